"""``eagle2-tree`` policy: EAGLE-2's dynamic draft tree (Li et al. 2024, arXiv 2406.16858, §4), the
tree EAGLE-3 is served with (FailFast App. D.3: SGLang, 50-60 tokens per tree, depth 8).

Expansion: the root predicts its ``top_k`` children; for each depth up to ``depth``, the ``top_k``
nodes of the newest level with the highest *cumulative* log-probability (the product of the draft
probabilities along the path: the drafter's estimate of the chance the whole path is accepted) are
expanded in ONE drafter pass each, every one proposing its ``top_k`` children. Reranking: of all
nodes proposed, the ``total_tokens`` with the highest cumulative log-probability form the tree (a
node scores no higher than its parent, so the kept nodes are a tree). The target verifies it in one
pass (``specpolicy.tree``). Drafter passes per round: ``depth`` (the root's and one per expanded
level). Works with drafters that offer ``tree_root`` / ``tree_expand`` (``eagle3``, ``ar``).
"""

from __future__ import annotations

from typing import Any

import torch

from specpolicy.hookspecs import hookimpl
from specpolicy.policy import TreePolicy
from specpolicy.types import Draft
from specpolicy.validation import check_init

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

    def check_drafter(self, drafter: Any) -> None:
        if not (hasattr(drafter, "tree_root") and hasattr(drafter, "tree_expand")):
            raise ValueError(f"policy=eagle2-tree needs a drafter that expands trees (eagle3, ar); drafter "
                             f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not")

    def draft_tree(self, drafter: Any, room: int, node_room: int) -> tuple[Draft, str]:
        device = getattr(getattr(drafter, "runtime", None), "torch_device", "cpu")
        depth = min(self.depth, room)
        if depth < 1:
            return Draft.empty(device), "room"
        ids, logp = drafter.tree_root(self.top_k)
        if ids.numel() == 0:
            return Draft.empty(device), "no_proposal"
        # candidates in creation order (parents first): token, cumulative log-prob, parent candidate
        # (-1 = the root); node_of[c + 1] is candidate c's drafter node once expanded (node_of[0]: the root, 0)
        first = int(ids.shape[0])
        capacity = first + (depth - 1) * self.top_k * self.top_k
        tokens = ids.new_zeros(capacity)
        scores = logp.new_zeros(capacity)
        parents = ids.new_full((capacity,), -1)
        node_of = ids.new_zeros(capacity + 1)
        tokens[:first], scores[:first] = ids, logp
        level, count = slice(0, first), first
        for _ in range(depth - 1):
            m = min(self.top_k, level.stop - level.start)
            # the level's best m candidates, best first (ties: the earlier, as a stable sort gives)
            chosen = torch.sort(scores[level], descending=True, stable=True).indices[:m] + level.start
            nodes, child_ids, child_logp = drafter.tree_expand(tokens[chosen], node_of[parents[chosen] + 1], self.top_k)
            node_of[chosen + 1] = nodes
            width = int(child_ids.shape[1])
            level = slice(count, count + m * width)
            tokens[level] = child_ids.flatten()
            scores[level] = (scores[chosen][:, None] + child_logp).flatten()
            parents[level] = chosen.repeat_interleave(width)
            count = level.stop
        # rerank: the best total_tokens candidates; ties go to the earlier one (a parent before its
        # child, which scores no higher), so the kept candidates form a tree; kept in creation order
        order = torch.sort(scores[:count], descending=True, stable=True).indices
        keep = order[: min(self.total_tokens, node_room)].sort().values
        index = torch.full((count + 1,), -1, dtype=torch.long, device=ids.device)  # index[c + 1]: c's node in the draft
        index[keep + 1] = torch.arange(keep.shape[0], device=ids.device)
        draft = Draft(token_ids=tokens[keep], confidences=scores[keep].exp(), forward_passes=drafter.tree_passes,
                      parents=index[parents[keep] + 1])
        return draft, "room" if depth < self.depth else "policy_bound"

    def __repr__(self) -> str:
        return f"Eagle2TreePolicy(depth={self.depth}, top_k={self.top_k}, total_tokens={self.total_tokens})"


@hookimpl
def specpolicy_validate_config(group: str, name: str, config: dict[str, Any]):
    """``policy=eagle2-tree``: its keys and ranges, checked by building it (cheap, no model)."""
    if group != "policy" or name != NAME:
        return None
    check_init("policy", Eagle2TreePolicy, config)
    return True


@hookimpl
def specpolicy_make_policy(name: str, config: dict[str, Any]):
    """Factory for ``policy=eagle2-tree``. Config keys: ``depth``, ``top_k``, ``total_tokens``."""
    if name != NAME:
        return None
    return Eagle2TreePolicy(**config)
