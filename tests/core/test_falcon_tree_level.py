"""Falcon's static tree between two passes in one compiled call (``compiled_falcon.falcon_tree_level``
on ``FalconLevels``) against the steps it fuses -- the policy's read (``falcon_tree_read``), the
numpy stores and gathers of the blocks' rows and the pass's layout (``compiled.falcon_block_layout``)
-- on random trees, random and tie-heavy top tokens (NaN, infinities, signed zeros), rounds after
rounds on the same buffers. Everything must be IDENTICAL."""

from __future__ import annotations

import numpy as np
import pytest

from specpolicy.core.compiled import falcon_block_layout
from specpolicy.core.compiled_falcon import FalconLevels, falcon_tree_level, falcon_tree_read
from specpolicy.policies.falcon_tree import CPU_TREE, PAPER_TREE, StaticTree


def _random_tree(rng: np.random.Generator, nodes: int, top: int) -> list[tuple[int, ...]]:
    paths: set[tuple[int, ...]] = set()
    while len(paths) < nodes:
        parent = () if not paths or rng.random() < 0.2 else sorted(paths)[int(rng.integers(len(paths)))]
        paths.add((*parent, int(rng.integers(top))))
    return sorted(paths, key=lambda p: (len(p), p))


def _logp(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    values = -rng.integers(0, 4, shape).astype(np.float32) / 4
    u = rng.random(shape)
    values[u < 0.08] = -np.inf
    values[(u >= 0.08) & (u < 0.14)] = -0.0
    values[u > 0.97] = np.nan
    return values


def _round(t: StaticTree, levels: FalconLevels | None, rng, committed: int, h: int, layers: int, dtype):
    """One round over ``t``'s passes with random pass results: the fused calls when ``levels`` is
    given, else the replaced steps on plain arrays. Returns every pass's inputs and the draft."""
    nodes, node_path, blocks, bounds, numbers, next_tokens, next_parents, _, _ = t.host_plan()
    k, n, top = t.k, nodes.shape[1], t.top_k
    results = [
        (
            rng.integers(0, 900, (m, k, top)),
            _logp(rng, (m, k, top)),
            rng.standard_normal((m, k, h)).astype(dtype),
            rng.standard_normal((layers, m, h)).astype(dtype),
            rng.standard_normal((layers, m, h)).astype(dtype),
        )
        for m in bounds[:, 3]
    ]
    tokens, node_logp, scores = np.empty(n, np.int64), np.empty(n, np.float32), np.empty(n, np.float32)
    cap = blocks.shape[0]
    if levels is None:
        ancestors, depths = np.zeros((cap, cap), bool), np.zeros(cap, np.int64)
        outs, hs, cs = (
            np.zeros((cap, k, h), dtype),
            np.zeros((layers, cap, h), dtype),
            np.zeros((layers, cap, h), dtype),
        )
    laid, base = [], 0
    for b in range(t.passes):
        ids, logp, out, hh, cc = results[b]
        m_last = ids.shape[0]
        if levels is None:  # the replaced steps
            first = base - m_last + 1
            falcon_tree_read(
                b, ids, logp, np.arange(first, first + m_last), nodes, node_path, blocks, bounds, numbers, tokens,
                node_logp, next_tokens, next_parents, scores,
            )  # fmt: skip
            if b + 1 == t.passes:
                break
            start, m = bounds[b + 1, 2], bounds[b + 1, 3]
            outs[first : first + m_last], hs[:, first : first + m_last], cs[:, first : first + m_last] = out, hh, cc
            parents = next_parents[start : start + m].copy()
            positions, mask = falcon_block_layout(ancestors, depths, parents, base, committed, k)
            laid.append(
                (outs[parents], hs[:, parents], cs[:, parents], positions, mask, next_tokens[start : start + m].copy())
            )
        else:
            m_next = bounds[b + 1, 3] if b + 1 < t.passes else 1
            inputs = levels.pass_of(int(m_next))[0]
            m = falcon_tree_level(
                b, ids, logp, nodes, node_path, blocks, bounds, numbers, tokens, node_logp, next_tokens,
                next_parents, scores, *levels.rows, *inputs, committed, base, out, hh, cc,
            )  # fmt: skip
            if not m:
                break
            start = bounds[b + 1, 2]
            mask = levels.mask[: m * k, : committed + (base + m) * k]
            laid.append((*(a.copy() for a in inputs[:4]), mask.copy(), next_tokens[start : start + m].copy()))
        base += m
    return laid, tokens.copy(), scores.copy()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("tree", ["cpu", "paper", "random"])
def test_the_fused_pass_is_the_replaced_steps(seed, k, tree):
    rng = np.random.default_rng(seed)
    choices = {"cpu": CPU_TREE, "paper": PAPER_TREE}.get(tree) or _random_tree(rng, int(rng.integers(2, 40)), 4)
    t = StaticTree(choices, k)
    dtype = np.float32 if seed % 2 else np.float64
    h, layers = 3, 2
    levels = FalconLevels(k, h, layers, dtype, t.top_k, len(t.host_plan()[2]), 700)
    for committed in (5, 1, 60, 9):  # rounds on the same buffers: stale rows and columns rewritten
        state = rng.bit_generator.state
        old = _round(t, None, rng, committed, h, layers, dtype)
        rng.bit_generator.state = state  # the same pass results for both
        new = _round(t, levels, rng, committed, h, layers, dtype)
        assert len(old[0]) == len(new[0]) == t.passes - 1
        for old_pass, new_pass in zip(old[0], new[0]):
            for a, b in zip(old_pass, new_pass):
                assert a.dtype == b.dtype and np.array_equal(a, b)
        assert np.array_equal(old[1], new[1])
        assert np.array_equal(old[2], new[2], equal_nan=True) and np.array_equal(np.signbit(old[2]), np.signbit(new[2]))
