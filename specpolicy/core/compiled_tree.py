"""Compiled host kernels of a tree round on the CPU (issue 48, item 5: host work per round): ``numba``
``njit`` functions, compiled on first call and cached on disk (``cache=True``), as
``specpolicy.core.compiled``'s are.

``tree_inputs`` builds a tree verification pass's input ids, positions and attention mask from the
tree's parents (``specpolicy.core.tree.host_inputs``: ``tree_shape`` then ``tree_layout`` in one
call, nothing kept per shape); ``keep_rows`` moves the accepted path's keys and values in every
layer's buffers at once (``specpolicy.core.cache.keep_path`` on the verifier's buffered cache:
``move_rows`` per buffer, in one call); ``gather_rows`` takes the kept rows' target features
(``select_features``); ``host_tree_level`` is one level of a drafter's tree on the host
(``specpolicy.core.tree.HostTree``: ``GrowingTree.add``'s rows, ``NodeRows``' append and take).
Each writes exactly what the code it replaces writes (``tests/core/test_tree_host.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def tree_inputs(
    parents: np.ndarray,
    tokens: np.ndarray,
    pending: np.ndarray,
    start: int,
    inputs: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray,
) -> int:
    """A tree verification pass's input (SpecInfer §4) straight from the tree's ``parents`` ``(k,)
    int64`` (topological) and ``tokens`` ``(k,) int64``, after ``start`` cached positions: ``inputs``
    ``(k + 1,) int64`` (the pending token ``pending[0]``, then the nodes' tokens), ``positions``
    ``(k + 1,) int64`` (``start`` + depth; the root at ``start``) and ``mask`` ``(k + 1, start + k + 1)
    bool`` (True = attend: every committed position, then the root, the ancestors and itself), written
    in place -- ``tree_shape`` then ``tree_layout``, with no shape kept. Each node's row is its
    parent's row plus its own column. Returns -1, or the first node whose parent is not an earlier
    node or the root (``-1 <= parents[i] < i``; the arrays then partly written)."""
    k = parents.shape[0]
    inputs[0] = pending[0]
    positions[0] = start
    mask[0, : start + 1] = True
    mask[0, start + 1 :] = False
    for i in range(k):
        parent = parents[i]
        if parent < -1 or parent >= i:
            return i
        row = i + 1
        inputs[row] = tokens[i]
        positions[row] = positions[parent + 1] + 1
        mask[row, :] = mask[parent + 1, :]
        mask[row, start + row] = True
    return -1


@njit(cache=True)
def keep_rows(entries, rows: np.ndarray, start: int, layers, out: np.ndarray) -> int:
    """``keep_path`` on every cache buffer at once: ``entries`` a tuple of the layers' key and value
    buffers ``(b, heads, C, d)`` (one array type), ``rows`` ``(n,) int64`` the input rows kept (0 the
    pending token, then the path's ``node + 1``, increasing); position ``start + i`` takes position
    ``start + rows[i]`` in each buffer (``move_rows``: a source is never overwritten before it is
    read; nothing moves when ``rows`` is ``0 .. n - 1``); then, in the same call, ``gather_rows(layers,
    rows, out)`` (the kept rows' target features; nothing when ``out`` has no rows). Returns -1, or
    the index of the first row that breaks the rule (0 when ``rows`` is empty or does not start at
    0; nothing moved or gathered)."""
    n = rows.shape[0]
    if n == 0 or rows[0] != 0:
        return 0
    for i in range(1, n):
        if rows[i] <= rows[i - 1]:
            return i
    if rows[n - 1] != n - 1:
        for entry in entries:
            for b in range(entry.shape[0]):
                for h in range(entry.shape[1]):
                    for i in range(n):
                        source = start + rows[i]
                        if source != start + i:
                            entry[b, h, start + i, :] = entry[b, h, source, :]
    if out.shape[0] > 0:
        gather_rows(layers, rows, out)
    return -1


@njit(cache=True)
def gather_rows(layers, rows: np.ndarray, out: np.ndarray) -> None:
    """``select_features`` on the host: ``out`` ``(n, sum of widths)`` takes row ``rows[i]`` of each
    array of ``layers`` (a tuple of ``(k + 1, H_j)`` arrays, one array type) side by side, in order."""
    column = 0
    for layer in layers:
        width = layer.shape[1]
        for i in range(rows.shape[0]):
            out[i, column : column + width] = layer[rows[i]]
        column += width


@njit(cache=True)
def host_tree_level(
    mask: np.ndarray,
    position: np.ndarray,
    rows: np.ndarray,
    parents: np.ndarray,
    base: int,
    committed: int,
    last_out: np.ndarray,
    last_at: int,
    hidden: np.ndarray,
) -> int:
    """One level of ``tree.HostTree.add`` in place: first the previous pass's outputs ``last_out``
    ``(p, H)`` become rows ``last_at ..`` of ``rows`` (node numbers; 0 the root's), then node
    ``base + 1 + j`` (row of ``mask`` ``(R, W) bool`` / ``position`` ``(R,) int64``) takes its parent's
    row (``parents[j]``, a node added before) plus its own column ``committed + base + j`` and its
    parent's position plus one (``grow_tree_rows``), and ``hidden[j]`` its parent's output row.
    Returns -1, or the first j whose parent is not a node already added (``0 <= parents[j] <= base``;
    nothing of the level written)."""
    for j in range(parents.shape[0]):
        if parents[j] < 0 or parents[j] > base:
            return j
    for i in range(last_out.shape[0]):
        rows[last_at + i, :] = last_out[i, :]
    for j in range(parents.shape[0]):
        row, parent = base + 1 + j, parents[j]
        mask[row, :] = mask[parent, :]
        mask[row, committed + base + j] = True
        position[row] = position[parent] + 1
        hidden[j, :] = rows[parent, :]
    return -1
