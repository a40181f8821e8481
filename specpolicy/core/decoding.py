"""The speculative decoding loop (batch size 1), readable top to bottom.

    prefill target and drafter
    repeat until EOS, a stop string, max_new_tokens or a full context:
        draft:   ask the policy for a length, draft it, extend while the policy wants more
                 (a tree policy drafts the round's whole tree instead: specpolicy.core.tree)
        reuse:   optionally append tokens from the previous round's rejected tail
        verify:  one target forward over [pending token] + draft (a tree: with a tree mask)
        commit:  accepted prefix + correction/bonus token, cut at the FIRST of EOS, a stop
                 string's completion and max_new_tokens (anywhere in the accepted draft or on
                 the bonus token: exactly where plain decoding would stop)
        update:  drafter rolls back (timed as drafting), policy learns from the round

Vanilla decoding is the same loop with no drafter: every draft is empty and each round
emits exactly one token, so speedups compare like with like.

Sampling (``sampling`` with temperature > 0): the same loop; drafters sample their tokens and
the verifier runs speculative sampling (``specpolicy.core.sampling``), so the output is distributed
as sampling from the target (lossless in distribution, not token for token); vanilla sampling
is the same loop without drafter. Draws come from ``runtime.generator``: seed it (e.g.
``runtime.seed_everything``) before a call to reproduce the call's output.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from specpolicy.core.drafter import Drafter
from specpolicy.core.policy import LengthPolicy, PolicyAnswerError, RunawayDrafts, TreePolicy
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import Draft, GenerationResult, RoundRecord, Verification
from specpolicy.core.verifier import Verifier

#: Policies whose drafts never end until the room runs out (one warning per run, on stderr).
RUNAWAY = RunawayDrafts()


def generate(
    prompt_ids: torch.Tensor,
    verifier: Verifier,
    runtime: Runtime,
    *,
    max_new_tokens: int,
    drafter: Drafter | None = None,
    policy: LengthPolicy | None = None,
    reuse: DraftReuse | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
    stop: StopStrings | None = None,
    sampling: SamplingConfig | None = None,
) -> GenerationResult:
    """Generate from ``prompt_ids`` with speculative decoding (or vanilla decoding when
    ``drafter`` is None). Greedy (the default): the output is token-identical to the target's
    greedy decoding; sampling: it is distributed as sampling from the target (see ``sampling``).

    Args:
        prompt_ids: ``(P,) int64`` prompt token ids (chat template already applied).
        verifier: the target.
        runtime: device, dtype and timers.
        max_new_tokens: maximum generated tokens, >= 1.
        drafter: the drafter, with ``policy`` (both or neither: neither = vanilla decoding).
        policy: the length policy: sets each round's speculation length.
        reuse: optional draft reuse by suffix matching (FailFast App. E).
        on_round: called with each round's record (loggers, progress).
        stop: optional stop strings (``specpolicy.core.stopping.StopStrings``), matched on the
            decoded output; reset here for the prompt.
        sampling: None or greedy (temperature 0): greedy decoding, token-identical to vanilla
            greedy decoding. Otherwise lossless speculative sampling: the output is distributed
            as vanilla sampling from the target under the same settings (given to
            ``verifier.prefill`` and ``drafter.prefill``; a drafter whose ``prefill`` takes no
            ``sampling`` keeps drafting as it does, its tokens verified as point masses).
    Returns:
        A ``GenerationResult``; ``output_ids`` ends at the first EOS (included), at the token
        completing the first stop string (included), after ``max_new_tokens`` tokens, or when
        the context is full -- whichever comes first; no token after it is returned.
    Raises:
        ValueError: for ``max_new_tokens`` < 1, a drafter without a policy (or the reverse), or a
            prompt that does not fit the context; ``PolicyAnswerError`` (a ValueError) when the
            policy answers anything but an integer >= 0.
    A policy (not a built-in one) whose drafts keep growing until the room runs out because it
    never answers 0 gets one warning line on stderr, once per policy object (``RUNAWAY``,
    ``specpolicy.core.policy.RunawayDrafts``).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if (drafter is None) != (policy is None):
        raise ValueError("drafter and policy go together: pass both (speculative) or neither (vanilla)")
    # Inference mode: no autograd bookkeeping on any op of the loop (cheaper dispatch for the many
    # small tensor ops of drafting and verification); the output is cloned out of it, so callers
    # get an ordinary tensor.
    with torch.inference_mode():
        result = _generate(
            prompt_ids, verifier, runtime, max_new_tokens, drafter, policy, reuse, on_round, stop, sampling
        )
    return dataclasses.replace(result, output_ids=result.output_ids.clone())


