"""``python -m specpolicy.analysis.report``: one table from every run's summary.json of a sweep."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from specpolicy.analysis.report import collect, main, report_rows, to_markdown


def _job(
    root: Path,
    num: int,
    overrides: list[str],
    speedup: float | None,
    lossless: float = 1.0,
    van_tokens: int = 100,
    van_wall: float = 2.0,
    modeled: float | None = None,
    warnings: list[str] | None = None,
) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    summary = {
        "method": "fastdllm+failfast",
        "prompts": 4,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 3.0,
        "mean_speculation_length": 6.0,
        "tokens_per_s": 10.0 * (speedup or 1.0),
        "methods": {"fastdllm+failfast": {"drafter_passes_per_round": 1.5}},
    }
    if modeled is not None:
        summary["modeled_speedup_vs_vanilla"] = modeled
    if speedup is not None:
        summary.update(speedup_vs_vanilla=speedup, vanilla_tokens_per_s=10.0, lossless_fraction=lossless)
        summary["methods"]["vanilla"] = {"generated_tokens": van_tokens, "wall_s": van_wall}
    if warnings is not None:  # what the run recorded about the machine (specpolicy.analysis.machine)
        summary["timing_conditions"] = {"timing_trusted": not warnings, "timing_warnings": warnings}
    (job / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "multirun"
    _job(root, 0, ["policy=failfast", "policy.tau=0.1", "policy.n_max=30"], 1.20)
    _job(root, 1, ["policy=failfast", "policy.tau=0.1", "policy.n_max=60"], 0.80, lossless=0.75)
    _job(
        root,
        2,
        ["policy=failfast", "policy.tau=0.45", "policy.n_max=30"],
        2.50,
        van_tokens=300,
        van_wall=2.0,
        modeled=3.1,
    )
    _job(root, 3, ["policy=failfast", "policy.tau=0.45", "policy.n_max=60"], None)  # no vanilla baseline
    (root / "4").mkdir()  # a failed job: no summary.json
    (root / "0" / "wandb" / "offline-run-x" / "files").mkdir(parents=True)
    (root / "0" / "wandb" / "offline-run-x" / "files" / "summary.json").write_text("{}")  # not a run summary
    return root


def test_collect_sorts_by_speedup_and_reads_overrides(sweep):
    rows = collect(sweep)
    assert [r["run"] for r in rows] == ["2", "0", "1", "3"]
    assert rows[0]["overrides"] == ["policy=failfast", "policy.tau=0.45", "policy.n_max=30"]
    assert rows[2]["lossless"] == "3/4" and rows[3]["lossless"] == "-"
    assert rows[0]["drafter_passes_per_round"] == 1.5
    assert rows[0]["modeled_speedup_vs_vanilla"] == 3.1 and rows[1]["modeled_speedup_vs_vanilla"] is None


def test_report_rows_vanilla_reference_and_varying_overrides(sweep):
    table, common = report_rows(collect(sweep))
    assert common == ["policy=failfast"]
    assert [r["run"] for r in table] == ["2", "0", "-", "1", "3"]  # vanilla (1.0x) between 1.2x and 0.8x
    vanilla = table[2]
    assert vanilla["method"] == "vanilla" and vanilla["speedup_vs_vanilla"] == 1.0
    assert vanilla["modeled_speedup_vs_vanilla"] == 1.0
    assert vanilla["tokens_per_s"] == pytest.approx((100 + 100 + 300) / 6.0)  # pooled over the 3 baselines
    assert table[0]["overrides"] == ["policy.tau=0.45", "policy.n_max=30"]
    md = to_markdown(table, common)
    assert md.splitlines()[2].startswith(
        "| 2 | policy.tau=0.45 policy.n_max=30 | fastdllm+failfast | 4 | 2.500x | 3.100x |"
    )
    assert md.splitlines()[3].startswith("| 0 | policy.tau=0.1 policy.n_max=30 | fastdllm+failfast | 4 | 1.200x | - |")
    assert "Common to every run: `policy=failfast`" in md


def test_main_prints_and_writes_csv_and_markdown(sweep, capsys):
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "2.500x" in out and "0.800x" in out and "wrote" in out
    with open(sweep / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["2", "0", "-", "1", "3"]
    assert float(rows[0]["speedup_vs_vanilla"]) == 2.5 and rows[4]["speedup_vs_vanilla"] == ""
    assert (sweep / "report.md").read_text().count("\n| ") == 5  # 5 data rows after the header rule


def test_main_fails_cleanly_without_summaries(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert "no summary.json" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 1


BUSY = "other processes kept up to 2.0 of 2 CPUs busy (1-min load average 3.10 at the start; this process used 1.0)"


def test_untrusted_timings_are_marked_wherever_speedups_are_ranked(tmp_path, capsys):
    """Issue 22: jobs that warned and recorded timing_trusted: false were ranked by measured speedup
    with no note, and report.md / report.csv never mentioned it."""
    root = tmp_path / "multirun"
    _job(root, 0, ["policy.tau=0.1"], 1.40, warnings=[BUSY])
    _job(root, 1, ["policy.tau=0.3"], 1.30, warnings=[])
    _job(root, 2, ["policy.tau=0.6"], 1.20)  # recorded no timing conditions: not judged, not marked
    assert main([str(root), "--wide"]) == 0
    out = capsys.readouterr().out
    assert "1.400x*" in out and "1.300x*" not in out and "1.200x*" not in out
    assert "(1 with timings that cannot be trusted: marked *, see below)" in out
    note = next(line for line in out.splitlines() if line.startswith("* timing cannot be trusted"))
    assert "run.resume=false" in note
    assert f"  0: {BUSY}" in out.splitlines()
    md = (root / "report.md").read_text()
    assert "| 0 | policy.tau=0.1 | fastdllm+failfast | 4 | 1.400x\\* |" in md
    assert "| 1 | policy.tau=0.3 | fastdllm+failfast | 4 | 1.300x |" in md
    assert "\\* timing cannot be trusted" in md and f"- `0`: {BUSY}" in md
    with open(root / "report.csv", newline="") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert (rows["0"]["timing_trusted"], rows["1"]["timing_trusted"], rows["2"]["timing_trusted"]) == (
        "False",
        "True",
        "",
    )
    assert rows["0"]["timing_warnings"] == BUSY and float(rows["0"]["speedup_vs_vanilla"]) == 1.4


def test_a_single_run_shows_its_name_and_its_full_overrides(family, tmp_path, monkeypatch, capsys):
    """Issue 22: the run directory's name is shortened (model paths, cut values), so the report and
    the figures page show the run's name -- not "." -- and its overrides in full (.hydra)."""
    import re
    import sys

    from conftest import overrides
    from specpolicy.analysis.plot import main as plot
    from specpolicy.run.cli import main as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    args = [*overrides(family), "dataset.num_prompts=1", "policy=static", "policy.k=3", "reuse.enabled=true"]
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    cli()
    (run,) = (tmp_path / "outputs").iterdir()
    assert re.search(r"policy\.k=3,policy=static,reuse\.enabled=true,.*model=target-[0-9a-f]{8}$", run.name)
    capsys.readouterr()
    assert main([str(run), "--wide"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in (run / "report.md").read_text().splitlines() if "static" in x)
    assert line.startswith(f"| {run.name} | ")
    for override in args:  # every override in full, model paths included
        assert override in line, override
    assert "│ . " not in out
    assert plot([str(run)]) == 0
    index = (run / "plots" / "index.html").read_text()
    first_row = index.split("<tbody><tr>", 1)[1]
    assert first_row.startswith(f"<td>{run.name}</td>")


@pytest.mark.parametrize("columns", ["100", None])
def test_the_modeled_column_the_docs_compare_by_is_shown(sweep, capsys, monkeypatch, columns):
    """The docs tell users to compare methods by the MODELED speedup (clock-free): the printed report
    shows that column at a 100-character terminal and in a log (stdout not a terminal); it is the
    last column left out when a table must shrink."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "MODELED" in out and "3.100x" in out and "2.500x" in out
    assert "left out to fit" not in out or "MODELED" not in out.split("left out to fit", 1)[1].split("\n")[0]
