"""Compiled host kernels for the searches a round runs between model passes (issue 48, item 5: host
work per round): ``numba`` ``njit`` functions, compiled on first call and cached on disk
(``cache=True``: later processes load the machine code instead of compiling again).

``topk_largest`` reproduces ``torch.topk(values, k)`` (largest, sorted) on a float64 vector on the
CPU, ties included: ATen's ``topk_impl_loop`` (``ATen/native/TopKImpl.h``) fills a queue of
``(value, index)`` pairs in index order and calls ``std::nth_element`` then ``std::sort`` on the
first ``k - 1`` (or ``std::partial_sort`` when ``64 k <= n``), with NaN ranked above everything; the
order among equal values is whatever libstdc++'s introselect / heap select leave, so those
algorithms are restated here step for step (GCC's ``bits/stl_algo.h`` / ``bits/stl_heap.h``). A
search ported from a loop that called ``torch.topk`` then picks the same entries in the same order
(``tests/core/test_compiled.py`` checks it against ``torch.topk`` on tie-heavy vectors).

``kneser_ney_row`` is ``NGramModel.kneser_ney_probs`` for one context (the same float64 operations
in the same order over the same fused tables).

``unmask_pick``, ``unmask_apply`` and ``block_scan`` are the Fast-dLLM v2 drafter's per-pass
bookkeeping on its current block (``drafters/fastdllm.py``): which masked positions a pass unmasks,
writing them, and how far the block is unmasked (with its first drafted stop token) -- the torch
rule they replaced, element for element, on the host copy of a block of B (32) positions.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from specpolicy.core.compiled_falcon import _falcon_layout_into

# -- torch.topk's order (libstdc++'s algorithms over (value, index) pairs) ---------------------------


@njit(cache=True, inline="always")
def _before(vals: np.ndarray, a: int, b: int) -> bool:
    """``topk``'s comparator, largest first: NaN above every number, then ``>``."""
    x, y = vals[a], vals[b]
    return (math.isnan(x) and not math.isnan(y)) or x > y


@njit(cache=True, inline="always")
def _before_value(x: float, y: float) -> bool:
    return (math.isnan(x) and not math.isnan(y)) or x > y


@njit(cache=True, inline="always")
def _swap(vals: np.ndarray, idx: np.ndarray, a: int, b: int) -> None:
    vals[a], vals[b] = vals[b], vals[a]
    idx[a], idx[b] = idx[b], idx[a]


