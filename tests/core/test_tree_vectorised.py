"""The vectorised tree helpers (``specpolicy.core.tree``: ancestors and depths by level, cached by shape;
the greedy path from the ancestor mask) against the per-node implementations they replaced, kept here
as the reference, on random trees: outputs identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpolicy.core import tree


# --- the reference: the per-node implementations before vectorisation (verbatim but names) ---------
def ref_ancestors(plist: list[int]) -> np.ndarray:
    k = len(plist)
    mask = np.zeros((k + 1, k + 1), dtype=bool)
    mask[:, 0] = True
    for row, parent in enumerate(plist, start=1):
        if parent >= 0:
            mask[row] = mask[parent + 1]
        mask[row, row] = True
    return mask


def ref_depths(plist: list[int]) -> np.ndarray:
    depth: list[int] = []
    for parent in plist:
        depth.append(1 + (depth[parent] if parent >= 0 else 0))
    return np.asarray(depth, dtype=np.int64)


def ref_layout(plist: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    ancestors = ref_ancestors(plist)
    k = len(plist)
    mask = np.ones((k + 1, start + k + 1), dtype=bool)
    mask[:, start:] = ancestors
    positions = start - 1 + ancestors.sum(axis=1)
    return torch.from_numpy(positions), torch.from_numpy(mask)


def ref_greedy_path(parents: torch.Tensor, token_ids: torch.Tensor, target_ids: torch.Tensor) -> tuple[int, ...]:
    k = int(parents.shape[0])
    if k == 0:
        return ()
    edge_ok = (token_ids == target_ids[parents + 1]).tolist()
    plist = parents.tolist()
    ok: list[bool] = []
    best, best_depth = -1, 0
    depth: list[int] = []
    for i, parent in enumerate(plist):
        ok.append(edge_ok[i] and (parent < 0 or ok[parent]))
        depth.append(1 + (depth[parent] if parent >= 0 else 0))
        if ok[i] and depth[i] > best_depth:
            best, best_depth = i, depth[i]
    return tree.path_to(best, plist)


# --- random trees ------------------------------------------------------------------------------------
def random_tree(rng: np.random.Generator, k: int, shape: str) -> list[int]:
    """``k`` nodes in topological order: any earlier parent, a chain, or wide (parents among the first few)."""
    if shape == "chain":
        return list(range(-1, k - 1))
    if shape == "wide":
        return [int(rng.integers(-1, min(i, 3))) for i in range(k)]
    return [int(rng.integers(-1, i)) for i in range(k)]


CASES = [(seed, k, shape) for seed in range(12) for k in (0, 1, 2, 5, 27, 60) for shape in ("any", "chain", "wide")]


@pytest.mark.parametrize("seed,k,shape", CASES)
def test_layout_depths_and_ancestors_equal_the_per_node_reference(seed, k, shape):
    rng = np.random.default_rng(seed)
    plist = random_tree(rng, k, shape)
    start = int(rng.integers(0, 40))
    for _ in range(2):  # the second call reads the shape cache
        positions, mask = tree.verification_layout(plist, start, "cpu")
        ref_positions, ref_mask = ref_layout(plist, start)
        assert positions.dtype == ref_positions.dtype == torch.int64 and mask.dtype == torch.bool
        assert torch.equal(positions, ref_positions) and torch.equal(mask, ref_mask)
        assert np.array_equal(tree.ancestor_mask(plist).numpy(), ref_ancestors(plist))
        assert tree.depths(torch.tensor(plist, dtype=torch.long)).tolist() == ref_depths(plist).tolist()
    mask[:, -1] = False  # a caller's change never reaches the cache
    assert torch.equal(tree.verification_layout(plist, start, "cpu")[1], ref_mask)


@pytest.mark.parametrize("seed,k,shape", CASES)
def test_greedy_path_equals_the_per_node_reference(seed, k, shape):
    rng = np.random.default_rng(100 + seed)
    plist = random_tree(rng, k, shape)
    parents = torch.tensor(plist, dtype=torch.long).reshape(k)
    for vocab in (2, 3, 50):  # small vocabularies: long agreeing paths and ties between equally deep ones
        tokens = torch.from_numpy(rng.integers(0, vocab, size=k))
        target = torch.from_numpy(rng.integers(0, vocab, size=k + 1))
        expected = ref_greedy_path(parents, tokens, target)
        assert tree.greedy_path(parents, tokens, target) == expected
        assert tree.greedy_path(parents, tokens, target, plist) == expected
        if k:  # a target that agrees with the node last written under each parent: long paths, ties
            agree = target.clone()
            agree[parents + 1] = tokens
            assert tree.greedy_path(parents, tokens, agree, plist) == ref_greedy_path(parents, tokens, agree)
            same = torch.zeros(k, dtype=torch.long)  # every node agrees: the first of the deepest
            path = tree.greedy_path(parents, same, torch.zeros(k + 1, dtype=torch.long), plist)
            assert path == ref_greedy_path(parents, same, torch.zeros(k + 1, dtype=torch.long))
            assert len(path) == int(ref_depths(plist).max())
