"""Draft trees: the shape, verifying one in one target pass, and what is accepted.

A tree draft (``Draft.parents`` set) holds k nodes in topological order: node i carries
``token_ids[i]`` and hangs under ``parents[i]`` (-1: under the pending token, the tree's root;
else an earlier node). A chain is the tree whose parents are ``i - 1`` (``Draft.parents`` None).
The target verifies every node at once (SpecInfer, Miao et al. 2024, §4): the input is
``[pending] + token_ids`` at positions ``start + depth``, and each node attends to the committed
sequence, the root and its own ancestors only (``ancestor_mask``). Greedy verification accepts
the longest root-to-node path whose every token equals the target's greedy token at its parent
(``greedy_path``); speculative sampling walks down from the root trying each node's children in
order with recursive rejection sampling (``sample_path``). Either way the KV cache then keeps
exactly the accepted path (gathered, never recomputed).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from specpolicy.core import compiled, compiled_tree


def depths(parents: torch.Tensor | list[int]) -> torch.Tensor:
    """``(k,) int64`` depth of each node (1 = a child of the root) from ``parents`` (``(k,)``, topological
    order: ``parents[i] < i``); on ``parents``' device. Computed on the host: one sync for a tensor.

    Raises:
        ValueError: when a parent is not an earlier node or the root (``-1 <= parents[i] < i``)."""
    depth = _shape(_as_list(parents))[1]
    device = parents.device if isinstance(parents, torch.Tensor) else "cpu"
    return torch.from_numpy(depth.copy()).to(device)


def ancestor_mask(parents: torch.Tensor | list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """``(k + 1, k + 1) bool``: row/column 0 is the root (the pending token), i + 1 is node i;
    entry (i, j) is True when j is i itself or one of its ancestors (the root is everyone's). Built
    on the host from the parents (one sync for a tensor), placed on ``device`` (default: the parents').

    Raises:
        ValueError: when a parent is not an earlier node or the root (``-1 <= parents[i] < i``)."""
    mask = _shape(_as_list(parents))[0]
    if device is None:
        device = parents.device if isinstance(parents, torch.Tensor) else "cpu"
    return torch.from_numpy(mask.copy()).to(device)


def verification_layout(
    parents: list[int] | np.ndarray, start: int, device: torch.device | str, heads: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the target's one pass over ``[pending] + nodes`` needs (SpecInfer §4), built on the host
    in one go: position ids ``(k + 1,) int64`` (``start`` + depth; the root at ``start``) and the
    attention mask ``(k + 1, start + k + 1) bool`` (True = attend: every committed position, then
    ``ancestor_mask``), both on ``device``. A tree shape's ancestors and depths are built once
    (``_shape``: compiled, numpy) and kept on ``device`` (``_on_device``) for the next tree of the
    same shape (a static tree: every round); on the CPU the layout is one compiled call
    (``compiled.tree_layout``) and the tensors share its arrays.

    Args:
        parents: the tree's parents on the host, a list or an ``int64`` array (``(k,)``, topological).
        start: committed positions already cached (tokens).
        heads: positions as ``(1, k + 1)`` and the mask as ``(1, 1, k + 1, start + k + 1)``, what a
            Hugging Face model takes.
    Raises:
        ValueError: when a parent is not an earlier node or the root (``-1 <= parents[i] < i``).
    """
    k = len(parents)
    if getattr(device, "type", device) == "cpu":  # numpy, then shared with torch: no per-op dispatch
        host_positions = np.empty((1, k + 1), dtype=np.int64)
        host_mask = np.empty((1, 1, k + 1, start + k + 1), dtype=bool)
        compiled.tree_layout(*_shape(parents), start, host_positions[0], host_mask[0, 0])
        if heads:
            return torch.from_numpy(host_positions), torch.from_numpy(host_mask)
        return torch.from_numpy(host_positions[0]), torch.from_numpy(host_mask[0, 0])
    ancestors, depth_plus_one = _on_device(parents, device)
    mask = torch.ones((k + 1, start + k + 1), dtype=torch.bool, device=device)
    mask[:, start:] = ancestors
    positions = depth_plus_one + (start - 1)  # a row holds the root, its ancestors and itself: depth + 1
    return (positions[None], mask[None, None]) if heads else (positions, mask)


def host_inputs(
    parents: np.ndarray, tokens: np.ndarray, pending: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The target's one pass over ``[pending] + nodes`` on the CPU, in a Hugging Face model's shapes,
    from ONE compiled call (``compiled_tree.tree_inputs``; no shape kept, nothing dispatched): input ids
    ``(1, k + 1) int64``, position ids ``(1, k + 1) int64`` and the attention mask ``(1, 1, k + 1,
    start + k + 1) bool`` -- the same as ``verification_layout(parents, start, "cpu", heads=True)``
    with the pending token and the nodes' tokens as the input.

    Args:
        parents: ``(k,) int64`` the tree's parents (topological). tokens: ``(k,) int64`` its tokens.
        pending: ``(1,) int64`` the pending token (the root). start: committed positions cached (tokens).
    Raises:
        ValueError: when a parent is not an earlier node or the root (``-1 <= parents[i] < i``).
    """
    k = parents.shape[0]
    if parents.dtype != np.int64 or tokens.dtype != np.int64:
        parents, tokens = parents.astype(np.int64), tokens.astype(np.int64)
    inputs, positions = np.empty((1, k + 1), dtype=np.int64), np.empty((1, k + 1), dtype=np.int64)
    mask = np.empty((1, 1, k + 1, start + k + 1), dtype=bool)
    bad = compiled_tree.tree_inputs(parents, tokens, pending, start, inputs[0], positions[0], mask[0, 0])
    if bad >= 0:
        raise ValueError(f"node {bad} has parent {int(parents[bad])}; parents must come earlier (-1 = the root)")
    return inputs, positions, mask


def host_buffer_width(needed: int, held: int) -> int:
    """The attention columns of a drafter's host tree buffers laid out anew (``TreeLevels``,
    ``FalconLevels``): room for ``needed`` columns (cached positions and the round's nodes) and 256
    more; doubled from the ``held`` width (0: none) only when ``needed`` outgrew it, kept when a round
    of another tree shape lays them out (a doubling there would compound with every change of shape)."""
    return max(needed + 256, 2 * held if needed > held else held)


def _as_list(parents: torch.Tensor | list[int]) -> list[int]:
    return parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)


_SHAPES: dict[tuple[int, ...] | bytes, tuple[np.ndarray, np.ndarray]] = {}  # parents -> (ancestors, depths), LRU
_DEVICE_SHAPES: dict[
    tuple[tuple[int, ...] | bytes, str], tuple[torch.Tensor, torch.Tensor]
] = {}  # the same, on a device
_SHAPES_KEPT = 64  # tree shapes kept (a static tree's every round, a dynamic tree's repeats)


def _keep(table: dict, key, value):
    """Insert into a small LRU table (oldest dropped past ``_SHAPES_KEPT``) and return ``value``."""
    table[key] = value
    if len(table) > _SHAPES_KEPT:
        del table[next(iter(table))]
    return value


def _key(parents: list[int] | np.ndarray) -> tuple[int, ...] | bytes:
    """The shape tables' key of a tree's parents: a list's tuple, an ``int64`` array's bytes."""
    return parents.tobytes() if isinstance(parents, np.ndarray) else tuple(parents)


def _shape(parents: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A tree's ``ancestor_mask`` ``(k + 1, k + 1) bool`` and depths ``(k,) int64`` as numpy arrays
    (read-only, shared: copy before changing), cached by the parents (a list, or an ``int64`` array).
    Built in one compiled pass over the nodes (``compiled.tree_shape``: each node's row is its
    parent's plus itself), which checks the order on the way; only valid shapes are cached.

    Raises:
        ValueError: naming the first node whose parent does not come earlier (``validate``'s message).
    """
    if isinstance(parents, np.ndarray) and parents.dtype != np.int64:
        parents = parents.astype(np.int64)
    key = _key(parents)
    hit = _SHAPES.get(key)
    if hit is not None:
        _SHAPES[key] = _SHAPES.pop(key)  # most recently used
        return hit
    bad, mask, depth = compiled.tree_shape(np.ascontiguousarray(parents, dtype=np.int64).reshape(len(parents)))
    if bad >= 0:
        raise ValueError(f"node {bad} has parent {int(parents[bad])}; parents must come earlier (-1 = the root)")
    mask.setflags(write=False)
    depth.setflags(write=False)
    return _keep(_SHAPES, key, (mask, depth))


def _on_device(parents: list[int] | np.ndarray, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``_shape`` on ``device``: the ancestor mask ``(k + 1, k + 1) bool`` and depth + 1 per row
    ``(k + 1,) int64`` (the root's 1), cached by (parents, device). Shared: never write to them."""
    key = (_key(parents), str(torch.device(device)))
    hit = _DEVICE_SHAPES.get(key)
    if hit is not None:
        _DEVICE_SHAPES[key] = _DEVICE_SHAPES.pop(key)
        return hit
    mask, depth = _shape(parents)
    ancestors = torch.from_numpy(mask.copy()).to(device)
    depth_plus_one = torch.from_numpy(np.concatenate(([1], depth + 1))).to(device)
    return _keep(_DEVICE_SHAPES, key, (ancestors, depth_plus_one))


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the tree kernels of a round (``compiled.tree_shape``,
    ``compiled.tree_layout``, ``compiled_tree.tree_inputs``, ``compiled.move_rows`` for float32 / float64
    caches, the verifier's host path -- ``compiled_tree.greedy_nodes`` and ``compiled_tree.keep_nodes``
    with no feature layer or 1 to 3 of them -- and a ``GrowingTree``'s ``compiled.grow_tree_rows``) now,
    not in a timed round: tree policies call it when built. ``compiled_tree.keep_rows`` / ``gather_rows``
    take a tuple as long as the target's layers: compiled (or loaded) at their first call."""
    verification_layout(np.full(1, -1, dtype=np.int64), 1, "cpu")  # tree_shape, tree_layout on a cached shape
    host_inputs(np.full(1, -1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), 1)
    for dtype in (np.float32, np.float64):  # a contiguous cache layer, and a cropped view of one
        entries = np.zeros((1, 2, 4, 1), dtype=dtype)
        for view in (entries, entries[:, :, :2]):
            compiled.move_rows(view, np.zeros(1, dtype=np.int64), 0)
        # the verifier's host path: the kept path moved by address, with 0 to 3 feature layers gathered
        nodes = np.zeros(1, dtype=np.int64)
        layouts = np.array([[entries.ctypes.data, 2, 4, entries.itemsize]], dtype=np.int64)
        for count in range(4):  # no features: one empty float32 layer, no row gathered
            like = dtype if count else np.float32
            layers = tuple(np.zeros((1, 2, 1) if count else (1, 0, 0), dtype=like) for _ in range(max(count, 1)))
            out = np.zeros((2 if count else 0, count), dtype=like)
            compiled_tree.keep_nodes(layouts, nodes, 1, 0, layers, out)
    greedy_nodes(np.full(1, -1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64), nodes)
    GrowingTree(1, "cpu", capacity=1).add(torch.zeros(1, dtype=torch.long))
    for dtype in (np.float32, np.float64):  # a HostTree's level: after a root, and after a pass
        host = HostTree(1, dtype, capacity=2)
        host.reset(1, np.zeros((1, 1), dtype=dtype))
        host.add(np.zeros(1, dtype=np.int64))
        host.outputs(np.zeros((1, 1), dtype=dtype))
        host.add(np.ones(1, dtype=np.int64))


class GrowingTree:
    """A drafter's tentative tree while a dynamic-tree policy expands it (EAGLE-2 §4: each
    ``tree_expand`` adds one level's nodes in one pass). Node 0 is the root (the last committed
    position, already cached); nodes 1, 2, ... are added in order. Kept in buffers that grow by
    doubling, so adding m nodes costs a handful of tensor ops, whatever the tree's size: each new
    node's mask row is its parent's row plus itself, its depth its parent's plus one. Shared by the
    ``ar``, ``eagle3`` and ``falcon`` drafters. On the CPU the buffers are numpy arrays (the tensors
    handed out share them) and an ``add`` is one compiled call (``compiled.grow_tree_rows``).

    Args:
        committed: positions already in the drafter's cache (the root is the last of them), tokens.
        device: where the buffers live.
        capacity: nodes (besides the root) to allocate for at first.
    """

    def __init__(self, committed: int, device: torch.device | str, capacity: int = 64) -> None:
        self.committed, self.size = committed, 0  # size: nodes added (the root not counted)
        self._on_host = getattr(device, "type", device) == "cpu"  # the bookkeeping on numpy arrays (no dispatch)
        self._device = device
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        """Buffers for ``capacity`` nodes besides the root, the rows so far copied over. Row r: node r's
        position (the root's: committed - 1), its number, and what it attends to (every committed
        position, then its ancestors-or-self among nodes 1..)."""
        kept, committed, old = self.size + 1, self.committed, getattr(self, "_mask", None)
        self._capacity = capacity
        if self._on_host:
            host_position = np.full(capacity + 1, committed - 1, dtype=np.int64)
            host_mask = np.zeros((capacity + 1, committed + capacity), dtype=bool)
            host_mask[:, :committed] = True
            if old is not None:
                host_position[:kept] = self._position_np[:kept]
                host_mask[:kept, : committed + kept - 1] = self._mask_np[:kept, : committed + kept - 1]
            self._position_np: np.ndarray = host_position
            self._mask_np: np.ndarray = host_mask
            self._number_np: np.ndarray = np.arange(capacity + 1)
            self._position, self._mask = torch.from_numpy(host_position), torch.from_numpy(host_mask)
            self._number = torch.from_numpy(self._number_np)
            return
        device = self._device if old is None else old.device
        position = torch.full((capacity + 1,), committed - 1, dtype=torch.long, device=device)
        mask = torch.zeros((capacity + 1, committed + capacity), dtype=torch.bool, device=device)
        mask[:, :committed] = True
        if old is not None:
            position[:kept] = self._position[:kept]
            mask[:kept, : committed + kept - 1] = old[:kept, : committed + kept - 1]
        self._position, self._mask = position, mask
        self._number = torch.arange(capacity + 1, device=device)

    def add(self, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` nodes under ``parents`` (``(m,) int64`` node numbers: 0 = the root, else a
        number an earlier ``add`` returned).

        Returns:
            ``(nodes, positions, mask)``: the new nodes' numbers ``(m,) int64``, their positions
            ``(m,) int64`` (the root's position plus depth), and their attention rows
            ``(m, committed + size) bool`` (True = attend: the committed positions, then their
            ancestors-or-self among the nodes). Views, valid until the next ``add``.
        """
        m, base = int(parents.shape[0]), self.size
        if base + m > self._capacity:
            self._allocate(max(base + m, 2 * self._capacity))
        self.size = size = base + m
        rows = slice(base + 1, size + 1)
        if self._on_host:  # one compiled call on the numpy buffers; the tensors handed out share them
            compiled.grow_tree_rows(self._mask_np, self._position_np, parents.numpy(), base, self.committed)
            return (
                torch.from_numpy(self._number_np[rows]),
                torch.from_numpy(self._position_np[rows]),
                torch.from_numpy(self._mask_np[rows, : self.committed + size]),
            )
        self._mask[rows] = self._mask.index_select(0, parents)
        self._mask[rows, self.committed + base : self.committed + size].fill_diagonal_(True)
        self._position[rows] = self._position.index_select(0, parents) + 1
        return self._number[rows], self._position[rows], self._mask[rows, : self.committed + size]


class NodeRows:
    """Rows kept per tree node while a tree grows (a drafter's outputs by node number: row r = node
    r, row 0 the root's), gathered by node for the next level's pass. On the CPU, for dtypes numpy
    holds, a numpy buffer grown by doubling (a gather is a numpy take, an append a copy into the
    buffer); elsewhere a tensor (``index_select``, ``torch.cat``), as before.

    Args:
        first: ``(r, H)`` the first nodes' rows (the root's).
        capacity: rows to allocate for at first.
    """

    def __init__(self, first: torch.Tensor, capacity: int = 65) -> None:
        self.size = int(first.shape[0])
        self._rows: torch.Tensor | None = None
        if first.device.type == "cpu" and first.dtype in _NUMPY_FLOATS and not first.requires_grad:
            self._buffer = np.empty((max(capacity, self.size), *first.shape[1:]), dtype=_NUMPY_FLOATS[first.dtype])
            self._buffer[: self.size] = first.numpy()
        else:
            self._rows = first

    def take(self, nodes: torch.Tensor) -> torch.Tensor:
        """The rows of ``nodes`` (``(m,) int64`` numbers already added): ``(m, H)``, a new tensor."""
        if self._rows is not None:
            return self._rows.index_select(0, nodes)
        return torch.from_numpy(self._buffer.take(nodes.numpy(), axis=0))  # a copy (rows past size: never asked)

    def append(self, rows: torch.Tensor) -> None:
        """Add the next nodes' rows ``(m, H)`` (numbered ``size``, ``size + 1``, ...)."""
        m = int(rows.shape[0])
        if self._rows is not None:
            self._rows = torch.cat([self._rows, rows])
            self.size += m
            return
        if self.size + m > self._buffer.shape[0]:
            grown = np.empty(
                (max(self.size + m, 2 * self._buffer.shape[0]), *self._buffer.shape[1:]), self._buffer.dtype
            )
            grown[: self.size] = self._buffer[: self.size]
            self._buffer = grown
        self._buffer[self.size : self.size + m] = rows.numpy()
        self.size += m


_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


class HostTree:
    """``GrowingTree`` and ``NodeRows`` together for a drafter on the CPU whose tree passes take the
    parents' outputs (EAGLE-3's head), on numpy buffers kept from round to round: a level's rows
    (mask, position), its parents' outputs gathered for the pass, and the previous pass's outputs
    stored are ONE compiled call (``compiled_tree.host_tree_level``); a new round rewrites the root's row
    only (every node's row is copied whole from its parent's). The same mask, positions and rows as
    ``GrowingTree.add`` and ``NodeRows.take`` (``tests/core/test_tree_kernels.py``).

    Args:
        width: the outputs' width H. dtype: their numpy dtype (float32 or float64).
        capacity: nodes (besides the root) to allocate for at first (grown by doubling).
    """

    def __init__(self, width: int, dtype: npt.DTypeLike, capacity: int = 64) -> None:
        self.width, self.dtype = width, np.dtype(dtype)
        self.committed = self.size = 0
        self._mask: np.ndarray  # (capacity + 1, columns) bool: node rows (0: the root's)
        self._position: np.ndarray  # (capacity + 1,) int64
        self._rows: np.ndarray  # (capacity + 1, width): node outputs
        self._number: np.ndarray  # (capacity + 1,) int64: 0, 1, ...
        self._capacity = self._columns = 0
        self._last: np.ndarray = np.empty((0, width), dtype=self.dtype)  # outputs not yet in ``_rows``
        self._allocate(capacity, 0, keep=False)

    def _allocate(self, capacity: int, committed: int, keep: bool = True) -> None:
        """Buffers for ``capacity`` nodes besides the root after ``committed`` positions (a round's
        columns: ``committed + capacity``, with room for 256 more committed positions), the rows
        held so far copied over when ``keep``."""
        kept, old = self.size + 1, getattr(self, "_mask", None)
        columns = max(committed + capacity + 256, self._columns)
        mask = np.zeros((capacity + 1, columns), dtype=bool)
        position = np.zeros(capacity + 1, dtype=np.int64)
        rows = np.empty((capacity + 1, self.width), dtype=self.dtype)
        if keep and old is not None:
            mask[:kept, : self._columns] = old[:kept]
            position[:kept] = self._position[:kept]
            rows[:kept] = self._rows[:kept]
        self._mask, self._position, self._rows = mask, position, rows
        self._number = np.arange(capacity + 1)
        self._capacity, self._columns = capacity, columns

    def reset(self, committed: int, root: np.ndarray) -> None:
        """Start a round's tree: the root (node 0, the last of ``committed`` cached positions) with its
        output ``root`` ``(1, H)``."""
        self.size = 0
        if committed + self._capacity > self._columns:
            self._allocate(self._capacity, committed, keep=False)
        self.committed = committed
        self._mask[0, :committed] = True
        self._mask[0, committed:] = False
        self._position[0] = committed - 1
        self._rows[0] = root[0]
        self._last = self._rows[:0]

    def add(self, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Add ``m`` nodes under ``parents`` (``(m,) int64`` node numbers: 0 = the root, else a number
        an earlier ``add`` returned).

        Returns:
            ``(nodes, positions, mask, hidden)``: the new nodes' numbers ``(m,) int64``, positions
            ``(m,) int64``, attention rows ``(m, committed + size) bool`` (``GrowingTree.add``'s) --
            views, valid until the next ``add`` -- and their parents' outputs ``(m, H)`` (a new array).
        Raises:
            ValueError: for a parent that is not a node added before.
        """
        m, base = parents.shape[0], self.size
        if base + m > self._capacity:
            self._allocate(max(base + m, 2 * self._capacity), self.committed)
        hidden = np.empty((m, self.width), dtype=self.dtype)
        last = self._last
        bad = compiled_tree.host_tree_level(
            self._mask,
            self._position,
            self._rows,
            parents,
            base,
            self.committed,
            last,
            base + 1 - last.shape[0],
            hidden,
        )
        if bad >= 0:
            raise ValueError(f"node parent {int(parents[bad])} is not a node of the tree (0..{base})")
        self.size = size = base + m
        return (
            self._number[base + 1 : size + 1],
            self._position[base + 1 : size + 1],
            self._mask[base + 1 : size + 1, : self.committed + size],
            hidden,
        )

    def outputs(self, out: np.ndarray) -> None:
        """The outputs ``(m, H)`` of the nodes the last ``add`` returned (stored at the next ``add``)."""
        self._last = out


def validate(parents: torch.Tensor | list[int], k: int) -> None:
    """Check a tree's parents (``(k,)`` int64, or the same as a list): each ``-1 <= parents[i] < i``.
    Checked on the host (one sync for a tensor), by building the shape (``_shape``, cached: a
    shape seen before is valid).

    Raises:
        ValueError: naming the first bad node.
    """
    plist = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    if isinstance(parents, torch.Tensor) and tuple(parents.shape) != (k,) or len(plist) != k:
        shape = tuple(parents.shape) if isinstance(parents, torch.Tensor) else (len(plist),)
        raise ValueError(f"parents has shape {shape}; a tree of {k} nodes needs ({k},)")
    _shape(plist)


def path_to(node: int, parents: list[int]) -> tuple[int, ...]:
    """The nodes from the root's child down to ``node`` (-1: the empty path)."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return tuple(reversed(out))


def greedy_path(
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    target_ids: torch.Tensor,
    plist: list[int] | np.ndarray | None = None,
) -> tuple[int, ...]:
    """The longest root-to-node path the target agrees with (greedy verification of a tree).

    Args:
        parents: ``(k,) int64``. token_ids: ``(k,) int64`` the nodes' tokens.
        target_ids: ``(k + 1,) int64`` the target's greedy token at the root (0) and after each
            node (i + 1): what it would emit next there.
        plist: ``parents`` on the host (a list or an ``int64`` array) when the caller already has it
            there (saves a sync).
    Returns:
        the accepted nodes, root's child first (empty: nothing accepted); the deepest accepted
        node wins, the first in order among equally deep ones. Tensor ops on the ancestor mask
        (``verification_layout``'s, cached by shape): a node is accepted when it and every ancestor
        agree with the target at their parents; one host sync (the path).
    """
    k = int(parents.shape[0])
    if k == 0:
        return ()
    plist = parents.tolist() if plist is None else plist
    ancestors, depth_plus_one = _on_device(plist, target_ids.device)
    disagrees = token_ids != target_ids[parents + 1]  # (k,) each node vs the target at its parent
    accepted = ~(ancestors[1:, 1:] & disagrees[None, :]).any(dim=1)  # (k,) the node and its ancestors agree
    score = torch.where(accepted, depth_plus_one[1:], 0)  # accepted depth + 1, else 0
    best = score.argmax().reshape(1)  # the first of the deepest (argmax gives the first maximum); no sync
    path = ancestors[1:, 1:].index_select(0, best)[0] & (score.max() > 0)  # (k,) its ancestors-or-self, or none
    return tuple(path.nonzero().flatten().tolist())  # topological order: root's child first


def greedy_nodes(parents: np.ndarray, tokens: np.ndarray, target: np.ndarray, nodes: np.ndarray) -> tuple[int, ...]:
    """``greedy_path`` on the host, in ONE compiled call (``compiled_tree.greedy_nodes``): the same
    path from numpy arrays -- ``parents`` ``(k,) int64`` (topological, already checked), ``tokens`` ``(k,)
    int64``, ``target`` ``(k + 1,) int64`` the target's greedy tokens -- also written to ``nodes[:m]``
    (an ``int64`` buffer of at least k entries; m the path's length). Returns the accepted nodes, root's
    child first (empty: nothing accepted)."""
    return tuple(nodes[: compiled_tree.greedy_nodes(parents, tokens, target, nodes)].tolist())


def sample_path(
    p: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[tuple[int, ...], int]:
    """Speculative sampling over a tree: recursive rejection sampling (SpecInfer §4; EAGLE's
    tree sampling). From the root, try the current node's children in order: child c (token x,
    drawn from ``q[c]``) is accepted with probability ``min(1, p(x) / q_c(x))`` and becomes the
    current node; a rejection replaces p by ``norm(max(p - q_c, 0))`` and tries the next sibling.
    When no child is accepted, the next token is drawn from the (residual) p; after a leaf, from
    the target's p there. The output is distributed as sampling from the target.

    Args:
        p: ``(k + 1, V) float32`` the target's (warped) distribution at the root and after each node.
        parents, token_ids: ``(k,) int64``.
        q: ``(k, V) float32`` the distribution each node was drawn from (siblings drawn from the
            same q, or point masses), or None: every node a point mass.
        generator: the random stream.
    Returns:
        ``(accepted path, next token)``.
    """
    parents_l, tokens = parents.tolist(), token_ids.tolist()
    gen_device = generator.device if generator is not None else torch.device("cpu")
    uniforms = torch.rand(len(tokens) + 1, generator=generator, device=gen_device).cpu().tolist()
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents_l):
        children.setdefault(parent, []).append(i)
    node, draw = -1, 0
    path: list[int] = []
    dist = p[0].cpu()  # rows move to the host as the walk reaches them (each step is a decision anyway)
    while True:
        accepted = None
        for c in children.get(node, []):
            x = tokens[c]
            q_c = None if q is None else q[c].cpu()
            qx = 1.0 if q_c is None else float(q_c[x])
            ratio = float(dist[x]) / qx if qx > 0 else 0.0
            u = uniforms[draw]
            draw += 1
            if u < min(1.0, ratio):
                accepted = c
                break
            if q_c is None:
                dist = dist.clone()
                dist[x] = 0.0
            else:
                dist = torch.clamp(dist - q_c, min=0.0)
            total = float(dist.sum())
            if total <= 0:  # numerically nothing left: the target's own distribution is the residual
                dist = p[node + 1].cpu()
            else:
                dist = dist / total
        if accepted is None:  # inverse CDF with the last uniform (each node is tried at most once)
            cdf = dist.double().cumsum(0)
            nxt = int(torch.searchsorted(cdf, uniforms[-1] * cdf[-1], right=True).clamp(max=int(dist.shape[0]) - 1))
            while float(dist[nxt]) <= 0:  # rounding at the top: the last token of positive weight
                nxt -= 1
            return tuple(path), nxt
        path.append(accepted)
        node = accepted
        dist = p[node + 1].cpu()
