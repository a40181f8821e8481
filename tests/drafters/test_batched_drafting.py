"""``Drafter.draft_many`` with one padded pass per step (``drafters/dflash.py``): over requests with
different context lengths it returns exactly what each request's own ``draft`` calls return --
the same tokens, confidences, look-ahead, forward passes, stop tokens and ``alternatives``, and
when sampling the same q rows --, through extension passes and later rounds' batched context
caching, with one network pass per drafting step (tiny float64 models)."""

from __future__ import annotations

import copy

import pytest
import torch

from conditioned_reference import write_dflash_checkpoint
from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.dflash import DFlashDrafter
from specpolicy.models.dflash import load_dflash
from specpolicy.runners.dflash import DFlashRunner

B, MASK, LAYER_IDS = 8, 5, [0, 2]
#: prompt lengths: one token (no context yet), short ones, one past ``BATCH_POSITIONS`` (cached alone)
LENGTHS = (1, 5, 9, 14, 30)


@pytest.fixture(scope="module")
def rt():
    return Runtime(device="cpu", dtype="float64", seed=0)


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=4, vocab=VOCAB), 4.0)


@pytest.fixture(scope="module", params=["official", "draft-vocab"])
def network(tmp_path_factory, request):
    """The DFlash network of an official-layout checkpoint, and of one with a draft vocabulary (every
    other target id): every test runs on both."""
    vocab = list(range(0, VOCAB, 2)) if request.param == "draft-vocab" else None
    return load_dflash(
        write_dflash_checkpoint(tmp_path_factory.mktemp("dflash"), 32, VOCAB, 4, LAYER_IDS, B, MASK, draft_vocab=vocab)
    ).double()


def _features(target, seq, start, stop):
    """The target's DFlash context features ``(stop - start, 2 H)`` of ``seq[start:stop]``."""
    hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0, start:stop] for i in LAYER_IDS], -1)


def _prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(6, VOCAB - 1, (n,), generator=g) for n in LENGTHS]


def _requests(network, target, rt, prompts, stop=(), sampling=None):
    """One drafter per prompt, prefilled: copies of one drafter (as the batched loop makes them)."""
    base = DFlashDrafter(network, target.get_input_embeddings(), target.get_output_embeddings(), rt, stop)
    out = []
    for p in prompts:
        d = copy.copy(base)
        d.prefill(p, sampling=sampling, features=_features(target, p, 0, p.shape[0] - 1))
        out.append(d)
    return out


def _same(got: Draft, want: Draft) -> None:
    assert got.token_ids.tolist() == want.token_ids.tolist()
    torch.testing.assert_close(got.confidences, want.confidences)
    assert (got.forward_passes, got.lookahead, got.ends_at_stop_token) == (
        want.forward_passes,
        want.lookahead,
        want.ends_at_stop_token,
    )
    torch.testing.assert_close(got.lookahead_confidences, want.lookahead_confidences)
    assert (got.probs is None) == (want.probs is None)
    if want.probs is not None:
        torch.testing.assert_close(got.probs, want.probs)


class _CountPasses:
    """Counts the network's passes: its forward (a forward hook; the padded passes) and, for
    DFlash's network, its one-request ``draft_pass``."""

    def __init__(self, network):
        self.calls = 0
        self._network = network
        self._handle = network.register_forward_hook(self._hook)
        one = getattr(network, "draft_pass", None)
        if one is not None:

            def counted(*args, **kwargs):
                self.calls += 1
                return one(*args, **kwargs)

            network.draft_pass = counted

    def _hook(self, *_):
        self.calls += 1

    def close(self):
        self._handle.remove()
        self._network.__dict__.pop("draft_pass", None)


def _both_ways(cls, alone, together, asks, counter):
    """Each request's own ``draft`` calls (``alone``), then ``cls.draft_many`` (``together``): both
    drafts must be the same (``_same``). Returns ``(drafts, network passes alone, passes together)``."""
    counter.calls = 0
    want = [d.draft(n) for d, n in zip(alone, asks)]
    single, counter.calls = counter.calls, 0
    got = cls.draft_many(together, asks)
    for a, b in zip(got, want):
        _same(a, b)
    return got, want, single, counter.calls


