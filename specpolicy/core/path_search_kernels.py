"""The compiled kernels of the path search's lattice and Kneser-Ney scoring (``specpolicy.core.
path_search``; issue 48, item 5: host work per round): each lattice row's top-k taken on the host in
``torch.topk``'s order (``_row_topk``: ATen's ``topk_impl_loop`` restated, with a shortcut when the
answer is unique), the lattice rows of ``candidate_lattice`` (``lattice_rows`` / ``lattice_topk``),
and the Kneser-Ney tables' per-token unigram row and per-context-token ranges (``search_tables``,
``kneser_ney_higher_indexed``): the same values as the kernels of ``specpolicy.core.compiled``
they stand for, found with fewer operations; and a block drafter's writes of a path into its block
(``path_into_block``, Fast-dLLM's: ``runners/fastdllm_host.search_apply``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from specpolicy.core.compiled import (
    _adjust_heap,
    _before_value,
    _lookup_one,
    _make_heap,
    _select,
    _sort_heap,
    block_scan,
    kneser_ney_unigram,
)


@njit(cache=True)
def _row_topk(row: np.ndarray, top: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """``torch.topk(row, top)`` on the CPU (largest, sorted, ties in its order) into ``vals`` / ``idx``
    ``(top,)``: ``row`` ``(V,)`` float32 is not changed. When the answer is unique (``_unique_topk``:
    no NaN, the ``top`` best strictly decreasing and strictly above the rest, all positive), any
    method gives torch's; otherwise ATen's ``topk_impl_loop`` restated (``_heap_topk`` /
    ``compiled._select``), the order among equal values included."""
    vocab = row.shape[0]
    if top * 64 <= vocab:  # std::partial_sort in ATen
        if not _unique_topk(row, top, vals, idx):
            _heap_topk(row, top, vals, idx)
    else:  # std::nth_element, then std::sort of the first top - 1
        scratch, order = row.copy(), np.arange(vocab)
        _select(scratch, order, top)
        vals[:top], idx[:top] = scratch[:top], order[:top]


@njit(cache=True)
def _heap_topk(row: np.ndarray, top: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """``compiled._select``'s heap select reading ``row`` in place (``64 top <= V``): a run of 16
    entries none of which beats the heap's top is skipped after one check (the top only rises, so
    none of them would have entered), each other entry as ``std::partial_sort`` takes it."""
    vocab = row.shape[0]
    for j in range(top):
        vals[j], idx[j] = row[j], j
    _make_heap(vals, idx, 0, top)
    i = top
    while i < vocab:
        end = min(i + 16, vocab)
        threshold = vals[0]
        hit = False
        for j in range(i, end):
            hit |= (row[j] > threshold) | (row[j] != row[j])
        if hit:
            for j in range(i, end):
                if _before_value(row[j], vals[0]):  # _pop_heap with the entry j as its result
                    _adjust_heap(vals, idx, 0, 0, top, row[j], j)
        i = end
    _sort_heap(vals, idx, 0, top)


@njit(cache=True)
def _unique_topk(row: np.ndarray, top: int, vals: np.ndarray, idx: np.ndarray) -> bool:
    """The ``top`` largest of ``row`` ``(V,)`` float32 (``V >= 64 top``) into ``vals`` / ``idx`` in
    decreasing order when they are unique -- no NaN in the row, the ``top`` values positive, strictly
    decreasing and strictly above every other entry, so ``torch.topk``'s answer is the same whatever
    its algorithm's order; returns False (``vals`` / ``idx`` unspecified) otherwise. On the float32
    bit patterns as int32 (ordered as the floats for positive ones): the row cut into ``R = V // 16``
    groups (entries ``r, r + R, ..., r + 15 R``; the last ``V % 16`` one more), each group's largest
    pattern (a vectorised pass), the ``top``-th largest of those a lower bound for the answer (``top``
    groups hold an entry at or above it), then the entries at or above it sorted."""
    bits = row.view(np.int32)
    vocab = bits.shape[0]
    groups = vocab // 16
    peaks = np.empty(groups + 1, dtype=np.int32)
    peaks[:groups] = bits[:groups]
    for k in range(1, 16):
        for r in range(groups):
            b, p = bits[k * groups + r], peaks[r]
            peaks[r] = b if b > p else p
    tail = np.int32(-(2**31))
    for j in range(16 * groups, vocab):
        tail = max(tail, bits[j])
    peaks[groups] = tail
    negative_nan = 0  # a NaN with its sign bit set: an int32 between -inf's pattern and 0
    for j in range(vocab):
        b = bits[j]
        negative_nan |= np.int32(b < 0) & np.int32(b > -8388608)
    if negative_nan:
        return False
    best = np.full(top, np.int32(-(2**31)))  # the top largest peaks, decreasing
    for r in range(groups + 1):
        p = peaks[r]
        if p > best[top - 1]:
            j = top - 1
            while j > 0 and best[j - 1] < p:
                best[j] = best[j - 1]
                j -= 1
            best[j] = p
    bound = best[top - 1]
    if bound <= 0:
        return False
    count = 0
    for r in range(groups + 1):
        if peaks[r] >= bound:
            count += 16
    keys = np.empty(count, dtype=np.int32)
    where = np.empty(count, dtype=np.int64)
    count = 0
    for r in range(groups + 1):
        if peaks[r] >= bound:
            members = range(r, 16 * groups, groups) if r < groups else range(16 * groups, vocab)
            for j in members:
                b = bits[j]
                if b >= bound:  # insertion sort, decreasing
                    if b > 0x7F800000:
                        return False  # a NaN
                    k = count
                    while k > 0 and keys[k - 1] < b:
                        keys[k], where[k] = keys[k - 1], where[k - 1]
                        k -= 1
                    keys[k], where[k] = b, j
                    count += 1
    for j in range(top):
        if j + 1 < count and keys[j] == keys[j + 1]:
            return False  # a tie among the best or at the boundary: the algorithm's order decides
        vals[j], idx[j] = row[where[j]], where[j]
    return True


@njit(cache=True)
def _lattice_row(
    i: int,
    vals: np.ndarray,
    cols: np.ndarray,
    stop_values: np.ndarray,
    stop_cols: np.ndarray,
    token_map: np.ndarray,
    mass: np.float32,
    tokens: np.ndarray,
    values: np.ndarray,
    valid: np.ndarray,
) -> bool:
    """Row ``i`` of ``candidate_lattice`` from its top-k ``vals`` ``(top,)`` float32 / ``cols``
    ``(top,)`` int64 and its stop columns' probabilities ``stop_values`` ``(s,)`` float32, written
    into ``tokens`` / ``valid`` ``(N, M)`` and ``values`` ``(N M,)`` (clamped at 1e-30 as
    ``candidate_lattice`` clamps before its log); returns whether a stop token is in the row's set
    on its own merit (the lattice ends there). The set reaching ``mass`` is ``cumsum - value <
    mass`` in float32 with the sum accumulated in float64 (``torch.cumsum`` on the CPU); a stop
    token is matched by its column."""
    top, s = cols.shape[0], stop_cols.shape[0]
    size = top + s
    floor = np.float32(1e-30)
    mapped = token_map.shape[0] > 0
    total = 0.0
    for j in range(top):
        total += np.float64(vals[j])
        valid[i, j] = np.float32(np.float32(total) - vals[j]) < mass
        tokens[i, j] = token_map[cols[j]] if mapped else cols[j]
        v = vals[j]
        values[i * size + j] = v if (v != v or v >= floor) else floor
    natural = False
    for k in range(s):
        in_set = False
        for j in range(top):
            if valid[i, j] and cols[j] == stop_cols[k]:
                in_set = True
        natural = natural or in_set
        tokens[i, top + k] = token_map[stop_cols[k]] if mapped else stop_cols[k]
        v = stop_values[k]
        values[i * size + top + k] = v if (v != v or v >= floor) else floor
        valid[i, top + k] = not in_set  # the others added, once
    return natural


@njit(cache=True)
def lattice_rows(
    probs: np.ndarray,
    top: int,
    stop_cols: np.ndarray,
    token_map: np.ndarray,
    mass: np.float32,
    tokens: np.ndarray,
    values: np.ndarray,
    valid: np.ndarray,
) -> int:
    """``candidate_lattice`` of ``probs`` ``(n, V)`` float32 on the host, top-k included
    (``_row_topk``), into the buffers of ``_lattice_row``; returns the lattice's length ``m``."""
    n, s = probs.shape[0], stop_cols.shape[0]
    vals, cols = np.empty(top, dtype=np.float32), np.empty(top, dtype=np.int64)
    stop_values = np.empty(s, dtype=np.float32)
    for i in range(n):
        _row_topk(probs[i], top, vals, cols)
        for k in range(s):
            stop_values[k] = probs[i, stop_cols[k]]
        if _lattice_row(i, vals, cols, stop_values, stop_cols, token_map, mass, tokens, values, valid):
            return i + 1
    return n


