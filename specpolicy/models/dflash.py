"""The DFlash draft model: a few Qwen3-style layers that draft a whole block in one pass, with the
target's features injected as keys and values (Chen, Liang, Liu, arXiv 2602.06036, §3).

* Context: the target's hidden states at ``target_layer_ids`` (DFlash's id i = the OUTPUT of
  target decoder layer i, Hugging Face ``hidden_states[i + 1]``) of every committed position,
  concatenated and projected: ``hidden_norm(fc(features))`` (``fc``: n_layers * H -> H).
* KV injection: every drafter layer projects the context with its own ``k_proj`` / ``v_proj``
  (k-norm and RoPE at the context's positions) and prepends it to the block's keys and values;
  only these context entries are ever cached (``specpolicy.models.kv.KVCache``).
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

Draft vocabulary (this project's opt-in extension, EAGLE-3's convention): a checkpoint may add
``draft_vocab_size`` (in ``dflash_config`` or at the top level) and an int64 ``d2t`` tensor; the
drafter then runs the rows of the target's LM head for those target ids only (``d + d2t[d]``),
not the whole vocabulary. Without them the checkpoint is the official layout, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from specpolicy.core.errors import ConfigError
from specpolicy.models.checkpoint import (
    decoder_fields,
    hf_config,
    load_into,
    load_weights,
    read_config,
    save_checkpoint,
)
from specpolicy.models.kv import KVCache

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
        draft_vocab_size: rows of the LM head a pass runs, when a draft vocabulary is given
            (``draft_vocab_size`` and a ``d2t`` tensor, EAGLE-3's convention: draft id d is target
            id ``d + d2t[d]``; an extension of this project, opt-in); None (official checkpoints):
            the target's whole vocabulary.
    """

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    draft_vocab_size: int | None = None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The context as indices into Hugging Face ``hidden_states`` (id + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @staticmethod
    def from_config(config: dict[str, Any], key: str = "drafter.model") -> DFlashSpec:
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
            draft_vocab = nested.get("draft_vocab_size", config.get("draft_vocab_size"))
            spec = DFlashSpec(
                int(field("block_size")),
                int(field("mask_token_id")),
                tuple(int(i) for i in ids),
                int(num_target_layers),
                None if draft_vocab is None else int(draft_vocab),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: config.json's DFlash fields must be integers ({exc})") from exc
        if spec.block_size < 2:
            raise ConfigError(f"{key}: dflash_config.block_size must be >= 2, got {spec.block_size}")
        if spec.draft_vocab_size is not None and spec.draft_vocab_size < 1:
            raise ConfigError(f"{key}: dflash_config.draft_vocab_size must be >= 1, got {spec.draft_vocab_size}")
        return spec


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` ``(b, heads, n, d)`` with ``cos``/``sin`` ``(b, n, d)``."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _norm(x: torch.Tensor, norm: Qwen3RMSNorm) -> torch.Tensor:
    """``norm(x)`` in fewer ops, the same values in any dtype: ``Qwen3RMSNorm`` normalises in float32,
    casts back, then multiplies by its weight -- in float32 that is one fused ``rms_norm`` with the
    weight; in a lower precision the weight multiplies after the cast, as there."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return F.rms_norm(x, (x.shape[-1],), None, norm.variance_epsilon) * norm.weight


def _times(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight_t.T, bias)`` with the weight stored transposed, ``(in, out)``: ``x``
    ``(..., in)`` -> ``(..., out)`` (see ``DFlashLayer.fuse``)."""
    if bias is None:
        return x @ weight_t
    # the bias inside one addmm, as F.linear adds it (one rounding in a low precision)
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight_t).view(*x.shape[:-1], weight_t.shape[1])


def _signed(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` with sin negated in its first half, for ``_rope_rolled``."""
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _rope_rolled(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``_rope`` of ``x`` ``(b, n, heads, d)`` (positions before heads) in two fewer ops, the same
    values: ``rotate_half(x) * sin`` is ``roll(x, d / 2) * signed_sin`` with ``signed_sin`` = sin
    negated in its first half; ``cos`` / ``signed_sin`` ``(b, n, d)``."""
    return x * cos[:, :, None] + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin[:, :, None]


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

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_k: torch.Tensor | None,
        context_v: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
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

    def forward_blocks(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_k: torch.Tensor,
        context_v: torch.Tensor,
        context_mask: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
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
        scale = self.head_dim**-0.5
        to_context = (q @ ck.transpose(-1, -2)) * scale  # (R, h, n, L)
        to_context = to_context.masked_fill(~context_mask, float("-inf"))
        qb = q.view(R, self.num_heads, nb, span, self.head_dim)
        kb = k.view(R, self.num_heads, nb, span, self.head_dim)
        within = ((qb @ kb.transpose(-1, -2)) * scale).reshape(R, self.num_heads, n, span)  # (R, h, n, span)
        scores = torch.cat([to_context, within], dim=-1)
        p = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
        L = ck.shape[2]
        out = p[..., :L] @ cv + (
            p[..., L:].reshape(R, self.num_heads, nb, span, span) @ v.view(R, self.num_heads, nb, span, self.head_dim)
        ).reshape(R, self.num_heads, n, self.head_dim)
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

    def fuse(self) -> None:
        """Inference: stack the q/k/v and the gate/up projections' weights and the q/k norms' weights
        for ``draft_pass`` (one operation each instead of three, two and two), and lay every
        projection ``draft_pass`` multiplies by out TRANSPOSED, ``(in, out)`` contiguous: a block's
        few rows times an ``(in, out)`` matrix runs 20-40% faster on CPU than ``F.linear``'s
        ``(out, in)`` layout (oneDNN/MKL, 15-20 rows of width 256; the down projection, whose rows
        are wider than its output, gains nothing and keeps its module). Non-persistent buffers (not
        in the checkpoint; ``.to()`` moves them), COPIES of the weights -- their memory again -- so
        call it again after changing weights."""
        a = self.self_attn
        with torch.no_grad():
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            self.register_buffer("qkv_weight_t", qkv.t().contiguous(), persistent=False)  # (H, (h + 2 kv) d)
            biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            self.register_buffer("qkv_bias", None if biases[0] is None else torch.cat(biases), persistent=False)
            self.register_buffer("o_weight_t", a.o_proj.weight.t().contiguous(), persistent=False)  # (h d, H)
            gate_up = torch.cat([self.mlp.gate_proj.weight, self.mlp.up_proj.weight])
            self.register_buffer("gate_up_weight_t", gate_up.t().contiguous(), persistent=False)  # (H, 2 I)
            # q-norm's weight for each q head, then k-norm's for each kv head: (heads + kv_heads, head_dim)
            self.register_buffer(
                "qk_norm_weight",
                torch.cat([a.q_norm.weight.expand(a.num_heads, -1), a.k_norm.weight.expand(a.num_kv_heads, -1)]),
                persistent=False,
            )

    def draft_pass(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        index: int,
    ) -> torch.Tensor:
        """``forward`` for one request, with the new context's keys and values made in the same
        projections as the block's; the cache's layer ``index`` then holds the context with them.

        Args:
            x: ``(1, q, H)`` the block's hidden states.
            context: ``(1, u, H)`` the fused features of the committed positions not yet cached
                (their keys and values are projected from them without this layer's input norm,
                as ``context_keys_values`` does), or None.
            cos, sin: ``(1, u + q, head_dim)`` RoPE of the new context's and the block's positions,
                ``sin`` signed for ``_rope_rolled``.
            cache: the drafter's cache (the context before ``context``); layer ``index``'s entry is
                replaced by the context with the new positions (a view of this pass's keys and
                values when there was a cached context, a compact copy when there was none).
            index: this layer's index in the model (and the cache).
        Returns:
            ``(1, q, H)``.
        Raises:
            AttributeError: before ``fuse``.
        """
        a = self.self_attn
        n, d = x.shape[1], a.head_dim
        h = _norm(x, self.input_layernorm)
        rows = h if context is None else torch.cat([context, h], dim=1)  # (1, u + q, H)
        u = rows.shape[1] - n
        qkv = _times(rows, self.qkv_weight_t, self.qkv_bias)
        nq, nkv, heads = a.num_heads * d, a.num_kv_heads * d, a.num_heads
        # q and k heads side by side, each row at its own position: one norm and one RoPE for both
        # (the new context's q rows are computed and dropped: u rows, cheaper than separate calls)
        qk = qkv[:, :, : nq + nkv].view(1, u + n, heads + a.num_kv_heads, d)
        qk = F.rms_norm(qk, (d,), None, a.q_norm.variance_epsilon) * self.qk_norm_weight
        qk = _rope_rolled(qk, cos, sin)
        q, k = qk[:, u:, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2)
        v = qkv[:, :, nq + nkv :].view(1, u + n, a.num_kv_heads, d).transpose(1, 2)
        cached_k, cached_v = cache.layer(index)
        if cached_k is not None:  # [cached context ; new context ; block]
            k, v = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
            if u:  # the cache keeps the context part: a view of the new tensors, no copy
                cache.keys[index], cache.values[index] = k[:, :, : k.shape[2] - n], v[:, :, : v.shape[2] - n]
        elif u:  # the first context: a compact copy (a view would keep every q head of this pass alive)
            cache.keys[index], cache.values[index] = k[:, :, :u].contiguous(), v[:, :, :u].contiguous()
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=a.num_kv_heads != a.num_heads)
        x = x + _times(out.transpose(1, 2).reshape(1, n, nq), self.o_weight_t, a.o_proj.bias)
        gate, up = (_norm(x, self.post_attention_layernorm) @ self.gate_up_weight_t).chunk(2, dim=-1)
        return x + self.mlp.down_proj(self.mlp.act_fn(gate) * up)

    def forward_blocks(self, x, cos, sin, context_k, context_v, context_mask, span):
        x = x + self.self_attn.forward_blocks(
            self.input_layernorm(x), cos, sin, context_k, context_v, context_mask, span
        )
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
        if spec.draft_vocab_size is not None:  # draft id d is target id d + d2t[d]
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))

    def draft_to_target(self) -> torch.Tensor | None:
        """The target id of every draft id, ``(draft_vocab_size,) int64`` (``d + d2t[d]``), or None
        without a draft vocabulary."""
        if self.spec.draft_vocab_size is None:
            return None
        return torch.arange(self.spec.draft_vocab_size, device=self.d2t.device) + self.d2t

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``(b, n, head_dim)`` for ``positions`` ``(b, n)`` int64, in ``x``'s dtype."""
        return self.rotary_emb(x, positions)

    def fuse(self) -> None:
        """Inference (the drafter calls it once): each layer's stacked projections
        (``DFlashLayer.fuse``) and, for the default RoPE, a table of every position up to
        ``max_position_embeddings`` (``rope_cos`` / ``rope_signed_sin``, non-persistent buffers that
        ``.to()`` moves; other RoPE types -- dynamic scaling updates its state per call -- are
        computed per pass), for ``draft_pass``. Call it again after changing weights."""
        for layer in self.layers:
            layer.fuse()
        cos = sin = None
        if getattr(self.rotary_emb, "rope_type", "default") == "default":
            weight = self.fc.weight
            positions = torch.arange(int(self.config.max_position_embeddings), device=weight.device)[None]
            cos, sin = _signed(*self.rope(weight, positions))
            cos, sin = cos[0], sin[0]
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_signed_sin", sin, persistent=False)

    def _rope_at(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, signed sin)`` ``(1, stop - start, head_dim)`` of positions ``start .. stop - 1``:
        from the table, computed where there is none or past its end."""
        if self.rope_cos is None or stop > self.rope_cos.shape[0]:
            positions = torch.arange(start, stop, device=self.fc.weight.device)[None]
            return _signed(*self.rope(self.fc.weight, positions))
        return self.rope_cos[None, start:stop], self.rope_signed_sin[None, start:stop]

    def draft_pass(self, block_embeds: torch.Tensor, cache: KVCache, new_features: torch.Tensor | None) -> torch.Tensor:
        """One request's pass (the drafter's ``_pass``): ``forward`` over the block with the cached
        context, the newly committed positions' keys and values computed in the same pass (joined to
        the block's projections) and appended to ``cache`` -- the values ``context_keys_values`` then
        ``forward`` give (up to the summation order of the stacked matrix multiplies), in fewer,
        larger operations. Needs ``fuse``.

        Args:
            block_embeds: ``(1, q, H)`` the target's embeddings of the block tokens.
            cache: the drafter's ``KVCache``: the context up to the newly committed positions, which
                follow it; the block follows them.
            new_features: ``(1, u, n_layers * H)`` those positions' target features, or None.
        Returns:
            ``(1, q, H)`` after the final norm.
        Raises:
            RuntimeError: before ``fuse``.
        """
        if not hasattr(self, "rope_cos"):
            raise RuntimeError("DFlashDraftModel.draft_pass needs fuse() first (the DFlash drafter calls it)")
        start = cache.length
        u = 0 if new_features is None else new_features.shape[1]
        cos, sin = self._rope_at(start, start + u + block_embeds.shape[1])
        context = None
        if u:
            context = _norm(self.fc(new_features), self.hidden_norm)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            x = layer.draft_pass(x, context, cos, sin, cache, i)
        return _norm(x, self.norm)

    def context_keys_values(
        self, features: torch.Tensor, positions: torch.Tensor
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

    def forward(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]] | None,
        mask: torch.Tensor | None = None,
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

    def forward_blocks(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        context_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Training: ``nb`` blocks of ``span`` tokens per sequence in one pass, each seeing the context
        ``context_mask`` allows and itself (bidirectionally), never the other blocks -- per block,
        exactly ``forward`` on that block with its own context (``tests/family/test_conditioned_training.py``).

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


def draft_vocabulary_error(target_ids: torch.Tensor, vocab_size: int) -> str | None:
    """What is wrong with a draft vocabulary's target ids ``(Vd,) int64`` for a vocabulary of
    ``vocab_size`` (none, out of range, or one id twice), or None when nothing is."""
    if (
        target_ids.numel()
        and int(target_ids.min()) >= 0
        and int(target_ids.max()) < vocab_size
        and target_ids.unique().numel() == target_ids.numel()
    ):
        return None
    return (
        f"d2t maps the draft vocabulary outside the target's vocabulary of {vocab_size} or onto one target id "
        f"twice (draft id d is target id d + d2t[d], each in 0..{vocab_size - 1}, distinct; "
        f"{target_ids.numel()} draft ids)"
    )


def with_draft_vocabulary(model: DFlashDraftModel, target_ids: torch.Tensor) -> DFlashDraftModel:
    """Give ``model`` a draft vocabulary (in place): the target ids ``(Vd,) int64`` its passes run
    the LM head for (``d2t`` = ``target_ids - arange(Vd)``; the opt-in extension of the module
    docstring). Returns ``model``.

    Raises:
        ValueError: for no ids, or ids not distinct or not all in ``0 .. vocab_size - 1``
            (``draft_vocabulary_error``).
    """
    ids = target_ids.to(torch.long).flatten()
    error = draft_vocabulary_error(ids, int(model.config.vocab_size))
    if error:
        raise ValueError(error)
    model.spec = replace(model.spec, draft_vocab_size=int(ids.numel()))
    model.register_buffer("d2t", (ids - torch.arange(ids.numel())).to(model.fc.weight.device))
    return model


def qwen3_config(config: dict[str, Any]) -> Qwen3Config:
    """A ``Qwen3Config`` from a checkpoint's config.json dict (extra fields kept as attributes)."""
    return hf_config(Qwen3Config, config)