@torch.no_grad()
def test_draft_many_drafts_what_each_request_drafts_alone(network, target, rt):
    """Rounds of one and two calls, a request asking two blocks' worth of tokens (an extension pass),
    another a third block in a second call, commits of different accepted lengths (later rounds'
    contexts of different lengths, cached in one batch): every draft equals the request's own."""
    prompts = _prompts()
    alone, together = _requests(network, target, rt, prompts), _requests(network, target, rt, prompts)
    committed = [p.clone() for p in prompts]
    g = torch.Generator().manual_seed(3)
    counter = _CountPasses(network)
    try:
        rounds = [
            [[3, 2 * (B - 1), 1, B - 1, 4]],  # one call: request 1 takes two passes
            # two calls: then blocks of different lengths in one pass (request 1's third block beside
            # the others' second)
            [[1, 2 * (B - 1), 3, 4, 5], [2, B, 1, B, 2 * B]],
            [[B - 1] * len(prompts)],
        ]
        for calls in rounds:
            before = [0] * len(prompts)  # passes spent on each request's round so far
            for asks in calls:
                got, want, single, batched = _both_ways(DFlashDrafter, alone, together, asks, counter)
                passes = [b.forward_passes - n for b, n in zip(want, before)]
                # one network pass per drafting step: as many as the most passes one request took
                assert single == sum(passes) and batched == max(passes) and sum(passes) > max(passes)
                before = [b.forward_passes for b in want]
            for d_alone, d_together in zip(alone, together):
                for k in (1, 3):
                    for x, y in zip(d_together.alternatives(k), d_alone.alternatives(k)):
                        torch.testing.assert_close(x, y)
            # commit: accept a random prefix, then a token of our own, with the target's features of the new positions
            for i, draft in enumerate(want):
                a = int(torch.randint(0, draft.length + 1, (1,), generator=g))
                nxt = torch.randint(6, VOCAB - 1, (1,), generator=g)
                new = torch.cat([committed[i], draft.token_ids[:a], nxt])
                features = _features(target, new, committed[i].shape[0] - 1, committed[i].shape[0] + a)
                verification = Verification(a, int(nxt), torch.cat([draft.token_ids[:a], nxt]), features=features)
                alone[i].commit(draft, verification)
                together[i].commit(got[i], verification)
                committed[i] = new
        for d_alone, d_together in zip(alone, together):
            assert d_together.cache.length == d_alone.cache.length
    finally:
        counter.close()


@torch.no_grad()
def test_a_drafted_stop_token_ends_that_request_only(network, target, rt):
    """The first token of request 4's extension block as the stop token: its draft ends there after
    two passes, request 3 drafts it in its first block and ends there, the others go on, as alone;
    ``extension=none`` keeps request 1 to one block; asking more of an ended draft runs no pass."""
    if hasattr(network, "d2t"):
        pytest.skip(
            "the scenario is built on the official checkpoint's drafts (request 4's first extension token "
            "absent from its first block); the draft-vocabulary network drafts other tokens"
        )
    prompts = _prompts()
    free = DFlashDrafter.draft_many(_requests(network, target, rt, prompts), [2 * (B - 1)] * len(prompts))
    stop = int(free[4].token_ids[B - 1])
    assert stop not in free[4].token_ids[: B - 1].tolist()
    alone = _requests(network, target, rt, prompts, stop=frozenset({stop}))
    together = _requests(network, target, rt, prompts, stop=frozenset({stop}))
    for ds in (alone, together):
        ds[1].extension = "none"
    asks = [2 * (B - 1), 2 * (B - 1), 2, 2 * (B - 1), 2 * (B - 1)]
    want = [d.draft(n) for d, n in zip(alone, asks)]
    got = DFlashDrafter.draft_many(together, asks)
    for a, b in zip(got, want):
        _same(a, b)
    assert (got[4].ends_at_stop_token, got[4].length, got[4].forward_passes) == (True, B, 2)
    assert got[3].ends_at_stop_token and got[3].forward_passes == 1
    assert not got[0].ends_at_stop_token and got[0].length == 2 * (B - 1)
    assert (got[1].length, got[1].forward_passes) == (B - 1, 1)  # extension=none: one block
    assert got[2].length == 2 and got[2].lookahead > 0
    for a, b in zip(DFlashDrafter.draft_many(together, [1] * len(prompts)), [d.draft(1) for d in alone]):
        _same(a, b)


