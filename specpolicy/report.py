"""Printing summaries as tables (rich), and the sweep report:
``python -m specpolicy.report <multirun dir>`` collects every run's ``summary.json`` into one
table sorted by speedup, printed and written as ``report.csv`` and ``report.md``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specpolicy.oracle import describe_fraction

#: Width of printed tables when stdout is not a terminal and ``COLUMNS`` is unset (log files).
DEFAULT_WIDTH = 100
#: The ``lossless`` text of sampling runs (``specpolicy.experiment.SAMPLING_LOSSLESS``).
SAMPLING_LOSSLESS = "n/a (sampling)"


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


def layout(columns: Sequence[Column], width: int | None, wide: bool = False) -> tuple[list[Column], list[int], list[str]]:
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


def print_table(columns: Sequence[Column], widths: Sequence[int], title: str | None = None,
                console: Console | None = None, width: int | None = None) -> Console:
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

#: Rows of the run summary table: (label saying its denominator, key in ``summary["methods"][m]``,
#: format, applies only to rounds that drafted). Definitions: README "Metric glossary",
#: ``specpolicy.metrics``.
SUMMARY_ROWS = (
    ("tokens/s (generated tokens / wall-clock s)", "tokens_per_s", "{:.1f}", False),
    ("acceptance rate (accepted / drafted tokens)", "acceptance_rate", "{:.3f}", True),
    ("accepted length per drafted round (mean, bonus excluded)", "mean_accepted_length", "{:.2f}", True),
    ("speculation length per round (mean over all rounds)", "mean_speculation_length", "{:.2f}", True),
    ("tokens per round (all rounds, bonus included)", "tokens_per_round", "{:.2f}", False),
    ("longest accepted length in a round", "max_accepted_length", "{}", True),
    ("longest speculation length in a round", "max_speculation_length", "{}", True),
    ("rounds (one verification each)", "rounds", "{}", False),
    ("drafted rounds (k > 0)", "drafted_rounds", "{}", True),
    ("drafter passes per round (all rounds)", "drafter_passes_per_round", "{:.2f}", True),
)


def _drafted(name: str, m: dict[str, Any]) -> bool:
    """Whether a method drafted at all (rows of drafting figures show ``-`` otherwise)."""
    if "drafted_rounds" in m:
        return bool(m["drafted_rounds"])
    return name != "vanilla" and bool(m.get("mean_speculation_length"))


def lossless_text(summary: dict[str, Any]) -> str:
    """The lossless cell of a run: ``k/n`` prompts equal to vanilla, ``n/a (sampling)`` when
    sampling (token identity is not expected), ``-`` without a vanilla baseline."""
    if summary.get("lossless") == SAMPLING_LOSSLESS or (summary.get("sampling") or {}).get("mode") == "sampling":
        return SAMPLING_LOSSLESS
    fraction = summary.get("lossless_fraction")
    if fraction is None:
        return "-"
    prompts = int(summary.get("prompts", 0))
    return f"{round(fraction * prompts)}/{prompts}"


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
    rows.append(("speedup vs vanilla (measured, same run)", speed))
    modeled = summary.get("modeled")
    if modeled:
        rows.append((f"speedup vs vanilla, MODELED ({modeled['profile']['name']} profile, not measured)",
                     ["1.00x" if name == "vanilla" else f"{modeled['speedup_vs_vanilla']:.2f}x" for name in methods]))
    for label, key, fmt, drafting in SUMMARY_ROWS:
        cells = []
        for name in methods:
            m = summary["methods"][name]
            value = m.get(key)
            cells.append("-" if value is None or (drafting and not _drafted(name, m)) else fmt.format(value))
        rows.append((label, cells))
    rows.append(("lossless (prompts equal to vanilla)",
                 ["reference" if name == "vanilla" else lossless_text(summary) for name in methods]))
    return methods, rows


def print_summary(summary: dict[str, Any], console: Console | None = None, wide: bool = False,
                  width: int | None = None) -> None:
    """Print a run's summary: a table of its figures (one row per figure, its denominator in
    its name; one column per method, vanilla first; ``wide``: one row per method instead), then
    the modeled speedups by profile, the oracle comparison (labelled: a bound when estimated
    from the run's own rounds) and any prompt that is not lossless. Fits ``width`` (default:
    ``console``'s width, else the terminal's, see ``available_width``); no number is ever cut."""
    methods, rows = summary_cells(summary)
    prompts = summary.get("prompts", 0)
    title = f"{summary['method']} on {prompts} prompts"
    if summary.get("partial"):
        title += f" (PARTIAL: {prompts} of {summary.get('prompts_total', '?')} planned prompts)"
    if wide:  # one row per method, the figures as columns
        columns = [Column("method", list(methods), text=True)] + [
            Column(label, cells) for label, cells in rows]
    else:
        columns = [Column("figure (denominator)", [label for label, _ in rows], text=True)] + [
            Column(name, [cells[i] for _, cells in rows]) for i, name in enumerate(methods)]
    width = None if wide else (width or (console.width if console is not None else available_width()))
    kept, widths, _ = layout(columns, width, wide)
    out = print_table(kept, widths, title, console, width)
    modeled = summary.get("modeled")
    if modeled and modeled.get("speedup_by_profile"):
        out.print("MODELED speedup by latency profile (pass counts x per-pass latencies; 'measured' = this "
                  "machine's latencies fitted from the run): "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in modeled["speedup_by_profile"].items()), markup=False)
    if summary.get("oracle"):
        out.print(f"oracle length policy: {describe_fraction(summary['oracle'])}", markup=False)
    for prompt_id, pos in summary.get("not_lossless", {}).items():
        out.print(f"[red]NOT lossless[/red]: prompt {prompt_id} differs from vanilla at output position {pos}")


# -- sweep reports: python -m specpolicy.report <multirun dir> --------------------------------

#: Columns of the sweep report: (title, row key, format, drop order). When the table does not
#: fit the terminal, the columns with the highest drop order go first (0: never dropped); every
#: column is always in report.md and report.csv, and ``--wide`` prints them all.
REPORT_COLUMNS = (
    ("run", "run", "{}", 0),
    ("overrides", "overrides", "{}", 0),
    ("method", "method", "{}", 0),
    ("prompts", "prompts_cell", "{}", 0),
    ("speedup (measured)", "speedup_vs_vanilla", "{:.3f}x", 0),
    ("MODELED speedup", "modeled_speedup_vs_vanilla", "{:.3f}x", 3),
    ("tokens/s", "tokens_per_s", "{:.1f}", 5),
    ("vanilla tokens/s", "vanilla_tokens_per_s", "{:.1f}", 6),
    ("acceptance rate (accepted / drafted tokens)", "acceptance_rate", "{:.3f}", 1),
    ("accepted length / drafted round", "mean_accepted_length", "{:.2f}", 2),
    ("speculation length / round (all rounds)", "mean_speculation_length", "{:.2f}", 2),
    ("drafter passes / round", "drafter_passes_per_round", "{:.2f}", 4),
    ("lossless", "lossless", "{}", 0),
)
_TEXT_KEYS = ("run", "overrides", "method")
_SKIP_DIRS = {"wandb", ".submitit", ".hydra", "plots"}


def job_overrides(job_dir: Path) -> list[str]:
    """The job's command-line/sweep overrides from Hydra's ``.hydra/overrides.yaml``."""
    file = job_dir / ".hydra" / "overrides.yaml"
    if not file.exists():
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(file)]


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path != root else "."


def _planned(summary: dict[str, Any]) -> int:
    """Prompts the run was configured to decode (``prompts_total``; ``prompts`` when absent)."""
    return int(summary.get("prompts_total", summary.get("prompts", 0)) or 0)


def is_partial(summary: dict[str, Any]) -> bool:
    """Whether a summary covers fewer prompts than planned: ``"partial": true`` (interrupted),
    or fewer prompts than ``prompts_total``."""
    return bool(summary.get("partial")) or int(summary.get("prompts", 0)) < _planned(summary)


def collect(directory: str | Path) -> list[dict[str, Any]]:
    """One row per ``summary.json`` under ``directory`` (a multirun dir, or a single run dir).

    A row holds ``run`` (the job directory relative to ``directory``), ``overrides`` (the job's
    Hydra overrides, a list), the summary's headline numbers (``modeled_speedup_vs_vanilla``
    None when the summary has none), ``drafter_passes_per_round``, ``lossless`` ("k/n" prompts,
    ``n/a (sampling)``, or ``-``), ``lossless_fraction``, ``prompts`` (finished),
    ``prompts_planned``, ``partial`` (``is_partial``) and ``prompts_cell`` (``"4"``, or
    ``"1 of 4"`` for a partial run); ``speedup_vs_vanilla`` is None for a run without the vanilla
    baseline. Complete runs come first, sorted by speedup (highest first), then partial runs.

    Raises:
        FileNotFoundError: when ``directory`` does not exist.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    rows = []
    for file in sorted(root.rglob("summary.json")):
        if _SKIP_DIRS & set(file.relative_to(root).parts[:-1]):
            continue
        try:
            summary = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(summary, dict) or "method" not in summary or "methods" not in summary:
            continue
        spec = summary["methods"].get(summary["method"], {})
        van = summary["methods"].get("vanilla")
        prompts, planned, partial = int(summary.get("prompts", 0)), _planned(summary), is_partial(summary)
        # figures of drafting: "-" for a run that never drafted
        drafted = _drafted(summary["method"], spec if "drafted_rounds" in spec else summary)
        rows.append({
            "run": _relative(file.parent, root),
            "overrides": job_overrides(file.parent),
            "method": summary["method"],
            "prompts": prompts,
            "prompts_planned": planned,
            "partial": partial,
            "prompts_cell": f"{prompts} of {planned}" if partial else str(prompts),
            "speedup_vs_vanilla": summary.get("speedup_vs_vanilla"),
            "modeled_speedup_vs_vanilla": summary.get("modeled_speedup_vs_vanilla"),
            "tokens_per_s": summary.get("tokens_per_s"),
            "vanilla_tokens_per_s": summary.get("vanilla_tokens_per_s"),
            "acceptance_rate": summary.get("acceptance_rate") if drafted else None,
            "mean_accepted_length": summary.get("mean_accepted_length") if drafted else None,
            "mean_speculation_length": summary.get("mean_speculation_length") if drafted else None,
            "drafter_passes_per_round": spec.get("drafter_passes_per_round") if drafted else None,
            "lossless_fraction": summary.get("lossless_fraction"),
            "lossless": lossless_text(summary),
            "_vanilla": (van or {}).get("generated_tokens", 0), "_vanilla_wall": (van or {}).get("wall_s", 0.0),
        })
    rows.sort(key=lambda r: (r["partial"], r["speedup_vs_vanilla"] is None, -(r["speedup_vs_vanilla"] or 0.0),
                             r["run"]))
    return rows


