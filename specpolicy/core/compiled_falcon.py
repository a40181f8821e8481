"""Compiled host kernels of Falcon's static tree on the CPU (``drafters/falcon.py``,
``policies/falcon_tree.py``; issue 48 item 5), each ONE ``numba`` call (``cache=True``) in place of
the numpy steps it replaced (same values: copies and the same float sums in the same order): the
round's first pass's layout (``falcon_root_layout``, ``falcon_root_mask_into``); the policy's read of
a pass (``falcon_tree_read``); and, between two tree passes, that read with the drafter's side of the
next pass -- its blocks' rows stored and gathered, the pass laid out -- on buffers the drafter keeps
(``falcon_tree_level``, ``FalconLevels``). ``specpolicy.core.compiled.falcon_block_layout`` lays a
pass out with ``_falcon_layout_into``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from numba import njit


@njit(cache=True)
def _falcon_layout_into(
    ancestors: np.ndarray, depths: np.ndarray, parents: np.ndarray, base: int, committed: int, k: int, positions
) -> np.ndarray:
    """``falcon_block_layout`` writing the positions into ``positions`` ``(1, m k) int64``; returns the mask."""
    m = parents.shape[0]
    size = base + m
    for j in range(m):
        row, parent = base + 1 + j, parents[j]
        for c in range(ancestors.shape[1]):  # whole rows (row 0 all False): no stale column survives
            ancestors[row, c] = ancestors[parent, c]
        ancestors[row, row] = True
        depths[row] = depths[parent] + 1
    mask = np.zeros((m * k, committed + size * k), dtype=np.bool_)
    for j in range(m):
        row = base + 1 + j
        first = committed + (depths[row] - 1) * k
        for i in range(k):
            r = j * k + i
            positions[0, r] = first + i
            mask[r, :committed] = True
            for b in range(1, size + 1):
                if ancestors[row, b]:
                    mask[r, committed + (b - 1) * k : committed + b * k] = True
    return mask


@njit(cache=True)
def falcon_root_layout(u: int, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The Falcon round's first pass's layout over ``u`` new pairs after ``start`` cached ones
    (``drafters/falcon.py``, ``root_mask``): positions ``(1, u) int64`` (``start`` ..) and the mask
    ``(u, start + u) bool`` (True = attend: every cached position, causal among the new ones, the last
    ``k`` whole), in one call."""
    positions = np.empty((1, u), dtype=np.int64)
    mask = np.ones((u, start + u), dtype=np.bool_)
    last = max(u - k, 0)  # the first pair of the last block
    for i in range(u):
        positions[0, i] = start + i
        if i < last:  # causal: no later pair (a row of the last block sees the block whole)
            mask[i, start + i + 1 :] = False
    return positions, mask


@njit(cache=True)
def falcon_tree_read(
    b: int,
    ids: np.ndarray,
    logp: np.ndarray,
    numbers_new: np.ndarray,
    nodes: np.ndarray,
    node_path: np.ndarray,
    blocks: np.ndarray,
    bounds: np.ndarray,
    numbers: np.ndarray,
    tokens: np.ndarray,
    node_logp: np.ndarray,
    next_tokens: np.ndarray,
    next_parents: np.ndarray,
    scores: np.ndarray,
) -> None:
    """Falcon's static tree (``policies/falcon_tree.py``) after its pass ``b`` on the CPU, in one
    call: the pass's ``m`` blocks' top tokens ``ids`` ``(m, k, top_k) int64`` and log-probabilities
    ``logp`` ``(m, k, top_k)``, numbered ``numbers_new`` ``(m,) int64`` by the drafter, give the nodes
    it drafted (``bounds[b]`` = first node, end node, first block, blocks; ``nodes`` ``(3, n)``: each
    node's block, offset and rank) their ``tokens`` and ``node_logp``; then the next pass's blocks
    (rows of ``blocks`` ``(B, 1 + k)``: the parent block, the k nodes of the path since it) their
    drafter parents ``next_parents`` and tokens ``next_tokens``, or after the last pass each node's
    cumulative log-probability ``scores`` summed root first over ``node_path`` ``(depth, n)`` (an
    index n: past the node's depth) -- the gathers and sums of ``_gather_on_host``, in the same order
    and dtype (a past-depth zero is not added: ``x + 0.0`` is ``x``, a -0.0 aside, whose exp is the same)."""
    lo, hi, first, m = bounds[b, 0], bounds[b, 1], bounds[b, 2], bounds[b, 3]
    for j in range(m):
        numbers[first + j] = numbers_new[j]
    for i in range(lo, hi):
        local, offset, rank = nodes[0, i] - first, nodes[1, i], nodes[2, i]
        tokens[i] = ids[local, offset, rank]
        node_logp[i] = logp[local, offset, rank]
    if b + 1 < bounds.shape[0]:
        start = bounds[b + 1, 2]
        for row in range(start, start + bounds[b + 1, 3]):
            next_parents[row] = numbers[blocks[row, 0]]
            for j in range(blocks.shape[1] - 1):
                next_tokens[row, j] = tokens[blocks[row, 1 + j]]
        return
    n = tokens.shape[0]
    for i in range(n):
        total = node_logp[node_path[0, i]]
        for d in range(1, node_path.shape[0]):
            above = node_path[d, i]
            if above < n:
                total = total + node_logp[above]
        scores[i] = total


