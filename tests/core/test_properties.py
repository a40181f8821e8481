"""Property tests (hypothesis) over random tiny models, drafters, policies, parameters and prompts:

* greedy speculative decoding always outputs exactly what plain decoding of the target outputs;
* after every round that does not end generation -- i.e. after every roll-back -- the target's
  KV cache equals a fresh prefill of the committed sequence minus its pending token, and the
  drafter's state equals a fresh prefill of the committed sequence: for ``ar``, cache + unfed
  tokens = the committed sequence with the cache as computed from scratch; for ``fastdllm``, the
  cache holds exactly the complete committed blocks, as a fresh block-causal prefill writes them,
  the partial block's tokens and (on a block boundary) the next block's first token.

Models are float64 (no argmax near-ties between cached and uncached computation)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.policies.aimd import AIMDPolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.specdecpp import SpecDecPPPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier

RUNTIME = Runtime(device="cpu", dtype="float64", seed=0)
ATOL = 1e-9


@st.composite
def policies(draw):
    kind = draw(st.sampled_from(["static", "failfast", "specdecpp", "aimd"]))
    if kind == "static":
        return StaticPolicy(k=draw(st.integers(1, 8)))
    if kind == "failfast":
        n = draw(st.integers(1, 4))
        return FailFastPolicy(n=n, tau=draw(st.floats(0.0, 1.0)), n_max=draw(st.integers(n, 16)))
    if kind == "specdecpp":
        lo = draw(st.integers(1, 4))
        return SpecDecPPPolicy(h=draw(st.floats(0.05, 1.0)), min_length=lo, max_length=draw(st.integers(lo, 16)))
    w_min = draw(st.integers(1, 3))
    n_max = draw(st.integers(w_min, 16))
    return AIMDPolicy(
        mode=draw(st.sampled_from(["aimd", "heuristic"])),
        w_init=draw(st.integers(w_min, n_max)),
        a=draw(st.integers(1, 3)),
        beta=draw(st.floats(0.1, 0.9)),
        w_min=w_min,
        n_max=n_max,
        off_when_slower=draw(st.booleans()),
        backoff_rounds=draw(st.integers(1, 4)),
        backoff_max=8,
        probe_rounds=draw(st.integers(1, 3)),
    )


@st.composite
def setups(draw):
    vocab = 64
    seed = draw(st.integers(0, 2**16))
    target = tiny_lm(seed=seed, layers=draw(st.integers(1, 2)), vocab=vocab)
    with torch.no_grad():
        target.lm_head.weight.mul_(draw(st.sampled_from([1.0, 4.0, 12.0])))  # flat .. confident
    relation = draw(st.sampled_from(["same", "perturbed", "independent"]))
    if relation == "same":
        drafter_model = target
    elif relation == "perturbed":
        drafter_model = copy.deepcopy(target)
        gen = torch.Generator().manual_seed(seed + 1)
        noise = draw(st.sampled_from([0.05, 0.3]))
        with torch.no_grad():
            for p in drafter_model.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * (p.std() if p.numel() > 1 else 1))
    else:
        drafter_model = tiny_lm(seed=seed + 7, layers=1, vocab=vocab)
    kind = draw(st.sampled_from(["ar", "fastdllm", "suffix"]))
    if kind == "ar":
        drafter = ARDrafter(drafter_model, RUNTIME)
    elif kind == "fastdllm":
        block = draw(st.sampled_from([4, 8, 16]))
        small = draw(st.sampled_from([s for s in (1, 2, 4, 8) if block % s == 0]))
        drafter = FastDLLMDrafter(
            drafter_model,
            RUNTIME,
            SimpleNamespace(mask_token_id=vocab - 2),
            block_size=block,
            small_block_size=small,
            threshold=draw(st.sampled_from([0.0, 0.05, 0.5, 0.9])),
        )
    else:
        drafter = SuffixDrafter(RUNTIME, min_match=draw(st.integers(1, 3)), max_match=8)
    eos = frozenset({vocab - 1}) if draw(st.booleans()) else frozenset()
    prompt = torch.tensor(draw(st.lists(st.integers(0, vocab - 3), min_size=1, max_size=40)), dtype=torch.long)
    reuse = DraftReuse(draw(st.integers(1, 3))) if draw(st.booleans()) else None
    return SimpleNamespace(
        target=target,
        drafter=drafter,
        kind=kind,
        policy=draw(policies()),
        eos=eos,
        prompt=prompt,
        reuse=reuse,
        max_new_tokens=draw(st.integers(1, 32)),
    )


def _kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _same_kv(cache, fresh) -> bool:
    a, b = _kv(cache), _kv(fresh)
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(x, y, atol=ATOL, rtol=0) for pa, pb in zip(a, b) for x, y in zip(pa, pb)
    )


@torch.no_grad()
def check_verifier(verifier: HFVerifier, committed: torch.Tensor) -> None:
    """Cache = fresh prefill of ``committed[:-1]``; the pending token is ``committed[-1]``."""
    assert verifier.cached_length == len(committed) - 1
    assert int(verifier._pending) == int(committed[-1])
    if len(committed) > 1:
        fresh = verifier.model(input_ids=committed[None, :-1], use_cache=True).cache
        assert _same_kv(verifier.cache, fresh)


@torch.no_grad()
def check_ar(drafter: ARDrafter, committed: torch.Tensor) -> None:
    """Cache + unfed tokens = the committed sequence; the cache as a fresh prefill computes it."""
    cached, unfed = drafter.cache.get_seq_length(), drafter._unfed
    assert len(unfed) >= 1 and cached + len(unfed) == len(committed)
    assert unfed.tolist() == committed[cached:].tolist()
    if cached:
        fresh = drafter.model(input_ids=committed[None, :cached], use_cache=True).cache
        assert _same_kv(drafter.cache, fresh)


@torch.no_grad()
def check_fastdllm(drafter: FastDLLMDrafter, committed: torch.Tensor) -> None:
    """The state a fresh ``prefill`` of the committed sequence builds: complete blocks cached."""
    fresh = FastDLLMDrafter(
        drafter.model,
        RUNTIME,
        SimpleNamespace(mask_token_id=drafter.mask_token_id),
        block_size=drafter.block_size,
        small_block_size=drafter.small_block_size,
        threshold=drafter.threshold,
    )
    fresh.prefill(committed)
    L = len(committed)
    assert (drafter._L, drafter._base) == (L, (L // drafter.block_size) * drafter.block_size) == (fresh._L, fresh._base)
    assert drafter.sequence.length == drafter._base
    assert drafter._tail.tolist() == fresh._tail.tolist() == committed[drafter._base :].tolist()
    if drafter._base:
        assert _same_kv(drafter.sequence.cache, fresh.sequence.cache)
    if fresh._first is not None:  # on a block boundary: the next block's first token, as from scratch
        assert drafter._first is not None and int(drafter._first[0]) == int(fresh._first[0])
        assert abs(float(drafter._first[1]) - float(fresh._first[1])) < 1e-6


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(setup=setups())
def test_greedy_speculative_decoding_equals_plain_decoding_and_caches_match_a_fresh_prefill(setup):
    verifier = HFVerifier(setup.target, RUNTIME, setup.eos)
    plain = generate(setup.prompt, verifier, RUNTIME, max_new_tokens=setup.max_new_tokens)
    committed = [setup.prompt]
    checked = []

    def on_round(record):
        a = record.accepted_length
        committed.append(torch.tensor(list(record.draft_token_ids[:a]) + [record.target_token_ids[a]]))
        if record.finish_reason:  # generation over: nothing is rolled back
            return
        assert record.emitted_tokens == a + 1
        seq = torch.cat(committed)
        check_verifier(verifier, seq)
        if setup.kind == "ar":
            check_ar(setup.drafter, seq)
        elif setup.kind == "fastdllm":
            check_fastdllm(setup.drafter, seq)
        checked.append(record.index)

    out = generate(
        setup.prompt,
        verifier,
        RUNTIME,
        max_new_tokens=setup.max_new_tokens,
        drafter=setup.drafter,
        policy=setup.policy,
        reuse=setup.reuse,
        on_round=on_round,
    )
    assert out.output_ids.tolist() == plain.output_ids.tolist()
    assert out.finish_reason == plain.finish_reason
    assert sum(r.emitted_tokens for r in out.rounds) == len(out.output_ids)
    assert checked == list(range(len(out.rounds) - 1))  # every round but the last was checked
