"""Temperature calibration of the dLLM drafter's confidence for one-pass drafting, folded into its weights.

The confidence FailFast gates on (arXiv 2512.20573 §4.2) is the max softmax probability of the
pass that unmasked a token. Matching the target's soft distributions makes it track the
target's own uncertainty, which is lower than the chance that the drafter's top-1 equals the
target's top-1 (under-confidence). A temperature ``T`` fixes that (Guo et al. 2017,
"On Calibration of Modern Neural Networks", §4.2): ``T`` is chosen on a grid to minimise the
expected calibration error of the confidence vs correctness over the positions a one-pass
drafter predicts when its prefix is right -- a suffix mask per block (clean prefix, masks from
a cut to the block's end, cuts as in training), scored only from the cut to the end of its
small block, which is what the pass at that cut decodes.

Folding: the logits are ``lm_head(norm(h))`` with an RMSNorm whose weight multiplies its
output and an ``lm_head`` without bias, so dividing ``model.model.norm.weight`` by ``T``
divides every logit by ``T`` exactly; the model stays a plain ``Qwen2ForCausalLM``.
"""

from __future__ import annotations

import torch

from specpolicy.family.block_diffusion import BLOCK_SIZE, sample_suffix_noise, shift_source, to_attention_mask
from specpolicy.family.data import Example, collate
from specpolicy.family.diagnostics import expected_calibration_error

#: Temperatures tried (a grid: ECE is piecewise constant in T).
T_GRID = tuple(round(0.5 + 0.02 * i, 2) for i in range(51))  # 0.50 .. 1.50


@torch.no_grad()
def one_pass_logits(
    model,
    examples: list[Example],
    mask_id: int,
    pad_id: int,
    seed: int = 0,
    block_size: int = BLOCK_SIZE,
    small_block_size: int = 8,
    batch_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and targets at the positions a one-pass pass decodes, from suffix masks.

    Returns:
        ``(logits (N, V) float32, targets (N,) int64)``.
    """
    from specpolicy.family.block_diffusion import dual_stream_mask

    gen = torch.Generator().manual_seed(seed)
    out_l, out_t = [], []
    for s in range(0, len(examples), batch_size):
        batch = collate(examples[s : s + batch_size], pad_id, block_size)
        ids, valid, resp = batch["input_ids"], batch["valid"], batch["response"]
        B, L = ids.shape
        masked, targets = sample_suffix_noise(resp, gen, block_size, small_block_size)
        off = torch.arange(L) % block_size
        # keep targets from the cut to the end of the cut's small block
        first = targets & ~torch.cat([torch.zeros(B, 1, dtype=torch.bool), targets[:, :-1]], 1) | (targets & (off == 0))
        cut_off = torch.where(first, off.expand(B, L), torch.full((B, L), block_size))
        blk = torch.arange(L) // block_size
        cut_blk = torch.full((B, L // block_size), block_size)
        cut_blk.scatter_reduce_(1, blk.expand(B, L), cut_off, reduce="amin")
        cut_tok = cut_blk.repeat_interleave(block_size, 1)
        end_tok = (cut_tok // small_block_size + 1) * small_block_size
        used = targets & (off[None] < end_tok)
        noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
        attn = to_attention_mask(dual_stream_mask(valid, block_size), model.config._attn_implementation)
        hidden = model.model(
            input_ids=torch.cat([noisy, ids], 1),
            position_ids=torch.arange(L).repeat(2)[None].expand(B, -1),
            attention_mask=attn,
        ).last_hidden_state
        rows, cols = used.nonzero(as_tuple=True)
        out_l.append(model.lm_head(hidden[rows, shift_source(L, block_size)[cols]]).float())
        out_t.append(ids[rows, cols])
    return torch.cat(out_l), torch.cat(out_t)


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor, grid=T_GRID) -> tuple[float, float, float]:
    """The grid temperature with the lowest ECE of max-softmax confidence vs (argmax == target).

    Returns:
        ``(T, ECE at T = 1, ECE at T)``.
    """
    correct = logits.argmax(-1) == targets
    eces = {t: expected_calibration_error(torch.softmax(logits / t, -1).amax(-1), correct) for t in grid}
    best = min(eces, key=lambda t: (eces[t], abs(t - 1)))
    return best, expected_calibration_error(torch.softmax(logits, -1).amax(-1), correct), eces[best]


def fold_temperature(model, temperature: float) -> None:
    """Divide every logit of ``model`` (a ``Qwen2ForCausalLM``) by ``temperature`` by scaling its
    final RMSNorm weight in place.

    Raises:
        ValueError: ``temperature`` <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with torch.no_grad():
        model.model.norm.weight.div_(temperature)


def calibrate_saved(model_dir, examples: list[Example], tokenizer, seed: int = 0) -> dict:
    """Fit the temperature of the drafter saved in ``model_dir`` on ``examples`` (prompt + target
    greedy response), fold it into the weights and save the model back (its config records
    ``confidence_temperature``, the product over repeated calibrations).

    Returns:
        ``{"temperature", "ece_before", "ece_after", "positions", "examples"}``.
    """
    from specpolicy.family.models import load_model, save_model

    model = load_model(model_dir)
    bs = int(getattr(model.config, "bd_block_size", BLOCK_SIZE))
    logits, targets = one_pass_logits(model, examples, tokenizer.mask_token_id, tokenizer.pad_token_id, seed, bs)
    t, before, after = fit_temperature(logits, targets)
    fold_temperature(model, t)
    prev = float(getattr(model.config, "confidence_temperature", 1.0) or 1.0)
    save_model(model, tokenizer, model_dir, extra_config={"confidence_temperature": round(prev * t, 4)})
    return {
        "temperature": t,
        "ece_before": round(before, 4),
        "ece_after": round(after, 4),
        "positions": int(targets.numel()),
        "examples": len(examples),
    }
