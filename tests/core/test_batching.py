"""The batched loop (``specpolicy.core.batching``): every request's output is its batch-1 greedy output
whatever shares its batch, at batch sizes 1, 4 and 16, for every drafter (tiny float64 models);
each request drafts and accepts exactly as it does alone (its own drafter state and policy);
requests leave at EOS / max_new_tokens / the context's end, a bad prompt is skipped and recorded;
arrivals and the serving statistics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conditioned_reference import write_dflash_checkpoint, write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.batching import generate_batch
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.serving import RequestTiming, arrival_times, summarize
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.dflash import DFlashDrafter
from specpolicy.drafters.eagle3 import Eagle3Drafter
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.models.dflash import load_dflash
from specpolicy.models.eagle3 import load_eagle3
from specpolicy.policies.aimd import AIMDPolicy
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.runners.causal import CausalRunner
from specpolicy.runners.dflash import DFlashRunner
from specpolicy.runners.eagle3 import Eagle3Runner
from specpolicy.verifiers.hf import HFVerifier

LAYERS = 4


@pytest.fixture(scope="module")
def rt():
    return Runtime(device="cpu", dtype="float64", seed=0)


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=LAYERS, vocab=VOCAB), 4.0)


@pytest.fixture(scope="module")
def drafters(target, rt, tmp_path_factory):
    stop = frozenset({EOS})
    dflash = write_dflash_checkpoint(tmp_path_factory.mktemp("dflash"), 32, VOCAB, LAYERS, [0, 2], 8, 5)
    dflash_vocab = write_dflash_checkpoint(
        tmp_path_factory.mktemp("dflash-vocab"),
        32,
        VOCAB,
        LAYERS,
        [0, 2],
        8,
        5,
        draft_vocab=sorted(set(range(0, VOCAB, 2)) | {EOS}),
    )
    eagle3 = write_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), 32, VOCAB, VOCAB, layer_ids=[1, 2, 3])
    return {
        "ar": lambda: ARDrafter(sharpen(tiny_lm(0, layers=1)), rt),
        "fastdllm": lambda: FastDLLMDrafter(
            sharpen(tiny_lm(0, layers=1)),
            rt,
            SimpleNamespace(mask_token_id=VOCAB - 2),
            block_size=16,
            small_block_size=4,
            threshold=0.05,
            stop_token_ids=[EOS],
        ),
        "suffix": lambda: SuffixDrafter(rt),
        "dflash": lambda: DFlashDrafter(
            load_dflash(dflash).double(), target.get_input_embeddings(), target.get_output_embeddings(), rt, stop
        ),
        "dflash-vocab": lambda: DFlashDrafter(
            load_dflash(dflash_vocab).double(), target.get_input_embeddings(), target.get_output_embeddings(), rt, stop
        ),
        "eagle3": lambda: Eagle3Drafter(
            load_eagle3(eagle3).double(), target.get_input_embeddings(), (1, 2, 3), VOCAB, rt, stop
        ),
    }


def _prompts(n: int) -> list[torch.Tensor]:
    """Prompts of different lengths (1 to ~20 tokens), some repetitive (the suffix drafter matches)."""
    out = []
    for i, p in enumerate(random_prompts(n, seed=3)):
        p = p[: 1 + (i * 7) % len(p)]
        out.append(torch.cat([p, p]) if i % 3 == 0 else p)
    return out


POLICIES = {
    "static": lambda: StaticPolicy(3),
    "failfast": lambda: FailFastPolicy(n=3, tau=0.3, n_max=12),
    "aimd": lambda: AIMDPolicy(n_max=12),
}


@pytest.fixture(scope="module")
def alone_runs() -> dict:
    """The batch-1 runs of one drafter x policy, made once and compared with every batch size (the
    tests only read them)."""
    return {}


def _alone_case(kind: str, choice: str, batch_size: int):
    """Fast subset: every drafter with FailFast (vanilla: no policy) at batch size 4, but DFlash's
    draft-vocabulary variant (DFlash's batched pass, checked with the full vocabulary); the other
    policies and batch sizes 1 and 16 are ``slow``."""
    fast = batch_size == 4 and choice in ("failfast", "none") and kind != "dflash-vocab"
    marks = () if fast else pytest.mark.slow
    return pytest.param(kind, choice, batch_size, id=f"{kind}-{choice}-{batch_size}", marks=marks)


@pytest.mark.parametrize(
    "kind, choice, batch_size",
    [
        _alone_case(kind, choice, batch_size)
        for kind in ["vanilla", "ar", "fastdllm", "suffix", "dflash", "dflash-vocab", "eagle3"]
        for choice in (["none"] if kind == "vanilla" else sorted(POLICIES))
        for batch_size in (1, 4, 16)
    ],
)
def test_every_request_decodes_as_it_does_alone(target, rt, drafters, alone_runs, kind, choice, batch_size):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompts = _prompts(20)
    make = (lambda: (None, None)) if kind == "vanilla" else (lambda: (drafters[kind](), POLICIES[choice]()))
    if kind in ("dflash", "dflash-vocab", "eagle3"):
        verifier.request_features(make()[0].target_feature_layers)
    if (kind, choice) not in alone_runs:
        alone_runs[kind, choice] = [
            generate(prompt, verifier, rt, max_new_tokens=24, drafter=d, policy=p)
            for prompt in prompts
            for d, p in [make()]
        ]
    alone = alone_runs[kind, choice]
    d, p = make()
    batched = generate_batch(prompts, verifier, rt, max_new_tokens=24, batch_size=batch_size, drafter=d, policy=p)
    assert not batched.skipped and sorted(batched.results) == list(range(len(prompts)))
    for i, ref in enumerate(alone):
        got = batched.results[i]
        assert got.output_ids.tolist() == ref.output_ids.tolist(), (kind, choice, i)
        assert got.finish_reason == ref.finish_reason
        # its own drafter state and policy: the same drafts and accepted lengths as alone
        assert [(r.draft_token_ids, r.accepted_length) for r in got.rounds] == [
            (r.draft_token_ids, r.accepted_length) for r in ref.rounds
        ], (kind, choice, i)
    assert max(batched.batch_sizes) == min(batch_size, len(prompts))
    assert sum(batched.verify_tokens) == sum(
        r.speculation_length + 1 for g in batched.results.values() for r in g.rounds
    )


@pytest.mark.parametrize(
    "kind", ["ar", pytest.param("fastdllm", marks=pytest.mark.slow), pytest.param("eagle3", marks=pytest.mark.slow)]
)
def test_draft_reuse_extends_each_request_from_its_own_rejected_tail_as_alone(target, rt, drafters, kind, monkeypatch):
    """``reuse``: every request's rounds -- drafts with the reused tokens, accepted lengths -- and
    output equal its batch-1 run with reuse, and reuse happened (static drafts of 6 tokens from
    tiny random drafters: long rejected tails)."""
    from specpolicy.core.reuse import DraftReuse

    verifier = HFVerifier(target, rt, frozenset({EOS}))
    if kind == "eagle3":
        verifier.request_features(drafters[kind]().target_feature_layers)
    prompts = _prompts(12)
    alone = [
        generate(
            p, verifier, rt, max_new_tokens=32, drafter=drafters[kind](), policy=StaticPolicy(6), reuse=DraftReuse(1)
        )
        for p in prompts
    ]
    padded = []  # the drafter class's padded passes ran (``draft_many`` for many requests at once)
    import specpolicy.runners.fastdllm as fastdllm_module

    owner, name = {
        "ar": (CausalRunner, "together"),
        "fastdllm": (fastdllm_module, "padded_cache"),
        "eagle3": (Eagle3Runner, "together"),
    }[kind]
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        padded.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(
        owner, name, spy if owner in (fastdllm_module, Eagle3Runner, CausalRunner) else staticmethod(spy)
    )
    batched = generate_batch(
        prompts,
        verifier,
        rt,
        max_new_tokens=32,
        batch_size=4,
        drafter=drafters[kind](),
        policy=StaticPolicy(6),
        reuse=DraftReuse(1),
    )
    monkeypatch.undo()
    assert padded
    for i, ref in enumerate(alone):
        got = batched.results[i]
        assert got.output_ids.tolist() == ref.output_ids.tolist()
        assert [(r.draft_token_ids, r.accepted_length, r.reused_tokens) for r in got.rounds] == [
            (r.draft_token_ids, r.accepted_length, r.reused_tokens) for r in ref.rounds
        ], (kind, i)
    assert sum(r.reused_tokens for g in batched.results.values() for r in g.rounds) > 0


def test_requests_leave_at_eos_max_new_tokens_and_the_context_and_bad_prompts_are_skipped(target, rt, drafters):
    verifier = HFVerifier(target, rt, frozenset({EOS}), max_context=64)
    prompts = _prompts(8)
    prompts[2] = torch.empty(0, dtype=torch.long)  # empty: skipped
    prompts[5] = torch.arange(70) % (VOCAB - 3)  # longer than the context: skipped
    prompts[6] = torch.arange(50) % (VOCAB - 3)  # fits, runs into the context's end
    out = generate_batch(
        prompts, verifier, rt, max_new_tokens=30, batch_size=3, drafter=drafters["ar"](), policy=StaticPolicy(4)
    )
    assert sorted(out.skipped) == [2, 5] and "max_context=64" in out.skipped[5]
    for i, got in out.results.items():
        ref = generate(prompts[i], verifier, rt, max_new_tokens=30)
        assert got.output_ids.tolist() == ref.output_ids.tolist() and got.finish_reason == ref.finish_reason
    assert out.results[6].finish_reason == "max_context"
    assert {r.finish_reason for r in out.results.values()} >= {"max_context", "max_new_tokens"}
    assert all(r.output_ids[-1] == EOS for r in out.results.values() if r.finish_reason == "eos")


class _BracketTokenizer:
    """Token t decodes to ``[t]`` (stop strings on the tiny models' ids)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"[{int(t)}]" for t in ids)


@pytest.mark.parametrize(
    "kind", [pytest.param("vanilla", marks=pytest.mark.slow), "ar", pytest.param("eagle3", marks=pytest.mark.slow)]
)
def test_requests_leave_at_their_first_stop_string_as_they_do_alone(target, rt, drafters, kind):
    """Stop strings taken from two requests' outputs (spanning two tokens): each request stops where
    it stops alone -- output, finish reason, drafts and accepted lengths --, the others go on."""
    from specpolicy.core.stopping import StopStrings

    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompts = _prompts(10)

    def make():
        return (None, None) if kind == "vanilla" else (drafters[kind](), FailFastPolicy(n=3, tau=0.3, n_max=12))

    if kind == "eagle3":
        verifier.request_features(make()[0].target_feature_layers)
    free = [generate(q, verifier, rt, max_new_tokens=24).output_ids.tolist() for q in prompts]
    long_enough = [out for out in free if len(out) >= 16]
    stop = StopStrings(_BracketTokenizer(), [f"{a}][{b}" for out in long_enough[:2] for a, b in [out[9:11]]])
    alone = []
    for q in prompts:
        d, p = make()
        alone.append(generate(q, verifier, rt, max_new_tokens=24, drafter=d, policy=p, stop=stop))
    reasons = {r.finish_reason for r in alone}
    assert "stop_string" in reasons and reasons - {"stop_string"}  # some stop there, some do not
    d, p = make()
    batched = generate_batch(prompts, verifier, rt, max_new_tokens=24, batch_size=4, drafter=d, policy=p, stop=stop)
    for i, ref in enumerate(alone):
        got = batched.results[i]
        assert got.output_ids.tolist() == ref.output_ids.tolist() and got.finish_reason == ref.finish_reason, i
        assert [(r.draft_token_ids, r.accepted_length) for r in got.rounds] == [
            (r.draft_token_ids, r.accepted_length) for r in ref.rounds
        ], i


def test_the_loop_refuses_what_it_cannot_run(target, rt, drafters):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompts = _prompts(2)
    with pytest.raises(ValueError, match="generation.batch_size must be an integer >= 1, got 0"):
        generate_batch(prompts, verifier, rt, max_new_tokens=4, batch_size=0)
    with pytest.raises(ValueError, match="trees"):
        generate_batch(
            prompts,
            verifier,
            rt,
            max_new_tokens=4,
            batch_size=2,
            drafter=drafters["ar"](),
            policy=Eagle2TreePolicy(2, 2, 4),
        )
    with pytest.raises(ValueError, match="got 1 arrival times for 2 prompts"):
        generate_batch(prompts, verifier, rt, max_new_tokens=4, batch_size=2, arrivals=[0.0])


def test_poisson_arrivals_are_seeded_and_requests_wait_for_theirs(target, rt):
    times = arrival_times(6, "poisson", rate=50.0, seed=4)
    assert times == arrival_times(6, "poisson", rate=50.0, seed=4) != arrival_times(6, "poisson", rate=50.0, seed=5)
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    assert arrival_times(3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="generation.arrival_rate must be a number > 0"):
        arrival_times(3, "poisson", rate=0)
    with pytest.raises(ValueError, match="generation.arrival must be one of all_at_once, poisson"):
        arrival_times(3, "burst")
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    out = generate_batch(_prompts(6), verifier, rt, max_new_tokens=6, batch_size=4, arrivals=times)
    for i, t in out.timings.items():
        assert t.admitted_s >= t.arrival_s == times[i]
        assert t.arrival_s <= t.first_token_s <= t.finish_s and t.ttft_ms >= 0
    assert out.wall_s >= times[-1]


def test_serving_statistics():
    timings = [
        RequestTiming(0.0, 0.0, 0.1, 0.5, 5),
        RequestTiming(0.0, 0.2, 0.3, 0.3, 1),
        RequestTiming(1.0, 1.0, 1.2, 2.2, 11),
    ]
    s = summarize(timings, wall_s=2.5)
    assert s["tokens"] == 17 and s["throughput_tokens_per_s"] == pytest.approx(17 / 2.5)
    assert s["ttft_mean_ms"] == pytest.approx((100 + 300 + 200) / 3)
    assert s["ttft_p50_ms"] == pytest.approx(200)
    assert timings[0].tpot_ms == pytest.approx(100) and timings[1].tpot_ms == 0.0
    assert s["latency_p99_ms"] == pytest.approx(1200, rel=0.02)


def test_the_experiment_runs_the_batched_loop_and_reports_serving_numbers(family, tmp_path, capsys):
    """``python -m specpolicy generation.batch_size=3 ...`` on the tiny family: every prompt a
    lossless PromptResult, the serving block in summary.json and printed; a resume reads them back."""
    import json

    from hydra import compose, initialize_config_module

    from conftest import overrides
    from specpolicy.run.experiment import run_experiment

    args = [o for o in overrides(family, drafter="drafter") if not o.startswith("dataset.num_prompts")]
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *args,
                "dataset.num_prompts=5",
                "generation.batch_size=3",
                "policy=goodput-batch",
                "run.warmup_prompts=1",
            ],
        )
    summary = run_experiment(cfg, tmp_path)
    out = capsys.readouterr().out
    assert summary["prompts"] == 5 and summary["lossless_fraction"] == 1.0
    serving = summary["serving"]
    assert serving["batch_size"] == 3 and serving["requests"] == 5
    for method in ("speculative", "vanilla"):
        assert serving[method]["tokens"] == 5 * 16 and serving[method]["throughput_tokens_per_s"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["serving"]["requests"] == 5
    assert "serving: 5 requests, batch size 3, all_at_once" in out and "TPOT p99 (ms)" in out
    assert "throughput speedup over vanilla batched decoding at batch size 3" in out
    again = run_experiment(cfg, tmp_path)  # complete: read back, nothing recomputed
    assert again["prompts"] == 5


def test_the_batched_experiment_stops_each_request_where_batch_1_does(family, tmp_path):
    """``generation.stop`` with ``generation.batch_size=3``: every prompt's output and finish reason
    (and vanilla's) equal the batch-1 run's, and the stop string ends some of them."""
    from hydra import compose, initialize_config_module

    from conftest import overrides
    from specpolicy.analysis.results import read_results
    from specpolicy.run.experiment import run_experiment

    args = [o for o in overrides(family, drafter="drafter") if not o.startswith("dataset.num_prompts")]
    rows = {}
    for batch in (1, 3):
        with initialize_config_module("specpolicy.conf", version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    *args,
                    "dataset.num_prompts=5",
                    f"generation.batch_size={batch}",
                    "generation.stop=[' ']",
                    "policy=failfast",
                ],
            )
        run_experiment(cfg, tmp_path / str(batch))
        rows[batch] = [
            (
                r.prompt_id,
                r.speculative.output_ids.tolist(),
                r.speculative.finish_reason,
                r.vanilla.output_ids.tolist(),
                r.vanilla.finish_reason,
            )
            for r in read_results(tmp_path / str(batch) / "results.jsonl")
        ]
    assert rows[3] == rows[1]
    assert any(r[2] == "stop_string" for r in rows[1])


