"""Sweeps on Slurm. The watcher and the presets are tested everywhere; the ``slow`` tests run on a
real cluster: the local single-node cluster of ``scripts/slurm-local.sh up`` (``.ci/run`` starts
it), and are skipped when it is not running.

Each cluster test launches ``python -m specpolicy -m ...`` on the tiny family (2 prompts, 16 new tokens,
no warm-up) through a Slurm launcher and checks the jobs' results and the sweep report:
``hydra/launcher=submitit_slurm`` (the plugin's bare defaults), the ``slurm`` preset without a
GPU, and ``slurm_cpu`` with a pending job's reason logged, an ``scancel``led array task ending
the launcher's wait (the cluster has no accounting: ``sacct`` cannot tell), and a preempted job
(submitit's signal, USR2) requeued and resumed from ``results.jsonl`` without recomputing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import overrides
from specpolicy.core.errors import EXIT_FAILURE, one_line
from specpolicy.run.slurm import GONE, SqueueWatcher

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path(os.environ.get("SPECPOLICY_SLURM_DIR", "/tmp/specpolicy-slurm"))
LAUNCH_TIMEOUT_S = 900  # a sweep of two tiny jobs; generous for a loaded machine


# -- without a cluster: the watcher on a scripted squeue, the presets ---------------------------------


@pytest.fixture
def fake_squeue(tmp_path, monkeypatch):
    """``squeue`` on PATH answering what the test writes: ``answer(stdout, rc=0, stderr="")``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text(f'#!/bin/sh\ncat "{tmp_path}/out"; cat "{tmp_path}/err" >&2; exit $(cat "{tmp_path}/rc")\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def answer(stdout: str, rc: int = 0, stderr: str = "") -> None:
        (tmp_path / "out").write_text(stdout)
        (tmp_path / "err").write_text(stderr)
        (tmp_path / "rc").write_text(str(rc))

    return answer


def test_squeue_watcher_follows_states_logs_pending_reasons_and_ends_jobs_squeue_forgot(fake_squeue, caplog):
    caplog.set_level("INFO", logger="specpolicy.run.slurm")
    watcher = SqueueWatcher(remind_s=0.0)
    for job_id in ("7", "7_0", "7_1"):  # an array as submitit registers it: the array, then its tasks
        watcher.register_job(job_id)
    fake_squeue("7_1|PENDING|JobArrayTaskLimit\n7_0|RUNNING|None\n")
    watcher.update()
    assert watcher.get_state("7_1", mode="cache") == "PENDING" and not watcher.is_done("7_1", mode="cache")
    assert not watcher.is_done("7_0", mode="cache")
    fake_squeue("7_0|COMPLETED|None\n")  # task 1 was scancelled while pending: squeue drops it at once
    watcher.update()
    assert watcher.is_done("7_0", mode="cache") and watcher.get_state("7_1", mode="cache") == GONE
    assert watcher.is_done("7_1", mode="cache")  # submitit's sacct watcher: UNKNOWN, waiting forever
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == ["Slurm job 7 submitted", "Slurm job 7_0 submitted", "Slurm job 7_1 submitted"]
    assert "Slurm job 7_1 PENDING, reason: JobArrayTaskLimit" in messages
    assert "Slurm job 7_0 RUNNING" in messages and "Slurm job 7_0 COMPLETED" in messages
    assert "Slurm job 7_1 ended (no longer listed by squeue)" in messages
    assert not any(m.startswith("Slurm job 7 ") and "submitted" not in m for m in messages)  # the array itself


def test_squeue_watcher_repeats_a_pending_reason_and_keeps_states_when_squeue_fails(fake_squeue, caplog):
    caplog.set_level("INFO", logger="specpolicy.run.slurm")
    watcher = SqueueWatcher(remind_s=0.0)
    watcher.register_job("8")
    fake_squeue("8|PENDING|Resources\n")
    watcher.update()
    watcher.update()
    assert [r.getMessage() for r in caplog.records][-2:] == [
        "Slurm job 8 PENDING, reason: Resources",
        "Slurm job 8 still PENDING, reason: Resources",
    ]
    fake_squeue("8|PENDING|PartitionConfig\n")  # more than the partition offers: it never starts
    watcher.update()
    assert "ask for less (hydra.launcher.cpus_per_task" in caplog.records[-1].getMessage()
    fake_squeue("", rc=1, stderr="slurm_load_jobs error: Socket timed out on send/recv operation")
    watcher.update()  # a busy controller: the last known state stands, the job is not taken for ended
    assert watcher.get_state("8", mode="cache") == "PENDING" and "squeue failed" in caplog.records[-1].getMessage()
    fake_squeue("", rc=1, stderr="slurm_load_jobs error: Invalid job id specified")
    watcher.update()  # Slurm forgot every job asked about
    assert watcher.is_done("8", mode="cache")


def test_slurm_presets_request_a_gpu_or_none():
    from hydra_plugins.specpolicy_launcher import SpecpolicySlurmLauncher

    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        gpu = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
        cpu = compose("config", overrides=["hydra/launcher=slurm_cpu"], return_hydra_config=True).hydra.launcher
    assert gpu._target_ == cpu._target_ == "hydra_plugins.specpolicy_launcher.SpecpolicySlurmLauncher"
    assert (gpu.gpus_per_node, gpu.cpus_per_task, gpu.mem_gb) == (1, 4, 32)
    assert (cpu.gpus_per_node, cpu.cpus_per_task, cpu.mem_gb) == (0, 2, 2)
    assert OmegaConf.to_container(cpu.setup, resolve=True) == [
        "export OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK > 0 ? SLURM_CPUS_PER_TASK : 1))"
    ]
    params = {k: v for k, v in cpu.items() if k != "_target_"}
    assert SpecpolicySlurmLauncher(**params).params["gpus_per_node"] is None  # no --gpus-per-node line
    assert SpecpolicySlurmLauncher(**{**params, "gpus_per_node": 2}).params["gpus_per_node"] == 2


@pytest.mark.parametrize("cluster_up", [False, True])  # no cluster at all / the local one up but not sourced
@pytest.mark.parametrize("launcher", ["slurm_cpu", "submitit_slurm"])
def test_a_slurm_sweep_without_slurm_is_one_line_before_anything_is_created(
    launcher, cluster_up, tmp_path, monkeypatch, capsys
):
    """Without Slurm's commands on PATH (here: a PATH holding none, whatever this machine has),
    the sweep stops before Hydra makes its sweep directory: one line pointing to
    ``scripts/slurm-local.sh up`` and the env.sh it writes, status 2, no traceback."""
    from specpolicy.run.cli import main

    cluster_dir = tmp_path / "cluster"
    if cluster_up:
        cluster_dir.mkdir()
        (cluster_dir / "env.sh").write_text("export PATH=...\n")
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("SPECPOLICY_SLURM_DIR", str(cluster_dir))
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        ["specpolicy", "-m", "policy=static", "policy.k=2,4", f"hydra/launcher={launcher}", "hydra.sweep.dir=sweep"],
    )
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    how = (
        f"a local cluster is up: run `source {cluster_dir}/env.sh` (the exports `scripts/slurm-local.sh env` "
        f"prints) in this shell first"
        if cluster_up
        else f"to try it on this machine, start a local cluster with `scripts/slurm-local.sh up` (root) and run "
        f"`source {cluster_dir}/env.sh` (the exports `scripts/slurm-local.sh env` prints)"
    )
    assert capsys.readouterr().err.splitlines() == [
        f"error: hydra/launcher={launcher} submits the sweep to Slurm, but sbatch, srun, squeue are not on PATH (no "
        f"Slurm cluster here); {how}; or run the sweep on this machine with hydra/launcher=basic. Nothing was "
        f"launched or created"
    ]
    assert not (tmp_path / "sweep").exists()


