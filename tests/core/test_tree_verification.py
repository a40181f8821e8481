"""Draft trees verified in one target pass (``specpolicy.core.tree``, the ``hf`` verifier): property tests
against verifying each root-to-leaf path as a chain, the KV cache after a tree round against a fresh
prefill of the committed sequence, the target's features of the accepted path. Tree sampling's
distribution is tested with every other sampler's in tests/core/test_sampling.py (eagle2-tree,
failfast-tree)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core import tree
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Draft
from specpolicy.verifiers.hf import HFVerifier

RT = Runtime(device="cpu", dtype="float64", seed=0)
TARGET = sharpen(tiny_lm(0, layers=2), 3.0)


@st.composite
def trees(draw, max_nodes=12):
    """A random tree: parents (topological), tokens (some equal to the target's greedy tokens so
    paths get accepted), and a prompt."""
    k = draw(st.integers(1, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(k)]
    prompt = draw(st.lists(st.integers(0, VOCAB - 2), min_size=2, max_size=12))
    guided = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    noise = draw(st.lists(st.integers(0, VOCAB - 2), min_size=k, max_size=k))
    return parents, prompt, guided, noise


def _greedy_tokens(prompt, parents, guided, noise):
    """Node tokens: where ``guided``, the target's greedy token after the node's ancestors."""
    tokens = []
    for i, parent in enumerate(parents):
        if guided[i]:
            path = tree.path_to(parent, parents) if parent >= 0 else ()
            seq = torch.tensor(prompt + [tokens[j] for j in path])
            tokens.append(int(TARGET(input_ids=seq[None]).logits[0, -1].argmax()))
        else:
            tokens.append(noise[i])
    return tokens


@settings(max_examples=25, deadline=None)
@given(trees())
def test_a_tree_round_accepts_the_longest_path_a_chain_round_would(case):
    parents, prompt, guided, noise = case
    tokens = _greedy_tokens(prompt, parents, guided, noise)
    draft = Draft(torch.tensor(tokens), torch.ones(len(tokens)), parents=torch.tensor(parents))
    verifier = HFVerifier(TARGET, RT, frozenset())
    verifier.prefill(torch.tensor(prompt))
    result = verifier.verify(draft)
    best = 0
    for leaf in range(len(parents)):  # every root-to-node path verified as a chain
        path = tree.path_to(leaf, parents)
        chain = HFVerifier(TARGET, RT, frozenset())
        chain.prefill(torch.tensor(prompt))
        v = chain.verify(Draft(torch.tensor([tokens[j] for j in path]), torch.ones(len(path))))
        best = max(best, v.accepted_length)
        if v.accepted_length == len(path) and len(path) == result.accepted_length and path == result.path:
            assert v.next_token == result.next_token  # the bonus token after the same path
    assert result.accepted_length == best == len(result.path)
    committed = result.committed_tokens(draft)
    assert committed.tolist() == [tokens[j] for j in result.path] + [result.next_token]
    # the cache now equals a fresh prefill of the committed sequence (its last token pending)
    seq = torch.cat([torch.tensor(prompt), committed])
    fresh = TARGET(input_ids=seq[None, :-1], use_cache=True).cache
    assert verifier.cached_length == seq.shape[0] - 1
    for mine, ref in zip(verifier.cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, ref.keys)
        torch.testing.assert_close(mine.values, ref.values)
    # and decoding continues from it exactly as from the fresh cache
    nxt = verifier.verify(Draft.empty())
    assert nxt.next_token == int(TARGET(input_ids=seq[None]).logits[0, -1].argmax())


def test_features_of_a_tree_round_are_the_accepted_paths():
    prompt = torch.tensor([3, 9, 14, 2])
    parents = [-1, -1, 0, 2]
    tokens = _greedy_tokens(prompt.tolist(), parents, [False, True, True, True], [7, 0, 0, 0])
    verifier = HFVerifier(TARGET, RT, frozenset())
    verifier.request_features((1, 2))
    verifier.prefill(prompt)
    v = verifier.verify(Draft(torch.tensor(tokens), torch.ones(4), parents=torch.tensor(parents)))
    assert v.path == (1,)  # node 1 is right (guided); node 0 is noise, so 2 and 3 under it fall
    seq = torch.cat([prompt, torch.tensor([tokens[1]])])
    hs = TARGET(input_ids=seq[None], output_hidden_states=True).hidden_states
    want = torch.cat([hs[1][0, -2:], hs[2][0, -2:]], dim=-1)  # the pending token and node 1
    torch.testing.assert_close(v.features, want)


def test_bad_parents_are_refused():
    with pytest.raises(ValueError, match="node 1 has parent 1"):
        tree.validate(torch.tensor([-1, 1]), 2)


def test_tree_rounds_count_depths_in_the_metrics_and_survive_results_jsonl():
    from specpolicy.analysis.metrics import acceptance_by_position, aggregate
    from specpolicy.analysis.results import round_from_dict, round_to_dict
    from specpolicy.core.types import GenerationResult, RoundRecord

    tree_round = RoundRecord(
        index=0,
        speculation_length=6,
        accepted_length=2,
        emitted_tokens=3,
        drafter_forward_passes=3,
        reused_tokens=0,
        draft_ms=1.0,
        verify_ms=1.0,
        draft_parents=(-1, -1, 0, 0, 2, 4),
        accepted_path=(0, 3),
    )
    chain_round = RoundRecord(
        index=1,
        speculation_length=3,
        accepted_length=1,
        emitted_tokens=2,
        drafter_forward_passes=3,
        reused_tokens=0,
        draft_ms=1.0,
        verify_ms=1.0,
    )
    assert tree_round.tree_depth == 4 and chain_round.tree_depth == 3 and not tree_round.fully_accepted
    by_position = acceptance_by_position([tree_round, chain_round])
    assert by_position["drafted"] == [2, 2, 2, 1]  # the tree reaches depth 4, the chain position 3
    assert by_position["accepted"] == [2, 1, 0, 0]
    agg = aggregate([GenerationResult(torch.arange(5), (tree_round, chain_round), "max_new_tokens", 1.0, 0.0)])
    assert agg["tree_rounds"] == 1 and agg["mean_draft_depth"] == pytest.approx(3.5)
    assert agg["acceptance_rate"] == pytest.approx(3 / 9)  # accepted / verified tokens (a tree's nodes)
    assert round_from_dict(round_to_dict(tree_round), 0) == tree_round
    assert "draft_parents" not in round_to_dict(chain_round)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.integers(0, 2**31 - 1), st.integers(1, 9))
def test_a_growing_tree_masks_each_node_to_its_ancestors_and_places_it_by_depth(levels, seed, committed):
    """``GrowingTree`` (the drafters' tentative tree, grown past its first capacity) against the
    verifier's ``ancestor_mask`` and ``depths`` of the same tree."""
    for on_host in (True, False):  # the CPU's numpy steps, and the tensor ops an accelerator runs
        g = torch.Generator().manual_seed(seed)
        grown = tree.GrowingTree(committed, "cpu", capacity=2)
        grown._on_host = on_host
        _check_growing_tree(grown, levels, g, committed)


def _check_growing_tree(grown: tree.GrowingTree, levels: list[int], g: torch.Generator, committed: int) -> None:
    parents: list[int] = []  # node i + 1's parent node number (0 = the root)
    for m in levels:
        level_parents = torch.randint(0, len(parents) + 1, (m,), generator=g)
        nodes, positions, mask = grown.add(level_parents)
        first = len(parents) + 1
        parents += level_parents.tolist()
        assert nodes.tolist() == list(range(first, first + m))
        as_draft = [p - 1 for p in parents]  # draft convention: -1 = under the root
        expected = tree.ancestor_mask(as_draft)[first:, 1:]  # rows of the new nodes, columns of the nodes
        assert mask.shape == (m, committed + len(parents))
        assert mask[:, :committed].all() and torch.equal(mask[:, committed:], expected)
        assert positions.tolist() == (tree.depths(as_draft)[first - 1 :] + committed - 1).tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 30), min_size=0, max_size=30), st.integers(0, 50))
