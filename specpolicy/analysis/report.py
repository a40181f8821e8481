"""The sweep report: ``python -m specpolicy.analysis.report <multirun dir>`` collects every run's
``summary.json`` (read with ``specpolicy.analysis.results``) into one table sorted by speedup, printed
within the terminal's width and written as ``report.csv`` and ``report.md``. A run's figures are
``specpolicy.analysis.summary.headline`` of its summary; the columns are ``specpolicy.analysis.labels.FIGURES``
and the layout is ``specpolicy.analysis.tables``'s (the run's own summary table is
``specpolicy.analysis.tables.print_summary``). When runs carry ``summary.json``'s ``serving`` block (a
``generation.batch_size`` sweep), a serving table follows (``serving_rows``: throughput and p99
latency per run by batch size, vanilla per batch size), printed, in ``report.md`` and as
``report_serving.csv``; ``specpolicy.analysis.plot`` draws it (``serving.png``)."""

from __future__ import annotations

# The serving table and the helpers it shares with the sweep table live in report_serving; they are
# re-exported here (``from specpolicy.analysis.report import serving_rows`` keeps working).
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, timing_trusted, untrusted_reasons
from specpolicy.analysis.report_serving import (  # noqa: F401 (BATCH1_LOOP ... serving_rows: re-exported)
    BATCH1_LOOP,
    SERVING_COLUMNS,
    SERVING_FIGURES,
    VANILLA_SERIES,
    _planned,
    _relative,
    collect_serving,
    is_partial,
    print_serving_table,
    serving_csv,
    serving_markdown,
    serving_of,
    serving_rows,
    untrusted,
    untrusted_notes,
)
from specpolicy.analysis.results import (
    RESULTS_FILE,
    SKIP_DIRS,
    SUMMARY_FILE,
    find_runs,
    job_overrides,
    read_summary,
    scan_results,
)
from specpolicy.analysis.summary import headline
from specpolicy.analysis.tables import (
    FIGURES,
    TREE_NOTE,
    Column,
    available_width,
    layout,
    lossless_text,
    method_drafted,
    print_table,
)

# -- sweep reports: python -m specpolicy.analysis.report <multirun dir> --------------------------------

#: Columns of the sweep report: (title, row key, format, drop order). When the table does not
#: fit the terminal, the columns with the highest drop order go first (0: never dropped); every
#: column is always in report.md and report.csv, and ``--wide`` prints them all. Titles and
#: formats are ``FIGURES``' (speedups with one more digit: the report ranks by them).
REPORT_COLUMNS = (
    ("run", "run", "{}", 0),
    ("overrides", "overrides", "{}", 0),
    ("method", "method", "{}", 0),
    ("prompts", "prompts_cell", "{}", 0),
    *(
        (FIGURES[key].short, key, fmt or FIGURES[key].fmt, drop)
        for key, fmt, drop in (
            ("speedup_vs_vanilla", "{:.3f}x", 0),
            ("modeled_speedup_vs_vanilla", "{:.3f}x", 1),  # clock-free, the docs compare by it: left out last
            ("tokens_per_s", None, 5),
            ("vanilla_tokens_per_s", None, 6),
            ("acceptance_rate", None, 2),
            ("mean_accepted_length", None, 2),
            ("mean_speculation_length", None, 2),
            ("drafter_passes_per_round", None, 4),
            ("lossless", None, 0),
        )
    ),
)
_TEXT_KEYS = ("run", "overrides", "method")


