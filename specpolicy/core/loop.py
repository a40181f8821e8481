"""The round, once: draft -> verify -> commit -> record over R >= 1 requests in flight.

``generate`` (``specpolicy.core.decoding``) is this loop with one request on the batch-1 verifier,
``generate_batch`` (``specpolicy.core.batching``) the same loop with up to ``slots`` requests on the
verifier's batched form; vanilla decoding is the loop without a drafter (every draft empty, one token
a round), so speedups compare like with like::

    admit:   queued requests that have arrived take free rows: the target's prefill of the prompt,
             then the request's drafter's (given the prompt's target features when it reads them)
    repeat while requests are queued or in flight:
        end:     a request whose context has no room left ends before the round
        plan:    (batch serving) a batch-aware policy class plans every request's length at once
        draft:   each request asks its policy for a length and drafts it, extending while the policy
                 wants more (FailFast Alg. 1 shape); the drafter calls of every request at the same
                 step go together (``Drafter.draft_many``: one pass for all where the drafter can); a
                 tree policy drafts its request's whole tree (``specpolicy.core.tree``); draft reuse
                 appends the previous round's rejected tail (FailFast App. E)
        verify:  ONE target pass over every request's [pending token] + draft (a tree: a tree mask)
        commit:  per request, the accepted prefix + the correction/bonus token, cut at the FIRST of
                 EOS, a stop string's completion and max_new_tokens (exactly where plain decoding
                 would stop); its drafter rolls back (timed as drafting); its round record; its
                 policy and draft reuse learn from the round; the record's ``host_ms`` is the round's
                 time outside the model passes (``specpolicy.core.passes``), then ``on_round`` sees it
        leave:   a finished request frees its row (continuous batching, Orca, Yu et al. OSDI 2022)

Sampling (``sampling`` with temperature > 0): drafters sample their tokens and the verifier runs
speculative sampling (``specpolicy.core.sampling``), so each output is distributed as sampling from the
target. Draws come from ``runtime.generator`` in round and row order.
"""

from __future__ import annotations

import copy
import inspect
import operator
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol, cast

import torch

from specpolicy.core.batch_context import BatchContext, VerifyCost
from specpolicy.core.drafter import Drafter
from specpolicy.core.passes import PassClock, pass_entry_points
from specpolicy.core.policy import LengthPolicy, PolicyAnswerError, RunawayDrafts, TreePolicy
from specpolicy.core.protocols import FeatureVerifier
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.serving import RequestTiming
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import Draft, GenerationResult, RoundRecord, Verification
from specpolicy.core.verifier import Verifier

#: Policies whose drafts never end until the room runs out (one warning per run, on stderr).
RUNAWAY = RunawayDrafts()


@dataclass(frozen=True)
class Decoding:
    """What a call of the loop decodes with: the method and the generation settings.

    Attributes:
        max_new_tokens: tokens generated per request at most (>= 1).
        drafter / policy: the drafter and its length policy (both: speculative decoding; neither:
            vanilla decoding).
        reuse: draft reuse by suffix matching (FailFast App. E), or None.
        stop: stop strings matched on each request's decoded output, or None.
        sampling: None or greedy: greedy decoding; else lossless speculative sampling.
        on_round: called with every verified round's record (request index, record).
    """

    max_new_tokens: int
    drafter: Drafter | None = None
    policy: LengthPolicy | None = None
    reuse: DraftReuse | None = None
    stop: StopStrings | None = None
    sampling: SamplingConfig | None = None
    on_round: Callable[[int, RoundRecord], None] | None = None

    def check(self) -> None:
        """Raises ValueError for ``max_new_tokens`` < 1 or a drafter without a policy (or the reverse)."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if (self.drafter is None) != (self.policy is None):
            raise ValueError("drafter and policy go together: pass both (speculative) or neither (vanilla)")


class Target(Protocol):
    """The loop's target: rows of requests, each verified in one pass per round (``verifiers/hf_batch.py``
    for R requests, ``OneRequestTarget`` for the batch-1 verifier)."""

    max_context: int
    eos_token_ids: Any
    rows: int

    def add(self, prompt_ids: torch.Tensor) -> torch.Tensor | None:
        """Prefill a new last row; returns its prompt's target features when features were asked for."""

    def remove(self, row: int) -> None:
        """Drop a row (its cache)."""

    def verify(self, drafts: list[Draft]) -> list[Verification]:
        """Verify every row's draft in one pass, in row order."""


