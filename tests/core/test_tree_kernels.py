"""The compiled kernels of a tree round (``specpolicy.core.compiled``: EAGLE-2's level step and
reranking, a growing tree's rows, the verification layout) and the numpy buffers around them
(``tree.NodeRows``, ``keep_path``'s host path) against the numpy / torch forms they replaced, on
random and tie-heavy inputs (NaN, infinities and signed zeros included). Outputs must be IDENTICAL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specpolicy.core import tree
from specpolicy.core.cache import keep_path
from specpolicy.core.compiled import eagle2_level, eagle2_rerank
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy


def _tie_heavy(rng: np.random.Generator, n: int, dtype=np.float32, nan: bool = True) -> np.ndarray:
    """Log-probability-like values from a handful of distinct ones, with -inf, signed zeros and NaN."""
    values = -rng.integers(0, int(rng.integers(1, 5)), n).astype(dtype) / 4
    u = rng.random(n)
    values[u < 0.1] = -np.inf
    values[(u >= 0.1) & (u < 0.15)] = -0.0
    if nan:
        values[u > 0.95] = np.nan
    return values


@pytest.mark.parametrize("seed", range(4))
def test_the_rerank_kernel_is_the_stable_sorts_first(seed):
    """``eagle2_rerank`` against the numpy reranking it replaced (kept here verbatim)."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        scores = _tie_heavy(rng, n, np.float32 if seed % 2 else np.float64)
        tokens = rng.integers(0, 1000, n)
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int64)
        total = int(rng.integers(1, n + 3))
        # the replaced form
        keep = np.sort(np.argsort(-scores, kind="stable")[:total])
        index = np.full(n + 1, -1, dtype=np.int64)
        index[keep + 1] = np.arange(keep.shape[0])
        kept = min(total, n)
        out_tokens, out_parents, out_scores = (
            np.empty(kept, np.int64),
            np.empty(kept, np.int64),
            np.empty(kept, scores.dtype),
        )
        assert eagle2_rerank(tokens, scores, parents, n, total, out_tokens, out_scores, out_parents) == kept
        assert np.array_equal(out_tokens, tokens[keep]) and np.array_equal(out_parents, index[parents[keep] + 1])
        assert np.array_equal(out_scores, scores[keep], equal_nan=True)
        assert np.array_equal(np.signbit(out_scores), np.signbit(scores[keep]))


