"""Drafter forward-pass accounting: what this project counts, and what the official FailFast harness
counts for the same rounds (``profile.pass_accounting=official``).

Both count, per round, the Fast-dLLM drafter's unmasking passes (one per small block at threshold
0.05; until the requested tokens are unmasked at higher thresholds) and one full-block pass each
time the draft crosses a block boundary. They differ in what they charge around that:

=============================  ==========================================  ==========================================
event                          this project (``fastdllm`` drafter)         official harness (``failfast.py`` +
                                                                           ``generate_draft_tokens[_arbitrary_length]``)
=============================  ==========================================  ==========================================
prompt prefill                 outside the rounds (not counted, like the   counted in round 1 when the prompt is
                               target's prefill)                           longer than one block
committed blocks' KV           kept across rounds; a block the round       no drafter KV cache across rounds: every
                               completed but did not write as drafted is   round re-runs the drafter over all
                               written by ``commit`` in ONE pass, charged  complete committed blocks (1 pass) unless
                               to the next round                           the previous round's prefill output covers
                                                                           exactly the same blocks and the previous
                                                                           round crossed no block boundary (its
                                                                           boundary pass replaces the kept output)
draft ends on a block's first  0 passes for that token (it comes from the  1 more unmasking pass: the draft is only
token                          pass that completed the previous block)     checked after an unmasking pass
FailFast extension inside the  0 passes (the look-ahead already holds the  1 pass of the next small block before the
decoded look-ahead (N < S)     tokens)                                     check (not modeled here: exact for N >= S)
drafted EOS                    stops, no pass past it                      stops, no pass past it
=============================  ==========================================  ==========================================

``official_passes`` rebuilds the official count of every round from a run's round records and the
prompt length alone (the project's own count is ``drafter_forward_passes``): the passes ``commit``
carried into a round are recomputed from the previous round (``carried_passes``), removed, and the
official prefill and first-token passes added. Only the Fast-dLLM drafter differs; other drafters
(AR: one pass per drafted token in both) keep their counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specpolicy.core.types import RoundRecord

#: Values of ``profile.pass_accounting``.
PASS_ACCOUNTINGS = ("project", "official")
#: Drafters whose pass accounting differs between the two (``drafter.name``).
BLOCK_DIFFUSION_DRAFTERS = ("fastdllm",)


def _own(record: RoundRecord) -> int:
    """Tokens the drafter itself proposed in the round (draft reuse excluded)."""
    return record.speculation_length - record.reused_tokens


def carried_passes(rounds: Sequence[RoundRecord], prompt_tokens: int, block_size: int = 32) -> list[int]:
    """Per round, the passes the ``fastdllm`` drafter's ``commit`` spent after the previous round(s)
    and charged to this one (0 or 1 per commit; a plain round with no draft carries them on).

    ``commit`` writes the committed complete blocks in one pass when the committed sequence
    completes a block whose KV is not validly cached: the cache holds the complete blocks below
    the round's committed length plus the blocks the draft crossed (written tentatively) that are
    committed exactly as drafted.

    Args:
        rounds: one prompt's rounds, in order.
        prompt_tokens: the prompt's length in tokens.
        block_size: B of the drafter (32).
    Returns:
        ``[int]`` per round.
    """
    B = block_size
    out, pending, L = [], 0, int(prompt_tokens)
    for r in rounds:
        own = _own(r)
        out.append(pending if own > 0 or r.speculation_length > 0 else 0)
        if own > 0 or r.speculation_length > 0:
            pending = 0
        a = r.accepted_length
        L_new = L + a + 1
        base = L // B * B
        matched_end = L + min(a, own)
        valid_end = base
        e = base + B
        while e < L + own and e <= matched_end:  # tentative blocks the draft crossed, committed as drafted
            valid_end = e
            e += B
        if L_new // B * B > valid_end:
            pending += 1
        L = L_new
    return out


def official_passes(rounds: Sequence[RoundRecord], prompt_tokens: int, block_size: int = 32) -> list[int]:
    """Per round, the drafter passes the official FailFast harness counts for the same rounds (see
    the module docstring); 0 for a round without a draft.

    Args:
        rounds: one prompt's rounds of a ``fastdllm`` run, in order; ``drafter_forward_passes`` is
            this project's count.
        prompt_tokens: the prompt's length in tokens.
        block_size: B of the drafter (32).
    Returns:
        ``[int]`` per round.
    Raises:
        ValueError: when a round's passes are fewer than the passes carried into it (records that
            are not a ``fastdllm`` run's).
    """
    B = block_size
    carried = carried_passes(rounds, prompt_tokens, B)
    out: list[int] = []
    kept = None  # logits length of the prefill output the harness keeps from the previous round
    L = int(prompt_tokens)
    for r, carry in zip(rounds, carried):
        own = _own(r)
        passes = r.drafter_forward_passes
        if passes < carry:
            raise ValueError(f"round with {passes} drafter passes but {carry} carried into it: not a fastdllm run")
        if own > 0:
            complete = L // B * B
            prefill = 0
            if L > B:
                prefill = 0 if kept == complete else 1
                kept = complete
            else:
                kept = None
            first_token = 1 if (L + own - 1) % B == 0 else 0  # the draft ends on a block's first token
            crossed = (L + own - 1) // B > L // B  # a boundary pass: the kept output is now that block's
            if crossed:
                kept = B
            out.append(passes - carry + prefill + first_token)
        else:
            out.append(0)
        L += r.accepted_length + 1
    return out


def with_pass_accounting(
    prompts: Sequence[tuple[Sequence[RoundRecord], int]], accounting: str, drafter: str, block_size: int | None = None
) -> list[RoundRecord]:
    """Every round of ``prompts`` (``(rounds, prompt_tokens)`` per prompt), its
    ``drafter_forward_passes`` counted under ``accounting`` (``project``: unchanged;
    ``official``: ``official_passes`` for block-diffusion drafters, unchanged for others).

    Raises:
        ValueError: naming ``profile.pass_accounting`` for an unknown accounting.
    """
    if accounting not in PASS_ACCOUNTINGS:
        raise ValueError(f"profile.pass_accounting must be one of {', '.join(PASS_ACCOUNTINGS)}, got {accounting!r}")
    out: list[RoundRecord] = []
    for rounds, prompt_tokens in prompts:
        if accounting == "official" and drafter in BLOCK_DIFFUSION_DRAFTERS:
            passes = official_passes(rounds, prompt_tokens, block_size or 32)
            out.extend(replace(r, drafter_forward_passes=p) for r, p in zip(rounds, passes))
        else:
            out.extend(rounds)
    return out
