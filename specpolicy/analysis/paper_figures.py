"""The FailFast paper's analysis figures (arXiv 2512.20573), from run or sweep directories:

    python -m specpolicy.analysis.paper_figures concavity multirun/concavity/<date> multirun/static-k-ar/<date>
    python -m specpolicy.analysis.paper_figures easy-regions <AR run per data set> ...
    python -m specpolicy.analysis.paper_figures reliability <run dir>
    python -m specpolicy.analysis.paper_figures sensitivity --tau multirun/tau-sensitivity/<date> \\
        --nmax multirun/nmax-sensitivity/<date>

Each subcommand reads every run under its directories (``specpolicy.analysis.results``: a directory holding
``results.jsonl`` and ``summary.json``: a single run, the jobs of a Hydra multirun, or the ``runs/`` of
``benchmarks/paper_table.py`` / ``benchmarks/peers.py``) and writes a PNG into ``--out`` (default:
``<first directory>/plots``):

* ``concavity.png`` (Fig. 2) -- acceptance rate and MODELED speedup against drafter forward passes
  per draft, for static drafts of several lengths k: the AR drafter (one pass per token) and the
  Fast-dLLM drafter at several unmask thresholds (more compute per draft at higher thresholds).
  Figures per run from its rounds: acceptance rate (``metrics.aggregate``), passes per drafted round,
  modeled speedup (``latency.modeled_speedup``, ``--profile``).
* ``easy_regions.png`` (Fig. 4 and 5) -- tokens of an AR-drafter run classed easy (an accepted draft
  token, or the bonus token of a fully accepted draft) or hard (the correction token after a
  rejection, or a token decoded without a draft), for the first prompts; and per run (data set) the
  fraction of tokens lying in a run of at least n consecutive easy tokens, against n.
* ``reliability.png`` -- drafter confidence as a signal of acceptance: per draft position (groups),
  the acceptance rate of draft tokens whose earlier tokens were all accepted, in 10 confidence bins,
  against the mean confidence of the bin, with the expected calibration error (ECE) and τ marked.
* ``sensitivity.png`` (App. C) -- measured and MODELED speedup over vanilla against τ and against
  N_max (the ``tau-sensitivity`` and ``nmax-sensitivity`` presets).

Uses matplotlib's Agg backend (``pip install matplotlib``, part of ``specpolicy[test]``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpolicy.analysis.machine import UNTRUSTED_MARK, timing_trusted
from specpolicy.analysis.metrics import aggregate, observed
from specpolicy.analysis.plot import UNTRUSTED_COLOR, line_styles, text_width_in, untrusted_figure_note
from specpolicy.analysis.results import RESULTS_FILE, Run as RunData, find_runs, read_run, told_apart
from specpolicy.core.latency import load_profile, modeled_speedup
from specpolicy.core.types import RoundRecord

#: Draft position groups of the reliability diagram: (first, last) 1-based positions, last None = open.
POSITION_GROUPS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 10), (11, None))
EASY, HARD = "#55a868", "#c44e52"


def load(paths: Sequence[str | Path]) -> list[RunData]:
    """Every run under ``paths`` (``specpolicy.analysis.results.find_runs``: directories holding
    ``results.jsonl``, read with ``read_run``), in path order.

    Raises:
        FileNotFoundError: naming the path when one holds no ``results.jsonl``.
    """
    runs = []
    for path in paths:
        dirs = find_runs(path)
        if not dirs:
            raise FileNotFoundError(f"no {RESULTS_FILE} under {path}")
        runs.extend(read_run(d) for d in dirs)
    return runs


# -- data ------------------------------------------------------------------------------------------


def concavity_points(runs: Sequence[RunData], profile: str = "a6000-qwen7b") -> list[dict[str, Any]]:
    """One point per static-length run: ``{"drafter", "threshold", "k", "passes_per_draft",
    "acceptance_rate", "modeled_speedup", "run"}``; runs of other policies are skipped.

    ``passes_per_draft`` = drafter passes / rounds with a draft; ``modeled_speedup`` = MODELED
    speedup over vanilla under ``profile`` (project pass accounting)."""
    prof = load_profile(profile)
    points = []
    for run in runs:
        if run.setting("policy.name") != "static" or not run.results:
            continue
        agg = aggregate([res.speculative for res in run.results])
        rounds = run.rounds
        points.append(
            {
                "drafter": run.setting("drafter.name", "?"),
                "threshold": run.setting("drafter.threshold"),
                "k": int(run.setting("policy.k", 0)),
                "passes_per_draft": agg["drafter_forward_passes"] / agg["drafted_rounds"]
                if agg["drafted_rounds"]
                else 0.0,
                "acceptance_rate": agg["acceptance_rate"],
                "modeled_speedup": modeled_speedup(rounds, agg["generated_tokens"], prof),
                "run": str(run.directory),
            }
        )
    return points


def token_classes(rounds: Sequence[RoundRecord]) -> list[bool]:
    """Per output token of one prompt (its rounds, in order): True = easy (an accepted draft token,
    or the bonus token after a fully accepted draft), False = hard (the correction after a
    rejection, or a token of a round without a draft). FailFast §3.2, Fig. 4."""
    out: list[bool] = []
    for r in rounds:
        k, a, emitted = r.speculation_length, r.accepted_length, r.emitted_tokens
        flags = [True] * min(a, emitted)
        if emitted > a:
            flags.append(k > 0 and a == k)  # bonus (easy) or correction / plain decoding (hard)
        out.extend(flags)
    return out


def easy_run_fraction(classes: Sequence[Sequence[bool]], ns: Sequence[int]) -> list[float]:
    """For each n: the fraction of all tokens (pooled over prompts) lying in a run of at least n
    consecutive easy tokens (FailFast Fig. 5)."""
    runs: list[int] = []  # lengths of maximal easy runs
    total = 0
    for flags in classes:
        total += len(flags)
        length = 0
        for easy in list(flags) + [False]:
            if easy:
                length += 1
            elif length:
                runs.append(length)
                length = 0
    return [sum(x for x in runs if x >= n) / total if total else 0.0 for n in ns]


def reliability(
    rounds: Sequence[RoundRecord], groups: Sequence[tuple[int, int | None]] = POSITION_GROUPS, bins: int = 10
) -> list[dict[str, Any]]:
    """Reliability of drafter confidence per draft-position group.

    A draft token at position i (1-based) counts when every earlier token of its draft was
    accepted and the position was observed (``metrics.observed``); its outcome is accepted or
    not. Per group: ``{"label", "n", "ece", "bins": [{"lo", "hi", "n", "confidence", "accuracy"}]}``
    (equal-width bins on [0, 1]; ``confidence`` / ``accuracy`` = means in the bin, None when empty),
    ``ece`` = sum over bins of n_bin / n x |accuracy - confidence| (expected calibration error).
    The last entry pools every position ("all")."""
    pairs: list[tuple[int, float, bool]] = []  # (position, confidence, accepted)
    for r in rounds:
        confs = r.confidences
        k, a = observed(r)
        for i in range(min(k, len(confs), a + 1)):  # positions 1..a+1: reached with all earlier accepted
            pairs.append((i + 1, float(confs[i]), i < a))
    out = []
    labelled = [
        (f"position {lo}" if lo == hi else f"positions {lo}-{hi}" if hi else f"positions {lo}+", lo, hi)
        for lo, hi in groups
    ] + [("all positions", 1, None)]
    for label, lo, hi in labelled:
        sel = [(c, ok) for p, c, ok in pairs if p >= lo and (hi is None or p <= hi)]
        cells = []
        for b in range(bins):
            left, right = b / bins, (b + 1) / bins
            inside = [(c, ok) for c, ok in sel if left <= c < right or (b == bins - 1 and c == 1.0)]
            cells.append(
                {
                    "lo": left,
                    "hi": right,
                    "n": len(inside),
                    "confidence": sum(c for c, _ in inside) / len(inside) if inside else None,
                    "accuracy": sum(ok for _, ok in inside) / len(inside) if inside else None,
                }
            )
        ece = sum(c["n"] / len(sel) * abs(c["accuracy"] - c["confidence"]) for c in cells if c["n"]) if sel else 0.0
        out.append({"label": label, "n": len(sel), "ece": ece, "bins": cells})
    return out


def sensitivity_points(runs: Sequence[RunData], key: str) -> list[dict[str, Any]]:
    """``{"x", "measured", "modeled", "profile", "trusted"}`` per run, sorted by x = the config
    value ``key`` (e.g. ``policy.tau``); runs without ``key`` are skipped. Speedups from the run's
    summary; ``trusted`` False when the run recorded that its timings cannot be trusted
    (``specpolicy.analysis.machine.timing_trusted``)."""
    points = []
    for run in runs:
        x = run.setting(key)
        if x is None or "speedup_vs_vanilla" not in run.summary:
            continue
        points.append(
            {
                "x": float(x),
                "measured": run.summary.get("speedup_vs_vanilla"),
                "modeled": run.summary.get("modeled_speedup_vs_vanilla"),
                "profile": run.summary.get("modeled_profile", ""),
                "trusted": timing_trusted(run.summary) is not False,
            }
        )
    return sorted(points, key=lambda p: p["x"])


# -- figures ---------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_concavity(points: Sequence[dict[str, Any]], path: str | Path, profile: str) -> Path:
    """Fig. 2: acceptance rate (left) and MODELED speedup (right) against passes per draft."""
    plt = _pyplot()
    import matplotlib
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.6))
    ar = sorted((p for p in points if p["drafter"] == "ar"), key=lambda p: p["k"])
    dl = [p for p in points if p["drafter"] != "ar"]
    ks = sorted({p["k"] for p in dl})
    thresholds = sorted({p["threshold"] for p in dl if p["threshold"] is not None})
    colors = matplotlib.colormaps["viridis"]
    markers = "os^Dv<>ph*"
    for ax, metric, title in (
        (axes[0], "acceptance_rate", "acceptance rate"),
        (axes[1], "modeled_speedup", f"MODELED speedup over vanilla ({profile})"),
    ):
        if ar:
            ax.plot(
                [p["passes_per_draft"] for p in ar],
                [p[metric] for p in ar],
                "-",
                color="black",
                marker="x",
                label="AR drafter (one pass per token; points: k)",
            )
            for p in ar:
                ax.annotate(
                    f"k={p['k']}",
                    (p["passes_per_draft"], p[metric]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                )
        for i, k in enumerate(ks):
            line = sorted((p for p in dl if p["k"] == k), key=lambda p: p["passes_per_draft"])
            color = colors(i / max(len(ks) - 1, 1) * 0.85)
            ax.plot(
                [p["passes_per_draft"] for p in line],
                [p[metric] for p in line],
                "-",
                color=color,
                alpha=0.8,
                label=f"Fast-dLLM drafter, k = {k}",
            )
            for p in line:
                m = markers[thresholds.index(p["threshold"]) % len(markers)] if p["threshold"] in thresholds else "o"
                ax.plot(p["passes_per_draft"], p[metric], m, color=color, markersize=7)
        ax.set_xlabel("drafter forward passes per draft (log scale)")
        ax.set_ylabel(title)
        ax.set_xscale("log")
        top = max(p["passes_per_draft"] for p in points) if points else 1.0
        ax.set_xticks([t for t in (0.5, 1, 2, 4, 8, 16, 32, 64, 128) if t <= top * 1.5])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        if metric == "modeled_speedup":
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    handles, labels = axes[0].get_legend_handles_labels()
    for t in thresholds:
        handles.append(plt.Line2D([], [], ls="", marker=markers[thresholds.index(t) % len(markers)], color="grey"))
        labels.append(f"unmask threshold {t}")
    rows = (len(labels) + 3) // 4
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("Concavity (FailFast Fig. 2): more drafter compute per draft, diminishing acceptance gains")
    fig.tight_layout(rect=(0, 0.035 * rows + 0.01, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_easy_regions(runs: Sequence[RunData], path: str | Path, max_prompts: int = 5, max_n: int = 60) -> Path:
    """Fig. 4 (top: easy/hard tokens of the first prompts of the first run) and Fig. 5 (bottom:
    fraction of tokens in easy runs of length >= n, one line per run)."""
    plt = _pyplot()
    import numpy as np
    from matplotlib.colors import ListedColormap

    labels = [
        f"{name} ({len(run.results)} prompts)" for name, run in zip(told_apart([_label(r) for r in runs], runs), runs)
    ]
    # the panels keep their size; the legend goes below them, in as many columns as fit (many runs)
    columns = max(1, int(11.5 // (text_width_in(labels) + 0.7)))
    rows = -(-len(labels) // columns)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7.4 + 0.17 * rows), layout="constrained")
    first = runs[0]
    classes = [token_classes(res.speculative.rounds) for res in first.results[:max_prompts]]
    width = max((len(c) for c in classes), default=1)
    grid = np.full((len(classes), width), np.nan)
    for i, flags in enumerate(classes):
        grid[i, : len(flags)] = [1.0 if f else 0.0 for f in flags]
    top.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap([HARD, EASY]), vmin=0, vmax=1)
    top.set_yticks(range(len(classes)))
    top.set_yticklabels([res.prompt_id for res in first.results[:max_prompts]], fontsize=8)
    top.set_xlabel("output token")
    top.set_title(
        f"Fig. 4: easy (green: accepted, or the bonus token) and hard (red: corrected) tokens, {_label(first)}",
        fontsize=10,
    )
    ns = list(range(1, max_n + 1))
    for run, label, style in zip(runs, labels, line_styles(len(runs))):
        fractions = easy_run_fraction([token_classes(res.speculative.rounds) for res in run.results], ns)
        bottom.plot(ns, fractions, label=label, **style)
    for n in (10, 50):
        if n <= max_n:
            bottom.axvline(n, color="grey", lw=0.8, ls=":")
    bottom.set_xlabel("n (consecutive easy tokens)")
    bottom.set_ylabel("fraction of tokens in an easy run of length >= n")
    bottom.set_ylim(0, 1)
    bottom.grid(alpha=0.3)
    fig.legend(*bottom.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncol=columns, frameon=False)
    bottom.set_title("Fig. 5: easy regions per data set (AR drafter runs)", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_reliability(run: RunData, path: str | Path, tau: float | None = None) -> Path:
    """Reliability diagram per draft-position group (one panel each, then all positions pooled),
    and a last panel with the ECE and the acceptance rate per single draft position."""
    plt = _pyplot()
    groups = reliability(run.rounds)
    per_position = reliability(run.rounds, groups=[(i, i) for i in range(1, 21)])[:-1]
    cols = 4
    rows = (len(groups) + 1 + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.7 * rows + 0.8), squeeze=False)
    tau = tau if tau is not None else run.setting("policy.tau")
    for ax, g in zip(axes.flat, groups):
        filled = [b for b in g["bins"] if b["n"]]
        ax.bar(
            [(b["lo"] + b["hi"]) / 2 for b in filled],
            [b["accuracy"] for b in filled],
            width=0.095,
            color="#4c72b0",
            alpha=0.75,
            label="acceptance rate in the bin",
        )
        ax.plot(
            [b["confidence"] for b in filled],
            [b["accuracy"] for b in filled],
            "o",
            color="#dd8452",
            markersize=4,
            label="(mean confidence, acceptance rate)",
        )
        for b in filled:  # tokens per bin, small, along the bottom
            ax.text(
                (b["lo"] + b["hi"]) / 2,
                0.015,
                str(b["n"]),
                ha="center",
                va="bottom",
                fontsize=6,
                color="white" if b["accuracy"] > 0.06 else "black",
            )
        ax.plot([0, 1], [0, 1], "--", color="grey", lw=0.8, label="perfect calibration")
        if tau is not None:
            ax.axvline(float(tau), color="#c44e52", lw=0.9, ls=":", label=f"τ = {tau}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{g['label']}: ECE {g['ece']:.3f} (n = {g['n']})", fontsize=9)
        ax.set_xlabel("drafter confidence", fontsize=8)
        ax.set_ylabel("accepted (rate)", fontsize=8)
        ax.tick_params(labelsize=7)
    ax = list(axes.flat)[len(groups)]
    seen = [g for g in per_position if g["n"] >= 10]  # sparse positions say nothing
    xs = [int(g["label"].split()[-1]) for g in seen]
    ax.plot(xs, [g["ece"] for g in seen], "o-", color="#c44e52", label="ECE")
    ax.plot(
        xs,
        [sum(b["n"] * b["accuracy"] for b in g["bins"] if b["n"]) / g["n"] for g in seen],
        "s-",
        color="#4c72b0",
        label="acceptance rate",
    )
    ax.plot(
        xs,
        [sum(b["n"] * b["confidence"] for b in g["bins"] if b["n"]) / g["n"] for g in seen],
        "^-",
        color="#dd8452",
        label="mean confidence",
    )
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position", fontsize=8)
    ax.set_title("by draft position (positions with >= 10 tokens)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups) + 1 :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        f"Confidence as a signal: P(draft token accepted | earlier tokens accepted, confidence), "
        f"{_label(run)}; numbers: tokens per bin",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_sensitivity(panels: Sequence[tuple[str, list[dict[str, Any]]]], path: str | Path) -> Path:
    """App. C: measured and MODELED speedup against each swept parameter (one panel each). A
    measured point whose timings cannot be trusted is circled and marked, with a note under the
    figure."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    untrusted = sum(not p.get("trusted", True) for _, points in panels for p in points)
    for ax, (name, points) in zip(axes.flat, panels):
        xs = [p["x"] for p in points]
        ax.plot(xs, [p["measured"] for p in points], "o-", color="#4c72b0", label="measured (this machine)")
        bad = [p for p in points if not p.get("trusted", True)]
        if bad:
            ax.plot(
                [p["x"] for p in bad],
                [p["measured"] for p in bad],
                "o",
                ms=13,
                mfc="none",
                mew=1.6,
                color=UNTRUSTED_COLOR,
                label=f"{UNTRUSTED_MARK} measured, timing cannot be trusted",
            )
        if any(p["modeled"] is not None for p in points):
            ax.plot(
                xs, [p["modeled"] for p in points], "s--", color="#dd8452", label=f"MODELED ({points[0]['profile']})"
            )
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(name)
        ax.set_ylabel("speedup over vanilla")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"speedup vs {name} (FailFast App. C)", fontsize=10)
    note = untrusted_figure_note(untrusted, "points", width=int(14 * 6.2 * len(panels)))
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, color=UNTRUSTED_COLOR, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.035 * (note.count("\n") + 1) + 0.01 if note else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _label(run: RunData) -> str:
    name = run.setting("dataset.name") or run.directory.name
    drafter = run.setting("drafter.name")
    return f"{name}" + (f" ({drafter} drafter)" if drafter else "")


