#!/usr/bin/env python
"""Batched peer run: speculation-length policies at several batch sizes, side by side in one run.

    python benchmarks/batched.py --num-prompts 30 --max-new-tokens 128 --batch-sizes 1,2,4,8,16 \
        --out benchmarks/results/batched-gsm8k-30x128.json --figure benchmarks/results/batched-gsm8k-30x128.png

For each batch size B, the prompts go through the batched loop (``specpolicy.core.batching``) with
up to B requests in flight (all arriving at once, or ``--arrival poisson --rate R``): vanilla
batched decoding and each method (``--method NAME``, repeated: ``conf/method/`` presets by name or
one-offs as ``benchmarks/peers.py`` takes them, all on one drafter; default ``DEFAULT_METHODS``:
the EAGLE-3 chain at every fixed K of 1, 2, 3, 4 and 6 (``static-k<K>`` rows), vLLM's per-batch-size
schedule (``batch-schedule``) and the batch-aware cost policy (``goodput-batch``)); at B = 1 also today's batch-1 loop (``specpolicy.core.decoding.generate``,
"loop-1"), the reference the batched loop is held to. Methods run interleaved (rotating order
per batch size) after one untimed warm-up, on a quiet machine (``specpolicy.analysis.machine``:
``timing_conditions``). Reported per (B, method): throughput (generated tokens/s over all
requests), TTFT / TPOT p50 and p99 (ms), mean speculation length and accepted length per round,
the ratio to vanilla at the same B, and whether every request's output equals its batch-1
greedy output (``lossless``); ``modeled``: the MODELED throughput and ratio to vanilla at the same
B on each GPU profile (``specpolicy.analysis.batch_model``: a roofline for the batched target pass, drafter
passes batched across requests; labelled MODELED, never mixed with the measured figures). Summary
per B: the best fixed K, and the batch-aware policy's throughput over it (the bar: within 5% at
every B) and over vanilla (never below 1).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import Bench, MethodSpec, add_method_argument, add_model_arguments, parse_method, start_benchmark  # noqa: E402

from specpolicy.analysis.batch_model import RoundCounts, modeled_batched  # noqa: E402
from specpolicy.analysis.machine import MachineWatch  # noqa: E402
from specpolicy.core.batching import generate_batch  # noqa: E402
from specpolicy.core.decoding import generate  # noqa: E402
from specpolicy.core.serving import RequestTiming, arrival_times, summarize  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402

#: The methods a run without ``--method`` measures beside vanilla: ``conf/method/`` presets by name,
#: all on one drafter (the EAGLE-3 chain at fixed K, vLLM's per-batch-size schedule, the batch-aware
#: cost policy). A row is named by its preset's name less the drafter's (``static-k1``, ...).
DEFAULT_METHODS = (
    "eagle3+static-k1",
    "eagle3+static-k2",
    "eagle3+static-k3",
    "eagle3+static-k4",
    "eagle3+static-k6",
    "eagle3+batch-schedule",
    "eagle3+goodput-batch",
)


def methods(bench: Bench, specs: list[MethodSpec]) -> list[tuple[str, Any, Any]]:
    """``(row, drafter, policy)`` of vanilla (neither) and every method (``parse_method``), the row
    its name less ``<drafter>+``."""
    out: list[tuple[str, Any, Any]] = [("vanilla", None, None)]
    for spec in specs:
        drafter, policy = bench.parts(spec)
        out.append((spec.name.removeprefix(f"{spec.drafter}+"), drafter, policy))
    return out


def run_method(
    bench: Bench,
    prompts: list[torch.Tensor],
    max_new_tokens: int,
    batch_size: int,
    drafter,
    policy,
    arrivals: list[float],
    batch1_loop: bool = False,
) -> tuple[list[RequestTiming], float, list, list, RoundCounts]:
    """One method over every prompt: the requests' timings, the wall seconds, every round, every
    request's output ids and the counts the MODELED throughput reads (``batch_model.RoundCounts``)."""
    if drafter is not None:
        bench.verifier.request_features(tuple(drafter.target_feature_layers or ()))
    if batch1_loop:  # today's loop, one request after another (arrivals all at once)
        start, timings, outputs, rounds = time.perf_counter(), [], [], []
        for ids in prompts:
            t0 = time.perf_counter() - start
            res = generate(
                ids, bench.verifier, bench.runtime, max_new_tokens=max_new_tokens, drafter=drafter, policy=policy
            )
            t1 = time.perf_counter() - start
            first = (
                t0 + (res.prefill_ms + (res.rounds[0].draft_ms + res.rounds[0].verify_ms if res.rounds else 0)) / 1e3
            )
            timings.append(RequestTiming(0.0, t0, first, t1, res.generated_tokens))
            outputs.append(res.output_ids.tolist())
            rounds += res.rounds
        return (
            timings,
            time.perf_counter() - start,
            rounds,
            outputs,
            RoundCounts.of_rounds(rounds, sum(t.tokens for t in timings)),
        )
    res = generate_batch(
        prompts,
        bench.verifier,
        bench.runtime,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        drafter=drafter,
        policy=policy,
        arrivals=arrivals,
    )
    outputs = [res.results[i].output_ids.tolist() for i in range(len(prompts))]
    rounds = [r for g in res.results.values() for r in g.rounds]
    return [res.timings[i] for i in sorted(res.timings)], res.wall_s, rounds, outputs, RoundCounts.of(res)


