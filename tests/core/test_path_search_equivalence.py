"""The vectorised host searches against the implementations they replaced, kept here verbatim as
references (issue 48, item 5: host work per round): DiffuSpec's CPS beam loop
(``PathSearch.search``, numpy bookkeeping and a compiled lattice since) and the Kneser-Ney scorer (``NGramModel.log_probs``,
numpy arithmetic since). Outputs must be IDENTICAL (bit for bit), on random lattices, contexts,
draft vocabularies and n-gram models."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from numba import njit

from specpolicy.core.compiled import kneser_ney_row
from specpolicy.core.path_search import PathSearch, _beam_step, _best, candidate_lattice
from specpolicy.models.ngram import NGramModel, _lookup, load_ngram, resolve_ngram_path

# -- the replaced implementations (verbatim, as methods' bodies taking ``self``) ----------------------


@torch.no_grad()
def reference_search(
    self, probs: torch.Tensor, context: torch.Tensor, token_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The best path through one pass's lattice.

    Args:
        probs: ``(n, V)`` float32, the drafter's distribution at each drafted position.
        context: ``(order - 1,)`` int64, the tokens before the first drafted position
            (committed tokens, then any drafted earlier this round; ``NGramModel.pad_context``).
        token_ids: ``(V,)`` int64, the token id of each column of ``probs`` (a draft vocabulary's
            ``d2t``); None: column i is token i.
    Returns:
        ``path`` ``(m,)`` int64 (``m <= n``; shorter when the lattice or the path ended at a stop
        token), ``q`` ``(m,)`` float32 the drafter's probability of each path token (its
        confidence), and whether the lattice ended early (a stop token, or the path's end).
    """
    stop_cols = self.stop_ids if token_ids is None else torch.isin(token_ids, self.stop_ids).nonzero().flatten()
    cols, log_q, valid = candidate_lattice(probs, self.mass, self.max_candidates, stop_cols)
    tokens = (cols if token_ids is None else token_ids[cols]).cpu()  # the search runs on the host
    m, width, order = tokens.shape[0], self.width, self.scorer.order
    log_q, valid, stops = log_q.cpu().double(), valid.cpu(), self.stop_ids.cpu()
    drafter_term = torch.where(valid, self.lam * log_q, -torch.inf)  # (m, M): invalid slots never chosen
    # W beam slots from the start; the empty ones score -inf and are never preferred
    scores = torch.full((width,), -torch.inf, dtype=torch.float64)
    scores[0] = 0.0
    done = torch.zeros(width, dtype=torch.bool)
    paths = torch.full((width, m), -1, dtype=torch.long)
    history = context.reshape(1, -1).cpu()[:, max(context.numel() - (order - 1), 0) :]
    if history.shape[1] < order - 1:  # a short context: start symbols in front (``NGramModel.pad_context``)
        pad = torch.full((1, order - 1 - history.shape[1]), self.scorer.vocab_size, dtype=torch.long)
        history = torch.cat([pad, history], dim=1)
    history = history.expand(width, -1)
    for i in range(m):
        cand = tokens[i]  # (M,)
        lp = self.scorer.log_probs(history, cand.expand(width, -1)).double()  # (W, M)
        step = torch.where(done[:, None], -torch.inf, scores[:, None] + drafter_term[i] + (1 - self.lam) * lp)
        top = torch.cat([step.flatten(), torch.where(done, scores, -torch.inf)]).topk(width)
        extended = top.indices < step.numel()  # else a finished path carried as it stands
        rows = torch.where(extended, top.indices // cand.numel(), top.indices - step.numel())
        new = torch.where(extended, cand[top.indices % cand.numel()], -1)
        paths = paths[rows]
        paths[:, i] = new
        last = torch.where(extended, new, history[rows, -1])
        history = torch.cat([history[rows, 1:], last[:, None]], dim=1)
        scores, done = top.values, torch.where(extended, torch.isin(new, stops), True)
        if bool(done.all()):
            break
    best = paths[int(scores.argmax())]
    path = best[best >= 0]
    # each path token's drafter probability: the lattice slot it was taken from
    picked = (tokens[: path.numel()] == path[:, None]) & valid[: path.numel()]
    q = torch.where(picked, log_q[: path.numel()].exp(), 0).sum(-1).float()
    ended = path.numel() < probs.shape[0] or (path.numel() > 0 and bool(torch.isin(path[-1:], stops).any()))
    return path.to(probs.device), q.to(probs.device), ended


@njit(cache=True)
def reference_beams_kneser_ney(
    tokens: np.ndarray,
    drafter_term: np.ndarray,
    context: np.ndarray,
    stops: np.ndarray,
    width: int,
    weight: float,
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    order: int,
) -> np.ndarray:
    """The path search's beams with an ``NGramModel`` scorer as first compiled (the per-beam kernel,
    kept here as the shared-beam search's reference): each position's scores are ``kneser_ney_row``
    per beam, logged as ``log_probs`` returns them (float32, then float64)."""
    m, size = tokens.shape
    scores = np.full(width, -np.inf)
    scores[0] = 0.0
    done = np.zeros(width, dtype=np.bool_)
    paths = np.full((width, m), -1, dtype=np.int64)
    history = np.empty((width, context.shape[0]), dtype=np.int64)
    for w in range(width):
        history[w] = context
    lp = np.empty((width, size))
    row = np.empty(size)
    for i in range(m):
        cand = tokens[i].copy()
        for w in range(width):
            kneser_ney_row(
                keys, values, discounts, unigram_total, unigram_types, vocab_size, base, order, history[w], cand, row
            )
            for c in range(size):
                lp[w, c] = np.float64(np.float32(np.log(row[c])))
        if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, stops):
            break
    return _best(paths, scores)