def test_the_verification_layout_places_nodes_by_depth_and_masks_them_to_their_ancestors(raw, start):
    """``verification_layout`` (the verifier's one host-built layout) against a walk up each node's
    parents: position = start + depth (the root at start), a row attends to every committed
    position, the root, its ancestors and itself, and nothing else."""
    parents = [min(p, i - 1) for i, p in enumerate(raw)]  # topological
    positions, mask = tree.verification_layout(parents, start, "cpu")
    k = len(parents)
    assert positions.dtype == torch.long and mask.dtype == torch.bool and mask.shape == (k + 1, start + k + 1)
    assert positions[0] == start and mask[0].tolist() == [True] * (start + 1) + [False] * k
    for i in range(k):
        seen = tree.path_to(i, parents)  # the root's child ... node i
        assert positions[i + 1] == start + len(seen)
        expected = [True] * (start + 1) + [j in seen for j in range(k)]
        assert mask[i + 1].tolist() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # compiled in place; index_select
def test_keep_path_moves_the_accepted_rows_down_and_keeps_the_prefix(dtype):
    """``keep_path``: the committed prefix stays, the path's rows land at start, start + 1, ... in
    order, the rest is cropped, every layer alike."""
    from transformers import DynamicCache

    from specpolicy.core.cache import keep_path

    g = torch.Generator().manual_seed(0)
    start, rows = 5, [0, 2, 3, 7]
    for path in (rows, [0, 1, 2]):  # a tree's path; a chain-like path (nothing moves)
        cache = DynamicCache()
        before = []
        for layer in range(3):
            keys, values = (torch.randn(1, 2, start + 9, 4, generator=g).to(dtype) for _ in range(2))
            before.append((keys.clone(), values.clone()))
            cache.update(keys, values, layer)
        keep_path(cache, start, path)
        assert cache.get_seq_length() == start + len(path)
        for layer, (keys, values) in zip(cache.layers, before):
            expected = [*range(start), *(start + r for r in path)]
            assert torch.equal(layer.keys, keys[:, :, expected]) and torch.equal(layer.values, values[:, :, expected])


