"""Block-diffusion (Fast-dLLM v2, arXiv 2509.26328) conventions shared by training and evaluation.

Blocks are ``block_size`` (32) consecutive ABSOLUTE positions of the full sequence, prompt
included: block ``b`` holds positions ``[32 b, 32 b + 32)``.

Training input (length ``2L``): ``[noisy (L) ; clean (L)]`` with ``position_ids =
[0..L-1, 0..L-1]``. Attention (``True`` = may attend), for query block ``bq`` / key block ``bk``:

* noisy query -> noisy key: ``bk == bq`` (bidirectional inside the block);
* noisy query -> clean key: ``bk < bq``;
* clean query -> clean key: ``bk <= bq`` (block-causal, bidirectional inside the block);
* clean query -> noisy key: never;
* padding keys: never, except a padding query's own key (keeps every softmax row finite;
  outputs at padding queries are meaningless and never used).

Token shift: the token at absolute position ``i`` (offset ``j = i % 32``) is predicted by
the logits at ``i - 1``: of the NOISY stream when ``j > 0``, of the CLEAN stream when
``j == 0`` (the first token of a block comes from the last clean token of the previous
block, as at inference where that logit comes from the cached previous block).

Inference (single stream): committed blocks are processed clean under the block-causal
mask (and cached); the current block holds the committed tokens of the block followed by
mask tokens, attends to all earlier blocks and bidirectionally to itself; the token at
``i`` is read from the logits at ``i - 1`` (for ``j == 0``: the last position of the
previous, clean block). :func:`block_causal_mask` gives that single-stream mask.

Noise: :func:`sample_noise` draws Fast-dLLM v2's complementary random masks;
:func:`sample_suffix_noise` draws the masks a one-pass drafter meets (a clean prefix of the
block, masks from a cut to the block's end). :func:`mixed_noise` mixes them per block.
"""

from __future__ import annotations

import torch

BLOCK_SIZE = 32
EPS = 1e-3


def block_ids(length: int, block_size: int = BLOCK_SIZE, device=None) -> torch.Tensor:
    """``(length,) int64``: block index of each absolute position."""
    return torch.arange(length, device=device) // block_size


