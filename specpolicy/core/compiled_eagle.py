"""Compiled host kernels of EAGLE-2's dynamic draft tree grown by a drafter on the CPU (issue 48,
item 5: host work per round; ``policies/eagle2_tree.py`` with ``drafters/eagle3.py``).

Between two drafter passes of a tree round ONE ``numba`` call (``cache=True``) does the policy's
and the drafter's host work together: ``eagle2_host_level`` stores the last pass's outputs as its
nodes' rows, appends the pass's children to the policy's candidates with their cumulative scores,
picks the next level's nodes (the stable descending sort's first, ``compiled._best_of``) and lays
out the next pass over them -- each new node's attention row (its parent's plus its own column),
position (its parent's plus one), token and parent's output -- into buffers the pass reads as
tensors made once (``TreeLevels``). After the last pass ``eagle2_host_finish`` appends its children
and reranks (``compiled.eagle2_rerank``'s rule). The same values as the steps they fuse:
``compiled.eagle2_level`` / ``eagle2_rerank`` and ``compiled_tree.host_tree_level`` (copies, the
same float sums in the same order; ``tests/core/test_compiled_eagle.py``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from numba import njit

from specpolicy.core.compiled import _best_of, eagle2_rerank


@njit(cache=True)
def _append(candidates: np.ndarray, scores: np.ndarray, end: int, ids: np.ndarray, logp: np.ndarray, best, first):
    """The expanded candidates ``best[j]`` (-1: the root), drafter nodes ``first + j``, bring their
    children ``ids`` / ``logp`` ``(m, w)``: appended at ``end`` row by row to ``candidates`` ``(3, N)
    int64`` (token, parent candidate, parent node) and ``scores`` (``scores[best[j]] + logp``; the
    root's children: ``logp`` as it is). Returns the new end."""
    at = end
    for j in range(ids.shape[0]):
        parent = best[j]
        for c in range(ids.shape[1]):
            candidates[0, at] = ids[j, c]
            scores[at] = logp[j, c] if parent < 0 else scores[parent] + logp[j, c]
            candidates[1, at] = parent
            candidates[2, at] = first + j
            at += 1
    return at


@njit(cache=True)
def eagle2_host_level(
    candidates: np.ndarray,
    scores: np.ndarray,
    end: int,
    ids: np.ndarray,
    logp: np.ndarray,
    best: np.ndarray,
    select: int,
    mask: np.ndarray,
    position: np.ndarray,
    rows: np.ndarray,
    inputs: np.ndarray,
    hidden: np.ndarray,
    committed: int,
    base: int,
    last_out: np.ndarray,
) -> tuple[int, int]:
    """One level of EAGLE-2's expansion (Li et al. 2024, §4) between two drafter passes.

    The last pass ran over the ``m`` nodes ``base - m + 1 .. base`` of the drafter's tree (the round's
    first pass: the root, node 0, ``base`` 0), expanding candidates ``best[:m]`` (-1: the root);
    it gave their outputs ``last_out`` ``(m, H)`` and children ``ids`` (int64) / ``logp`` ``(m, w)``.
    In order: ``last_out`` becomes rows ``base - m + 1 ..`` of ``rows`` ``(R, H)`` (at ``base`` 0 the
    root's row of ``mask`` ``(R, W) bool`` -- every one of the ``committed`` cached positions -- and
    ``position`` ``(R,) int64`` -- ``committed - 1`` -- are reset too; a row is written over its
    first ``committed + R - 1`` columns (at most ``W``), all a pass reads, not the buffers' whole
    width); the children go to the
    candidates (``_append``; ``candidates`` ``(3, N) int64``, ``scores`` ``(N,)`` float, ``[0, end)``
    filled); the new level's ``select`` best (the stable descending sort's first) go to ``best``, and
    each becomes node ``base + 1 + j`` under its parent node p: ``mask`` row = p's row plus column
    ``committed + base + j``, ``position`` = p's plus one; the next pass's inputs ``inputs[0, j]``
    (its token), ``inputs[1, j]`` (its position) and ``hidden[j]`` (p's output row).

    Returns:
        ``(new end, nodes selected)``.
    """
    m = ids.shape[0]
    first = base - m + 1
    # the columns any pass of the round reads (``committed`` cached positions, then at most the
    # buffers' nodes), not the buffers' whole width: rows are written and copied this far only
    limit = min(mask.shape[1], committed + mask.shape[0] - 1)
    if base == 0:
        mask[0, :committed] = True
        mask[0, committed:limit] = False
        position[0] = committed - 1
    for i in range(last_out.shape[0]):
        rows[first + i, :] = last_out[i, :]
    at = _append(candidates, scores, end, ids, logp, best, first)
    chosen = _best_of(scores, end, at, select, best)
    for j in range(chosen):
        c = best[j]
        parent, row = candidates[2, c], base + 1 + j
        mask[row, :limit] = mask[parent, :limit]
        mask[row, committed + base + j] = True
        position[row] = position[parent] + 1
        inputs[0, j] = candidates[0, c]
        inputs[1, j] = position[row]
        hidden[j, :] = rows[parent, :]
    return at, chosen


@njit(cache=True)
def eagle2_host_finish(
    candidates: np.ndarray,
    scores: np.ndarray,
    end: int,
    ids: np.ndarray,
    logp: np.ndarray,
    best: np.ndarray,
    base: int,
    total: int,
    out_tokens: np.ndarray,
    out_scores: np.ndarray,
    out_parents: np.ndarray,
) -> int:
    """After the round's last pass (over nodes ``base - m + 1 .. base``, candidates ``best[:m]``): its
    children appended (``_append``), then EAGLE-2's reranking of candidates ``[0, new end)``
    (``compiled.eagle2_rerank``: the ``total`` best, ties to the earlier, kept in creation order,
    parents renumbered among the kept, -1 the root) into ``out_*`` ``(total,)``. Returns how many kept."""
    at = _append(candidates, scores, end, ids, logp, best, base - ids.shape[0] + 1)
    return eagle2_rerank(candidates[0], scores, candidates[1], at, total, out_tokens, out_scores, out_parents)


class TreeLevels:
    """The host buffers of a drafter's draft tree on the CPU, kept from round to round (made anew
    only for a round that needs more room): ``eagle2_host_level`` writes the tree's rows and the next
    pass's inputs, the drafter's passes read those as tensors sharing them and write each node's
    ``top`` children there (``views``).

    Attributes:
        mask: ``(nodes + 1, columns) bool`` each node's attention row (0: the root's).
        position: ``(nodes + 1,) int64`` each node's position. rows: ``(nodes + 1, H)`` its output.
        inputs: ``(2, nodes) int64`` a pass's tokens (row 0) and positions (row 1). hidden: ``(nodes,
            H)`` its parents' outputs.
        ids / logp / index: ``(nodes, top)`` a pass's children per node: target ids (int64),
            log-probabilities (float32) and draft-vocabulary ids (int64, scratch).
        arrays: ``(mask, position, rows, inputs, hidden)``, in ``eagle2_host_level``'s order.

    Args:
        width: the outputs' width H. dtype: their numpy dtype (float32, float64). top: children per node.
        nodes: nodes past the root (>= 1). columns: attention columns (cached positions and nodes).
    """

    def __init__(self, width: int, dtype: npt.DTypeLike, top: int, nodes: int, columns: int) -> None:
        self.width, self.dtype, self.top, self.nodes, self.columns = width, np.dtype(dtype), top, nodes, columns
        self.mask = np.zeros((nodes + 1, columns), dtype=bool)
        self.position = np.zeros(nodes + 1, dtype=np.int64)
        self.rows = np.zeros((nodes + 1, width), dtype=self.dtype)
        self.inputs = np.zeros((2, nodes), dtype=np.int64)
        self.hidden = np.zeros((nodes, width), dtype=self.dtype)
        self.ids = np.zeros((nodes, top), dtype=np.int64)
        self.logp = np.zeros((nodes, top), dtype=np.float32)
        self.index = np.zeros((nodes, top), dtype=np.int64)
        self.arrays = (self.mask, self.position, self.rows, self.inputs, self.hidden)
        self._views: dict[int, tuple] = {}

    def fits(self, width: int, dtype: np.dtype, top: int, nodes: int, columns: int) -> bool:
        """Whether these buffers serve a round of ``nodes`` nodes over ``columns`` columns."""
        return (
            width == self.width and top == self.top and nodes <= self.nodes and columns <= self.columns
        ) and dtype == self.dtype

    def views(self, m: int) -> tuple:
        """A pass over ``m`` nodes (made once per ``m``): its inputs as tensors sharing the buffers --
        tokens ``(m,) int64``, positions ``(m,) int64``, parents' outputs ``(m, H)`` -- then the
        tensors its children go to (ids, log-probabilities, draft ids ``(m, top)``) as one tuple, and
        the children's ids and log-probabilities as numpy arrays."""
        views = self._views.get(m)
        if views is None:
            inputs = (self.inputs[0, :m], self.inputs[1, :m], self.hidden[:m])
            children = (self.ids[:m], self.logp[:m], self.index[:m])
            views = self._views[m] = (
                *(torch.from_numpy(a) for a in inputs),
                tuple(torch.from_numpy(a) for a in children),
                self.ids[:m],
                self.logp[:m],
            )
        return views


def warm_kernels() -> None:
    """Run the kernels once on tiny float32 and float64 arrays (compiled or loaded now, not in a round)."""
    for dtype in (np.float32, np.float64):
        levels = TreeLevels(2, dtype, 1, 2, 4)
        candidates, scores, best = np.zeros((3, 4), np.int64), np.zeros(4, dtype), np.full(1, -1, np.int64)
        ids, logp = np.zeros((1, 1), np.int64), np.zeros((1, 1), dtype)
        end, _ = eagle2_host_level(candidates, scores, 0, ids, logp, best, 1, *levels.arrays, 1, 0, levels.rows[:1])
        out = np.empty(2, np.int64), np.empty(2, dtype), np.empty(2, np.int64)
        eagle2_host_finish(candidates, scores, end, ids, logp, best, 1, 2, out[0], out[1], out[2])