def dead_jobs(directory: str | Path) -> list[dict[str, Any]]:
    """Jobs under ``directory`` without a ``summary.json``: they died before finishing (killed,
    cancelled by the cluster, an error) or are still running. A job directory is one holding
    Hydra's ``.hydra/`` or a ``results.jsonl``, or a numbered sub-directory of a multirun
    (``hydra.sweep.subdir``). Each entry: ``run``, ``overrides`` and ``prompts_in_results``
    (rows in its ``results.jsonl``, None without one).

    Raises:
        FileNotFoundError: when ``directory`` does not exist.
    """
    from specpolicy.resume import read_results

    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    candidates = {root} if (root / ".hydra").is_dir() or (root / "results.jsonl").is_file() else set()
    candidates |= {d for d in root.iterdir() if d.is_dir() and d.name.isdigit()}
    candidates |= {f.parent for f in root.rglob(".hydra") if f.is_dir()}
    candidates |= {f.parent for f in root.rglob("results.jsonl")}
    out = []
    for job in sorted(candidates, key=lambda d: [int(p) if p.isdigit() else p for p in d.relative_to(root).parts]):
        if _SKIP_DIRS & set(job.relative_to(root).parts) or (job / "summary.json").is_file():
            continue
        results = job / "results.jsonl"
        out.append({"run": _relative(job, root), "overrides": job_overrides(job),
                    "prompts_in_results": len(read_results(results, truncate=False)) if results.is_file() else None})
    return out


