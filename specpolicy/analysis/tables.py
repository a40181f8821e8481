"""Tables shown to people: the figures' titles (``FIGURES``, from ``specpolicy.analysis.labels``,
the one list of what each summary figure is called, long and short, and how it is formatted), the
width-fitting layout every printed table
uses, and the run's own summary table (``print_summary``, printed after every run). The sweep
report (``specpolicy.analysis.report``), the figures page (``specpolicy.analysis.plot``) and the peer benchmark
(``benchmarks/peers.py``) take their columns from ``FIGURES``; the values come from
``summary.json`` (``specpolicy.analysis.summary.summarize`` / ``headline``), so a figure has one name,
one format and one value wherever it is printed."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specpolicy.analysis.labels import FIGURES, Figure  # noqa: F401 (Figure: re-exported)
from specpolicy.analysis.oracle import is_censored
from specpolicy.analysis.parting import NOT_LOSSLESS, parting_line
from specpolicy.analysis.summary import headline


def figure_columns(keys: Iterable[str], long: bool = False) -> tuple[tuple[str, str, str], ...]:
    """``(title, key, format)`` of each key, from ``FIGURES`` (``long``: the labels that name
    their denominators, else the short titles)."""
    return tuple(((FIGURES[k].label if long else FIGURES[k].short), k, FIGURES[k].fmt) for k in keys)


def peak_memory_line(peak: Mapping[str, Any]) -> str:
    """The run's peak memory in one line (``summary.json`` ``peak_memory``), in MiB."""
    parts = [f"CPU peak RSS {peak['cpu_rss_bytes'] / 2**20:,.0f} MiB"]
    if peak.get("cuda_max_allocated_bytes") is not None:
        parts.append(f"CUDA max allocated {peak['cuda_max_allocated_bytes'] / 2**20:,.0f} MiB")
    return "peak memory: " + ", ".join(parts) + " (summary.json peak_memory)"


def lossless_text(summary: Mapping[str, Any]) -> str:
    """The lossless cell of a run: ``k/n`` prompts equal to vanilla, ``n/a (sampling)`` when
    sampling (token identity is not expected), ``-`` without a vanilla baseline
    (``specpolicy.analysis.summary.headline``)."""
    return headline(summary)["lossless"] or "-"


# -- layout: tables that fit the terminal, no number ever cut ---------------------------------

#: Width of printed tables when stdout is not a terminal and ``COLUMNS`` is unset (log files).
DEFAULT_WIDTH = 100


def available_width() -> int:
    """Characters a printed table may use: the terminal's width, ``COLUMNS`` when set, else
    ``DEFAULT_WIDTH`` (stdout is a file or a pipe)."""
    probe = Console()
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe.width
    return DEFAULT_WIDTH


@dataclass
class Column:
    """One column of a printed table: its title, its cells (already formatted), whether it holds
    text (wrapped at spaces; numbers are never wrapped or cut) and its drop order (when the table
    does not fit, columns with the highest order are left out first; 0: never)."""

    title: str
    cells: list[str]
    text: bool = False
    drop: int = 0

    def floor(self, hard: bool = False) -> int:
        """The narrowest this column may be: a number's full width, the longest header word, and
        for text the longest word (at most 30 characters; 8 when ``hard``: words then fold)."""
        header = max((len(w) for w in self.title.split()), default=1)
        if not self.text:
            return max([header] + [len(c) for c in self.cells])
        words = max([len(w) for c in self.cells for w in c.split()] or [1])
        return max(min(header, 12), min(words, 8 if hard else 30))

    def natural(self) -> int:
        """Its comfortable width: the longest cell unwrapped, and the header on one line (a
        number's header wraps beyond 16 characters)."""
        header = len(self.title) if self.text else max(min(len(self.title), 16), self.floor())
        return max([header] + [len(c) for c in self.cells])


def table_width(widths: Sequence[int]) -> int:
    """Characters a rich table (default box) with these column content widths takes: one space
    of padding on each side of a cell, one border character between and around cells."""
    return sum(w + 3 for w in widths) + 1


