"""The Falcon draft head: an LSTM encoder and decoder layer(s) under a relaxed causal mask, drafting k
tokens per pass semi-autoregressively (Gao et al., "Falcon: Faster and Parallel Inference of Large
Language Models through Enhanced Semi-Autoregressive Drafting and Custom-Designed Decoding Tree",
arXiv 2412.12639, AAAI 2025, §3.1-3.2; Bestpay-inc/Falcon ``models/cnets.py``, ``Model``).

* Inputs, as EAGLE-1: drafter position i pairs the target's TOP-LAYER feature f_i (what the target's
  LM head reads: Hugging Face's last ``hidden_states`` entry, after the final norm) with the
  target's embedding of the token x_{i+1}; ``[embedding ; feature]`` (2H) goes through a 2-layer
  LSTM (2H -> H), then the decoder layer(s). Position i's output is a prediction of the feature
  f_{i+k}, read by the target's LM head (frozen, not stored, no final norm) as the token x_{i+k+1}.
* Relaxed causal mask: positions form blocks of k; each position sees every earlier position and
  its whole block. So the last committed block (f_{n-2}, x_{n-1}), (f_{n-1}, x_n) predicts
  x_{n+1}, x_{n+2} in one pass; the next pass feeds those two predicted features with the two
  drafted tokens, and so on (k = 2 tokens per pass: the paper's choice, §4.4).
* Departures from the released file, following the paper (§3.1: "LSTM ... to capture the sequential
  dependency"): the LSTM is ``batch_first`` (the released one is not, so on ``(1, n, 2H)`` it runs a
  length-1 sequence per position) and its return tuple is unpacked (the released file assigns the
  tuple to the hidden states). The LSTM state runs along the sequence, so a drafted block continues
  from its parent's state (``forward``'s ``state``). Layer 0 has no ``input_layernorm``, as released.

Checkpoint layout (as released): ``config.json`` (Llama fields plus ``k_mask``; ``architectures``
``FalconModel``) and ``model.safetensors`` / ``pytorch_model.bin`` with ``lstm.weight_ih_l{0,1}``,
``lstm.weight_hh_l{0,1}``, ``lstm.bias_{ih,hh}_l{0,1}``, ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.mlp.{gate,up,down}_proj``, ``layers.{i}.post_attention_layernorm`` and, for i > 0,
``layers.{i}.input_layernorm``; ``embed_tokens`` when present is ignored (the target's is used).
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

#: ``architectures`` written to our Falcon checkpoints.
ARCHITECTURE = "FalconModel"
#: Tokens per drafter pass (``k_mask``), the paper's default.
DEFAULT_K = 2
#: LSTM layers (released: ``nn.LSTM(2H, H, num_layers=2)``).
LSTM_LAYERS = 2

State = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class FalconSpec:
    """What a Falcon checkpoint says beyond Llama's fields.

    Attributes:
        k: tokens per drafter pass (``k_mask``), >= 1.
        lstm_bias: whether the LSTM has biases (released default True).
    """

    k: int
    lstm_bias: bool = True

    @staticmethod
    def from_config(config: dict[str, Any], key: str = "drafter.model") -> FalconSpec:
        """Read a checkpoint's ``config.json`` dict.

        Raises:
            ConfigError: naming ``key`` for a missing ``hidden_size`` / ``vocab_size`` or a
                ``k_mask`` that is not an integer >= 1.
        """
        for field in ("hidden_size", "vocab_size"):
            if field not in config:
                raise ConfigError(f"{key}: config.json has no {field} (not a Falcon checkpoint)")
        k = config.get("k_mask", DEFAULT_K)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"{key}: config.json's k_mask must be an integer >= 1, got {k!r}")
        return FalconSpec(k, bool(config.get("lstm_bias", True)))


def relaxed_mask(n: int, k: int, past: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """The relaxed causal mask ``(n, past + n) bool`` (True = attend) of ``n`` new positions in blocks
    of ``k`` aligned at the new positions' start (released ``_make_causal_mask``): every past
    position, every earlier position and the position's whole block (a short last block sees
    itself). Training runs whole sequences from position 0 under it."""
    i = torch.arange(n, device=device)
    block_end = (i // k + 1) * k  # exclusive
    new = i[None, :] < block_end[:, None]
    return torch.cat([torch.ones((n, past), dtype=torch.bool, device=device), new], dim=1)


class FalconAttention(nn.Module):
    """Llama attention (RoPE, grouped keys/values) over the layer's H-wide input."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = bool(getattr(config, "qkv_bias", False))
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``(b, n, H)``, RoPE ``cos``/``sin`` ``(b, n, d)``, cached ``(b, kv_heads, p, d)`` keys and
        values or None, ``mask`` ``(n, p + n)`` or ``(b, 1, n, p + n)`` bool. Returns the output
        ``(b, n, H)`` and the keys/values of past + new."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads
        )  # (b, heads, n, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)), k, v


