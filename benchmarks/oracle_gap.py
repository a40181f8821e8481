"""Where a length policy's gap to the exact oracle comes from, clock-free (MODELED with a profile's costs).

    python benchmarks/oracle_gap.py --drafters ar --cap 20 --tune --check-real ar+goodput-head-a6000-qwen7b \\
        --cache /tmp/traces --out ar.json          # eagle3 and dflash: --cap 32

(defaults: held-out GSM8K test rows 100-107, calibration gsm8k-train rows 500-507, 128 tokens,
a6000-qwen7b; ``benchmarks/results/oracle-gap-a6000-qwen7b.json`` holds the three drafters' runs).

For each drafter: the target's greedy outputs on the prompts, the drafter's proposal recorded at
every committed prefix (``specpolicy.analysis.policy_replay.collect_traces``: up to ``--cap`` tokens,
further while it still matches, so the exact oracle's M(i) is there), then, with the profile's costs:

* the exact oracle's modeled time and every ``--method`` preset (and the drafter's presets when none
  is given) REPLAYED offline on the traces -- the real policy objects, fed the recorded drafts -- as
  a fraction of the oracle, with the gap split into ``early`` rounds (stopped before the first wrong
  token) and ``waste`` (passes on tokens past it);
* length rules tuned in hindsight on these very prompts (``bounds``; optimistic for their family,
  not bounds on every policy): the best static length, the best SpecDec++ threshold on the head's and
  on the confidences' estimates, the best survival threshold that knows the NEXT token's estimate
  before paying its pass, one that predicts it from the last token's estimate, and a PERFECT head
  (each drafted token known right or wrong once drafted: drafting to the first wrong one, or a cap)
  -- the price of learning a token's fate only by drafting it, which no estimate of drafted tokens
  avoids;
* ``--tune``: SpecDec++ (head), FailFast (head) and goodput (head, profile costs) grids replayed on
  ``--calib-num-prompts`` prompts from ``--calib-offset`` (disjoint from the held-out ones), the best
  of each on the held-out prompts.

``--check-real METHOD``: also runs METHOD through the real loop on the held-out prompts and counts
the rounds whose (length, accepted) differ from the replay (the replay's fidelity). Figures are
MODELED (pass counts x the profile's latencies), never timings.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import Bench, add_model_arguments, parse_method, start_benchmark  # noqa: E402

from specpolicy.analysis.policy_replay import (  # noqa: E402
    Costs,
    collect_traces,
    estimates,
    gap,
    oracle_ms,
    oracle_stats,
    rule_ms,
    simulate,
)
from specpolicy.core.decoding import generate  # noqa: E402
from specpolicy.core.latency import load_profile  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402
from specpolicy.models.acceptance_head import default_head_dir, load_head, wire_acceptance  # noqa: E402
from specpolicy.plugins.manager import get_plugin_manager, make_policy  # noqa: E402

#: The presets replayed per drafter when no ``--method`` is given.
PRESETS = {
    "ar": (
        "ar+static-k5",
        "ar+specdecpp",
        "ar+specdecpp-head",
        "ar+goodput",
        "ar+goodput-head",
        "ar+goodput-head-a6000-qwen7b",
    ),
    "eagle3": (
        "eagle3+static-best",
        "eagle3+specdecpp",
        "eagle3+specdecpp-head",
        "eagle3+specdecpp-tuned",
        "eagle3+specdecpp-head-tuned",
        "eagle3+goodput",
        "eagle3+goodput-head",
        "eagle3+specdecpp-head-a6000-qwen7b",
    ),
    "dflash": (
        "dflash+static-best",
        "dflash+failfast",
        "dflash+specdecpp",
        "dflash+specdecpp-head-tuned",
        "dflash+failfast-head",
        "dflash+goodput",
        "dflash+goodput-head-a6000-qwen7b",
    ),
}
#: Oracle's longest speculation (as peers': FailFast's N_max).
ORACLE_MAX = 60


def outputs_of(bench: Bench, prompt_ids: list[torch.Tensor], max_new_tokens: int) -> list[torch.Tensor]:
    """The target's greedy outputs (vanilla decoding), ``(n,) int64`` each."""
    return [
        generate(ids, bench.verifier, bench.runtime, max_new_tokens=max_new_tokens).output_ids.cpu()
        for ids in prompt_ids
    ]


