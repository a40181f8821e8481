"""Compiled host kernels of a tree round on the CPU (issue 48, item 5: host work per round): ``numba``
``njit`` functions, compiled on first call and cached on disk (``cache=True``), as
``specpolicy.core.compiled``'s are.

``tree_inputs`` builds a tree verification pass's input ids, positions and attention mask from the
tree's parents (``specpolicy.core.tree.host_inputs``: ``tree_shape`` then ``tree_layout`` in one
call, nothing kept per shape); ``greedy_nodes`` is a tree's greedy path from the target's argmax
(``specpolicy.core.tree.greedy_path``'s rule); ``keep_nodes`` moves the accepted path's keys and values
in every layer's buffers at once, given by address (one layout array to unbox, however many layers),
and gathers the kept rows' features (the verifier's host path: ``specpolicy.core.cache.keep_nodes``,
one call after the pass); ``keep_rows`` is the same move over a tuple of the buffers' numpy views
(``specpolicy.core.cache.keep_path`` on the verifier's buffered cache); ``gather_rows`` takes the kept
rows' target features (``select_features``); ``host_tree_level`` is one level of a drafter's tree on
the host (``specpolicy.core.tree.HostTree``: ``GrowingTree.add``'s rows, ``NodeRows``' append and take).
Rows of contiguous bytes are copied with ``llvm.memcpy`` (``_copy_bytes``), not element by element.
Each writes exactly what the code it replaces writes (``tests/core/test_tree_host.py``,
``tests/core/test_tree_verification.py``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _copy_bytes(typingctx, to, at, count):
    """Copy ``count`` bytes from address ``at`` to address ``to`` (int64s; the ranges do not overlap):
    ``llvm.memcpy``, a vectorised copy where numba's element loops are not."""

    def codegen(context, builder, signature, args):
        byte_pointer = context.get_value_type(types.voidptr)
        to_, at_, count_ = args
        cgutils.raw_memcpy(builder, builder.inttoptr(to_, byte_pointer), builder.inttoptr(at_, byte_pointer), count_, 1)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


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
    whole = mask.strides[1] == 1  # rows of contiguous bytes: each copied at once (``llvm.memcpy``)
    line, width, base = mask.strides[0], mask.shape[1], np.int64(mask.ctypes.data)  # an address: uintp, as int64
    for i in range(k):
        parent = parents[i]
        if parent < -1 or parent >= i:
            return i
        row = i + 1
        inputs[row] = tokens[i]
        positions[row] = positions[parent + 1] + 1
        if whole:
            _copy_bytes(base + row * line, base + (parent + 1) * line, width)  # type: ignore[call-arg]  # numba intrinsic: typingctx is its own
        else:
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


@njit(cache=True)
def greedy_nodes(parents: np.ndarray, tokens: np.ndarray, target: np.ndarray, nodes: np.ndarray) -> int:
    """``specpolicy.core.tree.greedy_path`` on the host: the deepest node that agrees with the target
    together with all its ancestors (node i agrees when ``tokens[i] == target[parents[i] + 1]``), the
    first in order among equally deep ones; its path, root's child first, written to ``nodes[:m]``.
    ``parents`` ``(k,) int64`` (topological, checked before: ``-1 <= parents[i] < i``), ``tokens`` ``(k,)
    int64``, ``target`` ``(k + 1,) int64`` (the target's greedy token at the root and after each node),
    ``nodes`` ``(>= k,) int64``. Returns m, the accepted length (0: nothing accepted)."""
    k = parents.shape[0]
    depth = np.empty(k, dtype=np.int64)  # accepted depth (1 = a child of the root), 0 = rejected
    best, best_depth = -1, 0
    for i in range(k):
        parent = parents[i]
        d = 0
        if tokens[i] == target[parent + 1]:
            if parent < 0:
                d = 1
            elif depth[parent] > 0:
                d = depth[parent] + 1
        depth[i] = d
        if d > best_depth:
            best, best_depth = i, d
    node = best
    for j in range(best_depth - 1, -1, -1):
        nodes[j] = node
        node = parents[node]
    return best_depth


