"""The ``goodput`` policy and its calibration: decisions driven through the loop's own drafting
function (``specpolicy.core.decoding.draft_round``) with a scripted drafter and known costs, the online
calibration and cost estimates against known curves, configuration errors, and the Fast-dLLM
drafter's ``Draft.lookahead`` that tells the policy where passes begin."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core.calibration import (
    BATCH_ROUNDS,
    BATCH_WARMUP,
    AcceptanceCalibration,
    calibration_from_rounds,
    online_predictions,
    reliability,
)
from specpolicy.core.decoding import draft_round, generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.policies.goodput import GoodputPolicy, OnlineCosts
from specpolicy.verifiers.hf import HFVerifier

ROOM = 1_000


def profile(pass_ms: float, target_ms: float = 10.0, per_token_ms: float = 0.0) -> dict:
    """A pinned cost profile (``policy.cost_profile`` as a mapping)."""
    return {
        "name": "test",
        "drafter_pass_ms": pass_ms,
        "target_ms_per_token": target_ms,
        "verify_ms_per_draft_token": per_token_ms,
    }


class ScriptedDrafter(Drafter):
    """Proposes tokens with scripted confidences, decoding ``chunk`` tokens per forward pass: a
    request past the decoded frontier costs one pass per ``chunk`` tokens and the rest of the
    chunk is reported as ``Draft.lookahead`` (``chunk=1``: an AR drafter; larger: Fast-dLLM-like).
    ``confidence``: one value for every token, or a seeded generator's draw per token from
    ``choices``."""

    name = "scripted"

    def __init__(
        self,
        confidence: float = 1.0,
        chunk: int = 1,
        choices: tuple[float, ...] = (),
        seed: int = 0,
        script: tuple[float, ...] = (),
        report_ahead: bool = False,
    ):
        self.confidence, self.chunk, self.choices, self.script = confidence, chunk, choices, script
        self.report_ahead = report_ahead  # report ``Draft.lookahead_confidences`` (as Fast-dLLM does)
        self.rng = np.random.default_rng(seed)
        self.commit(None, None)

    def prefill(self, prompt_ids, sampling=None) -> None:
        self.commit(None, None)

    def draft(self, num_tokens: int) -> Draft:
        self.k += num_tokens
        while self.decoded < self.k:
            if self.script:
                new = self.script[self.decoded : self.decoded + self.chunk]
            elif self.choices:
                new = self.rng.choice(self.choices, self.chunk)
            else:
                new = [self.confidence] * self.chunk
            self.confs += [float(c) for c in new]
            self.decoded += self.chunk
            self.passes += 1
        ahead = torch.tensor(self.confs[self.k : self.decoded]) if self.report_ahead else None
        return Draft(
            token_ids=torch.arange(self.k),
            confidences=torch.tensor(self.confs[: self.k]),
            forward_passes=self.passes,
            lookahead=self.decoded - self.k,
            lookahead_confidences=ahead,
        )

    def commit(self, draft, verification) -> None:
        self.k = self.decoded = self.passes = 0
        self.confs: list[float] = []


def play(
    policy: GoodputPolicy,
    drafter: ScriptedDrafter,
    accept,
    pass_ms: float = 0.0,
    verify_base: float = 0.0,
    verify_per_token: float = 0.0,
    room: int = ROOM,
) -> tuple[Draft, str]:
    """One round: draft through the loop's ``draft_round``, then feed the policy the round's record with
    ``accept(draft)`` tokens accepted and timings ``passes x pass_ms`` / ``verify_base + per_token x k``
    (0 = untimed). Returns ``(draft, draft stop reason)``."""
    draft, reason = draft_round(drafter, policy, room, "cpu")
    k = draft.length
    a = accept(draft)
    policy.update(
        RoundRecord(
            index=0,
            speculation_length=k,
            accepted_length=a,
            emitted_tokens=a + 1,
            drafter_forward_passes=draft.forward_passes,
            reused_tokens=0,
            draft_ms=draft.forward_passes * pass_ms,
            verify_ms=verify_base + verify_per_token * k if verify_base else 0.0,
            confidences=tuple(draft.confidences.tolist()),
        )
    )
    drafter.commit(draft, None)
    return draft, reason


def all_accepted(draft: Draft) -> int:
    return draft.length


def none_accepted(draft: Draft) -> int:
    return 0


def calibrated_acceptance(seed: int = 0):
    """``accept(draft)``: each token right with probability equal to its confidence, given the
    earlier ones (a perfectly calibrated drafter)."""
    rng = np.random.default_rng(seed)

    def accept(draft: Draft) -> int:
        right = rng.uniform(size=draft.length) < draft.confidences.numpy()
        return draft.length if right.all() else int(np.argmin(right))

    return accept


# -- decisions --------------------------------------------------------------------------------------


def test_extends_to_max_length_when_acceptance_is_certain_and_drafting_cheap():
    policy = GoodputPolicy(max_length=24, cost_profile=profile(pass_ms=0.5))
    drafter = ScriptedDrafter(confidence=1.0)
    for _ in range(5):  # a few rounds in which every drafted token is accepted
        draft, reason = play(policy, drafter, all_accepted)
    assert draft.length == 24 and reason == "policy_bound"
    assert policy.calibration.probability([1.0], 1)[0] > 0.9


def test_stops_after_the_first_pass_when_acceptance_is_zero():
    # A fresh policy drafts (its prior gives an undrafted token 0.5); the first token's confidence 0
    # calibrates to ~0.05, so no further pass pays: it stops at once, with one pass spent.
    drafter = ScriptedDrafter(confidence=0.0, chunk=1)
    draft, reason = draft_round(drafter, GoodputPolicy(cost_profile=profile(pass_ms=2.0)), ROOM, "cpu")
    assert (draft.length, draft.forward_passes, reason) == (1, 1, "low_confidence")
    # A chunked drafter: the chunk's decoded tokens cost nothing to add (flat verification), but no
    # second pass is spent.
    drafter = ScriptedDrafter(confidence=0.0, chunk=8)
    draft, reason = draft_round(drafter, GoodputPolicy(cost_profile=profile(pass_ms=2.0)), ROOM, "cpu")
    assert (draft.forward_passes, reason) == (1, "low_confidence") and draft.length <= 8


def test_chooses_length_0_when_no_length_pays():
    policy = GoodputPolicy(cost_profile=profile(pass_ms=2.0), probe_interval=0)
    drafter = ScriptedDrafter(confidence=0.9)
    for _ in range(30):  # the target rejects every draft: acceptance is learned to be ~0
        play(policy, drafter, none_accepted)
    draft, reason = draft_round(drafter, policy, ROOM, "cpu")
    assert (draft.length, reason) == (0, "length_0")
    # Before any data: one pass (30 ms) would have to save three verifications (10 ms each), more
    # than one drafted token can ever give.
    policy = GoodputPolicy(cost_profile=profile(pass_ms=30.0), probe_interval=0)
    assert draft_round(ScriptedDrafter(confidence=1.0), policy, ROOM, "cpu")[1] == "length_0"


def test_probes_after_probe_interval_plain_rounds():
    policy = GoodputPolicy(cost_profile=profile(pass_ms=2.0), probe_interval=4)
    drafter = ScriptedDrafter(confidence=0.9)
    for _ in range(30):
        play(policy, drafter, none_accepted)
    lengths = [play(policy, drafter, none_accepted)[0].length for _ in range(20)]
    probes = [i for i, k in enumerate(lengths) if k]
    assert len(probes) == 4 and np.all(np.diff(probes) == 5)  # 4 plain rounds, then one probe
    assert {lengths[i] for i in probes} == {1}  # a probe drafts one token and stops (nothing is accepted)


def test_switches_from_extend_to_stop_when_verify_cost_per_token_rises():
    # Measured costs: drafting 1 ms per pass, verification 10 ms flat -- then 10 ms + 10 ms per draft
    # token (verifying a token costs a plain decoding step: no draft can pay). The drafter is
    # calibrated (a token is right with its confidence's probability).
    policy = GoodputPolicy(max_length=40)
    drafter = ScriptedDrafter(choices=(0.7, 0.97, 0.995, 0.995))
    accept = calibrated_acceptance()
    flat = [play(policy, drafter, accept, pass_ms=1.0, verify_base=10.0)[0].length for _ in range(100)]
    assert np.mean(flat[-50:]) >= 6 and policy.costs.verify_slope == pytest.approx(0.0, abs=1e-6)
    rising = [
        play(policy, drafter, accept, pass_ms=1.0, verify_base=10.0, verify_per_token=10.0)[0].length
        for _ in range(450)
    ]
    # The fit follows the rise (once drafts stop, plain rounds only pin the intercept; older rounds
    # fade at VERIFY_DECAY per round) and the drafts stop: plain decoding but for probes.
    assert policy.costs.verify_slope > 5.0 and policy.costs.verify_base == pytest.approx(10.0, rel=0.05)
    assert np.mean(rising[-50:]) <= 1.0 and rising[-50:].count(0) >= 40
    # Pinned costs, one calibration: the switch decision by decision, as the per-token cost rises.
    lengths = []
    for per_token in (0.0, 1.0, 2.0, 4.0, 8.0, 16.0):
        pinned = GoodputPolicy(
            max_length=40, cost_profile=profile(pass_ms=1.0, per_token_ms=per_token), probe_interval=0
        )
        pinned.calibration = policy.calibration
        lengths.append(draft_round(ScriptedDrafter(confidence=0.995), pinned, ROOM, "cpu")[0].length)
    assert lengths == sorted(lengths, reverse=True) and lengths[0] >= 20 and lengths[-1] == 0, lengths


def test_plans_past_a_front_loaded_chunk():
    """One token does not pay for a pass, a whole chunk of 8 does: the policy looks ahead over
    the chunk (a myopic one-token test would stop)."""
    pass_ms, verify = 15.0, 10.0  # lambda starts at plain decoding's 1/10 tokens per ms: 1.5 tokens per pass
    chunked = GoodputPolicy(cost_profile=profile(pass_ms=pass_ms, target_ms=verify), probe_interval=4)
    lengths = [play(chunked, ScriptedDrafter(confidence=1.0, chunk=8), all_accepted)[0].length for _ in range(8)]
    # Its first round is a probe (no data yet); having seen 8 tokens per pass, it drafts whole chunks.
    assert min(lengths) >= 8
    assert chunked.first_chunk.numerator == pytest.approx(8.0)  # learned: 8 tokens per pass
    draft, _ = draft_round(ScriptedDrafter(confidence=1.0, chunk=8), chunked, ROOM, "cpu")
    assert draft.forward_passes >= 2 and draft.length > 8
    one = GoodputPolicy(cost_profile=profile(pass_ms=pass_ms, target_ms=verify), probe_interval=0)
    one.calibration.observe([1.0] * 8, 1)  # p(1.0) ~ 0.9 at the first position, ~0.5 for the rest
    assert draft_round(ScriptedDrafter(confidence=1.0, chunk=1), one, ROOM, "cpu")[0].length == 0


@pytest.mark.parametrize(
    "per_token_ms, expected",
    [
        (0.0, [1, 7, 1, 7, 1]),  # a pass, its 7 decoded tokens at once (free), the next pass, ...
        (0.01, [1, 1, 1, 1, 1, 1, 1, 1, 1]),  # decoded tokens cost verification: one by one, each seen
    ],
)
def test_takes_decoded_lookahead_then_asks_one_token_past_it(per_token_ms, expected):
    policy = GoodputPolicy(cost_profile=profile(pass_ms=0.1, per_token_ms=per_token_ms))
    for _ in range(5):
        play(policy, ScriptedDrafter(confidence=1.0, chunk=8), all_accepted)
    answers, d, passes = [], Draft.empty(), []
    drafter = ScriptedDrafter(confidence=1.0, chunk=8)
    for _ in expected:
        answers.append(policy.next_length(d))
        d = drafter.draft(answers[-1])
        passes.append(d.forward_passes)
    assert answers == expected
    assert passes[-1] == math.ceil(sum(expected) / 8)  # one pass per chunk of 8


def test_plans_over_reported_lookahead_confidences_in_one_answer():
    # Fast-dLLM-like chunks of 8 whose confidences are reported before they are asked for: with a
    # confident run then a hopeless token at position 6, the policy takes exactly the five
    # confident tokens in one answer (no per-token round trips) and then stops.
    policy = GoodputPolicy(cost_profile=profile(pass_ms=0.1, per_token_ms=0.5))
    for _ in range(20):  # learn that confidence 1.0 is accepted and 0.0 is not
        play(
            policy,
            ScriptedDrafter(chunk=8, script=(1.0,) * 5 + (0.0,) * 3, report_ahead=True),
            lambda d: min(d.length, 5),
        )
    drafter = ScriptedDrafter(chunk=8, script=(1.0,) * 5 + (0.0,) * 3, report_ahead=True)
    answers, d = [], Draft.empty()
    while (n := policy.next_length(d)) > 0:
        answers.append(n)
        d = drafter.draft(n)
    assert answers == [1, 4] and d.length == 5 and d.forward_passes == 1
    # the same chunks without reported confidences: one token at a time (each seen before the next)
    blind = ScriptedDrafter(chunk=8, script=(1.0,) * 5 + (0.0,) * 3)
    answers, d = [], Draft.empty()
    while (n := policy.next_length(d)) > 0:
        answers.append(n)
        d = blind.draft(n)
    assert answers == [1] * 6 and d.length == 6


def test_takes_reported_lookahead_and_one_token_past_it_when_the_plan_runs_further():
    policy = GoodputPolicy(max_length=20, cost_profile=profile(pass_ms=0.1, per_token_ms=0.01))
    for _ in range(5):
        play(policy, ScriptedDrafter(confidence=1.0, chunk=8, report_ahead=True), all_accepted)
    drafter = ScriptedDrafter(confidence=1.0, chunk=8, report_ahead=True)
    answers, d = [], Draft.empty()
    while (n := policy.next_length(d)) > 0:
        answers.append(n)
        d = drafter.draft(n)
    assert answers == [1, 8, 8, 3] and d.length == 20 and d.forward_passes == 3
    assert policy.draft_stop_reason == "policy_bound"  # stopped at max_length, not for low confidence
    _, reason = play(policy, ScriptedDrafter(confidence=1.0, chunk=8, report_ahead=True), all_accepted)
    assert reason == "policy_bound"  # as the loop records it


def test_reset_keeps_estimates_unless_configured_otherwise():
    for keep in (True, False):
        policy = GoodputPolicy(keep_across_prompts=keep, cost_profile=profile(pass_ms=1.0))
        for _ in range(5):
            play(policy, ScriptedDrafter(confidence=0.5), none_accepted)
        seen = policy.calibration.observations
        policy.reset()
        assert policy.calibration.observations == (seen if keep else 0)


def test_measures_costs_from_round_timings():
    costs = OnlineCosts()
    for k in range(0, 12):
        costs.observe(RoundRecord(0, k, 0, 1, 2 * k, 0, draft_ms=3.0 * 2 * k, verify_ms=12.0 + 0.5 * k))
    assert costs.pass_ms == pytest.approx(3.0)
    assert (costs.verify_base, costs.verify_slope) == (pytest.approx(12.0), pytest.approx(0.5))
    assert costs.draft_ms_per_token == 0.0
    costs.observe(RoundRecord(0, 4, 0, 1, 0, 0, draft_ms=0.2, verify_ms=14.0))  # a model-free drafter's round
    assert costs.draft_ms_per_token == pytest.approx(0.05)
    for _ in range(20):  # a steady drafter, then one stall of 100x: the estimate barely moves
        costs.observe(RoundRecord(0, 2, 0, 1, 1, 0, draft_ms=3.0, verify_ms=13.0))
    costs.observe(RoundRecord(0, 2, 0, 1, 1, 0, draft_ms=300.0, verify_ms=1300.0))
    assert costs.pass_ms < 3.0 * 1.25 and costs.verify_ms(2) < 13.0 * 1.1
    pinned = OnlineCosts(GoodputPolicy(cost_profile="a6000-qwen32b").profile)
    pinned.observe(RoundRecord(0, 4, 0, 1, 2, 0, draft_ms=100.0, verify_ms=100.0))  # timings are ignored
    assert (pinned.pass_ms, pinned.verify_base, pinned.verify_slope) == (6.1, 52.6, 0.0)


def test_the_plain_step_stands_apart_from_the_drafted_rounds_fit():
    """A forward over 2 positions costing far more than over 1 (CPU) is a step, not a slope: plain
    rounds give ``verify_base``, drafted rounds their own line, the gap ``verify_step``."""
    costs = OnlineCosts()
    for _ in range(3):
        costs.observe(RoundRecord(0, 1, 0, 1, 1, 0, draft_ms=2.0, verify_ms=5.75))
    assert (costs.verify_base, costs.verify_step, costs.verify_slope) == (pytest.approx(5.75), 0.0, 0.0)
    for _ in range(40):  # many plain rounds: they set the plain step and leave the drafted fit alone
        costs.observe(RoundRecord(0, 0, 0, 1, 0, 0, draft_ms=0.0, verify_ms=4.0))
    assert costs.verify_ms(0) == pytest.approx(4.0) and costs.verify_ms(1) == pytest.approx(5.75)
    assert costs.verify_ms(6) == pytest.approx(5.75)  # one draft length seen: no slope yet
    for k in range(1, 7):
        costs.observe(RoundRecord(0, k, 0, 1, k, 0, draft_ms=2.0 * k, verify_ms=5.5 + 0.25 * k))
    assert costs.verify_base == pytest.approx(4.0)
    assert costs.verify_slope == pytest.approx(0.25, abs=0.02) and costs.verify_step == pytest.approx(1.5, abs=0.1)
    assert costs.verify_ms(6) == pytest.approx(7.0, abs=0.05)


def test_a_probe_measures_a_draft_as_long_as_drafting_costs_allow():
    """Verification measured out of reach (every draft token costs a plain step): plain decoding
    but for probes, and a probe, planned without the measured verification cost, drafts the
    several tokens (at most PROBE_MAX_LENGTH) a cheap, always-right drafter makes worth it -- not
    one token that measures nothing of the slope. With the same cost pinned by a profile (known,
    nothing to measure) a probe plans as any round: one token, then stop."""
    from specpolicy.policies.goodput import PROBE_MAX_LENGTH

    policy = GoodputPolicy(probe_interval=3)
    drafter = ScriptedDrafter(confidence=0.99)
    lengths = [
        play(policy, drafter, all_accepted, pass_ms=0.5, verify_base=10.0, verify_per_token=10.0)[0].length
        for _ in range(80)
    ]
    probes = [k for k in lengths[40:] if k]
    assert lengths[40:].count(0) >= 20 and len(probes) >= 8  # probes of two rounds, 3 plain rounds apart
    assert min(probes) >= 5 and max(probes) <= PROBE_MAX_LENGTH  # each probe drafts several tokens, bounded
    pinned = GoodputPolicy(cost_profile=profile(pass_ms=0.5, target_ms=10.0, per_token_ms=10.0), probe_interval=3)
    lengths = [play(pinned, drafter, all_accepted)[0].length for _ in range(40)]
    assert {k for k in lengths if k} == {1}


def test_lambda_follows_the_policys_throughput_never_below_plain_decoding():
    policy = GoodputPolicy(cost_profile=profile(pass_ms=1.0, target_ms=10.0))
    assert policy.rate == pytest.approx(0.1)  # before any round: plain decoding, 1 token / 10 ms
    for _ in range(200):
        play(policy, ScriptedDrafter(confidence=1.0), all_accepted)
    draft, _ = draft_round(ScriptedDrafter(confidence=1.0), policy, ROOM, "cpu")
    k = draft.length  # every round: k + 1 tokens in k passes + one verification
    assert policy.rate == pytest.approx((k + 1) / (k * 1.0 + 10.0), rel=0.05)


# -- calibration ------------------------------------------------------------------------------------


def true_acceptance(conf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """A known curve: acceptance rises with confidence and falls with the position in the draft."""
    return np.clip(0.1 + 0.85 * conf**1.5 * 0.97 ** (pos - 1), 0.0, 1.0)


def test_calibration_converges_to_a_known_acceptance_curve():
    rng = np.random.default_rng(0)
    cal = AcceptanceCalibration()
    for _ in range(20_000):  # synthetic rounds: draft 12 tokens, accept while the known curve says so
        conf = rng.uniform(0.0, 1.0, 12)
        accepted = rng.uniform(size=12) < true_acceptance(conf, np.arange(1, 13))
        cal.observe(conf, int(np.argmin(accepted)) if not accepted.all() else 12)
    # Every well-observed cell: the estimate matches the curve averaged over the cell's confidences.
    mean_conf = cal.confidence_sum / np.maximum(cal.reached, 1)
    starts = cal.position_starts
    for q in range(4):  # position bins 1..4 (single positions)
        for b in range(cal.confidence_edges.size):
            if cal.reached[q, b] < 400:
                continue
            lo, hi = cal.confidence_edges[b], (list(cal.confidence_edges[1:]) + [1.0])[b]
            grid = np.linspace(lo, hi, 101)
            expected = true_acceptance(grid, np.full(101, starts[q])).mean()
            stderr = math.sqrt(expected * (1 - expected) / cal.reached[q, b])
            assert cal.table()[q, b] == pytest.approx(expected, abs=4.5 * stderr + 0.01), (q, b, mean_conf[q, b])
    # And the lookup by confidence and position agrees with the curve at bin centres.
    conf = np.array([0.05, 0.45, 0.85])
    assert np.allclose(cal.probability(conf, 2), true_acceptance(conf, np.arange(2, 5)), atol=0.05)
    # An undrafted token at position i: the curve averaged over confidence (uniform here).
    expect = [true_acceptance(np.linspace(0, 1, 1001), np.full(1001, i)).mean() for i in (1, 2, 3)]
    assert np.allclose(cal.unseen_curve(3), expect, atol=0.03)


def test_calibration_batches_count_as_one_draft_at_a_time():
    rng = np.random.default_rng(3)
    drafts = [(tuple(rng.uniform(size=k).tolist()), int(rng.integers(0, k + 1))) for k in rng.integers(1, 70, 40)]
    drafts.append(((0.5, 0.7), 0))  # rejected at once: only the first token is reached
    one, batch = AcceptanceCalibration(), AcceptanceCalibration()
    for conf, a in drafts:
        one.observe(conf, a)
    batch.observe_many(drafts[:25])
    batch.observe_many(drafts[25:])
    for name in ("reached", "accepted", "confidence_sum"):
        np.testing.assert_allclose(getattr(batch, name), getattr(one, name))
    assert one.observations == sum(min(a + 1, len(c)) for c, a in drafts)
    with pytest.raises(ValueError, match=r"accepted_length must be in \[0, 2\]"):
        batch.observe_many([((0.1,), 1), ((0.1, 0.2), 3)])
    np.testing.assert_allclose(batch.reached, one.reached)  # nothing counted from the bad batch


def test_decision_tables_are_rebuilt_every_round_then_every_few_rounds():
    from specpolicy.policies.goodput import REFRESH_EVERY, REFRESH_WARMUP

    policy = GoodputPolicy(cost_profile=profile(pass_ms=0.5))
    counted = []
    for _ in range(REFRESH_WARMUP + 3 * REFRESH_EVERY):
        play(policy, ScriptedDrafter(confidence=0.9), lambda d: d.length // 2)
        counted.append(policy.calibration.observations)
    grew = [i for i in range(1, len(counted)) if counted[i] > counted[i - 1]]
    # the rounds of the warm-up are counted as they come (at the next round's first decision) ...
    assert grew[: REFRESH_WARMUP - 1] == list(range(1, REFRESH_WARMUP))
    # ... then in batches, every REFRESH_EVERY rounds, none lost
    assert np.diff(grew[REFRESH_WARMUP - 1 :]).tolist() == [REFRESH_EVERY] * (len(grew) - REFRESH_WARMUP)


def test_calibration_prior_is_the_confidence_and_data_moves_it():
    cal = AcceptanceCalibration(prior_strength=4.0)
    assert np.allclose(cal.probability([0.05, 0.55, 0.995], 1), [0.05, 0.55, 0.995])
    assert np.allclose(cal.unseen_curve(5), 0.5)
    for _ in range(100):
        cal.observe([0.995, 0.995], 0)  # confident, always rejected at the first token
    assert cal.probability([0.995], 1)[0] < 0.1
    rel = cal.reliability()
    last = rel["reached"].nonzero()[0]
    assert rel["observed"][last].tolist() == [0.0] and rel["mean_confidence"][last] == pytest.approx([0.995])
    with pytest.raises(ValueError, match="accepted_length"):
        cal.observe([0.5], 2)


def test_calibration_from_rounds_counts_only_the_drafters_own_tokens():
    rounds = [
        RoundRecord(0, 4, 4, 5, 1, 2, 1.0, 1.0, confidences=(0.9, 0.9, 0.1, 0.1)),  # 2 reused tokens
        RoundRecord(1, 0, 0, 1, 0, 0, 0.0, 1.0),
    ]
    cal = calibration_from_rounds(rounds)
    assert cal.observations == 2 and cal.accepted.sum() == 2


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("max_length", 0, "policy.max_length must be an integer >= 1"),
        ("cost_profile", "a100-nonexistent", "policy.cost_profile"),
        ("cost_profile", 3, "policy.cost_profile must be null"),
        ("cost_profile", {"name": "x", "drafter_pass_ms": -1}, "policy.cost_profile: profile.drafter_pass_ms"),
        ("rate_ema", 0.0, "policy.rate_ema must be in"),
        ("prior_strength", 0, "policy.prior_strength must be a number > 0"),
        ("prior_acceptance", 1.5, "policy.prior_acceptance must be in"),
        ("probe_interval", -1, "policy.probe_interval must be an integer >= 0"),
        ("keep_across_prompts", "yes", "policy.keep_across_prompts"),
    ],
)
def test_bad_settings_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        GoodputPolicy(**{key: value})


def test_factory_builds_it_from_the_shipped_config():
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = OmegaConf.to_container(
            compose("config", overrides=["policy=goodput", "policy.cost_profile=a6000-qwen32b"]).policy
        )
    policy = make_policy(get_plugin_manager(autoload=False), cfg)
    assert isinstance(policy, GoodputPolicy) and policy.profile.name == "a6000-qwen32b"
    assert "cost_profile='a6000-qwen32b'" in repr(policy)


# -- the Fast-dLLM drafter's lookahead --------------------------------------------------------------


def test_fastdllm_reports_the_rest_of_its_small_block_as_lookahead(runtime):
    model = sharpen(tiny_lm(seed=0, layers=1))
    drafter = FastDLLMDrafter(
        model, runtime, SimpleNamespace(mask_token_id=VOCAB - 2), block_size=16, small_block_size=4, threshold=0.05
    )
    drafter.prefill(torch.arange(1, 6))  # committed length 5: offset 5 of block 0, small block [4, 8)
    d = drafter.draft(1)
    assert (d.length, d.lookahead, d.forward_passes) == (1, 2, 1)  # offsets 5 (drafted), 6 and 7 decoded
    d = drafter.draft(2)
    assert (d.length, d.lookahead, d.forward_passes) == (3, 0, 1)  # free: no new pass
    d = drafter.draft(1)
    assert (d.length, d.lookahead, d.forward_passes) == (4, 3, 2)  # the next small block
    ahead = d.lookahead_confidences.clone()
    d = drafter.draft(3)  # the look-ahead's confidences are those the draft then reports for its tokens
    assert d.forward_passes == 2 and torch.equal(d.confidences[4:7], ahead)
    assert d.lookahead == 0 and d.lookahead_confidences.numel() == 0


def test_goodput_is_lossless_and_drafts_whole_small_blocks_with_fastdllm(runtime):
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    drafter = FastDLLMDrafter(
        target, runtime, SimpleNamespace(mask_token_id=VOCAB - 2), block_size=16, small_block_size=4, threshold=0.05
    )  # the target's own weights: confident drafts
    policy = GoodputPolicy(max_length=12, cost_profile=profile(pass_ms=1.0))
    prompt = torch.arange(1, 10)
    ref = generate(prompt, verifier, runtime, max_new_tokens=40)
    out = generate(prompt, verifier, runtime, max_new_tokens=40, drafter=drafter, policy=policy)
    assert out.output_ids.tolist() == ref.output_ids.tolist()
    drafted = [r for r in out.rounds if r.speculation_length]
    assert drafted and policy.first_chunk.samples > 0
    assert math.isclose(
        policy.calibration.observations,
        sum(min(r.accepted_length + 1, r.speculation_length) for r in out.rounds[:-1] if r.speculation_length),
    )


# -- the calibration figure ------------------------------------------------------------------------


def test_online_predictions_are_made_before_each_round_is_learned():
    rounds = [RoundRecord(i, 2, 0, 1, 2, 0, 1.0, 1.0, confidences=(0.995, 0.995)) for i in range(50)]
    online = online_predictions(rounds)
    assert online["accepted"].tolist() == [False] * 50  # only the first token is reached, and rejected
    assert online["predicted"][0] == pytest.approx(0.995)  # the prior: the confidence itself
    assert online["predicted"][-1] < 0.1  # learned from the rounds before it (48 counted)
    rel = reliability(online["confidence"], online["accepted"])
    assert rel["ece"] == pytest.approx(0.995) and rel["count"].tolist() == [50]


def test_online_predictions_replay_the_policys_view_of_the_calibration(runtime):
    # The probabilities the policy decided with (its table at each round's first decision) equal
    # online_predictions' on its rounds: the batched schedule, two prompts, final rounds unlearned.
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    drafter = FastDLLMDrafter(
        tiny_lm(seed=1, layers=1),
        runtime,
        SimpleNamespace(mask_token_id=VOCAB - 2),
        block_size=16,
        small_block_size=4,
        threshold=0.05,
    )
    policy = GoodputPolicy(max_length=12, cost_profile=profile(pass_ms=0.1, per_token_ms=0.05))
    tables: list[np.ndarray] = []  # the policy's (position, confidence bin) table, one per round
    decide = policy.next_length

    def next_length(draft):
        answer = decide(draft)
        if draft.length == 0:
            tables.append(policy._p_table.copy())
        return answer

    policy.next_length = next_length
    rounds = []
    for prompt in (torch.arange(1, 10), torch.arange(20, 31)):
        rounds += generate(prompt, verifier, runtime, max_new_tokens=120, drafter=drafter, policy=policy).rounds
    assert len(tables) == len(rounds) > BATCH_WARMUP + 2 * BATCH_ROUNDS
    bins = policy.calibration.confidence_bin
    expected = [
        table[np.arange(reached), bins(np.array(r.confidences[:reached]))]
        for table, r in zip(tables, rounds)
        if r.speculation_length
        for reached in [min(r.accepted_length + 1, r.speculation_length)]
    ]
    online = online_predictions(rounds)
    np.testing.assert_allclose(online["predicted"], np.concatenate(expected), rtol=0, atol=1e-12)
    assert sum(r.speculation_length > 0 for r in rounds) > BATCH_WARMUP  # drafted rounds past the warm-up


def test_plot_writes_the_calibration_figure_for_runs_with_a_drafter(tmp_path, runtime):
    import json

    import matplotlib.image

    from specpolicy.analysis.plot import main as plot_main
    from specpolicy.analysis.results import PromptResult
    from specpolicy.drafters.ar import ARDrafter

    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset())
    policy = GoodputPolicy(max_length=8, cost_profile=profile(pass_ms=0.0))  # free drafting: drafts every round
    rows = []
    for i, prompt in enumerate([torch.arange(1, 9), torch.arange(3, 20)]):
        out = generate(prompt, verifier, runtime, max_new_tokens=30, drafter=ARDrafter(target, runtime), policy=policy)
        van = generate(prompt, verifier, runtime, max_new_tokens=30)
        rows.append(PromptResult.of(f"gsm8k/{i}", len(prompt), out, van).to_row())
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"method": "ar+goodput", "methods": {}, "config": {}}))
    assert plot_main([str(run), "--max-pages", "1"]) == 0
    img = matplotlib.image.imread(run / "plots" / "calibration_ar+goodput.png")
    assert img.shape[0] > 300 and float(img[..., :3].std()) > 0.01  # something was drawn
    assert 'src="calibration_ar+goodput.png"' in (run / "plots" / "index.html").read_text()


def catch_up_rounds(
    policy, drafter, rounds, accept, verify_ms, pass_ms=0.2, catch_up_ms=0.3, prompt=60, first_pass_ms=None
):
    """Rounds whose drafting ms carry a catch-up, as the drafters that read the target do: a round
    that resumes drafting (a prompt's first, or the first after plain rounds) makes one pass that
    also feeds every token committed without the drafter, ``catch_up_ms`` each (a prompt of
    ``prompt`` tokens, one per plain round); other rounds cost ``pass_ms`` a pass, or
    ``first_pass_ms`` for a round's first pass when given. ``accept(i, draft)``, ``verify_ms(k)``.
    Returns the draft lengths."""
    waiting, lengths = prompt, []
    first_extra = 0.0 if first_pass_ms is None else first_pass_ms - pass_ms
    for i in range(rounds):
        draft, _ = draft_round(drafter, policy, ROOM, "cpu")
        k, passes, a = draft.length, draft.forward_passes, accept(i, draft)
        draft_ms = passes * pass_ms + (catch_up_ms * waiting + first_extra if passes else 0.0)
        waiting = waiting + a + 1 if not passes else 0
        confidences = tuple(draft.confidences.tolist())
        policy.update(RoundRecord(0, k, a, a + 1, passes, 0, draft_ms, verify_ms(k), confidences))
        drafter.commit(draft, None)
        lengths.append(k)
    return lengths


def test_a_round_that_resumes_drafting_does_not_set_the_pass_cost():
    """The compiled runtime's case (EAGLE-3, measured: 2.2-2.4 ms booked per pass against about
    0.2 ms): a round that resumes drafting makes one drafter pass that also feeds the tokens
    committed without the drafter. With verification pinned out of reach (plain decoding but for
    probes), every probe resumes drafting: its catch-up must not be booked as a pass, and the
    probe is two rounds, so that the second one's pass is measured."""
    costs = {"name": "test", "drafter_pass_ms": None, "target_ms_per_token": 10.0, "verify_ms_per_draft_token": 10.0}
    policy = GoodputPolicy(cost_profile=costs, probe_interval=4)
    lengths = catch_up_rounds(
        policy, ScriptedDrafter(confidence=0.99), 60, lambda i, d: d.length, lambda k: 10.0 + 10.0 * k
    )
    assert lengths[:12] == [1, 2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0]  # two-round probes, the second of two passes, 4 apart
    assert policy.costs.pass_ms == pytest.approx(0.2)  # catch-ups of 18 ms (the prompt) and 1.2 ms left out