def _generate(
    prompt_ids: torch.Tensor,
    verifier: Verifier,
    runtime: Runtime,
    max_new_tokens: int,
    drafter: Drafter | None,
    policy: LengthPolicy | None,
    reuse: DraftReuse | None,
    on_round: Callable[[RoundRecord], None] | None,
    stop: StopStrings | None,
    sampling: SamplingConfig | None,
) -> GenerationResult:
    """The loop of ``generate`` (arguments checked there)."""
    device = runtime.torch_device
    prompt_ids = prompt_ids.to(device)
    prompt_len = int(prompt_ids.shape[0])
    eos_ids = torch.tensor(sorted(verifier.eos_token_ids), dtype=torch.long, device=device)

    # Target features for drafters that read the target (DFlash, EAGLE-3); () switches them off,
    # so vanilla decoding on the same verifier computes none.
    feature_layers = tuple(drafter.target_feature_layers or ()) if drafter is not None else ()
    if feature_layers or hasattr(verifier, "request_features"):
        verifier.request_features(feature_layers)

    start = time.perf_counter()
    with runtime.timer() as prefill_timer:
        _prefill(verifier, prompt_ids, sampling)
        if drafter is not None:
            extra = {"features": verifier.prompt_features} if feature_layers else {}
            _prefill(drafter, prompt_ids, sampling, **extra)
    if isinstance(policy, TreePolicy):
        policy.check_drafter(drafter)
    if policy is not None:
        policy.reset()
    if reuse is not None:
        reuse.reset()
    if stop is not None:
        stop.reset()

    # Positions the drafter can hold (drafters without a limit leave max_context at 0).
    drafter_context = (drafter.max_context if drafter is not None else 0) or verifier.max_context
    outputs: list[torch.Tensor] = []
    rounds: list[RoundRecord] = []
    generated = 0
    finish_reason = "max_new_tokens"
    context_limit = min(verifier.max_context, drafter_context) - prompt_len  # generated tokens allowed
    while generated < max_new_tokens:
        # Room for draft tokens: one output slot is kept for the correction/bonus token, and
        # verification feeds positions up to prompt_len + generated + k - 1 < max_context.
        context_room = context_limit - generated
        if context_room < 0:
            finish_reason = "max_context"
            break
        room = min(max_new_tokens - generated - 1, context_room)

        answers: list[int] = []
        with runtime.timer() as draft_timer:
            if isinstance(policy, TreePolicy):  # the policy shapes a draft tree (specpolicy.core.tree)
                draft, draft_stop = policy.draft_tree(drafter, room, context_room)
            else:
                draft, draft_stop = draft_round(drafter, policy, room, device, answers)
            if reuse is not None and drafter is not None and not draft.ends_at_stop_token and not draft.is_tree:
                draft = reuse.extend(draft, room)

        with runtime.timer() as verify_timer:
            verification = verifier.verify(draft)

        committed = verification.committed_tokens(draft)  # (a + 1,)
        keep, finish = emitted_of_round(committed, eos_ids, max_new_tokens - generated, stop)
        outputs.append(committed[:keep])
        generated += keep
        finish = finish or limit_reached(generated, max_new_tokens, context_limit)
        finished = bool(finish)

        # Roll the drafter back to the committed sequence (timed as drafting: it may spend a pass).
        commit_ms = 0.0
        if drafter is not None and not finished:
            with runtime.timer() as commit_timer:
                drafter.commit(draft, verification)
            commit_ms = commit_timer.ms

        record = round_record(
            len(rounds), draft, verification, keep, draft_timer.ms + commit_ms, verify_timer.ms, draft_stop, finish
        )
        rounds.append(record)
        if policy is not None:
            warning = RUNAWAY.observe(policy, answers, draft.length, draft_stop)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        if on_round is not None:
            on_round(record)
        if finished:
            finish_reason = finish
            break
        if policy is not None:
            policy.update(record)
        if reuse is not None:
            reuse.observe(draft, verification)

    output_ids = torch.cat(outputs) if outputs else torch.empty(0, dtype=torch.long, device=device)
    return GenerationResult(
        output_ids=output_ids.cpu(),
        rounds=tuple(rounds),
        finish_reason=finish_reason,
        wall_s=time.perf_counter() - start,
        prefill_ms=prefill_timer.ms,
    )


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
) -> RoundRecord:
    """The ``RoundRecord`` of a verified round (both loops): ``emitted`` tokens kept after the stop
    conditions, the drafting (commit included) and verification ms, why drafting stopped and why
    generation ended (``""``: it goes on)."""
    return RoundRecord(
        index=index,
        speculation_length=draft.length,
        accepted_length=verification.accepted_length,
        emitted_tokens=emitted,
        drafter_forward_passes=draft.forward_passes,
        reused_tokens=draft.reused_tokens,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        confidences=tuple(draft.confidences.tolist()),
        draft_token_ids=tuple(draft.token_ids.tolist()),
        target_token_ids=tuple(verification.target_token_ids.tolist()),
        draft_stop_reason=draft_stop,
        finish_reason=finish,
        draft_parents=tuple(draft.parents.tolist()) if draft.parents is not None else (),  # a tree
        accepted_path=tuple(verification.path or ()),
    )