def traces_of(bench, drafter, prompt_ids, outputs, cap, cache: Path | None, log):
    """Every prompt's traces (read from ``cache`` when it exists, else recorded and written there)."""
    if cache is not None and cache.is_file():
        return torch.load(cache, weights_only=False)
    start = time.perf_counter()
    model = bench.drafters[drafter]
    traces = [collect_traces(model, ids, y, cap, ORACLE_MAX, bench.verifier) for ids, y in zip(prompt_ids, outputs)]
    model.report_hidden = False
    log(f"  traces of {drafter}: {len(traces)} prompts, {time.perf_counter() - start:.0f} s")
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(traces, cache)
    return traces


def build_policy(bench: Bench, drafter: str, overrides: list[str]):
    """A fresh policy of a preset or a one-off (``NAME=drafter=D,policy=P,...``), its head loaded."""
    text = overrides[0] if len(overrides) == 1 else "x=" + ",".join(overrides)
    spec = parse_method(text, one_off=False)
    if spec.drafter != drafter:
        raise SystemExit(f"{text}: drafter {spec.drafter}, not {drafter}")
    policy = make_policy(get_plugin_manager(block=spec.block), dict(spec.policy))

    class _Model:  # wire_acceptance reads the drafter's hidden size and device; sets report_hidden
        model = bench.drafters[drafter].model
        runtime = bench.runtime
        report_hidden = False

    settings = {**_drafter_conf(bench, drafter), **(spec.drafter_settings or {})}
    wire_acceptance(policy, _Model(), settings)
    return policy


def _drafter_conf(bench: Bench, drafter: str) -> dict[str, Any]:
    from peers import _conf

    node = dict(_conf("drafter", drafter))
    node["model"] = getattr(bench.args, f"{drafter}_drafter", node.get("model"))
    return node


def replay(bench, drafter, overrides, traces, max_new, costs, cap, o_ms) -> dict[str, Any]:
    """One policy replayed: fraction of the oracle, modeled speedup and the gap's parts."""
    policy = build_policy(bench, drafter, overrides)
    res = simulate(policy, traces, max_new, costs, cap)
    ms = res.ms(costs)
    stats = gap(res.rounds, traces, costs)
    vanilla = sum(len(p) for p in traces) * costs.step_ms
    return {
        "policy": repr(policy),
        "fraction_of_oracle": o_ms / ms,
        "modeled_speedup": vanilla / ms,
        "capped_rounds": res.capped,
        **stats,
    }


def _specdecpp_len(e: np.ndarray, h: float, lo: int, hi: int) -> int:
    reject = 1.0 - np.cumprod(e[:hi])
    j = np.nonzero(reject[lo - 1 :] >= h)[0]
    return int(lo + j[0]) if j.size else min(hi, e.size)


BINS = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99])


def _next_table(traces, est) -> np.ndarray:
    """In-sample P(token j + 1 accepted | tokens 1..j accepted, bin of e_j), per bin."""
    hit, seen = np.zeros(BINS.size), np.zeros(BINS.size)
    for p, prompt in enumerate(traces):
        for i, tr in enumerate(prompt):
            e = est[p][i]
            for j in range(1, min(tr.match + 1, e.size)):  # token j accepted, token j + 1 reached
                b = np.searchsorted(BINS[1:], e[j - 1], side="right")
                seen[b] += 1
                hit[b] += j + 1 <= tr.match
    return (hit + 1.0) / (seen + 2.0)


def _markov_len(e: np.ndarray, q: np.ndarray, c: float) -> int:
    if not e.size:
        return 0
    survival = np.cumprod(e)
    nxt = q[np.searchsorted(BINS[1:], e, side="right")]
    go = survival * nxt >= c  # go[j - 1]: draft token j + 1
    stop = np.nonzero(~go)[0]
    return int(stop[0] + 1) if stop.size else int(e.size)