class OneRequestTarget:
    """A batch-1 ``Verifier`` as the loop's target of one row (``generate``): its prefill, its
    verification (chains and trees) and its features."""

    def __init__(self, verifier: Verifier, sampling: SamplingConfig | None, feature_layers: tuple[int, ...]) -> None:
        self.verifier, self.sampling, self.feature_layers = verifier, sampling, feature_layers
        self.max_context = verifier.max_context
        self.eos_token_ids = verifier.eos_token_ids
        self.rows = 0
        if isinstance(verifier, FeatureVerifier):
            verifier.request_features(feature_layers)  # () switches features off (vanilla computes none)

    def add(self, prompt_ids: torch.Tensor) -> torch.Tensor | None:
        if self.rows:
            raise ValueError("OneRequestTarget holds one request")
        prefill(self.verifier, prompt_ids, self.sampling)
        self.rows = 1
        return self.verifier.prompt_features if self.feature_layers else None

    def remove(self, row: int) -> None:
        self.rows = 0

    def verify(self, drafts: list[Draft]) -> list[Verification]:
        return [self.verifier.verify(drafts[0])]

    @property
    def timed_calls(self) -> tuple:
        """The verifier's pass entry points (``specpolicy.core.passes.pass_entry_points``)."""
        return pass_entry_points(self.verifier)


@dataclass
class _InFlight:
    """One request in flight: its own drafter, policy, reuse and stop state, output and rounds."""

    index: int  # the request's index in the call
    prompt_len: int  # tokens
    context_limit: int  # generated tokens the context allows
    drafter: Drafter | None
    policy: LengthPolicy | None
    reuse: DraftReuse | None
    stop: StopStrings | None
    arrival_s: float
    admitted_s: float
    prefill_ms: float = 0.0
    outputs: list[int] = field(default_factory=list)  # the emitted tokens, read once per round
    rounds: list[RoundRecord] = field(default_factory=list)
    generated: int = 0
    first_token_s: float | None = None
    finish_reason: str = ""
    drafts_tree: bool = False  # its policy is a ``TreePolicy`` (asked once, at admission)


@dataclass
class LoopResult:
    """What one call of the loop produced (``specpolicy.core.batching.BatchResult`` is its public form).

    Attributes:
        results / timings: request index -> its ``GenerationResult`` / ``RequestTiming``.
        errors: request index -> the ValueError that refused it at admission (e.g. a prompt too long).
        wall_s: first admission to last finish (s).
        verify_tokens / batch_sizes / padded_tokens / drafter_passes: per round, the tokens verified
            (sum of ``k_i + 1``), the requests in flight, the tokens the target pass computed
            (``rows x (1 + longest draft)``) and the most drafter passes a request spent.
    """

    results: dict[int, GenerationResult] = field(default_factory=dict)
    timings: dict[int, RequestTiming] = field(default_factory=dict)
    errors: dict[int, ValueError] = field(default_factory=dict)
    wall_s: float = 0.0
    verify_tokens: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    padded_tokens: list[int] = field(default_factory=list)
    drafter_passes: list[int] = field(default_factory=list)


