"""The block tree's compiled best-first search (``policies/block_tree.py``, ``best_first_tree``;
issue 48 item 5) against the Python ``heapq`` loop it replaced, kept here verbatim: the same
nodes, parents and scores, bit for bit, ties included."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import torch

from specpolicy.policies.block_tree import best_first_tree


def reference_best_first(ids: torch.Tensor, probs: torch.Tensor, n: int, nodes: int):
    """The replaced loop (verbatim but for its inputs and outputs)."""
    ids_l, logp = ids[:n].tolist(), probs[:n].clamp(min=1e-30).log().tolist()
    heap = [(-logp[0][r], 0, r, -1) for r in range(len(ids_l[0]))]  # (-score, position, rank, parent node)
    heapq.heapify(heap)
    tokens, parents, scores = [], [], []
    while heap and len(tokens) < nodes:
        neg, pos, r, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids_l[pos][r])
        parents.append(parent)
        scores.append(-neg)
        if pos + 1 < n:
            for c in range(len(ids_l[pos + 1])):
                heapq.heappush(heap, (neg - logp[pos + 1][c], pos + 1, c, node))
    return tokens, parents, scores


@pytest.mark.parametrize("seed", range(20))
def test_the_compiled_search_is_the_heapq_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    n, k = 1 + seed % 15, 1 + seed % 4
    probs = (torch.randn(n, k, generator=generator) * (0.3 + seed % 3)).softmax(-1).sort(descending=True).values
    if seed % 2:
        probs[:, -1] = probs[:, 0]  # exact ties between ranks
        probs[n // 2] = 0.0  # clamped to 1e-30
    ids = torch.randint(0, 1000, (n, k), generator=generator)
    for nodes in (1, 5, 24, 200):
        tokens, parents, scores = best_first_tree(
            ids.numpy().astype(np.int64), probs.clamp(min=1e-30).log().double().numpy(), nodes
        )
        want = reference_best_first(ids, probs, n, nodes)
        assert (tokens.tolist(), parents.tolist(), scores.tolist()) == want


@pytest.mark.parametrize("seed", range(12))
def test_the_search_into_arrays_is_the_heapq_loop(seed):
    """``best_first_tree_into`` (the policy's call: float32 logs widened inside, the tree written into
    the caller's arrays, each node's confidence the float32 of Python's ``math.exp`` of its score)
    against the replaced loop and the confidences the policy computed from its scores."""
    import math

    from specpolicy.policies.block_tree import best_first_tree_into

    generator = torch.Generator().manual_seed(50 + seed)
    n, k = 1 + seed % 15, 1 + seed % 4
    probs = (torch.randn(n, k, generator=generator) * (0.3 + seed % 3)).softmax(-1).sort(descending=True).values
    if seed % 2:
        probs[:, -1] = probs[:, 0]  # exact ties between ranks
        probs[n // 2] = 0.0  # clamped to 1e-30
    ids = torch.randint(0, 1000, (n, k), generator=generator)
    for nodes in (1, 5, 24, 200):
        ints, confidences = np.empty((2, nodes), np.int64), np.empty(nodes, np.float32)
        m = best_first_tree_into(ids.numpy(), probs.clamp(min=1e-30).log().numpy(), nodes, ints, confidences)
        tokens, parents, scores = reference_best_first(ids, probs, n, nodes)
        assert (ints[0, :m].tolist(), ints[1, :m].tolist()) == (tokens, parents)
        assert np.array_equal(confidences[:m], np.array([math.exp(s) for s in scores], dtype=np.float32))
