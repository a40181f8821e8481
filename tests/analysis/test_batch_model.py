"""The MODELED throughput of the batched loop (``specpolicy.analysis.batch_model``): the roofline (flat up to
its knee, linear past it), the per-round counts the batched loop records (``BatchResult``
``padded_tokens`` / ``drafter_passes``, checked against every request's own rounds), vanilla's
ratio of 1, speculation modeled as paying less at a large batch than alone, the profile keys'
validation, and the figures in the experiment's ``serving`` block and serving table."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.analysis.batch_model import (
    BATCH_MODELED_LABEL,
    COMPUTE_EFFICIENCY,
    RoundCounts,
    knee_tokens,
    modeled_batched,
    modeled_ms,
    ms_per_token_compute,
    target_pass_ms,
)
from specpolicy.core.batching import generate_batch
from specpolicy.core.latency import LatencyProfile, load_profile, modeled_ms as batch1_modeled_ms
from specpolicy.core.runtime import Runtime
from specpolicy.drafters.ar import ARDrafter
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier

GPU_PROFILES = ("a6000-qwen7b", "a6000-qwen14b", "a6000-qwen32b")
# 2 x 12.5e9 FLOP per token at 100 TFLOP/s x 0.5 = 0.5 ms per token; a 10 ms step: the knee at 20 tokens
TOY = LatencyProfile(
    "toy",
    drafter_pass_ms=2.0,
    target_ms_per_token=10.0,
    target_params=12.5e9,
    peak_tflops=100.0,
    compute_efficiency=0.5,
    drafter_pass_ms_by_drafter={"eagle3": 0.5},
)


def test_the_roofline_is_flat_below_the_knee_and_linear_above():
    assert ms_per_token_compute(TOY) == pytest.approx(0.5) and knee_tokens(TOY) == pytest.approx(20.0)
    assert [target_pass_ms(t, TOY) for t in (1, 5, 19, 20)] == [10.0] * 4  # memory-bound: one step
    assert target_pass_ms(21, TOY) == pytest.approx(10.5) and target_pass_ms(40, TOY) == pytest.approx(20.0)
    assert target_pass_ms(80, TOY) == pytest.approx(2 * target_pass_ms(40, TOY))  # compute-bound: linear
    # without compute_efficiency the documented default applies
    default = replace(TOY, compute_efficiency=None)
    assert ms_per_token_compute(default) == pytest.approx(2 * 12.5e9 / (100e12 * COMPUTE_EFFICIENCY) * 1e3)


@pytest.mark.parametrize("name,knee", [("a6000-qwen7b", 82), ("a6000-qwen14b", 78), ("a6000-qwen32b", 74)])
def test_the_shipped_knees_are_where_the_docstring_says(name, knee):
    p = load_profile(name)
    assert p.peak_tflops == 154.8 and p.compute_efficiency == 0.6
    assert knee_tokens(p) == pytest.approx(knee, abs=0.6)
    # the README's remark: verification on the A6000 is near-flat up to ~64 tokens
    assert target_pass_ms(64, p) == p.target_ms_per_token < target_pass_ms(128, p)


def test_a_round_pays_its_longest_drafting_and_its_padded_target_pass():
    counts = RoundCounts(padded_tokens=(4, 40), drafter_passes=(3, 0), tokens=9)
    assert modeled_ms(counts, TOY) == pytest.approx(3 * 2.0 + 10.0 + 20.0)
    assert modeled_ms(counts, TOY, "eagle3") == pytest.approx(3 * 0.5 + 10.0 + 20.0)  # the drafter's own pass ms
    out = modeled_batched(counts, None, "eagle3", profiles=[TOY])["by_profile"]["toy"]
    assert out["speculative_tokens_per_s"] == pytest.approx(9 / 31.5e-3)
    assert out["vanilla_tokens_per_s"] is None and out["throughput_speedup"] is None
    assert RoundCounts((1,), (2,), 3) + RoundCounts((5,), (0,), 4) == RoundCounts((1, 5), (2, 0), 7)


def test_measured_gets_no_batched_figure_and_the_runs_profile_replaces_its_namesake():
    van = RoundCounts((2, 2, 1), (0, 0, 0), 5)
    out = modeled_batched(van, van)
    assert out["label"] == BATCH_MODELED_LABEL and "MODELED" in out["label"] and "roofline" in out["label"]
    assert set(out["by_profile"]) == set(GPU_PROFILES)
    assert "measured" in out["unavailable"] and "does not apply" in out["unavailable"]["measured"]
    with pytest.raises(ValueError, match="profile measured gives no target_params"):
        ms_per_token_compute(load_profile("measured"))
    faster = replace(load_profile("a6000-qwen7b"), target_ms_per_token=1.0)
    mine = modeled_batched(van, van, selected=faster)["by_profile"]
    assert mine["a6000-qwen7b"]["vanilla_ms"] == pytest.approx(3.0)  # the run's numbers, not the shipped 13.5
    assert modeled_batched(van, van, selected=TOY)["by_profile"].keys() == {*GPU_PROFILES, "toy"}


@pytest.mark.parametrize(
    "key,value",
    [
        ("target_params", 0),
        ("target_params", -7e9),
        ("target_params", "7B"),
        ("target_params", True),
        ("peak_tflops", 0.0),
        ("peak_tflops", math.inf),
        ("compute_efficiency", 0),
        ("compute_efficiency", 1.5),
        ("compute_efficiency", math.nan),
    ],
)
def test_bad_roofline_keys_are_named(key, value):
    with pytest.raises(ValueError, match=rf"^profile\.{key} must be a number"):
        LatencyProfile.from_config({"name": "x", key: value})


def test_roofline_keys_load():
    p = LatencyProfile.from_config({"name": "x", "target_params": 7, "peak_tflops": 100, "compute_efficiency": 1})
    assert (p.target_params, p.peak_tflops, p.compute_efficiency) == (7.0, 100.0, 1.0)
    assert load_profile("a6000-qwen32b").target_params == 32.8e9 and load_profile("measured").target_params is None


@pytest.fixture(scope="module")
def rt():
    return Runtime(device="cpu", dtype="float64", seed=0)


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=4, vocab=VOCAB), 4.0)


def _run(target, rt, batch_size, drafter=None, policy=None, n=4, max_new_tokens=12):
    return generate_batch(
        random_prompts(n, seed=5),
        HFVerifier(target, rt, frozenset({EOS})),
        rt,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        drafter=drafter,
        policy=policy,
    )


def test_the_batched_loop_records_each_rounds_padded_tokens_and_drafter_passes(target, rt):
    """Every request is admitted before the first round (all arrive at once, batch size = requests),
    so round j holds every request with more than j rounds: its padded tokens and drafter passes
    follow from the requests' own round records."""
    out = _run(target, rt, 4, ARDrafter(sharpen(tiny_lm(0, layers=1)), rt), FailFastPolicy(n=2, tau=0.05, n_max=8))
    rounds = [out.results[i].rounds for i in range(4)]
    assert len(out.padded_tokens) == len(out.drafter_passes) == len(out.batch_sizes) == max(map(len, rounds))
    for j, (padded, passes) in enumerate(zip(out.padded_tokens, out.drafter_passes)):
        here = [r[j] for r in rounds if len(r) > j]
        assert out.batch_sizes[j] == len(here)
        assert padded == len(here) * (1 + max(r.speculation_length for r in here)) >= out.verify_tokens[j]
        assert passes == max(r.drafter_forward_passes for r in here)
    assert max(out.drafter_passes) > 0 and any(p > v for p, v in zip(out.padded_tokens, out.verify_tokens))
    assert RoundCounts.of(out).tokens == sum(len(g.output_ids) for g in out.results.values())
    van = _run(target, rt, 4)
    assert van.padded_tokens == van.batch_sizes and set(van.drafter_passes) == {0}  # one token per row, no drafter