@pytest.mark.parametrize("seed", range(4))
def test_the_level_kernel_is_the_numpy_level(seed):
    """``eagle2_level``: the children appended with cumulative scores and the next level's best, as
    the numpy steps it replaced computed them (stable descending argsort, float sums)."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        end = int(rng.integers(1, 40))
        m, width, select = int(rng.integers(1, 8)), int(rng.integers(1, 8)), int(rng.integers(0, 12))
        size = end + m * width
        scores = np.zeros(size, np.float32)
        scores[:end] = _tie_heavy(rng, end)
        tokens, parents, parent_nodes = (np.full(size, -7, np.int64) for _ in range(3))
        best = rng.choice(end, size=max(m, select, 1), replace=True).astype(np.int64)
        if rng.random() < 0.2:
            best[:m] = -1  # the root's children
        expanded = best[:m].copy()
        child_ids = rng.integers(0, 500, (m, width))
        child_logp = _tie_heavy(rng, m * width).reshape(m, width)
        nodes = rng.integers(1, 99, m)
        next_tokens, next_nodes = np.empty(max(select, 1), np.int64), np.empty(max(select, 1), np.int64)
        new_end, chosen = eagle2_level(
            tokens,
            scores,
            parents,
            parent_nodes,
            end,
            child_ids,
            child_logp,
            nodes,
            best,
            select,
            next_tokens,
            next_nodes,
        )
        # the replaced numpy steps
        level_scores = np.where(expanded[:, None] < 0, child_logp, scores[expanded][:, None] + child_logp).reshape(-1)
        assert new_end == size
        assert np.array_equal(scores[end:], level_scores, equal_nan=True)
        assert np.array_equal(tokens[end:], child_ids.reshape(-1))
        assert np.array_equal(parents[end:], np.repeat(expanded, width))
        assert np.array_equal(parent_nodes[end:], np.repeat(nodes, width))
        want = np.argsort(-level_scores, kind="stable")[:select] + end
        assert chosen == want.shape[0] and np.array_equal(best[:chosen], want)
        assert np.array_equal(next_tokens[:chosen], tokens[want]) and np.array_equal(
            next_nodes[:chosen], parent_nodes[want]
        )


class _Drafter:
    """Children drawn per expanded node (seeded), tie-heavy with -inf and NaN log-probabilities."""

    def __init__(self, seed: int, dtype=np.float32):
        self.rng, self.dtype, self.tree_passes, self.size = np.random.default_rng(seed), dtype, 0, 0

    def _children(self, n: int, k: int):
        return torch.from_numpy(self.rng.integers(0, 300, (n, k))), torch.from_numpy(
            _tie_heavy(self.rng, n * k, self.dtype).reshape(n, k)
        )

    def tree_root(self, top_k):
        self.tree_passes = 1
        ids, logp = self._children(1, top_k)
        return ids[0], logp[0]

    def tree_expand(self, tokens, parents, top_k):
        self.tree_passes += 1
        m = int(tokens.shape[0])
        nodes = torch.arange(self.size + 1, self.size + 1 + m)
        self.size += m
        return nodes, *self._children(m, top_k)


def _replaced_grow_on_host(policy, drafter, ids, logp, depth):
    """The numpy expansion the compiled one replaced (verbatim), then the numpy reranking."""
    level_tokens, level_scores = ids.numpy(), logp.numpy()
    level_parent_nodes = np.zeros(level_tokens.shape[0], dtype=np.int64)
    all_tokens, all_scores = [level_tokens], [level_scores]
    all_parents = [np.full(level_tokens.shape[0], -1, dtype=np.int64)]
    offset = 0
    for _ in range(depth - 1):
        n = int(level_tokens.shape[0])
        best = np.argsort(-level_scores, kind="stable")[: min(policy.top_k, n)]
        nodes, child_ids, child_logp = drafter.tree_expand(
            torch.from_numpy(level_tokens[best]), torch.from_numpy(level_parent_nodes[best]), policy.top_k
        )
        width = int(child_ids.shape[1])
        level_tokens = child_ids.numpy().reshape(-1)
        level_scores = (level_scores[best][:, None] + child_logp.numpy()).reshape(-1)
        level_parent_nodes = np.repeat(nodes.numpy(), width)
        all_tokens.append(level_tokens)
        all_scores.append(level_scores)
        all_parents.append(np.repeat(best + offset, width))
        offset += n
    tokens, scores, parents = np.concatenate(all_tokens), np.concatenate(all_scores), np.concatenate(all_parents)
    return Eagle2TreePolicy._rerank(torch.from_numpy(tokens), scores, parents, policy.total_tokens, drafter.tree_passes)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shape", [(4, 3, 10), (7, 10, 60), (5, 4, 200), (1, 5, 3), (3, 1, 3)])
def test_the_compiled_expansion_is_the_numpy_expansion(seed, shape):
    """The policy's compiled expansion against the numpy one it replaced: the same nodes expanded,
    the same draft (tokens, parents, confidences bit for bit), on NaN- and tie-heavy scores."""
    depth, top_k, total = shape
    policy = Eagle2TreePolicy(depth, top_k, total)
    drafts, calls = [], []
    for grow in ("compiled", "replaced"):
        drafter = _Drafter(seed, np.float32 if seed % 2 else np.float64)
        expand, seen = drafter.tree_expand, []
        drafter.tree_expand = lambda t, p, k, expand=expand, seen=seen: (
            seen.append((t.tolist(), p.tolist())) or expand(t, p, k)
        )
        ids, logp = drafter.tree_root(top_k)
        if grow == "compiled":
            drafts.append(policy._grow_on_host(drafter, ids, logp, depth, total))
        else:
            drafts.append(_replaced_grow_on_host(policy, drafter, ids, logp, depth))
        calls.append(seen)
    new, old = drafts
    assert calls[0] == calls[1]
    assert torch.equal(new.token_ids, old.token_ids) and torch.equal(new.parents, old.parents)
    assert new.confidences.dtype == old.confidences.dtype and torch.equal(
        new.confidences.isnan(), old.confidences.isnan()
    )
    assert torch.equal(new.confidences.nan_to_num(-1.0), old.confidences.nan_to_num(-1.0))
    assert new.forward_passes == old.forward_passes == depth


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])  # numpy buffer; tensor ops
def test_node_rows_gather_as_index_select_over_the_joined_rows(dtype):
    g = torch.Generator().manual_seed(1)
    first = torch.randn(1, 6, generator=g).to(dtype)
    rows, joined = tree.NodeRows(first, capacity=2), first
    for m in (3, 1, 5, 4):  # past the first capacity
        nodes = torch.randint(0, joined.shape[0], (m,), generator=g)
        assert torch.equal(rows.take(nodes), joined.index_select(0, nodes))
        new = torch.randn(m, 6, generator=g).to(dtype)
        rows.append(new)
        joined = torch.cat([joined, new])
        assert rows.size == joined.shape[0]
    assert torch.equal(rows.take(torch.arange(joined.shape[0])), joined)


def test_keep_path_on_views_moves_and_crops_as_on_tensors():
    """The host path over non-contiguous layers (a prefill's transposed values) and a mixed cache
    (one bfloat16 layer sends every layer through the tensor path): the same entries kept."""
    g = torch.Generator().manual_seed(2)
    start, path = 4, [0, 2, 5]
    for dtypes in ((torch.float32, torch.float32), (torch.float32, torch.bfloat16)):
        cache, before = DynamicCache(), []
        for layer, dtype in enumerate(dtypes):
            keys = torch.randn(1, start + 7, 2, 3, generator=g).to(dtype).transpose(1, 2)  # (1, 2, n, 3), strided
            values = torch.randn(1, 2, start + 7, 3, generator=g).to(dtype)
            before.append((keys.clone(), values.clone()))
            cache.update(keys, values, layer)
            cache.layers[layer].keys = keys  # as strided as a view can be (update stores a joined copy)
        keep_path(cache, start, path)
        expected = [*range(start), *(start + r for r in path)]
        assert cache.get_seq_length() == start + len(path)
        for layer, (keys, values) in zip(cache.layers, before):
            assert torch.equal(layer.keys, keys[:, :, expected]) and torch.equal(layer.values, values[:, :, expected])


@pytest.mark.parametrize("start", [0, 3])
def test_the_layout_with_heads_is_the_layout(start):
    parents = np.array([-1, 0, 0, 1, -1, 4], dtype=np.int64)
    positions, mask = tree.verification_layout(parents, start, "cpu")
    positions4, mask4 = tree.verification_layout(parents.tolist(), start, torch.device("cpu"), heads=True)
    assert positions4.shape == (1, *positions.shape) and torch.equal(positions4[0], positions)
    assert mask4.shape == (1, 1, *mask.shape) and torch.equal(mask4[0, 0], mask)
    with pytest.raises(ValueError, match="node 2 has parent 2"):
        tree.verification_layout(np.array([-1, 0, 2], dtype=np.int64), start, "cpu")
