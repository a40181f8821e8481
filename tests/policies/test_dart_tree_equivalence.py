"""DART's beam search (``policies/dart_tree.py``, compiled since issue 48 item 5, one call per search
since its host-work pass) against the numpy search it replaced, and its best-first search
(``beam_width >= total_tokens``, compiled) against the Python heap search it replaced, both kept
here verbatim: the same nodes, parents, scores and drafter log-probabilities, bit for bit, on
random passes, contexts, stop tokens and n-gram models (the bundled one included), exact ties
among them."""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from numba import njit

from specpolicy.core.compiled_dart import first_in_order
from specpolicy.models.ngram import NGramModel, _codes, _lookup, load_ngram, resolve_ngram_path
from specpolicy.policies.dart_tree import EPS, _best_set, dart_tree_search


class ReferenceTrie:
    """An ``NGramModel`` whose trie rule is the replaced numpy form (verbatim)."""

    def __init__(self, model: NGramModel) -> None:
        self.model, self.order, self.vocab_size = model, model.order, model.vocab_size

    def trie_probs_np_reference(self, context: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        m = self.model
        counts, followers = m._trie_arrays
        probs = np.zeros(tokens.shape, dtype=np.float32)
        found = np.zeros(tokens.shape, dtype=bool)
        for j in range(m.order - 1, 0, -1):
            code = _codes(context[:, -j:], m.base)  # (B,) the context suffix s of j tokens
            parent = _lookup(*counts[j - 1], code).astype(np.float32)
            parent = np.where(parent > 0, parent, _lookup(*followers[j - 1], code).astype(np.float32))
            child = _lookup(*counts[j], code[:, None] * m.base + tokens).astype(np.float32)  # (B, C)
            take = ~found & (child > 0)
            probs = np.where(take, child / np.maximum(parent, np.float32(1))[:, None], probs)
            found |= take
        return probs


def reference_dart_beams(
    ids: torch.Tensor,
    probs: torch.Tensor,
    context: torch.Tensor,
    ngram: Any | None,
    stop_ids: torch.Tensor,
    beam_width: int = 20,
    total_tokens: int = 60,
    level_power: float = -0.7,
    logit_decay: float = 0.9,
    ngram_weight: float = 0.5,
    ngram_on_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The replaced numpy beam search of ``dart_tree_search`` (verbatim, its best-first dispatch dropped)."""
    # numpy, not torch: a depth is ~20 operations on a few hundred entries, where numpy's per-call
    # cost (about 1 us against torch's 5-10 us) is most of the time (the reference runs host C++)
    ids_np = ids.cpu().numpy()
    D, K = ids_np.shape
    logp = np.log(probs.float().cpu().numpy() + np.float32(EPS))  # (D, K) float32
    ends_at = np.isin(ids_np, stop_ids.cpu().numpy())  # (D, K) candidates that end a path (EOS)
    ctx_np = context.cpu().numpy()
    order = ngram.order if ngram is not None else 1
    beams = np.empty((1, 0), dtype=np.int64)  # (B, l) the beams' paths
    beam_scores = np.zeros(1, dtype=np.float32)
    beam_drafter = np.zeros(1, dtype=np.float32)  # the path's drafter log-probability (the nodes' confidence)
    beam_nodes = np.full(1, -1, dtype=np.int64)  # each beam's number in the pool (-1: the root)
    pool_tokens, pool_parents, pool_scores, pool_drafter = [], [], [], []
    pooled = 0
    for level in range(D):
        B = beams.shape[0]
        term = np.float32(logit_decay**level) * np.broadcast_to(logp[level], (B, K))
        if ngram is not None and ngram_weight != 0 and (level > 0 or ngram_on_first):
            if order > 1:
                full = np.concatenate([np.broadcast_to(ctx_np, (B, ctx_np.shape[0])), beams], axis=1)[:, -(order - 1) :]
                pad = np.full((B, order - 1 - full.shape[1]), ngram.vocab_size, dtype=np.int64)
                ctx = np.concatenate([pad, full], axis=1)  # start symbols in front of a short context
            else:
                ctx = np.empty((B, 0), dtype=np.int64)
            p_ngram = ngram.trie_probs_np_reference(ctx, np.broadcast_to(ids_np[level], (B, K)))
            term = term + np.float32(ngram_weight) * np.log(p_ngram + np.float32(EPS))
        scores = (beam_scores[:, None] + np.float32((level + 1) ** level_power) * term).reshape(-1)  # (B K,)
        drafter = (beam_drafter[:, None] + logp[level][None]).reshape(-1)
        tokens = np.broadcast_to(ids_np[level], (B, K)).reshape(-1)
        parent_rows = np.repeat(np.arange(B), K)
        pool_tokens.append(tokens)
        pool_parents.append(beam_nodes[parent_rows])
        pool_scores.append(scores)
        pool_drafter.append(drafter)
        numbers = pooled + np.arange(B * K)
        pooled += B * K
        # beams: EOS-ending last, then by score (lexsort is stable: ties in creation order)
        ends = np.broadcast_to(ends_at[level], (B, K)).reshape(-1)
        keep = np.lexsort((-scores, ends))[:beam_width]
        beams = np.concatenate([beams[parent_rows[keep]], tokens[keep, None]], axis=1)
        beam_scores, beam_drafter, beam_nodes = scores[keep], drafter[keep], numbers[keep]
    tokens, parents = np.concatenate(pool_tokens), np.concatenate(pool_parents)
    scores, drafter = np.concatenate(pool_scores), np.concatenate(pool_drafter)
    kept = _best_set(scores, total_tokens)
    index = np.full(tokens.shape[0] + 1, -1, dtype=np.int64)  # index[c + 1]: pool entry c's node
    index[kept + 1] = np.arange(kept.shape[0])
    return (
        torch.from_numpy(tokens[kept]),
        torch.from_numpy(index[parents[kept] + 1]),
        torch.from_numpy(scores[kept]),
        torch.from_numpy(drafter[kept]),
    )


def reference_best_first(
    ids: torch.Tensor,
    probs: torch.Tensor,
    context: torch.Tensor,
    ngram: Any | None,
    stop_ids: torch.Tensor,
    total_tokens: int,
    level_power: float,
    logit_decay: float,
    ngram_weight: float,
    ngram_on_first: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The replaced Python best-first search of ``dart_tree_search`` (verbatim): the ``total_tokens`` best nodes by
    the same step score, popped best first from a heap (ties in push order); the nodes come out
    in pop order, parents first. Arguments and returns as ``dart_tree_search``."""
    ids_l = ids.tolist()
    logp = torch.log(probs.float() + EPS).tolist()
    D = len(ids_l)
    weight = [(level + 1) ** level_power for level in range(D)]
    decay = [logit_decay**level for level in range(D)]
    stops = set(stop_ids.tolist())
    use_ngram = ngram is not None and ngram_weight != 0
    if use_ngram:
        counts, parent_counts = ngram.trie_tables()
        order, base = ngram.order, ngram.base
        root_tail = tuple(ngram.pad_context(context.cpu()).tolist())  # the order - 1 tokens before depth 0
    else:
        order, root_tail = 1, ()

    def ngram_logs(tail: tuple[int, ...], level: int) -> list[float]:
        """``log(p_ngram + EPS)`` of depth ``level``'s candidates after ``tail`` (the trie rule:
        the longest suffix of ``tail`` the candidate was seen after; ``NGramModel.trie_probs``)."""
        suffixes = []  # (code of the j-token suffix, its trie count), j = order - 1 .. 1
        for j in range(order - 1, 0, -1):
            code = 0
            for t in tail[-j:]:
                code = code * base + t
            suffixes.append((code * base, counts[j], max(parent_counts[j - 1].get(code, 0), 1)))
        out = []
        for tok in ids_l[level]:
            p = 0.0
            for code, table, parent in suffixes:
                child = table.get(code + tok)
                if child:
                    p = child / parent
                    break
            out.append(math.log(p + EPS) if p < 1 else 0.0)  # log(1 + EPS) is 0 in the beams' float32
        return out

    heap: list[tuple[float, int, int, int, int, float, tuple[int, ...]]] = []
    pushed = 0

    def expand(level: int, node: int, score: float, drafter: float, tail: tuple[int, ...]) -> None:
        nonlocal pushed
        scored = use_ngram and (level > 0 or ngram_on_first)
        ngram_terms = ngram_logs(tail, level) if scored else None
        for c in range(len(ids_l[level])):
            term = decay[level] * logp[level][c]
            if ngram_terms is not None:
                term += ngram_weight * ngram_terms[c]
            heapq.heappush(
                heap, (-(score + weight[level] * term), pushed, level, c, node, drafter + logp[level][c], tail)
            )
            pushed += 1

    expand(0, -1, 0.0, 0.0, root_tail)
    tokens, parents, scores, drafter_logp = [], [], [], []
    while heap and len(tokens) < total_tokens:
        neg, _, level, c, parent, drafter, tail = heapq.heappop(heap)
        node, tok = len(tokens), ids_l[level][c]
        tokens.append(tok)
        parents.append(parent)
        scores.append(-neg)
        drafter_logp.append(drafter)
        if level + 1 < D and tok not in stops:
            expand(level + 1, node, -neg, drafter, (tail + (tok,))[1:] if order > 1 else ())
    return (
        torch.tensor(tokens, dtype=torch.long),
        torch.tensor(parents, dtype=torch.long),
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(drafter_logp, dtype=torch.float32),
    )


def _case(rng: random.Random, generator: torch.Generator, vocab: int, depth: int, k: int):
    ids = torch.stack([torch.randperm(vocab, generator=generator)[:k] for _ in range(depth)])
    raw = (torch.randn(depth, k, generator=generator) * rng.choice((0.5, 2.0, 5.0))).softmax(-1)
    probs = raw.sort(descending=True).values
    if rng.random() < 0.3:
        probs[:, 1:3] = probs[:, 1:2]  # exact ties
    probs = probs / probs.sum(-1, keepdim=True)
    context = torch.randint(0, vocab, (rng.randrange(0, 5),), generator=generator)
    return ids, probs, context


def _same(got, want) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def _random_search(rng: random.Random, generator: torch.Generator) -> tuple:
    """A random search's inputs: an n-gram model of random documents (vocabulary 12-80, order 1-4),
    a pass's top-k ids and probabilities with a context (``_case``), and 0-3 stop tokens."""
    vocab = rng.choice((12, 30, 80))
    order = rng.choice((1, 2, 3, 4))
    docs = [[rng.randrange(vocab) for _ in range(rng.randrange(5, 60))] for _ in range(rng.randrange(1, 8))]
    model = NGramModel.build(docs, vocab, order)
    depth, k = rng.randrange(1, 9), rng.randrange(1, min(vocab, 26))
    ids, probs, context = _case(rng, generator, vocab, depth, k)
    stops = torch.tensor(rng.sample(range(vocab), rng.choice((0, 1, 3))), dtype=torch.long)
    return model, ids, probs, context, stops


@pytest.mark.parametrize("seed", range(24))
def test_the_beam_search_is_the_numpy_search(seed):
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    model, ids, probs, context, stops = _random_search(rng, generator)
    width = rng.choice((1, 3, 20))
    total = width + rng.randrange(1, 50)  # beams narrower than the tree: the beam search
    weight, on_first = rng.choice((0.0, 0.5, 1.5)), rng.random() < 0.3
    for use in (model, None):
        got = dart_tree_search(ids, probs, context, use, stops, width, total, -0.7, 0.9, weight, on_first)
        ref = ReferenceTrie(model) if use is not None else None
        want = reference_dart_beams(ids, probs, context, ref, stops, width, total, -0.7, 0.9, weight, on_first)
        _same(got, want)


def test_the_beam_search_on_the_bundled_ngram_is_the_numpy_search():
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    generator = torch.Generator().manual_seed(0)
    for depth in (8, 15):
        logits = torch.randn(depth, model.vocab_size, generator=generator) * 3
        probs, ids = logits.softmax(-1).topk(25, dim=-1)
        probs = probs / probs.sum(-1, keepdim=True)
        ids[:, 0] = torch.tensor([220, 16, 17, 13, 11, 18, 220, 16] * 2)[:depth]  # common continuations
        for context in (torch.tensor([5, 220, 16]), torch.tensor([], dtype=torch.long)):
            stops = torch.tensor([model.vocab_size - 1, 13])
            got = dart_tree_search(ids, probs, context, model, stops, 20, 60)
            want = reference_dart_beams(ids, probs, context, ReferenceTrie(model), stops, 20, 60)
            _same(got, want)


@pytest.mark.parametrize("seed", range(8))
def test_the_next_beams_are_the_stable_sorts_first(seed):
    """``compiled_dart.first_in_order`` (the beam search's insertion into the beam width) against the stable sort it replaced: the
    non-ending children by score, then the ending ones, ties in creation order, NaN last in its group."""
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 8))
    n = K * int(rng.integers(1, 12))
    scores = (np.round(rng.normal(size=n) * 2) / 2).astype(np.float32)  # ties
    scores[rng.random(n) < 0.1] = np.nan
    ends = rng.random(K) < 0.3
    order = []
    for stop in (False, True):
        picked = np.array([i for i in range(n) if ends[i % K] == stop], dtype=np.int64)
        order += picked[np.argsort(-scores[picked], kind="mergesort")].tolist()
    for m in (1, 3, min(20, n), n):
        assert first_in_order(scores, ends, K, m).tolist() == order[:m]


