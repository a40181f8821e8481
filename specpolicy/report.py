"""Printing summaries as tables (rich), and the sweep report:
``python -m specpolicy.report <multirun dir>`` collects every run's ``summary.json`` into one
table sorted by speedup, printed and written as ``report.csv`` and ``report.md``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("acceptance rate", "acceptance_rate", "{:.3f}"),
    ("mean acc. len", "mean_accepted_length", "{:.2f}"),
    ("mean spec. len", "mean_speculation_length", "{:.2f}"),
    ("max acc. len", "max_accepted_length", "{}"),
    ("max spec. len", "max_speculation_length", "{}"),
    ("rounds", "rounds", "{}"),
    ("drafter passes/round", "drafter_passes_per_round", "{:.2f}"),
    ("tokens/s", "tokens_per_s", "{:.1f}"),
)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """Print one row per method (vanilla first) plus speedup and losslessness; without a
    ``console``, as wide as the table needs (no cell is cut, even when stdout is a file)."""
    table = Table(title=f"{summary['method']} on {summary['prompts']} prompts")
    table.add_column("method")
    for title, _, _ in COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("speedup vs vanilla", justify="right")
    table.add_column("lossless", justify="right")
    van = summary["methods"].get("vanilla")
    for name in sorted(summary["methods"], key=lambda n: n != "vanilla"):
        m = summary["methods"][name]
        speed = f"{m['tokens_per_s'] / van['tokens_per_s']:.2f}x" if van else "-"
        if name == "vanilla":
            lossless = "reference"
        elif "lossless_fraction" in summary:
            lossless = f"{round(summary['lossless_fraction'] * summary['prompts'])}/{summary['prompts']}"
        else:
            lossless = "-"
        table.add_row(name, *(fmt.format(m[key]) for _, key, fmt in COLUMNS), speed, lossless)
    if console is None:
        needed = Console(width=10_000).measure(table).maximum
        console = Console(width=max(needed, Console().width))
    console.print(table)
    modeled = summary.get("modeled")
    if modeled:  # never mistaken for a measurement: its own line, labelled
        measured = summary.get("speedup_vs_vanilla")
        console.print(f"speedup vs vanilla: measured {'-' if measured is None else f'{measured:.2f}x'} | "
                      f"MODELED (not measured) {modeled['speedup_vs_vanilla']:.2f}x with profile "
                      f"{modeled['profile']['name']} (by profile: " + ", ".join(
                          f"{k} {v:.2f}x" for k, v in modeled.get("speedup_by_profile", {}).items()) + ")",
                      markup=False)
    if summary.get("oracle"):
        o = summary["oracle"]
        console.print(f"oracle length policy: this policy reaches {o['fraction_of_oracle']:.3f} of the oracle's "
                      f"speedup (modeled with measured costs: {o['policy_speedup_modeled']:.2f}x vs "
                      f"{o['oracle_speedup_modeled']:.2f}x; {o['source']})", markup=False)
    for prompt_id, pos in summary.get("not_lossless", {}).items():
        console.print(f"[red]NOT lossless[/red]: prompt {prompt_id} differs from vanilla at output position {pos}")


# -- sweep reports: python -m specpolicy.report <multirun dir> --------------------------------

#: Columns of the sweep report: (title, row key, format).
REPORT_COLUMNS = (
    ("run", "run", "{}"),
    ("overrides", "overrides", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("speedup", "speedup_vs_vanilla", "{:.3f}x"),
    ("modeled speedup", "modeled_speedup_vs_vanilla", "{:.3f}x"),
    ("tokens/s", "tokens_per_s", "{:.1f}"),
    ("vanilla tokens/s", "vanilla_tokens_per_s", "{:.1f}"),
    ("acceptance rate", "acceptance_rate", "{:.3f}"),
    ("mean acc. len", "mean_accepted_length", "{:.2f}"),
    ("mean spec. len", "mean_speculation_length", "{:.2f}"),
    ("drafter passes/round", "drafter_passes_per_round", "{:.2f}"),
    ("lossless", "lossless", "{}"),
)
_SKIP_DIRS = {"wandb", ".submitit", ".hydra"}


def _overrides(job_dir: Path) -> list[str]:
    """The job's command-line/sweep overrides from Hydra's ``.hydra/overrides.yaml``."""
    file = job_dir / ".hydra" / "overrides.yaml"
    if not file.exists():
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(file)]


def collect(directory: str | Path) -> list[dict[str, Any]]:
    """One row per ``summary.json`` under ``directory`` (a multirun dir, or a single run dir).

    A row holds ``run`` (the job directory relative to ``directory``), ``overrides`` (the job's
    Hydra overrides, a list), the summary's headline numbers (``modeled_speedup_vs_vanilla``
    None when the summary has none), ``drafter_passes_per_round``,
    ``lossless`` ("k/n" prompts) and ``lossless_fraction``; ``speedup_vs_vanilla`` is None for a
    run without the vanilla baseline. Rows are sorted by speedup, highest first.

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
        prompts = int(summary.get("prompts", 0))
        fraction = summary.get("lossless_fraction")
        rows.append({
            "run": str(file.parent.relative_to(root)) if file.parent != root else ".",
            "overrides": _overrides(file.parent),
            "method": summary["method"],
            "prompts": prompts,
            "speedup_vs_vanilla": summary.get("speedup_vs_vanilla"),
            "modeled_speedup_vs_vanilla": summary.get("modeled_speedup_vs_vanilla"),
            "tokens_per_s": summary.get("tokens_per_s"),
            "vanilla_tokens_per_s": summary.get("vanilla_tokens_per_s"),
            "acceptance_rate": summary.get("acceptance_rate"),
            "mean_accepted_length": summary.get("mean_accepted_length"),
            "mean_speculation_length": summary.get("mean_speculation_length"),
            "drafter_passes_per_round": spec.get("drafter_passes_per_round"),
            "lossless_fraction": fraction,
            "lossless": "-" if fraction is None else f"{round(fraction * prompts)}/{prompts}",
            "_vanilla": (van or {}).get("generated_tokens", 0), "_vanilla_wall": (van or {}).get("wall_s", 0.0),
        })
    rows.sort(key=lambda r: (r["speedup_vs_vanilla"] is None, -(r["speedup_vs_vanilla"] or 0.0), r["run"]))
    return rows


