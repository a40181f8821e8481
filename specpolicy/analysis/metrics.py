"""Per-prompt and aggregate metrics of speculative decoding runs -- the project's metric glossary.

Everything here is computed from ``GenerationResult`` objects and their ``RoundRecord`` rounds
(rows of ``results.jsonl`` become such objects in ``specpolicy.analysis.results``, once), so a summary
rebuilt from the rows on disk equals the one computed during the run (resumed runs).
``specpolicy.analysis.summary.summarize`` assembles ``summary.json`` from these functions; ``FIELDS``
describes every field of ``summary.json`` (written into it as ``fields``); the README's
"Metric glossary" is the same text.

Definitions:
* speculation length k: tokens proposed in a round (drafter + reused); accepted length a:
  draft tokens the target accepted, the correction/bonus token excluded. A draft tree: k counts
  its nodes (all verified in one pass), a its accepted path, its depth its deepest node.
* observed positions: in the round that ends generation, draft positions past the stop (EOS,
  stop string, max_new_tokens) are unobserved -- neither accepted nor rejected -- so that round
  counts ``min(k, emitted)`` drafted and ``min(a, emitted)`` accepted tokens. Every other round
  counts k and a.
* acceptance rate = sum(a) / sum(k) over rounds with k > 0 (drafted tokens only, bonus excluded);
* mean accepted length = mean a over rounds with k > 0 (``..._with_bonus``: mean emitted tokens
  over the same rounds, i.e. a + 1 with the correction/bonus token, less where a stop cut the round);
* tokens per round = generated tokens / rounds (every round, plain-decoding rounds included);
* per-position acceptance: position i (1-based) is counted only in rounds whose (observed) draft
  reached i; positions beyond a draft are unobserved, not rejected;
* tokens/s = generated tokens / wall-clock seconds, summed over prompts (token-weighted);
* speedup vs vanilla = tokens/s over vanilla decoding's tokens/s on the same prompts, same run.
Aggregates are token-weighted (sums over all prompts' rounds, then one ratio) unless labelled
prompt-weighted (the mean over prompts of each prompt's value).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from specpolicy.core.types import DRAFT_STOP_REASONS, FINISH_REASONS, GenerationResult, RoundRecord


def observed(record: RoundRecord) -> tuple[int, int]:
    """``(drafted, accepted)`` draft positions of a round that count in acceptance metrics: k and
    a, except in the round that ended generation, where positions past the stop are unobserved
    (``min(k, emitted)``, ``min(a, emitted)``). The one definition of acceptance used everywhere."""
    k, a = record.speculation_length, record.accepted_length
    if record.finish_reason:
        e = record.emitted_tokens
        return min(k, e), min(a, e)
    return k, a


def acceptance_by_position(rounds: Sequence[RoundRecord]) -> dict[str, list]:
    """Per draft position i = 1..K (K = the longest observed draft):

    * ``drafted[i-1]``: rounds whose draft reached position i (k >= i);
    * ``accepted[i-1]``: of those, rounds that accepted position i (a >= i);
    * ``rate[i-1]`` = accepted / drafted: acceptance at position i given the draft reached it;
    * ``reached[i-1]``: rounds whose draft reached i with positions 1..i-1 all accepted (a >= i-1);
    * ``conditional_rate[i-1]`` = accepted / reached: P(position i accepted | 1..i-1 accepted).

    Positions beyond a round's draft are unobserved, not rejected (see ``observed``). A draft tree
    counts its depths: position i is drafted when the tree reaches depth i, accepted when the
    accepted path does.
    """
    pairs = [(min(k, r.tree_depth), a) for r, (k, a) in ((r, observed(r)) for r in rounds)]  # a tree: its depth
    depth = max((k for k, _ in pairs), default=0)
    drafted, accepted, reached = [0] * depth, [0] * depth, [0] * depth
    for k, a in pairs:
        for i in range(k):  # position i + 1
            drafted[i] += 1
            if a >= i + 1:
                accepted[i] += 1
            if a >= i:
                reached[i] += 1
    return {
        "position": list(range(1, depth + 1)),
        "drafted": drafted,
        "accepted": accepted,
        "rate": [x / n if n else 0.0 for x, n in zip(accepted, drafted)],
        "reached": reached,
        "conditional_rate": [x / n if n else 0.0 for x, n in zip(accepted, reached)],
    }


def aggregate(results: Sequence[GenerationResult]) -> dict[str, Any]:
    """Token-weighted aggregate metrics over prompts (see the module docstring): one entry of
    ``summary.json``'s ``methods``."""
    rounds = [r for res in results for r in res.rounds]
    drafted = [r for r in rounds if r.speculation_length > 0]
    seen = [observed(r) for r in drafted]
    tokens = sum(res.generated_tokens for res in results)
    wall = sum(res.wall_s for res in results)
    n_rounds = len(rounds)
    passes = sum(r.drafter_forward_passes for r in rounds)
    speculated = sum(r.speculation_length for r in drafted)
    spec_observed = sum(k for k, _ in seen)
    accepted = sum(a for _, a in seen)
    stops = Counter(r.draft_stop_reason or "unknown" for r in rounds)
    host = [r.host_ms for r in rounds if r.host_ms is not None]  # rounds whose host time was measured
    finishes = Counter(r.finish_reason for r in rounds if r.finish_reason)
    return {
        "prompts": len(results),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "rounds": n_rounds,
        "drafted_rounds": len(drafted),
        "acceptance_rate": accepted / spec_observed if spec_observed else 0.0,
        "mean_accepted_length": accepted / len(drafted) if drafted else 0.0,
        "mean_accepted_length_with_bonus": (sum(r.emitted_tokens for r in drafted) / len(drafted) if drafted else 0.0),
        "tokens_per_round": tokens / n_rounds if n_rounds else 0.0,
        "mean_speculation_length": speculated / n_rounds if n_rounds else 0.0,
        "mean_speculation_length_drafted": speculated / len(drafted) if drafted else 0.0,
        "max_accepted_length": max((r.accepted_length for r in rounds), default=0),
        "max_speculation_length": max((r.speculation_length for r in rounds), default=0),
        "tree_rounds": sum(r.is_tree for r in rounds),
        "mean_draft_depth": sum(r.tree_depth for r in drafted) / len(drafted) if drafted else 0.0,
        "drafter_forward_passes": passes,
        "drafter_passes_per_round": passes / n_rounds if n_rounds else 0.0,
        "reused_tokens": sum(r.reused_tokens for r in rounds),
        "draft_ms": sum(r.draft_ms for r in rounds),
        "verify_ms": sum(r.verify_ms for r in rounds),
        "host_ms": sum(host) if host else None,
        "host_ms_per_round": sum(host) / len(host) if host else None,
        "draft_stop_reasons": {k: stops[k] for k in (*DRAFT_STOP_REASONS, "unknown") if stops.get(k)},
        "finish_reasons": {k: finishes[k] for k in FINISH_REASONS if finishes.get(k)},
        "acceptance_by_position": acceptance_by_position(rounds),
    }


