"""Modeled latency: the shipped profiles, the pass-count model, measured profiles, summary.json fields."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from specpolicy.analysis.oracle import analyse_run
from specpolicy.analysis.results import PromptResult
from specpolicy.analysis.summary import profile_from, summarize
from specpolicy.core.latency import (
    BUILTIN_PROFILES,
    LatencyProfile,
    fit_affine,
    load_profile,
    measure_profile,
    modeled_ms,
    modeled_speedup,
    resolve_profile,
)
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import GenerationResult, RoundRecord


def _round(k, a, passes, draft_ms=0.0, verify_ms=0.0, emitted=None, index=0):
    return RoundRecord(
        index=index,
        speculation_length=k,
        accepted_length=a,
        emitted_tokens=a + 1 if emitted is None else emitted,
        drafter_forward_passes=passes,
        reused_tokens=0,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
    )


def test_the_papers_a6000_profiles_are_shipped():
    got = {name: load_profile(name) for name in BUILTIN_PROFILES}
    assert [(p.drafter_pass_ms, p.target_ms_per_token) for n, p in got.items() if n != "measured"] == [
        (6.1, 13.5),
        (6.1, 24.7),
        (6.1, 52.6),
    ]
    assert all(got[n].verify_ms_per_draft_token == 0.0 for n in BUILTIN_PROFILES if n != "measured")
    assert not got["measured"].complete
    with pytest.raises(FileNotFoundError, match="a6000-qwen7b"):
        load_profile("h100")


def test_modeled_time_counts_passes_times_latencies():
    p = load_profile("a6000-qwen7b")
    rounds = [_round(4, 4, 4), _round(4, 4, 4)]  # 10 tokens in 2 rounds of 4 drafter passes each
    assert modeled_ms(rounds, p) == pytest.approx(2 * (4 * 6.1 + 13.5))
    assert modeled_speedup(rounds, 10, p) == pytest.approx(10 * 13.5 / (2 * (4 * 6.1 + 13.5)))
    steep = LatencyProfile("x", drafter_pass_ms=1.0, target_ms_per_token=10.0, verify_ms_per_draft_token=0.5)
    assert modeled_ms([_round(6, 2, 3)], steep) == pytest.approx(3 * 1.0 + 10.0 + 0.5 * 6)
    assert modeled_speedup([], 0, p) == 0.0


def test_fit_affine():
    assert fit_affine([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert fit_affine([4, 4], [1.0, 3.0]) == (2.0, 0.0)
    assert fit_affine([], []) == (0.0, 0.0)


def test_measured_profile_recovers_the_run_timings():
    spec = [_round(k, 0, k, draft_ms=2.0 * k, verify_ms=5.0 + 0.5 * k) for k in (2, 4, 8, 8)]
    vanilla = [_round(0, 0, 0, verify_ms=5.0) for _ in range(3)]
    p = measure_profile(spec, vanilla)
    assert (p.drafter_pass_ms, p.target_ms_per_token, p.verify_ms_per_draft_token) == pytest.approx((2.0, 5.0, 0.5))
    # pinned values are kept, null ones measured
    half = resolve_profile(LatencyProfile("m", drafter_pass_ms=9.0, target_ms_per_token=None), spec, vanilla)
    got = (half.drafter_pass_ms, half.target_ms_per_token, half.verify_ms_per_draft_token)
    assert got == pytest.approx((9.0, 5.0, 0.0))
    # a model-free drafter: no passes, no drafter cost
    assert measure_profile([_round(3, 1, 0, draft_ms=0.2, verify_ms=6.0)], vanilla).drafter_pass_ms == 0.0


@pytest.mark.parametrize(
    "node,key",
    [
        ({"name": "x", "target_ms_per_token": 0}, "target_ms_per_token"),
        ({"name": "x", "drafter_pass_ms": -1}, "drafter_pass_ms"),
        ({"name": "x", "drafter_pass_ms": "fast"}, "drafter_pass_ms"),
        ({"name": "x", "gpu": "a100"}, "unknown profile key"),
        ({"drafter_pass_ms": 1.0}, "profile.name"),
    ],
)
def test_bad_profiles_are_named(node, key):
    with pytest.raises(ValueError, match=key):
        LatencyProfile.from_config(node)


@pytest.mark.parametrize("choice", BUILTIN_PROFILES)
def test_profile_config_group(choice):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"profile={choice}"])
        default = compose("config")
    assert profile_from(OmegaConf.to_container(cfg)) == load_profile(choice)
    assert default.profile.name == "a6000-qwen7b"


def _result(rounds, tokens):
    return GenerationResult(
        output_ids=torch.arange(tokens),
        rounds=tuple(rounds),
        finish_reason="max_new_tokens",
        wall_s=1.0,
        prefill_ms=0.0,
    )


def test_every_summary_has_modeled_speedup_next_to_measured_and_labelled():
    spec = _result([_round(4, 4, 4, draft_ms=8.0, verify_ms=7.0), _round(4, 4, 4, draft_ms=8.0, verify_ms=7.0)], 10)
    van = _result([_round(0, 0, 0, verify_ms=5.0)] * 10, 10)
    config = {
        "profile": OmegaConf.to_container(
            OmegaConf.create(
                "{name: a6000-qwen14b, description: d, drafter_pass_ms: 6.1, target_ms_per_token: 24.7, "
                "verify_ms_per_draft_token: 0.0}"
            )
        )
    }
    summary = summarize(
        "ar+static", [PromptResult.of("p0", 3, spec, van)], config, Runtime("cpu", "float32").describe()
    )
    json.dumps(summary)  # serialisable
    assert summary["speedup_vs_vanilla"] == pytest.approx(1.0)  # measured: equal wall times here
    assert summary["modeled_profile"] == "a6000-qwen14b"
    assert summary["modeled_speedup_vs_vanilla"] == pytest.approx(10 * 24.7 / (2 * (4 * 6.1 + 24.7)))
    assert "MODELED" in summary["modeled"]["label"] and "not measured" in summary["modeled"]["label"]
    by = summary["modeled"]["speedup_by_profile"]
    assert set(by) == set(BUILTIN_PROFILES)
    assert by["a6000-qwen7b"] < by["a6000-qwen14b"] < by["a6000-qwen32b"]  # a slower target gains more
    # the measured profile models this machine from the run: 2 rounds of 15 ms vs 10 steps of 5 ms
    assert by["measured"] == pytest.approx(50.0 / 30.0)
    assert 0.0 < summary["oracle"]["fraction_of_oracle"] <= 1.0 + 1e-9


def test_the_oracle_cli_reproduces_the_summarys_oracle_block(tmp_path):
    """Speculation lengths of 3 to 70 with their own timings and uneven vanilla steps: the affine
    verification fit depends on how the vanilla steps are weighted, and the oracle's longest
    length on the run's longest speculation (70 > the default 60)."""
    spec_rounds = [
        _round(3, 3, 3, draft_ms=3.0, verify_ms=6.0, index=0),
        _round(6, 2, 6, draft_ms=6.5, verify_ms=7.5, index=1),
        _round(10, 10, 10, draft_ms=11.0, verify_ms=9.0, index=2),
        _round(70, 70, 70, draft_ms=75.0, verify_ms=40.0, index=3),
        _round(8, 1, 8, draft_ms=8.0, verify_ms=8.5, index=4),
    ]
    tokens = sum(r.emitted_tokens for r in spec_rounds)
    spec = _result(spec_rounds, tokens)
    van = _result([_round(0, 0, 0, verify_ms=4.0 + (i % 3), index=i) for i in range(tokens)], tokens)
    result = PromptResult.of("p0", 3, spec, van)
    summary = summarize("ar+static", [result], {}, Runtime("cpu", "float32").describe())
    (tmp_path / "results.jsonl").write_text(json.dumps(result.to_row()) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    again = analyse_run(tmp_path)
    assert again["fraction_of_oracle"] == pytest.approx(summary["oracle"]["fraction_of_oracle"])
    assert again["oracle_speedup_modeled"] == pytest.approx(summary["oracle"]["oracle_speedup_modeled"])
    assert summary["oracle"]["max_length"] == 70


def _no_baseline(verify_ms_by_length):
    """Two prompts decoded without the vanilla baseline (run.vanilla_baseline=false): rounds of the
    given speculation lengths, each accepting 2 tokens, with these verification times."""
    results = []
    for p in range(2):
        rounds = [_round(k, 2, 2, draft_ms=1.0, verify_ms=ms, index=i) for i, (k, ms) in enumerate(verify_ms_by_length)]
        results.append(PromptResult.of(f"p{p}", 3, _result(rounds, sum(r.emitted_tokens for r in rounds)), None))
    return results


def test_without_vanilla_steps_a_degenerate_step_fit_is_n_a_with_the_reason_never_zero():
    """Issue 22: run.vanilla_baseline=false, 2 prompts: the verification times of lengths 10 and 20
    extrapolate to a target step of -0.5 ms (clamped to 0 / 1e-9 before), and every figure dividing
    by it read 0.00x ("measured 0.00x", "at most 0.000 of the oracle's speedup")."""
    from rich.console import Console

    from specpolicy.analysis.oracle import describe_fraction
    from specpolicy.analysis.tables import print_summary

    summary = summarize(
        "fastdllm+failfast",
        _no_baseline([(10, 6.0), (20, 12.5), (10, 6.0), (20, 12.5)]),
        {},
        Runtime("cpu", "float32").describe(),
    )
    json.dumps(summary)
    assert summary["modeled"]["speedup_by_profile"]["measured"] is None
    assert "run.vanilla_baseline=false" in summary["modeled"]["unavailable"]["measured"]
    assert summary["modeled"]["speedup_by_profile"]["a6000-qwen7b"] > 1.0  # pass counts x a full profile: fine
    assert summary["oracle"]["fraction_of_oracle"] is None
    assert "extrapolating" in summary["oracle"]["unavailable"]
    assert describe_fraction(summary["oracle"]).startswith("n/a (no vanilla decoding step was measured")
    console = Console(width=200, record=True)
    print_summary(summary, console=console)
    text = " ".join(console.export_text().split())
    assert "measured n/a (no vanilla decoding step" in text and "oracle: n/a (" in text
    assert "0.00x" not in text and "0.000" not in text
    # one length only: nothing to extrapolate from
    single = summarize(
        "ar+static",
        _no_baseline([(5, 6.0), (5, 6.5)]),
        {
            "profile": {
                "name": "measured",
                "drafter_pass_ms": None,
                "target_ms_per_token": None,
                "verify_ms_per_draft_token": None,
            }
        },
    )
    assert single["modeled_speedup_vs_vanilla"] is None and single["modeled"]["ms"] is None
    assert "every round has speculation length 5" in single["modeled"]["unavailable"]["measured"]
    console = Console(width=200, record=True)
    print_summary(single, console=console)
    assert "n/a" in console.export_text()


def test_without_vanilla_steps_a_sound_extrapolation_is_still_used():
    results = _no_baseline([(10, 9.0), (20, 12.0), (10, 9.0), (20, 12.0)])  # step 6 ms + 0.3 ms per token
    summary = summarize("fastdllm+failfast", results, {})
    assert "unavailable" not in summary["modeled"] and "unavailable" not in summary["oracle"]
    assert measure_profile([r for res in results for r in res.speculative.rounds]).target_ms_per_token == pytest.approx(
        6.0
    )
    assert 0.0 < summary["oracle"]["fraction_of_oracle"] <= 1.0 + 1e-9
    assert summary["modeled"]["speedup_by_profile"]["measured"] > 0.5
