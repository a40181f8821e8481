"""The Fast-dLLM drafter on each runtime of its runner (``specpolicy.runners.fastdllm``): the Hugging
Face forward (alone; several requests padded into one pass) and the static KV cache under a
block-wise causal mask (one sequence; a batched run's shared sequences, one pass for every request),
uncompiled here (the compiled runtime's passes, cheap to check) and compiled (slow). Every way the
drafter states its algorithm once; in float64 each drafts the same tokens in the same passes as the
Hugging Face forward alone, and the output is the target's greedy output."""

from __future__ import annotations

import pytest

from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.batching import generate_batch
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import CompileSettings, Runtime
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.runners.qwen import StaticQwen
from specpolicy.verifiers.hf import HFVerifier

MASK = 3
TOK = type("Tok", (), {"mask_token_id": MASK})()  # tokenizer stand-in


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(seed=0, layers=2), 4.0)


@pytest.fixture(scope="module")
def dllm():
    return sharpen(tiny_lm(seed=2, layers=2), 6.0)  # the drafter: another model, the same vocabulary


def _drafter(model, rt, threshold: float, static_cache: bool | None) -> FastDLLMDrafter:
    return FastDLLMDrafter(
        model, rt, TOK, block_size=8, small_block_size=4, threshold=threshold, stop_token_ids=(EOS,),
        static_cache=static_cache,
    )  # fmt: skip


def _rounds(result) -> list[tuple]:
    """What a round record holds of the drafting (confidences apart: ``_confidences``)."""
    return [
        (r.speculation_length, r.accepted_length, r.drafter_forward_passes, r.draft_token_ids, r.draft_stop_reason)
        for r in result.rounds
    ]


def _confidences(result) -> list[float]:
    return [c for r in result.rounds for c in r.confidences]


def _decode(prompts, verifier, rt, drafter, batch_size: int) -> list:
    policy = FailFastPolicy(n=3, tau=0.0, n_max=20)  # every draft 20 tokens: they cross blocks
    if batch_size == 1:
        return [generate(p, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy) for p in prompts]
    batch = generate_batch(
        prompts, verifier, rt, max_new_tokens=24, batch_size=batch_size, drafter=drafter, policy=policy
    )
    return [batch.results[i] for i in range(len(prompts))]


@pytest.mark.parametrize(
    ("threshold", "batch_size", "count"),
    [
        (0.05, 3, 3),
        pytest.param(0.05, 1, 4, marks=pytest.mark.slow),
        pytest.param(0.9, 1, 4, marks=pytest.mark.slow),
        pytest.param(0.9, 3, 4, marks=pytest.mark.slow),
    ],
)
def test_the_static_cache_drafts_as_the_hf_forward(target, dllm, threshold, batch_size, count, monkeypatch):
    """Alone and in a batch of 3 (eager: one padded pass; static: one pass over the shared cache of 3
    sequences), the static cache's drafts equal the Hugging Face forward's alone, round by round."""
    rt = Runtime("cpu", "float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompts = random_prompts(count)
    reference = _decode(prompts, verifier, rt, _drafter(dllm, rt, threshold, False), 1)
    vanilla = [generate(p, verifier, rt, max_new_tokens=24).output_ids.tolist() for p in prompts]
    assert [r.output_ids.tolist() for r in reference] == vanilla
    assert sum(r.speculation_length for out in reference for r in out.rounds) > 20 * count  # long drafts, across blocks

    widths = []
    run_rows = StaticQwen.run_rows

    def spy(self, input_ids, starts, counts=None, block_size=None):
        widths.append(int((counts > 0).sum()))
        return run_rows(self, input_ids, starts, counts, block_size)

    monkeypatch.setattr(StaticQwen, "run_rows", spy)
    for static_cache in (False, True):
        drafter = _drafter(dllm, rt, threshold, static_cache)
        assert (drafter.runner.static is not None) == static_cache
        got = _decode(prompts, verifier, rt, drafter, batch_size)
        for mine, theirs in zip(got, reference):
            assert mine.output_ids.tolist() == theirs.output_ids.tolist()
            assert _rounds(mine) == _rounds(theirs)
            # float32 confidences of float64 passes (the static forward reassociates sums)
            assert _confidences(mine) == pytest.approx(_confidences(theirs), abs=1e-6)
    if batch_size > 1:
        assert max(widths) == 3  # one static pass drafted for every request of the batch
        lead = drafter.batched(3)
        assert lead.runner.static.rows == 3 and drafter.runner.static.rows == 1
        assert drafter.batched(3).runner.static is lead.runner.static  # built once per batch size


def test_sampling_on_the_static_cache_keeps_the_draws_of_the_hf_forward(target, dllm):
    """Seeded sampling: the same draws, the same drafts (the runner changes no draw order)."""
    from specpolicy.core.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=1.0)
    outs = []
    for static_cache in (False, True):
        rt = Runtime("cpu", "float64", seed=5)
        verifier = HFVerifier(target, rt, frozenset({EOS}))
        drafter = _drafter(dllm, rt, 0.05, static_cache)
        result = generate(random_prompts(1)[0], verifier, rt, max_new_tokens=30, drafter=drafter,
                          policy=FailFastPolicy(n=3, tau=0.3, n_max=12), sampling=sampling)  # fmt: skip
        outs.append((result.output_ids.tolist(), [r.draft_token_ids for r in result.rounds]))
    assert outs[0] == outs[1]