def load_dflash(directory: str | Path, key: str = "drafter.model") -> DFlashDraftModel:
    """A DFlash checkpoint directory as a float32 ``DFlashDraftModel`` in eval mode, on the CPU.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    raw = read_config(directory, key)
    spec = DFlashSpec.from_config(raw, key)
    model = DFlashDraftModel(qwen3_config(raw), spec)
    state = load_weights(directory, key)
    if ("d2t" in state) != (spec.draft_vocab_size is not None):
        raise ConfigError(
            f"{key}: a draft vocabulary needs both dflash_config.draft_vocab_size and a d2t tensor; "
            + (
                "the weights have d2t but config.json has no draft_vocab_size (set it to d2t's length, "
                f"{state['d2t'].shape[0]})"
                if "d2t" in state
                else f"config.json has draft_vocab_size {spec.draft_vocab_size} but the weights have no d2t"
            )
        )
    load_into(model, state, key, ignore=("embed_tokens.", "lm_head."))
    return model.eval()


def checkpoint_config(model: DFlashDraftModel) -> dict[str, Any]:
    """The official config.json dict of ``model``."""
    c = model.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "num_hidden_layers": c.num_hidden_layers,
        **decoder_fields(c, model.layers[0].self_attn.head_dim),
        "attention_bias": bool(getattr(c, "attention_bias", False)),
        "tie_word_embeddings": False,
        "block_size": model.spec.block_size,
        "num_target_layers": model.spec.num_target_layers,
        "dflash_config": {
            "target_layer_ids": list(model.spec.target_layer_ids),
            "mask_token_id": model.spec.mask_token_id,
            "block_size": model.spec.block_size,
            **({} if model.spec.draft_vocab_size is None else {"draft_vocab_size": model.spec.draft_vocab_size}),
        },
        "dtype": "bfloat16",
    }


def save_dflash(
    model: DFlashDraftModel, directory: str | Path, extra: dict[str, Any] | None = None, int8: bool = False
) -> Path:
    """Write ``model`` in the official layout (bfloat16 weights; ``extra`` fields added to config.json;
    ``int8``: the large 2-D weights row-wise as int8, which ``load_dflash`` dequantises)."""
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    return save_checkpoint(directory, {**checkpoint_config(model), **(extra or {})}, state, int8=int8)