def fit_widths(columns: Sequence[Column], width: int, hard: bool = False) -> list[int] | None:
    """Content widths for ``columns`` within ``width`` characters: every column at least its
    floor, the room left shared out one character at a time up to each column's natural width.
    None when even the floors do not fit."""
    floors = [c.floor(hard) for c in columns]
    room = width - table_width(floors)
    if room < 0:
        return None
    widths, natural = list(floors), [max(c.natural(), f) for c, f in zip(columns, floors)]
    while room > 0 and any(w < n for w, n in zip(widths, natural)):
        for i in range(len(widths)):
            if room and widths[i] < natural[i]:
                widths[i] += 1
                room -= 1
    return widths


def layout(
    columns: Sequence[Column], width: int | None, wide: bool = False
) -> tuple[list[Column], list[int], list[str]]:
    """Choose the columns and their widths: ``wide`` (or ``width`` None): every column at its
    natural width; else within ``width``, leaving out columns by drop order while the rest does
    not fit at comfortable floors, then folding long words. A table that cannot fit even so is
    laid out at its floors, wider than ``width`` -- never a number cut.
    Returns ``(columns kept, their content widths, titles of the columns left out)``."""
    kept = list(columns)
    if wide or width is None:
        return kept, [c.natural() for c in kept], []
    dropped: list[str] = []
    while (widths := fit_widths(kept, width)) is None and any(c.drop for c in kept):
        order = max(c.drop for c in kept)
        victim = next(c for c in reversed(kept) if c.drop == order)
        kept.remove(victim)
        dropped.append(victim.title)
    if widths is None:
        widths = fit_widths(kept, width, hard=True) or [c.floor(hard=True) for c in kept]
    return kept, widths, dropped


def print_table(
    columns: Sequence[Column],
    widths: Sequence[int],
    title: str | None = None,
    console: Console | None = None,
    width: int | None = None,
) -> Console:
    """Print ``columns`` at exactly ``widths`` (rich; text columns wrap at spaces, numbers are
    right-aligned and whole). Returns the console used: ``console``, else one of ``width``
    characters (default: the terminal's), or as wide as the table when that is wider."""
    table = Table(title=title or None, title_justify="left")
    for column, w in zip(columns, widths):
        table.add_column(column.title, width=w, justify="left" if column.text else "right", overflow="fold")
    for i in range(len(columns[0].cells) if columns else 0):
        table.add_row(*(c.cells[i] for c in columns))
    console = console or Console(width=max(table_width(widths), width or available_width()))
    console.print(table)
    return console


# -- the summary of one run (printed after every run) -----------------------------------------

#: Figures of the run summary table, one row each (``FIGURES`` labels: each names its
#: denominator), after the measured and MODELED speedups.
SUMMARY_KEYS = (
    "tokens_per_s",
    "acceptance_rate",
    "mean_accepted_length",
    "mean_speculation_length",
    "tokens_per_round",
    "max_accepted_length",
    "max_speculation_length",
    "rounds",
    "drafted_rounds",
    "drafter_passes_per_round",
    "host_ms_per_round",
    "host_step_share",
)
#: Rows of the run summary table: (label, key in ``summary["methods"][m]``, format, applies only
#: to methods that drafted).
SUMMARY_ROWS = tuple((FIGURES[k].label, k, FIGURES[k].fmt, FIGURES[k].drafting) for k in SUMMARY_KEYS)
#: Rows added when a method drafted trees (``policy=eagle2-tree`` ...).
TREE_ROWS = tuple(
    (FIGURES[k].label, k, FIGURES[k].fmt, FIGURES[k].drafting) for k in ("tree_rounds", "mean_draft_depth")
)
#: Labels of the figures that count tree NODES when a method drafted trees (a round drafts a tree
#: of that many nodes and accepts one path of it): they replace the ``FIGURES`` labels in the run
#: summary of such a run.
TREE_LABELS = {
    "acceptance_rate": "acceptance rate (accepted tokens / drafted tree NODES)",
    "mean_speculation_length": "speculation length per round (tree NODES drafted; mean over all rounds)",
    "max_speculation_length": "longest speculation length in a round (tree NODES)",
}
#: The footnote under a table with rows of runs that drafted trees.
TREE_NOTE = (
    "draft trees: acceptance rate = accepted tokens / drafted tree NODES; speculation length = tree "
    "NODES drafted per round (one path of each tree is accepted; draft depth: its deepest node)"
)


