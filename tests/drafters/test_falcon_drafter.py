"""The ``falcon`` drafter: chain drafts equal a from-scratch (no cache) re-statement of Falcon's
semi-autoregressive rule, through the loop and for arbitrary accepted lengths; k tokens per pass
(an odd request reports the rest of the pass as look-ahead); greedy output identical to vanilla
decoding with static, FailFast (its rule on Falcon's passes) and FailFast-tree; speculative sampling
keeps the target's distribution (chi-square); the factory's one-line errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conditioned_reference import committed_after
from conftest import EOS, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.falcon import FalconDrafter
from specpolicy.family.train_falcon import new_falcon
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier

LAYERS = 2
SIZE = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=LAYERS), 4.0)


@pytest.fixture(scope="module")
def head(target):
    head = new_falcon(target.config, 3, size=SIZE).double().eval()
    with torch.no_grad():  # larger weights than the training init: varied drafts, some accepted
        for p in head.parameters():
            p.mul_(8.0)
    return head


@pytest.fixture
def rt():
    return Runtime(device="cpu", dtype="float64", seed=0)


def _drafter(head, target, rt, stop=()):
    return FalconDrafter(head, target.get_input_embeddings(), target.get_output_embeddings(), LAYERS, rt, stop)


def _features(target, seq, start, stop):
    """The target's top-layer features (what its LM head reads) of ``seq[start:stop]``."""
    return target(input_ids=seq[None], output_hidden_states=True).hidden_states[LAYERS][0, start:stop]


@torch.no_grad()
def falcon_reference(head, target, committed: torch.Tensor, passes: int) -> torch.Tensor:
    """Falcon's chain rule from scratch, no cache: the committed pairs (f_i, x_{i+1}), i < n, then
    each drafted block's pairs (its predicted features, its tokens), the whole sequence run from
    position 0 for every pass; a position sees every earlier one and its whole block (the last k
    committed pairs form one block, each drafted block one); the last block's outputs through the
    target's LM head give the next k tokens (argmax)."""
    k = head.k
    n = committed.shape[0] - 1
    feats = _features(target, committed, 0, n)
    hidden, tokens = [feats], [committed[1:]]
    block = list(range(n - k)) + [n - k] * k  # block id per position
    drafted = []
    for _ in range(passes):
        h, t = torch.cat(hidden)[None], torch.cat(tokens)
        N = t.shape[0]
        b = torch.tensor(block)
        i = torch.arange(N)
        mask = (i[None, :] <= i[:, None]) | (b[None, :] == b[:, None])
        out, _, _ = head(target.get_input_embeddings()(t)[None], h, i[None], mask=mask)
        last = out[0, -k:]
        new = target.get_output_embeddings()(last).argmax(-1)
        drafted.append(new)
        hidden.append(last)
        tokens.append(new)
        block += [N + 10**6] * k  # a fresh id for the new block
    return torch.cat(drafted)