def reference_log_probs(self, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Interpolated Kneser-Ney log-probability of each candidate after its context.

    Every count the estimate reads (the candidates' n-grams and their prefixes' totals and
    types, all orders) is looked up in one ``searchsorted`` over ``_fused_tables``.

    Args:
        context: ``(B, order - 1)`` int64 (``pad_context``).
        tokens: ``(B, C)`` int64 candidates, each in ``0..vocab_size - 1``.
    Returns:
        ``(B, C)`` float32 natural-log probabilities; for any context they sum (in probability)
        to 1 over the vocabulary.
    """
    batch, width = tokens.shape
    offset, base = self.base**self.order, self.base
    queries, prefix = [tokens.reshape(-1)], torch.zeros(batch, dtype=torch.long)
    for n in range(2, self.order + 1):
        prefix = context[:, -(n - 1)] * base ** (n - 2) + prefix  # the code of the last n - 1 context tokens
        table = 3 * (n - 1) * offset
        queries += [
            ((prefix[:, None] * base + tokens) + table).reshape(-1),
            prefix + table + offset,
            prefix + table + 2 * offset,
        ]
    values = _lookup(*self._fused, torch.cat(queries).contiguous()).split([len(q) for q in queries])
    t = self._kn[0]
    total, types, d = float(t["totals"].sum()), float(t["types"].sum()), float(t["discount"])
    probs = ((values[0].view(batch, width) - d).clamp(min=0) + d * types / self.vocab_size) / total
    for n in range(2, self.order + 1):  # each order's counts, its prefixes' totals and types
        count, total, types = (
            values[3 * n - 5].view(batch, width),
            values[3 * n - 4][:, None],
            values[3 * n - 3][:, None],
        )
        d = float(self._kn[n - 1]["discount"])
        mixed = ((count - d).clamp(min=0) + d * types * probs) / total.clamp(min=1)
        probs = torch.where(total > 0, mixed, probs)
    return probs.log().to(torch.float32)


class ReferenceScorer:
    """An ``NGramModel`` whose ``log_probs`` is the replaced torch form."""

    def __init__(self, model: NGramModel) -> None:
        self.model, self.order, self.vocab_size = model, model.order, model.vocab_size

    def log_probs(self, context, tokens):
        return reference_log_probs(self.model, context, tokens)


def _model(seed: int, vocab: int, order: int = 3) -> NGramModel:
    rng = random.Random(seed)
    documents = [[rng.randrange(vocab - 1) for _ in range(rng.randrange(2, 40))] for _ in range(rng.randrange(3, 20))]
    return NGramModel.build(documents, vocab, order)


@pytest.mark.parametrize("seed", range(8))
def test_the_scorer_is_bit_identical_to_the_torch_form(seed):
    torch.manual_seed(seed)
    vocab = 5 + seed * 3
    for order in (2, 3):
        model = _model(seed, vocab, order)
        batch, width = 1 + seed, 1 + 2 * seed
        context = torch.randint(0, vocab + 1, (batch, order - 1))  # start symbols (vocab) included
        tokens = torch.randint(0, vocab, (batch, width))
        got = model.log_probs(context, tokens)
        want = reference_log_probs(model, context, tokens)
        assert got.dtype == want.dtype == torch.float32
        assert torch.equal(got, want)
        # expanded (stride-0) inputs, as the old search passed them
        got = model.log_probs(context[:1].expand(3, -1), tokens[0].expand(3, -1))
        assert torch.equal(got, reference_log_probs(model, context[:1].expand(3, -1), tokens[0].expand(3, -1)))


def test_the_bundled_scorer_is_bit_identical_to_the_torch_form():
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    torch.manual_seed(0)
    for batch, width in ((3, 16), (20, 25), (1, 1)):
        context = torch.randint(0, model.vocab_size + 1, (batch, 2))
        context[0] = torch.tensor([220, 16])  # a common context: the higher orders' counts are read
        tokens = torch.randint(0, model.vocab_size, (batch, width))
        assert torch.equal(model.log_probs(context, tokens), reference_log_probs(model, context, tokens))


def _lattice_probs(generator: torch.Generator, n: int, vocab: int, sharp: float) -> torch.Tensor:
    return (torch.randn(n, vocab, generator=generator) * sharp).softmax(-1)


@pytest.mark.parametrize("seed", range(30))
def test_the_path_search_is_identical_to_the_all_torch_loop(seed):
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    vocab = rng.choice((7, 12, 40))
    model = _model(seed, vocab, rng.choice((2, 3)))
    stop = torch.tensor(rng.sample(range(vocab), rng.choice((0, 1, 2))), dtype=torch.long)
    search = PathSearch(
        model,
        stop,
        mass=rng.choice((0.5, 0.8, 1.0)),
        max_candidates=rng.choice((1, 3, 15)),
        width=rng.choice((1, 2, 3, 5)),
        lam=rng.choice((0.0, 0.5, 0.8, 1.0)),
    )
    reference = PathSearch(ReferenceScorer(model), stop, search.mass, search.max_candidates, search.width, search.lam)
    for _ in range(6):
        n = rng.randrange(1, 16)
        probs = _lattice_probs(generator, n, vocab, rng.choice((0.5, 3.0, 8.0)))
        context = torch.randint(0, vocab, (rng.randrange(0, 4),), generator=generator)
        token_ids = torch.randperm(vocab, generator=generator) if rng.random() < 0.3 else None  # a d2t map
        path, q, ended = search.search(probs, context, token_ids)
        want_path, want_q, want_ended = reference_search(reference, probs, context, token_ids)
        assert torch.equal(path, want_path) and torch.equal(q, want_q) and ended == want_ended


def test_the_path_search_on_the_bundled_scorer_is_identical():
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    stop = torch.tensor([model.vocab_size - 1])
    generator = torch.Generator().manual_seed(0)
    for lam in (0.5, 0.8):
        search = PathSearch(model, stop, lam=lam)
        reference = PathSearch(ReferenceScorer(model), stop, lam=lam)
        for sharp in (2.0, 6.0):
            probs = _lattice_probs(generator, 15, model.vocab_size, sharp)
            context = torch.tensor([220, 16])
            got, want = search.search(probs, context), reference_search(reference, probs, context)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
    assert candidate_lattice  # the lattice is shared, unchanged


@pytest.mark.parametrize("seed", range(12))
def test_the_path_search_over_a_smaller_draft_vocabulary_is_identical(seed):
    """A ``d2t`` that maps a draft vocabulary of fewer columns into the target's (not a bijection):
    a stop token may have no column, or the lattice's stop slots follow the columns that map to one;
    long lattices (up to 32 positions, up to 15 + 2 candidates) put slots on every side of the
    vectorised kernels' chunk boundaries."""
    rng = random.Random(100 + seed)
    generator = torch.Generator().manual_seed(100 + seed)
    vocab = rng.choice((12, 40))
    model = _model(seed, vocab, 3)
    stop = torch.tensor(rng.sample(range(vocab), 2), dtype=torch.long)
    search = PathSearch(model, stop, mass=rng.choice((0.8, 0.95)), max_candidates=rng.choice((7, 15)), lam=0.5)
    reference = PathSearch(ReferenceScorer(model), stop, search.mass, search.max_candidates, search.width, search.lam)
    columns = rng.randrange(vocab // 2, vocab)
    d2t = torch.tensor(sorted(rng.sample(range(vocab), columns)), dtype=torch.long)  # a subset of the tokens
    for _ in range(4):
        probs = _lattice_probs(generator, rng.randrange(1, 33), columns, rng.choice((0.5, 3.0)))
        context = torch.randint(0, vocab, (3,), generator=generator)
        got, want = search.search(probs, context, d2t), reference_search(reference, probs, context, d2t)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]


@pytest.mark.parametrize("seed", range(20))
def test_dart_pool_selection_is_the_stable_sort_s(seed):
    """``dart-tree``'s pool selection (a partition) keeps the set the stable argsort kept."""
    from specpolicy.policies.dart_tree import _best_set

    rng = random.Random(seed)
    size = rng.randrange(1, 400)
    levels = rng.choice((3, 50, 10_000))  # few distinct values: many ties
    scores = (torch.randint(0, levels, (size,)).float() / levels - 1.0).numpy()
    for n in (1, 2, 16, 60, size, size + 5):
        want = np.sort(np.argsort(-scores, kind="stable")[:n])
        assert np.array_equal(_best_set(scores, n), want), (size, n)


@pytest.mark.parametrize("seed", range(24))
def test_the_shared_beam_scoring_is_the_per_beam_kernel(seed):
    """``_beams_kneser_ney_shared`` (the unigram stage once per position, a repeated history's row
    copied, no row for finished or empty beams) against ``reference_beams_kneser_ney`` (every beam scored by
    ``kneser_ney_row``): the same path on random and tie-heavy lattices (drafter terms from a few
    values, candidates repeating across positions so beams share histories), every weight (lambda 1
    included: ``0 * -inf``), narrow lattices that leave beam slots empty, stop tokens."""
    from specpolicy.core.path_search import _beams_kneser_ney_shared, search_tables

    rng = np.random.default_rng(seed)
    vocab = int(rng.choice((6, 12, 40)))
    model = _model(seed, vocab, int(rng.choice((2, 3))))
    tables = model.compiled_tables()
    for _ in range(20):
        m, size = int(rng.integers(1, 20)), int(rng.integers(1, 8))
        tokens = rng.integers(0, int(rng.choice((2, vocab))), size=(m, size)).astype(np.int64)  # repeats
        levels = np.log(np.array([1e-30, 0.05, 0.25, 0.5, 1.0]))
        term = rng.choice(levels, size=(m, size)) if rng.random() < 0.5 else np.log(rng.random((m, size)))
        term[rng.random((m, size)) < 0.3] = -np.inf  # invalid slots (an empty beam when few are valid)
        lam = float(rng.choice((0.0, 0.5, 0.8, 1.0)))
        width = int(rng.choice((1, 2, 3, 5)))
        stops = rng.choice(vocab, size=int(rng.integers(0, 3)), replace=False).astype(np.int64)
        context = rng.integers(0, vocab + 1, size=model.order - 1).astype(np.int64)
        args = (tokens, lam * term, context, stops, width, 1.0 - lam)
        got = _beams_kneser_ney_shared(*args, *search_tables(tables))
        assert np.array_equal(got, reference_beams_kneser_ney(*args, *tables))


def _tie_heavy_rows(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """``(n, vocab)`` float32 rows: softmax-like, or a few repeated levels (ties in and across the top),
    with zeros, infinities and NaNs of both signs in some."""
    kind = rng.integers(0, 4)
    if kind == 0:
        rows = rng.standard_normal((n, vocab)) * rng.choice((0.5, 4.0))
        rows = np.exp(rows - rows.max(1, keepdims=True))
        return (rows / rows.sum(1, keepdims=True)).astype(np.float32)
    rows = rng.choice(np.array([0.0, 1e-31, 0.01, 0.02, 0.25, 0.5], dtype=np.float32), size=(n, vocab))
    if kind >= 2:  # specials at random places
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, -0.5], dtype=np.float32)
        at = rng.random((n, vocab)) < rng.choice((0.001, 0.02))
        rows[at] = rng.choice(specials, size=int(at.sum()))
    return rows