# -- on the local cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment that points Slurm's commands at the local cluster (its ``env.sh``)."""
    env_file = CLUSTER_DIR / "env.sh"
    if not env_file.exists():
        pytest.skip(
            f"no local Slurm cluster ({env_file} missing): run `scripts/slurm-local.sh up` "
            "(root; installs slurm-wlm and munge)"
        )
    out = subprocess.run(["bash", "-c", f'source "{env_file}" && env -0'], capture_output=True, check=True)
    env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    try:
        state = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"], env=env, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"the local Slurm cluster does not answer: {error!r}")
    if state.returncode != 0 or not {"idle", "mixed", "allocated"} & set(state.stdout.split()):
        pytest.skip(f"the local Slurm cluster has no usable node: {state.stdout.strip()} {state.stderr.strip()}")
    return env


def _sweep_command(family, sweep: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "specpolicy", "-m", *overrides(family), *args, f"hydra.sweep.dir={sweep}"]


def _launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the launcher (it blocks until its Slurm jobs end), its output going to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen, env: dict[str, str], log: Path) -> None:
    """Stop the launcher and cancel what it submitted (a failed test leaves no job behind)."""
    process.kill()
    jobs = sorted({job.split("_")[0] for job in _job_ids(log.read_text())})
    if jobs:
        subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=60)


