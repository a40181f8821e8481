"""The experiment's batched phase (``generation.batch_size`` > 1): every prompt through the batched
loop (``specpolicy.core.batching``), the speculative method and then vanilla batched decoding at the
same batch size, with the configured arrivals (``generation.arrival``, ``arrival_rate``, seeded
by ``seed``). Each request becomes the usual ``PromptResult`` (its output, rounds and time in
flight; losslessness against its vanilla output), so ``summary.json``, the loggers' rows and the
tables are the batch-1 run's; the serving figures -- throughput over all requests, TTFT / TPOT /
latency mean, p50 and p99 -- go to ``summary.json``'s ``serving`` block and a table of their own,
with the MODELED throughput of both methods on each GPU profile (``specpolicy.analysis.batch_model``: a
roofline for the batched target pass; ``serving.modeled``, MODELED rows in the table).
A prompt the batched loop refuses (e.g. too long) is skipped and recorded, the batch goes on.
"""

from __future__ import annotations

from typing import Any

from specpolicy.analysis.batch_model import RoundCounts, modeled_batched
from specpolicy.analysis.labels import FIGURES, SERVING_KEYS
from specpolicy.analysis.results import PromptResult
from specpolicy.analysis.summary import profile_from
from specpolicy.core.batching import generate_batch
from specpolicy.core.serving import arrival_times
from specpolicy.run.setup import PromptPlan, RunSetup

#: The serving figures shown, in order: (label, key of ``BatchResult.summary``, format), from the
#: one metric list (``specpolicy.analysis.labels``).
SERVING_ROWS = tuple((FIGURES[k].label, k, FIGURES[k].fmt) for k in SERVING_KEYS)


def run_batched(setup: RunSetup, plan: PromptPlan, config: dict[str, Any], pm) -> tuple[list, dict[str, Any]]:
    """Decode the prompts of ``plan`` not finished earlier with up to ``generation.batch_size`` in
    flight, with ``setup``'s models and settings (its stop strings matched per request).

    Returns:
        ``(results, serving)``: a ``PromptResult`` per prompt in prompt order (read back when
        finished earlier, skipped when too long or refused) and the ``serving`` block of
        ``summary.json`` (the batch size, arrivals, and ``BatchResult.summary`` of the speculative
        method and of vanilla, with the throughput ratio; ``modeled``: ``batch_model.modeled_batched``
        of both runs under every shipped profile and the run's own, labelled MODELED).
    """
    generation = config["generation"]
    batch_size, max_new = int(generation["batch_size"]), setup.max_new_tokens
    baseline = bool(config["run"]["vanilla_baseline"])
    prompts, finished, too_long, runtime = plan.prompts, plan.finished, plan.too_long, setup.runtime
    todo = [p for p in prompts if p.prompt_id not in finished and p.prompt_id not in too_long]
    ids = [plan.token_ids[p.prompt_id] for p in todo]
    arrivals = arrival_times(
        len(todo),
        generation.get("arrival", "all_at_once"),
        float(generation.get("arrival_rate", 0.0) or 0.0),
        int(config.get("seed", 0)),
    )
    method = {"drafter": setup.drafter, "policy": setup.policy}
    compiled_before = runtime.warmup_s
    if plan.warmup and ids:  # untimed: first-call overheads of every shape the batch will see
        for kwargs in (method, {}) if baseline else (method,):
            generate_batch(
                ids[:batch_size],
                setup.verifier,
                runtime,
                max_new_tokens=min(max_new, 16),
                batch_size=batch_size,
                **kwargs,
            )
    if runtime.warmup_s > compiled_before:  # the compiled runtime's batched static caches, built by the warm-up
        print(
            f"compiled runtime: the batched loop's static caches for {batch_size} requests compiled in "
            f"{runtime.warmup_s - compiled_before:.1f} s more (warm-up {runtime.warmup_s:.1f} s in all: "
            "summary.json runtime.warmup_s)"
        )
    sampling, seed = setup.sampling, setup.seed
    common = dict(max_new_tokens=max_new, batch_size=batch_size, arrivals=arrivals, sampling=sampling, stop=setup.stop)
    runtime.seed_everything(seed)  # sampled outputs depend on the seed and on what shares each batch
    spec = generate_batch(ids, setup.verifier, runtime, reuse=setup.reuse, **method, **common)
    van = None
    if baseline:
        runtime.seed_everything(seed)
        van = generate_batch(ids, setup.verifier, runtime, **common)
    tokenizer, fingerprint = setup.tokenizer, setup.fingerprint
    by_id = {p.prompt_id: i for i, p in enumerate(todo)}
    results = []
    for prompt in prompts:
        pid = prompt.prompt_id
        if pid in finished:
            results.append(finished[pid])
            continue
        n = int(plan.token_ids[pid].shape[0])
        i = by_id.get(pid)
        reason = too_long.get(pid) if i is None else spec.skipped.get(i)
        if reason is not None:
            result = PromptResult.skip(pid, n, reason, config_hash=fingerprint, prompt_text=prompt.text)
        else:
            out = spec.results[i]
            for record in out.rounds:
                pm.hook.specpolicy_round_end(method=setup.method, prompt_id=pid, record=record)
            result = PromptResult.of(
                pid,
                n,
                out,
                van.results.get(i) if van is not None else None,
                tokenizer.decode(out.output_ids.tolist(), skip_special_tokens=True),
                sampled=not sampling.is_greedy,
                config_hash=fingerprint,
                prompt_text=prompt.text,
            )
            result = setup.with_parting(result, plan.token_ids[pid])  # after decoding, untimed
        pm.hook.specpolicy_prompt_end(method=setup.method, prompt_id=pid, row=result.to_row(), result=result)
        results.append(result)
    serving: dict[str, Any] = {
        "batch_size": batch_size,
        "arrival": generation.get("arrival", "all_at_once"),
        "arrival_rate": generation.get("arrival_rate", 0.0),
        "requests": len(ids),
        "speculative": spec.summary(),
    }
    if van is not None:
        serving["vanilla"] = van.summary()
        if serving["vanilla"]["tokens"]:  # none when every prompt was finished earlier or refused
            serving["throughput_speedup"] = (
                serving["speculative"]["throughput_tokens_per_s"] / serving["vanilla"]["throughput_tokens_per_s"]
            )
    serving["modeled"] = modeled_batched(
        RoundCounts.of(spec),
        RoundCounts.of(van) if van is not None else None,
        str((config.get("drafter") or {}).get("name", "")) or None,
        selected=profile_from(config),
    )
    return results, serving


