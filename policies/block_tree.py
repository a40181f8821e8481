"""``block-tree`` policy: a one-pass draft tree for block drafters (DFlash).

One DFlash pass predicts every position of its block in parallel, each with a full distribution
(``Drafter.alternatives``). Rather than verifying only the most likely chain, the policy grows the
tree the block's marginals support best (Medusa's tree from per-position heads, Cai et al. 2024;
DART prunes such trees with n-gram continuity, here the block's own marginals rank the paths):
best-first from the root, a node at depth d with token ``ids[d - 1, r]`` scores the sum of the
log-probabilities along its path, its children are the ``top_k`` tokens of position d + 1, and the
``total_tokens`` best-scoring nodes form the tree (a node never scores above its parent, so they
do). One drafter pass per round for ``depth`` <= B - 1 (an extension pass beyond); the target
verifies the tree in one pass. Block drafters only (``dflash``): a chain drafter's per-position
alternatives are conditioned on its own chain, not on a sibling.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
import torch
from numba import njit

from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import BlockDrafter
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "block-tree"


@njit(cache=True)
def _grow(ids, logp, nodes, tokens, parents, scores):
    """``best_first_tree``'s search into ``tokens`` / ``parents`` (int64) and ``scores`` (float64), each
    ``(>= nodes,)``; ``logp`` float32 or float64 (widened); returns the node count."""
    n, k = ids.shape
    heap = [(-np.float64(logp[0, r]), 0, r, -1) for r in range(k)]
    heapq.heapify(heap)
    count = 0
    while len(heap) > 0 and count < nodes:
        neg, pos, r, parent = heapq.heappop(heap)
        tokens[count], parents[count], scores[count] = ids[pos, r], parent, -neg
        node = count
        count += 1
        if pos + 1 < n:
            for c in range(k):
                heapq.heappush(heap, (neg - np.float64(logp[pos + 1, c]), pos + 1, c, node))
    return count


@njit(cache=True)
def best_first_tree(ids: np.ndarray, logp: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best-first tree over one block's per-position top-k (module docstring), compiled: ``ids``
    ``(n, K) int64`` and ``logp`` ``(n, K) float64`` (each position's alternatives and their
    log-probabilities), ``nodes`` the most nodes -> ``(tokens (m,) int64, parents (m,) int64 (-1: the
    root), scores (m,) float64)``, m <= ``nodes``, in pop order (parents first). A heap of
    ``(-score, position, rank, parent)`` tuples, ties broken by the tuple's next fields, as the
    Python ``heapq`` loop it replaced broke them (numba's ``heapq`` is CPython's algorithm)."""
    tokens = np.empty(nodes, dtype=np.int64)
    parents = np.empty(nodes, dtype=np.int64)
    scores = np.empty(nodes)
    count = _grow(ids, logp, nodes, tokens, parents, scores)
    return tokens[:count].copy(), parents[:count].copy(), scores[:count].copy()


@njit(cache=True)
def best_first_tree_into(ids, logp, nodes, ints, confidences):
    """``best_first_tree`` on float32 ``logp`` (widened to float64, as ``astype`` widens it) into the
    caller's arrays: ``ints`` ``(2, >= nodes) int64`` the tokens and parents, ``confidences``
    ``(>= nodes,) float32`` each node's ``exp(score)`` (the C library's ``exp`` of the float64
    score, Python's ``math.exp``, rounded to float32); returns the node count (no arrays returned:
    boxing them costs more than the search)."""
    scores = np.empty(nodes)
    count = _grow(ids, logp, nodes, ints[0], ints[1], scores)
    for i in range(count):
        confidences[i] = math.exp(scores[i])
    return count


