"""``eagle2-tree`` policy: EAGLE-2's dynamic draft tree (Li et al. 2024, arXiv 2406.16858, §4), the
tree EAGLE-3 is served with (FailFast App. D.3: SGLang, 50-60 tokens per tree, depth 8).

Expansion: the root predicts its ``top_k`` children; for each depth up to ``depth``, the ``top_k``
nodes of the newest level with the highest *cumulative* log-probability (the product of the draft
probabilities along the path: the drafter's estimate of the chance the whole path is accepted) are
expanded in ONE drafter pass each, every one proposing its ``top_k`` children. Reranking: of all
nodes proposed, the ``total_tokens`` with the highest cumulative log-probability form the tree (a
node scores no higher than its parent, so the kept nodes are a tree). The target verifies it in one
pass (``specpolicy.core.tree``). Drafter passes per round: ``depth`` (the root's and one per expanded
level). Works with drafters that offer ``tree_root`` / ``tree_expand`` (``eagle3``, ``ar``); with
``eagle3`` on the CPU, the host work between two passes -- this policy's and the drafter's -- is ONE
compiled call (``specpolicy.core.compiled_eagle``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specpolicy.core import compiled, compiled_eagle
from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import TreeDrafter, device_of
from specpolicy.core.runtime import no_grad
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "eagle2-tree"


class Eagle2TreePolicy(TreePolicy):
    """EAGLE-2's dynamic tree.

    Args:
        depth: levels expanded (the tree's depth), an integer >= 1 (EAGLE-2/3's default 7; FailFast's
            SGLang runs 8).
        top_k: children proposed per expanded node and nodes expanded per level, >= 1 (default 10).
        total_tokens: nodes kept after reranking (tokens verified per round), >= 1 (default 60).
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(self, depth: int = 7, top_k: int = 10, total_tokens: int = 60) -> None:
        for key, value in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"policy.{key} must be an integer >= 1, got {value!r}")
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round
        self._grow_on_host(_WarmUp(), torch.zeros(2, dtype=torch.long), torch.zeros(2), 2, 2)  # this policy's

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, TreeDrafter):
            raise ValueError(
                f"policy=eagle2-tree needs a drafter that expands trees (eagle3, ar); drafter "
                f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def draft_tree(self, drafter: TreeDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        depth = min(self.depth, room)
        if depth < 1:
            return Draft.empty(device_of(drafter)), "room"
        if getattr(drafter, "grows_trees_on_host", False):  # eagle3 on the CPU: one compiled call a level
            draft = self._grow_levels(drafter, depth, min(self.total_tokens, node_room))
            return (Draft.empty("cpu"), "no_proposal") if draft is None else (draft, _bound(depth, self.depth))
        ids, logp = drafter.tree_root(self.top_k)
        if ids.numel() == 0:
            return Draft.empty(device_of(drafter)), "no_proposal"
        total = min(self.total_tokens, node_room)
        on_host = ids.device.type == "cpu" and logp.dtype in (torch.float32, torch.float64)
        draft = (self._grow_on_host if on_host else self._on_device)(drafter, ids, logp, depth, total)
        return draft, _bound(depth, self.depth)

    def _on_device(self, drafter: TreeDrafter, ids: torch.Tensor, logp: torch.Tensor, depth: int, total: int) -> Draft:
        """The tree of ``total`` nodes at most: ``_grow`` (tensor ops on the drafter's device) then ``_rerank``."""
        return self._rerank(*self._grow(drafter, ids, logp, depth), total, drafter.tree_passes)

    @staticmethod
    def _rerank(
        tokens: torch.Tensor, host_scores: np.ndarray, host_parents: np.ndarray, total: int, passes: int
    ) -> Draft:
        """The reranking (module docstring) of ``_grow``'s candidates, on the host, where the verifier
        needs the tree's shape anyway (one sync): the best ``total``; ties go to the earlier one (a
        parent before its child, which scores no higher), so the kept candidates form a tree; kept
        in creation order. The draft's tokens stay on their device."""
        keep = np.sort(np.argsort(-host_scores, kind="stable")[:total])
        index = np.full(host_scores.shape[0] + 1, -1, dtype=np.int64)  # index[c + 1]: candidate c's node in the draft
        index[keep + 1] = np.arange(keep.shape[0])
        token_ids = tokens[torch.from_numpy(keep).to(tokens.device)]
        return Draft(
            token_ids=token_ids,
            confidences=torch.from_numpy(np.exp(host_scores[keep])).to(token_ids.device),
            forward_passes=passes,
            parents=torch.from_numpy(index[host_parents[keep] + 1]).to(token_ids.device),
        )

    def _grow(
        self, drafter: TreeDrafter, ids: torch.Tensor, logp: torch.Tensor, depth: int
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """The expansion (module docstring) in tensor ops on the drafter's device, no sync until the
        end. Returns every candidate, in creation order (parents first): tokens ``(n,) int64`` (on
        the device), cumulative log-probs ``(n,) float32`` and parent candidates ``(n,) int64`` (-1:
        the root), the last two on the host."""
        # of the newest level: tokens, cumulative log-probs and each one's parent's drafter node (0 =
        # the root); of all levels: the same tokens and scores, and each one's parent candidate
        level_tokens, level_scores = ids, logp
        level_parent_nodes = ids.new_zeros(ids.shape)
        all_tokens, all_scores, all_parents = [ids], [logp], [ids.new_full(ids.shape, -1)]
        offset = 0  # the newest level's first candidate's number
        for _ in range(depth - 1):
            n = int(level_tokens.shape[0])
            m = min(self.top_k, n)
            # the level's best m candidates, best first (ties: the earlier, as a stable sort gives)
            best = torch.sort(level_scores, descending=True, stable=True).indices[:m]
            nodes, child_ids, child_logp = drafter.tree_expand(level_tokens[best], level_parent_nodes[best], self.top_k)
            width = int(child_ids.shape[1])
            level_tokens = child_ids.reshape(-1)
            level_scores = (level_scores[best][:, None] + child_logp).reshape(-1)
            level_parent_nodes = nodes[:, None].expand(m, width).reshape(-1)
            all_tokens.append(level_tokens)
            all_scores.append(level_scores)
            all_parents.append((best + offset)[:, None].expand(m, width).reshape(-1))
            offset += n
        scores, parents = torch.cat(all_scores), torch.cat(all_parents)
        return torch.cat(all_tokens), scores.cpu().numpy(), parents.cpu().numpy()

    def _grow_on_host(
        self, drafter: TreeDrafter, ids: torch.Tensor, logp: torch.Tensor, depth: int, total: int
    ) -> Draft:
        """``_grow`` then ``_rerank`` for a drafter on the CPU, as compiled steps on numpy views of its
        tensors (no per-op dispatch): per level ONE call (``compiled.eagle2_level``: the level's
        children appended to the candidate buffers with their cumulative scores -- the same float
        sums -- then the next level's best as the stable descending sort picks them), the drafter
        handed tensors sharing fresh arrays (``eagle3`` on the CPU takes ``_grow_levels`` instead:
        one compiled call a level for both sides); then ONE call for the reranking
        (``compiled.eagle2_rerank``) and ``np.exp`` for the confidences. The same draft as the tensor
        steps (``tests/policies/test_eagle2_tree.py``)."""
        top_k = self.top_k
        ids_np, logp_np = ids.numpy().reshape(1, -1), logp.numpy().reshape(1, -1)
        size = ids_np.shape[1] + (depth - 1) * top_k * top_k  # every candidate, when each node proposes top_k
        tokens, parents, parent_nodes, scores = self._candidates(size, logp_np.dtype)
        best, nodes = np.full(top_k, -1, np.int64), np.zeros(1, np.int64)  # the root: candidate -1, drafter node 0
        picked = np.empty((depth, 2, top_k), np.int64)  # per level: the nodes to expand, their parents' nodes
        end = m = 0
        for level in range(depth):
            if level:
                nodes_t, child_ids, child_logp = drafter.tree_expand(
                    torch.from_numpy(picked[level - 1, 0, :m]), torch.from_numpy(picked[level - 1, 1, :m]), top_k
                )
                ids_np, logp_np, nodes = child_ids.numpy(), child_logp.numpy(), nodes_t.numpy()
                if end + ids_np.size > tokens.shape[0]:  # a drafter proposing more than top_k children
                    tokens, parents, parent_nodes, scores = self._candidates(2 * (end + ids_np.size), scores.dtype, end)
            end, m = compiled.eagle2_level(
                tokens,
                scores,
                parents,
                parent_nodes,
                end,
                ids_np,
                logp_np,
                nodes,
                best,
                top_k if level < depth - 1 else 0,  # the next level's nodes to expand (none after the last)
                picked[level, 0],
                picked[level, 1],
            )
        total = min(total, end)
        kept_tokens, kept_parents, kept_scores = (
            np.empty(total, np.int64),
            np.empty(total, np.int64),
            np.empty(total, scores.dtype),
        )
        compiled.eagle2_rerank(tokens, scores, parents, end, total, kept_tokens, kept_scores, kept_parents)
        return Draft(
            token_ids=torch.from_numpy(kept_tokens),
            confidences=torch.from_numpy(np.exp(kept_scores)),
            forward_passes=drafter.tree_passes,
            parents=torch.from_numpy(kept_parents),
        )

    @no_grad
    def _grow_levels(self, drafter: Any, depth: int, total: int) -> Draft | None:
        """``_grow_on_host`` for a drafter that lets the policy lay out its tree's levels
        (``grows_trees_on_host``: ``eagle3``'s ``tree_root_host`` / ``tree_pass_host``): between two
        passes ONE compiled call (``compiled_eagle.eagle2_host_level``: the pass's outputs stored, its
        children appended, the next level picked and laid out in the drafter's kept buffers, which
        its next pass reads as tensors made once), after the last ONE more (``eagle2_host_finish``:
        its children, then the reranking). The same draft as ``_grow_on_host`` (the same kernels'
        steps; ``tests/core/test_compiled_eagle.py``). None: nothing to draft from."""
        top_k = self.top_k
        root = drafter.tree_root_host(top_k, (depth - 1) * top_k)
        if root is None:
            return None
        out, ids, logp, arrays, committed = root
        width = ids.shape[1]
        candidates, scores, best = self._level_buffers(width + (depth - 1) * top_k * width, logp.dtype)
        best[0] = -1  # the root's children: under no candidate
        end = base = 0
        level: Any = compiled_eagle.eagle2_host_level  # a numba dispatcher, called with the buffers unpacked
        expand = drafter.tree_pass_host
        for passes in range(2, depth + 1):  # the last pass's outputs are not read: no one's parents
            end, m = level(candidates, scores, end, ids, logp, best, top_k, *arrays, committed, base, out)
            out, ids, logp = expand(base, m, top_k, passes < depth)
            base += m
        total = min(total, end + ids.size)
        kept_tokens, kept_parents, kept_scores = (
            np.empty(total, np.int64),
            np.empty(total, np.int64),
            np.empty(total, scores.dtype),
        )
        kept = compiled_eagle.eagle2_host_finish(
            candidates, scores, end, ids, logp, best, base, total, kept_tokens, kept_scores, kept_parents
        )
        if kept != total:  # every entry of the arrays is written only when the reranking kept ``total``
            raise RuntimeError(f"EAGLE-2's reranking kept {kept} of the tree's {total} nodes ({end} candidates)")
        return Draft(
            token_ids=torch.from_numpy(kept_tokens),
            confidences=torch.from_numpy(np.exp(kept_scores)),
            forward_passes=depth,
            parents=torch.from_numpy(kept_parents),
        ).counted(total)

    def _level_buffers(self, size: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_grow_levels``' candidates ``(3, size) int64`` (token, parent candidate, parent node), their
        scores ``(size,)`` in ``dtype`` and the expanded candidates ``(top_k,) int64``, kept from round to
        round (the draft gets its own arrays), made anew only when a round needs more room or another dtype."""
        held = self.__dict__.get("_fused_buffers")
        if held is None or held[1].shape[0] < size or held[1].dtype != dtype:
            held = self._fused_buffers = (
                np.empty((3, size), np.int64),
                np.empty(size, dtype),
                np.empty(self.top_k, np.int64),
            )
        return held

    def _candidates(self, size: int, dtype: np.dtype, keep: int = 0) -> tuple[np.ndarray, ...]:
        """The candidate buffers of ``_grow_on_host`` (tokens, parent candidates, parent drafter nodes
        ``int64``; scores in ``dtype``), room for ``size`` at least, reused from round to round (the
        draft gets its own arrays); the first ``keep`` entries carried over when they grow."""
        held = self.__dict__.get("_buffers")
        if held is None or held[0].shape[0] < size or held[3].dtype != dtype:
            grown = (
                np.empty(size, np.int64),
                np.empty(size, np.int64),
                np.empty(size, np.int64),
                np.empty(size, dtype),
            )
            if held is not None and keep:
                for new, old in zip(grown, held):
                    new[:keep] = old[:keep]
            self._buffers = held = grown
        return held

    def __repr__(self) -> str:
        return f"Eagle2TreePolicy(depth={self.depth}, top_k={self.top_k}, total_tokens={self.total_tokens})"


def _bound(depth: int, most: int) -> str:
    """Why the round's tree stopped growing: the room left (``depth`` cut below ``most``) or the policy's depth."""
    return "room" if depth < most else "policy_bound"


class _WarmUp:
    """A stand-in drafter (every node proposes token 0 at log-probability 0) that runs this policy's
    compiled steps once when it is built (``compiled.eagle2_level`` / ``eagle2_rerank`` compiled or
    loaded then, not in a timed round)."""

    tree_passes = 0

    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, top_k: int):
        m = int(tokens.shape[0])
        return torch.arange(1, m + 1), torch.zeros((m, top_k), dtype=torch.long), torch.zeros((m, top_k))


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``Eagle2TreePolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class("policy", NAME, Eagle2TreePolicy, "EAGLE-2's dynamic draft tree, as EAGLE-3 is served")
    ]
