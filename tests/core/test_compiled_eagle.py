"""EAGLE-2's tree levels laid out in one compiled call (``specpolicy.core.compiled_eagle``) against
the steps they fuse (``compiled.eagle2_level``, ``tree.HostTree``'s ``compiled_tree.host_tree_level``,
``compiled.eagle2_rerank``) on random and tie-heavy inputs (NaN, infinities, signed zeros), rounds
after rounds on the same buffers; and the ``eagle3`` drafter's fused rounds (``tree_root_host`` /
``tree_pass_host``) against its tensor rounds (``tree_root`` / ``tree_expand``) through the loop.
Everything must be IDENTICAL."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conditioned_reference import write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core import tree
from specpolicy.core.compiled import eagle2_level, eagle2_rerank
from specpolicy.core.compiled_eagle import TreeLevels, eagle2_host_finish, eagle2_host_level
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.drafters.eagle3 import Eagle3Drafter
from specpolicy.models.eagle3 import load_eagle3
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.verifiers.hf import HFVerifier


def _tie_heavy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 log-probability-like values from a few distinct ones, with -inf, -0.0 and NaN."""
    values = -rng.integers(0, int(rng.integers(1, 5)), shape).astype(np.float32) / 4
    u = rng.random(shape)
    values[u < 0.08] = -np.inf
    values[(u >= 0.08) & (u < 0.14)] = -0.0
    values[u > 0.96] = np.nan
    return values


def _levels_data(rng, depth, top_k, width, h, dtype):
    """Per pass (the root's, then one per level): outputs ``(top_k, h)``, children ids / log-probs ``(top_k, width)``."""
    return [
        (
            rng.standard_normal((top_k, h)).astype(dtype),
            rng.integers(0, 500, (top_k, width)),
            _tie_heavy(rng, (top_k, width)),
        )
        for _ in range(depth)
    ]


def _replaced_round(host, data, depth, top_k, total, committed):
    """The replaced steps (verbatim calls): ``eagle2_level``, then ``HostTree.add`` / ``outputs``; at
    the end ``eagle2_level`` without a selection and ``eagle2_rerank``."""
    out0, ids0, logp0 = data[0]
    width = ids0.shape[1]
    size = width + (depth - 1) * top_k * width
    tokens, parents, parent_nodes = (np.empty(size, np.int64) for _ in range(3))
    scores = np.empty(size, np.float32)
    best, nodes = np.full(top_k, -1, np.int64), np.zeros(1, np.int64)
    host.reset(committed, out0[:1])
    ids, logp, end, laid = ids0[:1], logp0[:1], 0, []
    for level in range(1, depth + 1):
        select = top_k if level < depth else 0
        picked_tokens, picked_nodes = np.empty(top_k, np.int64), np.empty(top_k, np.int64)
        end, m = eagle2_level(
            tokens, scores, parents, parent_nodes, end, ids, logp, nodes, best, select, picked_tokens, picked_nodes
        )
        if level == depth:
            break
        nodes, positions, mask, hidden = host.add(picked_nodes[:m])
        laid.append((picked_tokens[:m].copy(), positions.copy(), mask.copy(), hidden.copy()))
        out, ids, logp = (x[:m] for x in data[level])
        host.outputs(out)
    total = min(total, end)
    kept = np.empty(total, np.int64), np.empty(total, np.float32), np.empty(total, np.int64)
    eagle2_rerank(tokens, scores, parents, end, total, *kept)
    return laid, kept


def _fused_round(levels, data, depth, top_k, total, committed):
    """``Eagle2TreePolicy._grow_levels``' calls on ``TreeLevels`` (the passes' results given)."""
    out, ids, logp = data[0][0][:1], data[0][1][:1], data[0][2][:1]
    width = ids.shape[1]
    candidates, scores = np.empty((3, width + (depth - 1) * top_k * width), np.int64), None
    scores = np.empty(candidates.shape[1], np.float32)
    best = np.empty(top_k, np.int64)
    best[0] = -1
    end = base = 0
    laid = []
    for level in range(1, depth):
        end, m = eagle2_host_level(
            candidates, scores, end, ids, logp, best, top_k, *levels.arrays, committed, base, out
        )
        size = base + m
        laid.append(
            (
                levels.inputs[0, :m].copy(),
                levels.inputs[1, :m].copy(),
                levels.mask[base + 1 : size + 1, : committed + size].copy(),
                levels.hidden[:m].copy(),
            )
        )
        out, ids, logp = (x[:m] for x in data[level])
        base = size
    total = min(total, end + ids.size)
    kept = np.empty(total, np.int64), np.empty(total, np.float32), np.empty(total, np.int64)
    assert eagle2_host_finish(candidates, scores, end, ids, logp, best, base, total, *kept) == total
    return laid, kept


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(4, 3, 10), (7, 10, 60), (5, 4, 200), (1, 5, 3), (3, 1, 3), (2, 2, 1)])
def test_the_fused_level_is_the_replaced_steps(seed, shape):
    depth, top_k, total = shape
    dtype = np.float32 if seed % 2 else np.float64
    rng = np.random.default_rng(seed)
    h, width = 5, top_k if seed % 3 else max(top_k - 1, 1)  # a drafter's vocabulary smaller than top_k
    nodes = (depth - 1) * top_k
    host = tree.HostTree(h, dtype, capacity=3)
    levels = TreeLevels(h, dtype, width, max(nodes, 1), 300)
    for committed in (7, 3, 40, 1):  # rounds on the same buffers: stale rows and columns overwritten
        data = _levels_data(rng, depth, top_k, width, h, dtype)
        old_laid, old_kept = _replaced_round(host, data, depth, top_k, total, committed)
        new_laid, new_kept = _fused_round(levels, data, depth, top_k, total, committed)
        assert len(old_laid) == len(new_laid) == depth - 1
        for old, new in zip(old_laid, new_laid):
            for a, b in zip(old, new):
                assert a.dtype == b.dtype and np.array_equal(a, b)
        assert np.array_equal(old_kept[0], new_kept[0]) and np.array_equal(old_kept[2], new_kept[2])
        assert np.array_equal(old_kept[1], new_kept[1], equal_nan=True)
        assert np.array_equal(np.signbit(old_kept[1]), np.signbit(new_kept[1]))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = sharpen(tiny_lm(0, layers=6, vocab=VOCAB).double(), 4.0)
    return target, write_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), 32, VOCAB, VOCAB, layer_ids=[1, 3, 5])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", [(4, 3, 10), (6, 4, 30), (1, 3, 3)])