@pytest.mark.parametrize("features", [(), (0, 2)])
def test_tree_rounds_in_a_row_keep_the_cache_of_the_committed_sequence(monkeypatch, features):
    """Tree rounds one after another on the host path (the cache's host form carried from round to round),
    a chain round among them, the buffers growing in the middle of a tree round (room for 2 tokens past
    the prompt): after every round the cache equals a fresh prefill of the committed sequence and the
    features are the target's hidden states at the committed positions."""
    from specpolicy.verifiers import hf as hf_module

    monkeypatch.setattr(hf_module, "BUFFER_STEP", 2)
    rng = torch.Generator().manual_seed(4)
    verifier = HFVerifier(TARGET, RT, frozenset())
    verifier.request_features(features)
    seq = [3, 9, 4, 1]
    verifier.prefill(torch.tensor(seq))
    for round_ in range(7):
        if round_ == 3:
            parents = None
            k = 3
        else:
            k = int(torch.randint(1, 9, (1,), generator=rng))
            parents = [int(torch.randint(-1, i, (1,), generator=rng)) for i in range(k)]
        tokens = []
        for i in range(k):  # the target's greedy token after the node's ancestors, now and then another
            above = (tree.path_to(parents[i], parents) if parents[i] >= 0 else ()) if parents else range(i)
            context = torch.tensor(seq + [tokens[j] for j in above])
            greedy = int(TARGET(input_ids=context[None]).logits[0, -1].argmax())
            tokens.append(greedy if torch.rand(1, generator=rng) < 0.7 else (greedy + 1) % (VOCAB - 1))
        draft = Draft(torch.tensor(tokens), torch.ones(k), parents=None if parents is None else torch.tensor(parents))
        result = verifier.verify(draft)
        committed = result.committed_tokens(draft).tolist()
        before = len(seq)
        seq += committed
        out = TARGET(input_ids=torch.tensor(seq[:-1])[None], use_cache=True, output_hidden_states=True)
        assert verifier.cached_length == len(seq) - 1
        for mine, ref in zip(verifier.cache.layers, out.cache.layers):
            torch.testing.assert_close(mine.keys, ref.keys)
            torch.testing.assert_close(mine.values, ref.values)
        if features:
            expected = torch.cat([out.hidden_states[i][0, before - 1 :] for i in features], dim=-1)
            torch.testing.assert_close(result.features, expected)
        else:
            assert result.features is None


def test_a_deep_copy_of_the_verifier_moves_its_own_cache_not_the_originals():
    """The host path keeps its cache's buffers by address (``kept_entries``, ``HFVerifier._tree_held``):
    a deep copy of the verifier after a tree round holds its original's addresses, which must not be
    written through: the copy's next tree round leaves the original's cache as it was and keeps its own
    cache equal to a fresh prefill of its committed sequence."""
    import copy

    from specpolicy.core.cache import kept_entries

    verifier = HFVerifier(TARGET, RT, frozenset())
    seq = [3, 9, 4, 1]
    verifier.prefill(torch.tensor(seq))
    first = Draft(torch.tensor([5, 6, 7]), torch.ones(3), parents=torch.tensor([-1, -1, 1]))
    seq += verifier.verify(first).committed_tokens(first).tolist()
    twin = copy.deepcopy(verifier)
    original = [(layer.keys.clone(), layer.values.clone()) for layer in verifier.cache.layers]
    held = kept_entries(twin.cache)
    assert held is not None and held[4][0, 0] == twin.cache.layers[0]._key_buffer.data_ptr()
    # a tree whose accepted path moves rows: the target's own greedy tokens under a rejected sibling
    greedy = []
    for _ in range(2):
        greedy.append(int(TARGET(input_ids=torch.tensor(seq + greedy)[None]).logits[0, -1].argmax()))
    second = Draft(
        torch.tensor([(greedy[0] + 1) % (VOCAB - 1), greedy[0], greedy[1]]),
        torch.ones(3),
        parents=torch.tensor([-1, -1, 1]),
    )
    result = twin.verify(second)
    assert result.path == (1, 2)
    seq += result.committed_tokens(second).tolist()
    for layer, (keys, values) in zip(verifier.cache.layers, original):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    out = TARGET(input_ids=torch.tensor(seq[:-1])[None], use_cache=True)
    for mine, ref in zip(twin.cache.layers, out.cache.layers):
        torch.testing.assert_close(mine.keys, ref.keys)
        torch.testing.assert_close(mine.values, ref.values)
