"""Per-prompt and aggregate metrics of speculative decoding runs.

Definitions (the project's metric glossary):
* speculation length k: tokens proposed in a round (drafter + reused); accepted length a:
  draft tokens the target accepted, the correction/bonus token excluded;
* acceptance rate = sum(a) / sum(k) over rounds with k > 0 (drafted tokens only, bonus excluded);
* mean accepted length = mean a per round (``..._with_bonus`` adds the correction/bonus token,
  i.e. tokens emitted per round);
* tokens/s = generated tokens / wall-clock seconds, summed over prompts (token-weighted);
* speedup vs vanilla = tokens/s over vanilla decoding's tokens/s on the same prompts, same run.
"""

from __future__ import annotations

from collections.abc import Sequence

from specpolicy.types import GenerationResult, RoundRecord


def first_difference(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first position where the two token sequences differ (a length mismatch
    counts at the shorter length), or None when identical."""
    for i, (x, y) in enumerate(zip(reference, candidate)):
        if x != y:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def round_to_dict(record: RoundRecord) -> dict:
    """A ``results.jsonl`` per-round record (ms rounded to µs)."""
    return {
        "speculation_length": record.speculation_length,
        "accepted_length": record.accepted_length,
        "emitted_tokens": record.emitted_tokens,
        "drafter_forward_passes": record.drafter_forward_passes,
        "reused_tokens": record.reused_tokens,
        "draft_ms": round(record.draft_ms, 3),
        "verify_ms": round(record.verify_ms, 3),
        "confidences": [round(c, 4) for c in record.confidences],
        "draft_token_ids": list(record.draft_token_ids),
        "target_token_ids": list(record.target_token_ids),
    }


def aggregate(results: Sequence[GenerationResult]) -> dict:
    """Aggregate metrics over prompts (token- and round-weighted, see module docstring)."""
    rounds = [r for res in results for r in res.rounds]
    drafted = [r for r in rounds if r.speculation_length > 0]
    tokens = sum(int(res.output_ids.shape[0]) for res in results)
    wall = sum(res.wall_s for res in results)
    n_rounds = len(rounds)
    passes = sum(r.drafter_forward_passes for r in rounds)
    speculated = sum(r.speculation_length for r in drafted)
    accepted = sum(r.accepted_length for r in drafted)
    return {
        "prompts": len(results),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "rounds": n_rounds,
        "acceptance_rate": accepted / speculated if speculated else 0.0,
        "mean_accepted_length": accepted / len(drafted) if drafted else 0.0,
        "mean_accepted_length_with_bonus": sum(r.emitted_tokens for r in rounds) / n_rounds if n_rounds else 0.0,
        "mean_speculation_length": speculated / n_rounds if n_rounds else 0.0,
        "max_accepted_length": max((r.accepted_length for r in rounds), default=0),
        "max_speculation_length": max((r.speculation_length for r in rounds), default=0),
        "drafter_forward_passes": passes,
        "drafter_passes_per_round": passes / n_rounds if n_rounds else 0.0,
        "reused_tokens": sum(r.reused_tokens for r in rounds),
        "draft_ms": sum(r.draft_ms for r in rounds),
        "verify_ms": sum(r.verify_ms for r in rounds),
    }