class BlockTreePolicy(TreePolicy):
    """A best-first tree over one block's per-position top-k.

    Args:
        depth: positions of the block the tree may use, an integer >= 1 (default 15: a DFlash block
            of 16 drafts 15; more costs an extension pass).
        top_k: alternatives per position, an integer in [1, 4] (default 3).
        total_tokens: nodes verified per round, an integer >= 1 (default 24).
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(self, depth: int = 15, top_k: int = 3, total_tokens: int = 24) -> None:
        for key, value, hi in (("depth", depth, None), ("top_k", top_k, 4), ("total_tokens", total_tokens, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (hi and value > hi):
                raise ValueError(f"policy.{key} must be an integer {'in [1, 4]' if hi else '>= 1'}, got {value!r}")
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        best_first_tree(
            np.zeros((1, 1), dtype=np.int64), np.zeros((1, 1)), 1
        )  # compiled (or cached) now, not in a round
        warm = np.zeros((1, 1), dtype=np.int64)
        best_first_tree_into(warm, np.zeros((1, 1), np.float32), 1, np.empty((2, 1), np.int64), np.empty(1, np.float32))
        self._drafter: Any = None  # the drafter ``draft_tree`` read its device of last
        self._device: Any = "cpu"
        self._on_host = True
        self._device_from_drafts = False
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round

    def check_drafter(self, drafter: Any) -> None:
        # a block's positions are predicted in parallel, so a position's top-k does not depend on the
        # token chosen before it: a chain drafter's alternatives are conditioned on its own chain
        if not isinstance(drafter, BlockDrafter):
            raise ValueError(
                f"policy=block-tree needs a block drafter that reports alternatives (dflash); "
                f"drafter {getattr(drafter, 'name', type(drafter).__name__)!r} is not one"
            )

    def draft_tree(self, drafter: BlockDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        if drafter is not self._drafter:  # its device, read once per drafter (``device_of`` without its check)
            runtime = getattr(drafter, "runtime", None)
            self._drafter, self._device = drafter, "cpu" if runtime is None else runtime.torch_device
            self._on_host = torch.device(self._device).type == "cpu"
            self._device_from_drafts = runtime is None  # no runtime: its drafts' device, read each round
        depth = min(self.depth, room)
        if depth < 1:
            return Draft.empty(self._device), "room"
        chain = drafter.draft(depth)
        n = chain.length
        if n == 0:
            return chain, "no_proposal"
        if self._device_from_drafts:
            self._device = chain.token_ids.device
            self._on_host = self._device.type == "cpu"
        ids, probs = drafter.alternatives(self.top_k)  # (n, top_k)
        total = min(self.total_tokens, node_room)
        logp_t = probs.clamp(min=1e-30).log()  # float32 logs (the search widens them)
        if not self._on_host:  # the search reads the host: the logs moved, the tree moved back
            ids, logp_t = ids.cpu(), logp_t.cpu()
        ids_np, logp = ids.numpy(), logp_t.numpy()
        if ids_np.shape[0] != n:  # (a block drafter's alternatives are the chain's n rows: no slicing)
            ids_np, logp = ids_np[:n], logp[:n]
        ints, confidences = np.empty((2, total), dtype=np.int64), np.empty(total, dtype=np.float32)
        m = best_first_tree_into(ids_np, logp, total, ints, confidences)
        token_ids, parent_ids = torch.from_numpy(ints[0, :m]), torch.from_numpy(ints[1, :m])
        confs = torch.from_numpy(confidences[:m])
        if not self._on_host:
            token_ids, confs, parent_ids = (
                token_ids.to(self._device),
                confs.to(self._device),
                parent_ids.to(self._device),
            )
        draft = Draft(token_ids=token_ids, confidences=confs, forward_passes=chain.forward_passes, parents=parent_ids)
        return draft, "room" if depth < self.depth else "policy_bound"

    def __repr__(self) -> str:
        return f"BlockTreePolicy(depth={self.depth}, top_k={self.top_k}, total_tokens={self.total_tokens})"


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``BlockTreePolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class("policy", NAME, BlockTreePolicy, "a one-pass draft tree for block drafters (DFlash)")
    ]