@pytest.mark.parametrize("seed", range(24))
def test_the_best_first_search_is_the_python_heap_search(seed):
    """Beams as wide as the tree: the compiled best-first search against the Python ``heapq`` one
    (float64 scores, the trie's counts as dicts), on random and tie-heavy passes."""
    rng = random.Random(100 + seed)
    generator = torch.Generator().manual_seed(100 + seed)
    model, ids, probs, context, stops = _random_search(rng, generator)
    total = rng.randrange(1, 40)
    weight, on_first = rng.choice((0.0, 0.5, 1.5)), rng.random() < 0.3
    for use in (model, None):
        got = dart_tree_search(
            ids, probs, context, use, stops, total + rng.randrange(3), total, -0.7, 0.9, weight, on_first
        )
        want = reference_best_first(ids, probs, context, use, stops, total, -0.7, 0.9, weight, on_first)
        _same(got, want)


def test_the_best_first_search_on_the_bundled_ngram_is_the_python_heap_search():
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    generator = torch.Generator().manual_seed(1)
    for depth, total in ((8, 16), (15, 24), (15, 60)):
        logits = torch.randn(depth, model.vocab_size, generator=generator) * 3
        probs, ids = logits.softmax(-1).topk(25, dim=-1)
        probs = probs / probs.sum(-1, keepdim=True)
        ids[:, 0] = torch.tensor([220, 16, 17, 13, 11, 18, 220, 16] * 2)[:depth]  # common continuations
        for context in (torch.tensor([5, 220, 16]), torch.tensor([], dtype=torch.long)):
            stops = torch.tensor([model.vocab_size - 1, 13])
            got = dart_tree_search(ids, probs, context, model, stops, total, total)
            _same(got, reference_best_first(ids, probs, context, model, stops, total, -0.7, 0.9, 0.5, False))


