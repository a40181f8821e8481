"""Record and compare the round records of a set of configurations: a loop, drafter or runner change
must leave every output token and every round record field (lengths, passes, drafted and target
tokens, tree parents, accepted path, confidences) as it was. Timings are not compared.

    python benchmarks/round_records.py record OUT_DIR [--only NAME ...]   # one CLI run per configuration
    python benchmarks/round_records.py compare OLD_DIR NEW_DIR            # field by field; exit 1 on a difference

Record on the commit before a change (a `git worktree` of it), then on the change, and compare. Each
configuration is a `python -m specpolicy` command on 3 held-in GSM8K prompts x 64 new tokens; its
`results.jsonl` holds every prompt's output and rounds (`specpolicy.analysis.results`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

COMMON = ["dataset.num_prompts=3", "generation.max_new_tokens=64", "run.warmup_prompts=0", "run.resume=false"]

#: name -> the configuration's overrides (the issue's list: chain, reuse, trees, a profile-priced
#: goodput, DEER, a batch of 2, seeded sampling at batch 1, SpecDec++'s acceptance head on three
#: drafters, the compiled runtime).
CONFIGS: dict[str, list[str]] = {
    "fastdllm-failfast": ["drafter=fastdllm", "policy=failfast"],
    "dflash-failfast-reuse": ["drafter=dflash", "policy=failfast", "reuse.enabled=true"],
    "eagle3-eagle2-tree": ["drafter=eagle3", "policy=eagle2-tree"],
    "dart-dart-tree": ["drafter=dart", "policy=dart-tree"],
    "dflash-block-tree": ["drafter=dflash", "policy=block-tree"],
    "ar-goodput-profile": ["drafter=ar", "policy=goodput", "policy.cost_profile=a6000-qwen7b"],
    "deer-failfast": ["drafter=deer", "policy=failfast"],
    "suffix-static": ["drafter=suffix", "policy=static"],
    "fastdllm-failfast-batch2": ["drafter=fastdllm", "policy=failfast", "generation.batch_size=2"],
    "eagle3-static-batch2-reuse": ["drafter=eagle3", "policy=static", "generation.batch_size=2", "reuse.enabled=true"],
    "dflash-failfast-batch2-sampled": [
        "drafter=dflash",
        "policy=failfast",
        "generation.batch_size=2",
        "generation.temperature=1.0",
        "seed=5",
    ],
    "fastdllm-failfast-sampled": ["drafter=fastdllm", "policy=failfast", "generation.temperature=1.0", "seed=3"],
    "eagle3-eagle2-tree-sampled": ["drafter=eagle3", "policy=eagle2-tree", "generation.temperature=0.8", "seed=4"],
    "ar-specdecpp-head": ["drafter=ar", "policy=specdecpp", "policy.acceptance=head"],
    "eagle3-goodput-head-profile": [
        "drafter=eagle3",
        "policy=goodput",
        "policy.acceptance=head",
        "policy.cost_profile=a6000-qwen7b",
    ],
    "dflash-failfast-head": ["drafter=dflash", "policy=failfast", "policy.acceptance=head"],
    "eagle3-static-compiled": ["drafter=eagle3", "policy=static", "runtime.compile=true"],
    "dflash-failfast-compiled": ["drafter=dflash", "policy=failfast", "runtime.compile=true"],
}

#: Round and row fields that are clocks (never compared).
TIMING = {"draft_ms", "verify_ms", "wall_s", "prefill_ms", "vanilla_draft_ms", "vanilla_verify_ms", "vanilla_wall_s"}
TIMING |= {"vanilla_prefill_ms", "tokens_per_s", "vanilla_tokens_per_s", "timestamp", "config_hash"}


def record(out_dir: Path, only: list[str]) -> None:
    """One ``python -m specpolicy`` run per configuration, its run directory ``out_dir/NAME``."""
    for name, overrides in CONFIGS.items():
        if only and name not in only:
            continue
        cmd = [sys.executable, "-m", "specpolicy", *overrides, *COMMON, f"hydra.run.dir={out_dir / name}"]
        print(f"[{name}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{name}: exit {done.returncode}")


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: str(r.get("prompt_id")))


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING and not k.endswith("_ms")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _first_difference(a, b, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'new' if key in b else 'old'}"
            found = _first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def compare(old_dir: Path, new_dir: Path) -> int:
    """Every configuration recorded in both directories, field by field (timings excluded)."""
    failures = 0
    for name in CONFIGS:
        if not (old_dir / name / "results.jsonl").exists() or not (new_dir / name / "results.jsonl").exists():
            print(f"{name:32s} not in both")
            continue
        old, new = _strip(_rows(old_dir / name)), _strip(_rows(new_dir / name))
        diff = _first_difference(old, new)
        rounds = sum(len(r.get("rounds", [])) for r in new)
        print(f"{name:32s} {'identical' if diff is None else 'DIFFERS ' + diff} ({len(new)} prompts, {rounds} rounds)")
        failures += diff is not None
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out_dir", type=Path)
    rec.add_argument("--only", nargs="*", default=[])
    cmp = sub.add_parser("compare")
    cmp.add_argument("old_dir", type=Path)
    cmp.add_argument("new_dir", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out_dir, args.only)
        return 0
    return compare(args.old_dir, args.new_dir)


if __name__ == "__main__":
    raise SystemExit(main())