def test_drafting_resumes_after_a_stretch_of_plain_decoding():
    """Costs measured throughout (a pass 0.2 ms, a catch-up 0.3 ms a token, a plain step 1.4 ms,
    any draft 0.5 ms more and 0.15 ms a draft token). A bad stretch (nothing accepted) sends the
    policy to plain decoding; then the drafter is always right and drafting pays. Before the
    probes left the catch-up out, each probe's catch-up (4 plain rounds' tokens, one pass) booked
    1.4 ms a pass and the policy never drafted more than a probe's one token again."""
    policy = GoodputPolicy(probe_interval=4)
    lengths = catch_up_rounds(
        policy,
        ScriptedDrafter(confidence=0.99),
        400,
        lambda i, d: 0 if i < 60 else d.length,
        lambda k: 1.4 + (0.5 + 0.15 * k if k else 0.0),
    )
    assert lengths[30:60].count(0) >= 20  # the bad stretch: plain decoding
    assert policy.costs.pass_ms == pytest.approx(0.2)
    assert max(lengths[-100:]) == policy.max_length and sum(1 for k in lengths[-100:] if k) >= 50


def test_a_drafter_without_passes_keeps_one_round_probes_and_its_token_cost():
    """A model-free drafter (no passes: the suffix drafter) has no catch-up pass: its ms per
    drafted token are learned from every round, and a probe stays one round (a policy that
    treated its rounds as resuming drafting never learned the cost and probed every round)."""

    class PassFree(ScriptedDrafter):
        def draft(self, num_tokens: int) -> Draft:
            draft = super().draft(num_tokens)
            return Draft(draft.token_ids, draft.confidences, forward_passes=0)

    policy = GoodputPolicy(probe_interval=4)
    drafter = PassFree(confidence=0.9)
    lengths = []
    for _ in range(40):
        draft, _ = draft_round(drafter, policy, ROOM, "cpu")
        k = draft.length
        confidences = tuple(draft.confidences.tolist())
        policy.update(RoundRecord(0, k, 0, 1, 0, 0, 0.5 * k, 1.4 + (0.5 + 0.15 * k if k else 0.0), confidences))
        drafter.commit(draft, None)
        lengths.append(k)
    assert policy.costs.draft_ms_per_token == pytest.approx(0.5)
    probes = [i for i, k in enumerate(lengths[10:]) if k]
    assert len(probes) >= 4 and np.all(np.diff(probes) == 5)  # 4 plain rounds, then a one-round probe
    # as long as acceptance and drafting costs pick (nothing accepted: one token), not pushed on for
    # a second pass it does not make
    assert {lengths[10 + i] for i in probes} == {1}


