"""The Fast-dLLM v2 drafter's one-request host path (``drafters/fastdllm.py``, issue 48 item 5: host
work per round): ``draft_alone`` and ``commit_in_place`` are ``FastDLLMDrafter.draft`` / ``commit``
for the case every CPU benchmark row runs -- one request on an eager cache, greedy choices read on the
host (``greedy_into``) -- with the same passes, the same block arrays and the same draft, in fewer calls
between passes.

With DiffuSpec's path search (``search_apply``, also the general path's step): on that path a pass's
logits are the drafter's own float32 tensor, so the mask token's column is filled in place and the
softmax written into a kept buffer whose host view the search reads (no copy, no view made a pass);
the n-gram context is the block's last ``order - 1`` ids before the search when the block holds them
(else the committed tokens' tail, ``recent_tokens``, and the round's drafted ones); the path, its
confidences, the small block's confidence row and the block scan are one compiled call
(``path_search_kernels.path_into_block``).

``commit_in_place`` keeps the committed tokens where they were drafted: when the committed sequence
ends inside the round's current block, the block's host ids already hold the new tail but for the
verification's next token, so the commit is lengths (``_tail_len``, the token kept in ``_pending``)
and the next ``draft_alone`` reopens the block in ONE compiled call (``compiled.block_reopen``: that
token, then masks), where the general path concatenated the tail and filled the block again
(``compiled.block_open``). Any other commit (a rejection before the current block, a tree path,
reused tokens, a completed block) takes the general path, which reads the tail through
``FastDLLMDrafter._tail`` (copied out of the block then).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specpolicy.core.compiled import block_reopen, unmask_step
from specpolicy.core.path_search_kernels import path_into_block
from specpolicy.core.sampling import point_mass
from specpolicy.core.types import SMALL_BLOCK_CONFIDENCES, Draft, Verification

from_numpy = torch.from_numpy


def draft_alone(d: Any, num_tokens: int) -> Draft:
    """``FastDLLMDrafter.draft`` of ``d`` (a ``FastDLLMDrafter`` whose ``_fast`` is set: one request
    on an eager cache, host greedy choices) for an int ``num_tokens`` >= 1: the same passes
    (``FastDLLMRunner.alone``), the same unmasking (``compiled.unmask_step``, or with a path search
    ``search_apply``), the same draft.

    Raises:
        ValueError: as ``draft``: a draft whose block would pass the drafter's context.
    """
    B = d.block_size
    start = d._blk_start
    if start is None:  # the round's block
        start = d._base
        if d._tail_held is None:  # committed in place (``commit_in_place``): one compiled call
            d._check_fits(start + B, "a draft from committed length {} (block [{}, {}))", d._L, start, start + B)
            block_reopen(d._blk_ids, d._blk_conf, d._blk_masked, d._tail_len, d._pending, d.mask_token_id)
            d._blk_start, d._sb_index, d._filled = start, -1, d._tail_len
        else:
            d._open_block(start, d._tail_held, d._first)
    L = d._L
    end = L + d._k + num_tokens  # the draft covers positions [L, end)
    if d._stop_len is None:
        d._check_fits(((end - 1) // B + 1) * B, "a draft of {} tokens from committed length {}", d._k + num_tokens, L)
    filled, S, run, seq, row = d._filled, d.small_block_size, d.runner.alone, d.sequence, d._blk_row
    search = d.path_search is not None
    while d._stop_len is None and d._path_len is None and start + filled < end:
        if filled == B:  # the block is full: write its KV, open the next (``_cross_keep`` / ``_cross_apply``)
            d._cross_keep()
            d._cross_apply(run(seq, row, start, None, True))
            start, filled = d._blk_start, d._filled
            continue
        j = filled // S
        if search:  # the pass's logits (1, m, V), its path through their lattice
            d._passes += 1
            search_apply(d, run(seq, row, start, d._keep[j], False), j * S or 1, (j + 1) * S, True)
            filled = d._filled
            continue
        d._choose(run(seq, row, start, d._keep[j], False))  # a pass, then its choice (``greedy_into``)
        tokens, confs = d._chosen  # (m,) int64 / float32: numpy views of the choice
        d._passes += 1
        sb_row = np.empty(tokens.shape[0], dtype=np.float32)  # ``_unmask_apply``'s row
        filled, stop = unmask_step(
            tokens, confs, j * S or 1, d._blk_ids, d._blk_conf, d._blk_masked, d._threshold32, False,
            d._stops, max(L - start, 0), d._pick, sb_row,
        )  # fmt: skip
        d._sb_conf.append(sb_row)
        d._filled = filled
        if stop < filled:  # the leading run holds a stop token: the draft ends at it
            d._stop_len = start + stop + 1 - L
    k, stop_len, path_len = d._k + num_tokens, d._stop_len, d._path_len
    if stop_len is not None:
        k = min(k, stop_len)
    if path_len is not None:
        k = min(k, path_len)
    d._k = k
    return current_draft(d)


def search_apply(d: Any, logits: torch.Tensor, lo: int, b: int, own: bool) -> None:
    """After an unmasking pass with the path search (``d.path_search``): the small block's masked
    positions (offsets ``[_filled, b)``) unmasked as the best path through their lattice, from the
    pass's logits ``(b - lo, V)`` or ``(1, b - lo, V)`` (the mask token never a candidate); the draft
    ends where the path does when that is before the small block's end (``_path_len``). ``own``: the
    logits are the eager pass's float32 output on the CPU, ``(1, b - lo, V)``, read by nothing else
    (``draft_alone``): filled in place and normalised into ``d._probs_out`` (the same values as
    ``torch.softmax``, no tensor allocated)."""
    first = max(lo, d._filled)
    n = b - first
    rows = logits if first == lo else logits.narrow(-2, first - lo, n)
    if own:
        rows.index_fill_(-1, d._mask_index, -torch.inf)  # never the mask token
        torch._softmax(rows, -1, False, out=d._probs_out[n])
        probs: Any = d._probs_np[:n]  # (n, V) float32, the kept buffer's host view
    else:
        probs = torch.softmax(rows.float().index_fill(-1, d._mask_index, -torch.inf), -1)
    keep = d.path_search.scorer.order - 1
    if first >= keep:  # the last order - 1 tokens before the search lie in the block (committed or drafted)
        context = d._blk_ids[first - keep : first]
    else:  # (c,) int64, padded by the search if short
        d0 = max(d._L - d._blk_start, 0)
        context = np.concatenate([recent_tokens(d), *[seg[0] for seg in d._segments], d._blk_ids[d0:first]])
    path, conf, ended = d.path_search.search_np(probs, context)  # host arrays
    m = path.shape[0]
    if d._blk_probs is not None:  # sampling: point masses
        d._blk_probs[first : first + m] = point_mass(d._tensor(path), d.vocab_size)
    row = np.empty(b - lo, dtype=np.float32)  # the pass's confidences at its masked positions, NaN elsewhere
    d._sb_conf.append(row)
    start = d._blk_start
    d._scan(
        path_into_block(
            path, conf, first, lo, d._blk_ids, d._blk_conf, d._blk_masked, d._stops, max(d._L - start, 0), row
        )
    )
    if ended and d._stop_len is None:
        d._path_len = start + first + m - d._L


def recent_tokens(d: Any) -> np.ndarray:
    """The path search's n-gram context of committed tokens, ``(<= order - 1,)`` int64: ``d._recent``,
    or, when ``commit_in_place`` left it to the block (None), the block's last committed ids before the
    pending token and that token (kept from then on)."""
    recent = d._recent
    if recent is None:
        n, keep = d._tail_len, d.path_search.scorer.order - 1
        recent = d._recent = np.append(d._blk_ids[n - keep : n - 1], d._pending)
    return recent


def commit_in_place(d: Any, draft: Draft, verification: Verification) -> bool:
    """``FastDLLMDrafter.commit`` of ``d`` (its checks done) when the committed sequence ends inside the
    round's current block (``1 <= L + a + 1 - start < B`` for the accepted length ``a``) and the draft is
    a chain of the drafter's own tokens: the block's ids hold the committed tokens from its start (the
    old tail when the round began in it, then the accepted drafted tokens) but for
    ``verification.next_token``, so the tail is kept as lengths (module docstring). Every block the
    round wrote tentatively ends at or before the current block's start, itself at most ``L + a``: all of
    them committed as written, kept as the general path keeps them (no rollback, no block to write).
    Returns False, touching nothing, when the general path must run."""
    start = d._blk_start
    if start is None or verification.path is not None or draft.reused_tokens:
        return False
    a = int(verification.accepted_length)
    n = d._L + a + 1 - start  # the new tail's length
    if n < 1 or n >= d.block_size:
        return False
    pending = int(verification.next_token)
    if d.path_search is not None:  # its context: in the block (read when needed), else joined now
        keep = d.path_search.scorer.order - 1
        if n >= keep:
            d._recent = None
        else:  # the tokens committed this round: the finished blocks' drafted ones, the block's, the pending one
            d0 = max(d._L - start, 0)
            joined = [recent_tokens(d), *[seg[0] for seg in d._segments], d._blk_ids[d0 : n - 1], (pending,)]
            d._recent = np.concatenate(joined)[-keep:].astype(np.int64, copy=False)
    d._tail_held, d._tail_len, d._pending = None, n, pending
    d._L, d._base = start + n, start
    d._first = None  # the block starts with committed tokens
    d._carry = 0 if d._k else d._passes  # an undrafted round carries on
    d._new_round()
    return True


def current_draft(d: Any) -> Draft:
    """The round's draft so far, assembled on the host (the block and the finished blocks'
    segments) and handed over as tensors on the drafter's device."""
    k, filled, start = d._k, d._filled, d._blk_start
    d0 = max(d._L - start, 0)  # ``_draft_start``
    d1 = min(filled, d0 + k)  # the draft's end in the current block, at most
    # Look-ahead: the leading unmasked run past the draft (free to add), none after a stop token.
    ended = d._stop_len is not None or d._path_len is not None
    lookahead = 0 if ended else max(start + filled - (d._L + k), 0)  # then d1 = filled - lookahead
    ahead = None
    if not d._segments and d._sampling is None:  # in the current block: one copy of the ids, one of the confidences
        ids, q = d._blk_ids[d0:d1].copy(), None
        conf = d._blk_conf[d0 : d1 + lookahead].copy()  # the draft's and the look-ahead's
        if lookahead:
            conf, ahead = conf[: d1 - d0], conf[d1 - d0 :]
    else:
        probs = None if d._blk_probs is None else d._blk_probs[d0:filled]
        parts = d._segments + [(d._blk_ids[d0:d1], d._blk_conf[d0:d1], probs)]
        ids, conf = np.concatenate([p[0] for p in parts])[:k], np.concatenate([p[1] for p in parts])[:k]
        q = None if d._sampling is None else torch.cat([p[2][:k] for p in parts])[:k]
        if lookahead:
            ahead = d._blk_conf[filled - lookahead : filled].copy()  # (lookahead,)
    sb_conf = d._sb_conf[0] if len(d._sb_conf) == 1 else np.concatenate([d._no_conf, *d._sb_conf])
    d._drafted = ids  # (k,) the round's drafted tokens on the host, for ``commit``
    tensor = d._tensor
    return Draft(
        tensor(ids),
        tensor(conf),
        forward_passes=d._passes,
        probs=q,  # fresh tensors (torch.cat)
        ends_at_stop_token=d._k == d._stop_len,
        extras={SMALL_BLOCK_CONFIDENCES: tensor(sb_conf)},
        lookahead=lookahead,
        lookahead_confidences=d._empty_conf if ahead is None else tensor(ahead),
    ).counted(ids.shape[0])  # the length from the host array: no tensor shape read after the pass