def method_drafted(name: str, m: Mapping[str, Any]) -> bool:
    """Whether a method drafted at all (rows of drafting figures show ``-`` otherwise)."""
    if "drafted_rounds" in m:
        return bool(m["drafted_rounds"])
    return name != "vanilla" and bool(m.get("mean_speculation_length"))


def summary_cells(summary: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The run summary as ``(methods, [(row label, one cell per method)])``, vanilla first;
    ``-`` wherever a figure does not apply (a method that did not draft, no vanilla baseline)."""
    methods = sorted(summary["methods"], key=lambda n: n != "vanilla")
    van = summary["methods"].get("vanilla")
    rows: list[tuple[str, list[str]]] = []
    speed = []
    for name in methods:
        m = summary["methods"][name]
        speed.append(f"{m['tokens_per_s'] / van['tokens_per_s']:.2f}x" if van and van.get("tokens_per_s") else "-")
    rows.append((FIGURES["speedup_vs_vanilla"].label, speed))
    modeled = summary.get("modeled")
    if modeled:
        value = modeled.get("speedup_vs_vanilla")
        rows.append(
            (
                f"speedup vs vanilla, MODELED ({modeled['profile']['name']} profile, not measured)",
                ["1.00x" if name == "vanilla" else ("n/a" if value is None else f"{value:.2f}x") for name in methods],
            )
        )
    trees = any(m.get("tree_rounds") for m in summary["methods"].values())
    for label, key, fmt, drafting in SUMMARY_ROWS + (TREE_ROWS if trees else ()):
        label = TREE_LABELS.get(key, label) if trees else label  # a tree's figures count nodes, and say so
        cells = []
        for name in methods:
            m = summary["methods"][name]
            value = m.get(key)
            cells.append("-" if value is None or (drafting and not method_drafted(name, m)) else fmt.format(value))
        rows.append((label, cells))
    rows.append(
        (FIGURES["lossless"].label, ["reference" if name == "vanilla" else lossless_text(summary) for name in methods])
    )
    return methods, rows


def run_header(summary: Mapping[str, Any]) -> str:
    """What a run ran, in one line (the run summary table's title): the method, the data set (its
    name, or the file of ``dataset.path``), prompts x ``generation.max_new_tokens``, the device and
    dtype it ran on, greedy or sampling (temperature, and top_p / top_k when set), the batch size
    when above 1 and the stop strings when any, e.g. ``fastdllm+failfast on gsm8k, 20 prompts x 256
    new tokens, cpu float32, greedy``. Parts the summary does not record are left out."""
    config = summary.get("config") or {}
    dataset = config.get("dataset") or {}
    generation = config.get("generation") or {}
    runtime = summary.get("runtime") or {}
    prompts = summary.get("prompts", 0)
    what = f"{prompts} prompt{'' if prompts == 1 else 's'}"
    if generation.get("max_new_tokens") is not None:
        what += f" x {generation['max_new_tokens']} new tokens"
    name = Path(str(dataset["path"])).name if dataset.get("path") else dataset.get("name")
    parts = [f"{name}, {what}" if name else what]
    if runtime.get("device") or runtime.get("dtype"):
        parts.append(" ".join(str(runtime[k]) for k in ("device", "dtype") if runtime.get(k)))
    sampling = summary.get("sampling") or {}
    if sampling.get("mode") == "sampling":
        knobs = [f"temperature {sampling.get('temperature')}"]
        if sampling.get("top_p") not in (None, 1.0):
            knobs.append(f"top_p {sampling['top_p']}")
        if sampling.get("top_k"):
            knobs.append(f"top_k {sampling['top_k']}")
        parts.append(f"sampling ({', '.join(knobs)})")
    elif sampling.get("mode"):
        parts.append(str(sampling["mode"]))
    if int(generation.get("batch_size") or 1) > 1:
        parts.append(f"batch size {generation['batch_size']}")
    if generation.get("stop"):
        parts.append("stop " + " ".join(repr(s) for s in generation["stop"]))
    return f"{summary.get('method', '?')} on " + ", ".join(parts)


#: How to see the oracle comparison in full (the run summary's oracle line ends with it).
ORACLE_COMMAND = "python -m specpolicy.analysis.oracle"


def oracle_sentence(oracle: Mapping[str, Any], run_dir: str | None = None) -> str:
    """The oracle comparison of a run summary in one plain sentence, ending with the command that
    explains it in full (``ORACLE_COMMAND``: the replayed or censored source, the costs, the
    per-prompt fractions; ``specpolicy.analysis.oracle.describe_fraction``). ``run_dir`` as the
    user types it (default ``DIR``)."""
    see = f"see {ORACLE_COMMAND} {run_dir or 'DIR'}"
    if oracle.get("unavailable") or oracle.get("fraction_of_oracle") is None:
        return f"oracle: n/a ({oracle.get('unavailable') or 'no figure'}); {see}"
    ratio = float(oracle["fraction_of_oracle"])
    if ratio > 1.0 + 1e-9:
        return (
            f"oracle: no fraction of the oracle's speedup (this policy's modeled time is below that of the "
            f"oracle length policy estimated from this run, so the estimate bounds nothing); {see}"
        )
    bound = "at most " if is_censored(oracle) else ""
    clock_free = oracle.get("profile_costs") or {}
    beside = ""
    if clock_free.get("fraction_of_oracle") is not None and clock_free["fraction_of_oracle"] <= 1.0 + 1e-9:
        beside = (
            f" with this machine's measured costs (they follow its load), {bound}"
            f"{clock_free['fraction_of_oracle']:.2f} with the {clock_free['profile']} profile's costs (clock-free)"
        )
    return f"oracle: this policy reaches {bound}{ratio:.2f} of an oracle length policy's speedup{beside}; {see}"


def print_summary(
    summary: dict[str, Any],
    console: Console | None = None,
    wide: bool = False,
    width: int | None = None,
    run_dir: str | None = None,
) -> None:
    """Print a run's summary: a table of its figures (one row per figure, its denominator in
    its name; one column per method, vanilla first; ``wide``: one row per method instead) under a
    title saying what ran (``run_header``), then the modeled speedups by profile, the oracle
    comparison in one sentence (``oracle_sentence``; ``run_dir``: the directory its command names)
    and any prompt that is not lossless. Fits ``width`` (default: ``console``'s width, else the
    terminal's, see ``available_width``); no number is ever cut."""
    methods, rows = summary_cells(summary)
    prompts = summary.get("prompts", 0)
    title = run_header(summary)
    if summary.get("partial"):
        title += f" (PARTIAL: {prompts} of {summary.get('prompts_total', '?')} planned prompts)"
    if wide:  # one row per method, the figures as columns
        columns = [Column("method", list(methods), text=True)] + [Column(label, cells) for label, cells in rows]
    else:
        columns = [Column("figure (denominator)", [label for label, _ in rows], text=True)] + [
            Column(name, [cells[i] for _, cells in rows]) for i, name in enumerate(methods)
        ]
    width = None if wide else (width or (console.width if console is not None else available_width()))
    kept, widths, _ = layout(columns, width, wide)
    out = print_table(kept, widths, title, console, width)
    modeled = summary.get("modeled")
    if modeled and modeled.get("speedup_by_profile"):
        why = modeled.get("unavailable") or {}
        out.print(
            "MODELED speedup by latency profile (pass counts x per-pass latencies; 'measured' = this "
            "machine's latencies fitted from the run): "
            + ", ".join(
                f"{k} {v:.2f}x" if v is not None else f"{k} n/a ({why.get(k, 'not estimable')})"
                for k, v in modeled["speedup_by_profile"].items()
            ),
            markup=False,
        )
    if summary.get("oracle"):
        sentence = oracle_sentence(summary["oracle"], run_dir)
        head, sep, see = sentence.rpartition("; see ")
        if len(sentence) <= out.width or not sep:
            out.print(sentence, markup=False, soft_wrap=True)
        else:  # too long for one line: the command on a line of its own, whole (never broken at a space)
            out.print(head + ";", markup=False)
            out.print("  see " + see, markup=False, soft_wrap=True)
    partings = summary.get("partings") or {}
    for prompt_id, pos in summary.get("not_lossless", {}).items():
        if prompt_id not in partings:
            out.print(f"[red]NOT lossless[/red]: prompt {prompt_id} differs from vanilla at output position {pos}")
    for prompt_id, parting in partings.items():  # measured partings: near-ties and real differences
        out.print(
            parting_line(prompt_id, parting), markup=False, style="red" if parting["lossless"] == NOT_LOSSLESS else None
        )
    if summary.get("peak_memory"):
        out.print(peak_memory_line(summary["peak_memory"]), markup=False)
