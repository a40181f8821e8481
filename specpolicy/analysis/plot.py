"""The paper's figures for any run: ``python -m specpolicy.analysis.plot <run dir | multirun dir> [--out DIR]``.

Reads every run under the directory (``specpolicy.analysis.results.load_runs``: a directory holding
``results.jsonl``, with its ``summary.json`` when present: a single run, each job of a Hydra
multirun, or each method of ``benchmarks/peers.py --runs-dir``) and writes, into ``DIR``
(default ``<dir>/plots``):

* ``length_cdf.png`` -- CDF of accepted and of speculated lengths per round, one line per
  method (FailFast, arXiv 2512.20573, Fig. 8);
* ``latency_breakdown.png`` -- milliseconds per generated token split into drafting,
  verification and the rest (prefill, loop), per method, vanilla decoding first (Fig. 6);
* ``serving.png`` -- (when runs are batched: ``generation.batch_size`` sweeps) throughput and
  p99 latency against batch size, one line per method, vanilla decoding its own line
  (``specpolicy.analysis.report_serving.serving_rows``, the report's serving table, also on ``index.html``);
* ``acceptance_<method>.png`` -- per round of the first prompts: speculated and accepted
  lengths (bars) and the acceptance rate of the round (line);
* ``calibration_<method>.png`` -- (methods with a drafter) how well the drafter's confidence and
  the online calibration of ``specpolicy.core.calibration`` (what ``policy=goodput`` uses) predict
  acceptance: a reliability diagram and the learned calibration curve against the observed
  acceptance;
* ``trajectories/<method>/<prompt>.html`` -- one page per prompt in the style of Fig. 12: one
  round per line with its lengths, accepted draft tokens plain, rejected draft tokens struck
  through, the target's token (correction or bonus) boxed; reused draft tokens underlined;
* ``index.html`` -- links to all of the above.

Tokens are decoded with the target's tokenizer (``config.verifier.model`` of the run's
summary, or ``--tokenizer``); without one, token ids are shown. Uses matplotlib's Agg backend
(no display needed; ``pip install matplotlib``, part of ``specpolicy[test]``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, timing_trusted
from specpolicy.analysis.metrics import aggregate
from specpolicy.analysis.plot_pages import _slug, drafts, index_html, prompt_texts, tokenizer_for, trajectory_html
from specpolicy.analysis.results import PromptResult, Run, load_runs

#: Colors: verification (bottom), drafting, other -- as Fig. 6 stacks them.
COLORS = {"verify": "#4c72b0", "draft": "#dd8452", "other": "#b0b0b0"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def text_width_in(texts: Sequence[str], fontsize: float = 8.0) -> float:
    """The width in inches of the widest of ``texts`` set in matplotlib's default font at
    ``fontsize`` points (0 for none): figures size themselves by their labels, so that long names
    (a sweep's runs, named by their overrides) never squeeze the axes."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop, measure = FontProperties(size=fontsize), TextToPath()
    return max((measure.get_text_width_height_descent(t, prop, ismath=False)[0] / 72.0 for t in texts), default=0.0)


def wrapped(text: str, width_in: float, fontsize: float = 10.0) -> str:
    """``text`` in lines that fit ``width_in`` inches at ``fontsize`` points (a title over a run's
    long name)."""
    import textwrap

    per_char = max(text_width_in([text], fontsize) / max(len(text), 1), 1e-3)
    return "\n".join(textwrap.wrap(text, max(int(width_in / per_char), 20))) or text


# -- Fig. 8: CDF of accepted / speculated lengths ---------------------------------------------


#: Width of the two panels of the length CDF (inches), and the widest legend put beside them;
#: a wider legend goes below them.
PANELS_IN = 11.0
LEGEND_BESIDE_IN = 4.0

#: Line styles, one per group of 10 methods (each group reuses tab10's hues, lighter from the
#: second group on): every method gets a colour/line-style pair of its own.
LINESTYLES = ("-", "--", ":", "-.")


def line_styles(count: int) -> list[dict[str, Any]]:
    """``count`` distinct colour AND line-style pairs: 1-10 tab10's colours with solid lines, 11-20
    tab20's lighter shades of the same hues with dashed lines, then dotted and dash-dotted lines
    (``LINESTYLES``)."""
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    styles = []
    for i in range(count):
        group, hue = divmod(i, 10)
        shade = 2 * hue + (group % 2)  # tab20: even = tab10's colour, odd = its lighter shade
        styles.append({"color": tab20(shade), "linestyle": LINESTYLES[group % len(LINESTYLES)]})
    return styles


def _style(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """A distinct colour and line-style pair per method, in run order (``line_styles``)."""
    return {run.name: style for run, style in zip(runs, line_styles(len(runs)))}


def plot_length_cdf(runs: Sequence[Run], path: str | Path) -> Path:
    """Empirical CDFs of the accepted length and of the speculation length per round (rounds
    with a draft), one line per method that drafts, two panels, legend right of the panels (off
    the data). Returns ``path``.

    Raises:
        ValueError: when no run has a round with a draft (the figure would be empty).
    """
    if not any(drafts(run) for run in runs):
        raise ValueError("no run has a round with a draft: nothing to plot")
    plt = _pyplot()
    style = _style(runs)
    runs = [run for run in runs if drafts(run)]
    # The panels keep their size whatever the names: a narrow legend sits right of them, a wide one
    # (long names: a sweep's runs named by their overrides) below them in as many columns as fit.
    legend_in = text_width_in([run.name for run in runs]) + 0.6  # the line sample and padding
    beside = legend_in <= LEGEND_BESIDE_IN
    columns = 1 if beside else max(1, int(PANELS_IN // legend_in))
    rows = len(runs) if beside else -(-len(runs) // columns)
    height = max(4.6, 1.2 + 0.17 * rows) if beside else 4.6 + 0.17 * rows
    fig, axes = plt.subplots(
        1, 2, figsize=(PANELS_IN + (legend_in if beside else 0.0), height), sharey=True, layout="constrained"
    )
    for key, ax, title in (
        ("accepted_length", axes[0], "accepted length per round"),
        ("speculation_length", axes[1], "speculated length per round"),
    ):
        for run in runs:
            values = sorted(getattr(r, key) for r in run.rounds if r.speculation_length > 0)
            if not values:
                continue
            n = len(values)
            ax.step(
                [values[0]] + values,
                [0.0] + [(i + 1) / n for i in range(n)],
                where="post",
                label=run.name,
                lw=1.4,
                **style[run.name],
            )
        ax.set_title(title)
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("CDF (fraction of rounds with a draft)")
    # outside the axes (constrained layout makes room): never on a line
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        fontsize=8,
        loc="outside right center" if beside else "outside lower center",
        ncol=columns,
        frameon=False,
        handlelength=3,
    )
    fig.suptitle("Accepted and speculated lengths per round (cf. FailFast Fig. 8)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- Fig. 6: latency breakdown ----------------------------------------------------------------


def latency_breakdown(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per method (vanilla first, pooled over the runs that measured it): ms per generated token
    spent drafting, verifying, and elsewhere (prefill + loop), from the recorded rounds; ``trusted``
    is False when the run (for vanilla: any pooled run) recorded that its timings cannot be trusted
    (``specpolicy.analysis.machine.timing_trusted``)."""
    out = []
    van = aggregate([res.vanilla for run in runs for res in run.results if res.vanilla is not None])
    if van["generated_tokens"]:
        tokens, wall_ms = van["generated_tokens"], van["wall_s"] * 1e3
        pooled = [run for run in runs if any(res.vanilla is not None for res in run.results)]
        out.append(
            {
                "method": "vanilla",
                "draft": 0.0,
                "verify": van["verify_ms"] / tokens,
                "other": max(wall_ms - van["verify_ms"], 0.0) / tokens,
                "trusted": not any(timing_trusted(run.summary) is False for run in pooled),
            }
        )
    for run in runs:
        tokens = sum(res.generated_tokens for res in run.results)
        if not tokens:
            continue
        draft = sum(r.draft_ms for r in run.rounds)
        verify = sum(r.verify_ms for r in run.rounds)
        wall = sum(res.speculative.wall_s for res in run.results) * 1e3
        out.append(
            {
                "method": run.name,
                "draft": draft / tokens,
                "verify": verify / tokens,
                "other": max(wall - draft - verify, 0.0) / tokens,
                "trusted": timing_trusted(run.summary) is not False,
            }
        )
    return out


#: Colour of what is marked untrusted (labels, notes), as the pages' ``.partial`` class.
UNTRUSTED_COLOR = "#9a6700"


def untrusted_figure_note(count: int, what: str, width: int = 130) -> str | None:
    """The note a figure carries under its axes when ``count`` of its ``what`` (bars, points) show
    timings that cannot be trusted (marked ``UNTRUSTED_MARK``), in lines of at most ``width``
    characters (about 14 per inch of figure at 8 points); None when there are none."""
    if not count:
        return None
    import textwrap

    what_is_wrong, what_to_do = UNTRUSTED_NOTE.split("; ", 1)
    lines = textwrap.wrap(f"{UNTRUSTED_MARK} {count} {what[:-1] if count == 1 else what}: {what_is_wrong};", width)
    return "\n".join(lines + textwrap.wrap(what_to_do, width))


def plot_latency_breakdown(runs: Sequence[Run], path: str | Path) -> Path:
    """Stacked horizontal bars, one per method (vanilla on top): verification, drafting and other
    time, in ms per generated token. A method whose timings cannot be trusted is marked
    ``UNTRUSTED_MARK`` and explained in a note under the figure. Returns ``path``."""
    plt = _pyplot()
    data = latency_breakdown(runs)
    names = [d["method"] + ("" if d["trusted"] else f" {UNTRUSTED_MARK}") for d in data]
    # the bars keep 6.5 inches whatever the names' width (long names: a sweep's runs by their overrides)
    fig, ax = plt.subplots(
        figsize=(6.5 + text_width_in(names) + 0.3, 1.9 + 0.38 * max(len(data), 1)), layout="constrained"
    )
    ys = list(range(len(data)))[::-1]  # first method at the top
    left = [0.0] * len(data)
    for part, label in (("verify", "verification"), ("draft", "drafting"), ("other", "other (prefill, loop)")):
        vals = [d[part] for d in data]
        ax.barh(ys, vals, left=left, color=COLORS[part], label=label, height=0.7)
        left = [a + v for a, v in zip(left, vals)]
    for y, total in zip(ys, left):
        ax.text(total, y, f" {total:.2f}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels(names, fontsize=8)
    for label, d in zip(ax.get_yticklabels(), data):
        if not d["trusted"]:
            label.set_color(UNTRUSTED_COLOR)
    ax.set_xlabel("ms per generated token (measured)")
    ax.set_xlim(0, max(left + [1e-9]) * 1.12)
    ax.set_title("Latency breakdown: drafting vs verification (cf. FailFast Fig. 6)", fontsize=10)
    # below the axes, outside them (constrained layout makes room), so it never covers a bar or its total;
    # the note on timings that cannot be trusted heads it (laid out with it)
    note = untrusted_figure_note(sum(not d["trusted"] for d in data), "bars")
    legend = fig.legend(fontsize=8, loc="outside lower center", ncol=3, frameon=False, title=note, title_fontsize=8)
    if note:
        legend.get_title().set_color(UNTRUSTED_COLOR)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- serving: throughput and p99 latency against batch size (generation.batch_size sweeps) -----------

#: Style of the vanilla line in the serving figure (the reference: black, drawn first).
VANILLA_STYLE = {"color": "#000000", "linestyle": "-"}


def serving_lines(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The serving figure's lines: ``rows`` (``specpolicy.analysis.report_serving.serving_rows``) by ``series``, in
    the rows' order (vanilla first), each line's points (rows) in batch-size order."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        lines.setdefault(row["series"], []).append(row)
    return {name: sorted(points, key=lambda r: r["batch_size"]) for name, points in lines.items()}


def draw_serving(rows: Sequence[dict[str, Any]]):
    """The serving figure of ``rows`` (``specpolicy.analysis.report_serving.serving_rows``) as a matplotlib figure:
    two panels against the batch size (log2 axis, the batch sizes as ticks) -- throughput (generated
    tokens/s over all requests) and p99 latency (ms, arrival to last token) -- one line per
    ``series`` (vanilla decoding black), points where the figure is known. Points of the batch-1
    loop (``specpolicy.analysis.report.BATCH1_LOOP``: replayed from per-prompt times) are hollow; a line
    with a run whose timings cannot be trusted is marked ``UNTRUSTED_MARK`` in the legend and
    explained under it. The legend sits outside the panels. The caller saves and closes it.

    Raises:
        ValueError: when ``rows`` is empty (nothing to plot).
    """
    from matplotlib.lines import Line2D

    from specpolicy.analysis.report_serving import BATCH1_LOOP, VANILLA_SERIES

    if not rows:
        raise ValueError("no run with serving figures: nothing to plot")
    plt = _pyplot()
    lines = serving_lines(rows)
    others = iter(line_styles(sum(name != VANILLA_SERIES for name in lines)))
    styles = {name: VANILLA_STYLE if name == VANILLA_SERIES else next(others) for name in lines}
    untrusted = {name: any(p.get("timing_trusted") is False for p in points) for name, points in lines.items()}
    labels = {name: name + (f" {UNTRUSTED_MARK}" if untrusted[name] else "") for name in lines}
    replayed = any(r["loop"] == BATCH1_LOOP for r in rows)
    hollow_label = "hollow: batch size 1 by the batch-1 loop (replayed)"
    legend_in = text_width_in(list(labels.values()) + ([hollow_label] if replayed else [])) + 0.6
    beside = legend_in <= LEGEND_BESIDE_IN
    entries = len(lines) + replayed
    columns = 1 if beside else max(1, int(PANELS_IN // legend_in))
    height = max(4.6, 1.2 + 0.17 * entries) if beside else 4.6 + 0.17 * -(-entries // columns)
    fig, axes = plt.subplots(1, 2, figsize=(PANELS_IN + (legend_in if beside else 0.0), height), layout="constrained")
    batch_sizes = sorted({r["batch_size"] for r in rows})
    for ax, key, ylabel, title in (
        (axes[0], "throughput_tokens_per_s", "tokens/s (generated, all requests)", "throughput"),
        (axes[1], "latency_p99_ms", "p99 latency (ms, arrival to last token)", "p99 latency"),
    ):
        for name, points in lines.items():
            shown = [p for p in points if p[key] is not None]
            ax.plot(
                [p["batch_size"] for p in shown],
                [p[key] for p in shown],
                marker="o",
                ms=5,
                lw=1.6,
                label=labels[name],
                **styles[name],
            )
            loop1 = [p for p in shown if p["loop"] == BATCH1_LOOP]
            if loop1:
                ax.plot(
                    [p["batch_size"] for p in loop1],
                    [p[key] for p in loop1],
                    ls="none",
                    marker="o",
                    ms=5,
                    mfc="white",
                    mec=styles[name]["color"],
                    zorder=3,
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        ax.minorticks_off()
        ax.set_xlim(batch_sizes[0] / 1.35, batch_sizes[-1] * 1.35)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("batch size (requests in flight at most)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    handles, _ = axes[0].get_legend_handles_labels()
    if replayed:
        handles.append(Line2D([], [], ls="none", marker="o", ms=5, mfc="white", mec="#444444", label=hollow_label))
    legend = fig.legend(
        handles=handles,
        fontsize=8,
        loc="outside right center" if beside else "outside lower center",
        ncol=columns,
        frameon=False,
        handlelength=3,
    )
    # the note on timings that cannot be trusted: under the panels (laid out with them), never on a line
    note = untrusted_figure_note(sum(untrusted.values()), "lines", width=100)
    if note:
        below = legend if not beside else fig.legend(handles=[], loc="outside lower center", frameon=False)
        below.set_title(note, prop={"size": 8})
        below.get_title().set_color(UNTRUSTED_COLOR)
    for text, name in zip(legend.get_texts(), lines):
        if untrusted[name]:
            text.set_color(UNTRUSTED_COLOR)
    arrivals = sorted({r["arrival_cell"] for r in rows})
    fig.suptitle(
        wrapped(f"Throughput and p99 latency against batch size (measured; arrival: {' / '.join(arrivals)})", PANELS_IN)
    )
    return fig


def plot_serving(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write ``draw_serving(rows)`` to ``path`` (PNG). Returns ``path``.

    Raises:
        ValueError: when ``rows`` is empty.
    """
    plt = _pyplot()
    fig = draw_serving(rows)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- acceptance over the rounds of a prompt -----------------------------------------------------


def plot_acceptance_over_rounds(run: Run, path: str | Path, max_prompts: int = 4) -> Path:
    """For the first ``max_prompts`` prompts of ``run``, one panel each: per round, the speculated
    and accepted lengths (bars, left axis) and the acceptance rate a/k (line, right axis; rounds
    without a draft are skipped). The legend sits above the panels, off the data. Returns ``path``.

    Raises:
        ValueError: when ``run`` never drafts (``drafts``): the figure would be empty.
    """
    if not drafts(run):
        raise ValueError(f"{run.name} has no round with a draft: no acceptance figure")
    plt = _pyplot()
    shown = [res for res in run.results if any(r.speculation_length > 0 for r in res.speculative.rounds)][:max_prompts]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 0.9 + 2.3 * len(shown)), squeeze=False)
    twins = []
    for ax, res in zip(axes[:, 0], shown):
        rounds = res.speculative.rounds
        idx = list(range(len(rounds)))
        ax.bar(idx, [r.speculation_length for r in rounds], color="#c6dbef", label="speculated length k")
        ax.bar(idx, [r.accepted_length for r in rounds], color="#2171b5", label="accepted length a")
        ax.set_ylabel("tokens")
        ax.set_xlim(-0.8, max(len(rounds), 1) - 0.2)
        ax.set_title(f"prompt {res.prompt_id} ({len(rounds)} rounds)", fontsize=9, loc="left")
        ax2 = ax.twinx()
        twins.append(ax2)
        pts = [(i, r.accepted_length / r.speculation_length) for i, r in enumerate(rounds) if r.speculation_length > 0]
        ax2.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color="#e6550d",
            marker=".",
            lw=1,
            label="acceptance rate a / k (right axis)",
        )
        ax2.set_ylim(-0.05, 1.05)
        ax2.set_ylabel("acceptance rate")
    axes[-1, 0].set_xlabel("round")
    from matplotlib.ticker import MaxNLocator

    for ax in axes[:, 0]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles = axes[0, 0].get_legend_handles_labels()[0] + twins[0].get_legend_handles_labels()[0]
    fig.tight_layout()
    top = axes[0, 0].get_position().y1  # above the first panel and its title, off the data
    fig.text(
        0.01, 1.0, wrapped(f"Speculated and accepted length per round: {run.name}", 10.8, 11), fontsize=11, va="bottom"
    )
    fig.legend(handles=handles, fontsize=8, ncol=3, frameon=False, loc="lower right", bbox_to_anchor=(0.99, top + 0.02))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


# -- calibration of acceptance probabilities (the goodput policy) ---------------------------------

#: Position bins shown as separate learned curves (first positions of ``calibration.POSITION_STARTS`` bins).
CALIBRATION_POSITIONS = (1, 2, 4, 9)


def has_confidences(run: Run) -> bool:
    """True when the run's rounds carry drafted tokens' confidences (a drafter ran)."""
    return any(r.confidences for r in run.rounds)


def plot_calibration(run: Run, path: str | Path) -> Path:
    """Two panels for the rounds of ``run`` replayed in order (``specpolicy.core.calibration``):

    * left, a reliability diagram of P(token accepted | earlier tokens accepted): the drafter's raw
      confidence and the online calibration's prediction (made from the earlier rounds only, as the
      ``goodput`` policy saw it) against the observed frequency, with the expected calibration error;
    * right, the calibration curve learned from every round (estimate by confidence, pooled and for
      a few draft positions) against the observed acceptance per confidence bin.

    Returns ``path``."""
    import numpy as np

    from specpolicy.core.calibration import calibration_from_rounds, online_predictions, reliability

    plt = _pyplot()
    rounds = run.rounds
    online = online_predictions(rounds)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    n = online["accepted"].size
    for key, label, color, marker in (
        ("confidence", "drafter confidence", "#969696", "s"),
        ("predicted", "calibrated (online, earlier rounds)", "#2171b5", "o"),
    ):
        rel = reliability(online[key], online["accepted"])
        sizes = 12 + 250 * np.sqrt(rel["count"] / max(n, 1))
        left.plot(rel["mean_predicted"], rel["observed"], color=color, lw=1)
        left.scatter(
            rel["mean_predicted"],
            rel["observed"],
            s=sizes,
            color=color,
            marker=marker,
            zorder=3,
            label=f"{label}: ECE {rel['ece']:.3f}",
        )
    left.plot([0, 1], [0, 1], ls="--", color="#444", lw=0.8, label="perfectly calibrated")
    left.set(
        xlim=(0, 1.02),
        ylim=(0, 1.02),
        xlabel="predicted P(accepted | earlier accepted)",
        ylabel="observed acceptance",
        title=f"reliability, {n} tokens (marker area ~ tokens)",
    )
    left.legend(fontsize=8, loc="lower right")

    cal = calibration_from_rounds(rounds)
    table = cal.reliability()
    has = table["reached"] > 0
    edges = np.append(cal.confidence_edges, 1.0)
    grid = np.linspace(0.0, 1.0, 401)
    starts = list(cal.position_starts) + [None]
    for i, position in enumerate(CALIBRATION_POSITIONS):
        q = int(cal.position_bin(np.array([position]))[0])
        last = starts[q + 1] - 1 if starts[q + 1] else None
        span = f"{starts[q]}" if last == starts[q] else f"{starts[q]}-{last or ''}"
        right.plot(
            grid,
            cal.table()[q, cal.confidence_bin(grid)],
            lw=1.4,
            label=f"estimate, position {span}",
            color=plt.get_cmap("viridis")(i / len(CALIBRATION_POSITIONS)),
        )
    right.plot(
        grid, cal.pooled()[cal.confidence_bin(grid)], color="#d62728", lw=1.0, ls=":", label="estimate, all positions"
    )
    right.scatter(
        table["mean_confidence"][has],
        table["observed"][has],
        s=12 + 250 * np.sqrt(table["reached"][has] / max(table["reached"].sum(), 1)),
        color="#d62728",
        zorder=3,
        label="observed, all positions",
    )
    right.plot([0, 1], [0, 1], ls="--", color="#444", lw=0.8)
    for x in edges[1:-1]:
        right.axvline(x, color="#eee", lw=0.6, zorder=0)
    right.set(
        xlim=(0, 1.02),
        ylim=(0, 1.02),
        xlabel="drafter confidence (bins: grey lines)",
        ylabel="P(accepted | earlier accepted)",
        title="calibration curve learned from all rounds",
    )
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        wrapped(f"{run.name}: acceptance calibration (binned confidence x position, Beta prior)", 11.5, 10), fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- the pages: specpolicy.analysis.plot_pages ------------------------------------------------------


def plot_runs(
    runs: Sequence[Run],
    out: str | Path,
    tokenizer=None,
    max_prompts: int = 4,
    max_pages: int | None = None,
    root: str | Path | None = None,
) -> list[Path]:
    """Write every figure and page for ``runs`` into ``out``; returns the written files
    (``index.html`` last). No figure is drawn without data: the length CDF only when some run
    drafts, an acceptance figure only per run that drafts. ``max_pages`` limits the trajectory
    pages per method (None: all); ``root``: the directory the runs were read from (shown)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(root) if root is not None else Path(os.path.commonpath([str(r.directory) for r in runs]))
    files = []
    if any(drafts(run) for run in runs):
        files.append(plot_length_cdf(runs, out / "length_cdf.png"))
    files.append(plot_latency_breakdown(runs, out / "latency_breakdown.png"))
    from specpolicy.analysis.report_serving import serving_rows

    serving = serving_rows(runs, root)  # empty unless some run is batched (generation.batch_size > 1)
    if serving:
        files.append(plot_serving(serving, out / "serving.png"))
    pages: dict[str, list[tuple[PromptResult, Path]]] = {}
    for run in runs:
        if drafts(run):
            files.append(plot_acceptance_over_rounds(run, out / f"acceptance_{_slug(run.name)}.png", max_prompts))
        if has_confidences(run):
            files.append(plot_calibration(run, out / f"calibration_{_slug(run.name)}.png"))
        folder = out / "trajectories" / _slug(run.name)
        folder.mkdir(parents=True, exist_ok=True)
        texts = prompt_texts(run)
        for res in run.results[:max_pages]:
            page = folder / f"{_slug(res.prompt_id)}.html"
            page.write_text(
                trajectory_html(res, run.name, tokenizer, texts.get(res.prompt_id), index_href="../../index.html"),
                encoding="utf-8",
            )
            pages.setdefault(run.name, []).append((res, page))
            files.append(page)
    index = out / "index.html"
    index.write_text(index_html(runs, root, files, pages, out, serving), encoding="utf-8")
    files.append(index)
    return files


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.analysis.plot DIR [--out OUT] [--tokenizer MODEL] [--max-prompts N] [--max-pages N]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.analysis.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a run directory, a multirun directory or a peers --runs-dir")
    parser.add_argument("--out", help="output directory (default: DIRECTORY/plots)")
    parser.add_argument("--tokenizer", help="tokenizer for the trajectory pages (default: the run's target)")
    parser.add_argument("--max-prompts", type=int, default=4, help="prompts in the acceptance-over-rounds figures")
    parser.add_argument("--max-pages", type=int, default=None, help="trajectory pages per method (default: all)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.directory)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files = plot_runs(
        runs,
        args.out or Path(args.directory) / "plots",
        tokenizer_for(runs, args.tokenizer),
        args.max_prompts,
        args.max_pages,
        root=args.directory,
    )
    print(f"wrote {len(files)} files for {len(runs)} run(s); open {files[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
