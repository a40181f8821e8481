"""Honest timings: each run records what the machine was doing (load, CPU time, the spread of
vanilla speed) in summary.json, and the printed summary warns in one line when the measured
speedup cannot be trusted."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_module

import specpolicy.analysis.machine as machine
from conftest import overrides
from specpolicy.analysis.machine import judge, vanilla_spread, warning_line
from specpolicy.analysis.results import PromptResult
from specpolicy.run.experiment import run_experiment


def conditions(load_start, load_end, cv=0.05, cores=2, own=1.9):
    return {
        "cpu_count": cores,
        "load_average_start": [load_start, 0, 0],
        "load_average_end": [load_end, 0, 0],
        "cpu_per_wall": own,
        "vanilla_tokens_per_s_cv": cv,
    }


def test_a_quiet_machine_is_trusted():
    assert judge(conditions(2.0, 2.3)) == []  # this process's own load (1.9) + 0.4 from others
    assert judge(conditions(1.0, 1.0, cv=None)) == []


def test_load_from_other_processes_beyond_the_free_cpus_is_not_trusted():
    (reason,) = judge(conditions(2.0, 9.6))
    assert reason == (
        "other processes kept up to 7.7 of 2 CPUs busy (1-min load average 2.00 at the start, "
        "9.60 at the end; this process used 1.9)"
    )
    assert judge(conditions(6.0, 2.0, cores=8, own=1.0)) == []  # 5 others on 7 free CPUs
    assert len(judge(conditions(9.0, 2.0, cores=8, own=1.0))) == 1  # 8 others on 7 free CPUs


def test_a_large_spread_of_vanilla_speed_is_not_trusted():
    (reason,) = judge(conditions(1.0, 1.0, cv=0.4))
    assert reason == "vanilla decoding speed varied 40% across prompts (coefficient of variation; more than 25%)"


def _result(tokens: int, verify_ms: float, wall_s: float = 9.0, baseline: bool = True) -> PromptResult:
    row = {"prompt_id": "p", "output_ids": [1] * tokens, "rounds": [], "wall_s": 1.0}
    if baseline:
        row.update(
            vanilla_generated_tokens=tokens,
            vanilla_verify_ms=verify_ms,
            vanilla_wall_s=wall_s,
            vanilla_finish_reason="max_new_tokens",
        )
    return PromptResult.from_row(row)


def test_vanilla_spread_is_the_coefficient_of_variation_of_tokens_per_verify_second():
    results = [_result(100, 1000.0), _result(100, 500.0), _result(50, 0.0, wall_s=1.0)]  # the last: wall time
    speeds = [100.0, 200.0, 50.0]
    mean = sum(speeds) / 3
    expected = (sum((s - mean) ** 2 for s in speeds) / 3) ** 0.5 / mean
    assert vanilla_spread(results) == round(expected, 3)
    assert vanilla_spread(results[:2]) is None  # too few prompts to judge
    assert vanilla_spread([_result(10, 5.0, baseline=False)] * 5) is None  # no vanilla baseline
    skipped = PromptResult.skip("long", 9000, "longer than the context")
    assert vanilla_spread([*results, skipped]) == vanilla_spread(results)


def test_a_run_records_the_machine_and_warns_in_one_line_when_busy(family, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(machine, "load_average", lambda: [40.0, 30.0, 20.0])
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*overrides(family), "dataset.num_prompts=3"])
    summary = run_experiment(cfg, tmp_path)
    timing = json.loads((tmp_path / "summary.json").read_text())["timing_conditions"]
    assert timing == summary["timing_conditions"]
    assert set(timing) == {
        "cpu_count",
        "load_average_start",
        "load_average_end",
        "process_cpu_s",
        "wall_s",
        "cpu_per_wall",
        "vanilla_tokens_per_s_cv",
        "timing_trusted",
        "timing_warnings",
    }
    assert timing["load_average_start"] == timing["load_average_end"] == [40.0, 30.0, 20.0]
    assert timing["wall_s"] > 0 and timing["process_cpu_s"] > 0 and timing["cpu_count"] >= 1
    assert timing["vanilla_tokens_per_s_cv"] is not None
    assert timing["timing_trusted"] is False and timing["timing_warnings"][0].startswith("other processes kept")
    assert summary["fields"]["timing_conditions.timing_trusted"].startswith("false when")
    out = capsys.readouterr().out.splitlines()
    warnings = [line for line in out if "cannot be trusted" in line]
    assert warnings == [warning_line(timing)]
    assert warnings[0].startswith("WARNING: the measured speedup cannot be trusted: other processes kept up to ")
    assert warnings[0].endswith(
        " -- re-time on an idle machine with run.resume=false (runtime.threads=N sets the CPU threads a run uses)"
    )