@pytest.mark.parametrize(
    "override, message",
    [
        ("generation.batch_size=0", "generation.batch_size must be an integer >= 1, got 0"),
        ("generation.arrival=burst", "generation.arrival must be one of"),
        ("policy=eagle2-tree", "policy=eagle2-tree drafts trees"),
    ],
)
def test_batched_settings_are_checked_before_models_load(family, tmp_path, override, message):
    from hydra import compose, initialize_config_module

    from conftest import overrides
    from specpolicy.core.errors import ConfigError
    from specpolicy.run.experiment import run_experiment

    extra = [] if override.startswith("generation.batch_size") else ["generation.batch_size=4"]
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *overrides(family),
                *extra,
                override,
                "verifier.model=/nonexistent" if "batch_size" in override else "seed=0",
            ],
        )
    with pytest.raises(ConfigError, match=message):
        run_experiment(cfg, tmp_path)


from test_sampling import ALPHA as _ALPHA, N as _N, T as _T, _config, chi_square_pvalue, exact_joint, models  # noqa: E402,F401

BATCH_STAT_TESTS = ("vanilla", "ar", "eagle3", "dflash", "ar-static", "eagle3-static", "dflash-static")
#: per drafter, the pass that drafts several requests at once: eager (their own caches, padded) and
#: on the shared static cache of one sequence per request (``Drafter.batched``)
BATCHED_PASSES = {
    "ar": (CausalRunner, "together", "last"),
    "eagle3": (Eagle3Runner, "together", "shared"),
    "dflash": (DFlashRunner, "together", "shared"),
}


