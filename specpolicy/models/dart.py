"""The DART draft layer: one pass drafts d = 8 future tokens from the target's fused features
(Liang et al., arXiv 2601.19278, §3; fvliang/DART ``dart/model/llama3_dart.py``).

* Feature and pairing: EAGLE-3's (``specpolicy.models.eagle3``): drafter position i pairs
  ``fc`` of the target's hidden states at three layers (the INPUT of layers ``[2, L // 2, L - 3]``
  by default) with the target's embedding of the token at i + 1; its output predicts the token at
  i + 2. The layer's attention input is ``[input_layernorm(embedding) ; hidden_norm(feature)]``
  (2H), the residual the feature.
* Masks: ``draft_length`` (d - 1 = 7) mask positions follow the last pair under the causal mask, at
  the next positions (RoPE). Each is the learned ``mask_rep`` (2H): its attention input is the whole
  vector, its residual the first H entries -- one vector shared by every mask position, told apart
  only by position, as the code does (``DartLlamaDecoderLayer.forward``). The last pair predicts
  the 1st future token, mask j the (j + 1)-th: logits for d positions in one pass.
* Cache: the pairs' keys and values are kept; the masks' are dropped after the pass (the code's
  ``dart_current_length_data.fill_(prev_input_len)``).
* Logits: ``lm_head(norm(h))`` over a draft vocabulary; draft id d is target id ``d + d2t[d]``.

Checkpoint layout (the released DART heads, ``LlamaForCausalLMDart``): ``config.json``
(``num_hidden_layers`` 1, ``draft_length``, ``draft_vocab_size``, optional ``target_hidden_size``,
optional ``eagle_config.eagle_aux_hidden_state_layer_ids``), ``model.safetensors`` with ``fc``,
``midlayer.*`` (``midlayer.mask_rep`` among them), ``norm``, ``lm_head``, ``d2t``, ``t2d``;
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
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from specpolicy.core.errors import ConfigError
from specpolicy.models.eagle3 import (
    Eagle3Midlayer,
    Eagle3Spec,
    checkpoint_config as eagle3_checkpoint_config,
    load_head,
    save_eagle3,
)

#: ``architectures`` of the released DART heads.
ARCHITECTURE = "LlamaForCausalLMDart"
#: The paper's mask positions per pass (d - 1; d = 8 drafted tokens per pass).
DRAFT_LENGTH = 7


@dataclass(frozen=True)
class DartSpec(Eagle3Spec):
    """What a DART checkpoint says beyond its layer: EAGLE-3's fields plus ``draft_length``, the
    mask positions appended per pass (a pass drafts ``draft_length + 1`` tokens)."""

    draft_length: int = DRAFT_LENGTH

    @staticmethod
    def from_config(config: dict[str, Any], key: str = "drafter.model") -> DartSpec:
        """Read a checkpoint's ``config.json`` dict.

        Raises:
            ConfigError: naming ``key`` for a missing ``hidden_size``, ``num_hidden_layers`` other
                than 1, a non-integer field, or ``draft_length`` < 1.
        """
        base = Eagle3Spec.from_config(config, key)
        try:
            length = int(config.get("draft_length", DRAFT_LENGTH))
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{key}: config.json's draft_length {config.get('draft_length')!r} is not an integer"
            ) from exc
        if length < 1:
            raise ConfigError(f"{key}: config.json's draft_length must be >= 1 (mask positions per pass), got {length}")
        return DartSpec(base.draft_vocab_size, base.target_hidden_size, base.layer_ids, length)


class DartMidlayer(Eagle3Midlayer):
    """EAGLE-3's decoder layer with DART's learned mask vector ``mask_rep`` (2H)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        self.mask_rep = nn.Parameter(torch.randn(2 * config.hidden_size))


class DartDraftModel(nn.Module):
    """The DART head (no embeddings: the target's are used).

    Args:
        config: a ``LlamaConfig`` (the checkpoint's config.json). spec: its DART fields.
    """

    def __init__(self, config: LlamaConfig, spec: DartSpec) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        self.fc = nn.Linear(3 * spec.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = DartMidlayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)

    @property
    def block_size(self) -> int:
        """Tokens drafted per pass: d = ``draft_length + 1``."""
        return self.spec.draft_length + 1

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        start: int,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        masks: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass over n new pairs followed by ``masks`` mask positions (default ``draft_length``).

        Args:
            embeds: ``(1, n, H)`` the target's embeddings of each pair's token (pair i: token i + 1).
            hidden: ``(1, n, H)`` each pair's feature (``fc`` of the target's, or a fed-back output).
            start: the position of the first new pair (the cache length).
            past: the cached keys and values ``(1, kv_heads, start, d)``, or None when ``start`` is 0.
        Returns:
            ``(out, k, v)``: the outputs ``(1, 1 + masks, H)`` of the last pair and the masks (before
            ``norm``; row j predicts the (j + 1)-th token after the last pair's token), and the keys
            and values ``(1, kv_heads, start + n + masks, d)``; cache the first ``start + n``.
        """
        masks = self.spec.draft_length if masks is None else masks
        layer = self.midlayer
        n = embeds.shape[1]
        x = layer.attention_input(embeds, hidden)
        x = torch.cat([x, layer.mask_rep.to(x.dtype).expand(1, masks, -1)], dim=1)
        residual = torch.cat([hidden[:, -1:], layer.mask_rep[: hidden.shape[-1]].to(x.dtype).expand(1, masks, -1)], 1)
        positions = torch.arange(start, start + n + masks, device=x.device)[None]
        cos, sin = self.rotary_emb(x, positions)
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        q = q[:, :, n - 1 :]  # only the last pair and the masks are read out
        total = k.shape[2]
        keys = torch.arange(total, device=q.device)
        mask = keys[None, :] <= torch.arange(total - masks - 1, total, device=q.device)[:, None]
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=layer.self_attn.num_kv_heads != layer.self_attn.num_heads
        )
        return layer.finish(residual, attended), k, v

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``(..., draft_vocab_size)`` of outputs ``(..., H)``."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target vocabulary ids of draft ids (any shape, int64): ``d + d2t[d]``."""
        return draft_ids + self.d2t[draft_ids]


def load_dart(directory: str | Path, key: str = "drafter.model") -> DartDraftModel:
    """A DART checkpoint directory as a float32 ``DartDraftModel`` in eval mode, on the CPU.

    Raises:
        ConfigError: naming ``key`` for a missing/invalid config or weights that do not fit it.
    """
    return load_head(directory, key, DartDraftModel, DartSpec)


def checkpoint_config(model: DartDraftModel, num_target_layers: int | None = None) -> dict[str, Any]:
    """The DART config.json dict of ``model``: EAGLE-3's (``specpolicy.models.eagle3.checkpoint_config``:
    explicit feature layers only when not the default of a target of ``num_target_layers`` layers;
    input-of-layer ids) with DART's ``architectures`` and ``draft_length``."""
    cfg = eagle3_checkpoint_config(model, num_target_layers)
    return {**cfg, "architectures": [ARCHITECTURE], "draft_length": model.spec.draft_length}


def save_dart(
    model: DartDraftModel, directory: str | Path, num_target_layers: int | None = None, extra: dict | None = None
) -> Path:
    """Write ``model`` in the DART layout (``save_checkpoint``: bfloat16 weights, int64 ``d2t``, bool ``t2d``)."""
    return save_eagle3(
        model, directory, num_target_layers, {**checkpoint_config(model, num_target_layers), **(extra or {})}
    )