def vanilla_reference(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The vanilla-decoding reference row (speedup 1.0): tokens/s pooled over every run's
    vanilla baseline (sum of tokens / sum of seconds); None when no run had the baseline."""
    tokens = sum(r["_vanilla"] for r in rows)
    wall = sum(r["_vanilla_wall"] for r in rows)
    if not tokens or wall <= 0:
        return None
    runs = sum(1 for r in rows if r["_vanilla"])
    return {
        "run": "-", "overrides": [f"(vanilla decoding, pooled over {runs} runs)"], "method": "vanilla",
        "prompts": sum(r["prompts"] for r in rows if r["_vanilla"]), "speedup_vs_vanilla": 1.0,
        "modeled_speedup_vs_vanilla": 1.0 if any(r["modeled_speedup_vs_vanilla"] is not None for r in rows) else None,
        "tokens_per_s": tokens / wall, "vanilla_tokens_per_s": tokens / wall, "acceptance_rate": None,
        "mean_accepted_length": None, "mean_speculation_length": None, "drafter_passes_per_round": None,
        "lossless_fraction": None, "lossless": "reference", "_vanilla": 0, "_vanilla_wall": 0.0,
    }


def report_rows(rows: list[dict[str, Any]], with_vanilla: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows ready to print (sorted by speedup, the vanilla reference inserted at 1.0x when
    ``with_vanilla``), each with ``overrides`` reduced to the ones that differ between runs,
    and the overrides common to every run."""
    lists = [r["overrides"] for r in rows]
    common = [o for o in lists[0] if all(o in other for other in lists[1:])] if len(lists) > 1 else []
    out = [{**r, "overrides": [o for o in r["overrides"] if o not in common]} for r in rows]
    reference = vanilla_reference(rows) if with_vanilla else None
    if reference is not None:
        at = next((i for i, r in enumerate(out) if (r["speedup_vs_vanilla"] or 0.0) < 1.0), len(out))
        out.insert(at, reference)
    return out, common


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key == "overrides":
        return " ".join(value) or "-"
    return fmt.format(value)


def to_markdown(rows: list[dict[str, Any]], common: list[str] = ()) -> str:
    """A GitHub-flavoured Markdown table (one line per row) plus the common overrides."""
    lines = ["| " + " | ".join(t for t, _, _ in REPORT_COLUMNS) + " |",
             "|" + "|".join("---:" if k not in ("run", "overrides", "method") else "---" for _, k, _ in REPORT_COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, k, f).replace("|", "\\|") for _, k, f in REPORT_COLUMNS) + " |")
    if common:
        lines += ["", "Common to every run: `" + " ".join(common) + "`"]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write ``rows`` as CSV with full-precision numbers (overrides space-separated)."""
    import csv

    keys = [k for _, k, _ in REPORT_COLUMNS] + ["lossless_fraction"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(keys)
        for row in rows:
            writer.writerow([" ".join(row[k]) if k == "overrides" else ("" if row.get(k) is None else row[k])
                             for k in keys])


def print_report(rows: list[dict[str, Any]], common: list[str] = (), title: str = "",
                 console: Console | None = None) -> None:
    """Print the sweep table (rich), as wide as its cells need (no cell is cut)."""
    if console is None:
        cells = [[t for t, _, _ in REPORT_COLUMNS]] + [[_cell(r, k, f) for _, k, f in REPORT_COLUMNS] for r in rows]
        needed = sum(max(len(c[i]) for c in cells) + 3 for i in range(len(REPORT_COLUMNS))) + 1
        console = Console(width=max(needed, Console().width))
    table = Table(title=title or None, caption=("common: " + " ".join(common)) if common else None)
    for t, k, _ in REPORT_COLUMNS:
        table.add_column(t, justify="left" if k in ("run", "overrides", "method") else "right")
    for row in rows:
        table.add_row(*(_cell(row, k, f) for _, k, f in REPORT_COLUMNS))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.report DIR [--out OUT] [--no-vanilla]``: collect every run's
    ``summary.json`` under DIR into one table sorted by speedup, print it and write
    ``report.csv`` and ``report.md`` (into OUT, default DIR). Returns the exit status:
    0, or 1 when DIR holds no summary."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.report", description=main.__doc__)
    parser.add_argument("directory", help="a Hydra multirun directory (or a single run directory)")
    parser.add_argument("--out", help="where to write report.csv and report.md (default: DIRECTORY)")
    parser.add_argument("--no-vanilla", action="store_true", help="leave out the vanilla reference row")
    args = parser.parse_args(argv)
    try:
        rows = collect(args.directory)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not rows:
        print(f"error: no summary.json under {args.directory}", file=sys.stderr)
        return 1
    table, common = report_rows(rows, with_vanilla=not args.no_vanilla)
    out = Path(args.out or args.directory)
    out.mkdir(parents=True, exist_ok=True)
    print_report(table, common, title=f"{len(rows)} runs in {args.directory}, sorted by speedup")
    to_csv(table, out / "report.csv")
    (out / "report.md").write_text(to_markdown(table, common), encoding="utf-8")
    print(f"wrote {out / 'report.csv'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