@njit(cache=True)
def keep_nodes(
    layouts: np.ndarray,
    nodes: np.ndarray,
    m: int,
    start: int,
    layers,
    out: np.ndarray,
) -> int:
    """``keep_rows`` over buffers given by address, with the kept rows as the accepted path: input
    row 0 (the pending token) and rows ``nodes[i] + 1`` for ``i < m`` (``nodes`` increasing, >= 0).
    ``layouts`` ``(B, 4) int64``: B C-contiguous ``(b, heads, C, d)`` buffers (every layer's keys and
    values, alive and unchanged for the call: the caller holds them) as ``(address of their data,
    b * heads, C, d * itemsize)``; position ``start + 1 + i`` takes position ``start + 1
    + nodes[i]`` in each (``move_rows``: a source is never overwritten before it is read, nodes only
    move down; nothing moves when ``nodes`` is ``0 .. m - 1``), a row (``d`` entries) copied at once.
    Then ``out`` ``(m + 1, sum of widths)`` (C-contiguous) takes those rows of the ``(1, k + 1, H_j)``
    arrays of ``layers`` side by side (the features; nothing when ``out`` has no rows). Returns -1, or
    the first i whose node breaks the rule -- a node must also lie in every buffer (``start + 1 +
    nodes[i] < C``) and, when ``out`` has rows, in every array of ``layers`` (``nodes[i] + 1 < k +
    1``) -- ``m`` when ``out`` has rows but not ``m + 1`` of them, fewer columns than the widths or
    another item size than an array of ``layers``, or ``m + 1`` when a buffer has no room for the
    pending token (``start + 1 > C``) (nothing moved or gathered)."""
    limit = 1 << 62  # the nodes lie below it: the buffers' room past start + 1, the arrays' rows past row 0
    for j in range(layouts.shape[0]):
        limit = min(limit, layouts[j, 2] - start - 1)
    if limit < 0:
        return m + 1
    if out.shape[0] > 0:
        widths = 0
        for layer in numba.literal_unroll(layers):
            limit = min(limit, layer.shape[1] - 1)
            widths += layer.shape[2]
            if layer.itemsize != out.itemsize:
                return m
        if out.shape[0] < m + 1 or out.shape[1] < widths:
            return m
    previous = -1
    for i in range(m):
        if nodes[i] <= previous or nodes[i] >= limit:
            return i
        previous = nodes[i]
    if m > 0 and nodes[m - 1] != m - 1:
        for j in range(layouts.shape[0]):
            base, sequences, capacity, row = layouts[j, 0], layouts[j, 1], layouts[j, 2], layouts[j, 3]
            for h in range(sequences):
                first = base + (h * capacity + start + 1) * row  # position start + 1 of sequence h
                for i in range(m):
                    if nodes[i] != i:
                        _copy_bytes(first + i * row, first + nodes[i] * row, row)  # type: ignore[call-arg]  # numba intrinsic: typingctx is its own
    if out.shape[0] > 0:
        column = 0
        for layer in numba.literal_unroll(layers):  # a tuple of arrays, of one type or not
            width = layer.shape[2]
            if layer.strides[2] == layer.itemsize and out.strides[1] == out.itemsize:  # rows copied whole
                line, at = out.strides[0], layer.strides[1]
                to = np.int64(out.ctypes.data) + column * out.itemsize  # addresses (uintp) as int64
                source, count = np.int64(layer.ctypes.data), width * out.itemsize
                _copy_bytes(to, source, count)  # type: ignore[call-arg]  # numba intrinsic: typingctx is its own
                for i in range(m):
                    _copy_bytes(to + (i + 1) * line, source + (nodes[i] + 1) * at, count)
            else:
                out[0, column : column + width] = layer[0, 0]
                for i in range(m):
                    out[i + 1, column : column + width] = layer[0, nodes[i] + 1]
            column += width
    return -1
