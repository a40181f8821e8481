"""Adapt the AR drafter into a block-diffusion drafter (Fast-dLLM v2 recipe, arXiv 2509.26328).

Starts from the AR drafter's weights (same ``Qwen2ForCausalLM`` architecture and parameter
names; the result loads with ``Qwen2ForCausalLM.from_pretrained``) and trains on the
distilled data (prompt + target greedy output) with the conventions of
:mod:`specpolicy.family.block_diffusion`:

* sequences right-padded to a multiple of ``block_size`` (32), blocks over absolute positions;
* per step two complementary noisy copies of every sequence (batch rows ``[copy A ; copy B]``),
  masking only response tokens with a per-block rate ``t ~ U(1e-3, 1)``;
* optionally (``suffix_prob`` > 0; the objective matched to one-pass drafting) a share of the
  (row, block) pairs gets suffix masks instead: a clean block prefix, masks from a cut
  (often a small-block boundary) to the block's end in each copy
  (:func:`specpolicy.family.block_diffusion.mixed_noise`);
* model input ``[noisy ; clean]`` (``2L`` tokens), ``position_ids = [0..L-1, 0..L-1]``, the
  dual-stream 4D mask;
* loss: cross-entropy on masked response positions, each predicted from the shifted logit
  (noisy stream ``i-1`` inside a block, clean stream ``i-1`` for a block's first token),
  averaged over masked tokens. No auxiliary AR loss is used (a next-token loss on the
  clean stream would leak the answer, since clean queries see their whole block).
  Optionally (``soft_weight`` > 0, with the target's top-k soft targets from
  :mod:`specpolicy.family.distill`) the loss is ``(1 - w) * CE(data token) + w * CE(target's
  next-token distribution)``, the latter over the target's top-k tokens plus one bucket for
  the rest of the vocabulary (:func:`soft_cross_entropy`; its minimum is the target's entropy,
  so it is the KL to the target plus a constant).

Training runs in two phases (``train_dllm_model`` called twice by the pipeline): Fast-dLLM v2
adaptation from the AR drafter (random masks, hard targets), then the matched objective.

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
    mixed_noise,
    shift_source,
    to_attention_mask,
)
from specpolicy.family.data import Example
from specpolicy.family.models import count_params, load_model, save_model
from specpolicy.family.trainer import TrainConfig, train


def make_dllm_inputs(
    batch: dict,
    mask_id: int,
    gen: torch.Generator,
    block_size: int = BLOCK_SIZE,
    eps: float = EPS,
    suffix_prob: float = 0.0,
    small_block_size: int = 8,
    boundary_prob: float = 0.5,
) -> dict[str, torch.Tensor]:
    """Build one training step's model inputs from a collated batch.

    Args:
        batch: :func:`specpolicy.family.data.collate` output with ``L % block_size == 0``.
        mask_id: id of ``|<MASK>|``.
        suffix_prob, small_block_size, boundary_prob: see
            :func:`specpolicy.family.block_diffusion.mixed_noise` (``suffix_prob=0``: Fast-dLLM
            v2's masks only; the random draws are then those of the original recipe).
    Returns:
        dict with (``B2 = 2B``: copy A rows then copy B rows)
        * ``input_ids``: ``(B2, 2L) int64`` ``[noisy ; clean]``;
        * ``position_ids``: ``(B2, 2L) int64`` ``[0..L-1, 0..L-1]``;
        * ``mask``: ``(B2, 1, 2L, 2L) bool`` dual-stream mask (True = attend);
        * ``masked``: ``(B2, L) bool`` positions masked in the noisy stream;
        * ``targets``: ``(B2, L) bool`` loss positions (``masked``, plus a suffix block's
          first token when its cut is 0);
        * ``clean``: ``(B2, L) int64`` the clean tokens (loss targets).
    Raises:
        ValueError: ``L`` not a multiple of ``block_size``.
    """
    ids, valid, resp = batch["input_ids"], batch["valid"], batch["response"]
    B, L = ids.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a multiple of block_size {block_size}")
    masked, targets = mixed_noise(resp, gen, block_size, suffix_prob, small_block_size, boundary_prob, eps)
    clean = ids.repeat(2, 1)
    noisy = torch.where(masked, torch.full_like(clean, mask_id), clean)
    valid2 = valid.repeat(2, 1)
    return {
        "input_ids": torch.cat([noisy, clean], 1),
        "position_ids": torch.arange(L).repeat(2)[None].expand(2 * B, -1),
        "mask": dual_stream_mask(valid2, block_size),
        "masked": masked,
        "targets": targets,
        "clean": clean,
    }


def soft_cross_entropy(logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the drafter's distribution against the target's, known by its top-k.

    The target distribution is ``p_j = exp(top_logprobs_j)`` on its top-k tokens plus
    ``p_rest = 1 - sum_j p_j`` on the rest of the vocabulary; the drafter's is ``q =
    softmax(logits)`` grouped the same way: ``-sum_j p_j log q(top_ids_j) - p_rest log(1 -
    sum_j q(top_ids_j))``, averaged over rows.

    Args:
        logits: ``(N, V) float32``. top_ids: ``(N, k) int64``. top_logprobs: ``(N, k)`` float.
    Returns:
        0-d float32.
    """
    logq = logits.float().log_softmax(-1)
    lq_top = logq.gather(1, top_ids)  # (N, k)
    p_top = top_logprobs.float().exp()
    p_rest = (1 - p_top.sum(-1)).clamp(min=0)
    lq_rest = torch.log1p(-lq_top.exp().sum(-1).clamp(max=1 - 1e-6))
    return -((p_top * lq_top).sum(-1) + p_rest * lq_rest).mean()


def dllm_loss_from_inputs(
    model,
    inp: dict,
    block_size: int = BLOCK_SIZE,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    soft_weight: float = 0.0,
) -> tuple[torch.Tensor, int]:
    """Mean loss over the loss positions (``inp["targets"]``, else ``inp["masked"]``) with the
    block-diffusion token shift.

    Args:
        soft: optional ``(ids (B2, L, k) int64, logprobs (B2, L, k) float)``, the target's
            top-k next-token distribution for the token at each absolute position (rows as
            ``inp``); required when ``soft_weight > 0``.
        soft_weight: w in ``(1 - w) * CE(clean token) + w * soft_cross_entropy``.
    Returns:
        (0-d float32 loss, number of loss positions).
    """
    B2, L2 = inp["input_ids"].shape
    L = L2 // 2
    attn = to_attention_mask(inp["mask"], model.config._attn_implementation, torch.float32)
    hidden = model.model(
        input_ids=inp["input_ids"], position_ids=inp["position_ids"], attention_mask=attn
    ).last_hidden_state  # (B2, 2L, H)
    src = shift_source(L, block_size)  # (L,)
    rows, cols = inp.get("targets", inp["masked"]).nonzero(as_tuple=True)  # loss positions
    h = hidden[rows, src[cols]]  # (N, H)
    logits = model.lm_head(h).float()
    targets = inp["clean"][rows, cols]
    loss = F.cross_entropy(logits, targets)
    if soft_weight > 0:
        if soft is None:
            raise ValueError("soft_weight > 0 needs soft targets")
        sl = soft_cross_entropy(logits, soft[0][rows, cols], soft[1][rows, cols])
        loss = (1 - soft_weight) * loss + soft_weight * sl
    return loss, int(targets.numel())


def soft_batch(
    batch: dict, soft_targets: list[tuple[torch.Tensor, torch.Tensor]], copies: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Align per-example soft targets with a collated batch.

    Args:
        batch: :func:`specpolicy.family.data.collate` output with ``index`` (set by the trainer)
            and ``prompt_len``.
        soft_targets: per example ``(ids (R, k) int16, logprobs (R, k) float16)`` for its R
            response tokens (:func:`specpolicy.family.distill.load_soft_targets`).
        copies: row repeats (2: the two noisy copies).
    Returns:
        ``(ids (copies*B, L, k) int64, logprobs (copies*B, L, k) float32)``; positions outside
        the responses hold id 0 with log-probability 0 (never read: no loss there).
    """
    B, L = batch["input_ids"].shape
    k = int(soft_targets[0][0].shape[1])
    ids = torch.zeros((B, L, k), dtype=torch.long)
    lps = torch.zeros((B, L, k), dtype=torch.float32)
    for b, (i, p) in enumerate(zip(batch["index"].tolist(), batch["prompt_len"].tolist())):
        ti, tl = soft_targets[i]
        r = min(int(ti.shape[0]), L - p)
        ids[b, p : p + r] = ti[:r].long()
        lps[b, p : p + r] = tl[:r].float()
    return ids.repeat(copies, 1, 1), lps.repeat(copies, 1, 1)


def train_dllm_model(
    init_dir: str | Path,
    examples: list[Example],
    tokenizer,
    cfg: TrainConfig,
    out_dir: str | Path,
    block_size: int = BLOCK_SIZE,
    name: str = "dllm-drafter",
    suffix_prob: float = 0.0,
    boundary_prob: float = 0.5,
    small_block_size: int = 8,
    soft_targets: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    soft_weight: float = 0.0,
    checkpoint_every: int = 0,
) -> dict:
    """Load a model from ``init_dir`` (float32: the AR drafter, or a dLLM drafter to train
    further), train it as a block-diffusion drafter, save into ``out_dir`` with
    ``bd_block_size`` and ``mask_token_id`` in the config.

    Args:
        suffix_prob, boundary_prob, small_block_size: the noise mix (see :func:`make_dllm_inputs`).
        soft_targets: per example (same order as ``examples``) the target's top-k soft targets;
            needed when ``soft_weight > 0``.
        soft_weight: weight of the soft cross-entropy (see :func:`dllm_loss_from_inputs`).
        checkpoint_every: when > 0, every this many steps (rounded up to a progress line) the
            model is saved to ``<out_dir>.checkpoint`` (overwritten; its config gets
            ``train_step``), so a long run leaves a usable drafter at any time.

    Returns:
        :func:`specpolicy.family.trainer.train` stats plus ``params``, ``block_size``,
        ``mask_token_id``.
    Raises:
        ValueError: the tokenizer has no mask token, ``cfg.pad_to_multiple`` is not a
            multiple of ``block_size``, or ``soft_weight > 0`` without soft targets for every
            example.
    """
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError("tokenizer has no mask token")
    if cfg.pad_to_multiple % block_size:
        raise ValueError("cfg.pad_to_multiple must be a multiple of block_size")
    if soft_weight > 0 and (soft_targets is None or len(soft_targets) != len(examples)):
        raise ValueError("soft_weight > 0 needs one soft target entry per example")
    model = load_model(init_dir, torch.float32, "sdpa")
    torch.manual_seed(cfg.seed)

    def loss_fn(m, batch, gen):
        inp = make_dllm_inputs(batch, mask_id, gen, block_size, EPS, suffix_prob, small_block_size, boundary_prob)
        soft = soft_batch(batch, soft_targets) if soft_weight > 0 else None
        return dllm_loss_from_inputs(m, inp, block_size, soft, soft_weight)

    extra = {"bd_block_size": block_size, "mask_token_id": mask_id}
    last_ckpt = [0]

    def on_log(step: int, m) -> None:
        if checkpoint_every > 0 and step - last_ckpt[0] >= checkpoint_every:
            save_model(m, tokenizer, f"{out_dir}.checkpoint", extra_config={**extra, "train_step": step})
            last_ckpt[0] = step

    stats = train(model, examples, loss_fn, cfg, tokenizer.pad_token_id, name=name, on_log=on_log)
    save_model(model, tokenizer, out_dir, extra_config={"bd_block_size": block_size, "mask_token_id": mask_id})
    stats.update(
        params=count_params(model),
        block_size=block_size,
        mask_token_id=mask_id,
        aux_ar_loss=False,
        init=str(init_dir),
        suffix_prob=suffix_prob,
        boundary_prob=boundary_prob,
        small_block_size=small_block_size,
        soft_weight=soft_weight,
    )
    return stats