@pytest.mark.parametrize("seed", range(16))
def test_the_row_top_k_is_torch_topk_ties_included(seed):
    """``_row_topk`` (the unique-answer shortcut, the in-place heap select, ``nth_element``) against
    ``torch.topk`` on the CPU: the same values and indices in the same order, on softmax rows and on
    rows of a few repeated values with NaNs of both signs, infinities and zeros."""
    from specpolicy.core.path_search_kernels import _heap_topk, _row_topk, _unique_topk

    rng = np.random.default_rng(seed)
    for _ in range(12):
        top = int(rng.choice((1, 3, 15)))
        vocab = int(rng.choice((top, 40, 64 * top, 64 * top + 7, 1024, 4096 + 5)))
        rows = _tie_heavy_rows(rng, 4, vocab)
        for row in rows:
            want = torch.from_numpy(row).topk(top)
            vals, idx = np.empty(top, dtype=np.float32), np.empty(top, dtype=np.int64)
            _row_topk(row, top, vals, idx)
            assert np.array_equal(vals, want.values.numpy(), equal_nan=True)
            assert np.array_equal(idx, want.indices.numpy()), (vocab, top)
            if top * 64 <= vocab:
                _heap_topk(row, top, vals, idx)
                assert np.array_equal(idx, want.indices.numpy())
                if _unique_topk(row, top, vals, idx):
                    assert np.array_equal(idx, want.indices.numpy())


