"""The serving table and figure of a ``generation.batch_size`` sweep (``specpolicy.analysis.report``,
``specpolicy.analysis.plot``): one real batched run and one real batch-1 run of the tiny family, copied into
a sweep's job directories with the batch size, the policy and the serving figures edited per job."""

from __future__ import annotations

import copy
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from specpolicy.analysis.machine import UNTRUSTED_MARK
from specpolicy.analysis.plot import draw_serving, main as plot_main, plot_serving
from specpolicy.analysis.report import BATCH1_LOOP, VANILLA_SERIES, collect_serving, main, serving_of, serving_rows
from specpolicy.analysis.results import read_results, read_run
from specpolicy.core.serving import RequestTiming, one_after_another

TRUSTED = {"timing_trusted": True, "timing_warnings": []}
BUSY = "other processes kept 2.0 of 2 CPUs busy"


@pytest.fixture(scope="module")
def real_runs(family, tmp_path_factory) -> dict[int, Path]:
    """``{batch size: run dir}``: the tiny family, 4 GSM8K prompts, ``policy=goodput-batch``, at
    batch sizes 1 (the batch-1 loop) and 3 (the batched loop)."""
    from hydra import compose, initialize_config_module

    from conftest import overrides
    from specpolicy.run.experiment import run_experiment

    args = [o for o in overrides(family, drafter="drafter") if not o.startswith("dataset.num_prompts")]
    out = {}
    for batch in (1, 3):
        run_dir = tmp_path_factory.mktemp(f"batch{batch}")
        with initialize_config_module("specpolicy.conf", version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[*args, "dataset.num_prompts=4", f"generation.batch_size={batch}", "policy=goodput-batch"],
            )
        run_experiment(cfg, run_dir)
        out[batch] = run_dir
    return out


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _job(root: Path, num: int, source: Path, overrides: list[str], edit) -> Path:
    """Job ``num`` of a sweep under ``root``: ``source``'s results.jsonl and summary.json (edited
    by ``edit(summary)``), with ``overrides`` in ``.hydra/overrides.yaml``."""
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    shutil.copy(source / "results.jsonl", job / "results.jsonl")
    summary = _summary(source)
    summary["timing_conditions"] = dict(TRUSTED)
    edit(summary)
    (job / "summary.json").write_text(json.dumps(summary))
    return job


def _batched(
    method: str,
    batch: int,
    tokens_per_s: float,
    latency_p99_ms: float,
    vanilla_tokens_per_s: float,
    vanilla_wall_s: float = 1.0,
):
    """An edit of the real batched summary: another method and batch size, known serving figures."""

    def edit(summary: dict) -> None:
        summary["method"] = method
        summary["config"]["generation"]["batch_size"] = batch
        serving = summary["serving"]
        serving["batch_size"] = batch
        spec, van = serving["speculative"], serving["vanilla"]
        spec.update(
            throughput_tokens_per_s=tokens_per_s,
            latency_p99_ms=latency_p99_ms,
            ttft_p99_ms=latency_p99_ms / 4,
            tpot_p99_ms=latency_p99_ms / 100,
        )
        van.update(
            throughput_tokens_per_s=vanilla_tokens_per_s,
            wall_s=vanilla_wall_s,
            tokens=vanilla_tokens_per_s * vanilla_wall_s,
            latency_p99_ms=latency_p99_ms / 2,
            ttft_p99_ms=latency_p99_ms / 8,
            tpot_p99_ms=latency_p99_ms / 200,
        )
        serving["throughput_speedup"] = tokens_per_s / vanilla_tokens_per_s

    return edit


def _batch1(method: str):
    def edit(summary: dict) -> None:
        summary["method"] = method

    return edit


COMMON = ["dataset.num_prompts=4", "drafter=ar"]