def run_loop(
    prompts: list[torch.Tensor],
    target: Target,
    runtime: Runtime,
    how: Decoding,
    *,
    slots: int,
    arrivals: list[float],
    own_state: bool,
    plan_batches: bool,
) -> LoopResult:
    """Decode ``prompts`` (``(P_i,) int64`` each) with up to ``slots`` in flight (module docstring).

    Args:
        target: the prefilled rows' verifier (``Target``).
        how: the method and settings (checked by the caller: ``Decoding.check``).
        slots: requests in flight at most (>= 1).
        arrivals: seconds from the start at which each request arrives, one per prompt.
        own_state: True: each request drafts with a copy of ``how.drafter`` (``copy.copy``: same
            weights, its own state), a deep copy of the policy and copies of the reuse and stop
            state, and its drafter copy is released when it leaves; False (one request): the given
            objects themselves, reset for the prompt.
        plan_batches: give each policy the round's ``BatchContext`` (batch serving; a batch-aware
            policy class plans the round, ``LengthPolicy.plan_round``).
    Returns:
        a ``LoopResult``; a request refused at admission (a ValueError: e.g. a prompt longer than
        the context) is in ``errors`` and the others go on.
    """
    device = runtime.torch_device
    eos_ids = frozenset(int(i) for i in target.eos_token_ids)
    drafter_context = (how.drafter.max_context if how.drafter is not None else 0) or target.max_context
    features_wanted = bool(getattr(target, "feature_layers", ()))
    queue = deque(sorted(range(len(prompts)), key=lambda i: arrivals[i]))
    active: list[_InFlight] = []
    out = LoopResult()
    verify_cost, draft_cost = VerifyCost(), VerifyCost()  # the batch's measured costs, shared by every policy
    clock = PassClock(runtime)  # the model passes of each round: the rest is its host work
    clock.watch(pass_entry_points(target))
    start = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - start

    def leave(row: int) -> None:
        r = active.pop(row)
        target.remove(row)
        if own_state and r.drafter is not None:
            clock.unwatch(r.drafter)
            r.drafter.release()
        if own_state and r.policy is not None:
            clock.unwatch(r.policy)
        ids = torch.tensor(r.outputs, dtype=torch.long, device=device)
        t = now()
        out.results[r.index] = GenerationResult(ids, tuple(r.rounds), r.finish_reason, t - r.admitted_s, r.prefill_ms)
        first = r.first_token_s if r.first_token_s else t
        out.timings[r.index] = RequestTiming(r.arrival_s, r.admitted_s, first, t, int(ids.shape[0]))

    with clock:
        while queue or active:
            while queue and len(active) < slots and arrivals[queue[0]] <= now():  # admit (continuous batching)
                i = queue.popleft()
                try:
                    r = _admit(i, prompts[i].to(device), target, runtime, how, own_state, features_wanted)
                except ValueError as error:
                    out.errors[i] = error
                    continue
                r.arrival_s, r.admitted_s = arrivals[i], r.admitted_s - start
                r.context_limit = min(target.max_context, drafter_context) - r.prompt_len
                active.append(r)
                clock.watch(pass_entry_points(r.drafter))
                clock.watch(pass_entry_points(r.policy))  # a policy's network (an acceptance head) is a pass too
            if not active:
                if not queue:  # the last prompts were refused
                    break
                time.sleep(max(0.0, arrivals[queue[0]] - now()))  # idle until the next arrival
                continue
            for row in reversed(range(len(active))):  # a request with no room left ends before its round
                if active[row].context_limit - active[row].generated < 0:
                    active[row].finish_reason = "max_context"
                    leave(row)
            if not active:
                continue
            clock.discard()  # the admissions' prefills
            host_start = runtime.mark()  # the round, planning included: host ms = this span - its passes
            if plan_batches and how.policy is not None:
                _plan(active, verify_cost, draft_cost)
            round_start = runtime.mark() if plan_batches else host_start
            done, drafting_ms, commit_ms = _round(active, target, runtime, how, eos_ids, out, now)
            round_end = runtime.mark()
            host_ms = runtime.ms_between(host_start, round_end) - clock.take_ms()
            host_ms = max(0.0, host_ms) / len(active)  # shared equally, as drafting
            for r in active:
                r.rounds[-1] = r.rounds[-1].with_host_ms(host_ms)
                if how.on_round is not None:
                    how.on_round(r.index, r.rounds[-1])
            if plan_batches:
                # the round's cost besides drafting (verification and the loop's work per request), against
                # the tokens the target pass computed: what a batch-aware policy weighs a draft token against
                round_ms = runtime.ms_between(round_start, round_end)
                verify_cost.observe(out.padded_tokens[-1], round_ms - drafting_ms - commit_ms)
                passes = sum(r.rounds[-1].drafter_forward_passes for r in active)  # the round's drafter passes
                if passes:
                    draft_cost.observe(passes, drafting_ms + commit_ms)
            for row in reversed(done):
                leave(row)
    out.wall_s = now()
    return out