def print_serving(serving: dict[str, Any]) -> None:
    """The serving table: one row per measured figure, a column per method (vanilla first), then
    a MODELED row per GPU profile (``serving["modeled"]``: tokens/s, the speculative cell with its
    ratio to vanilla), then the measured throughput ratio and the MODELED rows' label."""
    from rich.console import Console
    from rich.table import Table

    arrival = serving["arrival"] + (
        f" at {serving['arrival_rate']} requests/s" if serving["arrival"] == "poisson" else ""
    )
    table = Table(
        title=f"serving: {serving['requests']} requests, batch size {serving['batch_size']}, {arrival} "
        "(measured, this machine; MODELED rows: a GPU roofline, not measured)"
    )
    table.add_column("figure")
    columns = [name for name in ("vanilla", "speculative") if name in serving]
    for name in columns:
        table.add_column(name, justify="right")
    for label, key, fmt in SERVING_ROWS:
        table.add_row(label, *[fmt.format(serving[name][key]) for name in columns])
    modeled = serving.get("modeled") or {}
    if modeled.get("by_profile"):
        table.add_section()

        def rate(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.0f}"

        for profile, m in modeled["by_profile"].items():
            ratio = "" if m["throughput_speedup"] is None else f" ({m['throughput_speedup']:.2f}x)"
            cells = {
                "vanilla": rate(m["vanilla_tokens_per_s"]),
                "speculative": rate(m["speculative_tokens_per_s"]) + ratio,
            }
            table.add_row(f"MODELED {profile} (tokens/s)", *[cells[name] for name in columns])
    Console().print(table)
    if "throughput_speedup" in serving:
        print(
            f"throughput speedup over vanilla batched decoding at batch size {serving['batch_size']}: "
            f"{serving['throughput_speedup']:.2f}x"
        )
    if modeled:
        unavailable = "".join(f"; {why}" for why in modeled.get("unavailable", {}).values())
        print(f"MODELED rows: {modeled['label']}{unavailable}")