class FalconDecoderLayer(nn.Module):
    """A Llama decoder layer; layer 0 has no ``input_layernorm`` (its input is the LSTM's output)."""

    def __init__(self, config: LlamaConfig, index: int) -> None:
        super().__init__()
        self.self_attn = FalconAttention(config)
        self.mlp = LlamaMLP(config)
        if index != 0:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, cos, sin, past, mask):
        h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        attended, k, v = self.self_attn(h, cos, sin, past, mask)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class FalconDraftModel(nn.Module):
    """The Falcon head (no embeddings, no LM head: the target's are used).

    Args:
        config: a ``LlamaConfig`` (the checkpoint's config.json).
        spec: its Falcon fields (``k``).
    """

    def __init__(self, config: LlamaConfig, spec: FalconSpec) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        h = config.hidden_size
        self.lstm = nn.LSTM(
            2 * h, h, num_layers=LSTM_LAYERS, bias=spec.lstm_bias, batch_first=True, dropout=0.1
        )  # dropout between the LSTM layers in training, as released
        self.layers = nn.ModuleList(FalconDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.rotary_emb = LlamaRotaryEmbedding(config)

    @property
    def k(self) -> int:
        """Tokens per drafter pass."""
        return self.spec.k

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        state: State | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], State]:
        """One pass over n new positions of b rows (sequences, or tree blocks).

        Args:
            embeds: ``(b, n, H)`` the target's embeddings of each position's token (position i: x_{i+1}).
            hidden: ``(b, n, H)`` each position's feature: the target's f_i, or a predicted one.
            positions: ``(b, n)`` int64 rotary positions.
            past: per decoder layer, cached keys and values ``(b, kv_heads, p, d)``; None: no past.
            state: the LSTM's ``(h, c)``, each ``(2, b, H)``, after the row's previous position; None: zeros.
            mask: ``(n, p + n)`` or ``(b, 1, n, p + n)`` bool (True = attend); None: ``relaxed_mask``.
        Returns:
            ``(out, kv, state)``: the outputs ``(b, n, H)`` (predicted features f_{i+k}), per layer the
            keys/values of past + new, and the LSTM state after the last new position.
        """
        x, state = self.encode(embeds, hidden, state)
        out, kv = self.decode(x, positions, past, mask)
        return out, kv, state

    def encode(
        self, embeds: torch.Tensor, hidden: torch.Tensor, state: State | None = None
    ) -> tuple[torch.Tensor, State]:
        """The LSTM over ``[embeds ; hidden]`` ``(b, n, 2H)`` from ``state`` (None: zeros): ``(x (b, n, H), state)``."""
        return self.lstm(torch.cat([embeds, hidden], dim=-1), state)

    def decode(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The decoder layer(s) over the LSTM's output ``x`` ``(b, n, H)`` (``forward``'s other arguments):
        ``(out (b, n, H), per layer the keys/values of past + new)``."""
        n = x.shape[1]
        p = 0 if past is None else past[0][0].shape[2]
        if mask is None:
            mask = relaxed_mask(n, self.k, p, x.device)
        cos, sin = self.rotary_emb(x, positions)
        kv = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, None if past is None else past[i], mask)
            kv.append((k, v))
        return x, kv


def llama_config(config: dict[str, Any]) -> LlamaConfig:
    """A ``LlamaConfig`` from a checkpoint's config.json dict (extra fields kept as attributes)."""
    return hf_config(LlamaConfig, config)


def check_fits_target(draft_config: dict[str, Any], target_config: dict[str, Any], key: str) -> FalconSpec:
    """Check a Falcon checkpoint's config.json against the target's (both dicts).

    Raises:
        ConfigError: one line naming ``key``: a hidden size other than the target's (the head reads
            the target's features and embeddings and feeds its LM head) or a vocabulary other than
            the target's.
    """
    spec = FalconSpec.from_config(draft_config, key)
    hidden, vocab = int(target_config.get("hidden_size", 0)), int(target_config.get("vocab_size", 0))
    if int(draft_config["hidden_size"]) != hidden:
        raise ConfigError(
            f"{key}: hidden_size {draft_config['hidden_size']} does not match the target's {hidden} "
            "(Falcon reads the target's features and embeddings and feeds its LM head)"
        )
    if int(draft_config["vocab_size"]) != vocab:
        raise ConfigError(f"{key}: vocab_size {draft_config['vocab_size']} does not match the target's {vocab}")
    return spec


def load_falcon(directory: str | Path, key: str = "drafter.model") -> FalconDraftModel:
    """A Falcon checkpoint directory as a float32 ``FalconDraftModel`` in eval mode, on the CPU.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    raw = read_config(directory, key)
    model = FalconDraftModel(llama_config(raw), FalconSpec.from_config(raw, key))
    load_into(model, load_weights(directory, key), key, ignore=("embed_tokens.",))
    return model.eval()


def checkpoint_config(model: FalconDraftModel) -> dict[str, Any]:
    """The config.json dict of ``model`` (Llama fields plus ``k_mask``, as the released ``FConfig``)."""
    c = model.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": c.num_hidden_layers,
        **decoder_fields(c, model.layers[0].self_attn.head_dim),
        "k_mask": model.spec.k,
        "lstm_bias": model.spec.lstm_bias,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def save_falcon(model: FalconDraftModel, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` in the released layout (bfloat16 weights; no embeddings)."""
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    return save_checkpoint(directory, {**checkpoint_config(model), **(extra or {})}, state)