def test_the_rounds_first_pass_stands_apart_from_later_passes():
    """A round's first drafter pass also feeds the last round's committed tokens (on the compiled
    runtime a wider pass: the AR drafter 1.0 ms against 0.3 ms a later pass): drafting ms fitted on
    passes give both; with one pass count seen they are one ratio."""
    costs = OnlineCosts()
    for _ in range(5):
        costs.observe(RoundRecord(0, 1, 0, 1, 1, 0, draft_ms=1.0, verify_ms=2.3))
    assert costs.pass_ms == pytest.approx(1.0) and costs.first_pass_ms == pytest.approx(1.0)
    for passes in (2, 5, 8, 3, 1, 6) * 3:
        costs.observe(RoundRecord(0, passes, 0, 1, passes, 0, draft_ms=1.0 + 0.3 * (passes - 1), verify_ms=2.3))
    assert costs.first_pass_ms == pytest.approx(1.0) and costs.pass_ms == pytest.approx(0.3)
    record = RoundRecord(0, 5, 0, 1, 5, 0, draft_ms=0.0, verify_ms=0.0)
    assert costs.round_ms(record) == pytest.approx(1.0 + 4 * 0.3 + costs.verify_ms(5))
    pinned = OnlineCosts(GoodputPolicy(cost_profile="a6000-qwen32b").profile)
    assert pinned.first_pass_ms == pinned.pass_ms == 6.1