def test_copies_share_only_a_batched_static_cache(dllm):
    """A copy of a drafter on the static cache of one sequence drafts eagerly (requests would
    overwrite each other's sequence); the copies of ``batched``'s drafter share its cache, a
    sequence each from ``prefill`` to ``release``."""
    import copy

    rt = Runtime("cpu", "float64", seed=0)
    drafter = _drafter(dllm, rt, 0.05, True)
    assert copy.copy(drafter).runner.static is None and drafter.runner.static is not None
    lead = drafter.batched(2)
    a, b = copy.copy(lead), copy.copy(lead)
    assert a.runner.static is b.runner.static is lead.runner.static
    prompts = random_prompts(3)
    a.prefill(prompts[0])
    b.prefill(prompts[1])
    assert {a.sequence.slot, b.sequence.slot} == {0, 1}
    with pytest.raises(RuntimeError, match="holds 2 requests"):
        copy.copy(lead).prefill(prompts[2])
    a.release()
    c = copy.copy(lead)
    c.prefill(prompts[2])
    assert c.sequence.slot == 0 and a.sequence is None


def test_a_largest_bucket_splitting_a_block_is_refused_in_one_line(dllm):
    rt = Runtime("cpu", "float64", seed=0, compiled=CompileSettings(buckets=(1, 2, 4, 12)))
    with pytest.raises(ValueError, match=r"^runtime\.buckets=\[1, 2, 4, 12\]: .*drafter\.block_size=8 ") as err:
        _drafter(dllm, rt, 0.05, True)
    assert "\n" not in str(err.value)
    # before any model loads: the config check of drafter=fastdllm and drafter=deer (the bundled B = 32)
    from specpolicy.drafters import deer, fastdllm

    for plugin in (fastdllm, deer):
        with pytest.raises(ValueError, match=r"^runtime\.buckets=\[1, 8\]: .*drafter\.block_size=32 "):
            plugin.validate({}, {"runtime": {"compile": True, "buckets": [1, 8]}})
        plugin.validate({}, {"runtime": {"compile": True, "buckets": [1, 64]}})
        plugin.validate({}, {"runtime": {"compile": False, "buckets": [1, 8]}})


@pytest.mark.slow
def test_the_compiled_runtime_drafts_on_a_compiled_static_cache(target, dllm):
    """``runtime.compile=true`` (buckets 1 and 8, float64): the drafter's passes compiled at build
    (batch 1) and once for a batch of 2; the target's output and the eager drafts, with no graph
    compiled past the warm-up."""
    from torch._dynamo.utils import counters

    eager = Runtime("cpu", "float64", seed=0)
    verifier = HFVerifier(target, eager, frozenset({EOS}))
    prompts = random_prompts(3)
    reference = _decode(prompts, verifier, eager, _drafter(dllm, eager, 0.05, False), 1)
    rt = Runtime("cpu", "float64", seed=0, compile=True, compiled=CompileSettings(buckets=(1, 8)))
    drafter = _drafter(dllm, rt, 0.05, None)
    assert drafter.runner.static.compiled and rt.warmup_s > 0
    lead = drafter.batched(2)
    assert lead.runner.static.compiled and lead.runner.static.rows == 2
    graphs = counters["stats"]["unique_graphs"]
    for batch_size in (1, 2):
        got = _decode(prompts, verifier, rt, drafter, batch_size)
        assert [r.output_ids.tolist() for r in got] == [r.output_ids.tolist() for r in reference]
        assert [[r.draft_token_ids for r in g.rounds] for g in got] == [
            [r.draft_token_ids for r in g.rounds] for g in reference
        ]
    assert counters["stats"]["unique_graphs"] == graphs
    assert VOCAB == target.config.vocab_size