def _admit(
    index: int,
    prompt: torch.Tensor,
    target: Target,
    runtime: Runtime,
    how: Decoding,
    own_state: bool,
    features_wanted: bool,
) -> _InFlight:
    """A request's row: the target's prefill, then its drafter's (a copy when ``own_state``; given the
    prompt's target features when ``features_wanted``), its policy (checked against the drafter for a
    tree policy; reset), reuse and stop state; ``admitted_s`` is ``time.perf_counter()`` at admission.
    Raises ValueError (the target's row dropped again) when either prefill refuses the prompt."""
    admitted_s = time.perf_counter()
    drafter = copy.copy(how.drafter) if own_state and how.drafter is not None else how.drafter
    with runtime.timer() as prefill_timer:
        features = target.add(prompt)
        if drafter is not None:
            try:
                prefill(drafter, prompt, how.sampling, **({"features": features} if features_wanted else {}))
            except ValueError:  # e.g. longer than the drafter's context: the target's row goes too
                target.remove(target.rows - 1)
                if own_state:
                    drafter.release()
                raise
    policy = copy.deepcopy(how.policy) if own_state else how.policy
    if isinstance(policy, TreePolicy):
        policy.check_drafter(drafter)
    if policy is not None:
        policy.reset()
    reuse = None if drafter is None else copy.deepcopy(how.reuse) if own_state else how.reuse
    stop = copy.copy(how.stop) if own_state else how.stop  # the same tokenizer and strings, its own state
    for state in (reuse, stop):
        if state is not None:
            state.reset()
    r = _InFlight(index, int(prompt.shape[0]), 0, drafter, policy, reuse, stop, 0.0, admitted_s)
    r.prefill_ms = prefill_timer.ms
    r.drafts_tree = isinstance(policy, TreePolicy)
    return r


def _plan(active: list[_InFlight], verify_cost: VerifyCost, draft_cost: VerifyCost) -> None:
    """What each policy knows of the batch (``BatchContext``); a batch-aware class plans the round."""
    contexts = [BatchContext(len(active), row, verify_cost, draft_cost=draft_cost) for row in range(len(active))]
    policies = [cast(LengthPolicy, r.policy) for r in active]
    plan = type(policies[0]).plan_round(policies, contexts)
    for row, row_policy in enumerate(policies):
        row_policy.batch = (
            contexts[row] if plan is None else BatchContext(len(active), row, verify_cost, int(plan[row]), draft_cost)
        )


def _round(
    active: list[_InFlight],
    target: Target,
    runtime: Runtime,
    how: Decoding,
    eos_ids: frozenset[int],
    out: LoopResult,
    now: Callable[[], float],
) -> tuple[list[int], float, float]:
    """One round of every request in flight: draft, verify, commit, record.

    Returns:
        ``(rows that finished, drafting ms of the round, the drafters' commit ms summed)``.
    """
    rooms = [min(how.max_new_tokens - r.generated - 1, r.context_limit - r.generated) for r in active]
    answers: list[list[int]] = [[] for _ in active]
    mark = runtime.mark  # marks on the run's timeline (``Runtime.mark``): drafting, verification, commits
    draft_start = mark()
    node_rooms = [r.context_limit - r.generated for r in active]
    drafts, stops = draft_rows(active, rooms, node_rooms, runtime.torch_device, answers)
    if how.reuse is not None:  # each request's reuse state is a copy of it (or None without a drafter)
        drafts = [
            d if r.reuse is None or d.ends_at_stop_token or d.is_tree else r.reuse.extend(d, room)
            for r, d, room in zip(active, drafts, rooms)
        ]
    verify_start = mark()
    verifications = target.verify(drafts)
    verify_end = mark()
    if len(drafts) == 1:
        k = drafts[0].length
        out.verify_tokens.append(k + 1)
        out.padded_tokens.append(k + 1)
        out.drafter_passes.append(drafts[0].forward_passes)
    else:
        out.verify_tokens.append(sum(d.length + 1 for d in drafts))
        out.padded_tokens.append(len(drafts) * (1 + max(d.length for d in drafts)))
        out.drafter_passes.append(max(d.forward_passes for d in drafts))
    out.batch_sizes.append(len(active))
    draft_ms = runtime.ms_between(draft_start, verify_start)
    verify_ms = runtime.ms_between(verify_start, verify_end)
    drafting_ms = draft_ms / len(active)  # shared equally: passes run for many at once
    emitted_at = now()
    done, commit_total = [], 0.0
    for row, (r, draft, verification) in enumerate(zip(active, drafts, verifications)):
        # the round's one host read of its tokens (the record's, and what the stop conditions search)
        draft_ids, target_ids = draft.token_ids.tolist(), verification.target_token_ids.tolist()
        committed = committed_ids(draft_ids, target_ids, verification)  # a + 1 tokens
        keep, finish = emitted_count(committed, eos_ids, how.max_new_tokens - r.generated, r.stop)
        r.outputs += committed[:keep]
        r.generated += keep
        if keep and r.first_token_s is None:
            r.first_token_s = emitted_at
        finish = finish or limit_reached(r.generated, how.max_new_tokens, r.context_limit)
        commit_ms = 0.0
        if r.drafter is not None and not finish:  # roll back to the committed sequence (may spend a pass)
            commit_start = mark()
            r.drafter.commit(draft, verification)
            commit_ms = runtime.ms_between(commit_start, mark())
            commit_total += commit_ms
        record = round_record(
            len(r.rounds),
            draft,
            verification,
            keep,
            drafting_ms + commit_ms,
            verify_ms,
            stops[row],
            finish,
            (draft_ids, target_ids),
        )
        r.rounds.append(record)
        if how.policy is not None:
            warning = RUNAWAY.observe(how.policy, answers[row], draft.length, stops[row])
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        if finish:
            r.finish_reason = finish
            done.append(row)
            continue
        if r.policy is not None:
            r.policy.update(record)
        if r.reuse is not None:
            r.reuse.observe(draft, verification)
    return done, draft_ms, commit_total


