"""The batched loop: many requests in flight, one target forward pass per round over all of them.

Beside ``specpolicy.core.decoding.generate`` (the readable batch-1 reference, which it follows step
for step), for serving studies: up to ``batch_size`` requests in flight with continuous batching
(a finished request's row is refilled from the queue at once, Orca, Yu et al. OSDI 2022);
requests arrive all at once or as a Poisson process (``specpolicy.core.serving``). Each request keeps
its own committed sequence, KV-cache row, drafter state (a shallow copy of the configured
drafter, ``Drafter.batched`` for the batch size: same weights, its own state, which ``prefill``
replaces; on the compiled runtime the copies of EAGLE-3, the AR drafter and DFlash share a static
cache of one sequence per request, greedy or sampling, the other drafters' copies draft eagerly;
``Drafter.release`` when it leaves) and policy (a deep copy of the
configured one, reset), so it drafts its own speculation length; the target verifies every
request's chain draft in ONE forward pass (``verifiers/hf_batch.py``: padded rows, an attention
mask, caches moved per request, never recomputed). Drafting goes through ``Drafter.draft_many``:
EAGLE-3 and the AR drafter advance every drafting request by a token in one pass, Fast-dLLM runs
every drafting request's unmasking or block-boundary pass in one padded pass, DFlash drafts every
drafting request's block in one padded pass, the suffix drafter (no model) request by request. Draft
reuse (``reuse``) extends each request's draft from its own previous rejected tail, as alone.

Greedy or lossless speculative sampling per request; chains only (tree policies run in the
batch-1 loop). A request leaves the batch at EOS, its first stop string, ``max_new_tokens`` or
the context's end without disturbing the others; a prompt that does not fit is skipped and
recorded (``BatchResult.skipped``), the batch goes on.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections import deque
from dataclasses import dataclass, field
from typing import cast

import torch

from specpolicy.core.batch_context import BatchContext, VerifyCost
from specpolicy.core.decoding import _prefill, after_drafting, ask_policy, emitted_of_round, limit_reached, round_record
from specpolicy.core.drafter import Drafter
from specpolicy.core.policy import LengthPolicy, TreePolicy
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.serving import RequestTiming, summarize
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import Draft, GenerationResult, RoundRecord


@dataclass
class _Request:
    """One request in flight."""

    index: int  # the prompt's index in the run
    prompt_len: int  # tokens
    context_limit: int  # generated tokens the context allows
    drafter: Drafter | None
    policy: LengthPolicy | None
    arrival_s: float
    admitted_s: float
    outputs: list[torch.Tensor] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    generated: int = 0
    first_token_s: float | None = None
    finish_reason: str = ""
    prefill_ms: float = 0.0
    stop: StopStrings | None = None  # its own matching state (a copy of the run's, reset)
    reuse: DraftReuse | None = None  # its own rejected tail (a copy of the run's, reset)


@dataclass(frozen=True)
class BatchResult:
    """What the batched loop produced.

    Attributes:
        results: request index -> its ``GenerationResult`` (``wall_s``: admission to finish;
            ``prefill_ms``: its prefill, both models), for every request not skipped.
        timings: request index -> its ``specpolicy.core.serving.RequestTiming``.
        skipped: request index -> the one-line reason it was skipped (e.g. a prompt too long).
        wall_s: the run's wall-clock seconds, first arrival to last finish.
        verify_tokens: per round, the tokens the target verified over all rows (sum of ``k_i + 1``).
        batch_sizes: per round, the requests in flight.
        padded_tokens: per round, the tokens the target pass computed, ``rows x (1 + longest
            draft)`` (rows padded to the longest draft; ``specpolicy.analysis.batch_model`` models its cost).
        drafter_passes: per round, the most drafter forward passes a request spent drafting (0 for
            vanilla): the round's drafting steps when the passes of all requests run together.
    """

    results: dict[int, GenerationResult]
    timings: dict[int, RequestTiming]
    skipped: dict[int, str]
    wall_s: float
    verify_tokens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    padded_tokens: tuple[int, ...] = ()
    drafter_passes: tuple[int, ...] = ()

    def summary(self) -> dict[str, float]:
        """Throughput and TTFT / TPOT / latency statistics (``specpolicy.core.serving.summarize``),
        plus rounds and the mean requests in flight per round."""
        out = summarize([self.timings[i] for i in sorted(self.timings)], self.wall_s)
        out["rounds"] = float(len(self.batch_sizes))
        out["mean_batch_size"] = sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0
        return out


def draft_rounds(active: list[_Request], rooms: list[int], device) -> tuple[list[Draft], list[str]]:
    """Every request's drafting for the round, as ``specpolicy.core.decoding.draft_round`` does it for
    one (the same questions to each policy, the same stops), with the drafter calls of all
    requests that want tokens at the same time made together (``Drafter.draft_many``: one
    forward pass for all of them where the drafter can).

    Returns:
        ``(drafts, why drafting stopped)`` per request, in order.
    """
    drafts = [Draft.empty(device) for _ in active]
    stops = ["vanilla" if r.drafter is None else "" for r in active]
    while True:
        asks = {}
        for i, r in enumerate(active):
            if not stops[i]:  # a request that drafts (a drafter, so a policy)
                n, stops[i] = ask_policy(cast(LengthPolicy, r.policy), drafts[i], rooms[i])
                if n:
                    asks[i] = n
        if not asks:
            return drafts, stops
        rows = list(asks)
        before = [drafts[i].length for i in rows]
        drafting = [cast(Drafter, active[i].drafter) for i in rows]
        drafter_class = type(drafting[0])
        for i, b, draft in zip(rows, before, drafter_class.draft_many(drafting, [asks[i] for i in rows])):
            drafts[i] = draft
            stops[i] = after_drafting(draft, b)


def generate_batch(
    prompts: list[torch.Tensor],
    verifier,
    runtime: Runtime,
    *,
    max_new_tokens: int,
    batch_size: int,
    drafter: Drafter | None = None,
    policy: LengthPolicy | None = None,
    arrivals: list[float] | None = None,
    sampling: SamplingConfig | None = None,
    stop: StopStrings | None = None,
    reuse: DraftReuse | None = None,
) -> BatchResult:
    """Decode ``prompts`` with up to ``batch_size`` in flight (see the module docstring).

    Args:
        prompts: ``(P_i,) int64`` prompt ids per request.
        verifier (specpolicy.core.verifier.Verifier): the run's ``hf`` verifier (its model, context
            and stop tokens serve the batch).
        runtime: device, dtype.
        max_new_tokens: per request, >= 1.
        batch_size: requests in flight at most, >= 1.
        drafter: the drafter, with ``policy`` (both: speculative; neither: vanilla batched decoding);
            copied per request.
        policy: the length policy, copied per request.
        arrivals: seconds from the start at which each request arrives (default: all at 0;
            ``specpolicy.core.serving.arrival_times``), non-decreasing.
        sampling: None or greedy: every request's output is its greedy output; otherwise lossless
            speculative sampling per request (the draws from ``runtime.generator``, in round and
            row order: a request's sample depends on what shares its batch, its distribution does not).
        stop: optional stop strings (``specpolicy.core.stopping.StopStrings``): each request matches
            them on its own output (a copy per request) and leaves the batch after the token
            completing the first one, as it does alone.
        reuse: optional draft reuse by suffix matching (FailFast App. E, ``specpolicy.core.reuse``):
            each request extends its chain draft from its own previous round's rejected tail (a
            copy per request), after the round's drafting and timed with it, as alone.
    Returns:
        a ``BatchResult``.
    Raises:
        ValueError: for ``max_new_tokens`` or ``batch_size`` < 1, a drafter without a policy (or
            the reverse), a tree policy, or ``arrivals`` of the wrong length.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"generation.batch_size must be an integer >= 1, got {batch_size!r}")
    if (drafter is None) != (policy is None):
        raise ValueError("drafter and policy go together: pass both (speculative) or neither (vanilla)")
    if isinstance(policy, TreePolicy):
        raise ValueError(f"policy={policy.name} drafts trees; the batched loop verifies chains (use batch_size=1)")
    arrivals = [0.0] * len(prompts) if arrivals is None else list(arrivals)
    if len(arrivals) != len(prompts):
        raise ValueError(f"got {len(arrivals)} arrival times for {len(prompts)} prompts")
    with torch.inference_mode():
        return _run(
            prompts,
            verifier,
            runtime,
            max_new_tokens,
            batch_size,
            drafter,
            policy,
            arrivals,
            sampling,
            stop,
            reuse if drafter is not None else None,
        )