def measure(bench: Bench, prompts: list[torch.Tensor], args: argparse.Namespace, log) -> dict[str, Any]:
    ks = [int(k) for k in args.ks.split(",")]
    table = methods(bench, args.specs)
    arrivals = arrival_times(len(prompts), args.arrival, args.rate, args.seed)
    reference = [
        generate(ids, bench.verifier, bench.runtime, max_new_tokens=args.max_new_tokens).output_ids.tolist()
        for ids in prompts
    ]  # batch-1 greedy outputs (untimed; also the warm-up)
    rows: dict[str, dict[str, Any]] = {}
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        entries = [(name, d, p, False) for name, d, p in table]
        if b == 1:  # today's batch-1 loop beside the batched loop at B = 1
            entries += [
                (f"{name}:loop-1", d, p, True) for name, d, p in table if name.startswith(("vanilla", "static"))
            ]
        runs: dict[str, list] = {
            name: [[], 0.0, [], True, RoundCounts()]  # timings, wall, rounds, lossless, counts
            for name, *_ in entries
        }
        for rep in range(args.repeats):  # interleaved: every method once per repeat, rotating order
            shift = (b + rep) % len(entries)
            for name, d, p, loop1 in entries[shift:] + entries[:shift]:
                log(f"B={b} repeat {rep + 1}/{args.repeats} {name}")
                timings, wall, rounds, outputs, counts = run_method(
                    bench, prompts, args.max_new_tokens, b, d, p, arrivals, loop1
                )
                run = runs[name]
                run[0] += timings
                run[1] += wall
                run[2] += rounds
                run[3] = run[3] and outputs == reference
                run[4] += counts
        row: dict[str, Any] = {}
        for name, (timings, wall, rounds, lossless, counts) in runs.items():
            summary = summarize(timings, wall)  # over every repeat: tokens / total wall, latency percentiles
            n = max(len(rounds), 1)
            summary["mean_speculation_length"] = sum(r.speculation_length for r in rounds) / n
            summary["mean_accepted_length"] = sum(r.accepted_length for r in rounds) / n
            summary["speculation_off_fraction"] = sum(r.speculation_length == 0 for r in rounds) / n
            summary["lossless"] = lossless
            # MODELED (GPU roofline), against vanilla batched decoding at the same B: never a measured number
            summary["modeled"] = modeled_batched(counts, runs["vanilla"][4], args.drafter)["by_profile"]
            row[name] = summary
        van = row["vanilla"]["throughput_tokens_per_s"]
        for s in row.values():
            s["speedup_vs_vanilla"] = s["throughput_tokens_per_s"] / van
        fixed = {f"static-k{k}": row[f"static-k{k}"]["throughput_tokens_per_s"] for k in ks}
        best = max(fixed, key=fixed.get)
        best_any = max(fixed[best], van)  # a fixed K of 0 is vanilla
        row["_summary"] = {
            "best_fixed_k": best if fixed[best] >= van else "vanilla (k=0)",
            "best_fixed_tokens_per_s": best_any,
            "goodput_batch_over_best_fixed": row["goodput-batch"]["throughput_tokens_per_s"] / best_any,
            "batch_schedule_over_best_fixed": row["batch-schedule"]["throughput_tokens_per_s"] / best_any,
            "goodput_batch_over_vanilla": row["goodput-batch"]["speedup_vs_vanilla"],
        }
        rows[str(b)] = row
    return rows


