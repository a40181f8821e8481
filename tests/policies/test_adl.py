"""``policy=adl``: DiffuSpec's adaptive draft length against a worked example of Eqs. 9-11 (the
reproduction's ``ADLController.update``), its reading of the round record, and ``policy=diffuspec``
composing it with the drafter's path search."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from specpolicy.core.types import Draft, RoundRecord
from specpolicy.policies.adl import AdaptiveDraftLength


def _record(k, accepted, stop=False, reused=0):
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=accepted,
        emitted_tokens=accepted + 1,
        drafter_forward_passes=1,
        reused_tokens=reused,
        draft_ms=0.0,
        verify_ms=0.0,
        draft_stop_reason="stop_token" if stop else "policy_bound",
    )


def test_a_worked_example_of_the_rule():
    policy = AdaptiveDraftLength(k_min=20, k_max=30, delta=10, rho=0.5)
    assert policy.next_length(Draft.empty()) == 30  # k_1 = k_max
    # round 1: 30 drafted, no EOS -> L_gen 30, L_acc 12: ema_gen 15, ema_acc 6; 6 < 15: k = clip(15, 20, 30) = 20
    policy.update(_record(30, 12))
    assert (policy.gen_ema, policy.acc_ema, policy.k) == (15.0, 6.0, 20)
    # round 2: 20 drafted, EOS the 9th -> L_gen 8; L_acc 8: ema_gen 11.5, ema_acc 7; k = clip(11, 20, 30) = 20
    policy.update(_record(9, 8, stop=True))
    assert (policy.gen_ema, policy.acc_ema, policy.k) == (11.5, 7.0, 20)
    # round 3: EOS the 2nd, 1 accepted -> L_gen 1: ema_gen 6.25, ema_acc 4.0 -> k_min
    policy.update(_record(2, 1, stop=True))
    assert policy.k == 20
    # acceptance catching up: L_gen 4 = L_acc 4 twice -> ema_gen 4.56, ema_acc 4.0 ... then 4.28 / 4.0
    small = AdaptiveDraftLength(k_min=1, k_max=30, delta=10, rho=0.5)
    small.update(_record(4, 4, stop=False))  # L_gen 4, L_acc 4: emas 2, 2 -> floor(2) + 10 = 12
    assert small.k == 12 and small.next_length(Draft.empty()) == 12
    small.update(_record(12, 3))  # L_gen 12, L_acc 3: emas 7, 2.5 -> 7
    assert small.k == 7


def test_reused_tokens_are_not_generated_and_a_prompt_starts_afresh():
    policy = AdaptiveDraftLength(k_min=1, k_max=30, delta=0, rho=1.0)
    policy.update(_record(10, 2, reused=4))  # 6 drafted: L_gen 6
    assert policy.k == 6
    policy.reset()
    assert (policy.k, policy.gen_ema, policy.acc_ema) == (30, 0.0, 0.0)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"k_min": 0}, "k_min"),
        ({"k_min": 5, "k_max": 4}, "k_max"),
        ({"delta": -1}, "delta"),
        ({"rho": 0.0}, "rho"),
        ({"rho": True}, "rho"),
    ],
)
def test_bad_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"policy\.{key} "):
        AdaptiveDraftLength(**kwargs)


def test_policy_diffuspec_is_adl_with_the_path_search_on():
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=["drafter=dflash", "policy=diffuspec", "policy.k_min=5"])
    assert cfg.policy.name == "adl" and cfg.policy.k_min == 5 and cfg.policy.k_max == 30
    assert cfg.drafter.path_search == "cps" and cfg.drafter.cps_lambda == 0.5
