"""The speculative decoding loop (batch size 1), readable top to bottom.

    prefill target and drafter
    repeat until EOS or max_new_tokens:
        draft:   ask the policy for a length, draft it, extend while the policy wants more
        reuse:   optionally append tokens from the previous round's rejected tail
        verify:  one target forward over [pending token] + draft
        commit:  accepted prefix + correction/bonus token, cut at EOS / max_new_tokens
        update:  drafter rolls back (timed as drafting), policy learns from the round

Vanilla decoding is the same loop with no drafter: every draft is empty and each round
emits exactly one token, so speedups compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specpolicy.drafter import Drafter
from specpolicy.policy import LengthPolicy
from specpolicy.reuse import DraftReuse
from specpolicy.runtime import Runtime
from specpolicy.types import Draft, GenerationResult, RoundRecord
from specpolicy.verifier import Verifier


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
) -> GenerationResult:
    """Generate greedily from ``prompt_ids`` with speculative decoding (or vanilla decoding
    when ``drafter`` is None). The output is token-identical to the target's greedy decoding.

    Args:
        prompt_ids: ``(P,) int64`` prompt token ids (chat template already applied).
        verifier: the target.
        runtime: device, dtype and timers.
        max_new_tokens: maximum generated tokens, >= 1.
        drafter / policy: both or neither; the policy sets the speculation length.
        reuse: optional draft reuse by suffix matching (FailFast App. E).
        on_round: called with each round's record (loggers, progress).
    Returns:
        A ``GenerationResult``; ``output_ids`` ends at the first EOS (included), after
        ``max_new_tokens`` tokens, or when the context is full.
    Raises:
        ValueError: for ``max_new_tokens`` < 1, a drafter without a policy (or the reverse),
            a negative length from the policy, or a prompt that does not fit the context.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if (drafter is None) != (policy is None):
        raise ValueError("drafter and policy go together: pass both (speculative) or neither (vanilla)")
    device = runtime.torch_device
    prompt_ids = prompt_ids.to(device)
    prompt_len = int(prompt_ids.shape[0])
    eos_ids = torch.tensor(sorted(verifier.eos_token_ids), dtype=torch.long, device=device)

    start = time.perf_counter()
    with runtime.timer() as prefill_timer:
        verifier.prefill(prompt_ids)
        if drafter is not None:
            drafter.prefill(prompt_ids)
    if policy is not None:
        policy.reset()
    if reuse is not None:
        reuse.reset()

    # Positions the drafter can hold (drafters without a limit leave max_context at 0).
    drafter_context = (getattr(drafter, "max_context", 0) if drafter is not None else 0) or verifier.max_context
    outputs: list[torch.Tensor] = []
    rounds: list[RoundRecord] = []
    generated = 0
    stop_reason = "max_new_tokens"
    while generated < max_new_tokens:
        # Room for draft tokens: one output slot is kept for the correction/bonus token, and
        # verification feeds positions up to prompt_len + generated + k - 1 < max_context.
        context_room = min(verifier.max_context, drafter_context) - prompt_len - generated
        if context_room < 0:
            stop_reason = "max_context"
            break
        room = min(max_new_tokens - generated - 1, context_room)

        with runtime.timer() as draft_timer:
            draft = _draft(drafter, policy, room, device)
            if reuse is not None and drafter is not None:
                draft = reuse.extend(draft, room)

        with runtime.timer() as verify_timer:
            verification = verifier.verify(draft)

        committed = verification.committed_tokens(draft)  # (a + 1,)
        keep, hit_eos = _cut_at_stop(committed, eos_ids, max_new_tokens - generated)
        outputs.append(committed[:keep])
        generated += keep
        finished = hit_eos or generated >= max_new_tokens

        # Roll the drafter back to the committed sequence (timed as drafting: it may spend a pass).
        commit_ms = 0.0
        if drafter is not None and not finished:
            with runtime.timer() as commit_timer:
                drafter.commit(draft, verification)
            commit_ms = commit_timer.ms

        record = RoundRecord(
            index=len(rounds),
            speculation_length=draft.length,
            accepted_length=verification.accepted_length,
            emitted_tokens=keep,
            drafter_forward_passes=draft.forward_passes,
            reused_tokens=draft.reused_tokens,
            draft_ms=draft_timer.ms + commit_ms,
            verify_ms=verify_timer.ms,
            confidences=tuple(draft.confidences.tolist()),
            draft_token_ids=tuple(draft.token_ids.tolist()),
            target_token_ids=tuple(verification.target_token_ids.tolist()),
        )
        rounds.append(record)
        if on_round is not None:
            on_round(record)
        if finished:
            stop_reason = "eos" if hit_eos else "max_new_tokens"
            break
        if policy is not None:
            policy.update(record)
        if reuse is not None:
            reuse.observe(draft, verification)

    output_ids = torch.cat(outputs) if outputs else torch.empty(0, dtype=torch.long, device=device)
    return GenerationResult(
        output_ids=output_ids.cpu(),
        rounds=tuple(rounds),
        stop_reason=stop_reason,
        wall_s=time.perf_counter() - start,
        prefill_ms=prefill_timer.ms,
    )


def _draft(drafter: Drafter | None, policy: LengthPolicy | None, room: int, device: torch.device) -> Draft:
    """Draft, then extend while the policy asks for more (FailFast Alg. 1 shape), within ``room`` tokens.
    Stops as well when a ``draft`` call adds no token (a drafter with nothing more to propose,
    e.g. the model-free ``suffix`` drafter without a matching suffix)."""
    draft = Draft.empty(device)
    if drafter is None:
        return draft
    while True:
        wanted = policy.next_length(draft)
        if wanted < 0:
            raise ValueError(f"policy {policy.name!r} returned a negative speculation length ({wanted})")
        n = min(wanted, room - draft.length)
        if n <= 0:
            return draft
        before = draft.length
        draft = drafter.draft(n)
        if draft.length <= before:  # the drafter has nothing more to propose this round
            return draft


def _cut_at_stop(committed: torch.Tensor, eos_ids: torch.Tensor, remaining: int) -> tuple[int, bool]:
    """How many of ``committed`` ((m,) int64) to emit: up to and including the first EOS,
    and at most ``remaining``. Returns ``(count, hit_eos)``; one device sync."""
    m = int(committed.shape[0])
    is_eos = torch.isin(committed, eos_ids)
    first_eos = torch.where(is_eos.any(), is_eos.int().argmax(), m)
    first_eos = int(first_eos)  # the sync the algorithm needs: where generation stops
    if first_eos < min(m, remaining):
        return first_eos + 1, True
    return min(m, remaining), False
