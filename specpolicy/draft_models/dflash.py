"""The DFlash draft model: a few Qwen3-style layers that draft a whole block in one pass, with the
target's features injected as keys and values (Chen, Liang, Liu, arXiv 2602.06036, §3).

* Context: the target's hidden states at ``target_layer_ids`` (DFlash's id i = the OUTPUT of
  target decoder layer i, Hugging Face ``hidden_states[i + 1]``) of every committed position,
  concatenated and projected: ``hidden_norm(fc(features))`` (``fc``: n_layers * H -> H).
* KV injection: every drafter layer projects the context with its own ``k_proj`` / ``v_proj``
  (k-norm and RoPE at the context's positions) and prepends it to the block's keys and values;
  only these context entries are ever cached (``specpolicy.draft_models.kv.KVCache``).
* The block: token embeddings (the target's) of ``[last committed token, MASK x (B - 1)]`` at the
  positions that continue the sequence, bidirectional attention inside the block and to all
  context, then the final ``norm``; the target's LM head turns positions 1..B-1 into B-1 tokens.
  Position j predicts the token AT position j (no token shift).

Checkpoint layout (the official one, loadable by z-lab/dflash and the engines): ``config.json``
is a Qwen3 config (``model_type`` qwen3, ``architectures`` ``["DFlashDraftModel"]``) with
``dflash_config`` ``{target_layer_ids, mask_token_id, block_size}`` (older checkpoints keep
``block_size`` / ``mask_token_id`` / ``target_layer_ids`` at the top level: both are read),
``num_target_layers``; weights ``layers.N.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}``, ``fc``, ``hidden_norm``,
``norm``; no embeddings and no LM head (the target's are used).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from specpolicy.draft_models.checkpoint import hf_config, load_into, load_weights, read_config, save_checkpoint
from specpolicy.errors import ConfigError

#: ``architectures`` of a DFlash checkpoint's config.json.
ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default context layers when a checkpoint names none: the middle target layer for a
    one-layer drafter, else ``num_draft_layers`` ids evenly spaced over ``[1, L - 3]`` (rounded)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashSpec:
    """What a DFlash checkpoint says beyond its Qwen3 layers.

    Attributes:
        block_size: B, tokens per block (the last committed token + B - 1 masks); one pass
            drafts B - 1 tokens.
        mask_token_id: the mask token (a target vocabulary id).
        target_layer_ids: DFlash layer ids of the context (id i = output of target layer i).
        num_target_layers: decoder layers of the target it was trained on.
    """

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The context as indices into Hugging Face ``hidden_states`` (id + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @staticmethod
    def from_config(config: dict[str, Any], key: str = "drafter.model") -> "DFlashSpec":
        """Read a checkpoint's ``config.json`` dict (``dflash_config`` first, then the top level).

        Raises:
            ConfigError: naming ``key`` and the field that is missing or not an integer.
        """
        nested = config.get("dflash_config") or {}

        def field(name: str, default: Any = None) -> Any:
            value = nested.get(name, config.get(name, default))
            if value is None:
                raise ConfigError(f"{key}: config.json has no dflash_config.{name} (nor a top-level {name})")
            return value

        num_target_layers = field("num_target_layers")
        ids = nested.get("target_layer_ids", config.get("target_layer_ids"))
        if ids is None:
            ids = default_target_layer_ids(int(num_target_layers), int(config.get("num_hidden_layers", 1)))
        try:
            spec = DFlashSpec(int(field("block_size")), int(field("mask_token_id")), tuple(int(i) for i in ids),
                              int(num_target_layers))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: config.json's DFlash fields must be integers ({exc})") from exc
        if spec.block_size < 2:
            raise ConfigError(f"{key}: dflash_config.block_size must be >= 2, got {spec.block_size}")
        return spec


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` ``(b, heads, n, d)`` with ``cos``/``sin`` ``(b, n, d)``."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    """Qwen3 attention (q/k norms) whose keys/values are ``[context ; block]``, bidirectional."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k-norm, RoPE) and values of ``x`` ``(b, n, H)``: two ``(b, kv_heads, n, head_dim)``."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_k: torch.Tensor | None,
                context_v: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of the block ``x`` ``(b, q, H)`` over ``[context ; block]``.

        Args:
            cos, sin: ``(b, q, head_dim)`` RoPE of the block's positions.
            context_k, context_v: ``(b, kv_heads, c, head_dim)`` or None (no context).
            mask: ``(b, 1, q, c + q)`` bool (True = attend) or None (everything attends to everything).
        Returns:
            ``(b, q, H)``.
        """
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)
        q = _rope(q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        if context_k is not None:
            k, v = torch.cat([context_k, k], dim=2), torch.cat([context_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))


    def forward_blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_k: torch.Tensor,
                       context_v: torch.Tensor, context_mask: torch.Tensor, span: int) -> torch.Tensor:
        """Training: many blocks of one sequence at once, each attending to the context its mask
        allows and to itself only (the same as ``forward`` on each block alone).

        Args:
            x: ``(R, nb * span, H)`` the blocks, laid one after another.
            cos, sin: ``(R, nb * span, head_dim)`` RoPE of their positions.
            context_k, context_v: ``(R, kv_heads, L, head_dim)`` the whole sequences' context.
            context_mask: ``(R, 1, nb * span, L)`` bool, True = the query's block sees that position.
            span: tokens per block.
        Returns:
            ``(R, nb * span, H)``.
        """
        R, n, _ = x.shape
        nb, groups = n // span, self.num_heads // self.num_kv_heads
        q = _rope(self.q_norm(self.q_proj(x).view(R, n, self.num_heads, self.head_dim)).transpose(1, 2), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # (R, h, n, d)
        ck, cv = context_k.repeat_interleave(groups, 1), context_v.repeat_interleave(groups, 1)
        scale = self.head_dim ** -0.5
        to_context = (q @ ck.transpose(-1, -2)) * scale  # (R, h, n, L)
        to_context = to_context.masked_fill(~context_mask, float("-inf"))
        qb = q.view(R, self.num_heads, nb, span, self.head_dim)
        kb = k.view(R, self.num_heads, nb, span, self.head_dim)
        within = ((qb @ kb.transpose(-1, -2)) * scale).reshape(R, self.num_heads, n, span)  # (R, h, n, span)
        scores = torch.cat([to_context, within], dim=-1)
        p = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
        L = ck.shape[2]
        out = p[..., :L] @ cv + (p[..., L:].reshape(R, self.num_heads, nb, span, span)
                                 @ v.view(R, self.num_heads, nb, span, self.head_dim)).reshape(R, self.num_heads, n,
                                                                                            self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(R, n, self.num_heads * self.head_dim))


class DFlashLayer(nn.Module):
    """One pre-norm decoder layer: attention over ``[context ; block]``, then the SwiGLU MLP."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, cos, sin, context_k, context_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_k, context_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_blocks(self, x, cos, sin, context_k, context_v, context_mask, span):
        x = x + self.self_attn.forward_blocks(self.input_layernorm(x), cos, sin, context_k, context_v, context_mask,
                                              span)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The DFlash network (no embeddings, no LM head: the target's are used).

    Args:
        config: a ``Qwen3Config`` (the checkpoint's config.json).
        spec: its DFlash fields.
    """

    def __init__(self, config: Qwen3Config, spec: DFlashSpec) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(spec.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``(b, n, head_dim)`` for ``positions`` ``(b, n)`` int64, in ``x``'s dtype."""
        return self.rotary_emb(x, positions)

    def context_keys_values(self, features: torch.Tensor, positions: torch.Tensor
                            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values of the context.

        Args:
            features: ``(b, c, n_layers * H)`` the target's concatenated hidden states.
            positions: ``(b, c)`` int64, their positions.
        Returns:
            per layer, ``(k, v)`` each ``(b, kv_heads, c, head_dim)``.
        """
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = self.rope(ctx, positions)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                context: list[tuple[torch.Tensor, torch.Tensor]] | None, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """One pass over the block(s).

        Args:
            block_embeds: ``(b, q, H)`` the target's embeddings of the block tokens (masks included).
            positions: ``(b, q)`` int64, their absolute positions.
            context: per layer ``(k, v)`` of the context (``context_keys_values`` or a
                ``KVCache``'s tensors), or None.
            mask: ``(b, 1, q, c + q)`` bool (True = attend); None = full attention (one block).
        Returns:
            ``(b, q, H)`` after the final norm; the target's LM head gives the logits.
        """
        cos, sin = self.rope(block_embeds, positions)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            k, v = context[i] if context is not None else (None, None)
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)


    def forward_blocks(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                       context: list[tuple[torch.Tensor, torch.Tensor]], context_mask: torch.Tensor) -> torch.Tensor:
        """Training: ``nb`` blocks of ``span`` tokens per sequence in one pass, each seeing the context
        ``context_mask`` allows and itself (bidirectionally), never the other blocks -- per block,
        exactly ``forward`` on that block with its own context (``tests/test_conditioned_training.py``).

        Args:
            block_embeds: ``(R, nb, span, H)`` the target's embeddings of the blocks' tokens.
            positions: ``(R, nb, span)`` int64, their absolute positions.
            context: per layer ``(k, v)`` ``(R, kv_heads, L, head_dim)`` of the whole sequences.
            context_mask: ``(R, nb, L)`` bool: the context positions each block sees.
        Returns:
            ``(R, nb, span, H)`` after the final norm.
        """
        R, nb, span, H = block_embeds.shape
        x = block_embeds.reshape(R, nb * span, H)
        cos, sin = self.rope(x, positions.reshape(R, nb * span))
        mask = context_mask.repeat_interleave(span, dim=1)[:, None]  # (R, 1, nb * span, L)
        for i, layer in enumerate(self.layers):
            x = layer.forward_blocks(x, cos, sin, context[i][0], context[i][1], mask, span)
        return self.norm(x).view(R, nb, span, H)


def qwen3_config(config: dict[str, Any]) -> Qwen3Config:
    """A ``Qwen3Config`` from a checkpoint's config.json dict (extra fields kept as attributes)."""
    return hf_config(Qwen3Config, config)


def load_dflash(directory: str | Path, key: str = "drafter.model") -> DFlashDraftModel:
    """A DFlash checkpoint directory as a float32 ``DFlashDraftModel`` in eval mode, on the CPU.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    raw = read_config(directory, key)
    model = DFlashDraftModel(qwen3_config(raw), DFlashSpec.from_config(raw, key))
    load_into(model, load_weights(directory, key), key, ignore=("embed_tokens.", "lm_head."))
    return model.eval()


def checkpoint_config(model: DFlashDraftModel) -> dict[str, Any]:
    """The official config.json dict of ``model``."""
    c = model.config
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": model.layers[0].self_attn.head_dim,
        "hidden_act": c.hidden_act, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "rope_theta": float(c.rope_parameters["rope_theta"]),
        "attention_bias": bool(getattr(c, "attention_bias", False)), "tie_word_embeddings": False,
        "block_size": model.spec.block_size, "num_target_layers": model.spec.num_target_layers,
        "dflash_config": {"target_layer_ids": list(model.spec.target_layer_ids),
                          "mask_token_id": model.spec.mask_token_id, "block_size": model.spec.block_size},
        "dtype": "bfloat16",
    }


def save_dflash(model: DFlashDraftModel, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` in the official layout (bfloat16 weights; ``extra`` fields added to config.json)."""
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    return save_checkpoint(directory, {**checkpoint_config(model), **(extra or {})}, state)