def block_causal_mask(valid: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """Single-stream block-causal mask.

    Args:
        valid: ``(B, L) bool``, True on real (non-padding) tokens.
    Returns:
        ``(B, 1, L, L) bool``: query ``i`` may attend key ``j`` iff ``block(j) <= block(i)``
        and ``j`` is valid, or ``j == i`` (so padding queries keep one key).
    """
    B, L = valid.shape
    blk = block_ids(L, block_size, valid.device)
    m = (blk[None, :] <= blk[:, None])[None] & valid[:, None, :]
    m = m | torch.eye(L, dtype=torch.bool, device=valid.device)[None]
    return m[:, None]


def dual_stream_mask(valid: torch.Tensor, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """The ``[noisy ; clean]`` training mask described in the module docstring.

    Args:
        valid: ``(B, L) bool`` real-token mask of the (shared) sequence length ``L``.
    Returns:
        ``(B, 1, 2L, 2L) bool`` (True = may attend); rows/cols ``0..L-1`` are the noisy
        stream, ``L..2L-1`` the clean stream.
    """
    B, L = valid.shape
    dev = valid.device
    blk = block_ids(L, block_size, dev)
    same = blk[:, None] == blk[None, :]
    before = blk[None, :] < blk[:, None]
    upto = blk[None, :] <= blk[:, None]
    top = torch.cat([same, before], dim=1)  # noisy queries: (L, 2L)
    bottom = torch.cat([torch.zeros_like(same), upto], dim=1)  # clean queries
    m = torch.cat([top, bottom], dim=0)[None] & valid.repeat(1, 2)[:, None, :]
    m = m | torch.eye(2 * L, dtype=torch.bool, device=dev)[None]
    return m[:, None]


def to_attention_mask(mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Convert a bool mask to what the transformers attention backend expects.

    ``sdpa`` takes the bool mask as is (True = attend); ``eager`` (and anything else) gets
    an additive float mask: 0 where allowed, ``finfo(dtype).min`` elsewhere.
    """
    if attn_implementation == "sdpa":
        return mask
    z = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, z, torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device))


def sample_noise(
    response: torch.Tensor, gen: torch.Generator, block_size: int = BLOCK_SIZE, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw the two complementary masking patterns of one training step.

    Per (row, block) a rate ``t ~ U(eps, 1)``; each response token of the block is masked
    with probability ``t`` in the first copy; the second copy masks exactly the other
    response tokens of the block. Prompt and padding tokens are never masked.

    Args:
        response: ``(B, L) bool``, True on response tokens.
        gen: CPU generator (seeded by the caller).
    Returns:
        ``(masked_a, masked_b)``, both ``(B, L) bool``, disjoint, union == ``response``.
    """
    B, L = response.shape
    nblk = -(-L // block_size)
    t = eps + (1 - eps) * torch.rand((B, nblk), generator=gen)
    t_tok = t.repeat_interleave(block_size, dim=1)[:, :L]
    u = torch.rand((B, L), generator=gen)
    a = (u < t_tok) & response
    return a, response & ~a


def shift_source(length: int, block_size: int = BLOCK_SIZE, device=None) -> torch.Tensor:
    """``(length,) int64``: index into the ``2L`` model output whose logits predict position ``i``.

    ``i - 1`` (noisy stream) when ``i % block_size != 0``, else ``length + i - 1`` (clean
    stream). Entry 0 is 0 and must not be used (position 0 is never predicted).
    """
    i = torch.arange(length, device=device)
    src = torch.where(i % block_size == 0, length + i - 1, i - 1)
    src[0] = 0
    return src


def sample_suffix_noise(
    response: torch.Tensor,
    gen: torch.Generator,
    block_size: int = BLOCK_SIZE,
    small_block_size: int = 8,
    boundary_prob: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Suffix masks: the situation of a one-pass drafter (FailFast arXiv 2512.20573 §4.1 with
    threshold 0.05: one pass per small block).

    Per (row, block) a cut offset ``c``: with probability ``boundary_prob`` a small-block
    boundary ``{0, S, 2S, ...}`` (the pass that decodes a later small block of a draft), else
    uniform over ``[0, block_size)`` (the first pass of a round, from wherever the committed
    prefix ends). Response tokens at offsets ``>= c`` are LOSS targets; they are MASKED in the
    noisy input except offset 0: at inference a block's first token is never a mask (it is
    committed, or drafted from the last logit of the previous block's pass; here it is
    predicted from the clean stream, see :func:`shift_source`). Prompt and padding tokens are
    never masked nor targets.

    Args:
        response: ``(B, L) bool``, True on response tokens.
        gen: CPU generator (seeded by the caller).
        small_block_size: S, dividing ``block_size``.
        boundary_prob: share of cuts on small-block boundaries, in [0, 1].
    Returns:
        ``(masked, targets)``, both ``(B, L) bool``: ``masked`` = ``targets`` minus block
        offset 0; in every block the targets are a suffix of the block's response tokens.
    Raises:
        ValueError: ``small_block_size`` does not divide ``block_size``, or ``boundary_prob``
            outside [0, 1].
    """
    if small_block_size < 1 or block_size % small_block_size:
        raise ValueError(f"small_block_size {small_block_size} must divide block_size {block_size}")
    if not 0.0 <= boundary_prob <= 1.0:
        raise ValueError(f"boundary_prob must be in [0, 1], got {boundary_prob}")
    B, L = response.shape
    nblk = -(-L // block_size)
    uniform = torch.randint(0, block_size, (B, nblk), generator=gen)
    boundary = torch.randint(0, block_size // small_block_size, (B, nblk), generator=gen) * small_block_size
    cut = torch.where(torch.rand((B, nblk), generator=gen) < boundary_prob, boundary, uniform)
    offset = torch.arange(L) % block_size  # (L,)
    cut_tok = cut.repeat_interleave(block_size, dim=1)[:, :L]
    targets = response & (offset[None, :] >= cut_tok)
    return targets & (offset[None, :] > 0), targets


def mixed_noise(
    response: torch.Tensor,
    gen: torch.Generator,
    block_size: int = BLOCK_SIZE,
    suffix_prob: float = 0.0,
    small_block_size: int = 8,
    boundary_prob: float = 0.5,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two noisy copies of one training step, per (row, block) either Fast-dLLM v2's
    complementary random masks (:func:`sample_noise`) or, with probability ``suffix_prob``,
    two independent suffix masks (:func:`sample_suffix_noise`).

    Returns:
        ``(masked, targets)``, both ``(2B, L) bool`` (copy A rows, then copy B rows): masked
        positions of the noisy stream and loss positions. In random-mask blocks they are
        equal; in suffix blocks ``targets`` adds the block's first token when the cut is 0.
    Raises:
        ValueError: ``suffix_prob`` outside [0, 1] (and see :func:`sample_suffix_noise`).
    """
    if not 0.0 <= suffix_prob <= 1.0:
        raise ValueError(f"suffix_prob must be in [0, 1], got {suffix_prob}")
    ra, rb = sample_noise(response, gen, block_size, eps)
    random_masks = torch.cat([ra, rb], 0)
    if suffix_prob == 0.0:
        return random_masks, random_masks
    resp2 = response.repeat(2, 1)
    sm, st = sample_suffix_noise(resp2, gen, block_size, small_block_size, boundary_prob)
    B2, L = resp2.shape
    nblk = -(-L // block_size)
    use = (torch.rand((B2 // 2, nblk), generator=gen) < suffix_prob).repeat(2, 1)  # same mode in both copies
    use_tok = use.repeat_interleave(block_size, dim=1)[:, :L]
    return torch.where(use_tok, sm, random_masks), torch.where(use_tok, st, random_masks)