@pytest.fixture
def sweep(real_runs, tmp_path) -> Path:
    """A ``generation.batch_size=1,2,4,8 policy=static,goodput-batch`` sweep, its jobs numbered out
    of batch-size order, and a partial batched job (interrupted: no serving figures shown)."""
    root = tmp_path / "multirun"
    one, batched = real_runs[1], real_runs[3]
    jobs = [  # (batch size, policy, tokens/s, latency p99 ms, vanilla tokens/s)
        (8, "static", 800.0, 400.0, 1000.0),
        (2, "goodput-batch", 330.0, 900.0, 300.0),
        (4, "static", 520.0, 600.0, 500.0),
        (8, "goodput-batch", 1100.0, 380.0, 1000.0),
        (2, "static", 360.0, 950.0, 300.0),
        (4, "goodput-batch", 610.0, 560.0, 520.0),
    ]
    for num, (batch, policy, tps, p99, van) in enumerate(jobs):
        _job(
            root,
            num,
            batched,
            [*COMMON, f"generation.batch_size={batch}", f"policy={policy}"],
            _batched(f"ar+{policy}", batch, tps, p99, van, vanilla_wall_s=1.0 + batch / 8),
        )
    _job(root, 6, one, [*COMMON, "generation.batch_size=1", "policy=static"], _batch1("ar+static"))
    _job(root, 7, one, [*COMMON, "generation.batch_size=1", "policy=goodput-batch"], _batch1("ar+goodput-batch"))
    partial = _job(
        root,
        8,
        batched,
        [*COMMON, "generation.batch_size=16", "policy=static"],
        _batched("ar+static", 16, 1.0, 1.0, 1.0),
    )
    summary = _summary(partial)
    summary["partial"] = True
    (partial / "summary.json").write_text(json.dumps(summary))
    return root


def _replayed(results_file: Path) -> dict:
    """The batch-1 loop's serving figures computed here by hand from results.jsonl's raw rows:
    requests all arriving at 0, served one after another."""
    rows = [json.loads(line) for line in results_file.read_text().splitlines()]
    walls = np.array([r["wall_s"] for r in rows])
    finish_ms = np.cumsum(walls) * 1e3
    tokens = sum(r["generated_tokens"] for r in rows)
    van_walls = np.array([r["vanilla_wall_s"] for r in rows])
    van_tokens = sum(r["vanilla_generated_tokens"] for r in rows)
    return {
        "throughput": tokens / walls.sum(),
        "latency_p99_ms": float(np.percentile(finish_ms, 99)),
        "first_token_ms": rows[0]["prefill_ms"] + rows[0]["rounds"][0]["draft_ms"] + rows[0]["rounds"][0]["verify_ms"],
        "vanilla_throughput": van_tokens / van_walls.sum(),
        "vanilla_latency_p99_ms": float(np.percentile(np.cumsum(van_walls) * 1e3, 99)),
    }


def test_a_batch_1_run_has_no_serving_block_and_the_report_replays_its_requests(real_runs):
    """The batched run's block is read as written; the batch-1 run's is replayed from its measured
    per-prompt times: tokens / summed wall time, each request finishing when all before it have."""
    batched = _summary(real_runs[3])
    block = serving_of(batched, [])
    assert block["loop"] == "batched" and block["batch_size"] == 3
    assert block["speculative"] == batched["serving"]["speculative"]

    summary = _summary(real_runs[1])
    assert "serving" not in summary  # the premise: the batch-1 loop records no serving figures
    results = read_results(real_runs[1] / "results.jsonl")
    block = serving_of(summary, results)
    expected = _replayed(real_runs[1] / "results.jsonl")
    assert block["loop"] == BATCH1_LOOP and block["batch_size"] == 1 and block["requests"] == 4
    assert block["arrival"] == "all_at_once"
    assert block["speculative"]["throughput_tokens_per_s"] == pytest.approx(expected["throughput"])
    assert block["speculative"]["throughput_tokens_per_s"] == pytest.approx(summary["tokens_per_s"])
    assert block["speculative"]["latency_p99_ms"] == pytest.approx(expected["latency_p99_ms"])
    assert block["speculative"]["ttft_p50_ms"] > expected["first_token_ms"]  # later requests waited
    assert block["vanilla"]["throughput_tokens_per_s"] == pytest.approx(expected["vanilla_throughput"])
    assert block["vanilla"]["latency_p99_ms"] == pytest.approx(expected["vanilla_latency_p99_ms"])
    assert block["throughput_speedup"] == pytest.approx(expected["throughput"] / expected["vanilla_throughput"])


