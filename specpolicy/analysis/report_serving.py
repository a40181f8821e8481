"""The serving table of the sweep report (``python -m specpolicy.analysis.report``): when runs
carry ``summary.json``'s ``serving`` block (a ``generation.batch_size`` sweep), throughput and p99
latency per run by batch size, vanilla per batch size (``serving_rows``), printed, in
``report.md`` and as ``report_serving.csv``; ``specpolicy.analysis.plot`` draws it (``serving.png``).
Titles and formats: ``specpolicy.analysis.labels.FIGURES`` (``SERVING_REPORT_KEYS``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from specpolicy.analysis.labels import SERVING_REPORT_KEYS
from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, timing_trusted, untrusted_reasons
from specpolicy.analysis.results import (
    RESULTS_FILE,
    SUMMARY_FILE,
    find_runs,
    job_overrides,
    read_summary,
)
from specpolicy.analysis.tables import (
    FIGURES,
    Column,
    available_width,
    layout,
    print_table,
)

# -- shared with the sweep table (specpolicy.analysis.report) ------------------------------------


def _relative(path: Path, root: Path) -> str:
    """A job directory as the report's ``run`` column shows it: relative to the directory reported
    on, or its own name when that is the run itself (a single run: its name, never ".")."""
    return str(path.relative_to(root)) if path != root else path.resolve().name


def _planned(summary: dict[str, Any]) -> int:
    """Prompts the run was configured to decode (``prompts_total``; ``prompts`` when absent)."""
    return int(summary.get("prompts_total", summary.get("prompts", 0)) or 0)


def is_partial(summary: dict[str, Any]) -> bool:
    """Whether a summary covers fewer prompts than planned: ``"partial": true`` (interrupted),
    or fewer prompts than ``prompts_total``."""
    return bool(summary.get("partial")) or int(summary.get("prompts", 0)) < _planned(summary)


def untrusted(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose timings cannot be trusted (``timing_trusted`` False): their measured speedup
    is marked ``UNTRUSTED_MARK`` and explained by ``untrusted_notes``."""
    return [r for r in rows if r.get("timing_trusted") is False]


def untrusted_notes(rows: Sequence[dict[str, Any]], marked_figures: str = "measured speedup and tokens/s") -> list[str]:
    """The footnote of the figures marked ``UNTRUSTED_MARK`` (``marked_figures``, e.g. the
    speedups): what the mark means, then one line per such run with its reasons; empty when every
    run's timings can be trusted (or were not judged)."""
    marked = untrusted(rows)
    if not marked:
        return []
    return [f"{UNTRUSTED_MARK} {UNTRUSTED_NOTE}; {marked_figures} of:"] + [
        f"  {r['run']}: {'; '.join(r.get('timing_warnings') or [])}" for r in marked
    ]


# -- serving: throughput and p99 latency against batch size (generation.batch_size sweeps) --------

#: Figures of the serving table, by their key in ``summary.json``'s ``serving.speculative`` /
#: ``serving.vanilla`` (``specpolicy.core.serving.summarize``): (title, format). report_serving.csv
#: holds them at full precision, the run's own and its vanilla baseline's.
SERVING_FIGURES = {k: (FIGURES[k].short, FIGURES[k].fmt) for k in SERVING_REPORT_KEYS}


def _figure_column(key: str, drop: int) -> tuple[str, str, str, int]:
    title, fmt = SERVING_FIGURES[key]
    return title, key, fmt, drop


#: Columns of the serving table: (title, row key, format, drop order; see ``REPORT_COLUMNS``).
SERVING_COLUMNS = (
    ("method", "series", "{}", 0),
    ("run", "run", "{}", 4),
    ("loop", "loop", "{}", 3),
    ("batch size", "batch_size", "{}", 0),
    ("arrival", "arrival_cell", "{}", 2),
    ("requests", "requests", "{}", 5),
    _figure_column("throughput_tokens_per_s", 0),
    ("x vanilla (same batch size)", "throughput_speedup", "{:.2f}x", 0),
    _figure_column("ttft_p99_ms", 1),
    _figure_column("tpot_p99_ms", 1),
    _figure_column("latency_p99_ms", 0),
)
_SERVING_TEXT_KEYS = ("series", "run", "loop", "arrival_cell")
#: The ``loop`` of a batch-1 run's row: the batch-1 loop (``specpolicy.core.decoding``), its serving
#: figures replayed from its measured per-prompt times (``serving_of``).
BATCH1_LOOP = "batch-1"
VANILLA_SERIES = "vanilla"
#: Overrides that place a run on the figure's axes or name its method: not part of its line's name.
_PLACING_KEYS = ("generation.batch_size", "generation.arrival", "generation.arrival_rate", "policy", "drafter")