def _describe_dead(job: dict[str, Any], common: Sequence[str] = ()) -> str:
    held = job["prompts_in_results"]
    what = "no results.jsonl" if held is None else f"results.jsonl holds {held} prompt{'s' if held != 1 else ''}"
    overrides = " ".join(o for o in job["overrides"] if o not in common)
    return f"{job['run']}" + (f" ({overrides})" if overrides else "") + f": {what}"


def vanilla_reference(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The vanilla-decoding reference row (speedup 1.0): tokens/s pooled over the vanilla
    baselines of the COMPLETE runs (sum of tokens / sum of seconds; partial runs are left out);
    None when no complete run had the baseline."""
    complete = [r for r in rows if not r.get("partial")]
    tokens = sum(r["_vanilla"] for r in complete)
    wall = sum(r["_vanilla_wall"] for r in complete)
    if not tokens or wall <= 0:
        return None
    runs = sum(1 for r in complete if r["_vanilla"])
    prompts = sum(r["prompts"] for r in complete if r["_vanilla"])
    return {
        "run": "-", "overrides": [f"(vanilla decoding, pooled over {runs} complete runs)"], "method": "vanilla",
        "prompts": prompts, "prompts_planned": prompts, "partial": False, "prompts_cell": str(prompts),
        "speedup_vs_vanilla": 1.0,
        "modeled_speedup_vs_vanilla": 1.0 if any(r["modeled_speedup_vs_vanilla"] is not None for r in complete) else None,
        "tokens_per_s": tokens / wall, "vanilla_tokens_per_s": tokens / wall, "acceptance_rate": None,
        "mean_accepted_length": None, "mean_speculation_length": None, "drafter_passes_per_round": None,
        "lossless_fraction": None, "lossless": "reference", "_vanilla": 0, "_vanilla_wall": 0.0,
    }


def report_rows(rows: list[dict[str, Any]], with_vanilla: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows ready to print (complete runs sorted by speedup, the vanilla reference inserted at
    1.0x when ``with_vanilla``, then the partial runs, unranked), each with ``overrides`` reduced
    to the ones that differ between runs, and the overrides common to every run."""
    lists = [r["overrides"] for r in rows]
    common = [o for o in lists[0] if all(o in other for other in lists[1:])] if len(lists) > 1 else []
    out = [{**r, "overrides": [o for o in r["overrides"] if o not in common]} for r in rows]
    reference = vanilla_reference(rows) if with_vanilla else None
    if reference is not None:
        at = next((i for i, r in enumerate(out) if r.get("partial") or (r["speedup_vs_vanilla"] or 0.0) < 1.0),
                  len(out))
        out.insert(at, reference)
    return out, common


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if key == "prompts_cell" and value is None:
        value = row.get("prompts")
    if value is None:
        return "-"
    if key == "overrides":
        return " ".join(value) or "-"
    return fmt.format(value)


def _markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(t for t, _, _, _ in REPORT_COLUMNS) + " |",
             "|" + "|".join("---" if k in _TEXT_KEYS else "---:" for _, k, _, _ in REPORT_COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, k, f).replace("|", "\\|") for _, k, f, _ in REPORT_COLUMNS) + " |")
    return lines


