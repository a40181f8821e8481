"""``summary.json``: every number of a run, computed in one place from its ``PromptResult`` objects.

``summarize`` is the one function that turns results into summary fields; the run
(``specpolicy.run.experiment``), the sweep report (``specpolicy.analysis.report``, through ``headline``) and
the peer benchmark (``benchmarks/peers.py``) all use it, so a method's acceptance rate,
accepted lengths, rounds, speedup and losslessness are the same numbers wherever they are
printed. The definitions are ``specpolicy.analysis.metrics`` (measured), ``specpolicy.core.latency`` (MODELED
latency, labelled) and ``specpolicy.analysis.oracle`` (the oracle length policy, rounds source); they
are computed from the recorded rounds after the timed decoding, so they never affect measured
times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specpolicy.analysis.metrics import aggregate, describe_fields, prompt_values, weighted_aggregates
from specpolicy.analysis.oracle import analyse as analyse_oracle
from specpolicy.analysis.results import SAMPLING_LOSSLESS, PromptResult
from specpolicy.core.accounting import with_pass_accounting
from specpolicy.core.latency import LatencyProfile, load_profile, modeled_summary
from specpolicy.core.sampling import SamplingConfig

#: Profile used when the config has no ``profile`` node (e.g. summaries built outside the CLI).
DEFAULT_PROFILE = "a6000-qwen7b"


def profile_from(config: Mapping[str, Any] | None) -> LatencyProfile:
    """The run's latency profile: the ``profile`` config node, else the default profile.

    Raises:
        ValueError: for an invalid ``profile`` node (naming the key).
    """
    node = (config or {}).get("profile")
    return LatencyProfile.from_config(node) if node else load_profile(DEFAULT_PROFILE)


def summarize(
    method: str,
    results: Sequence[PromptResult],
    config: Mapping[str, Any] | None = None,
    runtime: Mapping[str, Any] | None = None,
    prompts_total: int | None = None,
    interrupted_by: str | None = None,
    timing_conditions: Mapping[str, Any] | None = None,
    peak_memory: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` content of ``results`` (one per prompt, in prompt order).

    Headline figures (token-weighted) and ``methods`` (the speculative method's and vanilla's
    ``metrics.aggregate``); the vanilla figures, the speedup and losslessness when every result
    has a vanilla baseline (``lossless_fraction`` (identical prompts), ``lossless_counts`` (identical /
    numerically equivalent / NOT lossless, ``specpolicy.analysis.parting``), ``not_lossless`` and
    ``partings`` (each measured parting: position, margins) when greedy; ``lossless``
    ``"n/a (sampling)"`` when sampling: token identity with vanilla is not expected);
    ``per_prompt``, ``aggregates`` (token- and prompt-weighted), per-position acceptance, stop and
    finish reasons; ``modeled`` (latency profile of ``config``, labelled MODELED) and ``oracle``
    (this policy's modeled speedup as a fraction of the oracle's); ``sampling``, ``runtime``,
    ``config``, ``prompts_total``, ``partial`` (``interrupted_by``: a signal name), ``skipped_prompts``
    (results of prompts that were not decoded, ``PromptResult.skipped``: listed, in no figure),
    ``timing_conditions`` (when given, ``specpolicy.analysis.machine``) and ``fields`` (``metrics.FIELDS``: a
    description of every field).

    Args:
        method: the speculative method's name (``<drafter>+<policy>...``).
        results: the prompts' results.
        config: the resolved run config (its ``generation`` and ``profile`` nodes are used).
        runtime: ``Runtime.describe()`` (device, dtype, seed, versions).
        prompts_total: prompts in the configured set (default: ``len(results)``).
        interrupted_by: marks the summary ``"partial": true``.
        timing_conditions: what the machine was doing while this invocation measured.
        peak_memory: the process's peak memory (``specpolicy.models.memory.peak_memory``), when given.
    """
    config = dict(config or {})
    skipped = {r.prompt_id: r.skipped for r in results if r.skipped}
    prompts_total = len(results) if prompts_total is None else prompts_total
    results = [r for r in results if not r.skipped]  # prompts over the context: listed, never measured
    sampling = SamplingConfig.from_config(config.get("generation"))
    specs = [r.speculative for r in results]
    vanillas = [r.vanilla for r in results if r.vanilla is not None]
    with_baseline = bool(results) and len(vanillas) == len(results)
    spec = aggregate(specs)
    summary: dict[str, Any] = {
        "method": method,
        "prompts": len(results),
        "acceptance_rate": spec["acceptance_rate"],
        "mean_accepted_length": spec["mean_accepted_length"],
        "mean_accepted_length_with_bonus": spec["mean_accepted_length_with_bonus"],
        "mean_speculation_length": spec["mean_speculation_length"],
        "rounds": spec["rounds"],
        "drafter_forward_passes": spec["drafter_forward_passes"],
        "tokens_per_s": spec["tokens_per_s"],
    }
    methods = {method: spec}
    if with_baseline:
        van = aggregate(vanillas)
        methods["vanilla"] = van
        summary.update(
            vanilla_tokens_per_s=van["tokens_per_s"],
            speedup_vs_vanilla=spec["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] else 0.0,
        )
        if sampling.is_greedy:
            classes = [r.lossless_class for r in results]
            summary.update(
                lossless_fraction=sum(r.lossless is True for r in results) / len(results),
                lossless_counts={
                    "identical": classes.count("identical"),
                    "numerically_equivalent": classes.count("numerically equivalent"),
                    "not_lossless": classes.count("NOT lossless"),
                },
                not_lossless={r.prompt_id: r.first_difference for r in results if r.lossless_class == "NOT lossless"},
                partings={r.prompt_id: r.parting for r in results if r.parting is not None},
            )
        else:
            summary["lossless"] = SAMPLING_LOSSLESS
    summary["sampling"] = sampling.describe()
    per_prompt = {}
    for r in results:
        values = prompt_values(r.speculative, r.vanilla if with_baseline else None)
        values["finish_reason"] = r.speculative.finish_reason
        if r.lossless is not None:
            values["lossless"] = r.lossless
        per_prompt[r.prompt_id] = values
    summary.update(
        generated_tokens=spec["generated_tokens"],
        tokens_per_round=spec["tokens_per_round"],
        draft_stop_reasons=spec["draft_stop_reasons"],
        finish_reasons=spec["finish_reasons"],
        acceptance_by_position=spec["acceptance_by_position"],
        aggregates=weighted_aggregates(spec, per_prompt, summary.get("speedup_vs_vanilla")),
        per_prompt=per_prompt,
    )
    summary.update(_modeled_and_oracle(results, config))
    step_ms = profile_from(config).target_ms_per_token
    for figures in methods.values():  # host work per round against the profile's target step
        host = figures.get("host_ms_per_round")
        figures["host_step_share"] = host / step_ms if host is not None and step_ms else None
    summary.update(
        host_ms_per_round=spec.get("host_ms_per_round"),
        host_step_share=spec.get("host_step_share"),
        host_step_profile=profile_from(config).name,
    )
    summary["methods"] = methods
    summary["runtime"] = dict(runtime or {})
    summary["config"] = config
    summary["prompts_total"] = prompts_total
    if skipped:
        summary["skipped_prompts"] = skipped
    if timing_conditions is not None:
        summary["timing_conditions"] = dict(timing_conditions)
    if peak_memory is not None:
        summary["peak_memory"] = dict(peak_memory)
    summary["partial"] = interrupted_by is not None
    if interrupted_by is not None:
        summary["interrupted_by"] = interrupted_by
    summary["fields"] = describe_fields(summary)
    return summary


def _modeled_and_oracle(results: Sequence[PromptResult], config: Mapping[str, Any]) -> dict[str, Any]:
    """``modeled_speedup_vs_vanilla``, ``modeled_profile``, ``modeled`` (``latency.modeled_summary``;
    labelled MODELED; drafter passes counted under ``profile.pass_accounting``,
    ``specpolicy.core.accounting``) and ``oracle`` (overall and per prompt)."""
    spec_rounds = [r for res in results for r in res.speculative.rounds]
    van_rounds = [r for res in results if res.vanilla is not None for r in res.vanilla.rounds]
    tokens = sum(res.generated_tokens for res in results)
    profile = profile_from(config)
    modeled_rounds = spec_rounds
    if profile.pass_accounting != "project":  # count the passes as the official FailFast harness does
        drafter = config.get("drafter") or {}
        if any(res.prompt_tokens < 1 for res in results):
            raise ValueError(f"profile.pass_accounting={profile.pass_accounting} needs each result's prompt_tokens")
        modeled_rounds = with_pass_accounting(
            [(res.speculative.rounds, res.prompt_tokens) for res in results],
            profile.pass_accounting,
            str(drafter.get("name", "")),
            drafter.get("block_size"),
        )
    drafter_name = str((config.get("drafter") or {}).get("name", "")) or None
    modeled = modeled_summary(modeled_rounds, tokens, profile, van_rounds, drafter=drafter_name)
    out: dict[str, Any] = {
        "modeled_speedup_vs_vanilla": modeled["speedup_vs_vanilla"],
        "modeled_profile": modeled["profile"]["name"],
        "modeled": modeled,
    }
    clock_free = profile.for_drafter(drafter_name)  # a measured profile is not complete: no clock-free figure
    oracle = analyse_oracle(results, profile=clock_free if clock_free.complete else None)
    if oracle is not None:
        out["oracle"] = {
            **{
                k: oracle[k]
                for k in (
                    "definition",
                    "source",
                    "fraction_of_oracle",
                    "policy_speedup_modeled",
                    "oracle_speedup_modeled",
                    "censored_positions",
                    "cost_model",
                    "max_length",
                )
            },
            "fraction_by_prompt": {p["prompt_id"]: p["fraction_of_oracle"] for p in oracle["per_prompt"]},
        }
        if oracle.get("unavailable"):  # the run's timings cannot give a cost model: n/a, with the reason
            out["oracle"]["unavailable"] = oracle["unavailable"]
        if oracle.get("profile_costs"):  # the same fraction with the profile's costs: clock-free
            out["oracle"]["profile_costs"] = oracle["profile_costs"]
    return out


def headline(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The headline figures of a ``summary.json`` as one flat row (what every table prints): method,
    prompts, measured and MODELED speedup, tokens/s (and vanilla's), acceptance rate, mean accepted
    length (without and with the bonus token), mean speculation length (every round, and per
    drafted round), longest accepted / speculated length, rounds, drafter passes per round,
    ``lossless`` ("k/n" prompts identical, "k/n identical + m numerically equivalent" when some
    partings are near-ties, ``"n/a (sampling)"``, or None without a baseline) and
    ``lossless_fraction``; None where the summary has no such figure."""
    spec = (summary.get("methods") or {}).get(summary.get("method"), {})
    prompts = int(summary.get("prompts", 0))
    fraction = summary.get("lossless_fraction")
    lossless: str | None
    if fraction is not None:
        lossless = f"{round(fraction * prompts)}/{prompts}"
        equivalent = (summary.get("lossless_counts") or {}).get("numerically_equivalent", 0)
        if equivalent:  # identical, plus the partings at near-ties within the dtype's rounding
            lossless += f" identical + {equivalent} numerically equivalent"
    else:
        lossless = summary.get("lossless")
    row = {"method": summary.get("method"), "prompts": prompts}
    for key in (
        "speedup_vs_vanilla",
        "modeled_speedup_vs_vanilla",
        "tokens_per_s",
        "vanilla_tokens_per_s",
        "acceptance_rate",
        "mean_accepted_length",
        "mean_accepted_length_with_bonus",
        "mean_speculation_length",
        "rounds",
    ):
        row[key] = summary.get(key, spec.get(key))
    for key in (
        "mean_speculation_length_drafted",
        "max_accepted_length",
        "max_speculation_length",
        "drafter_passes_per_round",
        "tree_rounds",
        "mean_draft_depth",
        "host_ms_per_round",
        "host_step_share",
    ):
        row[key] = spec.get(key)
    row.update(lossless=lossless, lossless_fraction=fraction)
    return row