@torch.no_grad()
def test_sampling_reports_the_same_q_rows(network, target, rt):
    """Sampling: with the random stream at the same state, the same draws and q rows as the requests'
    own calls (the request taking a second pass last: its draws come last alone too)."""
    sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0)
    prompts = _prompts()
    alone = _requests(network, target, rt, prompts, sampling=sampling)
    together = _requests(network, target, rt, prompts, sampling=sampling)
    asks = [3, B - 1, 1, 5, 2 * (B - 1)]
    rt.generator.manual_seed(21)
    want = [d.draft(n) for d, n in zip(alone, asks)]
    rt.generator.manual_seed(21)
    got = DFlashDrafter.draft_many(together, asks)
    for a, b in zip(got, want):
        assert a.probs is not None and a.probs.shape == (a.length, VOCAB)
        _same(a, b)
    assert got[-1].forward_passes == 2


@torch.no_grad()
def test_one_request_takes_the_plain_path_and_bad_counts_are_refused(network, target, rt, monkeypatch):
    prompts = _prompts()[1:3]
    alone, together = _requests(network, target, rt, prompts[:1]), _requests(network, target, rt, prompts)

    def refuse(*_):
        raise AssertionError("a batch of one ran the padded pass")

    monkeypatch.setattr(DFlashRunner, "together", refuse)  # the runner's padded pass over several requests
    _same(DFlashDrafter.draft_many(together[:1], [B])[0], alone[0].draft(B))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="num_tokens must be >= 1, got 0"):
        DFlashDrafter.draft_many(together, [3, 0])
    assert together[1]._passes == 0  # refused before any pass


# -- the AR drafter (``drafters/ar.py``): one padded pass per drafted position ------------------


def _ar_requests(model, rt, prompts, sampling=None):
    """One AR drafter per prompt, prefilled (its cache still empty: the prompt is fed by the first
    pass), as copies of one drafter."""
    from specpolicy.drafters.ar import ARDrafter

    base = ARDrafter(model, rt)
    out = []
    for p in prompts:
        d = copy.copy(base)
        d.prefill(p, sampling=sampling)
        out.append(d)
    return out


def _commit_random(drafters, drafts, g):
    for d, draft in zip(drafters, drafts):
        a = int(torch.randint(0, draft.length + 1, (1,), generator=g))
        nxt = torch.randint(6, VOCAB - 1, (1,), generator=g)
        d.commit(draft, Verification(a, int(nxt), torch.cat([draft.token_ids[:a], nxt])))


@torch.no_grad()
def test_ar_draft_many_drafts_what_each_request_drafts_alone_in_one_pass_per_position(rt):
    """Requests with caches of different lengths and different numbers of uncached tokens (one past
    ``BATCH_POSITIONS``: alone), a round extended by a second call, commits of random accepted
    lengths: every draft, confidence, pass count and cache equals the request's own, and a step
    costs one model pass for all batched requests."""
    from specpolicy.drafters.ar import BATCH_POSITIONS, ARDrafter

    model = sharpen(tiny_lm(5, layers=2, vocab=VOCAB), 3.0)
    prompts = _prompts()
    alone, together = _ar_requests(model, rt, prompts), _ar_requests(model, rt, prompts)
    g, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    first = [d.draft(2) for d in alone]  # the first round drafts alone (empty caches)
    _commit_random(alone, first, g)
    _commit_random(together, [d.draft(2) for d in together], g2)
    counter = _CountPasses(model)
    try:
        for calls in ([[3, 5, 1, 4, 2]], [[1, 2, 3, 1, 6], [2, 1, 4, 3, 1]], [[6] * len(prompts)]):
            for asks in calls:
                got, want, _, batched = _both_ways(ARDrafter, alone, together, asks, counter)
                assert batched == max(asks)  # one pass per step for all of them
            _commit_random(alone, want, g)
            _commit_random(together, got, g2)
            for x, y in zip(alone, together):
                assert x.cache.get_seq_length() == y.cache.get_seq_length()
                torch.testing.assert_close(x._unfed, y._unfed)
                for la, lb in zip(x.cache.layers, y.cache.layers):
                    torch.testing.assert_close(la.keys, lb.keys)
                    torch.testing.assert_close(la.values, lb.values)
        # request 0 goes 17 rounds without a draft: 18 uncached tokens, past BATCH_POSITIONS -> alone
        for _ in range(17):
            nxt = torch.randint(6, VOCAB - 1, (1,), generator=g)
            for d in (alone[0], together[0]):
                d.commit(Draft.empty(), Verification(0, int(nxt), nxt))
        assert together[0]._unfed.shape[0] > BATCH_POSITIONS
        asks = [3, 2, 4, 1, 2]
        want = [d.draft(n) for d, n in zip(alone, asks)]
        counter.calls = 0
        for a, b in zip(ARDrafter.draft_many(together, asks), want):
            _same(a, b)
        assert counter.calls == asks[0] + max(asks[1:])  # its passes alone, then the others' together
    finally:
        counter.close()
    with pytest.raises(ValueError, match="num_tokens must be >= 1, got 0"):
        ARDrafter.draft_many(together, [1, 0, 1, 1, 1])
    # new requests (empty caches, a 30-token prompt) beside ones with short uncached tails: the new
    # ones draft alone, the rest together, all as alone
    fresh_alone, fresh_together = _ar_requests(model, rt, prompts[3:]), _ar_requests(model, rt, prompts[3:])
    asks = [4, 2, 3, 5, 1, 3, 2]
    want = [d.draft(n) for d, n in zip(alone + fresh_alone, asks)]
    for a, b in zip(ARDrafter.draft_many(together + fresh_together, asks), want):
        _same(a, b)