@pytest.mark.parametrize("seed", range(8))
def test_the_path_search_over_a_large_vocabulary_is_identical(seed):
    """Vocabularies of at least 64 x the candidates (the top-k's heap path and its unique-answer
    shortcut), softmax rows and rows of few distinct values (ties at the lattice's edge), against
    the all-torch loop; and the path's probabilities computed by torch whatever the exp's margin
    (``_finish``'s fallback forced by a huge ``EXP_ULPS``) are the same."""
    import specpolicy.core.path_search as path_search

    rng = random.Random(200 + seed)
    generator = torch.Generator().manual_seed(200 + seed)
    vocab = rng.choice((1024, 1500))
    model = _model(seed, vocab, 3)
    stop = torch.tensor(rng.sample(range(vocab), rng.choice((1, 2))), dtype=torch.long)
    search = PathSearch(model, stop, mass=rng.choice((0.8, 0.95)), max_candidates=rng.choice((5, 15)), lam=0.5)
    reference = PathSearch(ReferenceScorer(model), stop, search.mass, search.max_candidates, search.width, search.lam)
    for _ in range(4):
        n = rng.randrange(1, 33)
        if rng.random() < 0.5:
            probs = _lattice_probs(generator, n, vocab, rng.choice((0.5, 3.0, 8.0)))
        else:  # a few levels: ties among the top and at the mass boundary
            levels = torch.tensor([0.0, 1e-4, 1e-3, 0.01, 0.05])
            probs = levels[torch.randint(0, 5, (n, vocab), generator=generator)]
            probs = probs / probs.sum(-1, keepdim=True)
        context = torch.randint(0, vocab, (rng.randrange(0, 4),), generator=generator)
        want = reference_search(reference, probs, context)
        got = search.search(probs, context)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
        ulps = path_search.EXP_ULPS
        try:
            path_search.EXP_ULPS = 1e300  # every exp "near a boundary": torch computes q
            forced = search.search(probs, context)
        finally:
            path_search.EXP_ULPS = ulps
        assert torch.equal(forced[0], want[0]) and torch.equal(forced[1], want[1]) and forced[2] == want[2]


