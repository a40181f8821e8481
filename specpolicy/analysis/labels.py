"""The one list of metric labels: what every figure a run, a sweep report, a serving table, the
peer benchmark or a docs page prints is called (long and short) and how it is formatted, by its key
in ``summary.json`` (``headline`` / ``methods.*`` / ``per_prompt.*`` / ``serving.*``).

``specpolicy.analysis.tables`` (the run's table), ``specpolicy.analysis.report`` (the sweep and
serving reports), ``specpolicy.run.batch_experiment`` (the batched run's serving table),
``specpolicy.analysis.docs`` (the results pages and the metric glossary) and
``benchmarks/peers.py`` all take their titles from ``FIGURES``, so a metric has one name and one
format wherever it is printed. Definitions: docs/reference/metrics.md, ``specpolicy.analysis.metrics``.
"""

from __future__ import annotations

from typing import NamedTuple


class Figure(NamedTuple):
    """How a summary figure is shown: ``label`` (names its denominator; the run summary's rows),
    ``short`` (column titles of the narrower tables), ``fmt`` and whether it applies only to a
    method that drafted (``-`` otherwise)."""

    label: str
    short: str
    fmt: str
    drafting: bool = False
    definition: str = ""  # where ``specpolicy.analysis.metrics.FIELDS`` has none (the serving figures)


_TTFT = "serving: time to first token, a request's arrival to its first emitted token, ms over requests"
_TPOT = "serving: time per output token after the first, ms over requests"

#: Every figure printed anywhere, by its key in ``summary.json`` (``headline`` / ``methods.*`` /
#: ``per_prompt.*``; the serving figures: ``serving.speculative.*`` / ``serving.vanilla.*``, from
#: ``specpolicy.core.serving.summarize``, listed in ``SERVING_KEYS``).
FIGURES: dict[str, Figure] = {
    "speedup_vs_vanilla": Figure("speedup vs vanilla (measured, same run)", "speedup vs vanilla (measured)", "{:.2f}x"),
    "modeled_speedup_vs_vanilla": Figure("speedup vs vanilla, MODELED (not measured)", "MODELED speedup", "{:.2f}x"),
    "tokens_per_s": Figure("tokens/s (generated tokens / wall-clock s)", "tokens/s", "{:.1f}"),
    "vanilla_tokens_per_s": Figure("vanilla tokens/s (same prompts, same run)", "vanilla tokens/s", "{:.1f}"),
    "generated_tokens": Figure("generated tokens", "tokens", "{}"),
    "acceptance_rate": Figure(
        "acceptance rate (accepted / drafted tokens)", "acceptance rate (accepted / drafted tokens)", "{:.3f}", True
    ),
    "mean_accepted_length": Figure(
        "accepted length per drafted round (mean, bonus excluded)", "accepted length / drafted round", "{:.2f}", True
    ),
    "mean_speculation_length": Figure(
        "speculation length per round (mean over all rounds)", "speculation length / round (all rounds)", "{:.2f}", True
    ),
    "mean_speculation_length_drafted": Figure(
        "speculation length per drafted round (mean)", "speculation length / drafted round", "{:.2f}", True
    ),
    "tokens_per_round": Figure("tokens per round (all rounds, bonus included)", "tokens / round", "{:.2f}"),
    "max_accepted_length": Figure("longest accepted length in a round", "max accepted length", "{}", True),
    "max_speculation_length": Figure("longest speculation length in a round", "max speculation length", "{}", True),
    "rounds": Figure("rounds (one verification each)", "rounds", "{:.0f}"),
    "drafted_rounds": Figure("drafted rounds (k > 0)", "drafted rounds (k > 0)", "{}", True),
    "drafter_passes_per_round": Figure(
        "drafter passes per round (all rounds)", "drafter passes / round", "{:.2f}", True
    ),
    "tree_rounds": Figure("rounds with a draft tree", "tree rounds", "{}", True),
    "mean_draft_depth": Figure(
        "draft depth per drafted round (mean; a tree: its deepest node)", "draft depth / drafted round", "{:.2f}", True
    ),
    "lossless": Figure("lossless (prompts equal to vanilla)", "lossless", "{}"),
    "host_ms_per_round": Figure(
        "host ms per round (outside the model passes: policy, searches, bookkeeping)",
        "host ms / round",
        "{:.3f}",
        definition="a round's time outside the model passes -- the drafter's, the target's and an acceptance "
        "head's (specpolicy.core.passes; a timing): policy decisions, tree and path searches, n-gram lookups, "
        "tree masks, cache and loop bookkeeping. The tensor work on a pass's logits (the verifier's argmax, "
        "the acceptance comparison, speculative sampling's draws; a drafter's choice of its tokens) counts "
        "as that pass on CPU as on CUDA, where it is queued behind the forward",
    ),
    "host_step_share": Figure("host ms per round / the profile's target step", "host / target step", "{:.1%}"),
    # serving (batched decoding): per request, over all requests of a batched run
    "throughput_tokens_per_s": Figure(
        "throughput (tokens/s, all requests)",
        "tokens/s (all requests)",
        "{:.1f}",
        definition="serving: tokens of every request / the batched run's wall-clock seconds (a timing)",
    ),
    "ttft_p50_ms": Figure("TTFT p50 (ms)", "TTFT p50 (ms)", "{:.1f}", definition=_TTFT + " (median)"),
    "ttft_p99_ms": Figure("TTFT p99 (ms)", "TTFT p99 (ms)", "{:.1f}", definition=_TTFT + " (99th percentile)"),
    "tpot_mean_ms": Figure("TPOT mean (ms)", "TPOT mean (ms)", "{:.2f}", definition=_TPOT + " (mean)"),
    "tpot_p50_ms": Figure("TPOT p50 (ms)", "TPOT p50 (ms)", "{:.2f}", definition=_TPOT + " (median)"),
    "tpot_p99_ms": Figure("TPOT p99 (ms)", "TPOT p99 (ms)", "{:.2f}", definition=_TPOT + " (99th percentile)"),
    "latency_p99_ms": Figure(
        "latency p99 (ms)",
        "latency p99 (ms)",
        "{:.0f}",
        definition="serving: a request's arrival to its last token, ms over requests (99th percentile; a timing)",
    ),
    "mean_batch_size": Figure(
        "mean requests in flight",
        "requests in flight",
        "{:.2f}",
        definition="serving: requests in the batch per batched round (mean over rounds)",
    ),
    "wall_s": Figure(
        "wall (s)",
        "wall (s)",
        "{:.2f}",
        definition="serving: the batched run's wall-clock seconds, first arrival to last finish (a timing)",
    ),
}

#: The serving figures (batched decoding, ``generation.batch_size``), in the order the batched run's
#: table prints them; the sweep report's serving table shows ``SERVING_REPORT_KEYS`` of them.
SERVING_KEYS = (
    "throughput_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "latency_p99_ms",
    "rounds",
    "mean_batch_size",
    "wall_s",
)
SERVING_REPORT_KEYS = ("throughput_tokens_per_s", "ttft_p99_ms", "tpot_p99_ms", "latency_p99_ms")