# -- the Fast-dLLM drafter (``drafters/fastdllm.py``): one padded pass per unmasking / boundary step --


def _fastdllm_requests(model, rt, prompts, threshold, stop=()):
    from types import SimpleNamespace

    from specpolicy.drafters.fastdllm import FastDLLMDrafter

    base = FastDLLMDrafter(
        model,
        rt,
        SimpleNamespace(mask_token_id=VOCAB - 2),
        block_size=16,
        small_block_size=4,
        threshold=threshold,
        stop_token_ids=stop,
    )
    out = []
    for p in prompts:
        d = copy.copy(base)
        d.prefill(p)
        out.append(d)
    return out


@pytest.mark.parametrize("threshold", [0.05, 0.9])
@torch.no_grad()
def test_fastdllm_draft_many_drafts_what_each_request_drafts_alone(rt, threshold):
    """Prompts of 1..30 tokens (cached blocks of 0, 16), drafts crossing block boundaries, a round
    extended by a second call, commits of random accepted lengths (blocks rewritten by commit),
    threshold 0.9 (several passes per small block): every draft, confidence, pass count, look-ahead
    and cache equals the request's own, with one model pass per step for all requests."""
    from specpolicy.drafters.fastdllm import FastDLLMDrafter

    model = sharpen(tiny_lm(7, layers=2, vocab=VOCAB), 2.0)
    prompts = _prompts()
    alone = _fastdllm_requests(model, rt, prompts, threshold)
    together = _fastdllm_requests(model, rt, prompts, threshold)
    g, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    counter = _CountPasses(model.model)  # the decoder: the padded passes skip the LM head's wrapper
    try:
        for calls in ([[3, 20, 1, 9, 4]], [[2, 5, 13, 1, 6], [4, 1, 18, 3, 2]], [[8] * len(prompts)]):
            for asks in calls:
                got, want, single, batched = _both_ways(FastDLLMDrafter, alone, together, asks, counter)
                for a, b in zip(got, want):
                    torch.testing.assert_close(
                        a.extras["small_block_confidences"], b.extras["small_block_confidences"], equal_nan=True
                    )
                assert 0 < batched < single  # passes of many requests run together
            _commit_random(alone, want, g)
            _commit_random(together, got, g2)
            for x, y in zip(alone, together):
                assert x.sequence.length == y.sequence.length
                for la, lb in zip(x.sequence.cache.layers, y.sequence.cache.layers):
                    torch.testing.assert_close(la.keys, lb.keys)
                    torch.testing.assert_close(la.values, lb.values)
    finally:
        counter.close()