def prompt_values(result: GenerationResult, vanilla: GenerationResult | None = None) -> dict[str, Any]:
    """One prompt's values (the ``per_prompt`` entries of ``summary.json``): its aggregate
    figures, and with ``vanilla`` (the same prompt's vanilla result) ``vanilla_tokens_per_s``
    and ``speedup_vs_vanilla``."""
    agg = aggregate([result])
    out = {
        k: agg[k]
        for k in (
            "generated_tokens",
            "wall_s",
            "tokens_per_s",
            "rounds",
            "acceptance_rate",
            "mean_accepted_length",
            "mean_accepted_length_with_bonus",
            "tokens_per_round",
            "mean_speculation_length",
            "drafter_passes_per_round",
        )
    }
    if vanilla is not None:
        van = aggregate([vanilla])
        out["vanilla_tokens_per_s"] = van["tokens_per_s"]
        out["speedup_vs_vanilla"] = agg["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] else 0.0
    return out


#: Per-prompt values averaged with equal weight per prompt in ``aggregates.prompt_weighted``.
PROMPT_WEIGHTED_KEYS = (
    "acceptance_rate",
    "mean_accepted_length",
    "mean_accepted_length_with_bonus",
    "tokens_per_round",
    "mean_speculation_length",
    "tokens_per_s",
    "speedup_vs_vanilla",
)


def weighted_aggregates(
    spec: Mapping[str, Any], per_prompt: Mapping[str, Mapping[str, Any]], speedup: float | None
) -> dict[str, dict[str, Any]]:
    """``{"token_weighted": ..., "prompt_weighted": ...}``: the headline figures pooled over all
    rounds/tokens of all prompts (one ratio of sums), and the mean over prompts of each prompt's
    value (``acceptance_rate`` and the accepted lengths over prompts that drafted at all)."""
    token = {k: spec[k] for k in PROMPT_WEIGHTED_KEYS if k in spec}
    if speedup is not None:
        token["speedup_vs_vanilla"] = speedup
    prompt: dict[str, Any] = {}
    values = list(per_prompt.values())
    for key in PROMPT_WEIGHTED_KEYS:
        xs = [
            v[key]
            for v in values
            if key in v
            and not (
                key in ("acceptance_rate", "mean_accepted_length", "mean_accepted_length_with_bonus")
                and v.get("mean_speculation_length", 0.0) == 0.0
            )
        ]
        if key in token or xs:
            prompt[key] = sum(xs) / len(xs) if xs else 0.0
    return {"token_weighted": token, "prompt_weighted": prompt}


#: Descriptions of the fields of ``summary.json`` (written into it as ``fields``). Dotted keys
#: name nested fields; ``*`` stands for any method name or prompt id.
FIELDS: dict[str, str] = {
    "method": "the speculative method: <drafter>+<policy>[-<mode>][+reuse]",
    "prompts": "prompts in this summary (finished prompts only when partial)",
    "prompts_total": "prompts in the configured prompt set",
    "partial": "true when the run was interrupted: the summary covers the finished prompts only",
    "interrupted_by": "the signal that interrupted the run (SIGINT / SIGTERM), when partial",
    "resumed_prompts": "prompts read back from results.jsonl (finished before a resume), not recomputed",
    "generated_tokens": "tokens generated by the speculative method, all prompts",
    "acceptance_rate": "accepted draft tokens / drafted tokens over rounds with k > 0, bonus excluded "
    "(token-weighted; positions past the stop of the last round are unobserved)",
    "mean_accepted_length": "accepted draft tokens per drafted round, WITHOUT the correction/bonus token",
    "mean_accepted_length_with_bonus": "tokens emitted per drafted round, WITH the correction/bonus token "
    "(= accepted + 1 except where a stop cut the round)",
    "tokens_per_round": "generated tokens / rounds, every round (plain-decoding rounds included)",
    "mean_speculation_length": "drafted tokens per round (k), every round",
    "rounds": "verification rounds (one target forward pass each), all prompts",
    "drafter_forward_passes": "drafter forward passes, all prompts (extensions and block passes included)",
    "tokens_per_s": "generated tokens / wall-clock seconds of the speculative method, summed over prompts "
    "(token-weighted; a timing)",
    "vanilla_tokens_per_s": "the same for vanilla decoding of the same prompts in the same run (a timing)",
    "speedup_vs_vanilla": "tokens_per_s / vanilla_tokens_per_s (measured, token-weighted)",
    "lossless_fraction": "fraction of prompts whose output equals vanilla greedy decoding's token for token",
    "lossless": '"n/a (sampling)" when sampling: token identity with vanilla is not expected',
    "not_lossless": "prompt id -> first differing output position, for prompts that are NOT lossless (a parting "
    "that is no near-tie within the dtype's rounding, or that could not be measured)",
    "lossless_counts": "greedy prompts by class: identical (token for token), numerically_equivalent (every "
    "parting from vanilla at a near-tie: both emitted tokens within the dtype's rounding tolerance of the top "
    "logit; float32: an exact tie), not_lossless (specpolicy.analysis.parting)",
    "partings": "prompt id -> the first differing position, re-measured after decoding: its class, the two "
    "emitted tokens, and per re-run pass (the method's verification pass, a one-token step) the top-2 logit "
    "margin, each emitted token's logit gap to the top token and the tolerance",
    "peak_memory": "the process's peak memory over the run: cpu_rss_bytes (getrusage ru_maxrss) and, on "
    "CUDA, cuda_max_allocated_bytes (torch.cuda.max_memory_allocated)",
    "draft_stop_reasons": "rounds by why drafting stopped: low_confidence (a confidence rule), n_max "
    "(FailFast's N_max), policy_bound (static k / max_length / window), length_0 (the "
    "policy chose plain decoding for the round), room (max_new_tokens or context room), "
    "no_proposal (the drafter had nothing), stop_token (the draft ends at a drafted EOS), "
    "vanilla (no drafter)",
    "finish_reasons": "prompts by why generation ended: eos, stop_string, max_new_tokens, max_context",
    "acceptance_by_position": "per draft position i (1-based): drafted (rounds whose draft reached i), accepted "
    "(of those, accepted at i), rate = accepted/drafted, reached (drafted to i with "
    "1..i-1 accepted), conditional_rate = accepted/reached; positions beyond a draft "
    "are unobserved, not rejected",
    "aggregates": "the headline figures twice, labelled: token_weighted (ratios of sums over all rounds / "
    "tokens of all prompts) and prompt_weighted (mean over prompts of each prompt's value; "
    "acceptance and accepted lengths over prompts that drafted)",
    "aggregates.token_weighted": "ratios of sums over every prompt's rounds and tokens (the headline values)",
    "aggregates.prompt_weighted": "mean over prompts of the per_prompt values (each prompt counts once)",
    "per_prompt": "prompt id -> that prompt's values (generated_tokens, wall_s, tokens_per_s, rounds, "
    "acceptance_rate, mean_accepted_length[_with_bonus], tokens_per_round, "
    "mean_speculation_length, drafter_passes_per_round, vanilla_tokens_per_s, "
    "speedup_vs_vanilla, finish_reason (why generation ended), lossless)",
    "methods": "method name -> its token-weighted aggregate (the speculative method and vanilla)",
    "methods.*.wall_s": "wall-clock seconds, summed over prompts (a timing)",
    "methods.*.drafted_rounds": "rounds with k > 0",
    "methods.*.mean_speculation_length_drafted": "drafted tokens per round with k > 0 (the denominator of "
    "mean_accepted_length)",
    "methods.*.max_accepted_length": "longest accepted length of any round",
    "methods.*.tree_rounds": "rounds that verified a draft tree (their speculation length counts the tree's "
    "nodes, their accepted length the accepted path)",
    "methods.*.mean_draft_depth": "depth of the draft per round with k > 0: a tree's deepest node, a chain's length",
    "methods.*.max_speculation_length": "longest draft of any round",
    "methods.*.drafter_passes_per_round": "drafter forward passes / rounds",
    "methods.*.reused_tokens": "draft tokens appended by draft reuse",
    "methods.*.draft_ms": "milliseconds spent drafting (drafter roll-back included), summed (a timing)",
    "methods.*.verify_ms": "milliseconds spent verifying, summed (a timing)",
    "methods.*.host_ms": "host milliseconds, summed over rounds: each round's time outside the drafter's and the "
    "target's model passes (policy, tree and path searches, n-gram lookups, tree masks, commit, bookkeeping; "
    "the verifier's argmax and acceptance comparison count as its pass; RoundRecord.host_ms, "
    "specpolicy.core.passes); null when no round measured it (a timing)",
    "methods.*.host_ms_per_round": "host_ms / the rounds that measured it (a timing)",
    "methods.*.host_step_share": "host_ms_per_round / the latency profile's target step (target_ms_per_token of "
    "host_step_profile): how much a round's host work would add to a real target step (a timing)",
    "host_ms_per_round": "the speculative method's methods.*.host_ms_per_round (a timing)",
    "host_step_share": "the speculative method's methods.*.host_step_share (a timing)",
    "host_step_profile": "the latency profile whose target step host_step_share divides by",
    "modeled_speedup_vs_vanilla": "MODELED (not measured) speedup with the configured latency profile",
    "modeled_profile": "name of the latency profile of the modeled speedup",
    "modeled": "MODELED latency block: label, resolved profile, modeled ms, speedup_by_profile; a profile whose "
    "latencies the run cannot measure (e.g. `measured` without vanilla steps) has speedup null and "
    "its reason under `unavailable` (n/a, never 0)",
    "oracle": "the oracle length policy: this policy's modeled speedup as a fraction of the oracle's "
    "(timing-derived cost model); estimated from the run's own rounds (censored), so an upper bound, "
    "and a fraction_of_oracle above 1 is no fraction of an optimum (specpolicy.analysis.oracle.describe_fraction); "
    "null figures with `unavailable` (the reason) when the run's timings give no cost model",
    "skipped_prompts": "prompt id -> why it was not decoded (a prompt longer than the context); such prompts are "
    "in results.jsonl with `skipped` and in no other figure",
    "timing_conditions": "what the machine was doing while this invocation measured (specpolicy.analysis.machine): load "
    "average, CPU time, spread of vanilla speed; timing_trusted false = do not trust the "
    "measured speedup (re-time with run.resume=false on an idle machine)",
    "timing_conditions.cpu_count": "CPUs this process may use",
    "timing_conditions.load_average_start": "os.getloadavg() (1, 5, 15 min) before the first timed prompt",
    "timing_conditions.load_average_end": "os.getloadavg() (1, 5, 15 min) after the last prompt",
    "timing_conditions.process_cpu_s": "CPU seconds of this process (all threads) over the timed prompts",
    "timing_conditions.wall_s": "wall-clock seconds over the same span",
    "timing_conditions.cpu_per_wall": "process_cpu_s / wall_s: CPUs this process kept busy on average",
    "timing_conditions.vanilla_tokens_per_s_cv": "std / mean over prompts of vanilla decoding's tokens per "
    "second of target passes (prefill excluded); null under 3 prompts",
    "timing_conditions.timing_trusted": "false when other processes' load (1-min load average less this "
    "process's cpu_per_wall) exceeded the CPUs this process left free by "
    "more than 0.5 at the start or end, or vanilla_tokens_per_s_cv > 0.25",
    "timing_conditions.timing_warnings": "why timing_trusted is false, one phrase per reason",
    "sampling": "the sampling settings (temperature, top_k, top_p; temperature 0 = greedy)",
    "runtime": "device, dtype, seed, and the versions of torch and transformers",
    "config": "the resolved run configuration",
    "fields": "this glossary: field -> description",
}


def describe_fields(summary: Mapping[str, Any]) -> dict[str, str]:
    """``FIELDS`` restricted to the keys present in ``summary`` (top level, and the dotted
    entries under present keys); a key without a description is listed as ``"(undocumented)"``."""
    out: dict[str, str] = {}
    for key in summary:
        out[key] = FIELDS.get(key, "(undocumented)")
        out.update({k: v for k, v in FIELDS.items() if k.startswith(f"{key}.")})
    out["fields"] = FIELDS["fields"]
    return out
