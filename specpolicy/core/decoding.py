"""Speculative decoding of one prompt: ``generate``, the round loop (``specpolicy.core.loop``) at R = 1.

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
emits exactly one token, so speedups compare like with like. ``generate_batch``
(``specpolicy.core.batching``) is the same loop with many requests in flight.

Sampling (``sampling`` with temperature > 0): the same loop; drafters sample their tokens and
the verifier runs speculative sampling (``specpolicy.core.sampling``), so the output is distributed
as sampling from the target (lossless in distribution, not token for token); vanilla sampling
is the same loop without drafter. Draws come from ``runtime.generator``: seed it (e.g.
``runtime.seed_everything``) before a call to reproduce the call's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from specpolicy.core.drafter import Drafter
from specpolicy.core.loop import (  # noqa: F401  (the loop's pieces, importable from here as before)
    RUNAWAY,
    Decoding,
    OneRequestTarget,
    after_drafting,
    ask_policy,
    draft_round,
    emitted_of_round,
    limit_reached,
    prefill as _prefill,
    round_record,
    run_loop,
)
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.protocols import feature_layers
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import GenerationResult, RoundRecord
from specpolicy.core.verifier import Verifier


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
    how = Decoding(
        max_new_tokens, drafter, policy, reuse, stop, sampling, None if on_round is None else _each(on_round)
    )
    how.check()
    layers = feature_layers(drafter)  # the target hidden states the drafter reads (none: vanilla computes none)
    # Inference mode: no autograd bookkeeping on any op of the loop (cheaper dispatch for the many
    # small tensor ops of drafting and verification); the output is cloned out of it, so callers
    # get an ordinary tensor.
    with torch.inference_mode():
        target = OneRequestTarget(verifier, sampling, layers)
        out = run_loop([prompt_ids], target, runtime, how, slots=1, arrivals=[0.0], own_state=False, plan_batches=False)
    if 0 in out.errors:
        raise out.errors[0]
    result = out.results[0]
    return dataclasses.replace(result, output_ids=result.output_ids.cpu().clone())


def _each(on_round: Callable[[RoundRecord], None]) -> Callable[[int, RoundRecord], None]:
    """``on_round(record)`` as the loop's ``on_round(request index, record)``."""
    return lambda _index, record: on_round(record)
