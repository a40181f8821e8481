"""Compiled host kernels of DART's tree searches (``policies/dart_tree.py``; Liang et al., arXiv
2601.19278, §3.4; fvliang/DART ``Searcher::search``; issue 48 item 5): the beam search and the
best-first search, each ONE call per round (``search``, from one packed state: ``pack_state``) that
writes the tree into the caller's arrays and returns its node count (no returned arrays: boxing them
costs more than the search's own work), and the n-gram logs they read, beside the trie's sorted keys
(``log_entries``: key and log in one cache line) with each context's run of continuations found by
one hash probe (``context_ranges``).

Both searches skip the work that cannot change their answer, exactly: a child's score is its
parent's plus ``weight * (decay * log p + ngram_weight * log p_ngram)``, so with a non-negative
weight and n-gram weight and n-gram logs <= 0 the drafter's part alone bounds it from above, in the
same float arithmetic (every rounding step is monotone). The beam search looks up the n-gram term
only of a child whose bound could still enter the next beams or the pool's best ``total`` (the
children of a beam come in the candidates' order: once the bound stops qualifying on a depth whose
log-probabilities are non-increasing, the beam's later candidates are skipped too), and pools only
those; the best-first search (nodes never above their parents when every log-probability is <= 0)
pushes only an entry the ``total`` best pushed before do not already outrank. Inputs outside these
conditions (NaN or infinite log-probabilities, negative weights) run every child as before.
``tests/policies/test_dart_tree_equivalence.py`` checks both against the numpy and Python searches
they replaced, bit for bit. ``numba`` ``njit`` functions cached on disk (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from specpolicy.core.compiled_ngram import _trie_slot


@njit(cache=True)
def log_entries(keys: np.ndarray, counts: np.ndarray, logs: np.ndarray) -> np.ndarray:
    """The trie's entries (``NGramModel.compiled_trie``'s ``keys`` ``(E,) int64``, sorted within each
    order) beside their n-gram logs: ``(E, 2) int64``, column 0 the key, column 1 the bits of the
    entry's log as float64 (``logs`` ``(E,)`` float32 or float64, exact either way; read through
    ``.view(np.float64)``), NaN's bits where the entry's count is 0 (what a search reads as "not
    seen"). A lookup's key and log share a cache line."""
    out = np.empty((keys.shape[0], 2), dtype=np.int64)
    values = out.view(np.float64)
    for e in range(keys.shape[0]):
        out[e, 0] = keys[e]
        values[e, 1] = np.float64(logs[e]) if counts[e] > 0 else np.nan
    return out


@njit(cache=True)
def context_ranges(keys: np.ndarray, starts: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each context's continuations are among the trie's sorted keys: per order j (order j's
    keys ``keys[starts[j]:starts[j + 1]]``, the (j + 1)-grams), an open-addressing table of its
    contexts ``key // base`` (``compiled_ngram.trie_hash``'s layout: a power-of-two region of at
    least twice its entries per order), each slot ``(context code, first << 32 | count)``: the
    context's keys are ``keys[first:first + count]`` (sorted; ``-1, -1`` empty). Returns the table
    ``(S, 2) int64`` and each order's first slot ``(orders + 1,) int64``."""
    orders = starts.shape[0] - 1
    offsets = np.zeros(orders + 1, dtype=np.int64)
    for j in range(orders):
        contexts = 0
        for i in range(starts[j], starts[j + 1]):
            if i == starts[j] or keys[i] // base != keys[i - 1] // base:
                contexts += 1
        size = 1
        while size < 2 * contexts:
            size *= 2
        offsets[j + 1] = offsets[j] + size
    table = np.full((offsets[orders], 2), -1, dtype=np.int64)
    for j in range(orders):
        first, mask = offsets[j], offsets[j + 1] - offsets[j] - 1
        i = starts[j]
        while i < starts[j + 1]:
            context, run = keys[i] // base, i
            while run < starts[j + 1] and keys[run] // base == context:
                run += 1
            slot = _trie_slot(context, mask)
            while table[first + slot, 0] != -1:
                slot = (slot + 1) & mask
            table[first + slot, 0], table[first + slot, 1] = context, (i << 32) | (run - i)
            i = run
    return table, offsets


@njit(cache=True, inline="always")
def _context_range(table, offsets, order, context):
    """A ``context_ranges`` slot's ``first << 32 | count`` for ``context`` among order ``order``'s
    contexts, -1 where it has none."""
    first, mask = offsets[order], offsets[order + 1] - offsets[order] - 1
    slot = _trie_slot(context, mask)
    while True:
        held = table[first + slot, 0]
        if held == context:
            return table[first + slot, 1]
        if held == -1:
            return -1
        slot = (slot + 1) & mask


@njit(cache=True, inline="always")
def _suffixes(window, order, base, contexts, offsets, codes, ranges):
    """For each j-token suffix of ``window`` (the last ``order - 1`` tokens; j = 1 .. order - 1) its
    code ``codes[j]`` and its continuations' range ``ranges[j]`` (``_context_range``)."""
    for j in range(1, order):
        code = window[order - 1 - j]
        for t in range(order - j, order - 1):
            code = code * base + window[t]
        codes[j] = code
        ranges[j] = _context_range(contexts, offsets, j, code)


@njit(cache=True, inline="always")
def _ngram_log(codes, ranges, candidate, entries, values, order, base, log_eps):
    """``log(p_ngram + EPS)`` of ``candidate`` after a window of suffix codes and ranges
    (``_suffixes``): the entry of the longest suffix it was seen after (the first of equal keys,
    found by a leftmost search of the suffix's sorted continuations; "seen": a count above 0),
    ``log_eps`` where none (a token past the n-gram's vocabulary is never seen)."""
    if candidate < 0 or candidate >= base:
        return log_eps
    for j in range(order - 1, 0, -1):
        if ranges[j] < 0:
            continue
        lo = ranges[j] >> 32
        hi = lo + (ranges[j] & 0xFFFFFFFF)
        key = codes[j] * base + candidate
        while lo < hi:
            mid = (lo + hi) >> 1
            if entries[mid, 0] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < (ranges[j] >> 32) + (ranges[j] & 0xFFFFFFFF) and entries[lo, 0] == key:
            v = values[lo, 1]
            if not np.isnan(v):
                return v
    return log_eps


@njit(cache=True)
def root_window(context, order, start, out):
    """The last ``order - 1`` tokens of ``context`` into ``out``, start symbols in front of a short one."""
    c = context.shape[0]
    for j in range(order - 1):
        at = c - (order - 1) + j
        out[j] = context[at] if at >= 0 else start


@njit(cache=True, inline="always")
def _ranks_before(end_i, x, end_j, y):
    """A child (ends a path ``end_i``, score ``x``) strictly ahead of another in (ends, -score) order
    (an equal one stays behind; NaN scores last in their group)."""
    if end_i != end_j:
        return not end_i
    return (np.isnan(y) and not np.isnan(x)) or x > y


@njit(cache=True, inline="always")
def _insert(keep, keep_ends, keep_scores, filled, m, i, end, x):
    """Insert child ``i`` into the kept ``keep[:filled]`` (at most ``m``, in (ends, -score) order,
    ties in creation order) when it ranks among them; returns the new count. The rule of a
    stable sort of each group by ``-score``, the non-ending group first."""
    pos = filled
    while pos > 0 and _ranks_before(end, x, keep_ends[pos - 1], keep_scores[pos - 1]):
        pos -= 1
    if pos >= m:
        return filled
    for j in range(min(filled, m - 1), pos, -1):
        keep[j], keep_ends[j], keep_scores[j] = keep[j - 1], keep_ends[j - 1], keep_scores[j - 1]
    keep[pos], keep_ends[pos], keep_scores[pos] = i, end, x
    return min(filled + 1, m)


@njit(cache=True)
def first_in_order(scores, ends, K, m):
    """The first ``m`` of the children ``0 .. n - 1`` (``scores`` ``(n,) float32``; child i ends a
    path when ``ends[i % K]``) in the stable order of (ends, -score), by ``_insert`` (the beam
    search's rule for its next beams)."""
    keep = np.empty(m, dtype=np.int64)
    keep_ends = np.empty(m, dtype=np.bool_)
    keep_scores = np.empty(m, dtype=scores.dtype)
    filled = 0
    for i in range(scores.shape[0]):
        filled = _insert(keep, keep_ends, keep_scores, filled, m, i, ends[i % K], scores[i])
    return keep[:filled]


@njit(cache=True, inline="always")
def _heap_offer(heap, size, cap, x):
    """Offer ``x`` to the min-heap ``heap[:size]`` of the ``cap`` largest offered so far; returns the
    new size."""
    if size < cap:
        j = size
        heap[j] = x
        while j > 0 and heap[(j - 1) // 2] > heap[j]:
            heap[(j - 1) // 2], heap[j] = heap[j], heap[(j - 1) // 2]
            j = (j - 1) // 2
        return size + 1
    if x > heap[0]:
        heap[0] = x
        j = 0
        while True:
            c = 2 * j + 1
            if c >= cap:
                break
            if c + 1 < cap and heap[c + 1] < heap[c]:
                c += 1
            if heap[c] >= heap[j]:
                break
            heap[c], heap[j] = heap[j], heap[c]
            j = c
    return size


@njit(cache=True)
def nth_largest(scores, n):
    """The ``n``-th largest of ``scores`` ``(P,)`` (``np.partition(scores, P - n)[P - n]``, 1 <= n <=
    P): a min-heap of the n largest seen; with a NaN among the scores (ranked above everything by
    the partition), the partition itself."""
    for i in range(scores.shape[0]):
        if np.isnan(scores[i]):
            return np.partition(scores, scores.shape[0] - n)[scores.shape[0] - n]
    heap = np.empty(n, dtype=scores.dtype)
    size = 0
    for i in range(scores.shape[0]):
        size = _heap_offer(heap, size, n, scores[i])
    return heap[0]


@njit(cache=True)
def best_indices(scores, n):
    """The ascending indices of the ``n`` best ``scores`` ``(P,) float32``, ties to the earlier index
    (the set ``np.sort(np.argsort(-scores, kind="stable")[:n])`` holds: the n-th best score, then
    one pass)."""
    P = scores.shape[0]
    if n >= P:
        return np.arange(P)
    threshold = nth_largest(scores, n)
    above = 0
    for i in range(P):
        if scores[i] > threshold:
            above += 1
    ties = n - above
    out = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(P):
        if scores[i] > threshold:
            out[m] = i
            m += 1
        elif scores[i] == threshold and ties > 0:
            out[m] = i
            m += 1
            ties -= 1
    return out[:m]


@njit(cache=True)
def _bounds_hold(logp, decay, weight, ngram_weight, at_most_zero):
    """Whether the drafter's part of a score bounds the whole from above (``ngram_weight``, every
    ``weight`` >= 0, every ``logp`` finite; the n-gram logs <= 0 are the caller's), and, when
    ``at_most_zero``, a child never above its parent too (every ``logp`` and ``decay`` term <= 0)."""
    if not ngram_weight >= 0:
        return False
    for level in range(weight.shape[0]):
        if not weight[level] >= 0 or (at_most_zero and not decay[level] >= 0):
            return False
    for level in range(logp.shape[0]):
        for c in range(logp.shape[1]):
            x = logp[level, c]
            if not (-np.inf < x < np.inf) or (at_most_zero and x > 0):
                return False
    return True


@njit(cache=True)
def beam_search(
    ids, logp, stops, context, order, base, entries, contexts, offsets, log_eps, first_scored,
    decay, weight, ngram_weight, width, total, prune, tokens, parents, scores, drafter,
):  # fmt: skip
    """DART's beam search in one call: per depth, every beam extended by every candidate, the step
    score in float32 (``beam + weight[l] * (decay[l] * logp + ngram_weight * log p_ngram)``, the
    n-gram term from depth ``first_scored`` on, read off ``entries`` (``log_entries``) through
    ``contexts`` / ``offsets`` (``context_ranges``)), every child pooled in creation order, the next
    beams the best ``width`` (stop-ending last, then by score, ties in creation order); then the
    best ``total`` of the pool, renumbered. ``ids`` ``(D, K) int64``, ``logp`` ``(D, K) float32``;
    ``prune`` (the n-gram logs and ``log_eps`` <= 0): skip the children that cannot matter (module
    docstring). Writes ``tokens`` / ``parents`` (int64), ``scores`` / ``drafter`` (float32, the
    path's drafter log-probability), each ``(>= total,)``, and returns the node count (parents
    before children)."""
    D, K = ids.shape
    prune = prune and total >= 1 and _bounds_hold(logp, decay, weight, ngram_weight, False)
    values = entries.view(np.float64)
    ends = np.zeros((D, K), dtype=np.bool_)
    falling = np.zeros(D, dtype=np.bool_)  # the depth's log-probabilities non-increasing (candidates best first)
    for level in range(D):
        falling[level] = decay[level] >= 0
        for c in range(K):
            for s in range(stops.shape[0]):
                if ids[level, c] == stops[s]:
                    ends[level, c] = True
            if c and not logp[level, c] <= logp[level, c - 1]:
                falling[level] = False
    w = order - 1
    beam_windows = np.empty((width, w), dtype=np.int64)
    next_windows = np.empty((width, w), dtype=np.int64)
    root_window(context, order, base - 1, beam_windows[0])
    beam_scores = np.zeros(width, dtype=np.float32)
    beam_drafter = np.zeros(width, dtype=np.float32)
    beam_nodes = np.full(width, -1, dtype=np.int64)
    keep = np.empty(width, dtype=np.int64)  # the next beams: pool entries, their ends and scores
    keep_ends = np.empty(width, dtype=np.bool_)
    keep_scores = np.empty(width, dtype=np.float32)
    size = K + max(D - 1, 0) * width * K
    pool_tokens = np.empty(size, dtype=np.int64)
    pool_parents = np.empty(size, dtype=np.int64)
    pool_scores = np.empty(size, dtype=np.float32)
    pool_drafter = np.empty(size, dtype=np.float32)
    pool_beams = np.empty(size, dtype=np.int64)  # each pool entry's beam
    top = np.empty(max(total, 1), dtype=np.float32)  # the pool's best ``total`` scores so far (a min-heap)
    codes = np.zeros(order, dtype=np.int64)
    ranges = np.zeros(order, dtype=np.int64)
    B, pooled, held = 1, 0, 0
    for level in range(D):  # the beams' paths are ``level`` tokens long
        scored = level >= first_scored
        m = min(width, B * K)
        filled = 0
        wl, dl = weight[level], decay[level]
        for b in range(B):
            sb, db, found = beam_scores[b], beam_drafter[b], False
            for c in range(K):
                lp = logp[level, c]
                term = dl * lp
                x = sb + wl * term  # the score when the depth is not scored, else a bound of it
                end = ends[level, c]
                if prune and filled == m and held == total and not x > top[0]:  # not among the pool's best
                    worst_end = keep_ends[m - 1]
                    below = not x > keep_scores[m - 1]
                    if (end and not worst_end) or (end == worst_end and below):
                        if falling[level] and not worst_end and below:
                            break  # the later candidates' bounds are no higher: none enters either
                        continue
                if scored:
                    if not found:
                        _suffixes(beam_windows[b], order, base, contexts, offsets, codes, ranges)
                        found = True
                    term = term + ngram_weight * np.float32(
                        _ngram_log(codes, ranges, ids[level, c], entries, values, order, base, log_eps)
                    )
                    x = sb + wl * term
                    if prune and filled == m and held == total and not x > top[0]:
                        if not _ranks_before(end, x, keep_ends[m - 1], keep_scores[m - 1]):
                            continue  # neither a next beam nor among the pool's best
                pool_tokens[pooled], pool_parents[pooled] = ids[level, c], beam_nodes[b]
                pool_scores[pooled], pool_drafter[pooled] = x, db + lp
                pool_beams[pooled] = b
                filled = _insert(keep, keep_ends, keep_scores, filled, m, pooled, end, x)
                if prune:
                    held = _heap_offer(top, held, total, x)
                pooled += 1
        for j in range(filled):  # the next beams: each kept child's window, score and node
            e = keep[j]
            parent = pool_beams[e]
            for t in range(w - 1):
                next_windows[j, t] = beam_windows[parent, t + 1]
            if w > 0:
                next_windows[j, w - 1] = pool_tokens[e]
            beam_scores[j], beam_drafter[j], beam_nodes[j] = pool_scores[e], pool_drafter[e], e
        beam_windows, next_windows = next_windows, beam_windows
        B = filled
    kept = best_indices(pool_scores[:pooled], total)
    index = np.full(pooled + 1, -1, dtype=np.int64)  # index[e + 1]: pool entry e's node
    for j in range(kept.shape[0]):
        index[kept[j] + 1] = j
    for j in range(kept.shape[0]):
        e = kept[j]
        tokens[j], parents[j] = pool_tokens[e], index[pool_parents[e] + 1]
        scores[j], drafter[j] = pool_scores[e], pool_drafter[e]
    return kept.shape[0]


@njit(cache=True, inline="always")
def _heap_before(neg, a, b):
    """Heap entry a pops before b: the lower ``neg`` (the higher score), ties in push order."""
    return neg[a] < neg[b] or (neg[a] == neg[b] and a < b)


@njit(cache=True)
def _heap_push(heap, size, neg, entry):
    """Push ``entry`` onto the binary heap ``heap[:size]``; returns the new size."""
    i = size
    heap[i] = entry
    while i > 0:
        parent = (i - 1) // 2
        if not _heap_before(neg, heap[i], heap[parent]):
            break
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent
    return size + 1


@njit(cache=True)
def _heap_pop(heap, size, neg):
    """The first entry of ``heap[:size]``, removed (the heap is then ``size - 1`` long)."""
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _heap_before(neg, heap[child + 1], heap[child]):
            child += 1
        if not _heap_before(neg, heap[child], heap[i]):
            break
        heap[i], heap[child] = heap[child], heap[i]
        i = child
    return top


@njit(cache=True)
def best_first_search(
    ids, logp, stops, context, order, base, entries, contexts, offsets, log_eps, first_scored,
    decay, weight, ngram_weight, total, prune, tokens, parents, scores, drafter,
):  # fmt: skip
    """DART's search for beams at least as wide as the tree, in one call: the ``total`` best nodes by
    the step score (float64: ``parent + weight[l] * (decay[l] * logp + ngram_weight * log
    p_ngram)``, ``logp`` ``(D, K) float32`` widened, the n-gram logs the float64 ones of
    ``entries`` (``log_entries``, through ``contexts`` / ``offsets``)), popped best first from a heap (ties in push order), a node ending in a
    stop token or at the last depth not expanded. ``prune`` (the n-gram logs and ``log_eps`` <= 0):
    when every log-probability is <= 0 too, a node never scores above its parent, so the pops come
    in falling order and the nodes are the ``total`` best ever pushed; an entry whose bound the
    ``total`` best pushed before already reach is not pushed (nor looked up). Writes ``tokens`` /
    ``parents`` (int64), ``scores`` / ``drafter`` (float32), each ``(>= total,)``, in pop order
    (parents first), and returns the node count."""
    D, K = ids.shape
    if D == 0 or total < 1:
        return 0
    prune = prune and _bounds_hold(logp, decay, weight, ngram_weight, True)
    values = entries.view(np.float64)
    falling = np.zeros(D, dtype=np.bool_)  # the depth's log-probabilities non-increasing
    for level in range(D):
        falling[level] = True
        for c in range(1, K):
            if not logp[level, c] <= logp[level, c - 1]:
                falling[level] = False
    cap = K + total * K
    neg = np.empty(cap, dtype=np.float64)  # per pushed entry: -score, depth, candidate, parent node, drafter
    levels = np.empty(cap, dtype=np.int64)
    cands = np.empty(cap, dtype=np.int64)
    owners = np.empty(cap, dtype=np.int64)
    drafts = np.empty(cap, dtype=np.float64)
    heap = np.empty(cap, dtype=np.int64)
    top = np.empty(total, dtype=np.float64)  # the ``total`` best scores pushed so far (a min-heap)
    windows = np.empty((total + 1, order - 1), dtype=np.int64)  # row 0 the root's, row i + 1 node i's
    root_window(context, order, base - 1, windows[0])
    codes = np.zeros(order, dtype=np.int64)
    ranges = np.zeros(order, dtype=np.int64)
    size, pushed, count, held = 0, 0, 0, 0
    level, node, score, path_drafter = 0, -1, 0.0, 0.0
    while True:  # expand ``node`` (``level``: its children's depth), then pop the next best
        scored, found = level >= first_scored, False
        wl, dl = weight[level], decay[level]
        for c in range(K):
            lp = np.float64(logp[level, c])
            term = dl * lp
            if prune and held == total and not score + wl * term > top[0]:
                if falling[level]:
                    break  # the later candidates' bounds are no higher
                continue
            if scored:
                if not found:
                    _suffixes(windows[node + 1], order, base, contexts, offsets, codes, ranges)
                    found = True
                term += ngram_weight * _ngram_log(codes, ranges, ids[level, c], entries, values, order, base, log_eps)
            x = score + wl * term
            if prune and held == total and not x > top[0]:
                continue  # the ``total`` best pushed before outrank it
            neg[pushed] = -x
            levels[pushed], cands[pushed], owners[pushed] = level, c, node
            drafts[pushed] = path_drafter + lp
            size = _heap_push(heap, size, neg, pushed)
            if prune:
                held = _heap_offer(top, held, total, x)
            pushed += 1
        expand = False
        while size > 0 and count < total and not expand:
            e = _heap_pop(heap, size, neg)
            size -= 1
            tok = ids[levels[e], cands[e]]
            tokens[count], parents[count] = tok, owners[e]
            scores[count], drafter[count] = -neg[e], drafts[e]
            stop = False
            for s in range(stops.shape[0]):
                stop = stop or tok == stops[s]
            if levels[e] + 1 < D and not stop:
                parent_window = windows[owners[e] + 1]
                for j in range(order - 2):
                    windows[count + 1, j] = parent_window[j + 1]
                if order > 1:
                    windows[count + 1, order - 2] = tok
                level, node, score, path_drafter = levels[e] + 1, count, -neg[e], drafts[e]
                expand = True
            count += 1
        if not expand:
            break
    return count


#: a packed search state's header (``pack_state``): its slots, in order
S_ORDER, S_BASE, S_FIRST, S_WIDTH, S_PRUNE, S_BEST_FIRST, S_LOG_EPS, S_NGRAM_WEIGHT = range(8)
S_DEPTHS, S_ENTRIES, S_CONTEXTS, S_OFFSETS = range(8, 12)
HEADER = 12


def pack_state(
    order: int,
    base: int,
    first_scored: int,
    width: int,
    prune: bool,
    best_first: bool,
    log_eps: float,
    ngram_weight: float,
    decay: np.ndarray,
    weight: np.ndarray,
    entries: np.ndarray,
    contexts: np.ndarray,
    offsets: np.ndarray,
) -> np.ndarray:
    """Everything a search reads besides its pass, in ONE ``int64`` array (``search``: a compiled call
    of 8 arguments instead of 20, each argument costing its type check and unboxing cold after a
    model pass): the header (``S_*`` slots: the integers, the floats' float64 bits, the lengths),
    then the per-depth ``decay`` and ``weight`` (float64 bits of their values: float32 ones are
    exact), the order ``offsets``, the ``contexts`` table and the ``entries`` (``context_ranges``,
    ``log_entries``), flattened."""
    floats = np.array([log_eps, ngram_weight], dtype=np.float64).view(np.int64)
    header = np.array(
        [order, base, first_scored, width, int(prune), int(best_first), floats[0], floats[1]]
        + [decay.shape[0], entries.shape[0], contexts.shape[0], offsets.shape[0]],
        dtype=np.int64,
    )
    parts = [decay.astype(np.float64), weight.astype(np.float64)]
    return np.concatenate([header, *(p.view(np.int64) for p in parts), offsets, contexts.ravel(), entries.ravel()])


@njit(cache=True)
def search(state, ids, logp, stops, context, total, ints, floats):
    """One tree search from a packed state (``pack_state``): ``beam_search`` (its float32 settings)
    or ``best_first_search`` (float64) on the pass's ``ids`` ``(D, K) int64`` and ``logp`` ``(D, K)
    float32``, the ``stops`` and the n-gram ``context``, at most ``total`` nodes, written into
    ``ints`` ``(2, >= total) int64`` (tokens, parents) and ``floats`` ``(2, >= total) float32``
    (scores, drafter log-probabilities); returns the node count."""
    f = state.view(np.float64)
    depths, n_entries, n_contexts, n_offsets = state[S_DEPTHS], state[S_ENTRIES], state[S_CONTEXTS], state[S_OFFSETS]
    at = HEADER
    decay, weight = f[at : at + depths], f[at + depths : at + 2 * depths]
    at += 2 * depths
    offsets = state[at : at + n_offsets]
    at += n_offsets
    contexts = state[at : at + 2 * n_contexts].reshape((n_contexts, 2))
    at += 2 * n_contexts
    entries = state[at : at + 2 * n_entries].reshape((n_entries, 2))
    order, base, first, prune = state[S_ORDER], state[S_BASE], state[S_FIRST], state[S_PRUNE] != 0
    if state[S_BEST_FIRST]:
        return best_first_search(
            ids, logp, stops, context, order, base, entries, contexts, offsets, f[S_LOG_EPS], first,
            decay, weight, f[S_NGRAM_WEIGHT], total, prune, ints[0], ints[1], floats[0], floats[1],
        )  # fmt: skip
    return beam_search(
        ids, logp, stops, context, order, base, entries, contexts, offsets, np.float32(f[S_LOG_EPS]), first,
        decay.astype(np.float32), weight.astype(np.float32), np.float32(f[S_NGRAM_WEIGHT]), state[S_WIDTH], total,
        prune, ints[0], ints[1], floats[0], floats[1],
    )  # fmt: skip
