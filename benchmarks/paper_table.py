#!/usr/bin/env python
"""The paper's comparison for one data set: FailFast (arXiv 2512.20573) Table 1 (speedup over vanilla
decoding) and App. B (acceptance rate, mean and max accepted / speculated length, rounds, drafter
passes per round), for its baselines and the two ablations, in one process.

    python benchmarks/paper_table.py --dataset gsm8k --out benchmarks/results/paper-gsm8k
    python benchmarks/paper_table.py combine benchmarks/results/paper-{math500,aime24,gsm8k,humaneval} \\
        --out benchmarks/results/paper                  # the four data sets side by side
    python -m specpolicy.analysis.paper_figures reliability benchmarks/results/paper-gsm8k/runs/failfast

Methods: ``conf/method/`` presets by name, one per row (``PAPER_ROWS``: the paper's row name -> the
preset that holds its settings and one-line description), run under the paper's
protocol (``protocol``: the ``--failfast-*`` settings, the unmask thresholds, the calibrated k);
``--method NAME`` picks other presets, ``--method NAME=OVERRIDES`` adds a one-off as
``benchmarks/peers.py`` takes it. The paper's rows (the bundled family by default; ``--target``,
``--ar-drafter``, ``--dllm-drafter``):

* ``ar`` -- AR drafter, static k = the best of ``--k-grid`` in calibration (§5.1);
* ``fast-dllm`` -- Fast-dLLM at its default unmask threshold 0.9, static k = the AR drafter's
  best k ("Our Fast-dLLM baseline adopts the same speculation length as the AR drafter", App. D.1);
* ``fast-dllm-plus`` -- Fast-dLLM+: the same at its OWN best k of the grid (App. D.1);
* ``failfast`` -- FailFast: unmask threshold 0.05 (one pass per small block) + the extension rule
  (N, τ, N_max = 10, 0.45, 60; ``--failfast-*``);
* ``fail-fast-only`` -- ablation: threshold 0.05, static k = N (no extension);
* ``win-big-only`` -- ablation: the extension rule at threshold 0.9;
* ``eagle3`` -- EAGLE-3 (``drafter=eagle3``, the paper's strongest baseline, App. D.3) as a CHAIN at
  its own best k of the grid;
* ``eagle3-tree`` -- EAGLE-3 (w/ draft tree) as the paper ran it: EAGLE-2's dynamic tree
  (``policy=eagle2-tree``) at SGLang's setting of App. D.3 -- depth 8, 60 tokens, top-k 10;
* ``dart-tree`` -- DART (arXiv 2601.19278) as its paper runs it: one pass of d = 8 positions and its
  n-gram-scored tree search (``drafter=dart,policy=dart-tree``: top-25, beam 20, 60 nodes);
* ``dart-failfast`` -- FailFast's length rule on DART's drafts (``drafter=dart,policy=failfast,policy.n=8``:
  one pass per chunk of 8; τ and N_max as ``failfast``'s, N_max at least 8);
* ``falcon-tree`` -- Falcon (arXiv 2412.12639) with its static decoding tree (``drafter=falcon,
  policy=falcon-tree``) on the bundled Falcon drafter or ``--falcon-drafter``'s checkpoint (an install
  whose bundle lacks it skips the row with a note);
* ``deer`` -- DEER (arXiv 2512.15176) in its own setting: one denoising step fills k = 32 masks,
  verified as a chain (``drafter=deer,policy=static,policy.k=32``).

(``--dart-drafter``, ``--falcon-drafter``, ``--deer-drafter``: their checkpoints; MODELED with each
drafter's own A6000 pass cost, ``drafter_pass_ms_by_drafter`` of ``conf/profile/a6000-*.yaml``.)

Calibration (the best-k sweeps) runs on a SEPARATE prompt slice (``--calibration-prompts`` prompts
from ``--calibration-offset``, by default right after the evaluation prompts), before and apart from
the evaluation prompts, with vanilla decoding and every grid point interleaved per prompt; the best
k is the one with the highest measured speedup (``--select-by modeled``: modeled with
``--select-profile``). Both stages reuse ``benchmarks/peers.py``: its model set-up (``Bench``), its
per-prompt rotation of the method order (``run_interleaved``: machine drift affects all methods
alike), its summaries (``summarize_method``: ``specpolicy.analysis.summary.summarize``, the numbers of a
run's ``summary.json``) and its per-method run directories (``write_runs``); the MODELED columns
come from ``specpolicy.core.latency`` and ``specpolicy.core.accounting``.

Speedups: MEASURED = tokens/s over vanilla decoding's tokens/s in the same process (prefill
included, summed over prompts); MODELED = forward-pass counts x the paper's A6000 latencies
(``conf/profile/a6000-qwen{32,14,7}b.yaml``), with this project's pass accounting and with the
official FailFast harness's (``specpolicy.core.accounting``), labelled. Every method's output is checked
against vanilla greedy decoding, prompt by prompt.

Output (``--out`` directory): ``table1.md`` / ``table1.csv`` and ``appendix_b.md`` /
``appendix_b.csv`` in the paper's layout (one column per data set), ``calibration.md``,
``results.json`` (settings, calibration, every figure), ``runs/<method>/`` and
``calibration-runs/<method>/`` (``results.jsonl`` + ``summary.json``, for ``specpolicy.analysis.plot`` and
``specpolicy.analysis.paper_figures``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # noqa: E402  (not a package)
    Bench,
    Method,
    MethodSpec,
    _conf,
    add_method_argument,
    add_model_arguments,
    mark_timing,
    parse_method,
    run_interleaved,
    start_benchmark,
    summarize_method,
    write_runs,
)

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, MachineWatch  # noqa: E402
from specpolicy.analysis.results import PromptResult  # noqa: E402
from specpolicy.analysis.summary import headline  # noqa: E402
from specpolicy.core.accounting import with_pass_accounting  # noqa: E402
from specpolicy.core.latency import load_profile, modeled_speedup  # noqa: E402
from specpolicy.data.datasets import BUNDLED, load_prompts  # noqa: E402

#: The paper's A6000 profiles, in the order of its Table 1 (32B, 14B, 7B targets).
PROFILES = ("a6000-qwen32b", "a6000-qwen14b", "a6000-qwen7b")
PROFILE_TITLES = {
    "a6000-qwen32b": "Qwen2.5-32B-Instruct",
    "a6000-qwen14b": "Qwen2.5-14B-Instruct",
    "a6000-qwen7b": "Qwen2.5-7B-Instruct",
}
ACCOUNTINGS = ("project", "official")
#: The paper's rows, in order: the row's name (the paper's, as in ``benchmarks/results/paper-*``) ->
#: (the ``conf/method/`` preset it runs, its title). Two rows may run one preset under the protocol:
#: Fast-dLLM at the AR drafter's calibrated k, Fast-dLLM+ at its own (``TAKES_K``).
PAPER_ROWS = {
    "ar": ("ar+static-k5", "AR drafter"),
    "fast-dllm": ("fastdllm-default", "Fast-dLLM"),
    "fast-dllm-plus": ("fastdllm-default", "Fast-dLLM+"),
    "failfast": ("fastdllm+failfast", "FailFast"),
    "fail-fast-only": ("fail-fast-only", "Fail fast only (ablation)"),
    "win-big-only": ("win-big-only", "Win big only (ablation)"),
    "eagle3": ("eagle3+static-k5", "EAGLE-3 (chain)"),
    "eagle3-tree": ("eagle3+eagle2-tree-paper", "EAGLE-3 (w/ draft tree)"),
    "dart-tree": ("dart+dart-tree", "DART (w/ draft tree)"),
    "dart-failfast": ("dart+failfast", "DART + FailFast"),
    "falcon-tree": ("falcon+falcon-tree", "Falcon (w/ draft tree)"),
    "deer": ("deer-k32", "DEER (static k = 32)"),
}
#: Table rows, in order: row name -> title.
METHOD_TITLES = {row: title for row, (_, title) in PAPER_ROWS.items()}


def paper_row(row: str) -> MethodSpec:
    """The paper's row ``row`` (``PAPER_ROWS``): its preset, composed by ``parse_method``, under the row's name."""
    return replace(parse_method(PAPER_ROWS[row][0]), name=row)


def _by_name(spec: MethodSpec) -> bool:
    """Whether ``spec`` is a row by name (a preset, or a paper row on its preset): the protocol applies."""
    return spec.given == spec.name or (
        spec.name in PAPER_ROWS and spec.overrides == [f"method={PAPER_ROWS[spec.name][0]}"]
    )


DATASET_TITLES = {"math500": "MATH-500", "aime24": "AIME 2024", "gsm8k": "GSM8K", "humaneval": "HumanEval"}
TRAINING_NOTE = (
    "The bundled model family (10.5M-parameter target, 2.4M-parameter drafters) is trained on "
    "GSM8K only: MATH-500, AIME 2024 and HumanEval are outside its training domain."
)
MEASURED_NOTE = (
    "MEASURED: tokens/s over vanilla decoding's, same process, methods interleaved per prompt "
    "(benchmarks/peers.py's rotation), prefill included."
)
MODELED_NOTE = (
    "MODELED, not measured: forward-pass counts x the paper's vLLM A6000 latencies (drafter pass "
    "6.1 ms; by specpolicy/analysis/gpu_pass_model.py an EAGLE-3 or DART head pass 0.68 / 0.89 / 1.17 ms, "
    "a Falcon pass 1.82 / 2.55 / 2.83 ms, a DEER pass 4.12 ms; target "
    "13.5 / 24.7 / 52.6 ms per token for Qwen2.5-7B / 14B / 32B); 'project' counts "
    "the drafter passes this project ran, 'official' counts them as the official FailFast harness "
    "does (specpolicy/core/accounting.py)."
)


def _k_list(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k-grid must be comma-separated integers >= 1, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"--k-grid must be comma-separated integers >= 1, got {text!r}")
    return ks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/paper_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="gsm8k", help="bundled prompt set: " + ", ".join(BUNDLED))
    p.add_argument("--dataset-path", default=None, help="a JSONL file of prompts instead of the bundled set")
    p.add_argument("--num-prompts", type=int, default=30, help="evaluation prompts (from --offset)")
    p.add_argument("--offset", type=int, default=0, help="first evaluation prompt")
    p.add_argument("--calibration-prompts", type=int, default=5, help="prompts of the best-k calibration slice")
    p.add_argument(
        "--calibration-offset",
        type=int,
        default=None,
        help="first calibration prompt (default: right after the evaluation prompts)",
    )
    p.add_argument(
        "--k-grid",
        type=_k_list,
        default=_k_list("3,4,5,6,8,10,12,16,20"),
        help="static speculation lengths swept in calibration (the paper: 3..20)",
    )
    p.add_argument(
        "--select-by",
        choices=("measured", "modeled"),
        default="measured",
        help="best k by measured speedup, or by modeled speedup under --select-profile",
    )
    p.add_argument("--select-profile", default="a6000-qwen7b", help="profile of --select-by modeled")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--failfast-n", type=int, default=10, help="N")
    p.add_argument("--failfast-tau", type=float, default=0.45, help="τ")
    p.add_argument("--failfast-n-max", type=int, default=60, help="N_max")
    p.add_argument("--fail-fast-only-k", type=int, default=None, help="static k of fail-fast-only (default: N)")
    p.add_argument("--default-threshold", type=float, default=0.9, help="Fast-dLLM's default unmask threshold")
    p.add_argument("--failfast-threshold", type=float, default=0.05, help="FailFast's unmask threshold")
    p.add_argument("--out", default="paper-table", help="output directory")
    add_method_argument(
        p,
        "a row by its conf/method/ preset's name or a paper row's (PAPER_ROWS; under the paper's protocol: the --failfast-* settings, "
        "the thresholds, the calibrated k of " + ", ".join(TAKES_K) + "), or a one-off NAME=drafter=D,policy=P,... "
        "(as given); repeat for several (default: the paper's rows, " + ", ".join(METHOD_TITLES) + ")",
    )
    add_model_arguments(p)
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per method")
    args = p.parse_args(argv)
    for key in ("num_prompts", "calibration_prompts", "max_new_tokens", "failfast_n", "failfast_n_max"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if not 0.0 <= args.failfast_tau <= 1.0:
        p.error(f"--failfast-tau must be in [0, 1], got {args.failfast_tau}")
    if args.failfast_n_max < args.failfast_n:
        p.error(f"--failfast-n-max must be >= --failfast-n ({args.failfast_n}), got {args.failfast_n_max}")
    for key in ("default_threshold", "failfast_threshold"):
        if not 0.0 <= getattr(args, key) <= 1.0:
            p.error(f"--{key.replace('_', '-')} must be in [0, 1], got {getattr(args, key)}")
    args.falcon_skipped = resolve_falcon(args)
    if args.calibration_offset is None:
        args.calibration_offset = args.offset + args.num_prompts
    if args.fail_fast_only_k is None:
        args.fail_fast_only_k = args.failfast_n
    if args.select_profile not in PROFILES and args.select_profile != "measured":
        p.error(f"--select-profile must be one of {', '.join(PROFILES)}, got {args.select_profile!r}")
    # The slices must fit the data set and must not overlap (checked before any model loads).
    if not args.dataset_path and args.dataset not in BUNDLED:
        p.error(f"--dataset must be one of {', '.join(BUNDLED)} (or give --dataset-path), got {args.dataset!r}")
    total = len(load_prompts(args.dataset, args.dataset_path))
    eval_end, cal_end = args.offset + args.num_prompts, args.calibration_offset + args.calibration_prompts
    if eval_end > total or cal_end > total:
        p.error(
            f"--offset/--num-prompts ({args.offset}+{args.num_prompts}) and --calibration-offset/"
            f"--calibration-prompts ({args.calibration_offset}+{args.calibration_prompts}) must fit the "
            f"{total} prompts of {args.dataset}"
        )
    if args.calibration_offset < eval_end and args.offset < cal_end:
        p.error(
            f"the calibration slice [{args.calibration_offset}, {cal_end}) overlaps the evaluation slice "
            f"[{args.offset}, {eval_end})"
        )
    args.rows = args.method or [paper_row(name) for name in METHOD_TITLES]
    presets = [s for s in args.rows if _by_name(s)]  # by name: the protocol applies
    args.presets = {s.name: s for s in presets + [parse_method(n) for n in CALIBRATED.values()]}
    return args


def resolve_falcon(args: argparse.Namespace) -> str | None:
    """Whether ``falcon-tree`` runs: ``--falcon-drafter`` given (anything but the default
    ``falcon-drafter``) is used as given; left at the default, the bundled drafter is used when the
    install's bundle holds it. Returns None when the row runs, else the one-line note of the skipped row."""
    from specpolicy.models.loading import bundled_dir

    if args.falcon_drafter != "falcon-drafter" or (bundled_dir() / "falcon-drafter" / "config.json").is_file():
        return None
    return "falcon-tree skipped: this install's bundle lacks falcon-drafter (pass --falcon-drafter DIR)"