def _static_caches(drafter, capacity: int = 64) -> None:
    """Give a drafter the batch-1 static cache the compiled runtime gives it (here not compiled),
    so ``Drafter.batched`` builds the batched one its requests share (``capacity`` positions)."""
    from specpolicy.runners.decoder import StaticDecoder
    from specpolicy.runners.dflash import StaticDFlash
    from specpolicy.runners.eagle3 import StaticEagle3

    if isinstance(drafter, ARDrafter):
        drafter.static = StaticDecoder(drafter.model, drafter.max_context)
    elif isinstance(drafter, Eagle3Drafter):
        drafter.static = StaticEagle3(drafter.model, drafter.embed_tokens, capacity)
    else:
        drafter.static = StaticDFlash(drafter.model, capacity)


@pytest.mark.parametrize(
    "name", [name if name == "ar" else pytest.param(name, marks=pytest.mark.slow) for name in BATCH_STAT_TESTS]
)
def test_batched_sampling_matches_the_target_distribution_per_request(models, name, monkeypatch):  # noqa: F811
    """N requests of the same prompt, mixed with others, through the batched loop at batch size 8:
    the joint of each request's first T tokens matches the target's sampling distribution
    (``tests/core/test_sampling.py``'s chi-square test, its alpha shared with these tests too) --
    with the drafters' passes batched over the requests (each step's tokens drawn for all of them
    in row order), on their own caches and (``-static``) on the static cache of one sequence per
    request that the compiled runtime shares among them."""
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    kind, static = name.removesuffix("-static"), name.endswith("-static")
    make, prompt, sampling, tokens = _config(kind, models, rt)
    other = torch.tensor([11, 2, 6])
    prompts = [prompt if i % 4 else other for i in range(_N * 4 // 3)]
    mine = [i for i in range(len(prompts)) if i % 4]
    verifier = HFVerifier(models["target"], rt, frozenset())  # no EOS: every request makes its tokens
    drafter, policy = make()
    together = []  # requests per batched drafter pass
    if kind in BATCHED_PASSES:
        cls, eager_pass, shared_pass = BATCHED_PASSES[kind]
        batched_pass = getattr(cls, shared_pass if static else eager_pass)
        if cls in (DFlashRunner, Eagle3Runner, CausalRunner):  # the runners' passes: methods over the requests'
            spy = lambda runner, passes, *a: together.append(len(passes)) or batched_pass(runner, passes, *a)  # noqa: E731
        else:
            spy = staticmethod(lambda drafters, *a: together.append(len(drafters)) or batched_pass(drafters, *a))
        monkeypatch.setattr(cls, shared_pass if static else eager_pass, spy)
    if static:
        _static_caches(drafter)
    rt.generator.manual_seed(1)
    out = generate_batch(
        prompts, verifier, rt, max_new_tokens=tokens, batch_size=8, drafter=drafter, policy=policy, sampling=sampling
    )
    counts = torch.zeros(16, 16, 16, dtype=torch.long)
    for i in mine[:_N]:
        y = out.results[i].output_ids.tolist()
        counts[y[0], y[1], y[2]] += 1
    pvalue, df = chi_square_pvalue(counts, exact_joint(models["target"], prompt, sampling))
    if name != "vanilla":
        rounds = [r for i in mine for r in out.results[i].rounds]
        accepted, drafted = sum(r.accepted_length for r in rounds), sum(r.speculation_length for r in rounds)
        assert accepted >= 20 and accepted < drafted, (accepted, drafted)  # acceptance and rejection exercised
        assert max(together) >= 4, together  # drafted in passes over many requests at once
    assert df >= 10 and max(out.batch_sizes) == 8
    assert pvalue > _ALPHA, f"{name}: chi-square p = {pvalue:.2e} (df {df})"


def test_a_prompt_the_drafter_refuses_is_skipped_and_the_batch_stays_aligned(target, rt):
    class Picky(ARDrafter):
        def prefill(self, prompt_ids, sampling=None):
            if prompt_ids.shape[0] > 12:
                raise ValueError(f"prompt_ids has {prompt_ids.shape[0]} tokens; this drafter takes at most 12")
            super().prefill(prompt_ids, sampling)

    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompts = [torch.arange(5 + 3 * i) % (VOCAB - 3) for i in range(6)]  # 5, 8, 11, 14, 17, 20 tokens
    out = generate_batch(
        prompts,
        verifier,
        rt,
        max_new_tokens=10,
        batch_size=4,
        drafter=Picky(sharpen(tiny_lm(0, layers=1)), rt),
        policy=StaticPolicy(3),
    )
    assert sorted(out.skipped) == [3, 4, 5] and "at most 12" in out.skipped[3]
    for i in (0, 1, 2):  # the others, in rows beside refused ones, are their greedy outputs
        assert (
            out.results[i].output_ids.tolist()
            == generate(prompts[i], verifier, rt, max_new_tokens=10).output_ids.tolist()
        )


def test_one_token_prompts_first_and_refused_last_prompts_keep_the_batch_whole(target, rt, drafters):
    verifier = HFVerifier(target, rt, frozenset({EOS}), max_context=64)
    prompts = [torch.tensor([7]), torch.arange(1, 9), torch.tensor([9]), torch.arange(3, 20), torch.arange(70)]
    for drafter, policy in ((None, None), (drafters["ar"](), StaticPolicy(3))):
        for b in (1, 2, 4):
            out = generate_batch(prompts, verifier, rt, max_new_tokens=10, batch_size=b, drafter=drafter, policy=policy)
            assert sorted(out.skipped) == [4]  # the last prompt is refused: the loop ends there
            for i in range(4):
                assert (
                    out.results[i].output_ids.tolist()
                    == generate(prompts[i], verifier, rt, max_new_tokens=10).output_ids.tolist()
                ), (b, i)
    nothing = generate_batch([torch.arange(70)], verifier, rt, max_new_tokens=4, batch_size=2)
    assert list(nothing.skipped) == [0] and not nothing.results and nothing.summary()["tokens"] == 0


def test_sampling_requests_draft_on_the_shared_static_cache_and_give_it_back(target, rt):
    """A sampling run of the batched loop, as a greedy one, copies ``Drafter.batched`` (on the
    compiled runtime: one static sequence per request): every request drafts on its own sequence
    of the shared cache and gives it back when it leaves; the run is reproducible from its seed."""
    from specpolicy.core.sampling import SamplingConfig

    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter, prompts = ARDrafter(sharpen(tiny_lm(1, layers=1), 4.0), rt), _prompts(5)
    _static_caches(drafter)
    leads = []
    drafter.batched = lambda slots, _batched=drafter.batched: leads.append(_batched(slots)) or leads[-1]
    outputs = []
    for _ in range(2):
        rt.generator.manual_seed(3)
        out = generate_batch(
            prompts, verifier, rt, max_new_tokens=12, batch_size=2, drafter=drafter, policy=StaticPolicy(k=3),
            sampling=SamplingConfig(temperature=1.0),
        )  # fmt: skip
        outputs.append([out.results[i].output_ids.tolist() for i in range(5)])
        shared = leads[-1].runner.sequences
        assert sorted(shared.free) == [0, 1] and min(shared.lengths) > 0  # both sequences drafted on, freed
        assert sum(len(r.rounds) for r in out.results.values()) > 5
    assert (
        len(leads) == 2 and leads[0].runner.sequences.static is leads[1].runner.sequences.static
    )  # built once per batch size
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("static", [False, True], ids=["own-caches", "shared-static-cache"])
def test_eagle3_batched_sampling_hands_each_request_the_q_of_its_own_logits(drafters, target, rt, static, monkeypatch):
    """EAGLE-3 sampling in the batched loop (8 prompts, 4 in flight, static k = 3), its passes batched
    over the requests on their own caches and on the static cache they share: every drafted token
    is recorded with q = ``warp`` of the logits row of its own request and position, and has q > 0."""
    from specpolicy.core.sampling import SamplingConfig, warp

    sampling = SamplingConfig(temperature=0.9, top_k=24)
    took, passes = Eagle3Drafter._took, []
    recorded = []

    def spy(self, last_out, logits, tokens, confs, q=None, *rest):
        recorded.append((logits.clone(), tokens.clone(), q, self._target_of_draft))
        return took(self, last_out, logits, tokens, confs, q, *rest)

    batched_pass = Eagle3Runner.shared if static else Eagle3Runner.together
    monkeypatch.setattr(Eagle3Drafter, "_took", spy)
    monkeypatch.setattr(
        Eagle3Runner,
        "shared" if static else "together",
        lambda runner, ps: passes.append(len(ps)) or batched_pass(runner, ps),
    )
    drafter = drafters["eagle3"]()
    if static:
        _static_caches(drafter, capacity=256)
    rt.generator.manual_seed(2)
    out = generate_batch(
        _prompts(8), HFVerifier(target, rt, frozenset({EOS})), rt, max_new_tokens=16, batch_size=4,
        drafter=drafter, policy=StaticPolicy(3), sampling=sampling,
    )  # fmt: skip
    assert sorted(out.results) == list(range(8)) and max(passes) >= 3
    assert len(recorded) > 40
    for logits, tokens, q, target_of_draft in recorded:  # q over the draft vocabulary, tokens as target ids
        torch.testing.assert_close(q, warp(logits, sampling))
        assert float(q[0, target_of_draft == tokens[0]].sum()) > 0