def test_requests_served_one_after_another_wait_for_the_server_or_for_their_arrival():
    timings, wall_s = one_after_another([(1.0, 0.25, 10), (2.0, 0.5, 20), (0.5, 0.1, 5)], [0.0, 0.5, 4.0])
    assert timings == [
        RequestTiming(0.0, 0.0, 0.25, 1.0, 10),  # served at once
        RequestTiming(0.5, 1.0, 1.5, 3.0, 20),  # waits for the first
        RequestTiming(4.0, 4.0, 4.1, 4.5, 5),
    ]  # the server idles until it arrives
    assert wall_s == 4.5


def test_serving_rows_come_from_the_summaries_grouped_by_method_in_batch_size_order(sweep):
    rows = collect_serving(sweep)
    assert [(r["series"], r["batch_size"]) for r in rows] == [
        (VANILLA_SERIES, 1),
        (VANILLA_SERIES, 2),
        (VANILLA_SERIES, 4),
        (VANILLA_SERIES, 8),
        ("ar+goodput-batch", 1),
        ("ar+goodput-batch", 2),
        ("ar+goodput-batch", 4),
        ("ar+goodput-batch", 8),
        ("ar+static", 1),
        ("ar+static", 2),
        ("ar+static", 4),
        ("ar+static", 8),
    ]  # the partial job 8 left out
    by_run = {r["run"]: r for r in rows}
    for num in range(6):  # every batched figure is the summary's
        serving = _summary(sweep / str(num))["serving"]
        row = by_run[str(num)]
        assert row["loop"] == "batched" and row["batch_size"] == serving["batch_size"]
        for key in ("throughput_tokens_per_s", "ttft_p99_ms", "tpot_p99_ms", "latency_p99_ms"):
            assert row[key] == serving["speculative"][key], key
        assert row["throughput_speedup"] == serving["throughput_speedup"]
        assert row["vanilla"] == serving["vanilla"]
    assert by_run["0"]["throughput_tokens_per_s"] == 800.0 and by_run["0"]["throughput_speedup"] == 0.8
    expected = _replayed(sweep / "6" / "results.jsonl")
    assert by_run["6"]["loop"] == BATCH1_LOOP and by_run["6"]["arrival_cell"] == "all_at_once"
    assert by_run["6"]["throughput_tokens_per_s"] == pytest.approx(expected["throughput"])
    assert by_run["6"]["latency_p99_ms"] == pytest.approx(expected["latency_p99_ms"])
    assert by_run["6"]["overrides"] == ["generation.batch_size=1", "policy=static"]  # what differs
    # vanilla at batch size 8: tokens/s pooled over jobs 0 and 3 (each 1000 tokens/s over 2 s), p99 their mean
    vanilla8 = rows[3]
    assert vanilla8["run"] == "-" and vanilla8["pooled_runs"] == ["0", "3"]
    assert vanilla8["throughput_tokens_per_s"] == pytest.approx(1000.0)
    assert vanilla8["latency_p99_ms"] == pytest.approx((400.0 / 2 + 380.0 / 2) / 2)
    vanilla4 = rows[2]  # 500 tokens/s over 1.5 s and 520 over 1.5 s
    assert vanilla4["throughput_tokens_per_s"] == pytest.approx((500 * 1.5 + 520 * 1.5) / 3.0)
    assert rows[0]["loop"] == BATCH1_LOOP
    assert rows[0]["throughput_tokens_per_s"] == pytest.approx(expected["vanilla_throughput"])