# -- methods -----------------------------------------------------------------------------------------

#: The calibration's static-k sweeps (``--k-grid``): label prefix -> the preset it sweeps.
CALIBRATED = {"ar": "ar+static-k5", "fast-dllm": "fastdllm-default", "eagle3": "eagle3+static-k5"}
#: The rows that take a calibrated k: row -> the calibration prefix whose best k it runs ("Our
#: Fast-dLLM baseline adopts the same speculation length as the AR drafter", App. D.1).
TAKES_K = {"ar": "ar", "fast-dllm": "ar", "fast-dllm-plus": "fast-dllm", "eagle3": "eagle3"}


def _bench(args: argparse.Namespace) -> Bench:
    """``peers.Bench``: the target and the drafters the methods use, loaded on first use (a method
    whose drafter settings differ from its config's, e.g. Fast-dLLM at threshold 0.9, gets its own)."""
    return Bench(SimpleNamespace(**vars(args), reuse_min_match=2))


def drafter_kind(drafter: str | None) -> str | None:
    """The drafter's name in ``drafter=<name>`` (the profiles' ``drafter_pass_ms_by_drafter`` key):
    the bench's two Fast-dLLM drafters are both ``fastdllm``."""
    return None if drafter is None else ("fastdllm" if drafter.startswith("fastdllm") else drafter)


