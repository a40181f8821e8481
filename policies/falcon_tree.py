"""``falcon-tree`` policy: Falcon's custom-designed static decoding tree (Gao et al., arXiv 2412.12639,
§3.4; Bestpay-inc/Falcon ``models/choices.py`` and ``generate_tree_buffers`` in ``models/utils_c.py``).

The tree is a list of choices: a node at depth d is a path ``(i_1, .., i_d)`` of ranks; its token is
the ``i_d``-th most likely token of the distribution that the drafter's block pass gives for depth d.
The drafter drafts k tokens per pass (``drafter=falcon``, k = 2), so depths come in blocks: the
round's first pass gives the distributions of depths 1..k (the k outputs of one pass, each
independent of the token chosen at the others), and every node at a depth that is a multiple of k
with descendants in the tree starts a block: ONE pass over all such nodes of that depth (each fed
its parent block's predicted features, the k tokens of its path since its parent block and that
block's LSTM state) gives the distributions of the next k depths below it. So a node at depth d
takes its token from the block of its ancestor at depth ``k * floor((d - 1) / k)`` (the root for
d <= k), at offset ``(d - 1) % k``. Drafter passes per round: 1 + (deepest depth - 1) // k.

Trees: ``paper`` is the released default ``kmask2_8layer_tree`` (depth 8 = 4 passes of 2 tokens;
165 distinct nodes -- the released list holds one path twice, kept once here), top-20 at depth 1,
a main chain with 8-10 children at each depth and short side branches; ``cpu`` (default here) is a
27-node tree of the same depth sized for this testbed's CPU, where a target pass over 166 nodes
costs several plain steps: top-4 at depth 1, the main chain with 2-3 children per depth and one
side branch under each of the top three paths. ``choices`` gives any other list. The target
verifies the tree in one pass (``specpolicy.core.tree``); nodes are point masses when sampling
(each node's token is a deterministic top-k choice, siblings distinct). With ``falcon`` on the CPU
the host work between two passes -- this policy's read and the drafter's layout of the next pass --
is ONE compiled call (``grow_levels``, ``specpolicy.core.compiled_falcon.falcon_tree_level``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specpolicy.core.compiled_falcon import falcon_tree_level, falcon_tree_read as read
from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import BlockTreeDrafter
from specpolicy.core.runtime import no_grad
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "falcon-tree"


def _paths(spec: str) -> list[tuple[int, ...]]:
    """Paths written as space-separated digit strings (each digit one rank < 10)."""
    return [tuple(int(c) for c in word) for word in spec.split()]


#: The released default tree, ``kmask2_8layer_tree`` (depth 8), by depth (ranks as digits).
PAPER_TREE: list[tuple[int, ...]] = [(i,) for i in range(20)] + _paths(
    "00 01 02 03 04 05 06 07 08 09 10 11 20 21 30 "
    "000 001 002 003 004 005 006 007 008 009 010 011 020 021 030 100 101 200 300 "
    "0000 0001 0002 0003 0004 0005 0006 0007 0008 0009 0010 0011 0020 0100 0101 0110 0200 0210 0300 "
    "1000 1001 2000 3000 "
    "00000 00001 00002 00003 00004 00005 00006 00007 00008 00009 00010 00011 00020 00100 00200 01000 "
    "02000 03000 10000 20000 30000 "
    "000000 000001 000002 000003 000004 000005 000006 000007 000008 000010 000011 000020 000100 000110 "
    "000200 001000 002000 010000 020000 030000 100000 200000 300000 "
    "0000000 0000001 0000002 0000003 0000004 0000005 0000006 0000007 0000008 0000010 0000011 0000020 "
    "0000100 0001000 0010000 0020000 0100000 0200000 0300000 1000000 2000000 "
    "00000000 00000001 00000002 00000003 00000004 00000005 00000006 00000007 00000010 00000011 00000020 "
    "00000100 00000110 00000200 00001000 00010000 00100000 00200000 01000000 02000000 03000000 10000000 "
    "20000000"
)

#: A 27-node tree of depth 8 for this testbed's CPU (see the module docstring).
CPU_TREE: list[tuple[int, ...]] = _paths(
    "0 1 2 3 00 01 02 10 000 001 002 010 100 0000 0001 0010 0100 00000 00001 00010 "
    "000000 000001 000010 0000000 0000001 00000000 00000001"
)

TREES = {"cpu": CPU_TREE, "paper": PAPER_TREE}

#: a drafter's log-probability dtypes as numpy's (the CPU's compiled reads)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


class StaticTree:
    """A choices list laid out for block drafting with k tokens per pass.

    Args:
        choices: paths of ranks (any order; duplicates dropped); every path's prefixes must be in it.
        k: tokens per drafter pass.
    Raises:
        ValueError: an empty list, a rank < 0, or a path whose parent path is missing.
    """

    def __init__(self, choices: list[tuple[int, ...]] | list[list[int]], k: int) -> None:
        paths = sorted({tuple(int(i) for i in c) for c in choices}, key=lambda p: (len(p), p))
        if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
            raise ValueError("policy.choices must be a non-empty list of non-empty paths of ranks >= 0")
        index = {p: i for i, p in enumerate(paths)}
        for p in paths:
            if len(p) > 1 and p[:-1] not in index:
                raise ValueError(f"policy.choices: path {list(p)} has no parent path {list(p[:-1])} in the tree")
        self.paths, self.k, self.index = paths, k, index
        self.top_k = 1 + max(max(p) for p in paths)
        self.depth = max(len(p) for p in paths)
        self.parents = [index[p[:-1]] if len(p) > 1 else -1 for p in paths]
        has_child = {p[:-1] for p in paths}
        #: passes per round (the root's included)
        self.passes = -(-self.depth // k)
        #: per pass b >= 1: the nodes at depth k * b with descendants (each starts a block)
        self.block_nodes = {
            b: [i for i, p in enumerate(paths) if len(p) == k * b and p in has_child] for b in range(1, self.passes)
        }
        # Gather indices, so a round reads the nodes off the passes' outputs level by level (tensor
        # ops, no per-node loop). Blocks are numbered root 0, then pass by pass in block_nodes order.
        block_of = {(): 0}
        for b in range(1, self.passes):
            block_of.update({paths[i]: len(block_of) + j for j, i in enumerate(self.block_nodes[b])})
        #: per node: the block whose pass gives its distribution, its offset in that block, its rank
        self.node_block = torch.tensor([block_of[self.owner(p)] for p in paths], dtype=torch.long)
        self.node_offset = torch.tensor([(len(p) - 1) % k for p in paths], dtype=torch.long)
        self.node_rank = torch.tensor([p[-1] for p in paths], dtype=torch.long)
        self.node_parent = torch.tensor(self.parents, dtype=torch.long)
        #: per depth d: the nodes at that depth are the slice level_start[d - 1] .. level_start[d]
        self.level_start = [sum(1 for p in paths if len(p) <= d) for d in range(self.depth + 1)]
        #: per pass b >= 1: each new block's parent block, and the nodes holding its k tokens
        self.block_parent = {b: self.node_block[self.block_nodes[b]] for b in range(1, self.passes)}
        self.block_tokens = {
            b: torch.tensor(
                [[index[paths[i][:j]] for j in range(k * b - k + 1, k * b + 1)] for i in self.block_nodes[b]],
                dtype=torch.long,
            ).reshape(len(self.block_nodes[b]), k)
            for b in range(1, self.passes)
        }
        #: per pass b: the slice of nodes it drafts (depths k * b + 1 .. k * (b + 1)), in node order
        self.pass_nodes = [
            slice(self.level_start[k * b], self.level_start[min(k * (b + 1), self.depth)]) for b in range(self.passes)
        ]
        #: ``(depth, n)``: row d - 1 holds each node's ancestor-or-self at depth d (n: none, a zero)
        self.node_path = torch.full((self.depth, len(paths)), len(paths), dtype=torch.long)
        for i, p in enumerate(paths):
            for d in range(1, len(p) + 1):
                self.node_path[d - 1, i] = index[p[:d]]
        self._truncated: dict[tuple[int, int], StaticTree | None] = {}
        self._on: dict[str, tuple] = {}

    def on(self, device: torch.device) -> tuple:
        """The gather indices on ``device`` (moved once, cached): ``(node_block, node_offset,
        node_rank, node_parent, node_path, block_parent, block_tokens)``, the last two per pass."""
        key = str(device)
        if key not in self._on:
            move: list[Any] = [x.to(device) for x in (self.node_block, self.node_offset, self.node_rank)]
            move += [self.node_parent.to(device), self.node_path.to(device)]
            move += [{b: x.to(device) for b, x in table.items()} for table in (self.block_parent, self.block_tokens)]
            self._on[key] = tuple(move)
        return self._on[key]

    def host_plan(self) -> tuple:
        """The CPU's round plan for ``compiled_falcon.falcon_tree_read`` (built once, cached): ``nodes`` ``(3,
        n) int64`` (each node's block, offset, rank), ``node_path`` ``(depth, n) int64``, ``blocks`` ``(B,
        1 + k) int64`` (per block: its parent block, the k nodes of its path since it; row 0, the root,
        unused), ``bounds`` ``(passes, 4) int64`` (per pass: its first and end node, first block and
        blocks), a scratch ``numbers`` ``(B,) int64`` (the drafter's block numbers), per pass b >= 1 the
        tensor of its blocks' tokens and the numpy array of their parents (views of scratch buffers the
        kernel fills), and the root's block number ``(1,) int64``."""
        if "plan" not in self._on:
            k, counts = self.k, [1] + [len(self.block_nodes[b]) for b in range(1, self.passes)]
            firsts = np.cumsum([0] + counts[:-1])
            blocks = np.zeros((sum(counts), 1 + k), dtype=np.int64)
            for b in range(1, self.passes):
                rows = slice(int(firsts[b]), int(firsts[b]) + counts[b])
                blocks[rows, 0], blocks[rows, 1:] = self.block_parent[b].numpy(), self.block_tokens[b].numpy()
            bounds = np.array(
                [[self.pass_nodes[b].start, self.pass_nodes[b].stop, firsts[b], counts[b]] for b in range(self.passes)],
                dtype=np.int64,
            ).reshape(self.passes, 4)
            nodes = np.stack([self.node_block.numpy(), self.node_offset.numpy(), self.node_rank.numpy()])
            next_tokens, next_parents = np.zeros((len(blocks), k), dtype=np.int64), np.zeros(len(blocks), np.int64)
            views = [
                (
                    torch.from_numpy(next_tokens[firsts[b] : firsts[b] + counts[b]]),
                    next_parents[firsts[b] : firsts[b] + counts[b]],
                )
                for b in range(self.passes)
            ]
            self._on["plan"] = (
                nodes,
                self.node_path.numpy(),
                blocks,
                bounds,
                np.zeros(len(blocks), dtype=np.int64),
                next_tokens,
                next_parents,
                views,
                np.zeros(1, dtype=np.int64),
            )
        return self._on["plan"]

    def owner(self, path: tuple[int, ...]) -> tuple[int, ...]:
        """The path of the block node whose pass gives this node's distribution (() = the root)."""
        return path[: self.k * ((len(path) - 1) // self.k)]

    def truncated(self, depth: int, nodes: int) -> StaticTree | None:
        """The tree cut to ``depth`` levels and its first ``nodes`` nodes (length order keeps it a
        tree); None when nothing is left."""
        key = (min(depth, self.depth), min(max(nodes, 0), len(self.paths)))
        if key not in self._truncated:  # a round's room only takes a few values: built once each
            kept = [p for p in self.paths if len(p) <= key[0]][: key[1]]
            cut = None if not kept else StaticTree(kept, self.k) if len(kept) < len(self.paths) else self
            self._truncated[key] = cut
        return self._truncated[key]


class FalconTreePolicy(TreePolicy):
    """Falcon's static decoding tree.

    Args:
        tree: ``"cpu"`` (default, 27 nodes, depth 8) or ``"paper"`` (the released default, 165 nodes,
            depth 8), used when ``choices`` is None.
        choices: a list of rank paths (e.g. ``[[0], [1], [0, 0]]``), overriding ``tree``.
    Raises:
        ValueError: naming ``policy.tree`` / ``policy.choices`` for a bad value.
    """

    name = NAME

    def __init__(self, tree: str = "cpu", choices: list[list[int]] | None = None) -> None:
        if choices is None and tree not in TREES:
            raise ValueError(f"policy.tree must be one of {', '.join(TREES)}, got {tree!r}")
        if choices is not None and not isinstance(choices, (list, tuple)):
            raise ValueError(f"policy.choices must be a list of rank paths, got {choices!r}")
        self.tree_name = tree if choices is None else "custom"
        self.choices = [tuple(p) for p in (TREES[tree] if choices is None else choices)]
        StaticTree(self.choices, 2)  # checks the list now, before any model loads
        self._layouts: dict[int, StaticTree] = {}
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round
        warm: Any = _WarmUp()  # and this policy's read (compiled.falcon_tree_read), both branches
        gather_on_host(warm, StaticTree([(0,), (0, 0), (0, 0, 0)], 1), *warm.tree_block_root(1))

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, BlockTreeDrafter):
            raise ValueError(
                f"policy=falcon-tree needs a drafter that drafts blocks of tokens per pass (falcon); drafter "
                f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def layout(self, k: int) -> StaticTree:
        """The tree laid out for k tokens per pass (cached)."""
        if k not in self._layouts:
            self._layouts[k] = StaticTree(self.choices, k)
        return self._layouts[k]

    def draft_tree(self, drafter: BlockTreeDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        runtime = getattr(drafter, "runtime", None)  # ``device_of`` without its Protocol check (per round)
        device = "cpu" if runtime is None else runtime.torch_device
        full = self.layout(drafter.k)
        t = full.truncated(min(room, full.depth), node_room)
        if t is None:
            return Draft.empty(device), "room"
        if getattr(drafter, "grows_trees_on_host", False):  # falcon on the CPU: one compiled call a pass
            draft = grow_levels(drafter, t)
            if draft is None:
                return Draft.empty(device), "no_proposal"
            return draft, "room" if t.depth < full.depth else "policy_bound"
        ids, logp = drafter.tree_block_root(t.top_k)
        if ids.numel() == 0:
            return Draft.empty(device), "no_proposal"
        if ids.device.type == "cpu" and logp.dtype in _NUMPY:  # compiled reads on numpy views (no per-op dispatch)
            tokens, scores = self._gather_on_host(drafter, t, ids, logp)
            parents = t.node_parent  # the CPU's, built once
        else:
            tokens, scores = self._gather(drafter, t, ids, logp)
            parents = t.on(tokens.device)[3]
        confidences = scores.exp()
        draft = Draft(
            token_ids=tokens,
            confidences=confidences if confidences.dtype == torch.float32 else confidences.float(),
            forward_passes=drafter.tree_passes,
            parents=parents,
        )
        return draft, "room" if t.depth < full.depth else "policy_bound"

    def _gather(
        self, drafter: BlockTreeDrafter, t: StaticTree, ids: torch.Tensor, logp: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's passes and the nodes read off them, in tensor ops on the drafter's device:
        tokens ``(n,) int64`` and cumulative log-probabilities ``(n,)`` (``logp``'s dtype)."""
        dev = ids.device
        node_block, node_offset, node_rank, _, node_path, block_parent, block_tokens = t.on(dev)
        block_ids, block_logp = [ids[None]], [logp[None]]  # per block: (k, top_k) ids / log-probs
        numbers = [torch.zeros(1, dtype=torch.long, device=dev)]  # per block: its drafter block number
        tokens = torch.empty(len(t.paths), dtype=torch.long, device=dev)
        for b in range(t.passes):
            if b > 0:  # ONE pass for every block-starting node at depth k * b
                parent = torch.cat(numbers)[block_parent[b]]
                new, bids, blogp = drafter.tree_block_expand(tokens[block_tokens[b]], parent, t.top_k)
                block_ids.append(bids)
                block_logp.append(blogp)
                numbers.append(new.to(dev))
            sl = t.pass_nodes[b]  # the nodes this pass drafted, read off its blocks in one gather
            tokens[sl] = torch.cat(block_ids)[node_block[sl], node_offset[sl], node_rank[sl]]
        node_logp = torch.cat(block_logp)[node_block, node_offset, node_rank]  # (n,) each node's own log-prob
        on_path = torch.cat([node_logp, node_logp.new_zeros(1)])[node_path]  # (depth, n): 0 past a node's depth
        scores = on_path[0]
        for d in range(1, t.depth):  # the paths' cumulative log-probabilities, summed root first
            scores = scores + on_path[d]
        return tokens, scores

    def _gather_on_host(
        self, drafter: BlockTreeDrafter, t: StaticTree, ids: torch.Tensor, logp: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_gather`` for a drafter on the CPU (``gather_on_host``)."""
        return gather_on_host(drafter, t, ids, logp)

    def __repr__(self) -> str:
        return f"FalconTreePolicy(tree={self.tree_name!r}, nodes={len(set(self.choices))})"


def gather_on_host(
    drafter: BlockTreeDrafter, t: StaticTree, ids: torch.Tensor, logp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``FalconTreePolicy._gather`` for a drafter on the CPU: after each pass ONE compiled call
    (``compiled_falcon.falcon_tree_read``: the nodes it drafted, the next pass's blocks, after the last the
    paths' sums) on numpy views of its outputs, the same gathers and sums in the same order; the
    drafter is handed tensors sharing the plan's arrays and the parents as numpy arrays. Returns
    tokens ``(n,) int64`` and cumulative log-probabilities ``(n,)`` (``logp``'s dtype, float32 or
    float64)."""
    nodes, node_path, blocks, bounds, numbers, next_tokens, next_parents, views, root = t.host_plan()
    n = nodes.shape[1]
    dtype = _NUMPY[logp.dtype]
    tokens, node_logp, scores = np.empty(n, np.int64), np.empty(n, dtype), np.empty(n, dtype)
    bids, blogp, new = ids.numpy()[None], logp.numpy()[None], root
    for b in range(t.passes):
        if b > 0:
            block_tokens, parents = views[b]
            new_t, bids_t, blogp_t = drafter.tree_block_expand(block_tokens, parents, t.top_k)
            bids, blogp = bids_t.numpy(), blogp_t.numpy()
            new = new_t.numpy() if isinstance(new_t, torch.Tensor) else new_t
        read(
            b, bids, blogp, new, nodes, node_path, blocks, bounds, numbers, tokens, node_logp, next_tokens,
            next_parents, scores,
        )  # fmt: skip
    return torch.from_numpy(tokens), torch.from_numpy(scores)


@no_grad
def grow_levels(drafter: Any, t: StaticTree) -> Draft | None:
    """The round's tree for a drafter that lets the policy lay out its passes (``grows_trees_on_host``:
    ``falcon``'s ``tree_root_host`` / ``tree_pass_host``): after each pass ONE compiled call
    (``compiled_falcon.falcon_tree_level``: the nodes it drafted and the next pass's blocks, as
    ``gather_on_host``'s read, then the drafter's side of that pass laid out in its kept buffers,
    which the pass reads as tensors made once; after the last, the paths' sums). The same draft as
    ``gather_on_host`` with ``tree_block_expand`` (``tests/drafters/test_falcon_drafter.py``). None:
    nothing to draft from (fewer than k pairs)."""
    nodes, node_path, blocks, bounds, numbers, next_tokens, next_parents, views, _ = t.host_plan()
    root = drafter.tree_root_host(t.top_k, blocks.shape[0])
    if root is None:
        return None
    out, h, c, ids, logp, levels, committed = root
    n, rows, expand = nodes.shape[1], levels.rows, drafter.tree_pass_host
    level: Any = falcon_tree_level  # a numba dispatcher, called with the buffers unpacked
    tokens, node_logp, scores = np.empty(n, np.int64), np.empty(n, np.float32), np.empty(n, np.float32)
    base = 0
    for b in range(t.passes):
        inputs = levels.pass_of(int(bounds[b + 1, 3]))[0] if b + 1 < t.passes else levels.pass_of(1)[0]
        m = level(
            b, ids, logp, nodes, node_path, blocks, bounds, numbers, tokens, node_logp, next_tokens, next_parents,
            scores, *rows, *inputs, committed, base, out, h, c,
        )  # fmt: skip
        if m:  # the last pass's outputs and state are not read (its blocks are no one's parents)
            got = expand(views[b + 1][0], base, m, t.top_k, b + 2 < t.passes)
            out, h, c = (out, h, c) if got[0] is None else got[:3]
            ids, logp, base = got[3], got[4], base + m
    return Draft(
        token_ids=torch.from_numpy(tokens),
        confidences=torch.from_numpy(scores).exp(),
        forward_passes=t.passes,
        parents=t.node_parent,
    ).counted(n)


class _WarmUp:
    """A block drafter of constant outputs (one token per block, float32 log-probabilities, as the
    falcon drafter's on the CPU): the policy's compiled read runs on it when the policy is built."""

    k = 1

    def tree_block_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros((1, top_k), dtype=torch.long), torch.zeros((1, top_k))

    def tree_block_expand(self, tokens, parents, top_k: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        m = int(tokens.shape[0])
        return np.ones(m, dtype=np.int64), torch.zeros((m, 1, top_k), dtype=torch.long), torch.zeros((m, 1, top_k))


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``FalconTreePolicy``, built from its config node and checked by building it."""
    return [PluginEntry.from_class("policy", NAME, FalconTreePolicy, "Falcon's static decoding tree")]
