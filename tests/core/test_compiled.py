"""The compiled host kernels (``specpolicy.core.compiled``, issue 48 item 5) against what they replace:
``torch.topk``'s order on tie-heavy vectors (NaN and -inf included, both of ATen's paths: nth_element
and partial_sort), and DART's trie rule against the numpy form it replaced (kept here verbatim).
Outputs must be IDENTICAL, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specpolicy.core.compiled import (
    block_open,
    block_reopen,
    block_scan,
    kneser_ney_row,
    topk_largest,
    unmask_apply,
    unmask_pick,
    unmask_step,
)
from specpolicy.models.fastdllm import greedy
from specpolicy.models.ngram import NGramModel, _codes, _lookup, load_ngram, resolve_ngram_path


@pytest.mark.parametrize("seed", range(6))
def test_topk_is_torch_topk_ties_included(seed):
    rng = np.random.default_rng(seed)
    for _ in range(400):
        n = int(rng.integers(1, 400))
        k = int(rng.integers(1, min(n, 40) + 1))  # k * 64 <= n: partial_sort; else nth_element + sort
        values = rng.integers(0, int(rng.integers(1, 6)), n).astype(np.float64)  # a handful of distinct values
        u = rng.random(n)
        values[u < 0.15] = -np.inf
        if seed % 2:
            values[u > 0.95] = np.nan
        index, top = topk_largest(values, k)
        want = torch.from_numpy(values).topk(k)
        assert np.array_equal(index, want.indices.numpy())
        assert np.array_equal(top, want.values.numpy(), equal_nan=True)


def reference_trie_probs_np(self, context: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The replaced numpy form of ``NGramModel.trie_probs_np`` (verbatim)."""
    counts, followers = self._trie_arrays
    probs = np.zeros(tokens.shape, dtype=np.float32)
    found = np.zeros(tokens.shape, dtype=bool)
    for j in range(self.order - 1, 0, -1):
        code = _codes(context[:, -j:], self.base)  # (B,) the context suffix s of j tokens
        # a context of start symbols was never counted on its own: its count is what followed it
        parent = _lookup(*counts[j - 1], code).astype(np.float32)
        parent = np.where(parent > 0, parent, _lookup(*followers[j - 1], code).astype(np.float32))
        child = _lookup(*counts[j], code[:, None] * self.base + tokens).astype(np.float32)  # (B, C)
        take = ~found & (child > 0)
        probs = np.where(take, child / np.maximum(parent, np.float32(1))[:, None], probs)
        found |= take
    return probs


@pytest.mark.parametrize("seed", range(8))
def test_the_trie_rule_is_the_numpy_form(seed):
    rng = random.Random(seed)
    vocab = 5 + 4 * seed
    for order in (1, 2, 3, 4):
        docs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 50))] for _ in range(rng.randrange(1, 15))]
        model = NGramModel.build(docs, vocab, order)
        generator = torch.Generator().manual_seed(seed)
        batch, width = rng.randrange(1, 30), rng.randrange(1, 30)
        context = torch.randint(0, vocab + 1, (batch, order - 1), generator=generator).numpy()  # start symbols too
        tokens = torch.randint(0, vocab, (batch, width), generator=generator).numpy()
        got = model.trie_probs_np(context, tokens)
        assert got.dtype == np.float32
        assert np.array_equal(got, reference_trie_probs_np(model, context, tokens))


def test_the_bundled_trie_rule_is_the_numpy_form():
    model = load_ngram(resolve_ngram_path("gsm8k-target"))
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, model.vocab_size + 1, (40, model.order - 1), generator=generator).numpy()
    context[:10] = [220, 16]  # a common context: the longest suffix is found
    tokens = torch.randint(0, model.vocab_size, (40, 25), generator=generator).numpy()
    tokens[:10, :5] = [16, 17, 18, 220, 13]
    got = model.trie_probs_np(context, tokens)
    assert (got > 0).any() and np.array_equal(got, reference_trie_probs_np(model, context, tokens))


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_kneser_ney_row_is_the_numpy_estimate(seed):
    rng = random.Random(seed)
    models = [load_ngram(resolve_ngram_path("gsm8k-target"))] if seed == 0 else []
    for order in (2, 3, 4):
        vocab = 6 + 5 * seed
        docs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(rng.randrange(1, 10))]
        models.append(NGramModel.build(docs, vocab, order))
    for model in models:
        generator = torch.Generator().manual_seed(seed)
        context = torch.randint(0, model.vocab_size + 1, (30, model.order - 1), generator=generator).numpy()
        tokens = torch.randint(0, model.vocab_size, (30, 17), generator=generator).numpy()
        want = model.kneser_ney_probs(context, tokens)
        got = np.empty(tokens.shape[1])
        for row in range(tokens.shape[0]):
            kneser_ney_row(*model.compiled_tables(), context[row], tokens[row], got)
            assert np.array_equal(got, want[row])