def protocol(spec: MethodSpec, args: argparse.Namespace) -> list[str]:
    """The paper protocol's settings as overrides of a row's preset: the Fast-dLLM drafter's unmask
    threshold (``--failfast-threshold`` where the preset fails fast, at or below 0.5, else
    ``--default-threshold``), FailFast's rule (``--failfast-n`` / ``-tau`` / ``-n-max``; a preset's
    own N, e.g. DART's one pass of 8, is kept, N_max at least N), and the fail-fast-only ablation's
    static k (``--fail-fast-only-k``)."""
    out = []
    if spec.drafter == "fastdllm":
        low = float({**_conf("drafter", "fastdllm"), **spec.drafter_settings}["threshold"]) <= 0.5
        out.append(f"drafter.threshold={args.failfast_threshold if low else args.default_threshold}")
    if spec.policy["name"] == "failfast":
        n = args.failfast_n if spec.policy["n"] == _conf("policy", "failfast")["n"] else int(spec.policy["n"])
        out += [f"policy.n={n}", f"policy.tau={args.failfast_tau}", f"policy.n_max={max(args.failfast_n_max, n)}"]
    if spec.name == "fail-fast-only":
        out.append(f"policy.k={args.fail_fast_only_k}")
    return out


def _row(name: str, args: argparse.Namespace, k: int | None = None, label: str | None = None) -> MethodSpec:
    """Preset ``name`` under the paper's protocol (``protocol``), at static k = ``k`` if given,
    named ``label`` (default: the preset's name)."""
    spec = args.presets[name] if name in args.presets else parse_method(name)
    extra = protocol(spec, args) + ([f"policy.k={k}"] if k is not None else [])
    row = spec.variant(",".join(extra), note="protocol") if extra else spec
    return replace(row, name=label or spec.name)