@njit(cache=True)
def falcon_root_mask_into(mask: np.ndarray, start: int, k: int) -> None:
    """``falcon_root_layout``'s mask written into ``mask`` ``(u, start + u) bool`` (a view of a kept
    buffer: no array returned, whose boxing costs a call two object unpickles): every cached
    position, causal among the ``u`` new pairs, the last ``k`` whole (True = attend)."""
    u, width = mask.shape
    last = max(u - k, 0)  # the first pair of the last block
    for i in range(u):
        for j in range(width):
            mask[i, j] = i >= last or j <= start + i


@njit(cache=True)
def falcon_tree_level(
    b: int,
    ids: np.ndarray,
    logp: np.ndarray,
    nodes: np.ndarray,
    node_path: np.ndarray,
    blocks: np.ndarray,
    bounds: np.ndarray,
    numbers: np.ndarray,
    tokens: np.ndarray,
    node_logp: np.ndarray,
    next_tokens: np.ndarray,
    next_parents: np.ndarray,
    scores: np.ndarray,
    ancestors: np.ndarray,
    depths: np.ndarray,
    outs: np.ndarray,
    hs: np.ndarray,
    cs: np.ndarray,
    mask: np.ndarray,
    hidden: np.ndarray,
    h: np.ndarray,
    c: np.ndarray,
    positions: np.ndarray,
    committed: int,
    base: int,
    last_out: np.ndarray,
    last_h: np.ndarray,
    last_c: np.ndarray,
) -> int:
    """Falcon's static tree between two drafter passes on the CPU, in one call: ``falcon_tree_read``
    of pass ``b`` (its ``m'`` blocks the drafter's blocks ``base - m' + 1 .. base``; the root's: block
    0, ``base`` 0), then, unless it was the last pass, the drafter's host work for the next one's ``m``
    blocks (``next_parents`` / ``next_tokens``' rows of pass ``b + 1``): the last pass's outputs and
    LSTM state (``last_out`` ``(m', k, H)``, ``last_h`` / ``last_c`` ``(layers, m', H)``) stored as its
    blocks' rows of ``outs`` / ``hs`` / ``cs``, the parents' rows gathered into ``hidden`` ``(m, k, H)``,
    ``h`` / ``c`` ``(layers, m, H)``, and the pass laid out: ``ancestors`` / ``depths`` rows of blocks
    ``base + 1 ..``, ``positions`` ``(1, m k)`` and the attention rows ``mask[:m k, :committed + (base
    + m) k]`` (written whole: a kept buffer). The same values as that read and the numpy ``take`` /
    assignment steps and ``falcon_block_layout`` it replaces (copies, no arithmetic). Returns ``m`` (0 after the last pass: ``scores`` written)."""
    m_last = ids.shape[0]
    first = base - m_last + 1
    for j in range(m_last):
        numbers[bounds[b, 2] + j] = first + j
    falcon_tree_read(
        b, ids, logp, numbers[bounds[b, 2] : bounds[b, 2] + m_last], nodes, node_path, blocks, bounds, numbers,
        tokens, node_logp, next_tokens, next_parents, scores,
    )  # fmt: skip
    if b + 1 >= bounds.shape[0]:
        return 0
    start, m = bounds[b + 1, 2], bounds[b + 1, 3]
    for j in range(m_last):
        outs[first + j] = last_out[j]
        for layer in range(hs.shape[0]):
            hs[layer, first + j] = last_h[layer, j]
            cs[layer, first + j] = last_c[layer, j]
    for j in range(m):
        parent = next_parents[start + j]
        hidden[j] = outs[parent]
        for layer in range(hs.shape[0]):
            h[layer, j] = hs[layer, parent]
            c[layer, j] = cs[layer, parent]
    k = hidden.shape[1]
    size = base + m
    for j in range(m):
        row, parent = base + 1 + j, next_parents[start + j]
        for col in range(ancestors.shape[1]):
            ancestors[row, col] = ancestors[parent, col]
        ancestors[row, row] = True
        depths[row] = depths[parent] + 1
    width = committed + size * k
    for j in range(m):
        row = base + 1 + j
        at = committed + (depths[row] - 1) * k
        for i in range(k):
            r = j * k + i
            positions[0, r] = at + i
            mask[r, :committed] = True
            mask[r, committed:width] = False
            for blk in range(1, size + 1):
                if ancestors[row, blk]:
                    mask[r, committed + (blk - 1) * k : committed + blk * k] = True
    return m


