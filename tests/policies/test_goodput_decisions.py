"""``goodput``'s one-token decisions read from its table (``GoodputPolicy._go_on``) and its refresh in
one compiled call (``goodput_refresh``) against the same policy planning every decision (``_plan``,
the path those decisions took before the table) with the separate calls that refresh joins; and
its cost estimates worked out once per observation (``OnlineCosts._derive``) against the
properties' formulas as they were: the same answers, survivals, stop reasons, costs, calibration
counts and tables, round after round, with costs measured online from noisy timings (speculation
switched off and probed again) and with a profile's pinned costs, on an AR-like drafter and on
ones that decode ahead."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_goodput import ScriptedDrafter, profile

from specpolicy.core import compiled_policy
from specpolicy.core.decoding import draft_round
from specpolicy.core.types import RoundRecord
from specpolicy.policies import goodput
from specpolicy.policies.goodput import PRIOR_PASS_RATIO, GoodputPolicy, OnlineCosts


class PlanningGoodput(GoodputPolicy):
    """``goodput`` without its decision table: every decision plans (``_plan``), the empty draft's
    included (``next_length``'s general path, not its short branch); and its refresh as the
    separate calls ``goodput_refresh`` joins: ``AcceptanceCalibration.observe_many`` on the pending
    rounds, ``table()`` / ``unseen()`` indexed by position, then ``goodput_tables``."""

    _short_start = False

    def _refresh(self) -> None:
        cal = self.calibration
        drafts, at = [], 0
        for reached, accepted in zip(self._pending_reached, self._pending_accepted):
            drafts.append((self._pending_conf[at : at + reached], accepted))
            at += reached
        cal.observe_many(drafts)
        self._pending_conf, self._pending_reached, self._pending_accepted = [], [], []
        self._pending_longest = 0
        table, unseen = cal.table()[self._position_bins], cal.unseen()[self._position_bins]
        original = compiled_policy.goodput_refresh

        def tables(*args):  # the tables alone, from the estimates just computed
            self._p_table[:], self._unseen[:] = table, unseen
            return compiled_policy.goodput_tables(self._unseen, *args[-11:])

        goodput.goodput_refresh = tables
        try:
            super()._refresh()
        finally:
            goodput.goodput_refresh = original
        self._go_on = None


class TwoPassDrafter(ScriptedDrafter):
    """A scripted drafter spending two passes per chunk (the chunk sizes' averages then move)."""

    def draft(self, num_tokens):
        draft = super().draft(num_tokens)
        return dataclasses.replace(draft, forward_passes=2 * draft.forward_passes)


def _run(policy: GoodputPolicy, chunk: int, report_ahead: bool, rounds: int, seed: int) -> list:
    """Drive ``policy`` through ``rounds`` rounds of a seeded scripted drafter (``chunk`` < 0: two passes
    per chunk of ``-chunk`` tokens), timings from a seeded generator: cheap passes, then dear ones
    (speculation off, probes), then cheap again. Returns what each round decided and the policy's
    state after it."""
    kind = TwoPassDrafter if chunk < 0 else ScriptedDrafter
    drafter = kind(chunk=abs(chunk), choices=(0.05, 0.3, 0.62, 0.9, 0.97, 0.995, 1.0), seed=seed)
    drafter.report_ahead = report_ahead
    rng = np.random.default_rng(seed)
    seen = []
    for i in range(rounds):
        answers: list[int] = []
        draft, reason = draft_round(drafter, policy, 200, "cpu", answers)
        k = draft.length
        conf = draft.confidences.numpy()
        right = rng.uniform(size=k) < conf
        a = k if right.all() else int(np.argmin(right))
        pass_ms = 0.4 if i < rounds // 3 or i > 2 * rounds // 3 else 30.0
        noise = float(rng.uniform(0.8, 1.25))
        record = RoundRecord(
            index=i,
            speculation_length=k,
            accepted_length=a,
            emitted_tokens=a + 1,
            drafter_forward_passes=draft.forward_passes,
            reused_tokens=0,
            draft_ms=draft.forward_passes * pass_ms * noise + (1.5 if draft.forward_passes else 0.0),
            verify_ms=(4.0 if k == 0 else 5.5 + 0.25 * k) * float(rng.uniform(0.9, 1.1)),
            confidences=tuple(draft.confidences.tolist()),
        )
        policy.update(record)
        drafter.commit(draft, None)
        chunks = [(c.samples, c.numerator, c.denominator) for c in (policy.first_chunk, policy.next_chunk)]
        seen.append((answers, reason, k, policy._survival, policy.draft_stop_reason, repr(policy.costs), chunks))
    return seen


@pytest.mark.parametrize(
    ("chunk", "report_ahead", "cost_profile"),
    [
        (1, False, None),
        (1, False, profile(pass_ms=1.0, per_token_ms=0.05)),
        (-1, False, None),
        (4, False, None),
        (3, True, None),
    ],
)
def test_table_decisions_are_the_plans(chunk, report_ahead, cost_profile):
    quick = GoodputPolicy(max_length=24, probe_interval=6, cost_profile=cost_profile)
    planning = PlanningGoodput(max_length=24, probe_interval=6, cost_profile=cost_profile)
    plans = {"quick": 0, "planning": 0}
    for name, policy in (("quick", quick), ("planning", planning)):
        plan = policy._plan

        def counted(*args, _plan=plan, _name=name):
            plans[_name] += 1
            return _plan(*args)

        policy._plan = counted  # type: ignore[method-assign]
    got = _run(quick, chunk, report_ahead, 240, seed=abs(chunk))
    want = _run(planning, chunk, report_ahead, 240, seed=abs(chunk))
    assert got == want
    assert quick._survival == planning._survival
    for name in (
        "_unseen_gain",
        "_cost_later",
        "_cost_first",
        "_probe_cost_later",
        "_probe_cost_first",
        "_p_table",
        "_unseen",
    ):
        np.testing.assert_array_equal(getattr(quick, name), getattr(planning, name))
    for name in ("reached", "accepted", "confidence_sum"):
        np.testing.assert_array_equal(getattr(quick.calibration, name), getattr(planning.calibration, name))
    lengths = [k for _, _, k, *_ in got]
    assert max(lengths) > 3  # drafted rounds
    if cost_profile is None:  # measured costs: dear passes switch speculation off (plain rounds, then probes)
        assert lengths.count(0) > 10
    if abs(chunk) == 1:  # the AR-like drafter's decisions after a token come from the table
        assert plans["quick"] < plans["planning"] * (0.5 if chunk == 1 else 0.9)


def _old_properties(costs: OnlineCosts) -> dict[str, float]:
    """``OnlineCosts``' estimates by the properties' formulas before ``_derive`` (computed from its state)."""
    w, sy = costs._plain
    plain = sy / w if w > 0.0 else None
    base = costs._pinned_base if costs._pinned_base is not None else (plain if plain is not None else costs._fitted[0])
    if costs._pinned_slope is not None or plain is None or costs._sums[0] == 0.0:
        step = 0.0
    else:
        step = max(costs._fitted[0] - plain, 0.0)
    slope = costs._pinned_slope if costs._pinned_slope is not None else costs._fitted[1]
    if costs._pinned_pass is not None:
        pass_ms = costs._pinned_pass
    elif costs._draft_line is not None:
        pass_ms = costs._draft_line[1]
    else:
        pass_ms = costs._pass.ratio if costs._pass.samples else PRIOR_PASS_RATIO * base
    first = costs._draft_line[0] if costs._pinned_pass is None and costs._draft_line is not None else pass_ms
    per_token = 0.0 if costs._pinned_pass is not None else (costs._token.ratio if costs._token.samples else 0.0)
    return {
        "pass_ms": pass_ms,
        "first_pass_ms": first,
        "draft_ms_per_token": per_token,
        "verify_base": base,
        "verify_step": step,
        "verify_slope": slope,
    }


@pytest.mark.parametrize("pinned", [None, profile(pass_ms=2.0, per_token_ms=0.1)])
def test_derived_costs_are_the_properties_formulas(pinned):
    prof = None if pinned is None else GoodputPolicy(cost_profile=pinned).profile
    costs = OnlineCosts(prof)
    rng = np.random.default_rng(5)
    for i in range(400):
        k = int(rng.choice([0, 0, 1, 2, 5, 9]))
        passes = int(rng.choice([0, 1, 2, 4])) if k else 0
        record = RoundRecord(
            index=i,
            speculation_length=k,
            accepted_length=0,
            emitted_tokens=1,
            drafter_forward_passes=passes,
            reused_tokens=0,
            draft_ms=float(rng.choice([0.0, rng.uniform(0.1, 20.0)])),
            verify_ms=float(rng.choice([0.0, rng.uniform(1.0, 12.0)])),
        )
        costs.observe(record, drafting=bool(rng.random() < 0.8))
        old = _old_properties(costs)
        assert {name: getattr(costs, name) for name in old} == old
        for length in (0, 1, 7):
            want = (
                old["verify_base"]
                if length == 0
                else old["verify_base"] + old["verify_step"] + old["verify_slope"] * length
            )
            assert costs.verify_ms(length) == want
        first = old["first_pass_ms"] - old["pass_ms"] if passes > 0 else 0.0
        want = passes * old["pass_ms"] + first + k * old["draft_ms_per_token"] + costs.verify_ms(k)
        assert costs.round_ms(record) == want