def _config(spec: MethodSpec, args) -> dict[str, Any]:
    """The summary config of a method's run directory (for ``specpolicy.analysis.paper_figures``)."""
    node = {k: v for k, v in {**_conf("drafter", spec.drafter), **spec.drafter_settings}.items() if k != "model"}
    return {
        "drafter": {**node, "name": spec.drafter},
        "policy": dict(spec.policy),
        "method": {"name": spec.name, "description": spec.description},
        "dataset": {"name": args.dataset, "path": args.dataset_path},
        "generation": {"max_new_tokens": args.max_new_tokens},
        "benchmark": "benchmarks/paper_table.py",
    }


def main_methods(bench: Bench, args, k_ar: int, k_dllm: int, k_eagle3: int) -> tuple[list[Method], dict[str, dict]]:
    """The evaluated methods, vanilla first: the rows (``--method``, default ``METHOD_TITLES``'
    presets) under the paper's protocol, the calibrated rows at their best k; Fast-dLLM+ only when
    its k differs from Fast-dLLM's; falcon-tree only with Falcon weights."""
    best = {"ar": k_ar, "fast-dllm": k_dllm, "eagle3": k_eagle3}
    specs = [
        _row(s.name, args, best[TAKES_K[s.name]] if s.name in TAKES_K else None) if s.name in args.presets else s
        for s in args.rows
        if not (s.drafter == "falcon" and getattr(args, "falcon_skipped", None))
        and not (s.name == "fast-dllm-plus" and k_dllm == k_ar)  # the same method: run once, reported twice
    ]
    methods = [bench.vanilla()] + [bench.added(s) for s in specs]
    return methods, {s.name: _config(s, args) for s in specs}