@njit(cache=True)
def lattice_topk(
    top_values: np.ndarray,
    top_cols: np.ndarray,
    stop_values: np.ndarray,
    stop_cols: np.ndarray,
    token_map: np.ndarray,
    mass: np.float32,
    tokens: np.ndarray,
    values: np.ndarray,
    valid: np.ndarray,
) -> int:
    """``lattice_rows`` after a device's top-k: ``top_values`` ``(n, top)`` float32, ``top_cols``
    ``(n, top)`` int64, ``stop_values`` ``(n, s)`` float32; returns ``m``."""
    n = top_values.shape[0]
    for i in range(n):
        if _lattice_row(
            i, top_values[i], top_cols[i], stop_values[i], stop_cols, token_map, mass, tokens, values, valid
        ):
            return i + 1
    return n


def search_tables(tables: tuple) -> tuple:
    """The compiled search's Kneser-Ney tables: ``NGramModel.compiled_tables()`` followed by each
    token's unigram estimate ``(base,)`` float64 (``kneser_ney_unigram`` of every token: the same
    values), ``starts`` ``(order + 1, 3, base + 1)`` int64 -- for each order n >= 2 and each of its
    three tables (counts, prefixes' totals, prefixes' types), where in the fused keys the entries whose
    oldest context token is t begin (``starts[n, j, t]``) and end (``starts[n, j, t + 1]``) -- and
    whether every estimate is a finite number (finite counts and discounts, a positive unigram total)."""
    keys, values, discounts, unigram_total, unigram_types, vocab_size, base, order = tables
    unigram_probs = np.empty(base)
    every = np.arange(base, dtype=np.int64)
    kneser_ney_unigram(keys, values, discounts, unigram_total, unigram_types, vocab_size, base, every, unigram_probs)
    offset = base**order
    starts = np.zeros((order + 1, 3, base + 1), dtype=np.int64)
    bounds = np.arange(base + 1, dtype=np.int64)
    for n in range(2, order + 1):
        table = 3 * (n - 1)
        for j, digits in ((0, n), (1, n - 1), (2, n - 1)):
            starts[n, j] = np.searchsorted(keys, (table + j) * offset + bounds * base ** (digits - 1))
    finite = bool(
        np.isfinite(values).all() and np.isfinite(discounts).all() and np.isfinite(unigram_types) and unigram_total > 0
    )
    return (*tables, unigram_probs, starts, finite)


