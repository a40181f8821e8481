"""Chain length policies replayed on recorded drafts (specpolicy.analysis.policy_replay)."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.analysis.oracle import replay_match_lengths
from specpolicy.analysis.policy_replay import (
    Costs,
    PositionTrace,
    collect_traces,
    gap,
    oracle_ms,
    outcomes,
    rule_ms,
    simulate,
)
from specpolicy.core.decoding import generate
from specpolicy.drafters.ar import ARDrafter
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.goodput import GoodputPolicy
from specpolicy.policies.specdecpp import SpecDecPPPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


def _trace(match: int, length: int = 4, conf: float = 0.9) -> PositionTrace:
    """An AR-like trace: ``length`` tokens, one pass each, the first ``match`` right."""
    return PositionTrace(
        tokens=torch.arange(length),
        confidences=torch.full((length,), conf),
        hidden=None,
        passes=list(range(length + 1)),
        frontier=list(range(length + 1)),
        match=match,
    )


def test_static_policy_worked_example():
    # 7 output tokens; M(i) per position; static k = 2 with a pass of 1 ms, a step of 10 ms:
    # round at 0 drafts 2, M(0) = 3 -> accepts 2, emits 3 (to 3); at 3: M = 0 -> emits 1 (to 4);
    # at 4: M = 2 -> accepts 2, emits 3 (to 7, the end). 3 rounds x (2 passes + 10 ms) = 36 ms.
    M = [3, 2, 1, 0, 2, 1, 0]
    traces = [[_trace(m) for m in M]]
    costs = Costs(pass_ms=1.0, step_ms=10.0)
    res = simulate(StaticPolicy(2), traces, max_new_tokens=7, costs=costs)
    assert [(i, k, a) for i, k, a, _ in res.rounds[0]] == [(0, 2, 2), (3, 2, 0), (4, 2, 2)]
    assert res.ms(costs) == pytest.approx(36.0)
    stats = gap(res.rounds, traces, costs)
    # early: round 0 (2 < M = 3); over: round 1 (2 > 0: 2 passes wasted)
    assert (stats["rounds"], stats["tokens"], stats["early"], stats["over"]) == (3, 7, 1, 1)
    assert stats["waste_ms"] == pytest.approx(2.0)
    # the oracle: draft 3 at 0 (to 4), 2 at 4 (to 7): (3 + 10) + (2 + 10) = 25 ms
    assert oracle_ms(traces, costs, 60) == pytest.approx(25.0)
    # a rule (draft exactly M + 1, as a perfect head would) costs the same rounds through rule_ms
    ms, rounds = rule_ms(traces, lambda p, i, tr: tr.match + 1, costs)
    assert [(i, k) for i, k, _, _ in rounds[0]] == [(0, 4), (4, 3)] and ms == pytest.approx(4 + 10 + 3 + 10)


def test_room_and_the_recorded_cap_bound_the_draft():
    traces = [[_trace(3, length=4) for _ in range(6)]]
    res = simulate(StaticPolicy(9), traces, max_new_tokens=6, costs=Costs(1.0, 10.0), cap=4)
    # room at 0 is 5 but only 4 tokens are recorded: the round is capped there
    assert res.rounds[0][0][1] == 4 and res.capped >= 1
    assert all(k <= 6 - i - 1 for i, k, _, _ in res.rounds[0])  # never past the room


def test_outcomes_label_each_token_up_to_the_first_wrong_one():
    tr = _trace(1, length=3)  # tokens 0, 1, 2: the first right, the second wrong
    _, _, distance, label = outcomes([[tr]], [[0, 7, 8]])
    assert distance.tolist() == [1, 2] and label.tolist() == [1.0, 0.0]


@pytest.fixture(scope="module")
def models():
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    drafter = copy.deepcopy(target)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        drafter.lm_head.weight.add_(0.6 * torch.randn(drafter.lm_head.weight.shape, generator=g))
    return target, drafter


@pytest.mark.parametrize(
    "make",
    [
        lambda: StaticPolicy(3),
        lambda: SpecDecPPPolicy(h=0.5, min_length=1, max_length=8),
        lambda: FailFastPolicy(n=2, tau=0.5, n_max=8),
        lambda: GoodputPolicy(max_length=8, cost_profile="a6000-qwen7b", cost_drafter="ar"),
    ],
    ids=["static", "specdecpp", "failfast", "goodput"],
)
def test_replay_gives_the_real_loops_rounds(runtime, models, make):
    """An AR drafter is self-consistent: every policy's replayed rounds are the real loop's."""
    target, small = models
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    prompts = random_prompts(2)
    costs = Costs(pass_ms=6.1, step_ms=13.5)
    real, traces, outputs = [], [], []
    policy = make()
    for prompt in prompts:
        out = generate(prompt, verifier, runtime, max_new_tokens=30, drafter=ARDrafter(small, runtime), policy=policy)
        real.append([(r.speculation_length, r.accepted_length) for r in out.rounds])
        outputs.append(out.output_ids)
        traces.append(collect_traces(ARDrafter(small, runtime), prompt, out.output_ids, cap=8, oracle_max=12))
    res = simulate(make(), traces, max_new_tokens=30, costs=costs, cap=8)
    assert [[(k, a) for _, k, a, _ in r] for r in res.rounds] == real
    assert res.capped == 0
    # the traces' M are the exact oracle's replay, and no policy beats the oracle
    M, _ = replay_match_lengths(ARDrafter(small, runtime), prompts[0], outputs[0], 12)
    assert [t.match for t in traces[0]] == M
    assert oracle_ms(traces, costs, 12) <= res.ms(costs) + 1e-9