def to_markdown(rows: list[dict[str, Any]], common: Sequence[str] = (), dead: Sequence[dict[str, Any]] = ()) -> str:
    """GitHub-flavoured Markdown: the ranked table of complete runs, the partial runs in a table
    of their own (not ranked), the jobs without a summary, and the common overrides."""
    complete = [r for r in rows if not r.get("partial")]
    partial = [r for r in rows if r.get("partial")]
    lines = _markdown_table(complete)
    if partial:
        lines += ["", "Partial runs (interrupted or short of their planned prompts; not ranked, their vanilla "
                      "figures not pooled):", ""] + _markdown_table(partial)
    if dead:
        lines += ["", "Jobs without a summary.json (died before finishing, or still running):", ""]
        lines += [f"- {_describe_dead(j, common)}" for j in dead]
    if common:
        lines += ["", "Common to every run: `" + " ".join(common) + "`"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write ``rows`` as CSV with full-precision numbers (overrides space-separated); partial
    runs last, marked in the ``partial`` column."""
    import csv

    keys = [k for _, k, _, _ in REPORT_COLUMNS if k != "prompts_cell"]
    keys[keys.index("method") + 1:keys.index("method") + 1] = ["prompts", "prompts_planned", "partial"]
    keys.append("lossless_fraction")
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(keys)
        for row in rows:
            writer.writerow([" ".join(row[k]) if k == "overrides" else ("" if row.get(k) is None else row[k])
                             for k in keys])


def print_report(rows: list[dict[str, Any]], common: Sequence[str] = (), title: str = "",
                 console: Console | None = None, wide: bool = False, width: int | None = None,
                 dead: Sequence[dict[str, Any]] = ()) -> None:
    """Print the sweep report (rich): the ranked table of complete runs, a table of partial runs
    (not ranked), the common overrides and the jobs without a summary. Fits ``width`` (default:
    ``console``'s width, else the terminal's, see ``available_width``) by leaving out the least
    needed columns (named below the table); ``wide`` prints every column however wide. No number
    is ever cut."""
    if not wide:
        width = width or (console.width if console is not None else available_width())
    complete = [r for r in rows if not r.get("partial")]
    partial = [r for r in rows if r.get("partial")]
    out = console
    dropped: list[str] = []
    for group, heading in ((complete, title), (partial, "Partial runs (interrupted or short of their planned "
                                                         "prompts): not ranked, their vanilla figures not pooled")):
        if not group:
            continue
        columns = [Column(t, [_cell(r, k, f) for r in group], text=k in _TEXT_KEYS, drop=d)
                   for t, k, f, d in REPORT_COLUMNS]
        kept, widths, gone = layout(columns, None if wide else width, wide)
        dropped += [t for t in gone if t not in dropped]
        out = print_table(kept, widths, heading, out, width)
    out = out or Console(width=width or available_width())
    if dropped:
        out.print(f"left out to fit {width} characters: {'; '.join(dropped)} (--wide prints them; report.md and "
                  "report.csv have every column)", markup=False)
    if common:
        out.print("common to every run: " + " ".join(common), markup=False)
    if dead:
        out.print(f"{len(dead)} job{'s' if len(dead) != 1 else ''} without a summary.json (died before finishing, "
                  "or still running), not in the table:", markup=False)
        for job in dead:
            out.print(f"  {_describe_dead(job, common)}", markup=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.report DIR [--out OUT] [--no-vanilla] [--wide]``: collect every
    run's ``summary.json`` under DIR into one table sorted by speedup (partial runs apart, not
    ranked; jobs without a summary listed), print it within the terminal's width (``--wide``:
    every column) and write ``report.csv`` and ``report.md`` (into OUT, default DIR). Returns
    the exit status: 0, or 1 when DIR holds no summary."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.report", description=main.__doc__)
    parser.add_argument("directory", help="a Hydra multirun directory (or a single run directory)")
    parser.add_argument("--out", help="where to write report.csv and report.md (default: DIRECTORY)")
    parser.add_argument("--no-vanilla", action="store_true", help="leave out the vanilla reference row")
    parser.add_argument("--wide", action="store_true",
                        help="print every column, however wide (default: fit the terminal)")
    args = parser.parse_args(argv)
    try:
        rows = collect(args.directory)
        dead = dead_jobs(args.directory)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not rows:
        print(f"error: no summary.json under {args.directory}", file=sys.stderr)
        for job in dead:
            print(f"  job without a summary.json: {_describe_dead(job)}", file=sys.stderr)
        return 1
    table, common = report_rows(rows, with_vanilla=not args.no_vanilla)
    out = Path(args.out or args.directory)
    out.mkdir(parents=True, exist_ok=True)
    ranked = sum(1 for r in rows if not r["partial"])
    title = f"{ranked} complete run{'s' if ranked != 1 else ''} in {args.directory}, sorted by speedup"
    print_report(table, common, title=title, wide=args.wide, dead=dead)
    to_csv(table, out / "report.csv")
    (out / "report.md").write_text(to_markdown(table, common, dead), encoding="utf-8")
    print(f"wrote {out / 'report.csv'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