def test_chain_drafts_equal_the_reference_through_the_loop(head, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(head, target, rt)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 4})
    for prompt in random_prompts(3):
        rounds = []
        generate(prompt, verifier, rt, max_new_tokens=20, drafter=drafter, policy=policy, on_round=rounds.append)
        committed = prompt.clone()
        for r in rounds:
            want = falcon_reference(head, target, committed, 2).tolist()
            assert r.draft_token_ids == tuple(want[: r.speculation_length])  # shorter at the end: room
            assert r.speculation_length == len(r.draft_token_ids)  # the length the drafter counted (Draft.counted)
            assert r.drafter_forward_passes == -(-r.speculation_length // 2)  # 2 tokens per pass
            committed = committed_after(committed, r)


@torch.no_grad()
def test_chain_drafts_equal_the_reference_for_any_accepted_lengths(head, target, rt):
    g = torch.Generator().manual_seed(3)
    drafter = _drafter(head, target, rt)
    committed = torch.randint(0, EOS, (8,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 7))
    for accept in (2, 0, None, 5, 1, 3, 6):
        if accept is None:  # a round that drafts nothing
            draft, a = Draft.empty(), 0
        else:
            first = drafter.draft(3)  # 2 passes: 4 tokens, the 4th as look-ahead
            assert (first.length, first.lookahead, first.forward_passes) == (3, 1, 2)
            assert drafter.draft(1).forward_passes == 2  # the look-ahead token: no pass
            draft = drafter.draft(2)  # one more pass
            assert (draft.length, draft.forward_passes) == (6, 3)
            assert torch.equal(draft.token_ids, falcon_reference(head, target, committed, 3))
            a = accept
        nxt = torch.randint(0, EOS, (1,), generator=g)
        new = torch.cat([committed, draft.token_ids[:a], nxt])
        drafter.commit(
            draft,
            Verification(
                a,
                int(nxt),
                torch.cat([draft.token_ids[:a], nxt]),
                features=_features(target, new, committed.shape[0] - 1, committed.shape[0] + a),
            ),
        )
        committed = new
        # the cache holds the committed pairs but the last k - 1, which wait with the new ones
        assert drafter.cache.length + drafter._features.shape[0] == committed.shape[0] - 1
    assert torch.equal(drafter.draft(4).token_ids, falcon_reference(head, target, committed, 2))


def test_a_short_prompt_drafts_nothing_until_k_pairs_exist(head, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(head, target, rt)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 2})
    rounds = []
    out = generate(
        torch.tensor([9]), verifier, rt, max_new_tokens=8, drafter=drafter, policy=policy, on_round=rounds.append
    )
    assert [r.speculation_length for r in rounds[:3]] == [0, 0, 2]  # 0, 1, then 2 pairs
    assert rounds[0].draft_stop_reason == "no_proposal"
    assert torch.equal(out.output_ids, generate(torch.tensor([9]), verifier, rt, max_new_tokens=8).output_ids)


@pytest.mark.parametrize(
    "policy",
    [
        {"name": "static", "k": 3},
        {"name": "failfast", "n": 2, "tau": 0.3, "n_max": 12},
        {"name": "failfast", "n": 2, "tau": 0.0, "n_max": 12},
        {"name": "failfast-tree", "n": 2, "tau": 0.3, "n_max": 12, "branch_k": 3},
    ],
)
def test_lossless_with_chain_policies(head, target, rt, policy):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafter(head, target, rt, stop=frozenset({EOS}))
    built = make_policy(get_plugin_manager(autoload=False), policy)
    lengths = set()
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=30)
        out = generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=built)
        assert torch.equal(out.output_ids, vanilla.output_ids)
        lengths |= {r.speculation_length for r in out.rounds}
    if policy["name"] == "failfast" and policy["tau"] == 0.0:
        assert 12 in lengths  # tau 0: FailFast extends pass by pass up to N_max


