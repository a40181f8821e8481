#!/usr/bin/env python
"""Loop overhead: how much of a run is spent outside model forward passes.

    python benchmarks/overhead.py --num-prompts 5 --max-new-tokens 256 --out overhead.json

For vanilla and each method (``--method NAME``: ``conf/method/`` presets by name, or one-offs as
``benchmarks/peers.py`` takes them; default ``DEFAULT_METHODS``: the static / FailFast / reuse
variants of our drafters, and the drafters that read the target with chains and trees), the
prompts are decoded with ``specpolicy.core.decoding.generate`` while forward hooks
(``specpolicy.analysis.profiling.ForwardTimer``) time every forward pass of the target and of the
drafter's model. Reported per method, summed over prompts:

* ``wall_ms`` -- ``generate`` wall-clock time (prefill included);
* ``target_forward_ms`` / ``drafter_forward_ms`` -- time inside the models' forward passes
  (prefill, drafting, verification, Fast-dLLM block rewrites at commit: every pass); a
  drafter's pass is what its ``timed_calls`` name, its top-k over its own distribution included
  (EAGLE-3's ``top_tokens``, the block drafters' ``alternatives``): drafting compute, not loop;
* ``outside_forward_ms`` = wall - forward, and ``outside_fraction`` (the goal: <= 10%);
* our loop timers for context: ``prefill_ms``, ``draft_ms``, ``verify_ms`` and ``loop_ms`` =
  wall - prefill - draft - verify (commit, policy update, reuse, bookkeeping);
* ``policy_ms`` / ``policy_fraction`` -- the length policy's own time (``next_length`` and
  ``update``, ``specpolicy.analysis.profiling.PolicyTimer``), part of ``outside_forward_ms``;
* ``wall_ms_without_hooks`` -- the same prompts without hooks (the hooks' own cost is the
  difference).

Methods run interleaved per prompt (rotating order), after one untimed warm-up prompt.
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
from peers import Bench, MethodSpec, add_method_argument, add_model_arguments, parse_method  # noqa: E402

from specpolicy.analysis.profiling import ForwardTimer, PolicyTimer  # noqa: E402
from specpolicy.core.decoding import generate  # noqa: E402
from specpolicy.core.reuse import DraftReuse  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402

#: The methods a run without ``--method`` measures beside vanilla, in table order: ``conf/method/``
#: presets by name (their settings and one-line descriptions live there).
DEFAULT_METHODS = (
    "ar+static-k5",
    "ar+failfast",
    "fastdllm+static-k5",
    "fastdllm+failfast",
    "fastdllm+failfast+reuse",
    "suffix+failfast",
    "ar+goodput",
    "fastdllm+goodput",
    "suffix+goodput",
    "dflash+failfast",
    "eagle3+static-k5",
    "eagle3+eagle2-tree-d6k4t16",
    "dflash+failfast-tree",
    "dflash+block-tree",
)


def measure(
    bench: Bench, prompt_ids: list[torch.Tensor], max_new_tokens: int, warmup: int = 1, specs: list[MethodSpec] = ()
) -> dict[str, dict[str, Any]]:
    """The overhead figures of vanilla and every method of ``specs`` (``parse_method``; see the
    module docstring), rows named by the methods."""
    rows: dict[str, dict[str, Any]] = {}
    runners = []
    for spec in [None, *specs]:  # vanilla first: no drafter, no policy
        name, reuse = (spec.name, spec.reuse) if spec else ("vanilla", False)
        drafter, policy = bench.parts(spec) if spec else (None, None)
        model = getattr(drafter, "timed_calls", None) or getattr(drafter, "model", None)  # a pass's entry points
        rows[name] = dict.fromkeys(
            (
                "wall_ms",
                "wall_ms_without_hooks",
                "target_forward_ms",
                "drafter_forward_ms",
                "prefill_ms",
                "draft_ms",
                "verify_ms",
                "policy_ms",
            ),
            0.0,
        )
        rows[name].update(target_forward_calls=0, drafter_forward_calls=0, tokens=0, rounds=0)

        def run(ids, hooks, record=True, _name=name, _d=drafter, _p=policy, _m=model, _r=reuse):
            reuse_obj = DraftReuse(bench.args.reuse_min_match) if _r else None
            if not hooks:
                res = generate(
                    ids,
                    bench.verifier,
                    bench.runtime,
                    max_new_tokens=max_new_tokens,
                    drafter=_d,
                    policy=_p,
                    reuse=reuse_obj,
                )
                if record:
                    rows[_name]["wall_ms_without_hooks"] += res.wall_s * 1e3
                return
            with ForwardTimer(target=bench.target, drafter=_m) as ft, PolicyTimer(_p) as pt:
                res = generate(
                    ids,
                    bench.verifier,
                    bench.runtime,
                    max_new_tokens=max_new_tokens,
                    drafter=_d,
                    policy=_p,
                    reuse=reuse_obj,
                )
            r = rows[_name]
            r["wall_ms"] += res.wall_s * 1e3
            r["target_forward_ms"] += ft.ms["target"]
            r["target_forward_calls"] += ft.calls["target"]
            r["drafter_forward_ms"] += ft.ms.get("drafter", 0.0)
            r["drafter_forward_calls"] += ft.calls.get("drafter", 0)
            r["prefill_ms"] += res.prefill_ms
            r["policy_ms"] += pt.total_ms
            r["draft_ms"] += sum(x.draft_ms for x in res.rounds)
            r["verify_ms"] += sum(x.verify_ms for x in res.rounds)
            r["tokens"] += int(res.output_ids.shape[0])
            r["rounds"] += len(res.rounds)

        runners.append((name, run))
    for i in range(warmup):  # untimed: first-call overheads
        for _, run in runners:
            run(prompt_ids[i % len(prompt_ids)], hooks=False, record=False)
    for i, ids in enumerate(prompt_ids):
        order = runners[i % len(runners) :] + runners[: i % len(runners)]
        for _, run in order:
            run(ids, hooks=True)
        for _, run in order:
            run(ids, hooks=False)
    for r in rows.values():
        forward = r["target_forward_ms"] + r["drafter_forward_ms"]
        r["forward_ms"] = forward
        r["outside_forward_ms"] = r["wall_ms"] - forward
        r["outside_fraction"] = r["outside_forward_ms"] / r["wall_ms"] if r["wall_ms"] else 0.0
        r["loop_ms"] = r["wall_ms"] - r["prefill_ms"] - r["draft_ms"] - r["verify_ms"]
        r["policy_fraction"] = r["policy_ms"] / r["wall_ms"] if r["wall_ms"] else 0.0
    return rows


def print_table(rows: dict[str, dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = (
        ("wall ms", "wall_ms", "{:.0f}"),
        ("target fwd ms", "target_forward_ms", "{:.0f}"),
        ("drafter fwd ms", "drafter_forward_ms", "{:.0f}"),
        ("outside fwd ms", "outside_forward_ms", "{:.0f}"),
        ("outside %", "outside_fraction", "{:.1%}"),
        ("prefill ms", "prefill_ms", "{:.0f}"),
        ("draft ms", "draft_ms", "{:.0f}"),
        ("verify ms", "verify_ms", "{:.0f}"),
        ("loop ms", "loop_ms", "{:.0f}"),
        ("policy %", "policy_fraction", "{:.1%}"),
        ("fwd calls T/D", None, None),
        ("wall ms no hooks", "wall_ms_without_hooks", "{:.0f}"),
    )
    table = Table(title=title)
    table.add_column("method")
    for c in cols:
        table.add_column(c[0], justify="right")
    for name, r in rows.items():
        cells = [
            f"{r['target_forward_calls']}/{r['drafter_forward_calls']}" if k is None else f.format(r[k])
            for _, k, f in cols
        ]
        table.add_row(name, *cells)
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="benchmarks/overhead.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=5)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    add_model_arguments(p)
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON output")
    add_method_argument(
        p,
        "a conf/method/ preset by name, or a one-off NAME=drafter=D,policy=P,... as benchmarks/peers.py "
        "takes it; repeat for several (default: DEFAULT_METHODS); vanilla always runs",
    )
    args = p.parse_args(argv)
    specs = args.method or [parse_method(name) for name in DEFAULT_METHODS]
    args.method = [s.given for s in specs]  # recorded in the settings as given
    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench(args)
    prompts = load_prompts(args.dataset, args.dataset_path, args.num_prompts)
    ids = [q.token_ids(bench.tokenizer) for q in prompts]
    start = time.perf_counter()
    rows = measure(bench, ids, args.max_new_tokens, args.warmup, specs)
    result = {
        "settings": {
            **vars(args),
            "device": str(bench.runtime.torch_device),
            "dtype": str(bench.runtime.torch_dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "benchmark_s": time.perf_counter() - start,
        },
        "methods": rows,
    }
    print_table(
        rows,
        f"time outside model forward passes: {len(ids)} prompts x {args.max_new_tokens} tokens, "
        f"{result['settings']['device']} {result['settings']['dtype']}",
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
