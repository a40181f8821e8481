"""DART's tree search (``policies/dart_tree.py``): a hand-worked example of the reference's scoring,
EOS ordering and pooling (fvliang/DART ``Searcher::search``), the same rule re-stated in plain
Python over random inputs, a valid tree always, and one-line setting errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specpolicy.core.errors import ConfigError
from specpolicy.models.ngram import NGramModel
from specpolicy.policies.dart_tree import DartTreePolicy, dart_tree_search

# a bigram model: after 6 come 7 and 8 (once each, of 6's two), after 7 comes 5, after 5 comes 6;
# token 9 was never seen
NGRAM = NGramModel.build([[5, 6, 7, 5, 6, 8]], vocab_size=10, order=2)
IDS = torch.tensor([[6, 9], [7, 8], [5, 6]])
PROBS = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]])
EOS = torch.tensor([8])


def test_the_bigram_model_is_what_the_example_assumes():
    probs = NGRAM.trie_probs(torch.tensor([[6], [7], [9]]), torch.tensor([[7, 8], [5, 6], [7, 8]]))
    assert probs.tolist() == [[0.5, 0.5], [1.0, 0.0], [0.0, 0.0]]


def test_hand_worked_example_with_the_ngram():
    # depth 0 (drafter only): [6] log .7 = -0.35667, [9] log .3 = -1.20397
    # depth 1, weight 2^-0.7 = 0.61557, logit weight 0.9:
    #   [6,7] -0.35667 + 0.61557 (0.9 log .6 + 0.5 log .5) = -0.85302
    #   [6,8] -1.07764 (8 = EOS)   [9,7] -1.20397 + 0.61557 (0.9 log .6 + 0.5 log 1e-10) = -8.57399   [9,8] -8.79863
    #   beams (EOS last): [6,7], [9,7]  -- by score alone they would be [6,7], [6,8]
    # depth 2, weight 3^-0.7 = 0.46346, logit weight 0.81; after 7: p_ngram(5) = 1, p_ngram(6) = 0
    #   [6,7,5] -0.89257   [6,7,6] -7.05323   [9,7,5] -8.61354   [9,7,6] -14.77420
    # pool of all 10; the best 6: [6] [6,7] [6,7,5] [6,8] [9] [6,7,6], kept in creation order
    tokens, parents, scores, logp = dart_tree_search(
        IDS, PROBS, torch.tensor([3, 5]), NGRAM, EOS, beam_width=2, total_tokens=6
    )
    assert tokens.tolist() == [6, 9, 7, 8, 5, 6]
    assert parents.tolist() == [-1, -1, 0, 0, 2, 2]
    torch.testing.assert_close(
        scores, torch.tensor([-0.35667, -1.20397, -0.85302, -1.07764, -0.89257, -7.05323]), atol=2e-4, rtol=0
    )
    torch.testing.assert_close(logp[4], torch.tensor(math.log(0.7 * 0.6 * 0.9)))  # the path's drafter log-prob


def test_hand_worked_example_without_the_ngram():
    # depth 1: [6,7] -0.63967 [6,8] -0.86431 [9,7] -1.48697 [9,8] -1.71161; beams [6,7], [9,7]
    # depth 2: [6,7,5] -0.67922 [6,7,6] -1.50407 [9,7,5] -1.52652 [9,7,6] -2.35137
    # best 6: [6] [6,7] [6,7,5] [6,8] [9] [9,7]
    tokens, parents, scores, _ = dart_tree_search(IDS, PROBS, torch.tensor([5]), None, EOS, 2, 6)
    assert tokens.tolist() == [6, 9, 7, 8, 7, 5]
    assert parents.tolist() == [-1, -1, 0, 0, 1, 2]
    torch.testing.assert_close(
        scores, torch.tensor([-0.35667, -1.20397, -0.63967, -0.86431, -1.48697, -0.67922]), atol=2e-4, rtol=0
    )


def test_ngram_on_the_first_token_is_the_option():
    tokens, _, scores, _ = dart_tree_search(IDS, PROBS, torch.tensor([5]), NGRAM, EOS, 2, 2, ngram_on_first=True)
    # after 5: p_ngram(6) = 1 -> [6] unchanged; p_ngram(9) = 0 -> [9] -1.20397 + 0.5 log 1e-10
    assert tokens.tolist() == [6, 7]
    assert float(scores[0]) == pytest.approx(-0.35667, abs=1e-4)


def _reference(ids, probs, context, ngram, eos, width, total):
    """The C++ loop re-stated with lists (order-2/3 trie rule through ``NGramModel.trie_probs``)."""
    cands, pool = [((), 0.0)], []
    for level in range(len(ids)):
        nxt = []
        for seq, score in cands:
            full = list(context) + list(seq)
            ctx = ngram.pad_context(full)
            pn = ngram.trie_probs(ctx[None], torch.tensor([ids[level]]))[0].tolist()
            for tok, p, q in zip(ids[level], probs[level], pn):
                term = math.log(p + 1e-10) * 0.9**level
                if level > 0:
                    term += 0.5 * math.log(q + 1e-10)
                nxt.append((seq + (tok,), score + (level + 1) ** -0.7 * term))
        pool += nxt
        nxt.sort(key=lambda c: (c[0][-1] in eos, -c[1]))
        cands = nxt[:width]
    best = sorted(pool, key=lambda c: -c[1])[:total]
    return {seq: score for seq, score in best}


@pytest.mark.parametrize("seed", range(6))
def test_equals_the_reference_loop_on_random_inputs(seed):
    rng = random.Random(seed)
    docs = [[rng.randrange(12) for _ in range(40)] for _ in range(3)]
    ngram = NGramModel.build(docs, 12, 3)
    D, K = 4, 5
    ids = [rng.sample(range(12), K) for _ in range(D)]
    raw = torch.rand(D, K, generator=torch.Generator().manual_seed(seed)).sort(descending=True).values
    probs = raw / raw.sum(-1, keepdim=True)
    context = [rng.randrange(12) for _ in range(3)]
    want = _reference(ids, probs.tolist(), context, ngram, {11}, 3, 15)
    tokens, parents, scores, _ = dart_tree_search(
        torch.tensor(ids), probs, torch.tensor(context), ngram, torch.tensor([11]), 3, 15
    )
    paths = {}
    for i, (t, p) in enumerate(zip(tokens.tolist(), parents.tolist())):
        paths[i] = (paths[p] if p >= 0 else ()) + (t,)  # parents come first: a valid tree
    got = {paths[i]: float(s) for i, s in enumerate(scores)}
    assert got.keys() == want.keys()
    for seq in want:
        assert got[seq] == pytest.approx(want[seq], abs=1e-4)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("total, order", [(4, 3), (9, 3), (9, 2)])
def test_beams_as_wide_as_the_tree_are_the_best_first_search(seed, total, order):
    """beam_width >= total_tokens takes the best-first path; it keeps the reference's tree."""
    rng = random.Random(seed)
    ngram = NGramModel.build([[rng.randrange(12) for _ in range(60)] for _ in range(3)], 12, order)
    D, K = 5, 4
    ids = [rng.sample(range(11), K) for _ in range(D)]  # no stop token among the candidates
    raw = torch.rand(D, K, generator=torch.Generator().manual_seed(seed)).sort(descending=True).values
    probs = raw / raw.sum(-1, keepdim=True)
    context = [rng.randrange(12) for _ in range(rng.randrange(4))]  # short ones padded with start symbols
    for model in (ngram, None):
        want = _reference(ids, probs.tolist(), context, ngram, {11}, total, total) if model else None
        tokens, parents, scores, logp = dart_tree_search(
            torch.tensor(ids), probs, torch.tensor(context, dtype=torch.long), model, torch.tensor([11]), total, total
        )
        paths, got = {}, {}
        for i, (t, p) in enumerate(zip(tokens.tolist(), parents.tolist())):
            assert p < i  # parents first
            paths[i] = (paths[p] if p >= 0 else ()) + (t,)
            got[paths[i]] = float(scores[i])
        assert len(got) == total
        if want is not None:
            assert got.keys() == want.keys()
            assert all(got[q] == pytest.approx(want[q], abs=1e-4) for q in want)
        # the drafter's log-probability along each path, as the beam search reports it
        drafter = {q: sum(math.log(float(probs[d, ids[d].index(t)]) + 1e-10) for d, t in enumerate(q)) for q in got}
        assert all(float(v) == pytest.approx(drafter[paths[i]], abs=1e-4) for i, v in enumerate(logp))