def _run(command: list[str], env: dict[str, str], log: Path) -> str:
    process = _launch(command, env, log)
    try:
        rc = process.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        _stop(process, env, log)
    output = log.read_text()
    assert rc == 0, output[-4000:]
    return output


def _wait_for(
    predicate,
    what: str,
    timeout_s: float = LAUNCH_TIMEOUT_S,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
    every_s: float = 0.5,
):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            break
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{log.read_text()[-4000:]}" if log else ""))


def _summaries(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))}


def _assert_report_lists_both_jobs_lossless(sweep: Path, env: dict[str, str]) -> None:
    """``python -m specpolicy.analysis.report SWEEP``: one row per job (its override), every one lossless."""
    out = subprocess.run(
        [sys.executable, "-m", "specpolicy.analysis.report", str(sweep)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "policy.k=2" in out.stdout and "policy.k=4" in out.stdout, out.stdout
    assert out.stdout.count("2/2") == 2, out.stdout  # lossless: 2 of 2 prompts, in each job's row
    assert (sweep / "report.csv").exists() and (sweep / "report.md").exists()
    summaries = _summaries(sweep)
    assert sorted(s["config"]["policy"]["k"] for s in summaries.values()) == [2, 4]
    assert all(s["lossless_fraction"] == 1.0 and s["prompts"] == 2 and not s["partial"] for s in summaries.values())


def _job_ids(output: str) -> list[str]:
    return re.findall(r"Slurm job (\d+(?:_\d+)?) submitted", output)


@pytest.mark.slow
def test_submitit_slurm_runs_the_sweep_and_the_report_lists_it(family, slurm_env, tmp_path):
    sweep = tmp_path / "sweep"
    _run(
        _sweep_command(
            family,
            sweep,
            "policy=static",
            "policy.k=2,4",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.timeout_min=10",
        ),
        slurm_env,
        tmp_path / "launcher.log",
    )
    assert len(list((sweep / ".submitit").glob("*_*/*_result.pkl"))) == 2  # a 2-task job array
    _assert_report_lists_both_jobs_lossless(sweep, slurm_env)


@pytest.mark.slow
def test_slurm_preset_without_gpu_requests_what_it_is_told_and_logs_the_jobs(family, slurm_env, tmp_path):
    sweep = tmp_path / "sweep"
    output = _run(
        _sweep_command(
            family,
            sweep,
            "policy=static",
            "policy.k=2,4",
            "hydra/launcher=slurm",
            "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1",
            "hydra.launcher.timeout_min=10",
        ),
        slurm_env,
        tmp_path / "launcher.log",
    )
    (script,) = (sweep / ".submitit").glob("*/*_submission.sh")
    sbatch = script.read_text()
    assert "gpus" not in sbatch and "gres" not in sbatch  # gpus_per_node=0: no GPU request at all
    assert "#SBATCH --cpus-per-task=1" in sbatch and "#SBATCH --mem=1GB" in sbatch
    array, *tasks = _job_ids(output)
    assert tasks == [f"{array}_0", f"{array}_1"]
    for task in tasks:  # each task's state changes are logged, up to its end
        assert re.search(rf"Slurm job {task} (RUNNING|COMPLETING|COMPLETED)", output), output
    _assert_report_lists_both_jobs_lossless(sweep, slurm_env)


@pytest.mark.slow
def test_slurm_cpu_logs_the_pending_reason_and_a_cancelled_task_ends_the_wait(family, slurm_env, tmp_path):
    sweep, log = tmp_path / "sweep", tmp_path / "launcher.log"
    # one task at a time: task 1 waits with Slurm's reason JobArrayTaskLimit while task 0 runs
    process = _launch(
        _sweep_command(
            family,
            sweep,
            "policy=static",
            "policy.k=2,4",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.array_parallelism=1",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10",
        ),
        slurm_env,
        log,
    )
    try:
        task, reason = _wait_for(
            lambda: re.search(r"Slurm job (\d+_1) PENDING, reason: (?!None)(\w+)", log.read_text()),
            "task 1's pending reason",
            process=process,
            log=log,
        ).groups()
        assert reason == "JobArrayTaskLimit"
        subprocess.run(["scancel", task], env=slurm_env, check=True, timeout=60)
        rc = process.wait(timeout=LAUNCH_TIMEOUT_S)  # without the squeue watcher: forever
    finally:
        _stop(process, slurm_env, log)
    output = log.read_text()
    assert rc != 0, output[-4000:]
    # squeue lists the task as CANCELLED, or no longer at all (a pending array task may go at once)
    assert re.search(rf"Slurm job {task} (CANCELLED|ended)", output) and f"Job {task} (task: 0)" in output
    assert f"hydra.sweep.dir={sweep}" in output  # how to resume the sweep
    assert "Traceback" not in output and rc == 1  # reported in one line: not a bug
    assert (sweep / "0" / "summary.json").exists() and not (sweep / "1" / "summary.json").exists()


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_without_recomputing(family, slurm_env, tmp_path):
    sweep, log = tmp_path / "sweep", tmp_path / "launcher.log"
    prompts = 30
    process = _launch(
        _sweep_command(
            family,
            sweep,
            f"dataset.num_prompts={prompts}",
            "generation.max_new_tokens=32",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.cpus_per_task=1",
            # submitit takes a signal after min(80%, limit - 10 min) of the limit for a timeout
            "hydra.launcher.timeout_min=30",
        ),
        slurm_env,
        log,
    )
    results = sweep / "0" / "results.jsonl"

    def signal(name: str) -> None:
        subprocess.run(["scancel", f"--signal={name}", job], env=slurm_env, check=True, timeout=60)

    try:
        (job,) = _wait_for(lambda: _job_ids(log.read_text()), "the job id", process=process, log=log)
        _wait_for(lambda: _lines(results) >= 1, "the first finished prompt", process=process, log=log, every_s=0.02)
        signal("STOP")  # hold the job mid-run (however fast this machine decodes) ...
        finished_before = _lines(results)
        assert finished_before < prompts, "the job finished before it could be preempted"
        signal("USR2")  # ... preempt it: submitit's signal, it checkpoints, requeues itself and exits ...
        signal("CONT")  # ... once it runs again
        rc = process.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        _stop(process, slurm_env, log)
    output = log.read_text()
    assert rc == 0, output[-4000:]
    job_log = "".join(p.read_text() for p in sorted((sweep / ".submitit" / job).glob("*_log.*")))
    assert "Caught signal SIGUSR2" in job_log and "this job is preempted" in job_log, job_log[-4000:]
    assert f"Slurm job {job} PENDING" in output.split(f"Slurm job {job} RUNNING", 1)[1]  # requeued after running
    resumed = re.search(r"resuming .*: (\d+) of (\d+) prompts finished earlier", job_log)
    assert resumed, job_log[-4000:]
    read_back, total = map(int, resumed.groups())
    assert total == prompts and finished_before <= read_back < prompts
    ids = [json.loads(line)["prompt_id"] for line in results.read_text().splitlines()]
    assert len(ids) == prompts and len(set(ids)) == prompts  # each prompt once: nothing recomputed
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["prompts"] == prompts and not summary["partial"] and summary["lossless_fraction"] == 1.0


def test_a_job_without_result_is_reported_in_one_line_and_still_is_submitits_error():
    submitit_utils = pytest.importorskip("submitit.core.utils")
    launcher = pytest.importorskip("hydra_plugins.specpolicy_launcher")
    if launcher._SubmititSlurmLauncher is None:
        pytest.skip("hydra-submitit-launcher is not installed")

    class Cancelled(launcher.SpecpolicySlurmLauncher):
        config = None  # no Hydra config: the error names a placeholder sweep dir

    def fail(self, job_overrides, initial_job_idx):
        raise submitit_utils.UncompletedJobError(
            "Job 7_1 (task: 0) has not produced any output (state: CANCELLED)\n"
            "Error stream produced:\n----------------------------------------"
        )

    parent = launcher._SubmititSlurmLauncher.launch
    try:
        launcher._SubmititSlurmLauncher.launch = fail
        with pytest.raises(submitit_utils.UncompletedJobError) as info:
            Cancelled.__new__(Cancelled).launch([["policy.k=2"]], 0)
    finally:
        launcher._SubmititSlurmLauncher.launch = parent
    line, status = one_line(info.value)
    assert status == EXIT_FAILURE and "\n" not in line
    assert line.startswith("error: Job 7_1 (task: 0) has not produced any output (state: CANCELLED); ")
    assert "hydra.sweep.dir=<sweep dir> to resume it" in line and "Error stream" not in line
