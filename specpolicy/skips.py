"""Prompts that cannot be decoded: longer than the context of the target or the drafter.

Such a prompt would abort the run at its turn -- and again at every resume. Instead it is found
before decoding starts (``over_context``), reported with its id and ``file:line``, and recorded
as a result that carries ``skipped`` (the reason) and no output
(``specpolicy.results.PromptResult.skip``), so its ``results.jsonl`` row says why; a resume reads
it back like any finished prompt. ``specpolicy.summary.summarize`` lists such prompts under
``skipped_prompts`` and leaves them out of every figure (so does ``specpolicy.results.read_run``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def context_limit(verifier: Any, drafter: Any = None) -> int:
    """The longest prompt (tokens) both models can prefill: one position less than the smaller
    context (``max_context``; a drafter without a limit has 0)."""
    limits = [c for c in (getattr(verifier, "max_context", 0), getattr(drafter, "max_context", 0)) if c]
    return min(limits) - 1 if limits else 1 << 62


def over_context(prompts: Sequence[Any], token_ids: Mapping[str, Any], verifier: Any,
                 drafter: Any = None) -> dict[str, str]:
    """``prompt id -> reason`` for every prompt whose token count exceeds ``context_limit``;
    prints one line per such prompt (id, ``file:line``, length, limit)."""
    limit = context_limit(verifier, drafter)
    reasons = {}
    for prompt in prompts:
        n = int(token_ids[prompt.prompt_id].shape[0])
        if n > limit:
            reasons[prompt.prompt_id] = (f"prompt of {n} tokens (chat template included) is longer than the "
                                         f"{limit} tokens the context allows (verifier.max_context or the models' "
                                         f"max_position_embeddings, less one position to generate)")
            where = f" ({prompt.source})" if getattr(prompt, "source", "") else ""
            print(f"skipping prompt {prompt.prompt_id}{where}: {n} tokens, over the context limit of {limit}; "
                  f"recorded in results.jsonl as skipped")
    return reasons


def skipped_line(summary: Mapping[str, Any]) -> str | None:
    """One line under the printed summary naming the skipped prompts, or None."""
    skipped = summary.get("skipped_prompts") or {}
    if not skipped:
        return None
    ids = ", ".join(list(skipped)[:5]) + (", ..." if len(skipped) > 5 else "")
    return (f"skipped {len(skipped)} of {summary.get('prompts_total', '?')} prompts longer than the context "
            f"(not decoded, not in the figures above): {ids}")