def test_the_drafting_fit_falls_back_to_the_ratio_on_a_thin_spread_or_a_flat_slope():
    """The first pass stands apart only on evidence: one two-pass round among many one-pass ones
    (a thin spread of pass counts), or passes after the first that cost almost nothing (a slope
    under a tenth of the ms per pass), leave one cost per pass, the ratio of averages."""
    thin = OnlineCosts()
    for i in range(40):
        passes = 2 if i == 20 else 1
        thin.observe(RoundRecord(0, passes, 0, 1, passes, 0, draft_ms=1.0 + 0.3 * (passes - 1), verify_ms=2.0))
    assert thin.first_pass_ms == thin.pass_ms == pytest.approx(thin._pass.ratio)
    flat = OnlineCosts()
    for passes in (1, 4, 2, 6) * 5:  # every round 1 ms, whatever its passes
        flat.observe(RoundRecord(0, passes, 0, 1, passes, 0, draft_ms=1.0, verify_ms=2.0))
    assert flat.first_pass_ms == flat.pass_ms == pytest.approx(flat._pass.ratio)


def test_a_dear_first_pass_does_not_keep_a_cheap_chain_off():
    """The compiled runtime's AR drafter (measured: a round's first pass about 1 ms, a later one
    0.3 ms; a plain step 1.55 ms, a drafted verification about 2.4 ms), after three rounds timed
    at warm-up (20x drafting, 5x verification) that send the policy to plain decoding: the
    probes, two passes at least, measure a later pass too, the fit separates it from the first,
    and drafting resumes (about 6 tokens a round). With one cost per pass the one-token probes
    booked the first pass's 1 ms for every pass and the policy stayed plain but for its probes
    (the compiled peers run: 11% of rounds drafted, 0.88x vanilla)."""
    policy = GoodputPolicy(probe_interval=16)
    accept = calibrated_acceptance(seed=3)
    drafter = ScriptedDrafter(choices=(0.7, 0.85, 0.95), seed=3)
    lengths, waiting = [], 60
    for i in range(800):
        draft, _ = draft_round(drafter, policy, ROOM, "cpu")
        k, passes, a = draft.length, draft.forward_passes, accept(draft)
        draft_ms = 1.0 + 0.3 * (passes - 1) + 0.01 * waiting if passes else 0.0  # with a catch-up
        waiting = waiting + a + 1 if not passes else 0
        verify_ms = 1.55 + (0.8 + 0.05 * k if k else 0.0)
        if i < 3:  # warm-up timings
            draft_ms, verify_ms = 20 * draft_ms, 5 * verify_ms
        policy.update(RoundRecord(0, k, a, a + 1, passes, 0, draft_ms, verify_ms, tuple(draft.confidences.tolist())))
        drafter.commit(draft, None)
        lengths.append(k)
    assert policy.costs.first_pass_ms == pytest.approx(1.0, abs=0.05)
    assert policy.costs.pass_ms == pytest.approx(0.3, abs=0.02)
    late = [k for k in lengths[-300:] if k]
    assert len(late) >= 150 and np.mean(late) >= 4


def test_one_token_decisions_read_the_same_probabilities_as_the_calibrations_numpy_lookup():
    """A decision after one drafted token (an AR pass) reads its p in Python floats, not numpy: the
    draft's survival must be exactly the product of ``AcceptanceCalibration.probability`` (the numpy
    lookup), confidences on and between the bins' edges included, after the calibration has data."""
    confs = (0.1, 0.95, 0.37, 0.99, 0.5, 1.0, 0.0, 0.985, 0.62, 0.9)
    policy = GoodputPolicy(max_length=len(confs), cost_profile=profile(pass_ms=0.0))
    drafter = ScriptedDrafter(script=confs * 4)
    for _ in range(3):  # data in the calibration: the table is no longer the prior
        play(policy, drafter, accept=lambda d: d.length // 2)
    policy.next_length(Draft.empty())  # a new round: the tables rebuilt
    for k in range(1, len(confs) + 1):
        draft = Draft(torch.arange(k), torch.tensor(confs[:k]))
        policy.next_length(draft)
        expected = 1.0
        for p in policy.calibration.probability(draft.confidences.tolist(), 1):
            expected *= float(p)
        assert policy._survival == expected