def draft_rows(
    active: list[_InFlight], rooms: list[int], node_rooms: list[int], device: torch.device, answers: list[list[int]]
) -> tuple[list[Draft], list[str]]:
    """Every request's drafting for the round, as ``draft_round`` does it for one (the same questions to
    each policy, the same stops), the drafter calls of all requests that want tokens at the same step
    made together (``Drafter.draft_many``); a tree policy's request drafts its tree
    (``TreePolicy.draft_tree`` within ``rooms[i]`` deep and ``node_rooms[i]`` nodes).

    Returns:
        ``(drafts, why drafting stopped)`` per request, in order; each policy's valid answers are
        appended to ``answers[i]``.
    """
    if len(active) == 1 and not active[0].drafts_tree and active[0].drafter is not None:
        return _draft_alone(active[0], rooms[0], device, answers[0])
    drafts: list[Draft] = []
    stops: list[str] = []
    for r, room, node_room in zip(active, rooms, node_rooms):
        if r.drafts_tree:
            draft, stop = r.policy.draft_tree(r.drafter, room, node_room)  # type: ignore[union-attr]
            if not draft.length and draft.token_ids.device.type != device.type:
                # nothing drafted, on a device the policy guessed (a runtime-less drafter before its
                # first draft): the run's empty draft, which the verifier reads beside its own tokens
                draft = empty_draft(device)
        else:
            draft, stop = empty_draft(device), "" if r.drafter is not None else "vanilla"
        drafts.append(draft)
        stops.append(stop)
    chain_rows = [i for i, r in enumerate(active) if not stops[i] and not r.drafts_tree]
    while chain_rows:
        asks = {}
        for i in chain_rows:
            n, stops[i] = ask_policy(active[i].policy, drafts[i], rooms[i], answers[i])  # type: ignore[arg-type]
            if n:
                asks[i] = n
        if not asks:
            break
        rows = list(asks)
        drafting: list[Drafter] = [active[i].drafter for i in rows]  # type: ignore[misc]
        before = [drafts[i].length for i in rows]
        for i, b, draft in zip(rows, before, type(drafting[0]).draft_many(drafting, [asks[i] for i in rows])):
            drafts[i] = draft
            stops[i] = after_drafting(draft, b)
        chain_rows = [i for i in chain_rows if not stops[i]]
    return drafts, stops


def _draft_alone(r: _InFlight, room: int, device: torch.device, answers: list[int]) -> tuple[list[Draft], list[str]]:
    """``draft_rows`` for one request drafting a chain: the same questions, the same ``draft_many``
    calls and stops, without the per-row lists between the drafter's passes (host work per round)."""
    policy, drafter = cast(LengthPolicy, r.policy), cast(Drafter, r.drafter)
    draft_many = type(drafter).draft_many
    draft, stop = empty_draft(device), ""
    while True:
        n, stop = ask_policy(policy, draft, room, answers)
        if stop:
            return [draft], [stop]
        before = draft.length
        draft = draft_many([drafter], [n])[0]
        stop = after_drafting(draft, before)
        if stop:
            return [draft], [stop]


#: The empty draft of each device, built once: every chain round starts from it (a frozen ``Draft``
#: of two empty tensors, never written), not from two new tensors per request and round.
_EMPTY_DRAFTS: dict[torch.device | str, Draft] = {}


