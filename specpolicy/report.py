"""Printing summaries as tables (rich)."""

from __future__ import annotations

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
    """Print one row per method (vanilla first) plus speedup and losslessness."""
    console = console or Console()
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
    console.print(table)
    for prompt_id, pos in summary.get("not_lossless", {}).items():
        console.print(f"[red]NOT lossless[/red]: prompt {prompt_id} differs from vanilla at output position {pos}")