def test_the_trie_logs_are_the_logs_of_the_trie_probabilities():
    """``NGramModel.trie_logs``: an (order)-gram entry's float32 log is numpy's log of
    ``trie_probs_np``'s float32 probability + EPS after its own context; every entry's float64 log
    is ``math.log(p + EPS)`` (0 for p >= 1) of the probability the dict tables give it."""
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    keys, _, starts = model.compiled_trie()[:3]
    logs32, logs64 = model.trie_logs(EPS)
    counts, parents = model.trie_tables()
    rng = np.random.default_rng(0)
    j = model.order - 1
    entries = rng.integers(starts[j], starts[j + 1], size=300)
    context = np.stack([(keys[entries] // model.base ** (j - i)) % model.base for i in range(j)], axis=1)
    p = model.trie_probs_np(context, (keys[entries] % model.base)[:, None])[:, 0]
    assert (p > 0).all() and np.array_equal(np.log(p + np.float32(EPS)), logs32[entries])
    for j in range(1, model.order):
        for e in rng.integers(starts[j], starts[j + 1], size=300).tolist():
            key = int(keys[e])
            p = counts[j][key] / max(parents[j - 1].get(key // model.base, 0), 1)
            assert logs64[e] == (math.log(p + EPS) if p < 1 else 0.0)
    with pytest.raises(ValueError, match="eps"):
        model.trie_logs(0.0)


@pytest.mark.parametrize("seed", range(8))
def test_the_nth_largest_is_the_partitions(seed):
    """``compiled_dart.nth_largest`` (a min-heap of the n largest) against ``np.partition`` on tie-heavy
    scores, NaN among them or not; ``best_indices`` against ``_best_set``."""
    from specpolicy.core.compiled_dart import best_indices, nth_largest

    rng = np.random.default_rng(seed)
    for _ in range(20):
        P = int(rng.integers(1, 400))
        scores = (np.round(rng.normal(size=P) * 3) / 2).astype(np.float32)  # ties
        if rng.random() < 0.2:
            scores[rng.random(P) < 0.05] = np.nan
        for n in {1, int(rng.integers(1, P + 1)), P}:
            want = np.partition(scores, P - n)[P - n]
            got = nth_largest(scores, n)
            assert got == want or (np.isnan(got) and np.isnan(want))
            assert np.array_equal(best_indices(scores, n), _best_set(scores, n))


@pytest.mark.parametrize("seed", range(6))
def test_the_trie_hash_finds_what_the_sorted_search_finds(seed):
    """``compiled_ngram.trie_hash`` / ``trie_find`` (DART's n-gram lookups by hash) against the leftmost
    binary search of each order's sorted keys they replaced: every key held (a repeated key: its
    first index) and absent keys (between, beyond, of another order) alike, on random tries."""
    from specpolicy.core import compiled_ngram

    rng = np.random.default_rng(seed)
    sizes = [int(x) for x in rng.integers(0, 300, size=int(rng.integers(1, 5)))]
    orders = [np.sort(rng.integers(0, 10 ** (j + 2), size=n)).astype(np.int64) for j, n in enumerate(sizes)]
    keys = np.concatenate([np.zeros(0, np.int64), *orders])
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    table, offsets = compiled_ngram.trie_hash(keys, starts)

    @njit
    def find(table, offsets, order, key):
        return compiled_ngram.trie_find(table, offsets, order, key)

    for j, order_keys in enumerate(orders):
        probes = np.concatenate([order_keys, rng.integers(0, 10 ** (j + 3), size=200), [-5]]).astype(np.int64)
        for key in probes:
            at = int(np.searchsorted(order_keys, key))
            want = int(starts[j]) + at if at < order_keys.shape[0] and order_keys[at] == key else -1
            assert find(table, offsets, j, int(key)) == want
