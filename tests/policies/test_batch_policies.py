"""Policies that know the batch: the measured verification cost (``VerifyCost``), vLLM's
per-batch-size schedule (``batch-schedule``), the batch goodput plan (``goodput-batch``), and the
batched loop handing every request's policy its ``BatchContext`` and the class's joint plan."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import EOS, random_prompts, sharpen, tiny_lm
from specpolicy.core.batch_context import BatchContext, VerifyCost
from specpolicy.core.batching import generate_batch
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.drafters.ar import ARDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.policies.batch_schedule import BatchSchedulePolicy
from specpolicy.policies.goodput_batch import WARMUP_LENGTHS, GoodputBatchPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


def test_verify_cost_interpolates_is_non_decreasing_and_extends_with_the_slope():
    cost = VerifyCost(window=1)
    assert cost.ms(10) == 0.0 and cost.slope() == 0.0
    cost.observe(8, 8.0)
    assert cost.slope() == pytest.approx(0.5 * 8.0 / 8)  # prior: half the mean ms per token
    cost.observe(16, 12.0)
    cost.observe(24, 14.0)
    assert cost.ms(12) == pytest.approx(10.0) and cost.ms(20) == pytest.approx(13.0)
    assert cost.slope() == pytest.approx((14.0 - 12.0) / 8)  # the local slope past the largest count
    assert cost.ms(32) == pytest.approx(14.0 + 8 * 0.25) and cost.ms(4) == pytest.approx(8.0 * 4 / 8)
    cost.observe(12, 30.0)  # one slow first call of a new shape ...
    assert list(cost.observed) == [8, 12, 16, 24]
    values = list(cost.observed.values())
    assert values == sorted(values) and values[1] < 30.0  # ... pooled with its larger neighbours
    assert np.allclose(cost.ms(np.array([8, 24])), [8.0, values[-1]])


def _record(k: int, a: int, draft_ms: float = 2.0, passes: int | None = None, verify_ms: float = 5.0) -> RoundRecord:
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=a,
        emitted_tokens=a + 1,
        drafter_forward_passes=k if passes is None else passes,
        reused_tokens=0,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        confidences=(),
        draft_token_ids=(),
        target_token_ids=(),
        draft_stop_reason="policy_bound",
        finish_reason="",
    )


def test_batch_schedule_drafts_the_length_of_its_band():
    policy = BatchSchedulePolicy([1, 4, 8], [5, 2, 0])
    assert policy.next_length(Draft.empty()) == 5  # no batch (the batch-1 loop): batch size 1
    cost = VerifyCost()
    for requests, k in ((1, 5), (3, 5), (4, 2), (7, 2), (8, 0), (64, 0)):
        policy.batch = BatchContext(requests, 0, cost)
        assert policy.next_length(Draft.empty()) == k, requests
    policy.batch = BatchContext(2, 0, cost)
    assert policy.next_length(Draft(torch.arange(3), torch.ones(3))) == 2  # tops the draft up to 5
    for sizes, lengths, key in (
        ([2, 4], [1, 1], "batch_sizes"),
        ([1, 4, 4], [1, 1, 1], "batch_sizes"),
        ([1, 4], [1], "lengths"),
        ([1, 4], [1, -1], "lengths"),
    ):
        with pytest.raises(ValueError, match=f"policy.{key} must be"):
            BatchSchedulePolicy(sizes, lengths)


def _goodput_batch(b: int, acceptance: float, cost: VerifyCost, pass_ms: float) -> list[GoodputBatchPolicy]:
    """``b`` request copies of one configured policy after many rounds at ``acceptance`` per position."""
    import copy

    configured = GoodputBatchPolicy(max_length=12)
    policies = [copy.deepcopy(configured) for _ in range(b)]
    rng = np.random.default_rng(0)
    for p in policies:
        p.reset()
        for _ in range(200):
            a = 0
            while a < 12 and rng.random() < acceptance:
                a += 1
            p.update(_record(12, a, draft_ms=12 * pass_ms))
    assert cost.samples >= len(WARMUP_LENGTHS)  # past the warm-up
    return policies


def _plan(policies, cost, pass_ms=None):
    """The round's plan; ``pass_ms``: the batched loop's drafting curve of a drafter running request
    by request (each request's pass costs ``pass_ms``), else the policies' own (batch-1) curve."""
    draft = None
    if pass_ms is not None:
        draft = VerifyCost()
        for passes in (1, 4, 12):
            draft.observe(len(policies) * passes, len(policies) * passes * pass_ms)
    return GoodputBatchPolicy.plan_round(
        policies, [BatchContext(len(policies), i, cost, draft_cost=draft) for i in range(len(policies))]
    )


def test_goodput_batch_speculates_long_when_verification_is_flat_and_switches_off_when_it_is_not():
    flat = VerifyCost()
    for n in (8, 16, 24, 32, 64, 128):
        flat.observe(n, 10.0)  # verification costs the same whatever it verifies: the GPU's memory-bound regime
    policies = _goodput_batch(8, 0.9, flat, pass_ms=0.1)
    # one drafter: its drafting curve pooled over the copies (12 passes: 1.2 ms; proportional below)
    assert policies[0]._shared.draft_cost.ms(12) == pytest.approx(1.2)
    assert policies[0]._shared.draft_cost.ms(3) == pytest.approx(0.3)
    plan = _plan(policies, flat, pass_ms=0.1)
    assert min(plan) >= 8
    steep = VerifyCost()
    for n in (8, 16, 24, 32, 64, 128):
        steep.observe(n, 1.0 * n)  # every verified token costs as much as a plain step's: compute-bound
    assert _plan(_goodput_batch(8, 0.9, steep, pass_ms=0.5), steep, pass_ms=0.5) == [0] * 8
    # a batch of one with the same costs: a draft token costs a fraction of a plain step
    one = VerifyCost()
    for n in (1, 2, 4, 8, 13, 16):
        one.observe(n, 10.0 + 0.2 * n)
    assert _plan(_goodput_batch(1, 0.9, one, pass_ms=0.5), one)[0] >= 4


def test_goodput_batch_gives_a_poorly_accepted_request_fewer_tokens():
    cost = VerifyCost()
    for n in (8, 16, 24, 32, 48, 64):
        cost.observe(n, 10.0 + 0.05 * n)
    good = _goodput_batch(4, 0.95, cost, pass_ms=0.5)
    bad = _goodput_batch(1, 0.2, cost, pass_ms=0.5)[0]
    for p in good + [bad]:
        p.per_request = True
    bad._shared = good[0]._shared
    bad.accepted, bad.tried = np.zeros(12), np.zeros(12)
    bad.tried[:1], bad.accepted[:1] = 300, 30  # its own first positions: rarely accepted
    plan = _plan(good + [bad], cost, pass_ms=0.5)
    assert plan[-1] < min(plan[:-1])


def test_the_batched_loop_hands_every_policy_its_batch_and_the_class_plans_once_per_round(runtime):
    class Recorder(StaticPolicy):
        plans: list[tuple[int, ...]] = []
        seen: list[tuple[int, int, int | None]] = []

        @classmethod
        def plan_round(cls, policies, contexts):
            assert all(isinstance(p, cls) for p in policies) and all(c.planned_length is None for c in contexts)
            plan = [c.row % 3 for c in contexts]
            cls.plans.append(tuple(plan))
            return plan

        def next_length(self, draft):
            if draft.length == 0:
                Recorder.seen.append((self.batch.requests, self.batch.row, self.batch.planned_length))
            return max(self.batch.planned_length - draft.length, 0)

    target = sharpen(tiny_lm(0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({EOS}))
    prompts = random_prompts(5)
    out = generate_batch(
        prompts,
        verifier,
        runtime,
        max_new_tokens=12,
        batch_size=3,
        drafter=ARDrafter(sharpen(tiny_lm(0, layers=1)), runtime),
        policy=Recorder(3),
    )
    assert len(Recorder.plans) == len(out.batch_sizes)  # one plan per round
    assert [len(p) for p in Recorder.plans] == list(out.batch_sizes)
    assert all(k == row % 3 and 1 <= b <= 3 for b, row, k in Recorder.seen)
    for i, prompt in enumerate(prompts):  # whatever lengths were planned, the output is the target's
        assert (
            out.results[i].output_ids.tolist()
            == generate(prompt, verifier, runtime, max_new_tokens=12).output_ids.tolist()
        )


@pytest.mark.parametrize("choice", ["goodput-batch", "batch-schedule"])
def test_batch_aware_policies_are_lossless_in_both_loops(choice):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    target = sharpen(tiny_lm(0, layers=2).double(), 4.0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    pm = get_plugin_manager(autoload=False)
    prompts = random_prompts(10, seed=2)
    refs = [generate(p, verifier, rt, max_new_tokens=30).output_ids.tolist() for p in prompts]
    drafter = ARDrafter(sharpen(tiny_lm(0, layers=1).double()), rt)
    policy = make_policy(pm, {"name": choice})
    for prompt, ref in zip(prompts, refs):
        assert (
            generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy).output_ids.tolist() == ref
        )
    for b in (1, 4, 16):
        out = generate_batch(
            prompts,
            verifier,
            rt,
            max_new_tokens=30,
            batch_size=b,
            drafter=drafter,
            policy=make_policy(pm, {"name": choice}),
        )
        assert [out.results[i].output_ids.tolist() for i in range(len(prompts))] == refs


def test_goodput_batch_does_not_charge_a_rounds_fixed_drafting_cost_to_each_draft_token():
    """Two drafting curves that cost the same for a 10-pass round: one mostly fixed per round (the
    commit, the first pass's catching up), one proportional to the passes. A fixed part is paid
    whatever the length, so the plan drafts longer with it than with per-pass costs."""
    cost = VerifyCost()
    for n in (1, 2, 4, 8, 13, 16):
        cost.observe(n, 10.0 + 0.3 * n)

    def plan(fixed_ms, per_pass_ms):
        draft = VerifyCost()
        for passes in (1, 2, 4, 8, 12):
            draft.observe(passes, fixed_ms + per_pass_ms * passes)
        policies = _goodput_batch(1, 0.8, cost, pass_ms=0.5)
        return GoodputBatchPolicy.plan_round(policies, [BatchContext(1, 0, cost, draft_cost=draft)])[0]

    assert plan(4.0, 0.1) > plan(0.0, 0.5)


def _linear(ms_at_zero: float, ms_per_token: float, counts=(8, 16, 32, 64, 104, 136)) -> VerifyCost:
    cost = VerifyCost()
    for n in counts:
        cost.observe(n, ms_at_zero + ms_per_token * n)
    return cost


def test_goodput_batch_holds_a_measured_k_for_replan_interval_rounds_and_replans_when_the_batch_changes():
    """A uniform K stands ``replan_interval`` rounds while the batch size stays; a new batch size,
    or the interval's end, plans afresh (here after verification turned steep meanwhile)."""
    flat, steep = _linear(10.0, 0.001), _linear(0.0, 1.0)  # steep: a draft token costs a plain step
    policies = _goodput_batch(8, 0.9, flat, pass_ms=0.01)
    for p in policies:
        p.replan_interval = 3
    drafting = VerifyCost()
    for passes in (8, 32, 64, 128):
        drafting.observe(passes, 0.01 * passes)
    ctx = lambda cost, b: [BatchContext(b, i, cost, draft_cost=drafting) for i in range(b)]  # noqa: E731
    first = GoodputBatchPolicy.plan_round(policies, ctx(flat, 8))
    assert 8 <= first[0] and len(set(first)) == 1 and 8 * (first[0] + 1) <= flat.largest
    flat._recent = copy.deepcopy(steep._recent)  # the same run's curve, now steep: the held K stands ...
    flat._fit = flat._arrays = None
    assert GoodputBatchPolicy.plan_round(policies, ctx(flat, 8)) == first
    assert GoodputBatchPolicy.plan_round(policies, ctx(flat, 8)) == first
    assert GoodputBatchPolicy.plan_round(policies, ctx(flat, 8)) == [0] * 8  # ... until the interval ends
    policies[0]._shared.held = None
    assert GoodputBatchPolicy.plan_round(policies, ctx(_linear(10.0, 0.001), 8)) == first  # held again
    assert GoodputBatchPolicy.plan_round(policies[:7], ctx(steep, 7)) == [0] * 7  # another batch size: replanned


def test_goodput_batch_starts_a_batched_runs_curves_from_the_last_run_at_that_batch_size():
    """The first run at a batch size spends its first rounds on the warm-up lengths; a later run
    starting with as many requests starts from that run's curves and plans at once."""
    policies = _goodput_batch(4, 0.9, _linear(10.0, 0.05), pass_ms=0.5)
    run1, draft1 = VerifyCost(), VerifyCost()
    for length in WARMUP_LENGTHS:
        plan = GoodputBatchPolicy.plan_round(policies, [BatchContext(4, i, run1, draft_cost=draft1) for i in range(4)])
        assert plan == [length] * 4  # the warm-up
        run1.observe(4 * (length + 1), 10.0 + 0.05 * 4 * (length + 1))
        if length:
            draft1.observe(4 * length, 0.5 * 4 * length)
    planned = GoodputBatchPolicy.plan_round(policies, [BatchContext(4, i, run1, draft_cost=draft1) for i in range(4)])
    assert planned[0] >= 3 and planned[0] != WARMUP_LENGTHS[0]  # cheap verification, high acceptance
    run2, draft2 = VerifyCost(), VerifyCost()
    again = GoodputBatchPolicy.plan_round(policies, [BatchContext(4, i, run2, draft_cost=draft2) for i in range(4)])
    assert again == planned and run2.observed == run1.observed and draft2.observed == draft1.observed
    run3 = VerifyCost()  # a run starting with 2 requests: nothing measured at that size yet
    assert (
        GoodputBatchPolicy.plan_round(
            policies[:2], [BatchContext(2, i, run3, draft_cost=VerifyCost()) for i in range(2)]
        )
        == [WARMUP_LENGTHS[0]] * 2
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("replan_interval", 0, "policy.replan_interval must be an integer >= 1"),
        ("per_request", "yes", "policy.per_request must be true or false"),
        ("max_length", 0, "policy.max_length must be an integer >= 1"),
    ],
)
def test_goodput_batch_names_a_bad_key_and_its_range(key, value, message):
    with pytest.raises(ValueError, match=message):
        GoodputBatchPolicy(**{key: value})


def test_verify_cost_ignores_slow_passes_and_fits_a_line_above_the_smallest_count():
    """A count's estimate is the least of its last ``window`` samples (a slow pass -- first call,
    other work -- does not inflate it); from the second smallest count on, with three or more
    counts there, the curve is their least-squares line (noise does not make flat steps)."""
    cost = VerifyCost(window=3)
    cost.observe(8, 8.0)
    cost.observe(16, 12.0)
    cost.observe(16, 40.0)  # a slow pass
    assert cost.ms(16) == pytest.approx(12.0) and cost.affine_from() is None
    for n, ms in ((24, 14.5), (32, 15.5), (40, 18.0)):  # roughly 12 + 0.25 per token past 16, noisy
        cost.observe(n, ms)
    start, at_start, per_token = cost.affine_from()
    # weights: samples per count (16 has 2); polyfit weighs residuals, so their square roots
    slope, intercept = np.polyfit([16, 24, 32, 40], [12.0, 14.5, 15.5, 18.0], 1, w=np.sqrt([2, 1, 1, 1]))
    assert start == 16 and per_token == pytest.approx(slope) and at_start == pytest.approx(intercept + 16 * slope)
    # the line, not the samples: 32 and 40 on it; 8 keeps its own value; between 8 and 16, linear
    assert cost.ms(40) == pytest.approx(at_start + 24 * per_token)
    assert cost.ms(8) == pytest.approx(8.0) and cost.ms(12) == pytest.approx((8.0 + at_start) / 2)
    for _ in range(3):
        cost.observe(16, 30.0)  # three slow passes in a row: the window's least is slow now
    assert cost.ms(8) == pytest.approx(8.0) and cost.observed[16] > 12.0


def test_goodput_batch_probes_the_best_speculative_length_while_speculation_is_off():
    steep = _linear(0.0, 1.0)
    policies = _goodput_batch(4, 0.9, steep, pass_ms=0.5)
    drafting = VerifyCost()
    for passes in (4, 16, 48):
        drafting.observe(passes, 0.5 * passes)
    plans = [
        GoodputBatchPolicy.plan_round(policies, [BatchContext(4, i, steep, draft_cost=drafting) for i in range(4)])
        for _ in range(64)
    ]
    probes = [p for p in plans if any(p)]
    assert len(probes) == 2 and all(len(set(p)) == 1 and p[0] >= 1 for p in probes)  # every 32 rounds


def test_verify_cost_line_never_dips_below_the_smallest_count():
    """Costs turning steeply up past a knee: the line through them would give the second count
    less than the first (a draft token cheaper than none); it starts at the smallest count's cost."""
    cost = VerifyCost()
    for n, ms in ((8, 11.9), (16, 12.0), (24, 12.0), (32, 30.0)):
        cost.observe(n, ms)
    values = cost.ms(np.array([8, 12, 16, 24, 32, 40]))
    assert values[0] == pytest.approx(11.9) and (np.diff(values) >= 0).all() and values[2] >= 11.9