def test_vanilla_over_itself_is_1_and_batch_1_matches_the_batch_1_model(target, rt):
    van = RoundCounts.of(_run(target, rt, 4))
    for m in modeled_batched(van, van)["by_profile"].values():
        assert m["throughput_speedup"] == pytest.approx(1.0) and m["vanilla_tokens_per_s"] > 0
    # batch 1, drafts far below the knee: the roofline gives the batch-1 profile's modeled time
    one = _run(target, rt, 1, ARDrafter(sharpen(tiny_lm(0, layers=1)), rt), StaticPolicy(3))
    spec_rounds = [r for g in one.results.values() for r in g.rounds]
    for name in GPU_PROFILES:
        p = load_profile(name)
        assert modeled_ms(RoundCounts.of(one), p, "ar") == pytest.approx(batch1_modeled_ms(spec_rounds, p))


def test_speculation_is_modeled_as_paying_less_at_a_large_batch(target, rt):
    """The same requests, the same drafts (each request drafts and accepts as it does alone): at
    batch 16, 7 tokens per row put the target pass past the knee while vanilla's 16 stay below it,
    so the modeled speedup over vanilla at the same batch size shrinks -- the roofline, not a number
    written here."""
    drafter = ARDrafter(target, rt)  # the target drafting for itself: every draft accepted
    ratio = {}
    for b in (1, 16):
        spec = _run(target, rt, b, drafter, StaticPolicy(6), n=16, max_new_tokens=29)
        van = _run(target, rt, b, n=16, max_new_tokens=29)
        assert b == 1 or max(spec.padded_tokens) > knee_tokens(load_profile("a6000-qwen7b"))
        out = modeled_batched(RoundCounts.of(spec), RoundCounts.of(van), "ar")["by_profile"]
        ratio[b] = {name: out[name]["throughput_speedup"] for name in GPU_PROFILES}
    for name in GPU_PROFILES:
        assert 1.0 < ratio[16][name] < ratio[1][name], (name, ratio)


def test_the_experiment_reports_modeled_batched_throughput(family, tmp_path, capsys):
    """``generation.batch_size=3``: ``serving.modeled`` in summary.json, MODELED rows in the printed
    serving table, the ``measured`` profile reported as not applicable."""
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
                "dataset.num_prompts=3",
                "generation.batch_size=3",
                "policy=static",
                "profile=a6000-qwen32b",
            ],
        )
    run_experiment(cfg, tmp_path)
    out = capsys.readouterr().out
    modeled = json.loads((tmp_path / "summary.json").read_text())["serving"]["modeled"]
    assert modeled["label"] == BATCH_MODELED_LABEL and modeled["drafter"] == "ar"
    assert set(modeled["by_profile"]) == set(GPU_PROFILES) and "measured" in modeled["unavailable"]
    for m in modeled["by_profile"].values():
        assert m["speculative_tokens_per_s"] > 0 and m["vanilla_tokens_per_s"] > 0
        assert m["throughput_speedup"] == pytest.approx(m["speculative_tokens_per_s"] / m["vanilla_tokens_per_s"])
    assert "MODELED a6000-qwen32b (tokens/s)" in out and "MODELED rows: MODELED (roofline" in out
