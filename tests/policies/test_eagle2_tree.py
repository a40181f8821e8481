"""``policy=eagle2-tree`` (EAGLE-2's dynamic tree) with the ``eagle3`` and ``ar`` drafters: a one-wide
tree is exactly the drafter's chain; trees are lossless through the loop, greedy and sampling; passes
per round = depth; a drafter that cannot expand trees is refused in one line."""

from __future__ import annotations

import pytest
import torch

from conditioned_reference import write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig, warp
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.eagle3 import Eagle3Drafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.models.eagle3 import load_eagle3
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.verifiers.hf import HFVerifier

LAYERS = 6


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=LAYERS, vocab=VOCAB).double(), 4.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), 32, VOCAB, VOCAB, layer_ids=[1, 3, 5])


def _drafters(target, checkpoint, rt, stop=frozenset({EOS})):
    eagle = Eagle3Drafter(load_eagle3(checkpoint).double(), target.get_input_embeddings(), (1, 3, 5), VOCAB, rt, stop)
    ar = ARDrafter(sharpen(tiny_lm(1, layers=2, vocab=VOCAB).double(), 4.0), rt)
    return {"eagle3": eagle, "ar": ar}


@pytest.mark.parametrize("kind", ["eagle3", "ar"])
def test_a_one_wide_tree_is_the_drafters_chain(target, checkpoint, kind):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())  # no stop token: the chain drafts past EOS as the tree does
    for prompt in random_prompts(3):
        chain_rounds, tree_rounds = [], []
        for rounds, policy in ((chain_rounds, None), (tree_rounds, Eagle2TreePolicy(depth=5, top_k=1, total_tokens=5))):
            drafter = _drafters(target, checkpoint, rt, stop=frozenset())[kind]
            if policy is None:
                from specpolicy.policies.static import StaticPolicy

                policy = StaticPolicy(5)
            generate(prompt, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy, on_round=rounds.append)
        assert [r.draft_token_ids for r in tree_rounds] == [r.draft_token_ids for r in chain_rounds]
        assert all(r.draft_parents == tuple(range(-1, r.speculation_length - 1)) for r in tree_rounds)
        assert [r.accepted_length for r in tree_rounds] == [r.accepted_length for r in chain_rounds]


@pytest.mark.parametrize("kind", ["eagle3", "ar"])
@pytest.mark.parametrize(  # the fast subset: one shape per drafter; the deeper and the wider tree slow
    "shape",
    [(4, 3, 10), pytest.param((6, 2, 12), marks=pytest.mark.slow), pytest.param((3, 4, 4), marks=pytest.mark.slow)],
)
def test_trees_are_lossless(target, checkpoint, kind, shape):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    depth, top_k, total = shape
    policy = Eagle2TreePolicy(depth=depth, top_k=top_k, total_tokens=total)
    for prompt in random_prompts(4):
        drafter = _drafters(target, checkpoint, rt)[kind]
        rounds = []
        out = generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy, on_round=rounds.append)
        assert torch.equal(out.output_ids, generate(prompt, verifier, rt, max_new_tokens=30).output_ids)
        for r in rounds[:-1]:
            assert r.speculation_length <= total and r.tree_depth <= depth
            assert r.drafter_forward_passes == depth or r.draft_stop_reason == "room"
            assert len(r.accepted_path) == r.accepted_length


def test_tree_sampling_runs_and_emits_target_tokens(target, checkpoint):
    """Sampling through eagle2-tree: the trees' nodes are point masses; every emitted token has
    positive probability under the target's warped distribution (distribution tests of tree sampling:
    tests/core/test_sampling.py)."""
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafters(target, checkpoint, rt)["eagle3"]
    sampling = SamplingConfig(temperature=0.8, top_k=8, top_p=1.0)
    prompt = torch.tensor([4, 9, 2])
    out = generate(
        prompt,
        verifier,
        rt,
        max_new_tokens=20,
        drafter=drafter,
        policy=Eagle2TreePolicy(depth=4, top_k=3, total_tokens=8),
        sampling=sampling,
    )
    assert out.generated_tokens == 20 or out.finish_reason == "eos"
    full = torch.cat([prompt, out.output_ids])
    with torch.no_grad():
        p = warp(target(input_ids=full[None]).logits[0, len(prompt) - 1 : -1], sampling)  # (n, V)
    assert bool((p.gather(1, out.output_ids[:, None]) > 0).all())  # top_k = 8 zeroes all but 8 tokens


def test_a_drafter_that_cannot_expand_trees_is_one_line(target):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    with pytest.raises(ValueError, match="policy=eagle2-tree needs a drafter that expands trees .* 'suffix' does not"):
        generate(
            torch.tensor([1, 2, 3]),
            verifier,
            rt,
            max_new_tokens=4,
            drafter=SuffixDrafter(rt),
            policy=Eagle2TreePolicy(),
        )