class FalconLevels:
    """The host buffers of Falcon's static tree on the CPU (``drafters/falcon.py``'s
    ``tree_root_host``), kept from round to round (made anew only when a round needs more):
    ``falcon_tree_level`` writes them, the drafter's passes read them as tensors made once.

    Attributes:
        rows: ``(ancestors (cap, cap) bool, depths (cap,) int64, outs (cap, k, H), hs (layers, cap,
            H), cs (layers, cap, H), mask (cap k, columns) bool)``: per block (0: the root's) its
            ancestors, depth, outputs and LSTM state; a pass's attention rows.

    Args:
        k: tokens per pass. width: H. layers: LSTM layers. dtype: the outputs' numpy dtype.
        top: top tokens per position. blocks: blocks a round holds (the root's included).
        columns: attention columns (cached positions and blocks' positions).
    """

    def __init__(
        self, k: int, width: int, layers: int, dtype: npt.DTypeLike, top: int, blocks: int, columns: int
    ) -> None:
        self.key, self.blocks, self.columns = (k, width, layers, np.dtype(dtype), top), blocks, columns
        self.mask = np.zeros((blocks * k, columns), dtype=bool)
        self.rows = (
            np.zeros((blocks, blocks), dtype=bool),
            np.zeros(blocks, dtype=np.int64),
            np.zeros((blocks, k, width), dtype=dtype),
            np.zeros((layers, blocks, width), dtype=dtype),
            np.zeros((layers, blocks, width), dtype=dtype),
            self.mask,
        )
        self._passes: dict[int, tuple] = {}
        #: the round's first pass's top tokens: ``(k, top)`` rows of ``pass_of(1)``'s ``(1, k, top)`` tensors
        self.root_into = tuple(t[0] for t in self.pass_of(1)[2])

    def fits(self, key: tuple, blocks: int, columns: int) -> bool:
        """Whether these buffers serve a round of ``blocks`` blocks over ``columns`` columns."""
        return blocks <= self.blocks and columns <= self.columns and key == self.key

    def pass_of(self, m: int) -> tuple:
        """A pass over ``m`` blocks (made once per ``m``): its inputs as numpy arrays -- parents' outputs
        ``(m, k, H)``, LSTM state ``(layers, m, H)`` twice, positions ``(1, m k) int64`` (contiguous,
        as the pass's tensors were) -- the same as tensors sharing them, then its top tokens' ids
        ``(m, k, top) int64`` and log-probabilities ``(m, k, top) float32`` as tensors and as arrays."""
        held = self._passes.get(m)
        if held is None:
            k, width, layers, dtype, top = self.key
            inputs = (
                np.zeros((m, k, width), dtype=dtype),
                np.zeros((layers, m, width), dtype=dtype),
                np.zeros((layers, m, width), dtype=dtype),
                np.zeros((1, m * k), dtype=np.int64),
            )
            top_ids, top_logp = np.zeros((m, k, top), dtype=np.int64), np.zeros((m, k, top), dtype=np.float32)
            held = self._passes[m] = (
                inputs,
                tuple(torch.from_numpy(a) for a in inputs),
                (torch.from_numpy(top_ids), torch.from_numpy(top_logp)),
                top_ids,
                top_logp,
            )
        return held