def calibration_methods(bench: Bench, args) -> tuple[list[Method], dict[str, dict]]:
    """Vanilla and each ``CALIBRATED`` preset at static k over ``--k-grid`` (``<prefix>-k<k>``)."""
    specs = [_row(preset, args, k, f"{prefix}-k{k}") for k in args.k_grid for prefix, preset in CALIBRATED.items()]
    return [bench.vanilla()] + [bench.added(s) for s in specs], {s.name: _config(s, args) for s in specs}


# -- figures -----------------------------------------------------------------------------------------


def method_figures(
    m: Method, results: list[PromptResult], summary: dict[str, Any], drafter: str | None, block_size: int
) -> dict[str, Any]:
    """One method's figures over its prompts: its ``summary.json`` numbers (``summarize``: the
    token-weighted aggregate, speedup and losslessness against vanilla), rounds per prompt, and the
    MODELED speedup under each A6000 profile with both pass accountings."""
    agg = {k: v for k, v in summary["methods"][m.name].items() if k != "acceptance_by_position"}
    figures = headline(summary)
    out: dict[str, Any] = {
        **agg,
        "description": m.description,
        "rounds_per_prompt": agg["rounds"] / len(results) if results else 0.0,
        "speedup_vs_vanilla": figures["speedup_vs_vanilla"],
        "lossless": figures["lossless"],
        "lossless_prompts": sum(r.lossless is True for r in results),
        "not_lossless": summary.get("not_lossless", {}),
    }
    modeled: dict[str, dict[str, float]] = {}
    official_passes = agg["drafter_forward_passes"]
    for accounting in ACCOUNTINGS:
        rounds = with_pass_accounting(
            [(r.speculative.rounds, r.prompt_tokens) for r in results], accounting, drafter or "", block_size
        )
        if accounting == "official":
            official_passes = sum(r.drafter_forward_passes for r in rounds)
        modeled[accounting] = {
            p: (
                modeled_speedup(rounds, agg["generated_tokens"], load_profile(p).for_drafter(drafter))
                if drafter
                else 1.0
            )
            for p in PROFILES
        }
    out["modeled_speedup"] = modeled
    out["drafter_passes_per_round_official"] = official_passes / agg["rounds"] if agg["rounds"] else 0.0
    return out


def stage(
    bench: Bench,
    methods: list[Method],
    prompts,
    prompt_ids: list[torch.Tensor],
    configs: dict[str, dict],
    warmup: int,
    log,
) -> dict[str, Any]:
    """Run ``methods`` interleaved on ``prompt_ids`` (vanilla first in the list) and return each
    method's figures (``method_figures``) and its results and summary (``summaries``, for
    ``write_runs``), speedups measured against vanilla's tokens/s."""
    start = time.perf_counter()
    watch = MachineWatch()  # was the machine busy while it measured? (specpolicy.analysis.machine)
    watch.start()
    run_interleaved(methods, prompt_ids, warmup, log)
    elapsed = time.perf_counter() - start
    block = bench.drafters["fastdllm"].block_size
    figures, summaries = {}, {}
    for m in methods:
        kind = drafter_kind(m.drafter)
        config = configs.get(m.name, {"benchmark": "benchmarks/paper_table.py"})
        results, summary = summarize_method(bench, m, methods[0], prompts, prompt_ids, config, PROFILES[-1])
        summaries[m.name] = (results, summary)
        figures[m.name] = method_figures(m, results, summary, kind, block)
    conditions = mark_timing(summaries, watch, log)
    return {"seconds": elapsed, "methods": figures, "summaries": summaries, "timing_conditions": conditions}