def _prefill(
    model: Verifier | Drafter, prompt_ids: torch.Tensor, sampling: SamplingConfig | None, **extra: Any
) -> None:
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


def draft_round(
    drafter: Drafter | None,
    policy: LengthPolicy | None,
    room: int,
    device: torch.device | str,
    answers: list[int] | None = None,
) -> tuple[Draft, str]:
    """One round's drafting: ask ``policy.next_length`` for a length, draft it, and extend while
    the policy asks for more (FailFast Alg. 1 shape), within ``room`` tokens. Stops as well when
    a ``draft`` call adds no token (a drafter with nothing more to propose, e.g. the model-free
    ``suffix`` drafter without a matching suffix), and when the draft ends at a drafted stop token
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
    draft = Draft.empty(device)
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
    """One question of a round's drafting (``draft_round``): how many tokens to add to ``draft``.

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
    stop condition ends generation there (both loops): up to and including the first EOS, at most
    ``remaining`` tokens, cut after the token completing the first stop string when that comes
    first (``stop``, fed the kept tokens). Returns ``(count, "eos" | "stop_string" | "")``; one
    device sync (the EOS search), plus a host copy of the kept tokens with stop strings."""
    keep, hit_eos = _cut_at_stop(committed, eos_ids, remaining)
    finish = "eos" if hit_eos else ""
    if stop is not None:  # the first completion of a stop string, if it comes first
        cut = stop.check(committed[:keep].tolist())
        if cut is not None and (cut < keep or not hit_eos):
            keep, finish = cut, "stop_string"
    return keep, finish


def _cut_at_stop(committed: torch.Tensor, eos_ids: torch.Tensor, remaining: int) -> tuple[int, bool]:
    """How many of ``committed`` ((m,) int64) to emit: up to and including the first EOS,
    and at most ``remaining``. Returns ``(count, hit_eos)``; one device sync."""
    m = int(committed.shape[0])
    is_eos = torch.isin(committed, eos_ids)
    first_eos = int(torch.where(is_eos.any(), is_eos.int().argmax(), m))  # the sync needed: where generation stops
    if first_eos < min(m, remaining):
        return first_eos + 1, True
    return min(m, remaining), False
