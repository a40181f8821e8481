"""``benchmarks/ceiling.py``: the reference verifier reproduces the target's rounds, the verdict
drafter's confidences are the verification's outcome, and the benchmark runs end to end on a
tiny on-disk family (float64, CPU)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from conftest import load_benchmark
from specpolicy.core.decoding import generate


@pytest.fixture(scope="module")
def ceiling():
    return load_benchmark("ceiling")


@pytest.fixture(scope="module")
def models(ceiling, family):
    def bench(ar_drafter):
        return ceiling.peers.Bench(
            argparse.Namespace(
                device="cpu",
                dtype="float64",
                target=str(family["target"]),
                ar_drafter=str(ar_drafter),
                dllm_drafter=str(family["drafter"]),
            )
        )

    same = bench(family["target"])  # drafts with the target's own weights: long accepted runs
    other = bench(family["drafter"])  # another model: early rejections
    runtime, verifier = same.runtime, same.verifier
    prompts = [torch.tensor([5, 17, 42, 9, 33]), torch.tensor([7, 7, 21, 64])]
    references = [generate(p, verifier, runtime, max_new_tokens=24).output_ids for p in prompts]
    drafters = {"same": same.drafters["ar"], "other": other.drafters["ar"], "fastdllm": other.drafters["fastdllm"]}
    return runtime, verifier, drafters, prompts, references, same.policy


@pytest.mark.parametrize("which", ["same", "other", "fastdllm"])
def test_reference_verifier_reproduces_the_targets_rounds(ceiling, models, which):
    runtime, verifier, drafters, prompts, references, policy = models
    reference = ceiling.ReferenceVerifier(verifier)
    for p, ref in zip(prompts, references):
        real = generate(p, verifier, runtime, max_new_tokens=24, drafter=drafters[which], policy=policy("static", k=3))
        reference.reference = ref
        replayed = generate(
            p, reference, runtime, max_new_tokens=24, drafter=drafters[which], policy=policy("static", k=3)
        )
        assert torch.equal(replayed.output_ids, ref) and torch.equal(real.output_ids, ref)
        assert [r.accepted_length for r in replayed.rounds] == [r.accepted_length for r in real.rounds]
        # the target's tokens up to the correction / bonus (past it the target reads the wrong draft)
        assert [r.target_token_ids[: r.accepted_length + 1] for r in replayed.rounds] == [
            r.target_token_ids[: r.accepted_length + 1] for r in real.rounds
        ]


def test_verdict_confidences_are_the_verification_outcome(ceiling, models):
    runtime, verifier, drafters, prompts, references, policy = models
    reference = ceiling.ReferenceVerifier(verifier)
    verdict = ceiling.VerdictDrafter(drafters["other"], reference)
    outcomes = set()
    for p, ref in zip(prompts, references):
        reference.reference = ref
        out = generate(p, reference, runtime, max_new_tokens=24, drafter=verdict, policy=policy("static", k=4))
        for r in out.rounds:
            a = r.accepted_length
            expected = (1.0,) * a + (0.0,) * (r.speculation_length - a)
            assert r.confidences == expected
            outcomes.add(a == r.speculation_length)
    assert outcomes == {True, False}  # both fully accepted and rejected drafts were checked


def test_the_benchmark_runs_and_the_checks_are_consistent(ceiling, family, tmp_path):
    out = tmp_path / "ceiling.json"
    results = ceiling.main(
        [
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "16",
            "--target",
            str(family["target"]),
            "--ar-drafter",
            str(family["target"]),
            "--dllm-drafter",
            str(family["drafter"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    for drafter in ("fastdllm", "ar"):
        rows = results["drafters"][drafter]["methods"]
        assert list(rows) == [
            "static-k5",
            "failfast",
            "goodput",
            "goodput-hindsight",
            "goodput-verdict",
            "goodput-verdict-hindsight",
        ]
        for row in rows.values():
            assert row["oracle_ms"] > 0 and row["policy_ms"] > 0
    # the AR drafter is the target itself: the oracle drafts to the end, every policy is costed
    # against it and none beats it (exact replay, same cost model)
    for row in results["drafters"]["ar"]["methods"].values():
        assert row["fraction_of_oracle"] <= 1.0 + 1e-9
        # every drafted token is accepted: no pass finds only rejected tokens, none is verified in vain
        assert row["wasted_pass_ms"] == row["wasted_verify_ms"] == row["zero_accept_rounds"] == 0
        assert row["drafter_passes"] > 0


def test_a_reference_ending_in_eos_ends_the_run_there(ceiling, models):
    runtime, verifier, drafters, prompts, references, policy = models
    reference = ceiling.ReferenceVerifier(verifier)
    eos = min(verifier.eos_token_ids)
    cut = torch.cat((references[0][:9], torch.tensor([eos])))  # the "target" stops after 10 tokens
    assert not torch.equal(references[0][:10], cut)  # the drafter (the target's weights) will miss the EOS
    reference.reference = cut
    out = generate(
        prompts[0], reference, runtime, max_new_tokens=24, drafter=drafters["same"], policy=policy("static", k=4)
    )
    assert torch.equal(out.output_ids, cut) and out.finish_reason == "eos"


def test_frozen_keeps_the_calibration_and_still_learns_its_throughput(ceiling, models):
    runtime, verifier, drafters, prompts, references, policy = models
    reference = ceiling.ReferenceVerifier(verifier)
    profile = {"name": "known", "drafter_pass_ms": 1.0, "target_ms_per_token": 5.0, "verify_ms_per_draft_token": 0.5}
    learned = ceiling.run(
        prompts, references, reference, drafters["other"], policy("goodput", cost_profile=profile), runtime, 24
    )
    fresh = ceiling.frozen(policy("goodput", cost_profile=profile), learned)
    fitted, tokens = fresh.calibration.table().copy(), fresh.calibration.observations
    assert tokens > 0 and fresh.throughput.samples == 0
    ceiling.run(prompts, references, reference, drafters["other"], fresh, runtime, 24)
    assert (fresh.calibration.table() == fitted).all() and fresh.calibration.observations == tokens
    assert fresh.throughput.samples > 0  # verified rounds still teach it its throughput
