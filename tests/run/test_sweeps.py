"""Sweeps: Hydra multirun over any key, the report of a sweep, the submitit local launcher,
the Optuna sweeper (losslessness as a hard constraint) and the paper's study presets."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra_plugins.hydra_optuna_sweeper  # noqa: F401 - test dependencies: a broken install fails here
import hydra_plugins.hydra_submitit_launcher  # noqa: F401
import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import overrides
from specpolicy.analysis.report import collect, main as report_main
from specpolicy.run.cli import sweep_objective


def _cli(monkeypatch, *args: str) -> None:
    """``python -m specpolicy ARGS`` in this process."""
    from specpolicy.run.cli import main

    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    main()


def _summaries(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))}


@pytest.mark.slow  # a multirun
def test_multirun_2x2_over_policy_keys_and_report(family, tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    _cli(
        monkeypatch,
        "-m",
        *overrides(family, drafter="drafter"),
        "policy=failfast",
        "policy.n=2",
        "policy.tau=0.0,1.0",
        "policy.n_max=2,6",
        f"hydra.sweep.dir={sweep}",
    )
    summaries = _summaries(sweep)
    assert len(summaries) == 4
    grid = {(s["config"]["policy"]["tau"], s["config"]["policy"]["n_max"]): s for s in summaries.values()}
    assert set(grid) == {(0.0, 2), (0.0, 6), (1.0, 2), (1.0, 6)}
    assert all(s["lossless_fraction"] == 1.0 for s in summaries.values())
    # tau = 0 always extends to n_max; tau = 1 never extends past the first chunk of n = 2
    assert max(r["speculation_length"] for r in _rounds(sweep, grid[(0.0, 6)])) == 6
    assert max(r["speculation_length"] for r in _rounds(sweep, grid[(1.0, 6)])) == 2
    capsys.readouterr()
    assert report_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "policy.tau=0.0" in out and "policy.n_max=6" in out and "common to every run: " in out
    assert "| policy.tau=0.0 policy.n_max=6 |" in (sweep / "report.md").read_text()
    rows = collect(sweep)
    speedups = [r["speedup_vs_vanilla"] for r in rows]
    assert len(rows) == 4 and speedups == sorted(speedups, reverse=True)
    assert (sweep / "report.csv").exists() and (sweep / "report.md").exists()


def test_a_bad_value_in_any_job_stops_the_sweep_before_the_first_job(family, tmp_path, monkeypatch, capsys):
    """The default sweeper composes and checks every job (all batches) before launching one."""
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info:
        _cli(
            monkeypatch,
            "-m",
            *overrides(family),
            "policy=failfast",
            "policy.tau=0.2,0.4,2.0",
            "seed=${hydra:job.num}",
            "hydra.sweeper.max_batch_size=1",
            f"hydra.sweep.dir={sweep}",
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith("error: policy.tau must be in [0, 1], got 2.0 (sweep job #2: ")
    assert "policy.tau=2.0" in err[0] and err[0].endswith("; no job was launched)")
    assert not sweep.exists()  # no job ran, not even the good ones


def test_a_job_that_does_not_compose_is_named(family, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli(
            monkeypatch,
            "-m",
            *overrides(family),
            "policy=failfast,static",
            "policy.tau=0.3",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown key policy.tau; policy has keys k, name")
    assert "(sweep job #1: " in err[0] and err[0].endswith("policy=static policy.tau=0.3; no job was launched)")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("choice", ["hydra/launcher=slurm_cpu", "hydra/sweeper=failfast_optuna", None])
def test_only_grid_sweeps_that_run_here_are_checked_up_front(monkeypatch, tmp_path, choice):
    """On a Slurm node the checks (CUDA, files, environment) are the node's: such jobs check
    themselves there; an Optuna sweep picks values as it goes. The basic grid run here is checked."""
    from specpolicy.run import preflight

    def expand(config):
        raise AssertionError("expanded")

    monkeypatch.setattr(preflight, "sweep_jobs", expand)
    for command in ("sbatch", "srun", "squeue"):  # Slurm's commands, so that the Slurm sweep gets past its own check
        (tmp_path / command).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[choice] if choice else [], return_hydra_config=True)
    if choice:
        preflight.SweepPreflight().on_multirun_start(config=cfg)
    else:
        with pytest.raises(AssertionError, match="expanded"):
            preflight.SweepPreflight().on_multirun_start(config=cfg)


def test_the_sweeper_resolves_each_jobs_hydra_interpolations(family, tmp_path, monkeypatch):
    """``${hydra:job.num}`` resolves per job in the check as in the job itself (seed = job number)."""
    from specpolicy.core.errors import ConfigError

    seen = []

    def record_then_stop(config, pm):
        seen.append(config)
        if len(seen) == 2:
            raise ConfigError("stop before launching")

    monkeypatch.setattr("specpolicy.run.validation.validate_config", record_then_stop)
    with pytest.raises(SystemExit):
        _cli(
            monkeypatch,
            "-m",
            *overrides(family),
            "policy.tau=0.1,0.3",
            "seed=${hydra:job.num}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        )
    assert [(config["seed"], config["policy"]["tau"]) for config in seen] == [(0, 0.1), (1, 0.3)]
    assert "hydra" not in seen[0]


def _rounds(sweep: Path, summary: dict) -> list[dict]:
    job = next(p.parent for p in sweep.glob("*/summary.json") if json.loads(p.read_text()) == summary)
    return [r for line in (job / "results.jsonl").read_text().splitlines() for r in json.loads(line)["rounds"]]


@pytest.mark.slow  # a multirun in subprocesses
def test_submitit_local_launcher_runs_the_sweep_as_separate_jobs(family, tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    _cli(
        monkeypatch,
        "-m",
        *overrides(family),
        "policy=static",
        "policy.k=2,4",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        f"hydra.sweep.dir={sweep}",
    )
    summaries = _summaries(sweep)
    assert sorted(s["config"]["policy"]["k"] for s in summaries.values()) == [2, 4]
    assert all(s["lossless_fraction"] == 1.0 for s in summaries.values())
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2  # two submitit jobs


@pytest.mark.slow  # an Optuna multirun
@pytest.mark.filterwarnings("ignore:.*declarative_base")  # optuna 2.10 on SQLAlchemy 2
def test_optuna_sweeper_maximises_lossless_speedup(family, tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    _cli(
        monkeypatch,
        "-m",
        *overrides(family),
        "hydra/sweeper=failfast_optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=1",
        f"hydra.sweep.dir={sweep}",
    )
    result = OmegaConf.load(sweep / "optimization_results.yaml")
    summaries = _summaries(sweep)
    assert len(summaries) == 2
    values = [sweep_objective(s) for s in summaries.values()]
    assert result.best_value == pytest.approx(max(values)) and result.best_value > 0
    assert 0.05 <= result.best_params["policy.tau"] <= 0.95 and result.best_params["policy.n_max"] % 10 == 0


def test_sweep_objective_treats_losslessness_as_a_hard_constraint():
    assert sweep_objective({"speedup_vs_vanilla": 2.5, "lossless_fraction": 1.0}) == 2.5
    assert sweep_objective({"speedup_vs_vanilla": 9.0, "lossless_fraction": 0.95}) == 0.0
    assert sweep_objective({"tokens_per_s": 10.0}) == 0.0  # no vanilla baseline: nothing to maximise


def _sweep_values(params: dict, key: str) -> list:
    (override,) = OverridesParser.create().parse_overrides([f"{key}={params[key]}"])
    return list(override.sweep_iterator())


@pytest.mark.parametrize(
    "preset,drafter,policy,key,expected",
    [
        (
            "tau-sensitivity",
            "fastdllm",
            "failfast",
            "policy.tau",
            [0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9],
        ),
        ("nmax-sensitivity", "fastdllm", "failfast", "policy.n_max", [10, 20, 30, 40, 50, 60, 70, 80, 100]),
        ("static-k-ar", "ar", "static", "policy.k", list(range(3, 21))),
        ("static-k-fastdllm", "fastdllm", "static", "policy.k", list(range(3, 21))),
        ("drafter-threshold", "fastdllm", "failfast", "drafter.threshold", [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9]),
        (
            "paper-main",
            "fastdllm",
            "failfast",
            "method",
            [
                "ar+static-k5",
                "fastdllm-default",
                "fastdllm+failfast",
                "fail-fast-only",
                "win-big-only",
                "dflash+failfast",
                "dflash-failfast-tuned",
                "eagle3+static-k5",
            ],
        ),
        ("failfast-grid", "fastdllm", "failfast", "policy.n", [3, 4, 6, 10]),
        ("concavity", "fastdllm", "static", "drafter.threshold", [0.05, 0.3, 0.5, 0.7, 0.9, 0.99]),
        ("concavity", "fastdllm", "static", "policy.k", [2, 4, 8, 16, 32]),
        ("speculation-off", "fastdllm", "aimd", "policy.off_when_slower", [False, True]),
        ("speculation-off", "fastdllm", "aimd", "drafter.threshold", [0.05, 0.95]),
        ("speculation-off", "fastdllm", "aimd", "dataset", ["humaneval", "math500"]),
        ("failfast-grid", "fastdllm", "failfast", "policy.tau", [0.45, 0.6, 0.7, 0.8]),
    ],
)
def test_experiment_presets_define_the_paper_studies(preset, drafter, policy, key, expected):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    assert (cfg.drafter.name, cfg.policy.name) == (drafter, policy)
    assert _sweep_values(cfg.hydra.sweeper.params, key) == expected
    assert preset in cfg.hydra.sweep.dir


@pytest.mark.parametrize(
    "method,drafter,threshold,policy,settings",
    [
        ("ar+static-k5", "ar", None, "static", {"k": 5}),
        ("fastdllm+static-k5", "fastdllm", 0.05, "static", {"k": 5}),
        (
            "fastdllm+failfast",
            "fastdllm",
            0.05,
            "failfast",
            {"n": 10, "tau": 0.45, "n_max": 60, "confidence_scope": "draft"},
        ),
        # the paper's baselines and ablations (FailFast §5.1, App. D.1)
        ("fastdllm-default", "fastdllm", 0.9, "static", {"k": 5}),
        ("fail-fast-only", "fastdllm", 0.05, "static", {"k": 10}),
        ("win-big-only", "fastdllm", 0.9, "failfast", {"n": 10, "tau": 0.45, "n_max": 60}),
        # drafters that read the target (DFlash, EAGLE-3 chain)
        ("dflash+failfast", "dflash", None, "failfast", {"n": 10, "tau": 0.45, "n_max": 60}),
        ("dflash-failfast-tuned", "dflash", None, "failfast", {"n": 5, "tau": 0.7, "n_max": 60}),
        ("dflash-static", "dflash", None, "static", {"k": 5}),
        ("eagle3+static-k5", "eagle3", None, "static", {"k": 5}),
        # FailFast's neighbours in their own settings (DiffuSpec, EasySpec)
        ("diffuspec-fastdllm", "fastdllm", 0.05, "adl", {"k_min": 20, "k_max": 30, "delta": 10, "rho": 0.5}),
        ("diffuspec-dflash", "dflash", None, "adl", {"k_min": 20, "k_max": 30, "delta": 10, "rho": 0.5}),
        ("easyspec-lp2-k5", "easyspec", None, "static", {"k": 5}),
        ("diffuspec-fastdllm-l0.8", "fastdllm", 0.05, "adl", {"k_min": 20, "k_max": 30}),
        ("diffuspec-dflash-l0.8", "dflash", None, "adl", {"k_min": 20, "k_max": 30}),
    ],
)
def test_method_presets_pick_drafter_and_policy(method, drafter, threshold, policy, settings):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"method={method}"])
        assert (cfg.drafter.name, cfg.policy.name, cfg.method.name) == (drafter, policy, method)
        assert cfg.drafter.get("threshold") == threshold
        assert {k: cfg.policy[k] for k in settings} == settings
        cfg = compose("config", overrides=[f"method={method}", "policy=aimd"])  # the command line still wins
        assert (cfg.drafter.name, cfg.policy.name) == (drafter, "aimd")
        if threshold is not None:
            assert compose("config", overrides=[f"method={method}", "drafter.threshold=0.3"]).drafter.threshold == 0.3
        if method.startswith("diffuspec"):  # the path search on, one refinement pass over fastdllm's block
            cfg = compose("config", overrides=[f"method={method}"])
            assert cfg.drafter.path_search == "cps"
            assert cfg.drafter.cps_lambda == (0.8 if method.endswith("-l0.8") else 0.5)
            assert drafter != "fastdllm" or cfg.drafter.small_block_size == cfg.drafter.block_size == 32


def test_slurm_launcher_and_optuna_sweeper_configs_compose():
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.timeout_min, launcher.partition) == (1, 240, "gpu")
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=["hydra/sweeper=failfast_optuna"], return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == "maximize"
    assert set(cfg.hydra.sweeper.params) == {"policy.tau", "policy.n_max"}