def figure(result: dict[str, Any], path: Path) -> None:
    """Throughput and p99 TPOT against batch size, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["batch_sizes"]
    sizes = [int(b) for b in rows]
    names = [n for n in rows[str(sizes[0])] if not n.startswith("_") and ":" not in n]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        style = dict(lw=2.5) if name in ("goodput-batch", "vanilla", "batch-schedule") else dict(lw=1, alpha=0.6)
        ax1.plot(sizes, [rows[str(b)][name]["throughput_tokens_per_s"] for b in sizes], marker="o", label=name, **style)
        ax2.plot(sizes, [rows[str(b)][name]["tpot_p99_ms"] for b in sizes], marker="o", label=name, **style)
    s = result["settings"]
    trusted = "" if result["timing_conditions"].get("timing_trusted", True) else " (timing NOT trusted)"
    for ax, label in ((ax1, "throughput (tokens/s, all requests)"), (ax2, "TPOT p99 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size (requests in flight)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(
        f"batched decoding, drafter={s['drafter']}: {s['num_prompts']} {s['dataset']} prompts x "
        f"{s['max_new_tokens']} tokens, {s['arrival']} arrivals, {s['device']} {s['dtype']} "
        f"(measured){trusted}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="batched decoding: tokens/s (x vanilla at the same batch size)")
    sizes = list(result["batch_sizes"])
    table.add_column("method")
    for b in sizes:
        table.add_column(f"B={b}", justify="right")
    names = [n for n in result["batch_sizes"][sizes[0]] if not n.startswith("_")]
    for name in names:
        cells = []
        for b in sizes:
            s = result["batch_sizes"][b].get(name)
            cells.append(
                ""
                if s is None
                else f"{s['throughput_tokens_per_s']:.0f} ({s['speedup_vs_vanilla']:.2f}x)"
                + ("" if s["lossless"] else " LOSSY")
            )
        table.add_row(name, *cells)
    for key in ("best_fixed_k", "goodput_batch_over_best_fixed", "batch_schedule_over_best_fixed"):
        table.add_row(
            key,
            *[
                (lambda v: f"{v:.3f}" if isinstance(v, float) else str(v))(result["batch_sizes"][b]["_summary"][key])
                for b in sizes
            ],
        )
    Console(width=200).print(table)
    print_modeled(result)


def print_modeled(result: dict[str, Any]) -> None:
    """One table per GPU profile: MODELED tokens/s (x vanilla at the same batch size) per method."""
    from rich.console import Console
    from rich.table import Table

    sizes = list(result["batch_sizes"])
    names = [n for n in result["batch_sizes"][sizes[0]] if not n.startswith("_")]
    for profile, knee in result["modeled"]["knee_tokens"].items():
        table = Table(title=f"MODELED {profile}, knee {knee:.0f} tokens: tokens/s (x vanilla)")
        table.add_column("method")
        for b in sizes:
            table.add_column(f"B={b}", justify="right")
        for name in names:
            cells = []
            for b in sizes:
                m = result["batch_sizes"][b].get(name, {}).get("modeled", {}).get(profile)
                if m is None or m["speculative_tokens_per_s"] is None:
                    cells.append("")
                    continue
                ratio = m["throughput_speedup"]
                cells.append(f"{m['speculative_tokens_per_s']:.0f}" + ("" if ratio is None else f" ({ratio:.2f}x)"))
            table.add_row(name, *cells)
        Console(width=200).print(table)
    print(
        f"MODELED tables: {result['modeled']['label']}"
        + "".join(f"; {why}" for why in result["modeled"].get("unavailable", {}).values())
    )


def parser() -> argparse.ArgumentParser:
    """The command line of ``benchmarks/batched.py``."""
    p = argparse.ArgumentParser(prog="benchmarks/batched.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    add_method_argument(
        p,
        "a conf/method/ preset by name, or a one-off NAME=drafter=D,policy=P,... as benchmarks/peers.py takes it; "
        "repeat for several, all on one drafter, with a static-k<K> row for each fixed K and the batch-schedule and "
        "goodput-batch rows (default: DEFAULT_METHODS); vanilla always runs",
    )
    p.add_argument("--arrival", default="all_at_once", choices=("all_at_once", "poisson"))
    p.add_argument("--rate", type=float, default=0.0, help="requests/s for --arrival poisson")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every method per batch size")
    add_model_arguments(p)
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON output")
    p.add_argument("--figure", default=None, help="PNG output")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, the methods composed before any model loads: ``args.specs`` (the methods),
    ``args.method`` (as given), ``args.drafter`` (theirs) and ``args.ks`` (the fixed K of their
    ``static-k<K>`` rows, comma-joined)."""
    p = parser()
    args = p.parse_args(argv)
    args.specs = args.method or [parse_method(name) for name in DEFAULT_METHODS]
    rows = [s.name.removeprefix(f"{s.drafter}+") for s in args.specs]
    drafters = sorted({s.drafter for s in args.specs})
    if len(drafters) > 1:
        p.error(f"--method: the methods run on one drafter, got {', '.join(drafters)}")
    missing = [r for r in ("batch-schedule", "goodput-batch") if r not in rows]
    ks = [r.removeprefix("static-k") for r in rows if re.fullmatch(r"static-k\d+", r)]
    if missing or not ks:
        p.error(f"--method: the summary compares static-k<K> rows with batch-schedule and goodput-batch, got {rows}")
    args.method, args.drafter, args.ks = [s.given for s in args.specs], drafters[0], ",".join(ks)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    log = start_benchmark(args.threads)
    bench = Bench(args)
    prompts = [q.token_ids(bench.tokenizer) for q in load_prompts(args.dataset, args.dataset_path, args.num_prompts)]
    watch = MachineWatch()
    watch.start()
    rows = measure(bench, prompts, args, log)
    result = {
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "specs"},
            "device": str(bench.runtime.torch_device),
            "dtype": str(bench.runtime.torch_dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
        },
        "timing_conditions": watch.stop([]),
        "batch_sizes": rows,
    }
    profiles = modeled_batched(RoundCounts(), None, args.drafter)  # what every (B, method)'s "modeled" is under
    result["modeled"] = {
        "label": profiles["label"],
        "drafter": args.drafter,
        "knee_tokens": {n: m["knee_tokens"] for n, m in profiles["by_profile"].items()},
        **({"unavailable": profiles["unavailable"]} if "unavailable" in profiles else {}),
    }
    print_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    if args.figure:
        figure(result, Path(args.figure))
    return result


if __name__ == "__main__":
    main()