def best_k(figures: dict[str, Any], prefix: str, grid: list[int], select_by: str, profile: str) -> int:
    """The k of ``<prefix>-k<k>`` with the highest measured (or modeled, project accounting) speedup."""

    def score(k):
        f = figures[f"{prefix}-k{k}"]
        return f["speedup_vs_vanilla"] if select_by == "measured" else f["modeled_speedup"]["project"][profile]

    return max(grid, key=score)


# -- tables ------------------------------------------------------------------------------------------


def _fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def table1_rows(results: list[dict[str, Any]]) -> list[tuple[str, str, list[str], str]]:
    """Rows ``(section, method title, one cell per data set, average cell)`` of Table 1."""
    sections = [("Measured on this machine", lambda f: f["speedup_vs_vanilla"])]
    for accounting in ACCOUNTINGS:
        for p in PROFILES:
            sections.append(
                (
                    f"MODELED, A6000 profile, target {PROFILE_TITLES[p]} ({accounting} pass accounting)",
                    lambda f, a=accounting, p=p: f["modeled_speedup"][a][p],
                )
            )
    rows = []
    for title, value in sections:
        for key, method_title in _present(results):
            vals = [value(r["methods"][key]) if key in r["methods"] else None for r in results]
            rows.append(
                (title, method_title, [_fmt_x(v) for v in vals], _fmt_x(_mean([v for v in vals if v is not None])))
            )
    return rows