def test_the_best_first_search_does_not_grow_a_path_past_a_stop_token():
    tokens, parents, _, _ = dart_tree_search(IDS, PROBS, torch.tensor([5]), NGRAM, EOS, 6, 6)
    ends = [i for i, t in enumerate(tokens.tolist()) if t == 8]
    assert ends and not any(p in ends for p in parents.tolist())
    assert len(tokens) == 6


def test_a_certain_ngram_continuation_does_not_lift_a_child_above_its_parent():
    """p_ngram = 1 adds log(1 + 1e-10): 0 on both paths, so a child never outscores its parent."""
    ngram = NGramModel.build([[5, 6, 7]], vocab_size=10, order=2)  # after 6 always 7
    ids, probs = torch.tensor([[6, 8, 9], [7, 5, 4]]), torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]])
    for width in (3, 2):  # best-first, then the beams
        tokens, parents, scores, _ = dart_tree_search(ids, probs, torch.tensor([5]), ngram, torch.tensor([1]), width, 3)
        assert tokens.tolist() == [6, 8, 9] and parents.tolist() == [-1, -1, -1], width
        assert all(float(s) <= 0 for s in scores)


def test_settings_are_checked_in_one_line():
    with pytest.raises(ValueError, match=r"policy.beam_width must be an integer >= 1, got 0"):
        DartTreePolicy(beam_width=0, ngram_model=NGRAM)
    with pytest.raises(ConfigError, match=r"policy.ngram='/nonexistent.npz': no such file"):
        DartTreePolicy(ngram="/nonexistent.npz")
    assert DartTreePolicy(use_ngram=False, ngram="/nonexistent.npz").ngram_weight == 0.0