def test_lines_are_told_apart_by_the_overrides_that_do_not_place_them(real_runs, tmp_path):
    """Runs of one method with other settings are lines of their own; arrivals that differ are named."""
    root = tmp_path / "multirun"
    batched = real_runs[3]

    def poisson(summary: dict) -> None:
        _batched("ar+static", 2, 200.0, 100.0, 150.0)(summary)
        summary["serving"].update(arrival="poisson", arrival_rate=20.0)

    _job(root, 0, batched, ["generation.batch_size=2", "policy.k=2"], _batched("ar+static", 2, 200.0, 90.0, 150.0))
    _job(root, 1, batched, ["generation.batch_size=2", "policy.k=4"], poisson)
    rows = collect_serving(root)
    assert sorted(r["series"] for r in rows if r["method"] != "vanilla") == [
        "ar+static (policy.k=2) [all_at_once]",
        "ar+static (policy.k=4) [poisson 20/s]",
    ]
    assert sorted(r["series"] for r in rows if r["method"] == "vanilla") == [
        "vanilla [all_at_once]",
        "vanilla [poisson 20/s]",
    ]  # not pooled across arrivals


def test_no_serving_table_without_a_batched_run(real_runs, tmp_path, capsys):
    root = tmp_path / "multirun"
    _job(root, 0, real_runs[1], ["policy=static"], _batch1("ar+static"))
    _job(root, 1, real_runs[1], ["policy=failfast"], _batch1("ar+failfast"))
    assert collect_serving(root) == []
    assert main([str(root), "--wide"]) == 0
    assert "Serving" not in capsys.readouterr().out
    assert "Serving" not in (root / "report.md").read_text() and not (root / "report_serving.csv").exists()


def test_the_report_prints_and_writes_the_serving_table(sweep, capsys):
    summary = _summary(sweep / "4")
    summary["timing_conditions"] = {"timing_trusted": False, "timing_warnings": [BUSY]}
    (sweep / "4" / "summary.json").write_text(json.dumps(summary))
    assert main([str(sweep), "--wide"]) == 0
    out = capsys.readouterr().out
    assert "Serving: throughput and p99 latency by batch size" in out
    assert "report_serving.csv" in out and "python -m specpolicy.analysis.plot" in out
    serving = out.split("Serving: throughput and p99 latency by batch size", 1)[1].splitlines()  # after the runs
    line = next(x for x in serving if "│ 5 " in x)  # ar+goodput-batch at batch size 4
    assert "ar+goodput-batch" in line and "610.0" in line and "1.17x" in line and "560" in line  # 610 / 520
    line = next(x for x in serving if "│ 4 " in x)  # ar+static at batch size 2
    assert "ar+static" in line and f"360.0{UNTRUSTED_MARK}" in line  # job 4 warned: its tokens/s marked
    assert f"  4: {BUSY}" in out.splitlines()
    md = (sweep / "report.md").read_text()
    assert "## Serving: throughput and p99 latency by batch size" in md
    assert "| ar+static | 0 | batched | 8 | all_at_once | 4 | 800.0 | 0.80x | 100.0 | 4.00 | 400 |" in md
    assert f"| ar+static | 4 | batched | 2 | all_at_once | 4 | 360.0\\{UNTRUSTED_MARK} | 1.20x |" in md
    assert "loop batch-1: a generation.batch_size=1 run takes the batch-1 loop" in md
    with open(sweep / "report_serving.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["series"], int(r["batch_size"])) for r in table] == [
        (r["series"], r["batch_size"]) for r in collect_serving(sweep)
    ]
    row = next(r for r in table if r["run"] == "3")
    assert float(row["throughput_tokens_per_s"]) == 1100.0 and float(row["vanilla_throughput_tokens_per_s"]) == 1000.0
    assert float(row["throughput_speedup"]) == pytest.approx(1.1) and row["loop"] == "batched"
    assert next(r for r in table if r["run"] == "4")["timing_trusted"] == "False"
    vanilla2 = next(r for r in table if r["series"] == VANILLA_SERIES and r["batch_size"] == "2")
    assert vanilla2["pooled_runs"] == "1 4" and vanilla2["timing_trusted"] == "False"  # job 4's baseline pooled
    assert float(vanilla2["throughput_tokens_per_s"]) == pytest.approx(300.0)
    assert "- `-`: vanilla at batch size 2 pools the baselines of runs whose timings cannot be trusted: 4" in md


