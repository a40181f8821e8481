"""``policy=falcon-tree``: Falcon's static decoding tree laid out for blocks of k = 2 tokens per pass
(a hand-worked example: which nodes start blocks, the tokens each block pass is fed, each node's
token and parent), the paper's and the CPU tree's shapes, greedy losslessness through the loop
(trees verified in one target pass), sampling (nodes as point masses), one-line errors."""

from __future__ import annotations

import pytest
import torch

from conftest import EOS, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.drafters.falcon import FalconDrafter
from specpolicy.family.train_falcon import new_falcon
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.policies.falcon_tree import CPU_TREE, PAPER_TREE, FalconTreePolicy, StaticTree
from specpolicy.verifiers.hf import HFVerifier

SIZE = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)
CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0, 0]]


class FakeBlockDrafter:
    """Block j's top tokens at offset o are 10 * (2 + 2 j + o) + rank; log-probs -(rank + 1) / 10 at
    offset 0 and -(rank + 1) / 5 at offset 1. Records what each block pass is fed."""

    name, k = "fake", 2

    def __init__(self):
        self.calls, self.blocks = [], 0

    def _rows(self, first, m, top_k):
        j = torch.arange(first, first + m)[:, None, None]
        o = torch.arange(2)[None, :, None]
        rank = torch.arange(top_k)[None, None, :]
        ids = 10 * (2 + 2 * j + o) + rank
        logp = -(rank + 1).double() / torch.where(o == 0, 10.0, 5.0)
        return ids.expand(m, 2, top_k), logp.expand(m, 2, top_k)

    def tree_block_root(self, top_k):
        ids, logp = self._rows(0, 1, top_k)
        return ids[0], logp[0]

    def tree_block_expand(self, tokens, parents, top_k):
        self.calls.append((tokens.tolist(), parents.tolist()))
        m = tokens.shape[0]
        ids, logp = self._rows(self.blocks + 1, m, top_k)
        numbers = torch.arange(self.blocks + 1, self.blocks + 1 + m)
        self.blocks += m
        return numbers, ids, logp

    @property
    def tree_passes(self):
        return 1 + len(self.calls)


def test_the_tree_worked_example():
    layout = StaticTree(CHOICES, 2)
    assert layout.passes == 2 and layout.top_k == 2 and layout.depth == 4
    assert [layout.paths[i] for i in layout.block_nodes[1]] == [(0, 0), (1, 0)]  # (0, 1) has no children
    drafter = FakeBlockDrafter()
    draft, reason = FalconTreePolicy(choices=CHOICES).draft_tree(drafter, room=10, node_room=100)
    # the root pass: depth 1 from offset 0 (20, 21), depth 2 from offset 1 (30, 31) whatever the depth-1 token
    # block pass: (0, 0) fed [20, 30], (1, 0) fed [21, 30], both under the root block 0
    assert drafter.calls == [([[20, 30], [21, 30]], [0, 0])]
    # block 1 = (0, 0): depth 3 from 40.., depth 4 from 50..; block 2 = (1, 0): depth 3 from 60..
    paths = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (1, 0, 0), (0, 0, 0, 0)]
    assert layout.paths == paths
    assert draft.token_ids.tolist() == [20, 21, 30, 31, 30, 40, 41, 60, 50]
    assert draft.parents.tolist() == [-1, -1, 0, 0, 1, 2, 2, 4, 5]
    assert draft.forward_passes == 2 and reason == "policy_bound" and draft.probs is None
    # confidence = the path's product of draft probabilities: (0, 0, 0, 0) = e^-(0.1 + 0.2 + 0.1 + 0.2)
    torch.testing.assert_close(draft.confidences[-1], torch.tensor(0.6).neg().exp().float())
    torch.testing.assert_close(draft.confidences[4], torch.tensor(0.2 + 0.2).neg().exp().float())  # (1, 0)