@pytest.mark.parametrize("seed", range(6))
def test_the_lattice_from_a_device_top_k_is_the_host_one(seed):
    """``lattice_topk`` (an accelerator's path: ``torch.topk`` and the stop columns' probabilities
    read from the device) writes the lattice ``lattice_rows`` writes from the rows themselves."""
    from specpolicy.core.path_search_kernels import lattice_rows, lattice_topk

    rng = np.random.default_rng(300 + seed)
    for _ in range(8):
        top, vocab = int(rng.choice((1, 3, 15))), int(rng.choice((40, 1024)))
        n = int(rng.integers(1, 33))
        probs = _tie_heavy_rows(rng, n, vocab)
        stop_cols = rng.choice(vocab, size=int(rng.integers(0, 3)), replace=False).astype(np.int64)
        token_map = rng.permutation(vocab).astype(np.int64) if rng.random() < 0.5 else np.zeros(0, dtype=np.int64)
        mass = np.float32(rng.choice((0.5, 0.8, 1.0)))
        size = top + stop_cols.shape[0]
        host = (np.zeros((n, size), np.int64), np.zeros(n * size, np.float32), np.zeros((n, size), np.bool_))
        device = (np.zeros((n, size), np.int64), np.zeros(n * size, np.float32), np.zeros((n, size), np.bool_))
        m = lattice_rows(probs, top, stop_cols, token_map, mass, *host)
        values, cols = torch.from_numpy(probs).topk(top, dim=-1)
        stop_values = np.ascontiguousarray(probs[:, stop_cols])
        assert lattice_topk(values.numpy(), cols.numpy(), stop_values, stop_cols, token_map, mass, *device) == m
        for got, want in zip(device, host):
            assert (
                np.array_equal(got[:m], want[:m], equal_nan=True)
                if got.ndim == 2
                else np.array_equal(got[: m * size], want[: m * size], equal_nan=True)
            )