# -- Fast-dLLM v2's unmasking bookkeeping against the torch rule it replaced (verbatim) ----------------


def _torch_select(conf: torch.Tensor, masked: torch.Tensor, threshold: float, sampling: bool) -> torch.Tensor:
    """``FastDLLMDrafter._select`` before the host kernels."""
    if not sampling:
        pick = masked & (conf > threshold)
        best = torch.where(masked, conf, -1.0).argmax()
        return pick | ((torch.arange(conf.shape[0]) == best) & masked)
    run = ((conf > threshold) | ~masked).int().cumprod(dim=0).bool()
    leftmost = masked & (masked.int().cumsum(dim=0) == 1)
    return masked & (run | leftmost)


@pytest.mark.parametrize("seed", range(40))
def test_the_unmasking_kernels_are_the_torch_rule(seed):
    """Ties, NaN confidences, thresholds at a confidence's float32 value, no masked position: the
    pick, the block's writes, the pass's row and the scan are the torch forms' element for element."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    B, lo = 32, rng.randrange(1, 8)
    m = rng.randrange(1, B - lo + 1)
    conf = torch.rand(m, generator=generator).round(decimals=rng.choice((1, 6)))  # ties when rounded to 0.1
    if rng.random() < 0.2:
        conf[rng.randrange(m)] = torch.nan
    masked = torch.rand(B, generator=generator) < rng.choice((0.0, 0.5, 1.0))
    threshold = rng.choice((0.0, 0.05, 0.9, float(conf[0]) if not torch.isnan(conf[0]) else 0.5, 1.0))
    tokens = torch.randint(0, 50, (m,), generator=generator)
    ids = torch.randint(0, 50, (B,), generator=generator)
    stops = torch.tensor(rng.sample(range(50), rng.choice((0, 1, 3))), dtype=torch.long)
    for sampling in (False, True):
        want_pick = _torch_select(conf, masked[lo : lo + m], threshold, sampling)
        pick = unmask_pick(conf.numpy(), masked[lo : lo + m].numpy(), np.float32(threshold), sampling)
        assert pick.tolist() == want_pick.tolist()
        want_row = torch.where(masked[lo : lo + m], conf, torch.nan)
        want_ids = ids.clone()
        want_ids[lo : lo + m] = torch.where(want_pick, tokens, ids[lo : lo + m])
        want_masked = masked.clone()
        want_masked[lo : lo + m] = masked[lo : lo + m] & ~want_pick
        got_ids, got_conf, got_masked = ids.numpy().copy(), np.zeros(B, dtype=np.float32), masked.numpy().copy()
        row = np.empty(m, dtype=np.float32)
        unmask_apply(tokens.numpy(), conf.numpy(), pick, lo, got_ids, got_conf, got_masked, row)
        assert got_ids.tolist() == want_ids.tolist() and got_masked.tolist() == want_masked.tolist()
        assert torch.equal(torch.from_numpy(row).isnan(), want_row.isnan())
        assert torch.equal(torch.from_numpy(row).nan_to_num(-7.0), want_row.nan_to_num(-7.0))
        d0 = rng.randrange(0, B)
        first_masked = int(torch.where(want_masked.any(), want_masked.int().argmax(), B))
        is_stop = torch.isin(want_ids, stops) & ~want_masked & (torch.arange(B) >= d0)
        first_stop = int(torch.where(is_stop.any(), is_stop.int().argmax(), B))
        assert block_scan(got_ids, got_masked, stops.numpy(), d0) == (first_masked, first_stop)
        # the fused step (one call a pass): the same picks, writes, row and scan as the torch forms
        step_ids, step_conf, step_masked = ids.numpy().copy(), np.zeros(B, dtype=np.float32), masked.numpy().copy()
        step_pick, step_row = np.ones(m + 2, dtype=np.bool_), np.empty(m, dtype=np.float32)  # pick: room past m
        step = unmask_step(
            tokens.numpy(), conf.numpy(), lo, step_ids, step_conf, step_masked, np.float32(threshold), sampling,
            stops.numpy(), d0, step_pick, step_row,
        )  # fmt: skip
        assert step_pick[:m].tolist() == want_pick.tolist() and step == (first_masked, first_stop)
        assert step_pick[m:].all()  # nothing written past the small block's m offsets
        assert step_ids.tolist() == want_ids.tolist() and step_masked.tolist() == want_masked.tolist()
        assert np.array_equal(step_conf, got_conf, equal_nan=True) and np.array_equal(step_row, row, equal_nan=True)


def _opened_by_numpy(B, prefix, first, mask_id, stops):
    """The block opening ``block_open`` replaced (``FastDLLMDrafter._open_block`` before it), verbatim
    in numpy, with ``block_scan`` for the first token's stop check."""
    t = prefix.shape[0]
    ids, conf = np.full(B, mask_id, dtype=np.int64), np.zeros(B, dtype=np.float32)
    drafted_first = t == 0
    if drafted_first:
        ids[0], conf[0] = first
        t = 1
    else:
        ids[:t] = prefix
    masked = np.arange(B) >= t
    scanned = block_scan(ids, masked, stops, 0) if drafted_first and stops.shape[0] else (t, B)
    return ids, conf, masked, scanned  # the drafter used the stop only when it lies before ``filled``


