"""``dart-tree`` policy: DART's n-gram-pruned draft tree from ONE drafter pass (Liang et al., arXiv
2601.19278, §3.4; fvliang/DART ``tree_search/tree_search.py`` -> ``cpplib/cpp_search/searcher.cpp``,
``Searcher::search``, config ``tree_search_config.py``).

The rule, as the code runs it:

* per depth l = 0 .. d - 1 of the pass, the top ``top_k`` (25) draft tokens, their probabilities the
  softmax over those 25 logits;
* a beam search from the empty path: every beam is extended by every candidate of the depth, the
  child scoring ``parent + (l + 1)^-0.7 * [0.9^l * log(p + 1e-10) + 0.5 * log(p_ngram + 1e-10)]``
  (``level_weights_func``, ``logit_weights_func``, ``ngram_weights``); the built extension defines
  ``NO_NGRAM_ON_FIRST_TOKEN``, so depth 0 is scored by the drafter alone;
* the children are sorted with those ending in EOS last, then by score, and the best ``beam_width``
  (20) are the next depth's beams (a beam ending in EOS is still extended);
* EVERY child of every depth goes into one pool; the best ``total_tokens`` (theta; paper 59, code
  60) by score form the tree -- a tree, since a child never scores above its parent (ties kept in
  creation order: a parent before its children);
* ``p_ngram`` is DART's trie probability of the token after the last ``order - 1`` tokens of
  committed + path (``NGramModel.trie_probs``; the default n-gram file is the target's own GSM8K
  continuations, ``bundle/ngram/gsm8k-target.npz``).

The search is compiled (numba, as the reference's is host C++), ONE call per round: every depth's
n-gram lookups, scores, pool and next beams (``_beam_search``), each n-gram log read off the trie's
table (``NGramModel.trie_logs``), the same float32 operations as the numpy search it replaced
(``tests/policies/test_dart_tree_equivalence.py``). With beams at least as wide as the tree the same
tree comes from a best-first search (``_best_first_search``, compiled; paths ending in a stop token
kept as leaves).
The target verifies the tree in one pass (``specpolicy.core.tree``); its nodes are verified as point
masses when sampling (lossless). ``ngram_weight=0`` turns the n-gram term off (the paper's
ablation); ``use_ngram: false`` does the same.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch
from numba import njit

from specpolicy.core.checks import check_init
from specpolicy.core.compiled_ngram import trie_find
from specpolicy.core.errors import ConfigError
from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import NgramBlockDrafter
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "dart-tree"
#: log(p + EPS): the code's guard against log 0.
EPS = 1e-10


def dart_tree_search(
    ids: torch.Tensor,
    probs: torch.Tensor,
    context: torch.Tensor,
    ngram: Any | None,
    stop_ids: torch.Tensor,
    beam_width: int = 20,
    total_tokens: int = 60,
    level_power: float = -0.7,
    logit_decay: float = 0.9,
    ngram_weight: float = 0.5,
    ngram_on_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DART's tree search over one pass's per-depth candidates (module docstring).

    Args:
        ids: ``(D, K) int64`` each depth's candidate tokens (target ids), best first.
        probs: ``(D, K) float32`` their probabilities (the softmax over the K candidates).
        context: ``(c,) int64`` the committed tokens before the path, the pending one last.
        ngram: an ``NGramModel`` (``trie_logs``) or None (no n-gram term).
        stop_ids: ``(s,) int64`` tokens whose paths sort last among the beams.
        ngram_on_first: score depth 0 with the n-gram too (the code's build does not).
    Returns:
        ``(tokens (n,) int64, parents (n,) int64 (-1: the root), scores (n,) float32, draft log-probs
        (n,) float32)`` of the kept nodes, a parent before its children (the beams: creation
        order; best-first: pop order), n <= ``total_tokens``.

    The whole search is ONE compiled call (``_beam_search``; the reference runs host C++ for the
    same reason), its float32 operations those of the numpy search it replaced
    (``tests/policies/test_dart_tree_equivalence.py``); each n-gram log is read off the trie's
    table (``NGramModel.trie_logs``) rather than taken per depth.

    With ``beam_width >= total_tokens`` the beam search keeps every node of the best
    ``total_tokens`` (a node's ancestors score at least as much, so fewer than ``total_tokens``
    nodes of its depth outrank it), and the same tree, up to exact ties, comes from a best-first
    search that expands only the popped nodes (``_best_first_search``, compiled: ``total_tokens``
    x K scores in float64 instead of a beam front of ``beam_width`` x K entries per depth). It
    treats a path ending in a stop token as a leaf, as the beams do whenever ``beam_width`` other
    candidates remain (its children could never be accepted).
    """
    ids_np = np.ascontiguousarray(ids.cpu().numpy(), dtype=np.int64)
    depth = ids_np.shape[0]
    stops = np.ascontiguousarray(stop_ids.cpu().numpy(), dtype=np.int64)
    ctx = np.ascontiguousarray(context.cpu().numpy(), dtype=np.int64)
    use_ngram = ngram is not None and ngram_weight != 0
    first_scored = (0 if ngram_on_first else 1) if use_ngram else depth  # the first depth the n-gram scores
    order, base = (ngram.order, ngram.base) if use_ngram else (1, 1)
    if beam_width >= total_tokens:
        table, counts, offsets, logs = _trie(ngram, use_ngram, 1)
        logp = np.ascontiguousarray(torch.log(probs.float() + EPS).cpu().numpy())  # torch's float32 log
        weight, decay = _step_weights(depth, level_power, logit_decay, np.float64)
        found = _best_first_search(
            ids_np, logp, stops, ctx, order, base, table, counts, offsets, logs, _LOG_EPS[1],
            first_scored, decay, weight, float(ngram_weight), total_tokens,
        )  # fmt: skip
    else:
        table, counts, offsets, logs = _trie(ngram, use_ngram, 0)
        logp = np.log(np.ascontiguousarray(probs.float().cpu().numpy()) + np.float32(EPS))  # (D, K) float32
        weight, decay = _step_weights(depth, level_power, logit_decay, np.float32)
        found = _beam_search(
            ids_np, logp, stops, ctx, order, base, table, counts, offsets, logs, _LOG_EPS[0],
            first_scored, decay, weight, np.float32(ngram_weight), beam_width, total_tokens,
        )  # fmt: skip
    return tuple(torch.from_numpy(x) for x in found)  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def _step_weights(depth: int, level_power: float, logit_decay: float, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """The step score's per-depth factors ``(depth,)`` of ``dtype``: ``(l + 1) ** level_power`` and
    ``logit_decay ** l`` (each computed as a Python float, then cast), built once per setting (a
    round's search reads them, never writes)."""
    weight = np.array([dtype((level + 1) ** level_power) for level in range(depth)], dtype=dtype)
    decay = np.array([dtype(logit_decay**level) for level in range(depth)], dtype=dtype)
    return weight, decay


#: ``log(0 + EPS)``, a candidate the n-gram never saw: numpy's float32 log (the beams'), Python's float64 log
_LOG_EPS = (np.log(np.zeros(1, np.float32) + np.float32(EPS))[0], math.log(0.0 + EPS))
_NO_TRIE = (np.full((1, 2), -1, np.int64), np.zeros(0, np.int64), np.zeros(2, np.int64))
_NO_LOGS = (np.zeros(0, np.float32), np.zeros(0, np.float64))


def _trie(ngram: Any | None, use: bool, kind: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trie's hash table, counts, the table's order offsets and logs (``kind`` 0: float32, 1:
    float64) for the compiled searches (``NGramModel.trie_hash``, ``compiled_trie``, ``trie_logs``);
    empty tables (of the same types) without the n-gram."""
    if not use:
        return (*_NO_TRIE, _NO_LOGS[kind])
    table, offsets = ngram.trie_hash()
    return table, ngram.compiled_trie()[1], offsets, ngram.trie_logs(EPS)[kind]


@njit(cache=True)
def _ngram_logs(window, candidates, table, counts, offsets, logs, base, log_eps, found, out):
    """``log(p_ngram + EPS)`` of each candidate ``(K,) int64`` after ``window`` (the last ``order - 1``
    tokens, start symbols in front) into ``out`` ``(K,)``: the entry of the longest suffix of the
    window the candidate was seen after (the trie rule, ``compiled.trie_probs``), read off ``logs``
    (``NGramModel.trie_logs``), ``log_eps`` where none. Each (suffix, candidate) entry is found by
    hash (``NGramModel.trie_hash``'s ``table`` and ``offsets``: ``compiled_ngram.trie_find``), the entry a
    search of the suffix's sorted continuations finds; the lookups stop once every candidate is
    found (a shorter suffix only fills candidates not found yet). ``found`` ``(K,) bool``: scratch."""
    order = window.shape[0] + 1
    K = candidates.shape[0]
    for c in range(K):
        out[c] = log_eps
        found[c] = False
    left = K
    for j in range(order - 1, 0, -1):  # the j-token suffix, longest first
        if left == 0:
            break
        code = window[order - 1 - j]
        for t in range(order - j, order - 1):
            code = code * base + window[t]
        for c in range(K):
            if found[c] or not 0 <= candidates[c] < base:  # (a token past the n-gram's vocabulary: never seen)
                continue
            at = trie_find(table, offsets, j, code * base + candidates[c])  # among the (j + 1)-grams
            if at >= 0 and counts[at] > 0:
                out[c] = logs[at]
                found[c] = True
                left -= 1


@njit(cache=True)
def _window(context, path, length, order, start, out):
    """The last ``order - 1`` tokens of ``context`` + ``path[:length]`` into ``out``, start symbols in
    front of a short one."""
    c = context.shape[0]
    for j in range(order - 1):
        at = c + length - (order - 1) + j
        if at >= c:
            out[j] = path[at - c]
        elif at >= 0:
            out[j] = context[at]
        else:
            out[j] = start


@njit(cache=True)
def _beam_search(
    ids, logp, stops, context, order, base, table, counts, offsets, logs, log_eps,
    first_scored, decay, weight, ngram_weight, width, total,
):  # fmt: skip
    """DART's beam search in one call: per depth, every beam extended by every candidate (the step
    score in float32, as the numpy search computed it: ``beam + weight[l] * (decay[l] * logp +
    ngram_weight * log p_ngram)``, the n-gram term from depth ``first_scored`` on), every child
    pooled in creation order, the next beams the best ``width`` (EOS-ending last, then by score,
    ties in creation order: ``_first_in_order``); then the best ``total`` of the pool
    (``_best_indices``), renumbered. ``ids`` ``(D, K) int64``, ``logp`` ``(D, K) float32``; returns
    ``(tokens, parents, scores, drafter log-probs)`` as ``dart_tree_search``."""
    D, K = ids.shape
    ends = np.zeros((D, K), dtype=np.bool_)
    for level in range(D):
        for c in range(K):
            for s in range(stops.shape[0]):
                if ids[level, c] == stops[s]:
                    ends[level, c] = True
    beams = np.zeros((width, max(D, 1)), dtype=np.int64)
    beam_scores = np.zeros(width, dtype=np.float32)
    beam_drafter = np.zeros(width, dtype=np.float32)
    beam_nodes = np.full(width, -1, dtype=np.int64)
    size = K + max(D - 1, 0) * width * K
    pool_tokens = np.zeros(size, dtype=np.int64)
    pool_parents = np.zeros(size, dtype=np.int64)
    pool_scores = np.zeros(size, dtype=np.float32)
    pool_drafter = np.zeros(size, dtype=np.float32)
    log_ngram = np.zeros((width, K), dtype=np.float32)
    scores = np.empty(width * K, dtype=np.float32)
    drafter = np.empty(width * K, dtype=np.float32)
    window = np.empty(order - 1, dtype=np.int64)
    found = np.empty(K, dtype=np.bool_)
    B, pooled = 1, 0
    for level in range(D):  # the beams' paths are ``level`` tokens long
        scored = level >= first_scored
        if scored:
            for b in range(B):
                _window(context, beams[b], level, order, base - 1, window)
                _ngram_logs(window, ids[level], table, counts, offsets, logs, base, log_eps, found, log_ngram[b])
        n = B * K
        for b in range(B):
            for c in range(K):
                term = decay[level] * logp[level, c]
                if scored:
                    term = term + ngram_weight * log_ngram[b, c]
                i = b * K + c
                scores[i] = beam_scores[b] + weight[level] * term
                drafter[i] = beam_drafter[b] + logp[level, c]
                pool_tokens[pooled + i] = ids[level, c]
                pool_parents[pooled + i] = beam_nodes[b]
                pool_scores[pooled + i] = scores[i]
                pool_drafter[pooled + i] = drafter[i]
        keep = _first_in_order(scores[:n], ends[level], K, min(width, n))
        old = beams[:B, :level].copy()
        for j in range(keep.shape[0]):
            i = keep[j]
            beams[j, :level] = old[i // K]
            beams[j, level] = ids[level, i % K]
            beam_scores[j], beam_drafter[j], beam_nodes[j] = scores[i], drafter[i], pooled + i
        B = keep.shape[0]
        pooled += n
    kept = _best_indices(pool_scores[:pooled], total)
    index = np.full(pooled + 1, -1, dtype=np.int64)  # index[c + 1]: pool entry c's node
    for j in range(kept.shape[0]):
        index[kept[j] + 1] = j
    parents = np.empty(kept.shape[0], dtype=np.int64)
    for j in range(kept.shape[0]):
        parents[j] = index[pool_parents[kept[j]] + 1]
    return pool_tokens[kept], parents, pool_scores[kept], pool_drafter[kept]


@njit(cache=True)
def _best_indices(scores, n):
    """``_best_set`` compiled: the ascending indices of the ``n`` best ``scores`` ``(P,) float32``,
    ties to the earlier index (the n-th best score, ``_nth_largest``, then one pass)."""
    P = scores.shape[0]
    if n >= P:
        return np.arange(P)
    threshold = _nth_largest(scores, n)
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
def _nth_largest(scores, n):
    """The ``n``-th largest of ``scores`` ``(P,)`` (``np.partition(scores, P - n)[P - n]``, 1 <= n <=
    P): a min-heap of the n largest seen, most entries turned away by one comparison with its top;
    with a NaN among the scores (ranked above everything by the partition), the partition itself."""
    for i in range(scores.shape[0]):
        if np.isnan(scores[i]):
            return np.partition(scores, scores.shape[0] - n)[scores.shape[0] - n]
    heap = np.empty(n, dtype=scores.dtype)
    size = 0
    for i in range(scores.shape[0]):
        x = scores[i]
        if size < n:  # push, sift up
            j = size
            heap[j] = x
            while j > 0 and heap[(j - 1) // 2] > heap[j]:
                heap[(j - 1) // 2], heap[j] = heap[j], heap[(j - 1) // 2]
                j = (j - 1) // 2
            size += 1
        elif x > heap[0]:  # replace the top, sift down
            heap[0] = x
            j = 0
            while True:
                c = 2 * j + 1
                if c >= n:
                    break
                if c + 1 < n and heap[c + 1] < heap[c]:
                    c += 1
                if heap[c] >= heap[j]:
                    break
                heap[c], heap[j] = heap[j], heap[c]
                j = c
    return heap[0]


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
def _best_first_search(
    ids, logp, stops, context, order, base, table, counts, offsets, logs, log_eps,
    first_scored, decay, weight, ngram_weight, total,
):  # fmt: skip
    """``dart_tree_search`` for ``beam_width >= total_tokens``, in one call: the ``total`` best nodes
    by the step score (float64: ``parent + weight[l] * (decay[l] * logp + ngram_weight * log
    p_ngram)``, ``logp`` ``(D, K) float32`` widened), popped best first from a heap (ties in push
    order), a node ending in a stop token or at the last depth not expanded; the nodes in pop
    order, parents first. The n-gram logs are the float64 ones (``NGramModel.trie_logs``)."""
    D, K = ids.shape
    if D == 0 or total < 1:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32)
    cap = K + total * K
    neg = np.empty(cap, dtype=np.float64)  # per pushed entry: -score, depth, candidate, parent node, drafter
    levels = np.empty(cap, dtype=np.int64)
    cands = np.empty(cap, dtype=np.int64)
    owners = np.empty(cap, dtype=np.int64)
    drafts = np.empty(cap, dtype=np.float64)
    heap = np.empty(cap, dtype=np.int64)
    windows = np.empty((total + 1, order - 1), dtype=np.int64)  # row 0 the root's, row i + 1 node i's
    _window(context, context[:0], 0, order, base - 1, windows[0])
    tokens = np.empty(total, dtype=np.int64)
    parents = np.empty(total, dtype=np.int64)
    scores = np.empty(total, dtype=np.float32)
    drafter = np.empty(total, dtype=np.float32)
    terms = np.zeros(K, dtype=np.float64)
    found = np.empty(K, dtype=np.bool_)
    size, pushed, count = 0, 0, 0
    level, node, score, path_drafter = 0, -1, 0.0, 0.0
    while True:  # expand ``node`` (``level``: its children's depth), then pop the next best
        scored = level >= first_scored
        if scored:
            _ngram_logs(windows[node + 1], ids[level], table, counts, offsets, logs, base, log_eps, found, terms)
        for c in range(K):
            lp = np.float64(logp[level, c])
            term = decay[level] * lp
            if scored:
                term += ngram_weight * terms[c]
            neg[pushed] = -(score + weight[level] * term)
            levels[pushed], cands[pushed], owners[pushed] = level, c, node
            drafts[pushed] = path_drafter + lp
            size = _heap_push(heap, size, neg, pushed)
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
    return tokens[:count], parents[:count], scores[:count], drafter[:count]


@njit(cache=True)
def _first_in_order(scores, ends, K, m):
    """The first ``m`` of the children ``0 .. n - 1`` (``scores`` ``(n,) float32``; child i ends a
    path when ``ends[i % K]``) in the stable order of (ends, -score): the non-ending children by
    score, then the ending ones, ties in creation order, NaN scores last in their group -- what a
    stable sort of each group by ``-score`` gives (``np.argsort(kind="mergesort")``), found by
    insertion into the ``m`` kept (m is the beam width, n = beams x K)."""
    keep = np.empty(m, dtype=np.int64)
    filled = 0
    for i in range(scores.shape[0]):
        pos = filled
        while pos > 0 and _ranks_before(scores, ends, K, i, keep[pos - 1]):
            pos -= 1
        if pos >= m:
            continue
        for j in range(min(filled, m - 1), pos, -1):
            keep[j] = keep[j - 1]
        keep[pos] = i
        filled = min(filled + 1, m)
    return keep


@njit(cache=True, inline="always")
def _ranks_before(scores, ends, K, i, j):
    """Child i strictly ahead of child j in (ends, -score) order (an equal one stays behind)."""
    end_i, end_j = ends[i % K], ends[j % K]
    if end_i != end_j:
        return not end_i
    x, y = scores[i], scores[j]
    return (np.isnan(y) and not np.isnan(x)) or x > y


def _best_set(scores: np.ndarray, n: int) -> np.ndarray:
    """The ascending indices of the ``n`` best ``scores`` (``(P,) float32``), ties to the earlier
    index: the set ``np.sort(np.argsort(-scores, kind="stable")[:n])`` holds, found with one
    partition (linear) instead of a sort of the whole pool (thousands of nodes at DART's settings)."""
    if n >= scores.shape[0]:
        return np.arange(scores.shape[0])
    threshold = np.partition(scores, scores.shape[0] - n)[scores.shape[0] - n]  # the n-th best score
    above = scores > threshold
    at = np.flatnonzero(scores == threshold)[: n - int(above.sum())]  # ties: the earliest
    return np.sort(np.concatenate([np.flatnonzero(above), at]))


class DartTreePolicy(TreePolicy):
    """DART's tree over one pass of a ``dart`` drafter.

    Args:
        top_k: candidates per depth (the code's ``topk_func``: 25), >= 1.
        beam_width: beams kept per depth (20), >= 1.
        total_tokens: theta, nodes kept (paper 59, code 60; ``conf/policy/dart-tree.yaml`` states the
            value sized for this CPU), >= 1.
        depth: depths searched, >= 1 (default: one pass's tokens, d = 8 for DART, B - 1 = 15 for
            DFlash; more costs later passes).
        level_power, logit_decay, ngram_weight: the step score's (l + 1)^level_power,
            logit_decay^l and n-gram weight (-0.7, 0.9, 0.5).
        ngram: a bundled n-gram name (``gsm8k-target``, ``gsm8k-train``) or an ``.npz`` file.
        use_ngram: False drops the n-gram term (the ablation; same as ``ngram_weight=0``).
        ngram_on_first: score depth 0 with the n-gram too (the released build does not).
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(
        self,
        top_k: int = 25,
        beam_width: int = 20,
        total_tokens: int = 60,
        depth: int | None = None,
        level_power: float = -0.7,
        logit_decay: float = 0.9,
        ngram_weight: float = 0.5,
        ngram: str = "gsm8k-target",
        use_ngram: bool = True,
        ngram_on_first: bool = False,
        ngram_model: Any | None = None,
    ) -> None:
        for key, value in (("top_k", top_k), ("beam_width", beam_width), ("total_tokens", total_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"policy.{key} must be an integer >= 1, got {value!r}")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise ValueError(f"policy.depth must be an integer >= 1 or null (the drafter's block), got {depth!r}")
        for key, value in (("level_power", level_power), ("logit_decay", logit_decay), ("ngram_weight", ngram_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"policy.{key} must be a number, got {value!r}")
        if not 0 < logit_decay <= 1 or ngram_weight < 0:
            raise ValueError(
                f"policy.logit_decay must be in (0, 1] and policy.ngram_weight >= 0, got {logit_decay!r}, {ngram_weight!r}"
            )
        self.top_k, self.beam_width, self.total_tokens, self.depth = top_k, beam_width, total_tokens, depth
        self.level_power, self.logit_decay = float(level_power), float(logit_decay)
        self.ngram_weight = float(ngram_weight) if use_ngram else 0.0
        self.ngram_on_first = bool(ngram_on_first)
        self.ngram_name = ngram
        self.ngram = ngram_model
        if self.ngram is None and self.ngram_weight > 0:
            from specpolicy.models.ngram import load_ngram, resolve_ngram_path

            if not isinstance(ngram, str) or not ngram:
                raise ConfigError(f"policy.ngram must be a bundled n-gram name or an .npz file, got {ngram!r}")
            self.ngram = load_ngram(resolve_ngram_path(ngram), "policy.ngram")
        # the compiled search's first call compiles it (or loads numba's cache): done here, before any
        # timed round; a two-depth pass of the real dtypes, beams narrower than the tree, then as wide
        warm = torch.zeros((2, 1), dtype=torch.long)
        for width in (1, 2):
            dart_tree_search(
                warm, torch.ones(2, 1), warm[0], self.ngram, warm[0], width, 2, ngram_weight=self.ngram_weight
            )
        self._stops: dict[tuple, torch.Tensor] = {}
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, NgramBlockDrafter):
            raise ValueError(
                f"policy=dart-tree needs a drafter that drafts a block in one pass and reports its "
                f"alternatives and n-gram context (dart, dflash); drafter "
                f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def draft_tree(self, drafter: NgramBlockDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        runtime = getattr(drafter, "runtime", None)  # ``device_of`` without its Protocol check (per round)
        device = "cpu" if runtime is None else runtime.torch_device
        want = self.depth or drafter.tokens_per_pass
        depth = min(want, room)
        if depth < 1:
            return Draft.empty(device), "room"
        chain = drafter.draft(depth)
        n = chain.length
        if n == 0:
            return chain, "no_proposal"
        ids, probs = drafter.alternatives(self.top_k)  # (n, K) best first
        if probs.shape[0] != n:  # (the drafters' alternatives are the chain's n rows: no slicing op)
            ids, probs = ids[:n], probs[:n]
        probs = probs / probs.sum(-1, keepdim=True)  # the softmax over the top K logits
        stop_ids = tuple(getattr(drafter, "stop_token_ids", ()))
        if stop_ids not in self._stops:  # built once per set of stop tokens
            self._stops[stop_ids] = torch.tensor(stop_ids, dtype=torch.long)
        tokens, parents, _, logp = dart_tree_search(
            ids,
            probs,
            drafter.ngram_context,
            self.ngram if self.ngram_weight > 0 else None,
            self._stops[stop_ids],
            self.beam_width,
            min(self.total_tokens, node_room),
            self.level_power,
            self.logit_decay,
            self.ngram_weight,
            self.ngram_on_first,
        )
        confidences = logp.exp()
        if torch.device(device).type != "cpu":
            tokens, confidences, parents = tokens.to(device), confidences.to(device), parents.to(device)
        draft = Draft(token_ids=tokens, confidences=confidences, forward_passes=chain.forward_passes, parents=parents)
        return draft, "room" if depth < want else "policy_bound"

    def __repr__(self) -> str:
        return (
            f"DartTreePolicy(top_k={self.top_k}, beam_width={self.beam_width}, total_tokens={self.total_tokens}, "
            f"ngram_weight={self.ngram_weight}, ngram={self.ngram_name!r})"
        )


#: The config keys (the n-gram model object is for tests and callers, not configs).
CONFIG_KEYS = (
    "top_k",
    "beam_width",
    "total_tokens",
    "depth",
    "level_power",
    "logit_decay",
    "ngram_weight",
    "ngram",
    "use_ngram",
    "ngram_on_first",
)


def validate(config: dict[str, Any]) -> None:
    """``policy=dart-tree``: its keys (``CONFIG_KEYS``: not ``ngram_model``) and ranges and the
    n-gram file, checked by building it (no model).

    Raises:
        ConfigError: naming the key, the value and the accepted range.
    """
    from specpolicy.core.checks import check_keys

    check_keys("policy", config, CONFIG_KEYS)
    check_init("policy", DartTreePolicy, config)


def build(config: dict[str, Any]) -> DartTreePolicy:
    """``policy=dart-tree`` from its config node (keys: ``CONFIG_KEYS``)."""
    return DartTreePolicy(**config)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the ``dart-tree`` policy."""
    return [PluginEntry("policy", NAME, build, validate, "DART's n-gram-pruned draft tree from one drafter pass")]
