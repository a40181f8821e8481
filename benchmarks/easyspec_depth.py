#!/usr/bin/env python
"""What EasySpec's stale attention costs in acceptance as the drafter gets deeper.

    python benchmarks/easyspec_depth.py --num-prompts 5 --max-new-tokens 128 \\
        --out benchmarks/results/easyspec-depth.json

EasySpec (arXiv 2502.02493, §3) runs the attention sublayers of a group of ``layer_parallel``
middle layers from the group's first input. The bundled AR drafter has 4 layers (one group of
2 middle layers); to see the rule at the paper's N = 4 without training a deeper drafter, this
runs the 12-layer bundled *target* as its own layer-parallel drafter (``drafter=easyspec
drafter.model=target``): with ``layer_parallel`` 1 every draft is the target's own greedy token
(acceptance 1.0), so any drop at N = 2, 3, 4 is the staleness alone. Acceptance rates do not
depend on the machine's load; no time is reported. Each setting is one ``python -m specpolicy``
run (resumed when its directory holds a finished run), its ``summary.json`` read back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=5, help="static speculation length (tokens)")
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 3, 4], help="layer_parallel values")
    ap.add_argument("--model", default="target", help="the drafter's model (default: the 12-layer target)")
    ap.add_argument("--runs-dir", default="outputs/easyspec-depth")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for n in a.groups:
        run_dir = Path(a.runs_dir) / f"lp{n}-{a.num_prompts}x{a.max_new_tokens}"
        cmd = [
            sys.executable, "-m", "specpolicy", "drafter=easyspec", f"drafter.model={a.model}",
            f"drafter.layer_parallel={n}", "policy=static", f"policy.k={a.k}",
            f"dataset.num_prompts={a.num_prompts}", f"generation.max_new_tokens={a.max_new_tokens}",
            "run.warmup_prompts=0", f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = json.loads((run_dir / "summary.json").read_text())
        rows.append(
            {
                "layer_parallel": n,
                "acceptance_rate": s["acceptance_rate"],
                "mean_accepted_length": s["mean_accepted_length"],
                "lossless_fraction": s["lossless_fraction"],
            }
        )
        print(f"layer_parallel {n}: acceptance rate {s['acceptance_rate']:.3f}, accepted length "
              f"{s['mean_accepted_length']:.2f}")  # fmt: skip
    result = {"settings": {k: v for k, v in vars(a).items() if k != "out"}, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