def test_the_tree_is_cut_to_the_room_left():
    drafter = FakeBlockDrafter()
    draft, reason = FalconTreePolicy(choices=CHOICES).draft_tree(drafter, room=2, node_room=100)
    assert draft.token_ids.tolist() == [20, 21, 30, 31, 30] and drafter.calls == [] and reason == "room"
    draft, _ = FalconTreePolicy(choices=CHOICES).draft_tree(FakeBlockDrafter(), room=10, node_room=3)
    assert draft.parents.tolist() == [-1, -1, 0]


def test_the_paper_and_cpu_trees():
    paper, cpu = StaticTree(PAPER_TREE, 2), StaticTree(CPU_TREE, 2)
    assert (len(paper.paths), paper.depth, paper.passes, paper.top_k) == (165, 8, 4, 20)  # 4 passes x 2 tokens
    assert (len(cpu.paths), cpu.depth, cpu.passes, cpu.top_k) == (27, 8, 4, 4)
    assert FalconTreePolicy().choices == [tuple(p) for p in CPU_TREE]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tree": "big"}, "policy.tree must be one of cpu, paper, got 'big'"),
        ({"choices": [[0], [0, 0, 1]]}, "policy.choices: path [0, 0, 1] has no parent path [0, 0]"),
        ({"choices": [[0], [-1]]}, "policy.choices must be a non-empty list"),
    ],
)
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        make_policy(get_plugin_manager(autoload=False), {"name": "falcon-tree", **kwargs})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_drafter_without_blocks_is_refused():
    with pytest.raises(ValueError, match="policy=falcon-tree needs a drafter that drafts blocks"):
        FalconTreePolicy().check_drafter(object())


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=2), 4.0)


@pytest.fixture(scope="module")
def head(target):
    head = new_falcon(target.config, 3, size=SIZE).double().eval()
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(8.0)
    return head


@pytest.mark.parametrize("tree", ["cpu", "paper"])
def test_lossless_greedy_one_target_pass_per_round(head, target, tree):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = FalconDrafter(head, target.get_input_embeddings(), target.get_output_embeddings(), 2, rt, {EOS})
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "falcon-tree", "tree": tree})
    accepted = 0
    calls = []
    target_forward = target.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return target_forward(*args, **kwargs)

    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=30)
        calls.clear()
        target.forward = counted
        try:
            out = generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy)
        finally:
            del target.forward
        assert torch.equal(out.output_ids, vanilla.output_ids)
        assert len(calls) == len(out.rounds) + 1  # the prefill, then ONE target pass per round
        accepted += sum(r.accepted_length for r in out.rounds)
        full = [r for r in out.rounds if r.draft_stop_reason == "policy_bound"]
        assert all(r.drafter_forward_passes == 4 for r in full)  # depth 8 = 4 passes x 2 tokens
    assert accepted > 0


@pytest.mark.slow
def test_tree_sampling_keeps_the_target_distribution():
    """Chi-square of the first 3 sampled tokens over N = 500 seeded runs against the exact joint
    (``tests/core/test_sampling.py``), a depth-2 falcon tree (one pass) whose nodes are point masses."""
    import importlib.util
    from pathlib import Path

    from specpolicy.core.sampling import SamplingConfig

    path = Path(__file__).resolve().parents[1] / "core" / "test_sampling.py"
    spec = importlib.util.spec_from_file_location("specpolicy_test_sampling_helpers", path)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    target = h._lm(0)
    runtime = Runtime(device="cpu", dtype="float64", seed=0)
    size = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=32)
    falcon = new_falcon(target.config, 4, size=size).double().eval()
    with torch.no_grad():
        falcon.layers[0].mlp.down_proj.weight.mul_(20.0)
    choices = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]

    def make():
        drafter = FalconDrafter(falcon, target.get_input_embeddings(), target.get_output_embeddings(), 1, runtime)
        return drafter, FalconTreePolicy(choices=choices)

    prompt, sampling = torch.tensor([3, 7, 5]), SamplingConfig(temperature=1.0)
    counts, stats = h.run_counts(make, prompt, sampling, runtime, target, h.T)
    pvalue, df = h.chi_square_pvalue(counts, h.exact_joint(target, prompt, sampling))
    assert stats["accepted"] >= 20, stats
    assert df >= 10 and pvalue > h.ALPHA, (pvalue, df, stats)
