"""The EAGLE-3 draft head: one decoder layer over the target's fused low/mid/high features
(Li et al., arXiv 2503.01840, §3; SafeAILab/EAGLE ``cnets.py``, SpecForge, vLLM ``llama_eagle3``).

* Feature: the target's hidden states at three layers, taken as the INPUT of layers
  ``[2, L // 2, L - 3]`` by default (Hugging Face ``hidden_states[i]``, no +1; a checkpoint may
  name its own in ``eagle_config.eagle_aux_hidden_state_layer_ids``, read as input-of-layer ids as
  vLLM reads them, or as output-of-layer ids as SGLang and SpecForge do with
  ``drafter.layer_id_convention=output``), concatenated low -> high and projected by ``fc``
  (3 * H_target -> H).
* Drafter position i pairs the feature of position i with the embedding (the target's) of the
  token at i + 1; its output predicts the token at i + 2. The layer (``midlayer``) attends
  causally over earlier drafter positions; its attention input is
  ``[input_layernorm(embedding) ; hidden_norm(feature)]`` (q/k/v take 2H), the residual is the
  feature. Later draft positions feed the layer's own output back as the feature (no ``fc``).
* Logits: ``lm_head(norm(h))`` over a draft vocabulary; draft id d is target id ``d + d2t[d]``
  (``d2t`` all zeros when the vocabularies match). ``t2d`` is kept for the layout and unused.

Checkpoint layout (EAGLE-3 / SpecForge): ``config.json`` (``LlamaForCausalLMEagle3`` or
``LlamaForCausalLM``, ``num_hidden_layers`` 1, ``draft_vocab_size``, optional
``target_hidden_size``, optional ``eagle_config``), ``model.safetensors`` or
``pytorch_model.bin`` with ``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``;
embeddings, when present, are ignored (the target's are used).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from specpolicy.core.errors import ConfigError
from specpolicy.models.checkpoint import (
    decoder_fields,
    hf_config,
    load_into,
    load_weights,
    read_config,
    save_checkpoint,
)

#: ``architectures`` written to our EAGLE-3 checkpoints (SGLang / vLLM name).
ARCHITECTURE = "LlamaForCausalLMEagle3"


#: How explicit ``eagle_aux_hidden_state_layer_ids`` are read (``Eagle3Spec.feature_layers``).
LAYER_ID_CONVENTIONS = ("input", "output")


def default_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's default feature layers for a target of L decoder layers: ``[2, L // 2, L - 3]``."""
    return [2, num_target_layers // 2, num_target_layers - 3]


@dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 checkpoint says beyond its layer.

    Attributes:
        draft_vocab_size: rows of ``lm_head``.
        target_hidden_size: width of each target feature (H_target).
        layer_ids: the feature layers (INPUT of layer i = ``hidden_states[i]``), or None for
            the default of the target it is paired with.
    """

    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None

    def feature_layers(self, num_target_layers: int, convention: str = "input") -> tuple[int, ...]:
        """The features as ``hidden_states`` indices for a target of ``num_target_layers`` layers.

        Args:
            convention: how the checkpoint's explicit ``eagle_aux_hidden_state_layer_ids`` count:
                ``"input"`` (vLLM, and the default ids: id i = the INPUT of layer i =
                ``hidden_states[i]``) or ``"output"`` (SGLang, SpecForge: id i = the OUTPUT of layer
                i = ``hidden_states[i + 1]``). The default ids (no explicit ones) are the same layers
                either way: input of ``[2, L // 2, L - 3]``.
        Raises:
            ValueError: for another ``convention``.
        """
        if convention not in LAYER_ID_CONVENTIONS:
            raise ValueError(
                f"drafter.layer_id_convention must be one of {', '.join(LAYER_ID_CONVENTIONS)}, got {convention!r}"
            )
        if self.layer_ids is None:
            return tuple(default_layer_ids(num_target_layers))
        return tuple(i + (convention == "output") for i in self.layer_ids)

    @staticmethod
    def from_config(config: dict[str, Any], key: str = "drafter.model") -> Eagle3Spec:
        """Read a checkpoint's ``config.json`` dict.

        Raises:
            ConfigError: naming ``key`` for a missing ``hidden_size``, a non-integer field, or a
                ``num_hidden_layers`` other than 1.
        """
        if "hidden_size" not in config:
            raise ConfigError(f"{key}: config.json has no hidden_size (not an EAGLE-3 checkpoint)")
        if int(config.get("num_hidden_layers", 1)) != 1:
            raise ConfigError(f"{key}: an EAGLE-3 head has num_hidden_layers 1, got {config['num_hidden_layers']}")
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        try:
            return Eagle3Spec(
                int(config.get("draft_vocab_size") or config["vocab_size"]),
                int(config.get("target_hidden_size") or config["hidden_size"]),
                None if ids is None else tuple(int(i) for i in ids),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: config.json's EAGLE-3 fields are missing or not integers ({exc!r})") from exc


def check_head_fits_target(
    spec: Eagle3Spec,
    draft_config: dict[str, Any],
    target_config: dict[str, Any],
    key: str,
    head: str = "EAGLE-3",
    convention: str = "input",
) -> tuple[int, ...]:
    """Check an EAGLE-3-style head's config.json (read into ``spec``: EAGLE-3's or DART's) against
    the target's (both as dicts); return the feature layers as ``hidden_states`` indices (explicit
    ids read by ``convention``, ``Eagle3Spec.feature_layers``). ``head`` names the head in the
    hidden-size message (``"EAGLE-3"``, ``"DART"``).

    Raises:
        ConfigError: naming ``key`` and what does not fit: the feature width, the hidden size (the
            head embeds tokens with the target's embeddings), the vocabulary, or a feature layer
            beyond the target's layers.
    """
    layers = int(target_config.get("num_hidden_layers", 0))
    hidden, vocab = int(target_config.get("hidden_size", 0)), int(target_config.get("vocab_size", 0))
    if spec.target_hidden_size != hidden:
        raise ConfigError(
            f"{key}: target_hidden_size {spec.target_hidden_size} does not match the target's hidden size {hidden}"
        )
    if int(draft_config["hidden_size"]) != hidden:
        raise ConfigError(
            f"{key}: hidden_size {draft_config['hidden_size']} does not match the target's {hidden} "
            f"({head} embeds tokens with the target's embeddings)"
        )
    if int(draft_config.get("vocab_size", vocab)) != vocab or spec.draft_vocab_size > vocab:
        raise ConfigError(
            f"{key}: vocab_size {draft_config.get('vocab_size')} / draft_vocab_size "
            f"{spec.draft_vocab_size} do not fit the target's vocabulary of {vocab}"
        )
    ids = spec.feature_layers(layers, convention)
    if len(ids) != 3 or any(not 0 <= i <= layers for i in ids):
        raise ConfigError(
            f"{key}: eagle_config.eagle_aux_hidden_state_layer_ids {list(ids)} must be three layers of "
            f"the target's {layers} (0..{layers})"
        )
    return ids


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide ``[embedding ; feature]``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.q_proj = nn.Linear(2 * config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``(b, heads, n, d)``, keys and values ``(b, kv_heads, n, d)`` of ``x`` ``(b, n, 2H)``,
        RoPE applied with ``cos``/``sin`` ``(b, n, d)``."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v

    def out(self, attended: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the attention output ``(b, heads, n, d)`` -> ``(b, n, H)``."""
        b, _, n, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))