@torch.no_grad()
def test_fastdllm_draft_many_ends_each_request_at_its_own_stop_token(rt):
    from specpolicy.drafters.fastdllm import FastDLLMDrafter

    model = sharpen(tiny_lm(7, layers=2, vocab=VOCAB), 2.0)
    prompts = _prompts()
    free = FastDLLMDrafter.draft_many(_fastdllm_requests(model, rt, prompts, 0.05), [12] * len(prompts))
    stop = int(free[2].token_ids[5])
    alone = _fastdllm_requests(model, rt, prompts, 0.05, stop=[stop])
    together = _fastdllm_requests(model, rt, prompts, 0.05, stop=[stop])
    want = [d.draft(12) for d in alone]
    got = FastDLLMDrafter.draft_many(together, [12] * len(prompts))
    for a, b in zip(got, want):
        _same(a, b)
    assert got[2].ends_at_stop_token and got[2].length <= 6


@torch.no_grad()
@pytest.mark.parametrize("shared", [False, True], ids=["own-caches", "shared-static-cache"])
def test_ar_draft_many_sampling_gives_each_token_its_own_q_row(rt, shared, monkeypatch):
    """Sampling through ``draft_many`` -- requests asking different numbers of tokens in one call (the
    padded passes run ``max`` steps for all, the extra draws unrecorded), a round extended by a
    second call, three rounds with random accepted lengths, on the requests' own caches and on the
    static cache they share (``ARDrafter.batched``): every drafted token's q row is ``warp`` of
    the AR model's logits after the request's committed sequence and its tokens drafted before it
    (one Hugging Face forward per request), and every drawn token has q > 0."""
    from specpolicy.core.sampling import warp
    from specpolicy.drafters.ar import ARDrafter
    from specpolicy.runners.decoder import StaticDecoder

    model = sharpen(tiny_lm(5, layers=2, vocab=VOCAB), 3.0)
    sampling = SamplingConfig(temperature=0.9, top_k=24)
    prompts = _prompts()[1:]  # 5, 9, 14 and 30 tokens
    if shared:
        base = ARDrafter(model, rt)
        base.static = StaticDecoder(model, base.max_context)
        lead = base.batched(len(prompts))
        requests = [copy.copy(lead) for _ in prompts]
        for d, p in zip(requests, prompts):
            d.prefill(p, sampling=sampling)
    else:
        requests = _ar_requests(model, rt, prompts, sampling)
    calls = []  # the counts of every multi-request padded pass
    if shared:  # the drafting steps over the requests, on the shared static cache
        steps = ARDrafter._steps
        monkeypatch.setattr(
            ARDrafter, "_steps", staticmethod(lambda ds, counts: calls.append(list(counts)) or steps(ds, counts))
        )
    else:  # the runner's padded passes
        from specpolicy.runners.causal import CausalRunner

        together = CausalRunner.together
        monkeypatch.setattr(
            CausalRunner,
            "together",
            lambda runner, seqs, first, counts, choose: (
                calls.append(list(counts)) or together(runner, seqs, first, counts, choose)
            ),
        )
    committed = [p.clone() for p in prompts]
    g = torch.Generator().manual_seed(8)
    rt.generator.manual_seed(5)
    for first, second in (([2, 3, 1, 4], [1, 1, 2, 1]), ([3, 1, 4, 2], [2, 3, 1, 1]), ([1, 4, 2, 3], [3, 1, 1, 2])):
        ARDrafter.draft_many(requests, first)
        drafts = ARDrafter.draft_many(requests, second)  # the round's draft extended
        for seq, draft, a, b in zip(committed, drafts, first, second):
            assert draft.length == a + b and draft.probs is not None
            logits = model(input_ids=torch.cat([seq, draft.token_ids])[None]).logits[0]
            q = warp(logits[seq.shape[0] - 1 : seq.shape[0] - 1 + draft.length], sampling)
            torch.testing.assert_close(draft.probs, q)
            assert bool((q.gather(1, draft.token_ids[:, None]) > 0).all())
        for i, (d, draft) in enumerate(zip(requests, drafts)):
            accepted = int(torch.randint(0, draft.length + 1, (1,), generator=g))
            nxt = torch.randint(6, VOCAB - 1, (1,), generator=g)
            d.commit(draft, Verification(accepted, int(nxt), torch.cat([draft.token_ids[:accepted], nxt])))
            committed[i] = torch.cat([committed[i], draft.token_ids[:accepted], nxt])
    assert any(len(c) > 1 and len(set(c)) > 1 for c in calls), calls  # unequal counts in one padded pass
