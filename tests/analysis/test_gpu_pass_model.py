"""The A6000 profiles' DFlash / EAGLE-3 pass costs are the memory-bound model's (no hand-typed
figure), the model reproduces the paper's own latencies it was not fitted on, and a run's drafter
picks its own pass cost in the MODELED figures."""

from __future__ import annotations

import pytest

from specpolicy.analysis.gpu_pass_model import QWEN25, dflash_pass_ms, eagle3_pass_ms, pass_ms
from specpolicy.core.latency import LatencyProfile, load_profile, modeled_summary
from specpolicy.core.types import RoundRecord


@pytest.mark.parametrize(
    "profile, target", [("a6000-qwen7b", "7b"), ("a6000-qwen14b", "14b"), ("a6000-qwen32b", "32b")]
)
def test_profiles_carry_the_models_pass_costs(profile, target):
    p = load_profile(profile)
    assert p.drafter_pass_ms_by_drafter == {
        "dflash": round(dflash_pass_ms(target), 2),
        "eagle3": round(eagle3_pass_ms(target), 2),
    }
    assert p.for_drafter("eagle3").drafter_pass_ms == p.drafter_pass_ms_by_drafter["eagle3"]
    assert p.for_drafter("fastdllm") == p


def test_the_fit_predicts_the_targets_it_was_not_fitted_on():
    for name, measured in (("14b", 24.7), ("32b", 52.6)):
        t = QWEN25[name]
        assert abs(pass_ms(t.layers, t.params()) - measured) / measured < 0.05


def test_modeled_figures_use_the_drafters_own_pass_cost():
    rounds = [
        RoundRecord(
            index=i,
            speculation_length=4,
            accepted_length=3,
            emitted_tokens=4,
            drafter_forward_passes=4,
            reused_tokens=0,
            draft_ms=1.0,
            verify_ms=1.0,
        )
        for i in range(5)
    ]
    profile = LatencyProfile(
        name="p", drafter_pass_ms=6.0, target_ms_per_token=50.0, drafter_pass_ms_by_drafter={"eagle3": 1.0}
    )
    default = modeled_summary(rounds, 20, profile, all_profiles=())
    eagle = modeled_summary(rounds, 20, profile, all_profiles=(), drafter="eagle3")
    assert default["ms"] == pytest.approx(5 * (4 * 6.0 + 50.0))
    assert eagle["ms"] == pytest.approx(5 * (4 * 1.0 + 50.0))
    assert eagle["profile"]["drafter_pass_ms"] == 1.0


def test_a_bad_per_drafter_cost_is_one_line():
    with pytest.raises(ValueError, match="profile.drafter_pass_ms_by_drafter must map drafter names to numbers"):
        LatencyProfile.from_config({"name": "x", "drafter_pass_ms_by_drafter": {"dflash": -1}})
