"""Autoregressive training of the target and the AR drafter (``Qwen2ForCausalLM`` from scratch).

Loss: next-token cross-entropy on response tokens only (the token at position ``i`` is
predicted from the logits at ``i - 1``; prompt and padding positions carry no loss),
averaged over response tokens. Batches are right-padded and run without an attention
mask: under the causal mask real tokens never attend to the padding that follows them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specpolicy.family.data import Example
from specpolicy.family.models import count_params, new_model, save_model
from specpolicy.family.trainer import TrainConfig, train


def ar_loss(model, batch: dict, gen: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over response tokens.

    Args:
        model: a ``Qwen2ForCausalLM``.
        batch: :func:`specpolicy.family.data.collate` output (``input_ids (B, L) int64``,
            ``response (B, L) bool``).
        gen: unused (AR training draws no randomness).
    Returns:
        (0-d float32 loss, number of target tokens).
    """
    ids, resp = batch["input_ids"], batch["response"]
    hidden = model.model(input_ids=ids).last_hidden_state  # (B, L, H)
    sel = resp[:, 1:]  # target positions 1..L-1, predicted from 0..L-2
    h = hidden[:, :-1][sel]  # (N, H)
    logits = model.lm_head(h).float()  # (N, V)
    targets = ids[:, 1:][sel]
    return F.cross_entropy(logits, targets), int(targets.numel())


def train_ar_model(
    size: str,
    examples: list[Example],
    tokenizer,
    cfg: TrainConfig,
    out_dir: str | Path,
    vocab_size: int | None = None,
    name: str | None = None,
) -> dict:
    """Train a fresh model of ``size`` (see :data:`specpolicy.family.models.SIZES`) and save it
    (bf16 weights + tokenizer) into ``out_dir``.

    Returns:
        the :func:`specpolicy.family.trainer.train` stats plus ``params`` and ``size``.
    """
    model = new_model(size, tokenizer, cfg.seed, vocab_size)
    torch.manual_seed(cfg.seed)
    stats = train(model, examples, ar_loss, cfg, tokenizer.pad_token_id, name=name or size)
    save_model(model, tokenizer, out_dir)
    stats.update(params=count_params(model), size=size)
    return stats