def collect(directory: str | Path) -> list[dict[str, Any]]:
    """One row per ``summary.json`` under ``directory`` (a multirun dir, or a single run dir).

    A row holds ``run`` (the job directory relative to ``directory``), ``overrides`` (the job's
    Hydra overrides, a list), the summary's headline numbers (``modeled_speedup_vs_vanilla``
    None when the summary has none), ``drafter_passes_per_round``, ``lossless`` ("k/n" prompts,
    ``n/a (sampling)``, or ``-``), ``lossless_fraction``, ``prompts`` (finished),
    ``prompts_planned``, ``partial`` (``is_partial``) and ``prompts_cell`` (``"4"``, or
    ``"1 of 4"`` for a partial run), ``timing_trusted`` (``specpolicy.analysis.machine.timing_trusted``:
    False when the run warned that its timings cannot be trusted, None when it recorded no timing
    conditions) and ``timing_warnings`` (why); ``speedup_vs_vanilla`` is None for a run without the
    vanilla baseline. Complete runs come first, sorted by speedup (highest first), then partial runs.

    Raises:
        FileNotFoundError: when ``directory`` does not exist.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    rows = []
    for run_dir in find_runs(root, SUMMARY_FILE):
        summary = read_summary(run_dir / SUMMARY_FILE)
        if summary is None or "method" not in summary or "methods" not in summary:  # not a run's summary
            continue
        spec = summary["methods"].get(summary["method"], {})
        van = summary["methods"].get("vanilla")
        prompts, planned, partial = int(summary.get("prompts", 0)), _planned(summary), is_partial(summary)
        figures = headline(summary)
        # figures of drafting: "-" for a run that never drafted
        drafted = method_drafted(summary["method"], spec if "drafted_rounds" in spec else summary)
        for key in ("acceptance_rate", "mean_accepted_length", "mean_speculation_length", "drafter_passes_per_round"):
            if not drafted:
                figures[key] = None
        rows.append(
            {
                "run": _relative(run_dir, root),
                "overrides": job_overrides(run_dir),
                **figures,
                "prompts": prompts,
                "prompts_planned": planned,
                "partial": partial,
                "prompts_cell": f"{prompts} of {planned}" if partial else str(prompts),
                "lossless": lossless_text(summary),
                "timing_trusted": timing_trusted(summary),
                "timing_warnings": untrusted_reasons(summary),
                "_vanilla": (van or {}).get("generated_tokens", 0),
                "_vanilla_wall": (van or {}).get("wall_s", 0.0),
            }
        )
    rows.sort(
        key=lambda r: (r["partial"], r["speedup_vs_vanilla"] is None, -(r["speedup_vs_vanilla"] or 0.0), r["run"])
    )
    return rows


#: The run lock a run takes after validation, before any model loads (``specpolicy.run.runlock.LOCK_FILE``;
#: analysis does not import run): a job directory without it never started.
LOCK_FILE = "run.lock"


def never_started(job: Path) -> bool:
    """Whether a job directory holds Hydra's ``.hydra/`` but no ``results.jsonl``, no
    ``summary.json`` and no ``run.lock``: its command failed validation before the run started
    (nothing died; the command printed why)."""
    return (job / ".hydra").is_dir() and not any((job / f).exists() for f in (RESULTS_FILE, SUMMARY_FILE, LOCK_FILE))


def dead_jobs(directory: str | Path) -> list[dict[str, Any]]:
    """Jobs under ``directory`` without a ``summary.json``: they died before finishing (killed,
    cancelled by the cluster, an error) or are still running. A job directory is one holding
    Hydra's ``.hydra/`` or a ``results.jsonl``, or a numbered sub-directory of a multirun
    (``hydra.sweep.subdir``); one whose command failed validation (``never_started``: no run lock,
    no results) is not a job that died. Each entry: ``run``, ``overrides`` and
    ``prompts_in_results`` (rows in its ``results.jsonl``, None without one).

    Raises:
        FileNotFoundError: when ``directory`` does not exist.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    candidates = {root} if (root / ".hydra").is_dir() or (root / RESULTS_FILE).is_file() else set()
    candidates |= {d for d in root.iterdir() if d.is_dir() and d.name.isdigit()}
    candidates |= {f.parent for f in root.rglob(".hydra") if f.is_dir()}
    candidates |= {f.parent for f in root.rglob(RESULTS_FILE)}
    out = []
    for job in sorted(candidates, key=lambda d: [int(p) if p.isdigit() else p for p in d.relative_to(root).parts]):
        if SKIP_DIRS & set(job.relative_to(root).parts) or (job / SUMMARY_FILE).is_file() or never_started(job):
            continue
        results = job / RESULTS_FILE
        out.append(
            {
                "run": _relative(job, root),
                "overrides": job_overrides(job),
                "prompts_in_results": len(scan_results(results)[0]) if results.is_file() else None,
            }
        )
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
        "run": "-",
        "overrides": [f"(vanilla decoding, pooled over {runs} complete runs)"],
        "method": "vanilla",
        "prompts": prompts,
        "prompts_planned": prompts,
        "partial": False,
        "prompts_cell": str(prompts),
        "speedup_vs_vanilla": 1.0,
        "modeled_speedup_vs_vanilla": 1.0
        if any(r["modeled_speedup_vs_vanilla"] is not None for r in complete)
        else None,
        "tokens_per_s": tokens / wall,
        "vanilla_tokens_per_s": tokens / wall,
        "acceptance_rate": None,
        "mean_accepted_length": None,
        "mean_speculation_length": None,
        "drafter_passes_per_round": None,
        "lossless_fraction": None,
        "lossless": "reference",
        "timing_trusted": None,
        "timing_warnings": [],
        "_vanilla": 0,
        "_vanilla_wall": 0.0,
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
        at = next(
            (i for i, r in enumerate(out) if r.get("partial") or (r["speedup_vs_vanilla"] or 0.0) < 1.0), len(out)
        )
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
    if key == "speedup_vs_vanilla" and row.get("timing_trusted") is False:  # ranked by it: marked, explained below
        return fmt.format(value) + UNTRUSTED_MARK
    return fmt.format(value)