def test_a_drafter_that_agrees_with_the_target_gets_long_paths_accepted(target):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = ARDrafter(target, rt)  # the target's own weights: its top child is the target's token
    rounds = []
    prompt = random_prompts(1)[0]
    out = generate(
        prompt,
        verifier,
        rt,
        max_new_tokens=30,
        drafter=drafter,
        policy=Eagle2TreePolicy(depth=4, top_k=2, total_tokens=8),
        on_round=rounds.append,
    )
    assert torch.equal(out.output_ids, generate(prompt, verifier, rt, max_new_tokens=30).output_ids)
    assert sum(r.accepted_length for r in rounds) / len(rounds) > 1.5
    assert max(r.accepted_length for r in rounds) >= 3  # paths deeper than the first branch point accepted


@pytest.mark.parametrize("kind", ["eagle3", "ar"])
def test_trees_stop_at_the_context_limit(target, checkpoint, kind):
    """Near the end of the target's context, a tree holds no more nodes than one verification can
    take (a tree of 12 nodes at 6 positions from the end)."""
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset(), max_context=40)
    prompt = random_prompts(2)[1][:30]
    out = generate(
        prompt,
        verifier,
        rt,
        max_new_tokens=30,
        drafter=_drafters(target, checkpoint, rt)[kind],
        policy=Eagle2TreePolicy(depth=4, top_k=4, total_tokens=12),
    )
    assert out.finish_reason == "max_context"
    assert torch.equal(out.output_ids, generate(prompt, verifier, rt, max_new_tokens=30).output_ids)


class _ScriptedTreeDrafter:
    """Children and log-probabilities drawn at random per expanded node (seeded): the policy's tree
    against EAGLE-2's expansion written out in plain Python."""

    def __init__(self, seed: int, vocab: int = 50):
        self.g, self.vocab, self.tree_passes, self.expanded = torch.Generator().manual_seed(seed), vocab, 0, 0

    def _children(self, n: int, top_k: int):
        logp = torch.log_softmax(torch.randn(n, self.vocab, generator=self.g, dtype=torch.float64), -1)
        logp = (logp * 4).round() / 4  # exact in float32: ties between candidates, to check how they are broken
        values, ids = logp.topk(top_k, dim=-1)
        return ids, values.float()

    def tree_root(self, top_k):
        self.tree_passes = 1
        ids, values = self._children(1, top_k)
        return ids[0], values[0]

    def tree_expand(self, tokens, parents, top_k):
        self.tree_passes += 1
        m = int(tokens.shape[0])
        nodes = torch.arange(self.expanded + 1, self.expanded + 1 + m)
        self.expanded += m
        return nodes, *self._children(m, top_k)


def _reference_eagle2(drafter, depth, top_k, total):
    ids, logp = drafter.tree_root(top_k)
    tokens, scores, parents = ids.tolist(), logp.tolist(), [-1] * len(ids)
    level, node_of, expanded = list(range(len(tokens))), {}, []
    for _ in range(depth - 1):
        chosen = sorted(level, key=lambda c: -scores[c])[:top_k]
        expanded.append(([tokens[c] for c in chosen], [node_of.get(parents[c], 0) for c in chosen]))
        nodes, cids, clps = drafter.tree_expand(torch.tensor([tokens[c] for c in chosen]), None, top_k)
        level = []
        for c, node, cid, clp in zip(chosen, nodes.tolist(), cids.tolist(), clps.tolist()):
            node_of[c] = node
            for t, lp in zip(cid, clp):
                level.append(len(tokens))
                tokens.append(t), scores.append(scores[c] + lp), parents.append(c)
    keep = sorted(sorted(range(len(tokens)), key=lambda c: -scores[c])[:total])
    index = {c: i for i, c in enumerate(keep)}
    return [tokens[c] for c in keep], [index[parents[c]] if parents[c] >= 0 else -1 for c in keep], expanded


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(4, 3, 10), (6, 2, 12), (5, 4, 60), (3, 5, 1)])
@pytest.mark.parametrize("path", ["host", "tensor"])  # a CPU drafter's numpy steps, an accelerator's tensor ops
def test_the_tensor_expansion_is_eagle2s_expansion(seed, shape, path, monkeypatch):
    if path == "tensor":
        monkeypatch.setattr(Eagle2TreePolicy, "_grow_on_host", Eagle2TreePolicy._on_device)
    depth, top_k, total = shape
    calls = []
    policy_drafter = _ScriptedTreeDrafter(seed)
    expand = policy_drafter.tree_expand
    policy_drafter.tree_expand = lambda t, p, k: calls.append((t.tolist(), p.tolist())) or expand(t, p, k)
    draft, _ = Eagle2TreePolicy(depth, top_k, total).draft_tree(policy_drafter, room=100, node_room=100)
    tokens, parents, expanded = _reference_eagle2(_ScriptedTreeDrafter(seed), depth, top_k, total)
    assert calls == expanded  # the same nodes expanded under the same drafter nodes, level by level
    assert draft.token_ids.tolist() == tokens and draft.parents.tolist() == parents
    assert all(p < i for i, p in enumerate(parents))
