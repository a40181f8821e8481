"""Falcon's static tree, vectorised (one gather per drafter pass, the cumulative log-probs summed
root first over a precomputed path index, truncations and device indices cached) against the
per-depth implementation it replaced, kept here as the reference: identical drafts on random
drafter outputs, every tree and room."""

from __future__ import annotations

import pytest
import torch

from specpolicy.core.types import Draft
from specpolicy.policies.falcon_tree import CPU_TREE, PAPER_TREE, FalconTreePolicy, StaticTree


class RandomBlockDrafter:
    """Random top tokens and log-probs per block (seeded), float32 or float64; records its calls."""

    name = "random"

    def __init__(self, seed: int, k: int, dtype: torch.dtype) -> None:
        self.gen, self.k, self.dtype, self.blocks, self.calls = torch.Generator().manual_seed(seed), k, dtype, 0, []

    def _rows(self, m: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 1000, (m, self.k, top_k), generator=self.gen)
        logp = torch.log_softmax(torch.randn(m, self.k, top_k, generator=self.gen, dtype=self.dtype) * 3, dim=-1)
        return ids, logp

    def tree_block_root(self, top_k):
        ids, logp = self._rows(1, top_k)
        return ids[0], logp[0]

    def tree_block_expand(self, tokens, parents, top_k):
        self.calls.append((tokens.tolist(), parents.tolist()))
        m = tokens.shape[0]
        ids, logp = self._rows(m, top_k)
        numbers = torch.arange(self.blocks + 1, self.blocks + 1 + m)
        self.blocks += m
        return numbers, ids, logp

    @property
    def tree_passes(self):
        return 1 + len(self.calls)


def reference_draft_tree(choices, drafter, room: int, node_room: int) -> tuple[Draft, str]:
    """``FalconTreePolicy.draft_tree`` before vectorisation (per depth: a gather and a sum per level)."""
    full = StaticTree(choices, drafter.k)
    kept = [p for p in full.paths if len(p) <= min(room, full.depth)][: max(node_room, 0)]
    if not kept:
        return Draft.empty("cpu"), "room"
    t = StaticTree(kept, full.k) if len(kept) < len(full.paths) else full
    ids, logp = drafter.tree_block_root(t.top_k)
    block_ids, block_logp = [ids[None]], [logp[None]]
    numbers = [torch.zeros(1, dtype=torch.long)]
    tokens = torch.empty(len(t.paths), dtype=torch.long)
    scores = torch.empty(len(t.paths), dtype=logp.dtype)
    for b in range(t.passes):
        if b > 0:
            parent = torch.cat(numbers)[t.block_parent[b]]
            new, bids, blogp = drafter.tree_block_expand(tokens[t.block_tokens[b]], parent, t.top_k)
            block_ids.append(bids)
            block_logp.append(blogp)
            numbers.append(new)
        all_ids, all_logp = torch.cat(block_ids), torch.cat(block_logp)
        for d in range(t.k * b + 1, min(t.k * (b + 1), t.depth) + 1):
            sl = slice(t.level_start[d - 1], t.level_start[d])
            at = (t.node_block[sl], t.node_offset[sl], t.node_rank[sl])
            tokens[sl] = all_ids[at]
            above = scores[t.node_parent[sl]] if d > 1 else 0.0
            scores[sl] = all_logp[at] + above
    draft = Draft(
        token_ids=tokens, confidences=scores.exp().float(), forward_passes=drafter.tree_passes, parents=t.node_parent
    )
    return draft, "room" if t.depth < full.depth else "policy_bound"


@pytest.mark.parametrize("name,choices", [("cpu", CPU_TREE), ("paper", PAPER_TREE)])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", ["host", "tensor"])  # a CPU drafter's numpy steps, an accelerator's tensor ops
def test_drafts_equal_the_per_depth_reference(name, choices, k, dtype, path, monkeypatch):
    if path == "tensor":
        monkeypatch.setattr(FalconTreePolicy, "_gather_on_host", FalconTreePolicy._gather)
    policy = FalconTreePolicy(tree=name)
    rooms = [(99, 999), (3, 999), (8, 10), (5, 4), (1, 1), (2, 0), (0, 5)]
    for seed, (room, node_room) in enumerate(rooms * 2):  # twice: the cached truncations and indices
        new_drafter, ref_drafter = RandomBlockDrafter(seed, k, dtype), RandomBlockDrafter(seed, k, dtype)
        draft, why = policy.draft_tree(new_drafter, room, node_room)
        expected, expected_why = reference_draft_tree(choices, ref_drafter, room, node_room)
        assert why == expected_why and new_drafter.calls == ref_drafter.calls
        assert torch.equal(draft.token_ids, expected.token_ids)
        assert draft.confidences.dtype == expected.confidences.dtype
        assert torch.equal(draft.confidences, expected.confidences)  # bit for bit
        assert (draft.parents is None) == (expected.parents is None)
        if draft.parents is not None:
            assert torch.equal(draft.parents, expected.parents) and draft.forward_passes == expected.forward_passes