def test_failfast_extends_by_passes_while_every_confidence_clears_tau(head, target, rt):
    """FailFast's rule on Falcon's passes: a round's draft grows by one pass (n = 2) while every
    drafted token's confidence >= tau, and stops at the first pass holding one below it."""
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(head, target, rt)
    tau = 0.2
    built = make_policy(get_plugin_manager(autoload=False), {"name": "failfast", "n": 2, "tau": tau, "n_max": 10})
    seen = 0
    for prompt in random_prompts(3):
        for r in generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=built).rounds:
            conf = torch.tensor(r.confidences)
            if r.speculation_length == 0 or r.draft_stop_reason == "room":
                continue
            seen += 1
            low = (conf < tau).nonzero()
            if len(low):  # stopped at the pass holding the first low confidence
                assert r.speculation_length == 2 * (int(low[0]) // 2 + 1)
            else:
                assert r.speculation_length == 10
    assert seen > 5


def _sampling_helpers():
    """tests/core/test_sampling.py's chi-square machinery (loaded by path: tests are not a package)."""
    path = Path(__file__).resolve().parents[1] / "core" / "test_sampling.py"
    spec = importlib.util.spec_from_file_location("specpolicy_test_sampling_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_speculative_sampling_keeps_the_target_distribution():  # the fast subset's sampled Falcon
    """Chi-square of the first 3 sampled tokens over N = 500 seeded runs against the exact joint
    (``tests/core/test_sampling.py``), drafts of 2 tokens (one pass) with q the head's rows."""
    h = _sampling_helpers()
    target = h._lm(0)
    runtime = Runtime(device="cpu", dtype="float64", seed=0)
    size = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=32)
    falcon = new_falcon(target.config, 4, size=size).double().eval()
    with torch.no_grad():  # predicted features near the target's: real acceptance
        falcon.layers[0].mlp.down_proj.weight.mul_(20.0)
    prompt = torch.tensor([3, 7, 5])  # two pairs: the first round drafts

    def make():
        drafter = FalconDrafter(falcon, target.get_input_embeddings(), target.get_output_embeddings(), 1, runtime)
        return drafter, make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": h.T - 1})

    sampling = SamplingConfig(temperature=1.0)
    counts, stats = h.run_counts(make, prompt, sampling, runtime, target, h.T)
    pvalue, df = h.chi_square_pvalue(counts, h.exact_joint(target, prompt, sampling))
    assert 0.02 < stats["accepted"] / stats["speculated"] < 0.95 and stats["accepted"] >= 20, stats
    assert df >= 10 and pvalue > h.ALPHA, (pvalue, df, stats)


@pytest.mark.parametrize("seed", range(4))
def test_the_host_layouts_equal_the_tensor_ops(seed, monkeypatch):
    """``root_mask`` and ``block_layout`` built in numpy on the CPU are the tensor ops' (an
    accelerator's) to the bit: random pair counts, cache lengths, block sizes and trees; so is the
    compiled root layout (``compiled_falcon.falcon_root_layout``) the CPU's round runs."""
    import numpy as np

    from specpolicy.core import compiled_falcon, tree as tree_mod
    from specpolicy.drafters import falcon as falcon_mod

    g = torch.Generator().manual_seed(seed)
    for _ in range(6):
        u, start, k = (int(x) for x in torch.randint(1, 9, (3,), generator=g))
        committed = int(torch.randint(1, 20, (1,), generator=g))
        grown = tree_mod.GrowingTree(committed, "cpu", capacity=2)
        grown.add(torch.zeros(2, dtype=torch.long))
        _, depth_pos, block_mask = grown.add(torch.randint(0, 3, (3,), generator=g))
        host = falcon_mod.root_mask(u, start, k, "cpu"), falcon_mod.block_layout(depth_pos, block_mask, committed, k)
        with monkeypatch.context() as patch:
            patch.setattr(falcon_mod, "_HOST_DEVICES", frozenset())
            tensor = (
                falcon_mod.root_mask(u, start, k, "cpu"),
                falcon_mod.block_layout(depth_pos, block_mask, committed, k),
            )
        assert torch.equal(host[0], tensor[0]) and host[0].dtype == tensor[0].dtype == torch.bool
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(host[1], tensor[1]))
        positions, mask = compiled_falcon.falcon_root_layout(u, start, k)  # the CPU round's first pass, one call
        assert np.array_equal(mask, tensor[0].numpy()) and mask.dtype == np.bool_
        assert np.array_equal(positions, np.arange(start, start + u)[None]) and positions.dtype == np.int64
        stale = np.ones((u, start + u), dtype=bool)  # the kept buffer's earlier contents: every cell rewritten
        stale[::2] = False
        compiled_falcon.falcon_root_mask_into(stale, start, k)
        assert np.array_equal(stale, mask)
    # the drafter's kept host buffers (``_host_layout``): the root's and a chain pass's layouts, as
    # ``falcon_root_layout`` / ``chain_layout`` make them, through growth and reuse
    drafter = object.__new__(falcon_mod.FalconDrafter)
    drafter.k = 3
    drafter._arange, drafter._ones, drafter._root_mask = (np.zeros(0, dtype=t) for t in (np.int64, bool, bool))
    for u, start in [(5, 0), (3, 7), (40, 300), (4, 2), (3, 610)]:
        for root in (True, False):
            rows = u if root else drafter.k
            positions, mask = drafter._host_layout(start, rows, root)
            want = compiled_falcon.falcon_root_layout(rows, start, drafter.k)
            assert np.array_equal(positions.numpy(), want[0]) and np.array_equal(mask.numpy(), want[1])
            assert positions.dtype == torch.long and mask.dtype == torch.bool and mask.is_contiguous()


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_block_layout_equals_the_growing_tree(seed):
    """``compiled.falcon_block_layout`` (the CPU tree's bookkeeping, one call per block pass) against
    ``tree.GrowingTree.add`` + ``block_layout``, the tensor code an accelerator runs: the same
    positions and masks, pass after pass, on random block trees, with buffers reused from a bigger
    earlier tree (no stale rows)."""
    import numpy as np

    from specpolicy.core import compiled, tree as tree_mod
    from specpolicy.drafters import falcon as falcon_mod

    g = torch.Generator().manual_seed(seed)
    ancestors, depths = np.ones((40, 40), dtype=bool), np.zeros(40, dtype=np.int64)  # stale: all True
    for _ in range(4):
        committed, k = int(torch.randint(1, 20, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        grown = tree_mod.GrowingTree(committed, "cpu", capacity=2)
        ancestors[0], base = False, 0
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            m = int(torch.randint(1, 5, (1,), generator=g))
            parents = torch.randint(0, base + 1, (m,), generator=g)
            _, depth_pos, block_mask = grown.add(parents)
            want = falcon_mod.block_layout(depth_pos, block_mask, committed, k)
            got = compiled.falcon_block_layout(ancestors, depths, parents.numpy(), base, committed, k)
            assert np.array_equal(got[0], want[0].numpy()) and np.array_equal(got[1], want[1].numpy())
            base += m


def test_the_host_tree_buffers_equal_the_tensor_path(head, target, rt, monkeypatch):
    """``policy=falcon-tree`` through the loop: the CPU's numpy buffers and compiled layout
    (``_expand_on_host``) give the drafts and outputs the tensor path (``GrowingTree``, index_select)
    gives, round for round."""
    from specpolicy.drafters import falcon as falcon_mod

    verifier = HFVerifier(target, rt, frozenset({EOS}))

    def run():
        drafter = _drafter(head, target, rt, stop=frozenset({EOS}))
        policy = make_policy(get_plugin_manager(autoload=False), {"name": "falcon-tree", "tree": "paper"})
        out = [generate(p, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy) for p in random_prompts(3)]
        return [
            (
                r.output_ids.tolist(),
                [(x.draft_token_ids, x.draft_parents, x.confidences, x.accepted_path) for x in r.rounds],
            )
            for r in out
        ]

    host = run()
    with monkeypatch.context() as patch:
        patch.setattr(falcon_mod, "_NUMPY_DTYPES", {})
        tensor = run()
    assert host == tensor


def test_trees_of_other_shapes_in_turn_on_one_drafter_keep_its_buffers_and_their_rounds(head, target, rt):
    """Falcon's default and paper trees in turn on ONE drafter, as an interleaved benchmark runs
    them: every round as with a drafter of its own, and the host buffers' width bounded by the
    context, not doubled at each change of tree."""
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    trees = [{"name": "falcon-tree"}, {"name": "falcon-tree", "tree": "paper"}]
    prompts = random_prompts(4)

    def rounds(drafter, config, prompt):
        policy = make_policy(get_plugin_manager(autoload=False), dict(config))
        out = generate(prompt, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy)
        return out.output_ids.tolist(), [(r.draft_token_ids, r.draft_parents, r.confidences) for r in out.rounds]

    shared = _drafter(head, target, rt, stop=frozenset({EOS}))
    own = [_drafter(head, target, rt, stop=frozenset({EOS})) for _ in trees]
    widest = 0
    for i, prompt in enumerate(prompts):
        assert rounds(shared, trees[i % 2], prompt) == rounds(own[i % 2], trees[i % 2], prompt), i
        widest = max(widest, shared._levels.columns)
    most = max(own[0]._levels.blocks, own[1]._levels.blocks) * shared.k
    assert widest <= 2 * (max(p.shape[0] for p in prompts) + 24 + most + 256), widest