@njit(cache=True)
def _push_heap(vals, idx, first, hole, top, value, value_index):
    parent = (hole - 1) // 2
    while hole > top and _before_value(vals[first + parent], value):
        vals[first + hole], idx[first + hole] = vals[first + parent], idx[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    vals[first + hole], idx[first + hole] = value, value_index


@njit(cache=True)
def _adjust_heap(vals, idx, first, hole, length, value, value_index):
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _before(vals, first + child, first + child - 1):
            child -= 1
        vals[first + hole], idx[first + hole] = vals[first + child], idx[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        vals[first + hole], idx[first + hole] = vals[first + child - 1], idx[first + child - 1]
        hole = child - 1
    _push_heap(vals, idx, first, hole, top, value, value_index)


@njit(cache=True)
def _make_heap(vals, idx, first, last):
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        _adjust_heap(vals, idx, first, parent, length, vals[first + parent], idx[first + parent])
        if parent == 0:
            return
        parent -= 1


@njit(cache=True)
def _pop_heap(vals, idx, first, last, result):
    value, value_index = vals[result], idx[result]
    vals[result], idx[result] = vals[first], idx[first]
    _adjust_heap(vals, idx, first, 0, last - first, value, value_index)


@njit(cache=True)
def _heap_select(vals, idx, first, middle, last):
    _make_heap(vals, idx, first, middle)
    for i in range(middle, last):
        if _before(vals, i, first):
            _pop_heap(vals, idx, first, middle, i)


@njit(cache=True)
def _sort_heap(vals, idx, first, last):
    while last - first > 1:
        last -= 1
        _pop_heap(vals, idx, first, last, last)


@njit(cache=True)
def _move_median_to_first(vals, idx, result, a, b, c):
    if _before(vals, a, b):
        if _before(vals, b, c):
            _swap(vals, idx, result, b)
        elif _before(vals, a, c):
            _swap(vals, idx, result, c)
        else:
            _swap(vals, idx, result, a)
    elif _before(vals, a, c):
        _swap(vals, idx, result, a)
    elif _before(vals, b, c):
        _swap(vals, idx, result, c)
    else:
        _swap(vals, idx, result, b)


@njit(cache=True)
def _unguarded_partition(vals, idx, first, last, pivot):
    while True:
        while _before(vals, first, pivot):
            first += 1
        last -= 1
        while _before(vals, pivot, last):
            last -= 1
        if not first < last:
            return first
        _swap(vals, idx, first, last)
        first += 1


@njit(cache=True)
def _partition_pivot(vals, idx, first, last):
    mid = first + (last - first) // 2
    _move_median_to_first(vals, idx, first, first + 1, mid, last - 1)
    return _unguarded_partition(vals, idx, first + 1, last, first)


@njit(cache=True)
def _unguarded_linear_insert(vals, idx, last):
    value, value_index = vals[last], idx[last]
    nxt = last - 1
    while _before_value(value, vals[nxt]):
        vals[last], idx[last] = vals[nxt], idx[nxt]
        last = nxt
        nxt -= 1
    vals[last], idx[last] = value, value_index


@njit(cache=True)
def _insertion_sort(vals, idx, first, last):
    if first == last:
        return
    for i in range(first + 1, last):
        if _before(vals, i, first):
            value, value_index = vals[i], idx[i]
            for j in range(i, first, -1):
                vals[j], idx[j] = vals[j - 1], idx[j - 1]
            vals[first], idx[first] = value, value_index
        else:
            _unguarded_linear_insert(vals, idx, i)


@njit(cache=True)
def _floor_log2(n):
    out = 0
    while n > 1:
        n >>= 1
        out += 1
    return out


@njit(cache=True)
def _introselect(vals, idx, first, nth, last):
    depth_limit = 2 * _floor_log2(last - first)
    while last - first > 3:
        if depth_limit == 0:
            _heap_select(vals, idx, first, nth + 1, last)
            _swap(vals, idx, first, nth)  # the nth element in its final place
            return
        depth_limit -= 1
        cut = _partition_pivot(vals, idx, first, last)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(vals, idx, first, last)


_THRESHOLD = 16  # libstdc++'s _S_threshold


@njit(cache=True)
def _introsort_loop(vals, idx, first, last, depth_limit):
    """libstdc++'s ``__introsort_loop`` with its recursion on the right part kept on a stack (a
    compiled function that calls itself does not load back from numba's cache): the parts are
    disjoint, so the order they are sorted in leaves the same array."""
    stack = [(first, last, depth_limit)]
    while len(stack):
        first, last, depth_limit = stack.pop()
        while last - first > _THRESHOLD:
            if depth_limit == 0:
                _heap_select(vals, idx, first, last, last)  # std::__partial_sort(first, last, last)
                _sort_heap(vals, idx, first, last)
                break
            depth_limit -= 1
            cut = _partition_pivot(vals, idx, first, last)
            stack.append((cut, last, depth_limit))
            last = cut


@njit(cache=True)
def _sort(vals, idx, first, last):
    if first == last:
        return
    _introsort_loop(vals, idx, first, last, 2 * _floor_log2(last - first))
    if last - first > _THRESHOLD:  # __final_insertion_sort
        _insertion_sort(vals, idx, first, first + _THRESHOLD)
        for i in range(first + _THRESHOLD, last):
            _unguarded_linear_insert(vals, idx, i)
    else:
        _insertion_sort(vals, idx, first, last)


@njit(cache=True)
def _select(vals: np.ndarray, idx: np.ndarray, k: int) -> None:
    """ATen's ``topk_impl_loop`` (largest, sorted) on a queue of ``(vals[j], idx[j])`` pairs filled in
    index order: the best ``k`` end up first, in ``torch.topk``'s order."""
    n = vals.shape[0]
    if k * 64 <= n:  # std::partial_sort
        _heap_select(vals, idx, 0, k, n)
        _sort_heap(vals, idx, 0, k)
    else:  # std::nth_element, then std::sort of the first k - 1
        if k - 1 != n:
            _introselect(vals, idx, 0, k - 1, n)
        _sort(vals, idx, 0, k - 1)


@njit(cache=True)
def topk_largest(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``torch.topk(torch.from_numpy(values), k)`` (largest, sorted) on the CPU, ties in torch's
    order: ``values`` ``(n,) float64``, ``1 <= k <= n`` -> ``(indices (k,) int64, values (k,)
    float64)``. Scratch copies; ``values`` is not changed."""
    vals = values.copy()
    idx = np.arange(values.shape[0])
    _select(vals, idx, k)
    return idx[:k].copy(), vals[:k].copy()


# -- Kneser-Ney scores (NGramModel.kneser_ney_probs, one context) ------------------------------------


@njit(cache=True, inline="always")
def _lookup_one(keys: np.ndarray, values: np.ndarray, code: int) -> float:
    """``values`` at ``code`` in the sorted ``keys``, 0 when absent (``ngram._lookup``)."""
    if keys.shape[0] == 0:
        return 0.0
    at = min(np.searchsorted(keys, code), keys.shape[0] - 1)
    return values[at] if keys[at] == code else 0.0


@njit(cache=True)
def kneser_ney_row(
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    order: int,
    context: np.ndarray,
    tokens: np.ndarray,
    out: np.ndarray,
) -> None:
    """``NGramModel.kneser_ney_probs`` of one context row: ``context`` ``(order - 1,) int64``,
    ``tokens`` ``(C,) int64`` -> ``out`` ``(C,) float64`` (written), the same IEEE operations in the
    same order. ``keys`` / ``values``: the fused tables (``NGramModel._fused_tables``),
    ``discounts`` ``(order,) float64`` each order's discount."""
    kneser_ney_unigram(keys, values, discounts, unigram_total, unigram_types, vocab_size, base, tokens, out)
    kneser_ney_higher(keys, values, discounts, base, order, context, tokens, out)


# -- DART's trie rule (NGramModel.trie_probs_np) -----------------------------------------------------


@njit(cache=True)
def trie_probs(
    keys: np.ndarray,
    counts: np.ndarray,
    starts: np.ndarray,
    follower_keys: np.ndarray,
    follower_counts: np.ndarray,
    follower_starts: np.ndarray,
    base: int,
    context: np.ndarray,
    tokens: np.ndarray,
) -> np.ndarray:
    """``NGramModel.trie_probs_np``: ``context`` ``(B, order - 1)`` int64, ``tokens`` ``(B, C)`` int64
    -> ``(B, C)`` float32, ``count(s + token) / count(s)`` for the longest context suffix ``s`` the
    token was seen after (0 if none), the same float32 operations. The per-order tables are
    concatenated: order n's sorted codes and counts are ``keys[starts[n - 1]:starts[n]]`` (likewise
    the followers of each j-token context, j = 1 .. order - 1)."""
    batch, width = tokens.shape
    order = context.shape[1] + 1
    probs = np.zeros((batch, width), dtype=np.float32)
    for b in range(batch):
        found = np.zeros(width, dtype=np.bool_)
        for j in range(order - 1, 0, -1):
            code = context[b, order - 1 - j]
            for t in range(order - j, order - 1):
                code = code * base + context[b, t]
            parent = np.float32(_lookup_one(keys[starts[j - 1] : starts[j]], counts[starts[j - 1] : starts[j]], code))
            if not parent > 0:
                lo, hi = follower_starts[j - 1], follower_starts[j]
                parent = np.float32(_lookup_one(follower_keys[lo:hi], follower_counts[lo:hi], code))
            parent = max(parent, np.float32(1))
            # the (j + 1)-grams continuing this suffix: the codes in [code * base, (code + 1) * base),
            # one range of the sorted keys, found once; each candidate is looked up inside it
            order_keys, order_counts = keys[starts[j] : starts[j + 1]], counts[starts[j] : starts[j + 1]]
            lo = np.searchsorted(order_keys, code * base)
            hi = np.searchsorted(order_keys, (code + 1) * base)
            if lo == hi:
                continue
            run_keys, run_counts = order_keys[lo:hi], order_counts[lo:hi]
            for c in range(width):
                if found[c]:
                    continue
                child = np.float32(_lookup_one(run_keys, run_counts, code * base + tokens[b, c]))
                if child > 0:
                    probs[b, c] = child / parent
                    found[c] = True
    return probs


# -- draft trees (``specpolicy.core.tree``) ----------------------------------------------------------


@njit(cache=True)
def tree_shape(parents: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """A draft tree's shape from its parents ``(k,) int64`` (topological: ``-1 <= parents[i] < i``),
    in one pass over the nodes (a node's parent comes first, so its row is complete): ``(bad,
    ancestors, depths)``. ``ancestors`` ``(k + 1, k + 1) bool``: row/column 0 the root, i + 1 node i;
    True where the column is the row itself or one of its ancestors (the root is everyone's) -- the
    parent's row plus the node itself. ``depths`` ``(k,) int64`` (1 = a child of the root). ``bad``:
    the first node whose parent breaks the order (the rows from it on left unfilled), else -1."""
    k = parents.shape[0]
    mask = np.zeros((k + 1, k + 1), dtype=np.bool_)
    depth = np.ones(k, dtype=np.int64)
    mask[0, 0] = True
    for i in range(k):
        parent = parents[i]
        if parent < -1 or parent >= i:
            return i, mask, depth
        row = i + 1
        if parent >= 0:
            mask[row, :row] = mask[parent + 1, :row]
            depth[i] = depth[parent] + 1
        else:
            mask[row, 0] = True
        mask[row, row] = True
    return -1, mask, depth


@njit(cache=True)
def move_rows(entries: np.ndarray, rows: np.ndarray, start: int) -> None:
    """A KV cache layer's tree path moved down, in place: ``entries`` ``(b, heads, n, d)``, ``rows``
    ``(m,) int64`` increasing with ``rows[i] >= i``; position ``start + i`` takes position
    ``start + rows[i]`` for each i in order (a source is never overwritten before it is read)."""
    for b in range(entries.shape[0]):
        for h in range(entries.shape[1]):
            for i in range(rows.shape[0]):
                source = start + rows[i]
                if source != start + i:
                    entries[b, h, start + i, :] = entries[b, h, source, :]


# -- Fast-dLLM v2's unmasking bookkeeping (drafters/fastdllm.py) -------------------------------------


@njit(cache=True)
def unmask_pick(conf: np.ndarray, masked: np.ndarray, threshold: np.float32, left_to_right: bool) -> np.ndarray:
    """Which masked positions of a small block one pass unmasks: ``conf`` ``(m,)`` float32 (the
    pass's confidences), ``masked`` ``(m,)`` bool (True = masked), ``threshold`` float32 -> ``(m,)``
    bool. Any order (greedy): every masked position with ``conf > threshold``, and the most confident
    masked one (``argmax`` of the confidences with -1 at unmasked positions: the first maximum, a NaN
    ranked first, as ``torch.argmax``). Left to right (sampling): the leading run of positions that
    are unmasked or above ``threshold``, masked, and the leftmost masked one (Fast-dLLM v2, arXiv
    2509.26328, confidence-aware parallel decoding; ``FastDLLMDrafter._select``)."""
    m = conf.shape[0]
    pick = np.zeros(m, dtype=np.bool_)
    if left_to_right:
        run, leftmost = True, True
        for i in range(m):
            run = run and (conf[i] > threshold or not masked[i])
            pick[i] = masked[i] and (run or leftmost)
            if masked[i]:
                leftmost = False
        return pick
    best, best_value = -1, np.float32(-1.0)
    for i in range(m):
        value = conf[i] if masked[i] else np.float32(-1.0)
        if best < 0 or (not np.isnan(best_value) and (np.isnan(value) or value > best_value)):
            best, best_value = i, value
        pick[i] = masked[i] and conf[i] > threshold
    if best < 0:
        return pick
    pick[best] = pick[best] or masked[best]
    return pick


@njit(cache=True)
def unmask_apply(
    tokens: np.ndarray,
    conf: np.ndarray,
    pick: np.ndarray,
    lo: int,
    block_ids: np.ndarray,
    block_conf: np.ndarray,
    masked: np.ndarray,
    row: np.ndarray,
) -> None:
    """Write one pass's picks into the block, in place: ``tokens`` ``(m,)`` int64, ``conf`` ``(m,)``
    float32 and ``pick`` ``(m,)`` bool of the small block's offsets ``[lo, lo + m)``; ``block_ids``
    ``(B,)`` int64, ``block_conf`` ``(B,)`` float32, ``masked`` ``(B,)`` bool; ``row`` ``(m,)``
    float32 receives the pass's confidences at the positions masked before it (NaN elsewhere)."""
    for i in range(tokens.shape[0]):
        was = masked[lo + i]
        row[i] = conf[i] if was else np.float32(np.nan)
        if pick[i]:
            block_ids[lo + i] = tokens[i]
            block_conf[lo + i] = conf[i]
            masked[lo + i] = False


@njit(cache=True)
def block_scan(block_ids: np.ndarray, masked: np.ndarray, stops: np.ndarray, first_drafted: int) -> tuple[int, int]:
    """How far a block is unmasked: ``(filled, first_stop)``, the first masked offset (B when none)
    and the first offset ``>= first_drafted`` holding an unmasked stop token (``stops`` ``(s,)``
    int64; B when none) of ``block_ids`` ``(B,)`` int64 under ``masked`` ``(B,)`` bool."""
    size = block_ids.shape[0]
    filled = size
    for p in range(size):
        if masked[p]:
            filled = p
            break
    first_stop = size
    for p in range(max(first_drafted, 0), size):
        if not masked[p]:
            for s in stops:
                if block_ids[p] == s:
                    first_stop = p
                    break
            if first_stop < size:
                break
    return filled, first_stop


# -- Fast-dLLM v2's whole unmasking step (drafters/fastdllm.py; h48-dllm2) ---------------------------


@njit(cache=True)
def unmask_step(
    tokens: np.ndarray,
    conf: np.ndarray,
    lo: int,
    block_ids: np.ndarray,
    block_conf: np.ndarray,
    masked: np.ndarray,
    threshold: np.float32,
    left_to_right: bool,
    stops: np.ndarray,
    first_drafted: int,
    pick: np.ndarray,
    row: np.ndarray,
) -> tuple[int, int]:
    """One unmasking pass's bookkeeping in ONE call: ``unmask_pick`` over the small block's offsets
    ``[lo, lo + m)`` (``tokens`` ``(m,)`` int64, ``conf`` ``(m,)`` float32, the pass's choice), then
    ``unmask_apply`` into the block (``block_ids`` ``(B,)`` int64, ``block_conf`` ``(B,)`` float32,
    ``masked`` ``(B,)`` bool, in place), then ``block_scan`` (``stops`` ``(s,)`` int64, the first
    drafted offset ``first_drafted``). Writes the picks into ``pick[:m]`` (``(>= m,)`` bool) and the
    confidences at the positions masked before the pass (NaN elsewhere) into ``row`` ``(m,)`` float32
    (arrays the caller owns: returning new ones costs the call two object unpickles); returns
    ``block_scan``'s pair -- the three kernels' results, by calling them."""
    m = tokens.shape[0]
    chosen = unmask_pick(conf, masked[lo : lo + m], threshold, left_to_right)
    pick[:m] = chosen
    unmask_apply(tokens, conf, chosen, lo, block_ids, block_conf, masked, row)
    return block_scan(block_ids, masked, stops, first_drafted)


# -- Kneser-Ney scores in two stages (the path search's beams; h48-dllm2) -----------------------------


@njit(cache=True)
def kneser_ney_unigram(
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    tokens: np.ndarray,
    out: np.ndarray,
) -> None:
    """``kneser_ney_row``'s first stage (the unigram estimate of ``tokens`` ``(C,) int64`` into ``out``
    ``(C,) float64``), which reads no context: computed once per lattice position and shared by
    every beam (``kneser_ney_higher`` completes a beam's row from a copy). The same IEEE operations."""
    d = discounts[0]
    # a table's entries for one context are one run of the sorted keys (the codes context * base +
    # token, token < base): found once, then every candidate is looked up inside it
    lo, hi = np.searchsorted(keys, 0), np.searchsorted(keys, base)  # the unigram counts (table 0)
    run_keys, run_values = keys[lo:hi], values[lo:hi]
    for c in range(tokens.shape[0]):
        count = _lookup_one(run_keys, run_values, tokens[c])
        out[c] = (max(count - d, 0.0) + d * unigram_types / vocab_size) / unigram_total


@njit(cache=True)
def kneser_ney_higher(
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    base: int,
    order: int,
    context: np.ndarray,
    tokens: np.ndarray,
    out: np.ndarray,
) -> None:
    """``kneser_ney_row``'s orders 2..``order`` for ``context`` ``(order - 1,) int64``, in place on
    ``out`` ``(C,) float64`` holding ``kneser_ney_unigram``'s row: after both, ``out`` is bit for bit
    ``kneser_ney_row``'s (the same operations in the same order)."""
    offset = base**order
    prefix = 0
    for n in range(2, order + 1):
        prefix = context[order - n] * base ** (n - 2) + prefix  # the code of the last n - 1 context tokens
        table = 3 * (n - 1) * offset
        total_n = _lookup_one(keys, values, prefix + table + offset)
        if total_n > 0:
            types_n = _lookup_one(keys, values, prefix + table + 2 * offset)
            d = discounts[n - 1]
            lo, hi = np.searchsorted(keys, prefix * base + table), np.searchsorted(keys, (prefix + 1) * base + table)
            run_keys, run_values = keys[lo:hi], values[lo:hi]
            for c in range(tokens.shape[0]):
                count = _lookup_one(run_keys, run_values, (prefix * base + tokens[c]) + table)
                out[c] = (max(count - d, 0.0) + d * types_n * out[c]) / max(total_n, 1.0)


# -- Falcon's tree blocks (``drafters/falcon.py``, ``tree_block_expand``) ------------------------------


@njit(cache=True)
def falcon_block_layout(
    ancestors: np.ndarray, depths: np.ndarray, parents: np.ndarray, base: int, committed: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Add ``m`` blocks under ``parents`` ``(m,) int64`` (0 = the root block, else an earlier block's
    row; ``base + m < cap``) as rows ``base + 1 .. base + m`` of the block tree, and lay out their pass: ``ancestors``
    ``(cap, cap) bool`` (row r: block r's ancestors-or-self among blocks 1..; row 0 empty) and
    ``depths`` ``(cap,) int64`` (the root 0) filled in place; returns positions ``(1, m k) int64``
    (block j's k tokens from ``committed + (depth - 1) k``) and the mask ``(m k, committed + (base +
    m) k) bool`` (True = attend: every committed position, then each ancestor-or-self block's k
    positions) -- ``tree.GrowingTree.add`` with ``block_layout`` on one node per block, in one call."""
    positions = np.empty((1, parents.shape[0] * k), dtype=np.int64)
    mask = _falcon_layout_into(ancestors, depths, parents, base, committed, k, positions)
    return positions, mask


# -- EAGLE-2's dynamic tree and the tree bookkeeping around a pass (policies/eagle2_tree.py,
# specpolicy.core.tree.GrowingTree, specpolicy.core.cache.keep_path) -----------------------------------


@njit(cache=True, inline="always")
def _ranks_above(x: float, y: float) -> bool:
    """Largest first as ``np.argsort(-scores, kind="stable")`` orders: x strictly ahead of y (NaN last,
    equal values keep their order: never ahead)."""
    return not math.isnan(x) and (math.isnan(y) or x > y)


@njit(cache=True)
def _best_of(scores: np.ndarray, lo: int, hi: int, count: int, out: np.ndarray) -> int:
    """The ``count`` best of ``scores[lo:hi]`` (absolute indices into ``out``, best first) as
    ``np.argsort(-scores[lo:hi], kind="stable")[:count] + lo`` picks them: insertion into the kept
    run, a later value going after the equal ones. Returns how many (``min(count, hi - lo)``)."""
    kept = 0
    for i in range(lo, hi):
        x = scores[i]
        if kept < count:
            at = kept
            kept += 1
        elif count > 0 and _ranks_above(x, scores[out[count - 1]]):
            at = count - 1
        else:
            continue
        while at > 0 and _ranks_above(x, scores[out[at - 1]]):
            out[at] = out[at - 1]
            at -= 1
        out[at] = i
    return kept


@njit(cache=True)
def eagle2_level(
    tokens: np.ndarray,
    scores: np.ndarray,
    parents: np.ndarray,
    parent_nodes: np.ndarray,
    end: int,
    child_ids: np.ndarray,
    child_logp: np.ndarray,
    nodes: np.ndarray,
    best: np.ndarray,
    select: int,
    next_tokens: np.ndarray,
    next_nodes: np.ndarray,
) -> tuple[int, int]:
    """One level of EAGLE-2's expansion (Li et al. 2024, §4) on the policy's candidate buffers
    (``tokens`` / ``parents`` / ``parent_nodes`` ``(N,) int64``, ``scores`` ``(N,)`` float, candidates
    ``[0, end)`` filled, in creation order): the expanded candidates ``best[j]`` (``(m,) int64``; -1:
    the root), now drafter nodes ``nodes[j]``, bring their children ``child_ids`` / ``child_logp``
    ``(m, w)``, appended at ``end`` row by row with cumulative scores ``scores[best[j]] + logp`` (the
    root's children: their log-probabilities as they are), parent candidate ``best[j]`` and parent
    node ``nodes[j]``; then, when ``select`` > 0, the new level's ``select`` best (``_best_of``: the
    stable descending sort's first) go to ``best`` with their tokens and parent nodes in
    ``next_tokens`` / ``next_nodes``. Returns ``(new end, nodes selected)``."""
    m, width = child_ids.shape
    at = end
    for j in range(m):
        parent = best[j]
        for c in range(width):
            tokens[at] = child_ids[j, c]
            scores[at] = child_logp[j, c] if parent < 0 else scores[parent] + child_logp[j, c]
            parents[at] = parent
            parent_nodes[at] = nodes[j]
            at += 1
    if select <= 0:
        return at, 0
    chosen = _best_of(scores, end, at, select, best)
    for j in range(chosen):
        next_tokens[j] = tokens[best[j]]
        next_nodes[j] = parent_nodes[best[j]]
    return at, chosen


@njit(cache=True)
def eagle2_rerank(
    tokens: np.ndarray,
    scores: np.ndarray,
    parents: np.ndarray,
    n: int,
    total: int,
    out_tokens: np.ndarray,
    out_scores: np.ndarray,
    out_parents: np.ndarray,
) -> int:
    """EAGLE-2's reranking: of candidates ``[0, n)`` (``eagle2_level``'s buffers) the ``total`` best
    (``np.argsort(-scores, kind="stable")[:total]``: ties to the earlier, NaN last), kept in creation
    order: their tokens, scores and parents renumbered among the kept (-1: the root, or a parent not
    kept) written to ``out_*`` (``(total,)``). Returns how many were kept."""
    order = np.empty(max(min(total, n), 1), dtype=np.int64)
    kept = _best_of(scores, 0, n, total, order)
    chosen = np.zeros(n, dtype=np.bool_)
    for j in range(kept):
        chosen[order[j]] = True
    renumber = np.full(n, -1, dtype=np.int64)
    j = 0
    for i in range(n):
        if chosen[i]:
            renumber[i] = j
            out_tokens[j] = tokens[i]
            out_scores[j] = scores[i]
            out_parents[j] = renumber[parents[i]] if parents[i] >= 0 else -1
            j += 1
    return kept


@njit(cache=True)
def grow_tree_rows(mask: np.ndarray, position: np.ndarray, parents: np.ndarray, base: int, committed: int) -> None:
    """``GrowingTree.add``'s rows, in place: node ``base + 1 + j`` (row of ``mask`` ``(R, W) bool`` and
    ``position`` ``(R,) int64``) takes its parent's row (``parents[j]``, an earlier node) plus its own
    column ``committed + base + j``, and its parent's position plus one."""
    for j in range(parents.shape[0]):
        row, parent = base + 1 + j, parents[j]
        mask[row, :] = mask[parent, :]
        mask[row, committed + base + j] = True
        position[row] = position[parent] + 1


@njit(cache=True)
def tree_layout(ancestors: np.ndarray, depth: np.ndarray, start: int, positions: np.ndarray, mask: np.ndarray) -> None:
    """A tree verification pass's layout (``specpolicy.core.tree.verification_layout``) from its shape
    (``tree_shape``'s ``ancestors`` ``(k + 1, k + 1) bool`` and ``depths`` ``(k,) int64``) after
    ``start`` cached positions, written into ``positions`` ``(k + 1,) int64`` (``start`` + depth; the
    root at ``start``) and ``mask`` ``(k + 1, start + k + 1) bool`` (True = attend: every committed
    position, then the ancestors-or-self). The caller allocates them (an array made here would be
    boxed at every call)."""
    rows = ancestors.shape[0]
    positions[0] = start
    for i in range(rows - 1):
        positions[i + 1] = start + depth[i]
    for r in range(rows):
        mask[r, :start] = True
        mask[r, start:] = ancestors[r]


# -- Fast-dLLM v2's block opening (drafters/fastdllm.py; h48-dllm3) -----------------------------------


@njit(cache=True)
def block_open(
    block_ids: np.ndarray,
    block_conf: np.ndarray,
    masked: np.ndarray,
    prefix: np.ndarray,
    first_id: int,
    first_conf: np.float32,
    mask_id: int,
    stops: np.ndarray,
) -> tuple[int, int]:
    """Fill a new block in place: ``block_ids`` ``(B,)`` int64 = the committed ``prefix`` ``(t,)`` int64
    (t < B) then ``mask_id``, ``block_conf`` ``(B,)`` float32 = 0, ``masked`` ``(B,)`` bool = offsets
    ``>= t``; when t == 0, offset 0 is the drafted first token ``first_id`` with confidence
    ``first_conf`` (unmasked). Returns ``block_scan``'s pair for the filled block with every offset
    drafted from ``t``: ``(filled, first_stop)``, ``filled`` = max(t, 1) (B when B == 1) and
    ``first_stop`` 0 when the drafted first token is in ``stops`` ``(s,)`` int64, else B."""
    size = block_ids.shape[0]
    t = prefix.shape[0]
    for p in range(size):
        block_ids[p] = prefix[p] if p < t else mask_id
        block_conf[p] = 0
        masked[p] = p >= t
    first_stop = size
    if t == 0:
        block_ids[0] = first_id
        block_conf[0] = first_conf
        masked[0] = False
        t = 1
        for s in stops:
            if first_id == s:
                first_stop = 0
                break
    return t, first_stop


# -- Fast-dLLM v2's block reopened in place after a commit (drafters/fastdllm.py; h48-dllm4) ----------


@njit(cache=True)
def block_reopen(
    block_ids: np.ndarray, block_conf: np.ndarray, masked: np.ndarray, t: int, last_id: int, mask_id: int
) -> None:
    """``block_open`` of a block whose committed prefix ``(t,)`` int64 already lies in ``block_ids``
    (``(B,)`` int64: the round's accepted tokens stay where they were drafted), but for its last token
    ``last_id`` (the verification's next token), written at offset ``t - 1``; then ``mask_id`` at
    offsets ``>= t``, ``block_conf`` ``(B,)`` float32 = 0 and ``masked`` ``(B,)`` bool = offsets
    ``>= t``, in place (1 <= t < B). ``block_open``'s pair for it is ``(t, B)`` (the first masked
    offset, no drafted stop token): the caller knows it."""
    size = block_ids.shape[0]
    block_ids[t - 1] = last_id
    for p in range(size):
        if p >= t:
            block_ids[p] = mask_id
        block_conf[p] = 0
        masked[p] = p >= t
