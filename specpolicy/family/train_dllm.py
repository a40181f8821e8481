"""Adapt the AR drafter into a block-diffusion drafter (Fast-dLLM v2 recipe, arXiv 2509.26328).

Starts from the AR drafter's weights (same ``Qwen2ForCausalLM`` architecture and parameter
names; the result loads with ``Qwen2ForCausalLM.from_pretrained``) and trains on the
distilled data (prompt + target greedy output) with the conventions of
:mod:`specpolicy.family.block_diffusion`:

* sequences right-padded to a multiple of ``block_size`` (32), blocks over absolute positions;
* per step two complementary noisy copies of every sequence (batch rows ``[copy A ; copy B]``),
  masking only response tokens with a per-block rate ``t ~ U(1e-3, 1)``;
* model input ``[noisy ; clean]`` (``2L`` tokens), ``position_ids = [0..L-1, 0..L-1]``, the
  dual-stream 4D mask;
* loss: cross-entropy on masked response positions, each predicted from the shifted logit
  (noisy stream ``i-1`` inside a block, clean stream ``i-1`` for a block's first token),
  averaged over masked tokens. No auxiliary AR loss is used (a next-token loss on the
  clean stream would leak the answer, since clean queries see their whole block).

The saved config gets ``bd_block_size`` and ``mask_token_id``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specpolicy.family.block_diffusion import (
    BLOCK_SIZE,
    EPS,
    dual_stream_mask,
    sample_noise,
    shift_source,
    to_attention_mask,
)
from specpolicy.family.data import Example
from specpolicy.family.models import count_params, load_model, save_model
from specpolicy.family.trainer import TrainConfig, train


def make_dllm_inputs(
    batch: dict, mask_id: int, gen: torch.Generator, block_size: int = BLOCK_SIZE, eps: float = EPS
) -> dict[str, torch.Tensor]:
    """Build one training step's model inputs from a collated batch.

    Args:
        batch: :func:`specpolicy.family.data.collate` output with ``L % block_size == 0``.
        mask_id: id of ``|<MASK>|``.
    Returns:
        dict with (``B2 = 2B``: copy A rows then copy B rows)
        * ``input_ids``: ``(B2, 2L) int64`` ``[noisy ; clean]``;
        * ``position_ids``: ``(B2, 2L) int64`` ``[0..L-1, 0..L-1]``;
        * ``mask``: ``(B2, 1, 2L, 2L) bool`` dual-stream mask (True = attend);
        * ``masked``: ``(B2, L) bool`` positions masked in the noisy stream (loss positions);
        * ``clean``: ``(B2, L) int64`` the clean tokens (loss targets).
    Raises:
        ValueError: ``L`` not a multiple of ``block_size``.
    """
    ids, valid, resp = batch["input_ids"], batch["valid"], batch["response"]
    B, L = ids.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a multiple of block_size {block_size}")
    ma, mb = sample_noise(resp, gen, block_size, eps)
    masked = torch.cat([ma, mb], 0)
    clean = ids.repeat(2, 1)
    noisy = torch.where(masked, torch.full_like(clean, mask_id), clean)
    valid2 = valid.repeat(2, 1)
    return {
        "input_ids": torch.cat([noisy, clean], 1),
        "position_ids": torch.arange(L).repeat(2)[None].expand(2 * B, -1),
        "mask": dual_stream_mask(valid2, block_size),
        "masked": masked,
        "clean": clean,
    }


def dllm_loss_from_inputs(model, inp: dict, block_size: int = BLOCK_SIZE) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over masked positions with the block-diffusion token shift.

    Returns:
        (0-d float32 loss, number of masked tokens).
    """
    B2, L2 = inp["input_ids"].shape
    L = L2 // 2
    attn = to_attention_mask(inp["mask"], model.config._attn_implementation, torch.float32)
    hidden = model.model(
        input_ids=inp["input_ids"], position_ids=inp["position_ids"], attention_mask=attn
    ).last_hidden_state  # (B2, 2L, H)
    src = shift_source(L, block_size)  # (L,)
    rows, cols = inp["masked"].nonzero(as_tuple=True)  # masked absolute positions
    h = hidden[rows, src[cols]]  # (N, H)
    logits = model.lm_head(h).float()
    targets = inp["clean"][rows, cols]
    return F.cross_entropy(logits, targets), int(targets.numel())


def train_dllm_model(
    init_dir: str | Path,
    examples: list[Example],
    tokenizer,
    cfg: TrainConfig,
    out_dir: str | Path,
    block_size: int = BLOCK_SIZE,
    name: str = "dllm-drafter",
) -> dict:
    """Load the AR drafter from ``init_dir`` (float32), train it as a block-diffusion drafter,
    save into ``out_dir`` with ``bd_block_size`` and ``mask_token_id`` in the config.

    Returns:
        :func:`specpolicy.family.trainer.train` stats plus ``params``, ``block_size``,
        ``mask_token_id``.
    Raises:
        ValueError: the tokenizer has no mask token, or ``cfg.pad_to_multiple`` is not a
            multiple of ``block_size``.
    """
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError("tokenizer has no mask token")
    if cfg.pad_to_multiple % block_size:
        raise ValueError("cfg.pad_to_multiple must be a multiple of block_size")
    model = load_model(init_dir, torch.float32, "sdpa")
    torch.manual_seed(cfg.seed)

    def loss_fn(m, batch, gen):
        return dllm_loss_from_inputs(m, make_dllm_inputs(batch, mask_id, gen, block_size), block_size)

    stats = train(model, examples, loss_fn, cfg, tokenizer.pad_token_id, name=name)
    save_model(model, tokenizer, out_dir, extra_config={"bd_block_size": block_size, "mask_token_id": mask_id})
    stats.update(params=count_params(model), block_size=block_size, mask_token_id=mask_id, aux_ar_loss=False)
    return stats
