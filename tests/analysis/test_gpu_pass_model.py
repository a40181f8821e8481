"""The A6000 profiles' DFlash / EAGLE-3 pass costs are the memory-bound model's (no hand-typed
figure), the model reproduces the paper's own latencies it was not fitted on, and a run's drafter
picks its own pass cost in the MODELED figures."""

from __future__ import annotations

import pytest

from specpolicy.analysis.gpu_pass_model import (
    QWEN25,
    dart_pass_ms,
    deer_pass_ms,
    dflash_pass_ms,
    eagle3_pass_ms,
    easyspec_pass_ms,
    falcon_pass_ms,
    neighbour_pass_ms,
    pass_ms,
)
from specpolicy.core.latency import LatencyProfile, load_profile, modeled_summary
from specpolicy.core.types import RoundRecord


@pytest.mark.parametrize(
    "profile, target", [("a6000-qwen7b", "7b"), ("a6000-qwen14b", "14b"), ("a6000-qwen32b", "32b")]
)
def test_profiles_carry_the_models_pass_costs(profile, target):
    p = load_profile(profile)
    assert p.drafter_pass_ms_by_drafter == neighbour_pass_ms(target)
    assert p.drafter_pass_ms_by_drafter["dflash"] == round(dflash_pass_ms(target), 2)
    assert p.drafter_pass_ms_by_drafter["eagle3"] == round(eagle3_pass_ms(target), 2)
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


def test_the_neighbours_costs_follow_their_shapes():
    one_five = QWEN25["1.5b"]
    sequential = pass_ms(one_five.layers, one_five.params())
    assert sequential == pytest.approx(6.1, abs=0.01)  # the fit reproduces the drafter it was fitted on
    # EasySpec: grouping the middle attention shortens the critical path, more with larger groups
    assert easyspec_pass_ms(group=1) == pytest.approx(sequential)
    assert sequential > easyspec_pass_ms(group=2) > easyspec_pass_ms(group=4)
    # DART's 8 positions read EAGLE-3's weights once; Falcon reads the target's LM head (full vocab)
    for target in ("7b", "32b"):
        assert dart_pass_ms(target) == eagle3_pass_ms(target)
        assert eagle3_pass_ms(target) < falcon_pass_ms(target) < dflash_pass_ms(target)
    # DEER's 0.5B dLLM is cheaper than the 1.5B drafter and does not depend on the target
    assert deer_pass_ms() < sequential