# -- CLI -------------------------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose user errors are one line, ``error: <prog>: <message>`` (status 2), not
    the usage block and the message (its subcommands' parsers are of this class too)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"error: {self.prog}: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.analysis.paper_figures FIGURE ...``: write one of the paper's figures (see the
    module docstring). Returns the exit status: 0, or 2 for a directory without runs.

    Raises:
        SystemExit: status 2 with one line naming the option, for a command-line error.
    """
    p = OneLineParser(prog="python -m specpolicy.analysis.paper_figures", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="figure", required=True)
    for name, help_ in (
        ("concavity", "Fig. 2 from static-k runs (AR and Fast-dLLM at several thresholds)"),
        ("easy-regions", "Fig. 4/5 from AR-drafter runs (one per data set)"),
        ("reliability", "confidence reliability diagram of one run"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("dirs", nargs="+", help="run or sweep directories")
        s.add_argument("--out", default=None, help="output directory (default: <first dir>/plots)")
        s.add_argument("--profile", default="a6000-qwen7b", help="latency profile of MODELED figures")
    s = sub.add_parser("sensitivity", help="App. C from the tau-sensitivity / nmax-sensitivity presets")
    s.add_argument("--tau", default=None, metavar="DIR", help="a tau-sensitivity sweep directory")
    s.add_argument("--nmax", default=None, metavar="DIR", help="an nmax-sensitivity sweep directory")
    s.add_argument("--out", default=None, help="output directory (default: <first dir>/plots)")
    s.add_argument("bare", nargs="*", help=argparse.SUPPRESS)  # a directory without its option: named below
    args = p.parse_args(argv)
    try:
        if args.figure == "sensitivity":
            need = "--tau DIR (a tau-sensitivity sweep) and/or --nmax DIR (an nmax-sensitivity sweep)"
            if args.bare:
                s.error(
                    f"the sweep directories are given as {need}, got {' '.join(args.bare)} without an option "
                    f"(e.g. sensitivity --tau {args.bare[0]})"
                )
            if not (args.tau or args.nmax):
                s.error(f"needs {need}")
            panels = []
            for key, name, d in (("policy.tau", "τ", args.tau), ("policy.n_max", "N_max", args.nmax)):
                if d:
                    points = sensitivity_points(load([d]), key)
                    if not points:
                        s.error(f"no run with {key} and a measured speedup under {d}")
                    panels.append((name, points))
            out = Path(args.out or Path(args.tau or args.nmax) / "plots")
            out.mkdir(parents=True, exist_ok=True)
            written = plot_sensitivity(panels, out / "sensitivity.png")
        else:
            runs = load(args.dirs)
            out = Path(args.out or Path(args.dirs[0]) / "plots")
            out.mkdir(parents=True, exist_ok=True)
            if args.figure == "concavity":
                points = concavity_points(runs, args.profile)
                if not points:
                    p.error("concavity needs static-k runs (policy.name = static) under the given directories")
                written = plot_concavity(points, out / "concavity.png", args.profile)
                (out / "concavity.json").write_text(json.dumps(points, indent=2))
            elif args.figure == "easy-regions":
                written = plot_easy_regions(runs, out / "easy_regions.png")
            else:
                written = plot_reliability(runs[0], out / "reliability.png")
                (out / "reliability.json").write_text(json.dumps(reliability(runs[0].rounds), indent=2))
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
