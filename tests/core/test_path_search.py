"""DiffuSpec's causal-consistency path search (specpolicy.core.path_search) against a plain-Python
re-statement of the reference rule (arXiv 2510.02358 §4.2, Eqs. 7-8, as the reproduction
``pluto0x0/DiffuSpec`` reads it: mass-pruned candidate sets, EOS always kept, the lattice ending at
the first position whose own set holds EOS, a width-W beam with finished paths competing), a
hand-worked example, and the lattice's edge cases."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specpolicy.core.path_search import PathSearch, candidate_lattice


class TableScorer:
    """A bigram scorer: ``log p(token | last context token)`` from a fixed ``(V + 1, V)`` table."""

    order = 2

    def __init__(self, table: torch.Tensor) -> None:
        self.table, self.vocab_size = table, table.shape[1]

    def log_probs(self, context, tokens):
        return self.table[context[:, -1]].gather(1, tokens)


def reference_cps(probs, prev, scorer, stop, mass, max_candidates, width, lam):
    """The rule in plain Python, one hypothesis at a time."""
    sets = []
    for row in probs.tolist():
        ranked = sorted(range(len(row)), key=lambda t: -row[t])[:max_candidates]
        kept, total = [], 0.0
        for t in ranked:
            if total >= mass:
                break
            kept.append(t)
            total += row[t]
        natural = stop in kept
        if not natural:
            kept.append(stop)
        sets.append([(t, math.log(row[t])) for t in kept])
        if natural:
            break
    beams = [([], 0.0, False)]
    for candidates in sets:
        grown = []
        for tokens, score, done in beams:
            if done:
                grown.append((tokens, score, done))
                continue
            last = tokens[-1] if tokens else prev
            for t, lq in candidates:
                ng = float(scorer.table[last, t])
                grown.append((tokens + [t], score + lam * lq + (1 - lam) * ng, t == stop))
        grown.sort(key=lambda b: -b[1])
        beams = grown[:width]
        if all(b[2] for b in beams):
            break
    return beams[0][0]


@pytest.mark.parametrize("seed", range(12))
def test_the_search_equals_the_reference_rule(seed):
    rng = torch.Generator().manual_seed(seed)
    vocab, stop, n = 9, 8, 6
    logits = torch.randn(n, vocab, generator=rng) * 2.0
    if seed % 3 == 0:
        logits[3, stop] += 6.0  # a likely EOS at position 3: the lattice ends there
    probs = torch.softmax(logits, -1)
    table = torch.log_softmax(torch.randn(vocab + 1, vocab, generator=rng) * 2.0, -1)
    scorer = TableScorer(table)
    settings = dict(
        mass=random.Random(seed).choice([0.5, 0.8, 0.95]),
        max_candidates=random.Random(seed).choice([2, 4, 15]),
        width=random.Random(seed).choice([1, 3, 5]),
        lam=random.Random(seed).choice([0.0, 0.5, 0.8]),
    )
    search = PathSearch(
        scorer, torch.tensor([stop]), settings["mass"], settings["max_candidates"], settings["width"], settings["lam"]
    )
    path, q, ended = search.search(probs, torch.tensor([2]))
    want = reference_cps(probs, 2, scorer, stop, **settings)
    assert path.tolist() == want
    assert torch.allclose(q, probs[torch.arange(len(want)), torch.tensor(want, dtype=torch.long)])
    assert ended == (len(want) < n or (bool(want) and want[-1] == stop))


def test_a_hand_worked_example():
    # vocab: 0 "the", 1 "a", 2 "cat", 3 EOS. Position 0: the 0.6, a 0.4; position 1: cat 0.9, EOS 0.1.
    probs = torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.9, 0.1]])
    table = torch.full((5, 4), math.log(0.01))
    table[4, 1] = math.log(0.9)  # after the context token 4, the n-gram strongly prefers "a"
    table[1, 2] = table[0, 2] = math.log(0.5)
    scorer = TableScorer(table)
    # lambda 0.5: "a" scores 0.5 ln 0.4 + 0.5 ln 0.9 = -0.51 against "the" 0.5 ln 0.6 + 0.5 ln 0.01 = -2.56
    path, q, ended = PathSearch(scorer, torch.tensor([3]), lam=0.5).search(probs, torch.tensor([4]))
    assert path.tolist() == [1, 2] and q.tolist() == pytest.approx([0.4, 0.9]) and not ended
    # lambda 1: the drafter alone, its argmax
    path, _, _ = PathSearch(scorer, torch.tensor([3]), lam=1.0).search(probs, torch.tensor([4]))
    assert path.tolist() == [0, 2]


def test_the_lattice_mass_cap_and_stop_tokens():
    probs = torch.tensor(
        [
            [0.5, 0.3, 0.15, 0.05, 0.0],  # mass 0.8 reached by {0, 1}; EOS 4 added (prob 0)
            [0.1, 0.1, 0.1, 0.1, 0.6],  # EOS ranks first on its own: the lattice ends here
            [0.9, 0.1, 0.0, 0.0, 0.0],
        ]
    )
    cols, log_q, valid = candidate_lattice(probs, 0.8, 3, torch.tensor([4]))
    assert cols.shape[0] == 2  # ended at position 1
    assert {int(c) for c, v in zip(cols[0], valid[0]) if v} == {0, 1, 4}
    kept1 = [int(c) for c, v in zip(cols[1], valid[1]) if v]
    assert kept1[0] == 4 and len(kept1) == 3 and kept1.count(4) == 1  # capped at 3, EOS not added twice
    assert torch.allclose(log_q[0, :2].exp(), torch.tensor([0.5, 0.3]))
    cols, _, valid = candidate_lattice(probs, 0.8, 1, torch.empty(0, dtype=torch.long))
    assert cols.shape == (3, 1) and valid.all()  # no stop tokens: every position, top-1 only


def test_a_short_context_is_padded_with_start_symbols_and_order_1_is_refused():
    rng = torch.Generator().manual_seed(1)
    vocab = 9
    table = torch.log_softmax(torch.randn(vocab + 1, vocab, generator=rng) * 2.0, -1)
    probs = torch.softmax(torch.randn(4, vocab, generator=rng), -1)
    search = PathSearch(TableScorer(table), torch.tensor([8]), lam=0.3)
    empty = search.search(probs, torch.empty(0, dtype=torch.long))
    padded = search.search(probs, torch.tensor([vocab]))  # the start symbol, given
    assert torch.equal(empty[0], padded[0])

    class Unigram(TableScorer):
        order = 1

    with pytest.raises(ValueError, match="order >= 2"):
        PathSearch(Unigram(table), torch.tensor([8]))