@njit(cache=True, inline="always")
def _lookup_range(keys: np.ndarray, values: np.ndarray, lo: int, hi: int, code: int) -> float:
    """``values`` at ``code`` in ``keys[lo:hi]`` (sorted, holding every entry ``code`` could be), 0 when
    absent: ``compiled._lookup_one`` on the whole keys, searching less."""
    if hi <= lo:
        return 0.0
    at = min(lo + np.searchsorted(keys[lo:hi], code), hi - 1)
    return values[at] if keys[at] == code else 0.0


@njit(cache=True)
def kneser_ney_higher_indexed(
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    base: int,
    order: int,
    starts: np.ndarray,
    context: np.ndarray,
    tokens: np.ndarray,
    out: np.ndarray,
) -> None:
    """``compiled.kneser_ney_higher`` (the same IEEE operations in the same order on the same counts)
    with each lookup searched inside the range of its n-gram's oldest context token (``starts``,
    ``search_tables``); a context token outside ``[0, base)`` searches the whole keys."""
    offset = base**order
    total_keys = keys.shape[0]
    prefix = 0
    for n in range(2, order + 1):
        oldest = context[order - n]
        prefix = oldest * base ** (n - 2) + prefix  # the code of the last n - 1 context tokens
        table = 3 * (n - 1) * offset
        if 0 <= oldest < base:
            c_lo, c_hi = starts[n, 0, oldest], starts[n, 0, oldest + 1]
            t_lo, t_hi = starts[n, 1, oldest], starts[n, 1, oldest + 1]
            y_lo, y_hi = starts[n, 2, oldest], starts[n, 2, oldest + 1]
        else:
            c_lo, c_hi, t_lo, t_hi, y_lo, y_hi = 0, total_keys, 0, total_keys, 0, total_keys
        total_n = _lookup_range(keys, values, t_lo, t_hi, prefix + table + offset)
        if total_n > 0:
            types_n = _lookup_range(keys, values, y_lo, y_hi, prefix + table + 2 * offset)
            d = discounts[n - 1]
            run = keys[c_lo:c_hi]
            lo = c_lo + np.searchsorted(run, prefix * base + table)
            hi = c_lo + np.searchsorted(run, (prefix + 1) * base + table)
            run_keys, run_values = keys[lo:hi], values[lo:hi]
            for c in range(tokens.shape[0]):
                count = _lookup_one(run_keys, run_values, (prefix * base + tokens[c]) + table)
                out[c] = (max(count - d, 0.0) + d * types_n * out[c]) / max(total_n, 1.0)


@njit(cache=True)
def path_into_block(
    path: np.ndarray,
    conf: np.ndarray,
    first: int,
    lo: int,
    block_ids: np.ndarray,
    block_conf: np.ndarray,
    masked: np.ndarray,
    stops: np.ndarray,
    first_drafted: int,
    row: np.ndarray,
) -> tuple[int, int]:
    """A path search's result written into a block drafter's host block in ONE call: ``path`` ``(m,)``
    int64 and its confidences ``conf`` ``(m,)`` float32 at offsets ``[first, first + m)`` of
    ``block_ids`` ``(B,)`` int64 / ``block_conf`` ``(B,)`` float32, unmasked in ``masked`` ``(B,)``
    bool; ``row`` ``(b - lo,)`` float32 the small block's confidence row (from offset ``lo``: the
    path's confidences, NaN elsewhere); then ``compiled.block_scan`` (``stops`` ``(s,)`` int64, the
    first drafted offset ``first_drafted``), whose pair it returns."""
    for i in range(row.shape[0]):
        row[i] = np.nan
    for i in range(path.shape[0]):
        block_ids[first + i] = path[i]
        block_conf[first + i] = conf[i]
        masked[first + i] = False
        row[first - lo + i] = conf[i]
    return block_scan(block_ids, masked, stops, first_drafted)
