#!/usr/bin/env python
"""Losslessness of the batched loop on the bundled family: every built-in drafter x chain policy
at several batch sizes, each request's output against its batch-1 greedy output.

    python benchmarks/batched_lossless.py --num-prompts 30 --max-new-tokens 64 --batch-sizes 1,4,16
    python benchmarks/batched_lossless.py ... --reuse   # with draft reuse in every run

Not a timing: it prints, per drafter and policy, how many requests decoded exactly their
batch-1 greedy output at each batch size (the issue-21 bar: all of them), and exits with status 1
when any did not. The float32 target computes a row slightly differently in a batch than alone
(batched matrix products), so a near-tie of the target's own argmax could in principle flip; the
tests run the same check in float64 (``tests/core/test_batching.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import Bench, MethodSpec, add_model_arguments, parse_method, start_benchmark  # noqa: E402

from specpolicy.core.batching import generate_batch  # noqa: E402
from specpolicy.core.decoding import generate  # noqa: E402
from specpolicy.core.reuse import DraftReuse  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402

#: The matrix checked: every built-in chain drafter x every chain policy, at the config groups'
#: defaults (``drafter=D policy=P``: composed and validated as ``benchmarks/peers.py``'s one-offs).
DRAFTERS = ("ar", "fastdllm", "suffix", "dflash", "eagle3")
POLICIES = ("static", "failfast", "specdecpp", "aimd", "heuristic", "goodput", "goodput-batch", "batch-schedule")


def matrix(drafters: list[str], policies: list[str], reuse: bool) -> list[MethodSpec]:
    """The methods of the matrix, ``<drafter>+<policy>[+reuse]`` each, composed by ``parse_method``
    (Hydra, plugin validation) before any model loads.

    Raises:
        argparse.ArgumentTypeError: one line naming an unknown drafter or policy.
    """
    suffix, extra = ("+reuse", ",reuse.enabled=true") if reuse else ("", "")
    return [parse_method(f"{d}+{p}{suffix}=drafter={d},policy={p}{extra}") for d in drafters for p in policies]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="benchmarks/batched_lossless.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--drafters", default=",".join(DRAFTERS))
    p.add_argument("--policies", default=",".join(POLICIES))
    add_model_arguments(p)
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument("--reuse", action="store_true", help="with draft reuse (reuse.enabled=true) in every run")
    p.add_argument("--out", default=None, help="JSON output")
    args = p.parse_args(argv)
    try:
        specs = matrix(args.drafters.split(","), args.policies.split(","), args.reuse)
    except argparse.ArgumentTypeError as exc:
        p.error(f"--drafters/--policies: {exc}")
    log = start_benchmark(args.threads)
    bench = Bench(args)
    prompts = [q.token_ids(bench.tokenizer) for q in load_prompts(args.dataset, None, args.num_prompts)]
    bench.verifier.request_features(())
    reference = [
        generate(ids, bench.verifier, bench.runtime, max_new_tokens=args.max_new_tokens).output_ids.tolist()
        for ids in prompts
    ]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    table: dict[str, dict[str, int]] = {}
    for spec in specs:
        row = {}
        for b in sizes:
            drafter, policy = bench.parts(spec)  # a fresh policy per run
            out = generate_batch(
                prompts,
                bench.verifier,
                bench.runtime,
                max_new_tokens=args.max_new_tokens,
                batch_size=b,
                drafter=drafter,
                policy=policy,
                reuse=DraftReuse(args.reuse_min_match) if spec.reuse else None,
            )
            row[str(b)] = sum(
                out.results[i].output_ids.tolist() == ref for i, ref in enumerate(reference) if i in out.results
            )
        table[spec.name] = row
        log(f"{spec.name}: " + ", ".join(f"B={b} {row[str(b)]}/{len(prompts)}" for b in sizes))
    every = all(v == len(prompts) for row in table.values() for v in row.values())
    result = {"settings": vars(args), "identical": table, "all_lossless": every}
    print(
        f"{'all' if every else 'NOT all'} {len(table) * len(sizes)} drafter x policy x batch-size runs lossless "
        f"on {len(prompts)} prompts"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    if not every:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