class Eagle3Midlayer(nn.Module):
    """The single decoder layer (``midlayer``)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``[input_layernorm(embeds) ; hidden_norm(hidden)]`` ``(b, n, 2H)``."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual on the feature, then the MLP block: ``(b, n, H)``."""
        x = hidden + self.self_attn.out(attended)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3DraftModel(nn.Module):
    """The EAGLE-3 head (no embeddings: the target's are used).

    Args:
        config: a ``LlamaConfig`` (the checkpoint's config.json).
        spec: its EAGLE-3 fields.
    """

    def __init__(self, config: LlamaConfig, spec: Eagle3Spec) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        self.fc = nn.Linear(3 * spec.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Midlayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass over n new drafter positions.

        Args:
            embeds: ``(1, n, H)`` the target's embeddings of each position's token (position i: token i + 1).
            hidden: ``(1, n, H)`` each position's feature: ``fc`` of the target's, or a fed-back output.
            positions: ``(1, n)`` int64 (a chain: consecutive from the cache length; tree nodes: by depth).
            past: the cached keys and values ``(1, kv_heads, p, d)`` of earlier positions, or None.
            mask: ``(n, p + n)`` bool (True = attend), e.g. tree nodes seeing only their ancestors;
                None: causal over the new positions, all of the past visible.
        Returns:
            ``(out, k, v)``: the outputs ``(1, n, H)`` (before ``norm``) and the keys/values of the
            whole sequence (past + new), to be cached.
        """
        cos, sin = self.rotary_emb(embeds, positions)
        q, k, v = self.midlayer.self_attn.qkv(self.midlayer.attention_input(embeds, hidden), cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        n, total = q.shape[2], k.shape[2]
        if mask is None and n > 1:  # causal over the new positions, all of the past visible
            mask = (
                torch.arange(total, device=q.device)[None, :]
                <= torch.arange(total - n, total, device=q.device)[:, None]
            )
        attended = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            enable_gqa=self.midlayer.self_attn.num_kv_heads != self.midlayer.self_attn.num_heads,
        )
        return self.midlayer.finish(hidden, attended), k, v

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``(..., draft_vocab_size)`` of outputs ``(..., H)``."""
        return self.lm_head(self.norm(out))

    def top_tokens(self, out: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely next tokens of outputs ``out`` ``(m, H)``: target ids ``(m, k) int64``
        and log-probabilities ``(m, k) float32``, best first (the head's log-softmax; EAGLE-2's
        per-node expansion, Li et al. 2024, §4). ``k`` above the draft vocabulary gives all of it."""
        logp = torch.log_softmax(self.logits(out).float(), dim=-1)
        values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
        return self.to_target_ids(ids), values

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target vocabulary ids of draft ids (any shape, int64): ``d + d2t[d]``."""
        return draft_ids + self.d2t[draft_ids]


def llama_config(config: dict[str, Any]) -> LlamaConfig:
    """A ``LlamaConfig`` from a checkpoint's config.json dict (extra fields kept as attributes)."""
    return hf_config(LlamaConfig, config)


def load_eagle3(directory: str | Path, key: str = "drafter.model") -> Eagle3DraftModel:
    """An EAGLE-3 checkpoint directory as a float32 ``Eagle3DraftModel`` in eval mode, on the CPU.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    return load_head(directory, key, Eagle3DraftModel, Eagle3Spec)


def load_head(directory: str | Path, key: str, model_type: type[nn.Module], spec_type: type[Eagle3Spec]) -> nn.Module:
    """An EAGLE-3-style head's checkpoint directory (``load_eagle3``, ``specpolicy.models.dart.load_dart``)
    as a float32 ``model_type(llama_config, spec_type.from_config(...))`` in eval mode, on the CPU;
    a missing ``d2t`` / ``t2d`` keeps the model's identity maps, embeddings are ignored.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    raw = read_config(directory, key)
    model = model_type(llama_config(raw), spec_type.from_config(raw, key))
    state = load_weights(directory, key)
    if "t2d" not in state:  # some exports drop the unused reverse map
        state["t2d"] = model.t2d
    if "d2t" not in state:
        state["d2t"] = model.d2t
    load_into(model, state, key, ignore=("embed_tokens.",))
    return model.eval()


def checkpoint_config(model: Eagle3DraftModel, num_target_layers: int | None = None) -> dict[str, Any]:
    """The EAGLE-3 config.json dict of ``model``; explicit feature layers are written only when they
    are not the default of a target of ``num_target_layers`` layers (input-of-layer ids)."""
    c = model.config
    cfg = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **decoder_fields(c, model.midlayer.self_attn.head_dim),
        "draft_vocab_size": model.spec.draft_vocab_size,
        "target_hidden_size": model.spec.target_hidden_size,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    ids = model.spec.layer_ids
    if ids is not None and (num_target_layers is None or list(ids) != default_layer_ids(num_target_layers)):
        # written only when not the default: engines read explicit ids differently (vLLM: input of
        # layer i; SGLang / SpecForge: output of layer i), the default they all read alike
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids)}
    return cfg


def save_eagle3(
    model: Eagle3DraftModel,
    directory: str | Path,
    num_target_layers: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` in the EAGLE-3 layout (bfloat16 weights, int64 ``d2t``, bool ``t2d``)."""
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    return save_checkpoint(directory, {**checkpoint_config(model, num_target_layers), **(extra or {})}, state)
