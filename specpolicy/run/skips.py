"""What does not fit the context of the target or the drafter: prompts that cannot be decoded,
and a ``generation.max_new_tokens`` the context cannot hold (``max_new_tokens_line``: one warning
line after the models load, when the context is known; generation then ends at the context,
``finish_reason`` ``max_context``, and nothing is lost).

Such a prompt would abort the run at its turn -- and again at every resume. Instead it is found
before decoding starts (``over_context``), reported with its id and ``file:line``, and recorded
as a result that carries ``skipped`` (the reason) and no output
(``specpolicy.analysis.results.PromptResult.skip``), so its ``results.jsonl`` row says why; a resume reads
it back like any finished prompt. ``specpolicy.analysis.summary.summarize`` lists such prompts under
``skipped_prompts`` and leaves them out of every figure (so does ``specpolicy.analysis.results.read_run``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def context_limit(verifier: Any, drafter: Any = None) -> int:
    """The longest prompt (tokens) both models can prefill: one position less than the smaller
    context (``max_context``; a drafter without a limit has 0)."""
    limits = [c for c in (getattr(verifier, "max_context", 0), getattr(drafter, "max_context", 0)) if c]
    return min(limits) - 1 if limits else 1 << 62


def over_context(
    prompts: Sequence[Any], token_ids: Mapping[str, Any], verifier: Any, drafter: Any = None
) -> dict[str, str]:
    """``prompt id -> reason`` for every prompt whose token count exceeds ``context_limit``;
    prints one line per such prompt (id, ``file:line``, length, limit)."""
    limit = context_limit(verifier, drafter)
    reasons = {}
    for prompt in prompts:
        n = int(token_ids[prompt.prompt_id].shape[0])
        if n > limit:
            reasons[prompt.prompt_id] = (
                f"prompt of {n} tokens (chat template included) is longer than the "
                f"{limit} tokens the context allows (verifier.max_context or the models' "
                f"max_position_embeddings, less one position to generate)"
            )
            where = f" ({prompt.source})" if getattr(prompt, "source", "") else ""
            print(
                f"skipping prompt {prompt.prompt_id}{where}: {n} tokens, over the context limit of {limit}; "
                f"recorded in results.jsonl as skipped"
            )
    return reasons


def _span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def max_new_tokens_line(max_new_tokens: int, lengths: Sequence[int], verifier: Any, drafter: Any = None) -> str | None:
    """One warning line (without ``warning:``) when ``generation.max_new_tokens`` is more than the
    context leaves some prompt, naming the key, the value, the context and how many new tokens
    those prompts get at most; None when every prompt can reach it.

    Args:
        max_new_tokens: ``generation.max_new_tokens``.
        lengths: the token counts of the prompts that will be decoded (chat template included;
            prompts over the context are skipped anyway and left out).
        verifier / drafter: their ``max_context`` (tokens; a drafter without a limit has 0).
    """
    limit = context_limit(verifier, drafter)
    if not lengths or limit >= 1 << 62:
        return None
    context = limit + 1  # positions the smaller context holds
    most = [context - n + 1 for n in lengths]  # the last new token is emitted, never fed back
    short = [(n, m) for n, m in zip(lengths, most) if m < max_new_tokens]
    if not short:
        return None
    which = (
        ("the prompt" if len(lengths) == 1 else "every prompt")
        if len(short) == len(lengths)
        else f"{len(short)} of {len(lengths)} prompts"
    )
    return (
        f"generation.max_new_tokens={max_new_tokens} is more than the context holds: it is {context} tokens "
        f"(verifier.max_context, or the models' max_position_embeddings), so {which} "
        f"({_span([n for n, _ in short])} tokens with the chat template) "
        f"end{'s' if which in ('the prompt', 'every prompt') else ''} at the context after at most "
        f"{_span([m for _, m in short])} new tokens (finish_reason max_context)"
    )


def skipped_line(summary: Mapping[str, Any]) -> str | None:
    """One line under the printed summary naming the skipped prompts, or None."""
    skipped = summary.get("skipped_prompts") or {}
    if not skipped:
        return None
    ids = ", ".join(list(skipped)[:5]) + (", ..." if len(skipped) > 5 else "")
    return (
        f"skipped {len(skipped)} of {summary.get('prompts_total', '?')} prompts longer than the context "
        f"(not decoded, not in the figures above): {ids}"
    )
