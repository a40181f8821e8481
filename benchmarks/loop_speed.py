"""Tokens/s of ``generate`` against another version of the batch-1 loop, interleaved in one process.

    python benchmarks/loop_speed.py --old OLD/specpolicy/core/decoding.py [--prompts 8] [--max-new-tokens 128]

``--old`` is the ``decoding.py`` of another checkout (e.g. a ``git worktree`` of the commit before a
loop change): it is loaded as a module of its own beside this checkout's package, so both loops drive
the same verifier, drafters and policies, prompt by prompt, alternating which goes first. Prints per
method the tokens/s of both loops and their ratio, and whether their outputs are identical. Run it
alone on the machine (timings).
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch

from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.data.datasets import load_prompts
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy, make_verifier

#: name -> the config overrides of its drafter and policy (None: vanilla decoding).
METHODS = {"vanilla": None} | {
    name: [f"method={name}"] for name in ("fastdllm+failfast", "eagle3+static-k5", "dflash+failfast")
}  # conf/method/ presets by name


def _config(overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


def _old_generate(path: str):
    spec = importlib.util.spec_from_file_location("old_decoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="another checkout's specpolicy/core/decoding.py")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    args = parser.parse_args()
    old = _old_generate(args.old)
    runtime = Runtime(device="cpu", dtype="float32")
    pm = get_plugin_manager()
    verifier = make_verifier(pm, _config([])["verifier"], runtime)
    prompts = [p.token_ids(verifier.tokenizer) for p in load_prompts("gsm8k", num_prompts=args.prompts)]
    for name, overrides in ((m, METHODS[m]) for m in args.methods):
        kwargs = {}
        if overrides is not None:
            config = _config(overrides)
            kwargs = {
                "drafter": make_drafter(pm, config["drafter"], runtime, verifier),
                "policy": make_policy(pm, config["policy"]),
            }
        seconds = {"new": 0.0, "old": 0.0}
        tokens = {"new": 0, "old": 0}
        identical = True
        generate(prompts[0], verifier, runtime, max_new_tokens=16, **kwargs)  # warm-up
        for repeat in range(args.repeats):
            for i, ids in enumerate(prompts):
                order = ("new", "old") if (i + repeat) % 2 == 0 else ("old", "new")
                outputs = {}
                for which in order:
                    loop = generate if which == "new" else old
                    t0 = time.perf_counter()
                    out = loop(ids, verifier, runtime, max_new_tokens=args.max_new_tokens, **kwargs)
                    seconds[which] += time.perf_counter() - t0
                    tokens[which] += int(out.output_ids.shape[0])
                    outputs[which] = out.output_ids
                identical &= bool(torch.equal(outputs["new"], outputs["old"]))
        new, old_rate = tokens["new"] / seconds["new"], tokens["old"] / seconds["old"]
        print(
            f"{name:20s} new {new:7.1f} tokens/s  old {old_rate:7.1f} tokens/s  new/old {new / old_rate:.3f}  "
            f"outputs {'identical' if identical else 'DIFFER'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