def empty_draft(device: torch.device | str) -> Draft:
    """``Draft.empty(device)``, the same object on every call for a device (host work per round)."""
    draft = _EMPTY_DRAFTS.get(device)
    if draft is None:
        draft = _EMPTY_DRAFTS[device] = replace(Draft.empty(device), extras=MappingProxyType({}))  # read-only
    return draft


def draft_round(
    drafter: Drafter | None,
    policy: LengthPolicy | None,
    room: int,
    device: torch.device | str,
    answers: list[int] | None = None,
) -> tuple[Draft, str]:
    """One request's drafting of a round (the loop's ``draft_rows`` for one request, for tree policies'
    chains and tests): ask ``policy.next_length`` for a length, draft it, and extend while the policy
    asks for more (FailFast Alg. 1 shape), within ``room`` tokens. Stops as well when a ``draft`` call
    adds no token (a drafter with nothing more to propose, e.g. the model-free ``suffix`` drafter
    without a matching suffix), and when the draft ends at a drafted stop token
    (``Draft.ends_at_stop_token``: nothing past it can be emitted).

    Args:
        drafter / policy: both, or neither (vanilla decoding: the empty draft).
        room: most draft tokens the round may hold (>= 0; 0: the empty draft).
        device: device of the empty draft.
        answers: when given, every valid answer of ``policy.next_length`` is appended to it.
    Returns:
        ``(draft, why drafting stopped)``: the round's draft (``(k,) int64`` tokens) and its
        ``RoundRecord.draft_stop_reason`` -- ``"length_0"`` (the first answer was 0), the
        policy's ``draft_stop_reason`` (a later 0), ``"room"``, ``"no_proposal"``, ``"stop_token"``
        or ``"vanilla"``.
    Raises:
        PolicyAnswerError: (a ValueError) when the policy answers anything but an integer >= 0.
    """
    draft = empty_draft(device)
    if drafter is None:
        return draft, "vanilla"
    assert policy is not None, "a drafter drafts with a length policy"
    while True:
        n, stop = ask_policy(policy, draft, room, answers)
        if stop:
            return draft, stop
        before = draft.length
        draft = drafter.draft(n)
        stop = after_drafting(draft, before)
        if stop:
            return draft, stop


def ask_policy(policy: LengthPolicy, draft: Draft, room: int, answers: list[int] | None = None) -> tuple[int, str]:
    """One question of a round's drafting: how many tokens to add to ``draft``.

    Returns:
        ``(n, "")`` to draft ``n`` >= 1 more tokens, or ``(0, why drafting stops)``: the policy
        answered 0 (``"length_0"`` for the empty draft, else its ``draft_stop_reason``) or the
        room is full (``"room"``).
    Raises:
        PolicyAnswerError: for an answer that is not an integer >= 0.
    """
    wanted = policy.next_length(draft)
    try:
        wanted = operator.index(wanted)  # an integer (int, NumPy or 0-d integer tensor); 2.5 is not
    except TypeError:
        raise PolicyAnswerError(policy, wanted) from None
    if wanted < 0:
        raise PolicyAnswerError(policy, wanted)
    if answers is not None:
        answers.append(wanted)
    if wanted == 0:
        return 0, ("length_0" if draft.length == 0 else policy.draft_stop_reason or "policy_bound")
    n = min(wanted, room - draft.length)
    return (n, "") if n > 0 else (0, "room")


def after_drafting(draft: Draft, before: int) -> str:
    """Why drafting stops after a ``draft`` call that began at ``before`` tokens, or ``""``: the
    drafter drafted a stop token (``"stop_token"``: no token past it is worth a pass) or added
    nothing (``"no_proposal"``)."""
    if draft.ends_at_stop_token:
        return "stop_token"
    if draft.length <= before:
        return "no_proposal"
    return ""


def emitted_of_round(
    committed: torch.Tensor, eos_ids: torch.Tensor, remaining: int, stop: StopStrings | None
) -> tuple[int, str]:
    """How many of a round's committed tokens (``(a + 1,) int64``) reach the output, and whether a
    stop condition ends generation there (``emitted_count`` on their host copy: one device sync).
    ``eos_ids``: the EOS ids, ``(e,) int64``."""
    return emitted_count(committed.tolist(), frozenset(eos_ids.tolist()), remaining, stop)