def _markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| " + " | ".join(t for t, _, _, _ in REPORT_COLUMNS) + " |",
        "|" + "|".join("---" if k in _TEXT_KEYS else "---:" for _, k, _, _ in REPORT_COLUMNS) + "|",
    ]
    for row in rows:
        lines.append(
            "| "
            + " | ".join(_cell(row, k, f).replace("|", "\\|").replace("*", "\\*") for _, k, f, _ in REPORT_COLUMNS)
            + " |"
        )
    return lines


def to_markdown(rows: list[dict[str, Any]], common: Sequence[str] = (), dead: Sequence[dict[str, Any]] = ()) -> str:
    """GitHub-flavoured Markdown: the ranked table of complete runs, the partial runs in a table
    of their own (not ranked), the note on speedups marked as timings that cannot be trusted
    (``untrusted``), the jobs without a summary, and the common overrides."""
    complete = [r for r in rows if not r.get("partial")]
    partial = [r for r in rows if r.get("partial")]
    lines = _markdown_table(complete)
    if partial:
        lines += [
            "",
            "Partial runs (interrupted or short of their planned prompts; not ranked, their vanilla "
            "figures not pooled):",
            "",
        ] + _markdown_table(partial)
    marked = untrusted(rows)
    if marked:
        lines += ["", f"\\{UNTRUSTED_MARK} {UNTRUSTED_NOTE}; measured speedup and tokens/s of:", ""]
        lines += [f"- `{r['run']}`: {'; '.join(r.get('timing_warnings') or [])}" for r in marked]
    if any(r.get("tree_rounds") for r in rows):
        lines += ["", TREE_NOTE[:1].upper() + TREE_NOTE[1:] + "."]
    if dead:
        lines += ["", "Jobs without a summary.json (died before finishing, or still running):", ""]
        lines += [f"- {_describe_dead(j, common)}" for j in dead]
    if common:
        lines += ["", "Common to every run: `" + " ".join(common) + "`"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write ``rows`` as CSV with full-precision numbers (overrides space-separated); partial
    runs last, marked in the ``partial`` column; ``timing_trusted`` (True / False / empty: not
    judged) and ``timing_warnings`` (``; ``-separated) say whether a run's timings can be trusted."""
    import csv

    keys = [k for _, k, _, _ in REPORT_COLUMNS if k != "prompts_cell"]
    keys[keys.index("method") + 1 : keys.index("method") + 1] = ["prompts", "prompts_planned", "partial"]
    keys += ["lossless_fraction", "timing_trusted", "timing_warnings"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(keys)
        for row in rows:
            writer.writerow(
                [
                    " ".join(row[k])
                    if k == "overrides"
                    else "; ".join(row.get(k) or [])
                    if k == "timing_warnings"
                    else ("" if row.get(k) is None else row[k])
                    for k in keys
                ]
            )


def print_report(
    rows: list[dict[str, Any]],
    common: Sequence[str] = (),
    title: str = "",
    console: Console | None = None,
    wide: bool = False,
    width: int | None = None,
    dead: Sequence[dict[str, Any]] = (),
) -> None:
    """Print the sweep report (rich): the ranked table of complete runs, a table of partial runs
    (not ranked), the note on speedups marked as timings that cannot be trusted
    (``untrusted_notes``), the common overrides and the jobs without a summary. Fits ``width`` (default:
    ``console``'s width, else the terminal's, see ``available_width``) by leaving out the least
    needed columns (named below the table); ``wide`` prints every column however wide. No number
    is ever cut."""
    if not wide:
        width = width or (console.width if console is not None else available_width())
    complete = [r for r in rows if not r.get("partial")]
    partial = [r for r in rows if r.get("partial")]
    out = console
    dropped: list[str] = []
    for group, heading in (
        (complete, title),
        (
            partial,
            "Partial runs (interrupted or short of their planned "
            "prompts): not ranked, their vanilla figures not pooled",
        ),
    ):
        if not group:
            continue
        columns = [
            Column(t, [_cell(r, k, f) for r in group], text=k in _TEXT_KEYS, drop=d) for t, k, f, d in REPORT_COLUMNS
        ]
        kept, widths, gone = layout(columns, None if wide else width, wide)
        dropped += [t for t in gone if t not in dropped]
        out = print_table(kept, widths, heading, out, width)
    out = out or Console(width=width or available_width())
    if dropped:
        out.print(
            f"left out to fit {width} characters: {'; '.join(dropped)} (--wide prints them; report.md and "
            "report.csv have every column)",
            markup=False,
        )
    for line in untrusted_notes(rows):
        out.print(line, markup=False)
    if any(r.get("tree_rounds") for r in rows):  # their acceptance rate and speculation length count nodes
        out.print(TREE_NOTE, markup=False)
    if common:
        out.print("common to every run: " + " ".join(common), markup=False)
    if dead:
        out.print(
            f"{len(dead)} job{'s' if len(dead) != 1 else ''} without a summary.json (died before finishing, "
            "or still running), not in the table:",
            markup=False,
        )
        for job in dead:
            out.print(f"  {_describe_dead(job, common)}", markup=False)


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.analysis.report DIR [--out OUT] [--no-vanilla] [--wide]``: collect every
    run's ``summary.json`` under DIR into one table sorted by speedup (partial runs apart, not
    ranked; jobs without a summary listed), print it within the terminal's width (``--wide``:
    every column) and write ``report.csv`` and ``report.md`` (into OUT, default DIR). When runs
    carry a ``serving`` block (``generation.batch_size`` > 1), the serving table too
    (``serving_rows``: throughput and p99 latency per run by batch size), printed, in
    ``report.md`` and as ``report_serving.csv``; its figure is ``python -m specpolicy.analysis.plot DIR``'s
    ``serving.png``. Returns the exit status: 0, or 1 when DIR holds no summary."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.analysis.report", description=main.__doc__)
    parser.add_argument("directory", help="a Hydra multirun directory (or a single run directory)")
    parser.add_argument("--out", help="where to write report.csv and report.md (default: DIRECTORY)")
    parser.add_argument("--no-vanilla", action="store_true", help="leave out the vanilla reference row")
    parser.add_argument(
        "--wide", action="store_true", help="print every column, however wide (default: fit the terminal)"
    )
    args = parser.parse_args(argv)
    try:
        rows = collect(args.directory)
        dead = dead_jobs(args.directory)
        serving = collect_serving(args.directory)
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
    title = f"{ranked} complete run{'s' if ranked != 1 else ''} in {args.directory}, sorted by measured speedup"
    untrusted = sum(1 for r in rows if not r["partial"] and r["timing_trusted"] is False)
    if untrusted:
        title += f" ({untrusted} with timings that cannot be trusted: marked {UNTRUSTED_MARK}, see below)"
    print_report(table, common, title=title, wide=args.wide, dead=dead)
    to_csv(table, out / "report.csv")
    markdown = to_markdown(table, common, dead)
    if serving:
        print()
        print_serving_table(serving, wide=args.wide)
        serving_csv(serving, out / "report_serving.csv")
        markdown += "\n" + serving_markdown(serving)
    (out / "report.md").write_text(markdown, encoding="utf-8")
    print(
        f"wrote {out / 'report.csv'}"
        + (f", {out / 'report_serving.csv'}" if serving else "")
        + f" and {out / 'report.md'}"
    )
    if serving:
        print(
            f"figure of throughput and p99 latency against batch size: python -m specpolicy.analysis.plot {args.directory}"
            " (plots/serving.png)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