@pytest.mark.parametrize("seed", range(4))
def test_block_open_is_the_numpy_opening(seed):
    """A new block's ids, confidences, mask state and scan pair: ``block_open`` against the numpy form,
    on random prefixes (empty: a drafted first token, often a stop token) over stale arrays."""
    rng = random.Random(seed)
    for _ in range(300):
        B = rng.choice([1, 2, 8, 16, 32])
        t = rng.randrange(0, B)
        prefix = np.array([rng.randrange(0, 6) for _ in range(t)], dtype=np.int64)
        first = (rng.randrange(0, 6), np.float32(rng.random()))
        stops = np.array(rng.sample(range(6), rng.randrange(0, 3)), dtype=np.int64)
        ids = np.array([rng.randrange(0, 9) for _ in range(B)], dtype=np.int64)  # a previous block's state
        conf = np.array([rng.random() for _ in range(B)], dtype=np.float32)
        masked = np.array([rng.random() < 0.5 for _ in range(B)], dtype=np.bool_)
        got = block_open(ids, conf, masked, prefix, first[0], first[1], 7, stops)
        want = _opened_by_numpy(B, prefix, first, 7, stops)
        assert ids.tolist() == want[0].tolist() and conf.tolist() == want[1].tolist()
        assert masked.tolist() == want[2].tolist()
        assert got[0] == want[3][0] and (got[1] < got[0]) == (want[3][1] < want[3][0])
        assert got[1] == (want[3][1] if want[3][1] < want[3][0] else B)
        if t == 0 and first[0] in stops.tolist():
            assert got == (1, 0)


@pytest.mark.parametrize("seed", range(2))
def test_block_reopen_is_block_open_of_the_tail_in_place(seed):
    """``block_reopen`` (the tail left in the block's ids, its last token written) leaves the arrays as
    ``block_open`` of that tail does, over stale arrays; the pair ``block_open`` returns is ``(t, B)``."""
    rng = random.Random(seed)
    for _ in range(300):
        B = rng.choice([2, 8, 16, 32])
        t = rng.randrange(1, B)
        stale = np.array([rng.randrange(0, 9) for _ in range(B)], dtype=np.int64)
        conf = np.array([rng.random() for _ in range(B)], dtype=np.float32)
        masked = np.array([rng.random() < 0.5 for _ in range(B)], dtype=np.bool_)
        last = rng.randrange(0, 9)
        ids, want_ids = stale.copy(), stale.copy()
        want_conf, want_masked = conf.copy(), masked.copy()
        prefix = np.append(stale[: t - 1], last)
        stops = np.array([last], dtype=np.int64)  # committed: never a drafted stop
        assert block_open(want_ids, want_conf, want_masked, prefix, 0, np.float32(0), 7, stops) == (t, B)
        block_reopen(ids, conf, masked, t, last, 7)
        assert ids.tolist() == want_ids.tolist() and conf.tolist() == want_conf.tolist()
        assert masked.tolist() == want_masked.tolist()


@pytest.mark.parametrize("shape", [(1, 5, 40), (7, 40), (1, 1, 40), (1, 40)])
def test_greedy_into_is_greedy(shape):
    """``runners.fastdllm.greedy_into`` (the drafter's greedy choice on the CPU, into kept tensors) gives
    ``models.fastdllm.greedy``'s tokens and confidences bit for bit, ties (first index) included, and
    its numpy views read the kept tensors after each call."""
    from specpolicy.runners.fastdllm import greedy_into

    held: dict = {}
    gen = torch.Generator().manual_seed(len(shape))
    for trial in range(50):
        logits = torch.randn(shape, generator=gen) * 4
        if trial % 2:  # tie-heavy: a few distinct values, the maximum repeated
            logits = torch.randint(0, 3, shape, generator=gen).float()
        tok, conf, tok_np, conf_np = greedy_into(logits, held)
        want_tok, want_conf = greedy(logits.reshape(-1, shape[-1]))
        assert torch.equal(tok.reshape(-1), want_tok) and torch.equal(conf.reshape(-1), want_conf)
        assert tok_np.tolist() == want_tok.tolist() and conf_np.tolist() == want_conf.tolist()
    assert len(held) == 1  # one set of outputs per shape