def _present(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(key, title)`` of the rows any of ``results`` has (runs made before a row existed lack it):
    the paper's rows in its order, then any other (``--method``) under its own name."""
    names = [n for r in results for n in r["methods"] if n != "vanilla"]
    titles = {**METHOD_TITLES, **{n: n for n in names if n not in METHOD_TITLES}}
    return [(k, t) for k, t in titles.items() if k in names]


APPENDIX_B_METRICS = (
    (
        "Acceptance Rate",
        lambda f: f"{100 * f['acceptance_rate']:.1f}%",
        lambda fs: f"{100 * _mean([f['acceptance_rate'] for f in fs]):.1f}%",
    ),
    (
        "Avg (Acc./Spec.) Len",
        lambda f: f"{f['mean_accepted_length']:.1f} / {f['mean_speculation_length_drafted']:.1f}",
        lambda fs: (
            f"{_mean([f['mean_accepted_length'] for f in fs]):.1f} / "
            f"{_mean([f['mean_speculation_length_drafted'] for f in fs]):.1f}"
        ),
    ),
    ("Max (Acc./Spec.) Len", lambda f: f"{f['max_accepted_length']} / {f['max_speculation_length']}", lambda fs: "-"),
    (
        "Num Speculation Rounds (per prompt)",
        lambda f: f"{f['rounds_per_prompt']:.1f}",
        lambda fs: f"{_mean([f['rounds_per_prompt'] for f in fs]):.1f}",
    ),
    (
        "Avg Drafter Passes / Round",
        lambda f: f"{f['drafter_passes_per_round']:.1f}",
        lambda fs: f"{_mean([f['drafter_passes_per_round'] for f in fs]):.1f}",
    ),
    (
        "Avg Drafter Passes / Round (official accounting)",
        lambda f: f"{f['drafter_passes_per_round_official']:.1f}",
        lambda fs: f"{_mean([f['drafter_passes_per_round_official'] for f in fs]):.1f}",
    ),
    ("Lossless prompts", lambda f: f["lossless"], lambda fs: "-"),
)


def appendix_b_rows(results: list[dict[str, Any]]) -> list[tuple[str, str, list[str], str]]:
    """Rows ``(method title, metric, one cell per data set, average cell)`` of App. B."""
    rows = []
    for key, method_title in _present(results):
        figures = [r["methods"].get(key) for r in results]
        present = [f for f in figures if f is not None]
        for metric, cell, average in APPENDIX_B_METRICS:
            rows.append((method_title, metric, ["-" if f is None else cell(f) for f in figures], average(present)))
    return rows


def _notes(results: list[dict[str, Any]]) -> list[str]:
    notes = [TRAINING_NOTE]
    for r in results:
        s, c = r["settings"], r["calibration"]
        notes.append(
            f"{DATASET_TITLES.get(s['dataset'], s['dataset'])}: {s['num_prompts']} prompts (from {s['offset']}) x "
            f"{s['max_new_tokens']} new tokens, {s['device']} {s['dtype']}; calibration on {s['calibration_prompts']} "
            f"other prompt{'s' if s['calibration_prompts'] != 1 else ''} (from {s['calibration_offset']}), k grid {','.join(map(str, s['k_grid']))}, best by "
            f"{s['select_by']} speedup: AR / Fast-dLLM k = {c['k_ar']}, Fast-dLLM+ k = {c['k_dllm']}"
            + (f", EAGLE-3 k = {c['k_eagle3']}" if "k_eagle3" in c else "")
            + "; every method "
            f"lossless on {min(f['lossless_prompts'] for f in r['methods'].values())}/{s['num_prompts']} prompts."
        )
        notes.extend(r.get("skipped", {}).values())
        untrusted = [
            stage for stage, cond in (r.get("timing_conditions") or {}).items() if not cond.get("timing_trusted", True)
        ]
        if untrusted:
            notes.append(
                f"{UNTRUSTED_MARK} {DATASET_TITLES.get(s['dataset'], s['dataset'])} ({', '.join(untrusted)}): "
                f"{UNTRUSTED_NOTE}: {'; '.join(w for st in untrusted for w in r['timing_conditions'][st]['timing_warnings'])}"
            )
    return notes


def _markdown(
    title: str, notes: list[str], header: list[str], rows: list[list[str]], align: int, section_col: bool
) -> str:
    """A Markdown table; with ``section_col`` the first cell of each row names its section, written
    as a bold row where it changes (the paper's "Target Model: ..." rows)."""
    lines = [f"# {title}", ""] + [f"- {n}" for n in notes] + [""]
    cols = header
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join(["---"] * align + ["---:"] * (len(cols) - align)) + "|")
    section = None
    for row in rows:
        if section_col:
            if row[0] != section:
                section = row[0]
                lines.append(f"| **{section}** |" + " |" * (len(cols) - 1))
            row = row[1:]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_tables(results: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    """``table1.md/csv`` and ``appendix_b.md/csv`` for ``results`` (one per data set, in column order)."""
    out.mkdir(parents=True, exist_ok=True)
    datasets = [DATASET_TITLES.get(r["settings"]["dataset"], r["settings"]["dataset"]) for r in results]
    several = len(results) > 1  # an Average column across data sets, as the paper's
    notes = _notes(results)
    t1 = table1_rows(results)
    files = {
        "table1.md": out / "table1.md",
        "table1.csv": out / "table1.csv",
        "appendix_b.md": out / "appendix_b.md",
        "appendix_b.csv": out / "appendix_b.csv",
    }
    files["table1.md"].write_text(
        _markdown(
            "Table 1: speedup over vanilla decoding (FailFast arXiv 2512.20573 layout)",
            notes + [MEASURED_NOTE, MODELED_NOTE],
            ["Drafting method", *datasets] + ["Average"] * several,
            [[s, m, *cells] + [avg] * several for s, m, cells, avg in t1],
            1,
            True,
        )
    )
    with open(files["table1.csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["section", "method", *datasets] + ["average"] * several)
        w.writerows([[s, m, *cells] + [avg] * several for s, m, cells, avg in t1])
    ab = appendix_b_rows(results)
    md_rows, last = [], None
    for method, metric, cells, avg in ab:
        md_rows.append([method if method != last else "", metric, *cells] + [avg] * several)
        last = method
    files["appendix_b.md"].write_text(
        _markdown(
            "Appendix B: detailed comparison (FailFast arXiv 2512.20573 layout)",
            notes
            + [
                "Acceptance rate = accepted / drafted tokens (bonus excluded); lengths are means per drafted round "
                "(accepted without the bonus token); rounds are per prompt; drafter passes per round with this "
                "project's accounting and with the official harness's."
            ],
            ["Drafting method", "Metric", *datasets] + ["Average"] * several,
            md_rows,
            2,
            False,
        )
    )
    with open(files["appendix_b.csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["method", "metric", *datasets] + ["average"] * several)
        w.writerows([[m, metric, *cells] + [avg] * several for m, metric, cells, avg in ab])
    return files


def write_calibration(result: dict[str, Any], out: Path) -> Path:
    """``calibration.md``: every grid point's measured and modeled (7B, project) speedup."""
    s, figs = result["settings"], result["calibration"]["methods"]
    lines = [
        "# Calibration: static k sweeps (best-k selection)",
        "",
        f"- {s['calibration_prompts']} prompts of {s['dataset']} from {s['calibration_offset']} (not evaluated), "
        f"best by {s['select_by']} speedup.",
        f"- {MEASURED_NOTE}",
        "",
        "| k | AR: measured | AR: MODELED 7B | AR: acc. rate | Fast-dLLM (0.9): measured | "
        "Fast-dLLM: MODELED 7B | Fast-dLLM: acc. rate | Fast-dLLM: passes/round |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in s["k_grid"]:
        a, d = figs[f"ar-k{k}"], figs[f"fast-dllm-k{k}"]
        lines.append(
            f"| {k} | {a['speedup_vs_vanilla']:.2f}x | {a['modeled_speedup']['project']['a6000-qwen7b']:.2f}x"
            f" | {a['acceptance_rate']:.3f} | {d['speedup_vs_vanilla']:.2f}x | "
            f"{d['modeled_speedup']['project']['a6000-qwen7b']:.2f}x | {d['acceptance_rate']:.3f} | "
            f"{d['drafter_passes_per_round']:.2f} |"
        )
    path = out / "calibration.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# -- commands ----------------------------------------------------------------------------------------


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    log = start_benchmark(args.threads)
    out = Path(args.out)
    bench = _bench(args)
    evaluation = load_prompts(args.dataset, args.dataset_path, args.num_prompts, args.offset)
    calibration = load_prompts(args.dataset, args.dataset_path, args.calibration_prompts, args.calibration_offset)
    eval_ids = [p.token_ids(bench.tokenizer) for p in evaluation]
    cal_ids = [p.token_ids(bench.tokenizer) for p in calibration]

    log(f"calibration: {len(args.k_grid)} k x 3 drafters + vanilla on {len(cal_ids)} prompts ...")
    cal_methods, cal_configs = calibration_methods(bench, args)
    cal = stage(bench, cal_methods, calibration, cal_ids, cal_configs, args.warmup, log)
    k_ar = best_k(cal["methods"], "ar", args.k_grid, args.select_by, args.select_profile)
    k_dllm = best_k(cal["methods"], "fast-dllm", args.k_grid, args.select_by, args.select_profile)
    k_eagle3 = best_k(cal["methods"], "eagle3", args.k_grid, args.select_by, args.select_profile)
    log(f"  best k: AR drafter (and Fast-dLLM) {k_ar}, Fast-dLLM+ {k_dllm}, EAGLE-3 {k_eagle3}")

    methods, configs = main_methods(bench, args, k_ar, k_dllm, k_eagle3)
    log(f"evaluation: {len(methods)} methods x {len(eval_ids)} prompts ...")
    main = stage(bench, methods, evaluation, eval_ids, configs, args.warmup, log)
    if "fast-dllm-plus" not in main["methods"]:
        main["methods"]["fast-dllm-plus"] = {
            **main["methods"]["fast-dllm"],
            "description": main["methods"]["fast-dllm"]["description"] + " (Fast-dLLM+ = Fast-dLLM: same best k)",
        }
    settings = {k: v for k, v in vars(args).items() if k not in ("method", "rows", "presets")}
    settings["method"] = [s.given for s in args.rows]
    settings.update(
        device=str(bench.runtime.torch_device),
        dtype=str(bench.runtime.torch_dtype).removeprefix("torch."),
        torch_threads=torch.get_num_threads(),
        evaluation_prompt_ids=[p.prompt_id for p in evaluation],
        calibration_prompt_ids=[p.prompt_id for p in calibration],
    )
    result = {
        "settings": settings,
        "calibration": {
            "k_ar": k_ar,
            "k_dllm": k_dllm,
            "k_eagle3": k_eagle3,
            "seconds": cal["seconds"],
            "methods": cal["methods"],
        },
        "seconds": main["seconds"],
        "methods": main["methods"],
        "timing_conditions": {"calibration": cal["timing_conditions"], "evaluation": main["timing_conditions"]},
        "labels": {"measured": MEASURED_NOTE, "modeled": MODELED_NOTE, "training": TRAINING_NOTE},
        "skipped": {"falcon-tree": args.falcon_skipped} if args.falcon_skipped else {},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    files = write_tables([result], out)
    write_calibration(result, out)
    write_runs(out / "runs", main["summaries"])
    write_runs(out / "calibration-runs", cal["summaries"])
    print(files["table1.md"].read_text())
    print(files["appendix_b.md"].read_text())
    log(f"wrote {out}/ (table1, appendix_b, calibration, results.json, runs/, calibration-runs/)")
    return result


def combine(argv: list[str]) -> list[Path]:
    p = argparse.ArgumentParser(
        prog="benchmarks/paper_table.py combine",
        description="The per-data-set tables side by side (the paper's layout).",
    )
    p.add_argument("dirs", nargs="+", help="output directories of per-data-set runs, in column order")
    p.add_argument("--out", required=True, help="directory for table1.md/csv and appendix_b.md/csv")
    args = p.parse_args(argv)
    results = []
    for d in args.dirs:
        file = Path(d) / "results.json"
        if not file.is_file():
            p.error(f"{file} does not exist (run benchmarks/paper_table.py --out {d} first)")
        results.append(json.loads(file.read_text()))
    files = write_tables(results, Path(args.out))
    print(files["table1.md"].read_text())
    print(files["appendix_b.md"].read_text())
    return list(files.values())


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "combine":
        return combine(argv[1:])
    return run(argv)


if __name__ == "__main__":
    main()