def committed_ids(draft_ids: list[int], target_ids: list[int], verification: Verification) -> list[int]:
    """``Verification.committed_tokens`` on host copies of the draft's and the target's tokens: the
    accepted draft tokens (a chain's prefix, a tree's path) then the correction / bonus token, ``a + 1``
    ints."""
    a = verification.accepted_length
    if verification.path is None:
        return draft_ids[:a] + target_ids[a : a + 1]
    last = verification.path[-1] + 1 if verification.path else 0
    return [draft_ids[node] for node in verification.path] + target_ids[last : last + 1]


def emitted_count(
    committed: list[int], eos_ids: frozenset[int], remaining: int, stop: StopStrings | None
) -> tuple[int, str]:
    """How many of a round's committed tokens (``a + 1`` ints) reach the output, and whether a stop
    condition ends generation there: up to and including the first EOS (``eos_ids``), at most
    ``remaining`` tokens, cut after the token completing the first stop string when that comes first
    (``stop``, fed the kept tokens). Returns ``(count, "eos" | "stop_string" | "")``; host work only."""
    m = len(committed)
    first_eos = next((i for i, token in enumerate(committed) if token in eos_ids), m)
    hit_eos = first_eos < min(m, remaining)
    keep = first_eos + 1 if hit_eos else min(m, remaining)
    finish = "eos" if hit_eos else ""
    if stop is not None:  # the first completion of a stop string, if it comes first
        cut = stop.check(committed[:keep])
        if cut is not None and (cut < keep or not hit_eos):
            keep, finish = cut, "stop_string"
    return keep, finish


def limit_reached(generated: int, max_new_tokens: int, context_limit: int) -> str:
    """Why generation ends after ``generated`` tokens, if a limit ends it: ``"max_new_tokens"``,
    ``"max_context"`` (the next round would not fit the context: more than ``context_limit``
    generated), else ``""``."""
    if generated >= max_new_tokens:
        return "max_new_tokens"
    return "max_context" if generated > context_limit else ""


def round_record(
    index: int,
    draft: Draft,
    verification: Verification,
    emitted: int,
    draft_ms: float,
    verify_ms: float,
    draft_stop: str,
    finish: str,
    token_lists: tuple[list[int], list[int]] | None = None,
) -> RoundRecord:
    """The ``RoundRecord`` of a verified round: ``emitted`` tokens kept after the stop conditions, the
    drafting (commit included) and verification ms, why drafting stopped and why generation ended
    (``""``: it goes on). ``token_lists``: the draft's and the target's token ids already read to the
    host (``.tolist()``), or None to read them here."""
    if token_lists is None:
        token_lists = (draft.token_ids.tolist(), verification.target_token_ids.tolist())
    return RoundRecord.built(
        index=index,
        speculation_length=draft.length,
        accepted_length=verification.accepted_length,
        emitted_tokens=emitted,
        drafter_forward_passes=draft.forward_passes,
        reused_tokens=draft.reused_tokens,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        confidences=tuple(draft.confidences.tolist()),
        draft_token_ids=tuple(token_lists[0]),
        target_token_ids=tuple(token_lists[1]),
        draft_stop_reason=draft_stop,
        finish_reason=finish,
        draft_parents=tuple(draft.parents.tolist()) if draft.parents is not None else (),  # a tree
        accepted_path=tuple(verification.path or ()),
    )


def prefill(model: Verifier | Drafter, prompt_ids: torch.Tensor, sampling: SamplingConfig | None, **extra: Any) -> None:
    """``model.prefill(prompt_ids, **extra)`` (``extra``: the prompt's target ``features`` for a
    drafter that reads them), with ``sampling=`` only when sampling (so drafters and verifiers
    written before sampling existed keep working for greedy decoding). A drafter without the
    keyword drafts as before (point masses, lossless); a verifier without it cannot sample:
    ValueError naming ``generation.temperature``."""
    if sampling is None or sampling.is_greedy:
        model.prefill(prompt_ids, **extra)
        return
    params = inspect.signature(model.prefill).parameters
    if "sampling" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        model.prefill(prompt_ids, sampling=sampling, **extra)
    elif isinstance(model, Verifier):
        raise ValueError(
            f"generation.temperature={sampling.temperature} needs a verifier that samples, but verifier "
            f"{model.name!r} has no prefill(..., sampling=) (use temperature 0 for greedy decoding)"
        )
    else:
        model.prefill(prompt_ids, **extra)