def bounds(traces, est_head, est_conf, costs, o_ms, cap, max_new) -> dict[str, Any]:
    """Length rules tuned in hindsight on these prompts (module docstring), as fractions of the oracle
    (optimistic for a policy of that rule's family; not an upper bound on every policy)."""
    out: dict[str, Any] = {}

    def best(name, grid, rule):
        scores = {g: o_ms / rule_ms(traces, lambda p, i, tr, g=g: rule(p, i, tr, g), costs, max_new)[0] for g in grid}
        g = max(scores, key=scores.get)
        out[name] = {"best": g, "fraction_of_oracle": scores[g]}

    best("static", range(0, cap + 1), lambda p, i, tr, k: k)
    hs = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    for label, est in (("head", est_head), ("confidence", est_conf)):
        if est is None:
            continue
        best(
            f"specdecpp_{label}",
            [(h, lo) for h in hs for lo in (1, 2)],
            lambda p, i, tr, g, est=est: _specdecpp_len(est[p][i], g[0], g[1], cap),
        )
        cs = [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
        # knows token j's estimate before its pass: drafts while the survival with it stays >= c
        best(
            f"next_estimate_known_{label}",
            cs,
            lambda p, i, tr, c, est=est: int(np.sum(np.cumprod(est[p][i][:cap]) >= c)),
        )
        # the next token's acceptance predicted from the last token's estimate (in-sample table by
        # its bin): draft token j + 1 while survival_j x q(bin(e_j)) >= c
        q = _next_table(traces, est)
        best(
            f"next_from_last_{label}",
            cs,
            lambda p, i, tr, c, est=est, q=q: _markov_len(est[p][i][:cap], q, c),
        )
    # a perfect head: every drafted token known right or wrong once drafted; drafts to the first wrong one
    # (the traces hold every token up to the first wrong one, past ``cap`` too)
    best("perfect_head", range(1, ORACLE_MAX + 2), lambda p, i, tr, L: min(tr.match + 1, L))
    return out


TUNE_GRIDS = {
    "specdecpp": [
        [f"policy.h={h}", f"policy.min_length={lo}", "policy.max_length=__cap__"]
        for h, lo in itertools.product((0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9), (1, 2))
    ],
    "failfast": [
        [f"policy.n={n}", f"policy.tau={t}", "policy.n_max=__cap__"]
        for n, t in itertools.product((1, 2, 3, 4), (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9))
    ],
    "goodput": [
        ["policy.cost_profile=__profile__", "policy.max_length=__cap__", f"policy.position_strength={s}"]
        for s in (2.0, 8.0, 32.0)
    ],
}


def tune(bench, drafter, calib, held, max_new, costs, cap, profile: str, log) -> dict[str, Any]:
    """Each grid replayed on the calibration traces; its best, then on the held-out ones."""
    o_cal = oracle_ms(calib, costs, ORACLE_MAX)
    o_held = oracle_ms(held, costs, ORACLE_MAX)
    out = {}
    for policy_name, grid in TUNE_GRIDS.items():
        for acceptance in ("head", "confidence"):
            scored = []
            for entry in grid:
                ov = [f"drafter={drafter}", f"policy={policy_name}", f"policy.acceptance={acceptance}"]
                ov += [e.replace("__cap__", str(cap)).replace("__profile__", profile) for e in entry]
                frac = replay(bench, drafter, ov, calib, max_new, costs, cap, o_cal)["fraction_of_oracle"]
                scored.append((frac, ov))
            frac, ov = max(scored, key=lambda s: s[0])
            held_res = replay(bench, drafter, ov, held, max_new, costs, cap, o_held)
            key = f"{policy_name}-{acceptance}"
            out[key] = {"overrides": ov, "calibration_fraction": frac, "held_out": held_res}
            log(f"  tuned {drafter} {key}: calib {frac:.3f} held-out {held_res['fraction_of_oracle']:.3f} {ov[3:]}")
    return out


def check_real(bench, name, prompt_ids, traces, max_new, costs) -> dict[str, Any]:
    """METHOD through the real loop vs its replay: rounds whose (length, accepted) differ."""
    spec = parse_method(name)
    policy = build_policy(bench, spec.drafter, [name])
    model = bench.drafters[spec.drafter]
    model.report_hidden = policy.acceptance_choice.wants_head if hasattr(policy, "acceptance_choice") else False
    real = [
        [
            (r.speculation_length, r.accepted_length)
            for r in generate(
                ids, bench.verifier, bench.runtime, max_new_tokens=max_new, drafter=model, policy=policy
            ).rounds
        ]
        for ids in prompt_ids
    ]
    model.report_hidden = False
    sim = simulate(build_policy(bench, spec.drafter, [name]), traces, max_new, costs)
    diff = sum(a != b for r, s in zip(real, sim.rounds) for a, b in zip(r, [(k, acc) for _, k, acc, _ in s]))
    return {"rounds_real": sum(map(len, real)), "rounds_replay": sum(map(len, sim.rounds)), "differing": diff}


def _cache_file(cache: Path | None, drafter: str, key: str, where: tuple[int, int], a) -> Path | None:
    """Where the traces of ``drafter`` on a prompt slice are cached (None: not cached)."""
    if cache is None:
        return None
    return cache / f"{drafter}-{key}-{where[0]}x{where[1]}-{a.max_new_tokens}-c{a.cap}.pt"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/oracle_gap.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--drafters", nargs="+", default=["ar", "eagle3", "dflash"], choices=sorted(PRESETS))
    p.add_argument("--offset", type=int, default=100, help="first held-out prompt (bundled GSM8K test)")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument(
        "--calib-dataset",
        default="gsm8k-train",
        help="bundled set of the calibration prompts (--tune; default: GSM8K train questions)",
    )
    p.add_argument(
        "--calib-offset",
        type=int,
        default=500,
        help="first calibration prompt (--tune; default past the rows the bundled heads were trained on)",
    )
    p.add_argument("--calib-num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--cap", type=int, default=24, help="tokens recorded per position (policies' longest draft)")
    p.add_argument("--profile", default="a6000-qwen7b")
    p.add_argument("--method", action="append", default=[], help="a preset or one-off to replay (repeatable)")
    p.add_argument("--tune", action="store_true")
    p.add_argument("--check-real", default=None, metavar="METHOD")
    p.add_argument("--cache", default=None, help="directory of recorded traces (read when there)")
    p.add_argument("--out", default=None)
    add_model_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> dict[str, Any]:
    a = parse_args(argv)
    a.device, a.dtype = ("cpu" if a.device == "auto" else a.device), ("float32" if a.dtype == "auto" else a.dtype)
    log = start_benchmark(a.threads)
    bench = Bench(a)
    profile = load_profile(a.profile)
    cache = Path(a.cache) if a.cache else None
    slices = {"held": (a.offset, a.num_prompts)}
    sets = {"held": "gsm8k", "calib": a.calib_dataset}
    if a.tune:
        slices["calib"] = (a.calib_offset, a.calib_num_prompts)
    ids, outs = {}, {}
    for key, (offset, count) in slices.items():
        ids[key] = [p.token_ids(bench.tokenizer) for p in load_prompts(sets[key], None, count, offset)]
        outs[key] = outputs_of(bench, ids[key], a.max_new_tokens)
    result: dict[str, Any] = {"settings": {k: v for k, v in vars(a).items()}, "drafters": {}}
    for drafter in a.drafters:
        costs = Costs.of(profile, drafter)
        tr = {
            key: traces_of(
                bench, drafter, ids[key], outs[key], a.cap, _cache_file(cache, drafter, key, slices[key], a), log
            )
            for key in slices
        }
        held = tr["held"]
        o_ms = oracle_ms(held, costs, ORACLE_MAX)
        vanilla = sum(len(p) for p in held) * costs.step_ms
        head_dir = default_head_dir(_drafter_conf(bench, drafter))
        head = load_head(head_dir) if head_dir is not None and (head_dir / "config.json").is_file() else None
        block: dict[str, Any] = {
            "costs": vars(costs),
            "oracle_speedup": vanilla / o_ms,
            "mean_match": float(np.mean([t.match for p in held for t in p])),
            "oracle": oracle_stats(held, costs, ORACLE_MAX),
            "methods": {},
        }
        for name in a.method or PRESETS[drafter]:
            block["methods"][name] = replay(bench, drafter, [name], held, a.max_new_tokens, costs, a.cap, o_ms)
            m = block["methods"][name]
            log(
                f"  {name}: {m['fraction_of_oracle']:.3f} of the oracle ({m['modeled_speedup']:.2f}x vs "
                f"{vanilla / o_ms:.2f}x); rounds {m['rounds']:.0f} early {m['early']:.0f} over {m['over']:.0f} "
                f"waste {m['waste_ms']:.0f} ms; capped {m['capped_rounds']}"
            )
        est_head = estimates(held, head) if head is not None else None
        block["bounds"] = bounds(held, est_head, estimates(held), costs, o_ms, a.cap, a.max_new_tokens)
        for k, v in block["bounds"].items():
            log(f"  best in hindsight {drafter} {k}: {v['fraction_of_oracle']:.3f} at {v['best']}")
        if a.tune:
            block["tuned"] = tune(bench, drafter, tr["calib"], held, a.max_new_tokens, costs, a.cap, a.profile, log)
        result["drafters"][drafter] = block
    if a.check_real:
        spec = parse_method(a.check_real)
        costs = Costs.of(profile, spec.drafter)
        held = traces_of(
            bench,
            spec.drafter,
            ids["held"],
            outs["held"],
            a.cap,
            _cache_file(cache, spec.drafter, "held", slices["held"], a),
            log,
        )
        result["check_real"] = check_real(bench, a.check_real, ids["held"], held, a.max_new_tokens, costs)
        log(f"  check-real {a.check_real}: {result['check_real']}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