def _number(value: Any) -> float | None:
    """``value`` as a float; None when it is missing or NaN (no request finished)."""
    return None if value is None or value != value else float(value)


def arrival_text(arrival: str, rate: Any) -> str:
    """How the requests arrived, in a cell: ``generation.arrival`` (``all_at_once``), with the
    rate for Poisson arrivals (``poisson 20/s``)."""
    return f"poisson {float(rate or 0.0):g}/s" if arrival == "poisson" else arrival


def serving_of(summary: dict[str, Any], results: Sequence[Any]) -> dict[str, Any] | None:
    """A run's ``serving`` block: ``summary["serving"]`` when the batched loop ran it
    (``generation.batch_size`` > 1), else -- a batch-1 run, which has none -- one replayed from its
    ``results`` (``PromptResult``s read from ``results.jsonl``, skipped prompts left out): the
    requests arrive as the run's ``generation.arrival`` / ``arrival_rate`` / ``seed`` say and are
    served one after another in prompt order, each taking its measured ``wall_s`` (first token
    after the prefill and the first round, ``specpolicy.core.serving.first_token_s``), the speculative
    method and vanilla decoding alike (``specpolicy.core.serving.one_after_another`` then
    ``summarize``, the batched loop's statistics). Its ``loop`` is ``BATCH1_LOOP``. None for a
    batch-1 run without results."""
    from specpolicy.core.serving import arrival_times, first_token_s, one_after_another, summarize

    if "serving" in summary:
        return {**summary["serving"], "loop": "batched"}
    config = summary.get("config") or {}
    generation = config.get("generation") or {}
    decoded = [r for r in results if not r.skipped]
    if int(generation.get("batch_size", 1) or 1) != 1 or not decoded:
        return None
    arrival, rate = str(generation.get("arrival", "all_at_once")), float(generation.get("arrival_rate", 0.0) or 0.0)
    arrivals = arrival_times(len(decoded), arrival, rate, int(config.get("seed", 0) or 0))

    def replay(outputs: list[Any]) -> dict[str, float]:
        timings, wall_s = one_after_another(
            [(g.wall_s, first_token_s(g), g.generated_tokens) for g in outputs], arrivals
        )
        return summarize(timings, wall_s)

    block: dict[str, Any] = {
        "batch_size": 1,
        "arrival": arrival,
        "arrival_rate": rate,
        "requests": len(decoded),
        "loop": BATCH1_LOOP,
        "speculative": replay([r.speculative for r in decoded]),
    }
    if all(r.vanilla is not None for r in decoded):
        block["vanilla"] = replay([r.vanilla for r in decoded])
        if block["vanilla"]["tokens"]:
            block["throughput_speedup"] = (
                block["speculative"]["throughput_tokens_per_s"] / block["vanilla"]["throughput_tokens_per_s"]
            )
    return block


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _pooled_vanilla(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The vanilla row of one batch size and arrival, from the vanilla baselines of ``rows`` (the
    runs measured there): tokens/s pooled (sum of tokens / sum of seconds), each p99 the mean of
    the runs' p99s (of those where a request finished); ``run`` ``-``, ``pooled_runs`` the runs it
    pools, ``throughput_speedup`` 1.0."""
    measured = [r for r in rows if r["vanilla"]]
    wall_s = sum(r["vanilla"]["wall_s"] for r in measured)
    requests = sorted({r["requests"] for r in measured})
    marked = [r["run"] for r in measured if r["timing_trusted"] is False]
    first = measured[0]
    return {
        "run": "-",
        "series": VANILLA_SERIES,
        "method": "vanilla",
        "overrides": [],
        "loop": first["loop"],
        "batch_size": first["batch_size"],
        "arrival": first["arrival"],
        "arrival_rate": first["arrival_rate"],
        "arrival_cell": first["arrival_cell"],
        "requests": requests[0] if len(requests) == 1 else f"{requests[0]}-{requests[-1]}",
        "throughput_tokens_per_s": sum(r["vanilla"]["tokens"] for r in measured) / wall_s if wall_s > 0 else None,
        **{
            k: _mean([_number(r["vanilla"].get(k)) for r in measured])
            for k in SERVING_FIGURES
            if k != "throughput_tokens_per_s"
        },
        "throughput_speedup": 1.0,
        "vanilla": None,
        "pooled_runs": [r["run"] for r in measured],
        "timing_trusted": False if marked else None,
        "timing_warnings": [
            f"vanilla at batch size {first['batch_size']} pools the baselines of runs whose timings "
            f"cannot be trusted: {', '.join(marked)}"
        ]
        if marked
        else [],
    }


def serving_rows(runs: Sequence[Any], root: str | Path) -> list[dict[str, Any]]:
    """The serving table of ``runs`` (``specpolicy.analysis.results.Run``; a batch-1 run needs its
    ``results``): empty unless some run has a ``serving`` block (the batched loop ran it). Else one
    row per complete run with a serving block or a batch-1 loop (``serving_of``; partial runs are
    left out) and, per batch size and arrival, a vanilla row pooled over those runs' baselines
    (``_pooled_vanilla``). A row holds ``run`` (relative to ``root``), ``method``, ``overrides``
    (those that differ between the runs), ``series`` (its line in the figure: the method and the
    differing overrides that do not place it on the axes, ``VANILLA_SERIES`` for vanilla; the
    arrival in brackets when the runs' arrivals differ), ``loop`` (``batched`` or ``BATCH1_LOOP``),
    ``batch_size``, ``arrival``, ``arrival_rate``, ``arrival_cell``, ``requests``, the speculative
    method's ``SERVING_FIGURES`` (ms, tokens/s; None where no request finished),
    ``throughput_speedup`` (its tokens/s over vanilla's at the same batch size in the same run;
    None without the baseline), ``vanilla`` (the run's own baseline figures, None without),
    ``timing_trusted`` and ``timing_warnings`` (``specpolicy.analysis.machine``). Sorted: vanilla first,
    then by line name, each line by batch size."""
    root = Path(root)
    if not any("serving" in run.summary for run in runs):
        return []
    placed = [
        (run, block)
        for run in runs
        if run.summary and not is_partial(run.summary) and (block := serving_of(run.summary, run.results)) is not None
    ]
    lists = [job_overrides(run.directory) for run, _ in placed]
    common = [o for o in lists[0] if all(o in other for other in lists[1:])] if len(lists) > 1 else []
    rows = []
    for (run, block), overrides in zip(placed, lists):
        differing = [o for o in overrides if o not in common]
        naming = [o for o in differing if o.split("=", 1)[0].lstrip("+~") not in _PLACING_KEYS]
        method = str(run.summary["method"])
        spec, van = block["speculative"], block.get("vanilla")
        rows.append(
            {
                "run": _relative(run.directory, root),
                "method": method,
                "overrides": differing,
                "series": method + (f" ({' '.join(naming)})" if naming else ""),
                "loop": block["loop"],
                "batch_size": int(block["batch_size"]),
                "arrival": block["arrival"],
                "arrival_rate": block["arrival_rate"],
                "arrival_cell": arrival_text(block["arrival"], block["arrival_rate"]),
                "requests": int(block["requests"]),
                **{k: _number(spec.get(k)) for k in SERVING_FIGURES},
                "throughput_speedup": _number(block.get("throughput_speedup")),
                "vanilla": van,
                "timing_trusted": timing_trusted(run.summary),
                "timing_warnings": untrusted_reasons(run.summary),
            }
        )
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["vanilla"]:
            groups.setdefault((r["batch_size"], r["arrival_cell"]), []).append(r)
    out = [_pooled_vanilla(group) for group in groups.values()] + rows
    if len({r["arrival_cell"] for r in out}) > 1:  # lines of other arrivals are other lines
        for r in out:
            r["series"] += f" [{r['arrival_cell']}]"
    out.sort(key=lambda r: ("pooled_runs" not in r, r["series"], r["batch_size"], r["run"]))
    return out


def collect_serving(directory: str | Path) -> list[dict[str, Any]]:
    """``serving_rows`` of every run's ``summary.json`` under ``directory`` (its batch-1 runs'
    ``results.jsonl`` read only when some run has a serving block); empty when none has.

    Raises:
        FileNotFoundError: when ``directory`` does not exist.
    """
    from specpolicy.analysis.results import Run, read_run

    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    runs = []
    for run_dir in find_runs(root, SUMMARY_FILE):
        summary = read_summary(run_dir / SUMMARY_FILE)
        if summary is not None and "method" in summary and "methods" in summary:  # a run's summary
            runs.append(Run(str(summary["method"]), run_dir, [], summary))
    if not any("serving" in run.summary for run in runs):
        return []
    for run in runs:
        if "serving" not in run.summary and (run.directory / RESULTS_FILE).is_file():
            run.results = read_run(run.directory).results
    return serving_rows(runs, root)


def serving_cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """A serving table cell as text: ``-`` where there is no value; the tokens/s of a run whose
    timings cannot be trusted marked ``UNTRUSTED_MARK`` (explained by ``untrusted_notes``)."""
    value = row.get(key)
    if value is None:
        return "-"
    if key == "throughput_tokens_per_s" and row.get("timing_trusted") is False:
        return fmt.format(value) + UNTRUSTED_MARK
    return fmt.format(value)


#: Heading of the serving table, and what its numbers are (printed after it).
SERVING_HEADING = "Serving: throughput and p99 latency by batch size"
SERVING_DETAIL = (
    "measured; x vanilla: over vanilla decoding at the same batch size in the same run; vanilla rows: "
    "tokens/s pooled over the runs at that batch size, p99s their mean"
)
SERVING_TITLE = f"{SERVING_HEADING} ({SERVING_DETAIL})"
SERVING_NOTE = (
    f"loop {BATCH1_LOOP}: a generation.batch_size=1 run takes the batch-1 loop, which records no serving "
    "figures; they are replayed: its requests queued one after another at the run's arrivals, each "
    "taking its measured time (results.jsonl)."
)


def serving_markdown(rows: list[dict[str, Any]]) -> str:
    """The serving table in GitHub-flavoured Markdown under its heading, with the note on the
    batch-1 loop (when a row has it) and on tokens/s marked ``UNTRUSTED_MARK``; empty without rows."""
    if not rows:
        return ""
    lines = [
        f"## {SERVING_TITLE}",
        "",
        "| " + " | ".join(t for t, _, _, _ in SERVING_COLUMNS) + " |",
        "|" + "|".join("---" if k in _SERVING_TEXT_KEYS else "---:" for _, k, _, _ in SERVING_COLUMNS) + "|",
    ]
    lines += [
        "| "
        + " | ".join(serving_cell(r, k, f).replace("|", "\\|").replace("*", "\\*") for _, k, f, _ in SERVING_COLUMNS)
        + " |"
        for r in rows
    ]
    if any(r["loop"] == BATCH1_LOOP for r in rows):
        lines += ["", SERVING_NOTE]
    marked = untrusted(rows)
    if marked:
        lines += ["", f"\\{UNTRUSTED_MARK} {UNTRUSTED_NOTE}; measured tokens/s of:", ""]
        lines += [f"- `{r['run']}`: {'; '.join(r.get('timing_warnings') or [])}" for r in marked]
    return "\n".join(lines) + "\n"


def serving_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write the serving rows as CSV at full precision: the table's columns, the runs' differing
    overrides and, for a vanilla row, the runs it pools (``pooled_runs``; both space-separated),
    each run's own vanilla baseline (``vanilla_<figure>``; empty for the vanilla rows and runs
    without one), ``timing_trusted`` and ``timing_warnings``."""
    import csv

    keys = [
        "series",
        "method",
        "run",
        "overrides",
        "pooled_runs",
        "loop",
        "batch_size",
        "arrival",
        "arrival_rate",
        "requests",
        *SERVING_FIGURES,
        "throughput_speedup",
    ]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(keys + [f"vanilla_{k}" for k in SERVING_FIGURES] + ["timing_trusted", "timing_warnings"])
        for r in rows:
            cells = [
                " ".join(r.get(k) or []) if k in ("overrides", "pooled_runs") else ("" if r.get(k) is None else r[k])
                for k in keys
            ]
            cells += [
                "" if not r["vanilla"] or _number(r["vanilla"].get(k)) is None else r["vanilla"][k]
                for k in SERVING_FIGURES
            ]
            writer.writerow(
                cells + ["" if r["timing_trusted"] is None else r["timing_trusted"], "; ".join(r["timing_warnings"])]
            )


def print_serving_table(
    rows: list[dict[str, Any]], console: Console | None = None, wide: bool = False, width: int | None = None
) -> None:
    """Print the serving table (rich) within ``width`` (default: the terminal's; ``wide``: every
    column), the columns left out named below it, then the notes of ``serving_markdown``."""
    if not wide:
        width = width or (console.width if console is not None else available_width())
    columns = [
        Column(t, [serving_cell(r, k, f) for r in rows], text=k in _SERVING_TEXT_KEYS, drop=d)
        for t, k, f, d in SERVING_COLUMNS
    ]
    kept, widths, dropped = layout(columns, None if wide else width, wide)
    out = print_table(kept, widths, SERVING_TITLE, console, width)
    if dropped:
        out.print(
            f"left out to fit {width} characters: {'; '.join(dropped)} (--wide prints them; report.md and "
            "report_serving.csv have every column)",
            markup=False,
        )
    if any(r["loop"] == BATCH1_LOOP for r in rows):
        out.print(SERVING_NOTE, markup=False)
    for line in untrusted_notes(rows, "measured tokens/s"):
        out.print(line, markup=False)
