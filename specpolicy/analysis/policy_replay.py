"""Chain length policies replayed offline on recorded drafts, against the exact oracle, with a profile's costs.

What it is for: tuning and diagnosing length policies clock-free. The exact oracle
(``specpolicy.analysis.oracle``) replays the drafter at every committed prefix of the target's greedy
output ``y`` up to its first wrong token. Here the drafter is replayed the same way but each
position's proposal is recorded further (``collect_traces``: up to ``cap`` tokens even past the first
wrong one, with the confidences, the last hidden states an acceptance head reads and the drafter
passes each length costs). Because a greedy, self-consistent drafter proposes from a committed prefix
the same tokens whatever the rounds before it did (the oracle module's assumption, exact for greedy
AR-style drafters), a round that starts at position ``i`` and drafts ``l`` tokens accepts
``min(l, M(i))`` of them and emits ``min(l, M(i)) + 1``, whichever policy chose ``l``. So any chain
policy -- the real ``LengthPolicy`` object, fed ``Draft``s cut from the trace and ``RoundRecord``s
with the profile's modeled timings (``simulate``) -- or any length rule on the recorded estimates
(``rule_ms``) can be costed without a model pass, and compared with the oracle on the same
positions (``oracle_ms``). The round's cost is the profile's model (``specpolicy.core.latency``:
passes x ``drafter_pass_ms`` + ``target_ms_per_token`` + ``verify_ms_per_draft_token`` x length).

``gap`` decomposes a policy's excess time over the oracle's into rounds that stopped before the
drafter's first wrong token (``early``: the oracle would have carried on) and drafter passes spent on
tokens past it (``waste``: drafted, then rejected or never reached).

Limits: a policy asking for more than the recorded ``cap`` tokens gets ``cap`` (counted as
``capped`` rounds; record with a ``cap`` at least the policy's longest draft); draft reuse is not
replayed; float differences between a round's real drafter state and the replayed one (a KV cache
filled by a multi-token commit) may flip a near tie, so a simulated run can differ from a real run
by a round here and there (``benchmarks/oracle_gap.py --check-real`` counts the rounds that differ).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specpolicy.analysis.oracle import CostModel, prefill_for_replay, solve
from specpolicy.core.types import LAST_HIDDEN, Draft, RoundRecord, Verification


@dataclass
class PositionTrace:
    """The drafter's proposal from one committed prefix ``y[:i]``.

    Attributes:
        tokens: ``(m,) int64`` every token the round decoded (the drafted ones and any decoded ahead).
        confidences: ``(m,) float32`` their confidences.
        hidden: ``(m, H) float32`` their last hidden states (``Draft.extras[LAST_HIDDEN]``), or None.
        passes: ``passes[l]``: drafter passes of the round at a draft of ``l`` tokens, ``l = 0..L``.
        frontier: ``frontier[l]``: tokens decoded at a draft of ``l`` tokens (``l`` + the look-ahead).
        match: M(i), leading tokens equal to ``y[i:]`` (at most the oracle's longest and ``n - i - 1``).
        stop_at: index of a drafted stop token (the proposal ends there), or None.
    """

    tokens: torch.Tensor
    confidences: torch.Tensor
    hidden: torch.Tensor | None
    passes: list[int]
    frontier: list[int]
    match: int
    stop_at: int | None = None

    @property
    def length(self) -> int:
        """L: the longest draft recorded (tokens)."""
        return len(self.passes) - 1

    def draft(self, length: int) -> Draft:
        """The round's ``Draft`` at ``length`` tokens (``0 < length <= L``), its look-ahead as the drafter had it."""
        end = self.frontier[length]
        hidden = None if self.hidden is None else self.hidden[:end]
        stop = self.stop_at if self.stop_at is not None and self.stop_at < end else None
        return Draft.with_lookahead(
            self.tokens[:end], self.confidences[:end], None, length, stop, self.passes[length], hidden
        )


@torch.no_grad()
def collect_traces(
    drafter,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor,
    cap: int,
    oracle_max: int,
    verifier=None,
) -> list[PositionTrace]:
    """``PositionTrace`` at every committed prefix of ``output_ids`` (the target's greedy output, ``(n,)
    int64``): the drafter prefilled with ``prompt_ids`` (``(P,) int64``) drafts one token at a time
    (``draft(1)``) while the draft is shorter than ``cap`` or still matches ``y`` below ``oracle_max``
    tokens (so that M(i) is exact up to ``oracle_max``, as ``replay_match_lengths``'s), then commits
    exactly ``y[i]``. Hidden states are recorded when the drafter reports them (``report_hidden``
    is set here). A drafter that reads the target's features gets them from one pass of ``verifier``
    over ``prompt + output`` (as ``specpolicy.analysis.oracle.replay_match_lengths``).

    Raises:
        ValueError: a drafter that reads the target, without a ``verifier``.
    """
    y = [int(t) for t in output_ids.tolist()]
    n, device = len(y), prompt_ids.device
    drafter.report_hidden = True
    features = prefill_for_replay(drafter, verifier, prompt_ids, output_ids, "tracing")
    P = int(prompt_ids.shape[0])
    traces = []
    for i in range(n):
        limit = min(oracle_max, n - i - 1)
        draft, m, matching = Draft.empty(device), 0, True
        passes, frontier = [0], [0]
        while draft.length < cap or (matching and m < limit):
            nxt = drafter.draft(1)
            if nxt.length <= draft.length:
                break
            draft = nxt
            k = draft.length
            if matching and k - 1 < limit and int(draft.token_ids[k - 1]) == y[i + k - 1]:
                m = k
            else:
                matching = False
            passes.append(int(draft.forward_passes))
            frontier.append(k + int(draft.lookahead))
            if draft.ends_at_stop_token:
                break
        hidden = draft.extras.get(LAST_HIDDEN)
        conf = draft.confidences
        if draft.lookahead and draft.lookahead_confidences is not None:  # the decoded-ahead tail (a block drafter)
            conf = torch.cat([conf, draft.lookahead_confidences])
        end = frontier[-1]
        # the decoded-ahead tokens' ids are not in a Draft (nor read by a policy): -1 stands for them
        tokens = torch.cat([draft.token_ids, draft.token_ids.new_full((max(end - draft.length, 0),), -1)])
        traces.append(
            PositionTrace(
                tokens=tokens.cpu(),
                confidences=conf[:end].float().cpu(),
                hidden=None if hidden is None or hidden.shape[0] < end else hidden[:end].float().cpu(),
                passes=passes,
                frontier=[min(f, int(conf.shape[0])) for f in frontier],
                match=min(m, limit),
                stop_at=draft.length - 1 if draft.ends_at_stop_token else None,
            )
        )
        target = torch.tensor([y[i]], dtype=torch.long, device=device)
        rows = None if features is None else features[P - 1 + i : P + i]
        drafter.commit(draft, Verification(accepted_length=0, next_token=y[i], target_token_ids=target, features=rows))
    return traces


@dataclass(frozen=True)
class Costs:
    """A round's modeled cost (ms): ``passes * pass_ms + step_ms + token_ms * length`` (``specpolicy.core.latency``)."""

    pass_ms: float
    step_ms: float
    token_ms: float = 0.0

    @staticmethod
    def of(profile: Any, drafter: str | None = None) -> Costs:
        """From a complete ``LatencyProfile`` (its pass cost for ``drafter`` when it lists one)."""
        p = profile.for_drafter(drafter)
        return Costs(float(p.drafter_pass_ms), float(p.target_ms_per_token), float(p.verify_ms_per_draft_token))

    def round_ms(self, passes: float, length: int) -> float:
        return passes * self.pass_ms + self.step_ms + self.token_ms * length

    def cost_model(self) -> CostModel:
        """The oracle's ``CostModel`` (exact passes are always given to it)."""
        return CostModel(self.pass_ms, 0.0, 0.0, 1.0, self.step_ms, self.token_ms)


@dataclass
class ReplayResult:
    """A policy replayed on traces: ``rounds[p]`` = ``(position, length, accepted, passes)`` of each
    round of prompt ``p``; ``capped``: rounds cut at the recorded ``cap``."""

    rounds: list[list[tuple[int, int, int, int]]] = field(default_factory=list)
    capped: int = 0

    def ms(self, costs: Costs) -> float:
        return sum(costs.round_ms(p, k) for prompt in self.rounds for _, k, _, p in prompt)


def _ask(policy, draft: Draft) -> int:
    wanted = int(policy.next_length(draft))
    if wanted < 0:
        raise ValueError(f"{policy!r} answered {wanted}")
    return wanted


def simulate(
    policy, traces: Sequence[Sequence[PositionTrace]], max_new_tokens: int, costs: Costs, cap: int | None = None
) -> ReplayResult:
    """Replay ``policy`` (a chain ``LengthPolicy``, fresh or not) on every prompt's traces as the loop
    runs it (``specpolicy.core.loop``: ``reset`` per prompt, ``next_length`` until 0 within the room
    ``max_new_tokens - i - 1``, the drafting stopped by a stop token or the end of the proposal,
    ``update`` with the round's record; timings the ``costs``' model). ``cap``: the recorded length
    (rounds cut there are counted)."""
    out = ReplayResult()
    for prompt in traces:
        policy.reset()
        n, i, rounds = len(prompt), 0, []
        while i < n:
            tr = prompt[i]
            room = max_new_tokens - i - 1
            draft = Draft.empty()
            while True:
                wanted = _ask(policy, draft)
                if wanted == 0:
                    break
                length = min(draft.length + wanted, room, tr.length)
                if length <= draft.length:
                    if tr.length < room and draft.length + wanted > tr.length and (cap is None or tr.length >= cap):
                        out.capped += 1
                    break
                draft = tr.draft(length)
                if draft.ends_at_stop_token:
                    break
            k = draft.length
            a = min(k, tr.match)
            emitted = min(a + 1, n - i)
            passes = int(draft.forward_passes) if k else 0
            rounds.append((i, k, a, passes))
            if i + emitted < n:
                policy.update(
                    RoundRecord(
                        index=len(rounds) - 1,
                        speculation_length=k,
                        accepted_length=a,
                        emitted_tokens=emitted,
                        drafter_forward_passes=passes,
                        reused_tokens=0,
                        draft_ms=passes * costs.pass_ms,
                        verify_ms=costs.step_ms + costs.token_ms * k,
                        confidences=tuple(float(c) for c in draft.confidences.tolist()),
                    )
                )
            i += emitted
        out.rounds.append(rounds)
    return out


def oracle_stats(traces: Sequence[Sequence[PositionTrace]], costs: Costs, max_length: int) -> dict[str, float]:
    """The exact oracle over every prompt (``specpolicy.analysis.oracle.solve`` on the traces' M(i) and
    exact passes): ``ms`` (modeled), ``rounds``, ``plain_rounds`` (length 0) and drafter ``passes``."""
    out = {"ms": 0.0, "rounds": 0.0, "plain_rounds": 0.0, "passes": 0.0}
    for prompt in traces:
        M = [t.match for t in prompt]
        passes = [t.passes[: t.match + 1] for t in prompt]
        res = solve(M, costs.cost_model(), max_length, passes)
        out["ms"] += res.ms
        out["rounds"] += res.rounds
        out["plain_rounds"] += sum(length == 0 for _, length in res.schedule)
        out["passes"] += sum(prompt[i].passes[length] for i, length in res.schedule)
    return out


def oracle_ms(traces: Sequence[Sequence[PositionTrace]], costs: Costs, max_length: int) -> float:
    """The exact oracle's modeled time over every prompt (``oracle_stats``'s ``ms``)."""
    return oracle_stats(traces, costs, max_length)["ms"]


def rule_ms(
    traces: Sequence[Sequence[PositionTrace]],
    lengths: Callable[[int, int, PositionTrace], int],
    costs: Costs,
    max_new_tokens: int | None = None,
) -> tuple[float, list[list[tuple[int, int, int, int]]]]:
    """Modeled time of a length RULE: ``lengths(prompt, i, trace)`` -> the round's length at position
    ``i`` (clipped to the trace and to the loop's room ``max_new_tokens - i - 1`` when given);
    returns (ms, rounds as ``ReplayResult.rounds``)."""
    total, out = 0.0, []
    for p, prompt in enumerate(traces):
        n, i, rounds = len(prompt), 0, []
        while i < n:
            tr = prompt[i]
            room = tr.length if max_new_tokens is None else min(tr.length, max_new_tokens - i - 1)
            k = max(0, min(int(lengths(p, i, tr)), room))
            a = min(k, tr.match)
            passes = tr.passes[k]
            rounds.append((i, k, a, passes))
            total += costs.round_ms(passes, k)
            i += min(a + 1, n - i)
        out.append(rounds)
    return total, out


def gap(
    rounds: Sequence[Sequence[tuple[int, int, int, int]]], traces: Sequence[Sequence[PositionTrace]], costs: Costs
) -> dict[str, float]:
    """Where a policy's time goes beyond the drafter's first wrong token: ``rounds`` (per prompt,
    ``(position, length, accepted, passes)``). Returns rounds, tokens, ``early`` (rounds that stopped
    before the first wrong token with more tokens to accept: each costs the oracle a round it
    avoids), ``over`` (rounds that drafted past it), ``waste_ms`` (passes spent on tokens past the
    match: ``passes(l) - passes(min(l, M))``) and ``step_ms`` (the rounds' fixed cost)."""
    stats = {"rounds": 0.0, "tokens": 0.0, "early": 0.0, "over": 0.0, "waste_ms": 0.0, "step_ms": 0.0}
    for prompt, trs in zip(rounds, traces):
        n = len(trs)
        for i, k, a, p in prompt:
            tr = trs[i]
            stats["rounds"] += 1
            stats["tokens"] += min(a + 1, n - i)
            stats["early"] += k < tr.match
            stats["over"] += k > tr.match
            stats["waste_ms"] += (p - tr.passes[min(k, tr.match)]) * costs.pass_ms
            stats["step_ms"] += costs.step_ms + costs.token_ms * k
    return stats


def estimates(traces: Sequence[Sequence[PositionTrace]], head=None) -> list[list[np.ndarray]]:
    """Per prompt and position, ``(m,) float64`` acceptance estimates of the decoded tokens: the
    head's (``acceptance_probs`` on the hidden states and confidences) or, without a head, the confidences."""
    out = []
    with torch.no_grad():
        for prompt in traces:
            rows = []
            for tr in prompt:
                if head is None or tr.hidden is None or tr.hidden.shape[0] == 0:
                    rows.append(tr.confidences.double().numpy())
                else:
                    rows.append(head.acceptance_probs(tr.hidden, tr.confidences).double().numpy())
            out.append(rows)
    return out


def outcomes(traces: Sequence[Sequence[PositionTrace]], outputs: Sequence[Sequence[int]]) -> tuple[np.ndarray, ...]:
    """Calibration data: every decoded token with its draft position (1-based) and label, 1 when it
    equals the target's token given an all-correct draft before it (only tokens whose prefix
    matched: the acceptance conditional a stop rule needs). Returns (prompt, position, distance, label)."""
    rows = []
    for p, (prompt, y) in enumerate(zip(traces, outputs)):
        n = len(y)
        for i, tr in enumerate(prompt):
            upto = min(tr.match + 1, int(tr.tokens.shape[0]), n - i)
            for j in range(upto):
                rows.append((p, i, j + 1, float(int(tr.tokens[j]) == y[i + j])))
    return tuple(np.asarray(c) for c in zip(*rows)) if rows else tuple(np.zeros(0) for _ in range(4))