def _run(
    prompts, verifier, runtime, max_new_tokens, batch_size, drafter, policy, arrivals, sampling, stop, reuse
) -> BatchResult:
    device = runtime.torch_device
    sampling = None if sampling is None or sampling.is_greedy else sampling
    if not callable(getattr(verifier, "batched", None)):
        raise ValueError(
            f"verifier {getattr(verifier, 'name', type(verifier).__name__)!r} has no batched form "
            "(Verifier.batched()); the batched loop needs one (verifier=hf has it)"
        )
    # a verifier whose batched form sizes a cache takes the batch size (the compiled runtime's)
    takes_slots = "slots" in inspect.signature(verifier.batched).parameters
    target = verifier.batched(slots=batch_size) if takes_slots else verifier.batched()
    target.sampling = sampling
    target.feature_layers = tuple(drafter.target_feature_layers or ()) if drafter is not None else ()
    if drafter is not None:  # the drafter the requests copy (Drafter.batched)
        drafter = drafter.batched(batch_size)
    eos_ids = torch.tensor(sorted(target.eos_token_ids), dtype=torch.long, device=device)
    drafter_context = (drafter.max_context if drafter is not None else 0) or target.max_context
    queue = deque(sorted(range(len(prompts)), key=lambda i: arrivals[i]))
    active: list[_Request] = []
    results: dict[int, GenerationResult] = {}
    timings: dict[int, RequestTiming] = {}
    skipped: dict[int, str] = {}
    verify_tokens: list[int] = []
    batch_sizes: list[int] = []
    padded_tokens: list[int] = []  # per round, for the MODELED batched throughput (specpolicy.analysis.batch_model)
    drafter_passes: list[int] = []
    verify_cost = VerifyCost()  # the batch's measured verification cost, shared by every policy
    draft_cost = VerifyCost()  # the round's measured drafting cost against its drafter passes, shared too
    planner = type(policy).plan_round if policy is not None else None
    start = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - start

    def finish(row: int) -> None:
        r = active.pop(row)
        target.remove(row)
        if r.drafter is not None:
            r.drafter.release()
        out = torch.cat(r.outputs) if r.outputs else torch.empty(0, dtype=torch.long, device=device)
        t = now()
        results[r.index] = GenerationResult(
            output_ids=out.clone(),
            rounds=tuple(r.rounds),
            finish_reason=r.finish_reason,
            wall_s=t - r.admitted_s,
            prefill_ms=r.prefill_ms,
        )
        timings[r.index] = RequestTiming(
            r.arrival_s, r.admitted_s, r.first_token_s if r.first_token_s else t, t, int(out.shape[0])
        )

    while queue or active:
        while queue and len(active) < batch_size and arrivals[queue[0]] <= now():  # admit (continuous batching)
            i = queue.popleft()
            admitted = now()
            prompt = prompts[i].to(device)
            mine = policy_copy = None
            try:
                features = target.add(prompt)
                if drafter is not None:
                    mine = copy.copy(drafter)  # same weights, not a batch-1 static cache (Drafter.__copy__)
                    try:
                        _prefill(mine, prompt, sampling, **({"features": features} if target.feature_layers else {}))
                        policy_copy = copy.deepcopy(policy)
                        policy_copy.reset()
                    except ValueError:  # e.g. longer than the drafter's context: the target's row goes too
                        target.remove(target.rows - 1)
                        mine.release()
                        raise
            except ValueError as error:
                skipped[i] = str(error)
                continue
            limit = min(target.max_context, drafter_context) - int(prompt.shape[0])
            r = _Request(i, int(prompt.shape[0]), limit, mine, policy_copy, arrivals[i], admitted)
            r.prefill_ms = (now() - admitted) * 1e3
            if stop is not None:
                r.stop = copy.copy(stop)  # the same tokenizer and strings; its own matching state
                r.stop.reset()
            if reuse is not None:
                r.reuse = DraftReuse(reuse.min_match)
            active.append(r)
        if not active:
            if not queue:  # the last prompts were refused
                break
            time.sleep(max(0.0, arrivals[queue[0]] - now()))  # idle until the next arrival
            continue
        for row in reversed(range(len(active))):  # a request with no room left ends before its round
            if active[row].context_limit - active[row].generated < 0:
                active[row].finish_reason = "max_context"
                finish(row)
        if not active:
            continue

        if planner is not None:  # what each policy knows of the batch; a batch-aware class plans the round
            contexts = [
                BatchContext(len(active), row, verify_cost, draft_cost=draft_cost) for row in range(len(active))
            ]
            policies = [cast(LengthPolicy, r.policy) for r in active]
            plan = planner(policies, contexts)
            for row, row_policy in enumerate(policies):
                row_policy.batch = (
                    contexts[row]
                    if plan is None
                    else BatchContext(len(active), row, verify_cost, int(plan[row]), draft_cost)
                )
        round_start = time.perf_counter()
        rooms = [min(max_new_tokens - r.generated - 1, r.context_limit - r.generated) for r in active]
        drafts, stops = draft_rounds(active, rooms, device)
        if reuse is not None:  # as the batch-1 loop: after drafting, never past a drafted stop token
            drafts = [
                d if d.ends_at_stop_token or r.reuse is None else r.reuse.extend(d, room)
                for r, d, room in zip(active, drafts, rooms)
            ]
        drafting_ms = (time.perf_counter() - round_start) * 1e3  # shared equally: passes run for many at once
        t0 = time.perf_counter()
        verifications = target.verify(drafts)
        verify_ms = (time.perf_counter() - t0) * 1e3
        verify_tokens.append(sum(d.length + 1 for d in drafts))
        padded = len(drafts) * (1 + max(d.length for d in drafts))
        padded_tokens.append(padded)
        drafter_passes.append(max(d.forward_passes for d in drafts))
        batch_sizes.append(len(active))
        emitted_at = now()

        done, commit_total = [], 0.0
        for row, (r, draft, verification) in enumerate(zip(active, drafts, verifications)):
            committed = verification.committed_tokens(draft)
            keep, reason = emitted_of_round(committed, eos_ids, max_new_tokens - r.generated, r.stop)
            r.outputs.append(committed[:keep])
            r.generated += keep
            if keep and r.first_token_s is None:
                r.first_token_s = emitted_at
            reason = reason or limit_reached(r.generated, max_new_tokens, r.context_limit)
            commit_ms = 0.0
            if r.drafter is not None and not reason:
                t0 = time.perf_counter()
                r.drafter.commit(draft, verification)
                commit_ms = (time.perf_counter() - t0) * 1e3
                commit_total += commit_ms
            record = round_record(
                len(r.rounds),
                draft,
                verification,
                keep,
                drafting_ms / len(active) + commit_ms,
                verify_ms,
                stops[row],
                reason,
            )
            r.rounds.append(record)
            if reason:
                r.finish_reason = reason
                done.append(row)
            else:
                if r.policy is not None:
                    r.policy.update(record)
                if r.reuse is not None:
                    r.reuse.observe(draft, verification)
        # the round's cost besides drafting (verification and the loop's work per request), against
        # the tokens the target pass computed: what a batch-aware policy weighs a draft token against
        verify_cost.observe(padded, (time.perf_counter() - round_start) * 1e3 - drafting_ms - commit_total)
        passes = sum(d.forward_passes for d in drafts)  # the round's drafter passes over all requests
        if passes:
            draft_cost.observe(passes, drafting_ms + commit_total)
        for row in reversed(done):
            finish(row)
    return BatchResult(
        results,
        timings,
        skipped,
        now(),
        tuple(verify_tokens),
        tuple(batch_sizes),
        tuple(padded_tokens),
        tuple(drafter_passes),
    )