@pytest.mark.parametrize("sampled", [False, True])
def test_the_drafters_fused_rounds_are_its_tensor_rounds(models, dtype, shape, sampled):
    """Every round's tree (tokens, parents, confidences), passes and outcome the same through the
    loop, with the fused host levels and with the drafter's tensor tree (``grows_trees_on_host`` off)."""
    target, checkpoint = models
    depth, top_k, total = shape
    torch_dtype = getattr(torch, dtype)
    sampling = SamplingConfig(temperature=0.8, top_k=8, top_p=1.0) if sampled else None
    runs = []
    for fused in (True, False):
        rt = Runtime(device="cpu", dtype=dtype, seed=0)
        verifier = HFVerifier(target.to(torch_dtype), rt, frozenset({EOS}))
        head = load_eagle3(checkpoint).to(torch_dtype)
        drafter = Eagle3Drafter(head, verifier.model.get_input_embeddings(), (1, 3, 5), VOCAB, rt, frozenset({EOS}))
        assert drafter.grows_trees_on_host
        drafter.grows_trees_on_host = fused
        rounds = []
        for prompt in random_prompts(3):
            out = generate(
                prompt,
                verifier,
                rt,
                max_new_tokens=24,
                drafter=drafter,
                policy=Eagle2TreePolicy(depth=depth, top_k=top_k, total_tokens=total),
                sampling=sampling,
                on_round=rounds.append,
            )
            rounds.append(out.output_ids.tolist())
        runs.append(
            [
                r
                if isinstance(r, list)
                else (
                    r.draft_token_ids,
                    r.draft_parents,
                    r.confidences,
                    r.drafter_forward_passes,
                    r.accepted_path,
                    r.draft_stop_reason,
                )
                for r in rounds
            ]
        )
    assert runs[0] == runs[1]


def test_a_reranking_that_keeps_fewer_nodes_than_asked_is_refused(models, monkeypatch):
    """The fused round's draft arrays are written only as far as EAGLE-2's reranking keeps nodes: a
    count other than the tree's size is a RuntimeError naming both, never a draft of unwritten entries."""
    import copy

    from specpolicy.core import compiled_eagle

    target, checkpoint = models
    rt = Runtime(device="cpu", dtype="float32", seed=0)
    verifier = HFVerifier(copy.deepcopy(target).float(), rt, frozenset({EOS}))
    drafter = Eagle3Drafter(
        load_eagle3(checkpoint).float(), verifier.model.get_input_embeddings(), (1, 3, 5), VOCAB, rt, frozenset({EOS})
    )
    finish = compiled_eagle.eagle2_host_finish
    monkeypatch.setattr(compiled_eagle, "eagle2_host_finish", lambda *args: finish(*args) - 1)
    policy = Eagle2TreePolicy(depth=4, top_k=3, total_tokens=10)
    with pytest.raises(RuntimeError, match=r"reranking kept 9 of the tree's 10 nodes"):
        generate(random_prompts(1)[0], verifier, rt, max_new_tokens=8, drafter=drafter, policy=policy)


def test_trees_of_other_shapes_in_turn_on_one_drafter_keep_its_buffers_and_their_rounds(models):
    """Two EAGLE-2 trees of other shapes (top-k, size) in turn on ONE drafter, as an interleaved
    benchmark runs them: every round as with a drafter of its own (the buffers laid out anew for
    another shape, rows rewritten over every column a pass reads), and the buffers' width bounded
    by the context, not doubled at each change of shape (the host work of copying rows of that width
    grew with every change: 61 ms a round after a run of interleaved methods)."""
    import copy

    target, checkpoint = models
    shapes = [(4, 3, 10), (3, 2, 6)]
    prompts = random_prompts(4)
    rt = Runtime(device="cpu", dtype="float32", seed=0)
    verifier = HFVerifier(copy.deepcopy(target).float(), rt, frozenset({EOS}))

    def drafter():
        head = load_eagle3(checkpoint).float()
        return Eagle3Drafter(head, verifier.model.get_input_embeddings(), (1, 3, 5), VOCAB, rt, frozenset({EOS}))

    def rounds(d, shape, prompt):
        depth, top_k, total = shape
        out = generate(
            prompt, verifier, rt, max_new_tokens=24, drafter=d,
            policy=Eagle2TreePolicy(depth=depth, top_k=top_k, total_tokens=total),
        )  # fmt: skip
        return out.output_ids.tolist(), [(r.draft_token_ids, r.draft_parents, r.confidences) for r in out.rounds]

    shared, own = drafter(), {shape: drafter() for shape in shapes}
    widest = 0
    for i, prompt in enumerate(prompts):
        shape = shapes[i % 2]
        assert rounds(shared, shape, prompt) == rounds(own[shape], shape, prompt), (i, shape)
        widest = max(widest, shared._levels.columns)
    longest = max(p.shape[0] for p in prompts) + 24 + max(total for _, _, total in shapes)
    assert widest <= 2 * (longest + 256), widest
