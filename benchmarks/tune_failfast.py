#!/usr/bin/env python
"""Retune FailFast's N and τ for one drafter: a grid measured side by side in one process.

    python benchmarks/tune_failfast.py --drafter dflash --offset 200 --num-prompts 40 \\
        --out benchmarks/results/tune-failfast-dflash.json

FailFast's defaults (N = 10, τ = 0.45, N_max = 60; arXiv 2512.20573 §4.2 and App. C) were chosen
for a Fast-dLLM v2 drafter on 7B-32B targets. Another drafter -- a different calibration of its
confidences, a different cost per pass -- may want others, and the issue that added the drafters
that read the target allows "defaults retuned for this drafter and stated". This runs every
``(N, τ)`` of the grid (each with N_max = ``--n-max``), FailFast's defaults (the policy's own, N_max
included), static k of ``--static-k`` (each row composed and validated as ``benchmarks/peers.py``'s
one-offs: ``grid_methods``) and any ``--method`` row (a ``conf/method/`` preset by name) on the same prompts with the same drafter, interleaved per prompt (rotating order,
one untimed warm-up prompt: ``peers.run_interleaved``), and reports tokens/s, the speedup over
vanilla greedy decoding in the same run, the mean accepted length and the number of prompts whose
output equals vanilla's. Tune on rows that the comparison you report does not use
(``--offset``): ``benchmarks/peers.py`` measures on GSM8K test rows 0-29 by default, and rows after
1000 are held out for checking.

Output: a printed table, best first, and ``--out`` JSON (settings, the machine's conditions from
``specpolicy.analysis.machine.MachineWatch``, every row, and ``best``: the fastest grid point).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # noqa: E402
    Bench,
    MethodSpec,
    add_method_argument,
    add_model_arguments,
    check_prompt_slice,
    failfast_label,
    parse_method,
    run_interleaved,
    start_benchmark,
)

from specpolicy.analysis.machine import MachineWatch, warning_line  # noqa: E402
from specpolicy.analysis.metrics import aggregate  # noqa: E402
from specpolicy.analysis.results import PromptResult  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402
from specpolicy.policies.failfast import FailFastPolicy  # noqa: E402


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 separated by commas, got {text!r}")
    return values


def _taus(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or not all(0.0 <= t <= 1.0 for t in values):
        raise argparse.ArgumentTypeError(f"expected values in [0, 1] separated by commas, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/tune_failfast.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", default="dflash", choices=("ar", "fastdllm", "suffix", "dflash", "eagle3"))
    p.add_argument("--n-grid", type=_ints, default=[2, 3, 4, 5], help="FailFast N values (tokens per chunk)")
    p.add_argument("--tau-grid", type=_taus, default=[0.5, 0.6, 0.7], help="FailFast τ values (confidence)")
    p.add_argument("--n-max", type=int, default=60, help="N_max of every grid point (>= the largest N)")
    p.add_argument("--static-k", type=_ints, default=[6, 8], help="static k rows beside the grid")
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--offset", type=int, default=200, help="first prompt row (keep clear of the reported rows)")
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    add_model_arguments(p)
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per method")
    p.add_argument("--out", default=None, help="JSON output")
    add_method_argument(
        p,
        "another row beside the grid: a conf/method/ preset by name (e.g. dflash-failfast-tuned) or a one-off "
        "as benchmarks/peers.py takes it; repeat for several",
    )
    args = p.parse_args(argv)
    if args.n_max < max(args.n_grid):
        p.error(f"--n-max must be >= the largest N of --n-grid ({max(args.n_grid)}), got {args.n_max}")
    check_prompt_slice(p, args)
    args.specs = grid_methods(args) + args.method
    args.method = [s.given for s in args.method]  # recorded in the settings as given
    return args


def grid_methods(args: argparse.Namespace) -> list[MethodSpec]:
    """The rows beside vanilla, composed by ``parse_method`` (Hydra, the policy's validation) before
    any model loads: FailFast at its defaults, static k of ``--static-k`` and every ``(N, τ)`` of the
    grid (N_max ``--n-max``) on ``--drafter`` D, named ``D+failfast``, ``D+static-k<k>`` and
    ``D+failfast-n<N>-t<τ>``."""
    d = args.drafter
    return (
        [parse_method(f"{d}+failfast=drafter={d},policy=failfast")]
        + [parse_method(f"{d}+static-k{k}=drafter={d},policy=static,policy.k={k}") for k in args.static_k]
        + [
            parse_method(
                f"{d}+{failfast_label((n, tau))}=drafter={d},policy=failfast,policy.n={n},policy.tau={tau},"
                f"policy.n_max={args.n_max}"
            )
            for n in args.n_grid
            for tau in args.tau_grid
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    log = start_benchmark(args.threads)
    bench = Bench(args)
    prompts = load_prompts(args.dataset, args.dataset_path, args.num_prompts, args.offset)
    ids = [q.token_ids(bench.tokenizer) for q in prompts]
    d = args.drafter
    grid = [(n, tau) for n in args.n_grid for tau in args.tau_grid]
    methods = [bench.vanilla()] + [bench.added(spec) for spec in args.specs]
    log(f"{len(methods)} methods x {len(ids)} prompts ...")
    watch = MachineWatch()
    watch.start()
    start = time.perf_counter()
    run_interleaved(methods, ids, args.warmup, log)
    elapsed = time.perf_counter() - start
    vanilla = methods[0]
    conditions = watch.stop(
        [PromptResult.of(q.prompt_id, len(x), o, o, "") for q, x, o in zip(prompts, ids, vanilla.outcomes)]
    )
    base = aggregate(vanilla.outcomes)["tokens_per_s"]
    rows = []
    defaults = FailFastPolicy()
    for m, pair in zip(
        methods, [None, (defaults.n, defaults.tau)] + [None] * len(args.static_k) + grid + [None] * len(args.method)
    ):
        agg = aggregate(m.outcomes)
        rounds = [r for o in m.outcomes for r in o.rounds]
        rows.append(
            {
                "method": m.name,
                "policy": m.description,
                "n_tau": pair,
                "tokens_per_s": agg["tokens_per_s"],
                "speedup": agg["tokens_per_s"] / base,
                "mean_accepted_length": (sum(r.accepted_length for r in rounds) / len(rounds))
                if rounds and m.drafter
                else None,
                "lossless": sum(torch.equal(o.output_ids, v.output_ids) for o, v in zip(m.outcomes, vanilla.outcomes)),
            }
        )
    tuned = [r for r in rows if r["method"].startswith(f"{d}+failfast-n")]
    best = max(tuned, key=lambda r: r["tokens_per_s"])
    result = {
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "specs"},
            "device": str(bench.runtime.torch_device),
            "dtype": str(bench.runtime.torch_dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "benchmark_s": elapsed,
            "prompt_ids": [q.prompt_id for q in prompts],
        },
        "timing_conditions": conditions,
        "rows": rows,
        "best": {"n": best["n_tau"][0], "tau": best["n_tau"][1], "n_max": args.n_max, "speedup": best["speedup"]},
    }
    print(
        f"FailFast (N, τ) on {d}: {len(ids)} prompts from row {args.offset} x {args.max_new_tokens} tokens, "
        f"{result['settings']['device']} {result['settings']['dtype']}"
    )
    print(f"{'method':32s} {'tok/s':>8s} {'x vanilla':>9s} {'accepted':>8s} {'lossless':>9s}")
    for r in sorted(rows, key=lambda r: -r["tokens_per_s"]):
        acc = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(
            f"{r['method']:32s} {r['tokens_per_s']:8.1f} {r['speedup']:9.2f} {acc:>8s} {r['lossless']:>5d}/{len(ids)}"
        )
    print(f"best: N = {best['n_tau'][0]}, τ = {best['n_tau'][1]:g} ({best['speedup']:.2f}x vanilla)")
    line = warning_line(conditions)
    if line:
        print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