def _lines(ax) -> dict[str, tuple[list, list]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_the_figure_draws_throughput_and_p99_latency_against_batch_size(sweep, tmp_path):
    import matplotlib.pyplot as plt

    rows = collect_serving(sweep)
    fig = draw_serving(rows)
    try:
        throughput, latency = fig.axes
        for ax in (throughput, latency):
            assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1, 2, 4, 8]
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
            assert "batch size" in ax.get_xlabel()
        assert "tokens/s" in throughput.get_ylabel() and "p99 latency (ms" in latency.get_ylabel()
        lines = _lines(throughput)
        assert list(lines) == [VANILLA_SERIES, "ar+goodput-batch", "ar+static"]
        by_run = {r["run"]: r for r in rows}
        assert lines["ar+static"] == ([1, 2, 4, 8], [by_run["6"]["throughput_tokens_per_s"], 360.0, 520.0, 800.0])
        assert _lines(latency)["ar+goodput-batch"] == (
            [1, 2, 4, 8],
            [by_run["7"]["latency_p99_ms"], 900.0, 560.0, 380.0],
        )
        assert lines[VANILLA_SERIES][0] == [1, 2, 4, 8]
        hollow = [line for line in throughput.get_lines() if line.get_markerfacecolor() == "white"]
        assert len(hollow) == 3 and all(list(line.get_xdata()) == [1] for line in hollow)  # the batch-1 loop
        legend = fig.legends[0].get_texts()
        assert [t.get_text() for t in legend][-1].startswith("hollow: batch size 1 by the batch-1 loop")
    finally:
        plt.close(fig)
    path = plot_serving(rows, tmp_path / "serving.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_line_with_untrusted_timings_is_marked_in_the_legend(sweep):
    import matplotlib.pyplot as plt

    rows = copy.deepcopy(collect_serving(sweep))
    for r in rows:
        if r["run"] == "2":
            r.update(timing_trusted=False, timing_warnings=[BUSY])
    fig = draw_serving(rows)
    try:
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert f"ar+static {UNTRUSTED_MARK}" in labels and "ar+goodput-batch" in labels
        notes = [legend.get_title().get_text() for legend in fig.legends]
        assert any(n.startswith(f"{UNTRUSTED_MARK} 1 line: timing cannot be trusted") for n in notes)
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="nothing to plot"):
        draw_serving([])


@pytest.mark.slow  # a matplotlib render of the figures page (the serving table's rows are tested fast above)
def test_plot_writes_the_serving_figure_and_table_on_the_figures_page(sweep, capsys):
    assert plot_main([str(sweep), "--max-pages", "1"]) == 0
    plots = sweep / "plots"
    assert (plots / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (plots / "index.html").read_text()
    assert '<img src="serving.png"' in index and "<h2>Serving: throughput and p99 latency by batch size</h2>" in index
    assert "<td><span class='nowrap'>ar+static</span></td><td>0</td><td>batched</td><td class=\"num\">8</td>" in index
    runs = [read_run(sweep / str(n)) for n in range(9)]
    assert serving_rows(runs, sweep) == collect_serving(sweep)  # the page's rows are the report's
