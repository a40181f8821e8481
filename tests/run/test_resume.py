"""Resumable runs: every results.jsonl line carries prompt_id and output_ids; a run interrupted at
any point (SIGINT, SIGTERM, SIGKILL, a half-written line) resumes with the same command, reads the
finished prompts back instead of recomputing them, and ends with the summary an uninterrupted run
writes (timings aside). SIGINT / SIGTERM write a partial summary first and exit non-zero."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import specpolicy.run.experiment as experiment
import specpolicy.run.setup as run_setup
from conftest import overrides
from specpolicy.analysis.results import PromptResult, read_results
from specpolicy.run.experiment import run_experiment
from specpolicy.run.resume import MAX_NAME, RunInterrupted, run_name

PROMPTS = 4
#: Fields that are timings (or derived from timings), and the process's peak memory (a measurement
#: of each invocation, like a timing): the only ones allowed to differ.
TIMING_KEYS = {
    "wall_s",
    "vanilla_wall_s",
    "tokens_per_s",
    "vanilla_tokens_per_s",
    "speedup_vs_vanilla",
    "draft_ms",
    "verify_ms",
    "prefill_ms",
    "vanilla_prefill_ms",
    "vanilla_draft_ms",
    "vanilla_verify_ms",
    "oracle",
    "measured",
    "timing_conditions",
    "peak_memory",
    "host_ms",
    "host_ms_per_round",
    "host_step_share",
}


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def cli_args(family) -> list[str]:
    base = [
        o
        for o in overrides(family, drafter="drafter")
        if not o.startswith(("dataset.num_prompts", "generation.max_new_tokens"))
    ]
    return [
        *base,
        "policy=failfast",
        "policy.n=3",
        "policy.n_max=9",
        f"dataset.num_prompts={PROMPTS}",
        "generation.max_new_tokens=20",
    ]


def compose_cfg(family, *extra: str):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return compose("config", overrides=[*cli_args(family), *extra])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- unit: the results file ------------------------------------------------------------------------


def _row(pid: str, tokens: int) -> dict:
    return {
        "prompt_id": pid,
        "output_ids": list(range(tokens)),
        "wall_s": 0.1,
        "finish_reason": "eos",
        "rounds": [
            {
                "speculation_length": 0,
                "accepted_length": 0,
                "emitted_tokens": 1,
                "drafter_forward_passes": 0,
                "reused_tokens": 0,
                "draft_ms": 0.0,
                "verify_ms": 1.0,
            }
        ]
        * tokens,
    }


def test_corrupt_lines_anywhere_are_quarantined_and_every_valid_row_is_kept(tmp_path, caplog):
    path = tmp_path / "results.jsonl"
    rows = [json.dumps(_row(f"p{i}", i + 1)).encode() for i in range(6)]
    damaged = [rows[0], b'{"prompt_id": "p1", "output_i\xff', *rows[2:4], b'{"prompt_id": "p4"}', rows[5]]
    path.write_bytes(b"\n".join(damaged) + b"\n" + rows[0][:25])  # and a half-written last line
    assert [r.prompt_id for r in read_results(path)] == ["p0", "p2", "p3", "p5"]  # a reader: nothing moved
    assert path.read_bytes().endswith(rows[0][:25]) and not (tmp_path / "results.jsonl.corrupt").exists()

    caplog.clear()
    kept = read_results(path, repair=True)  # a resume: quarantine, keep every valid row
    assert [(r.prompt_id, r.generated_tokens) for r in kept] == [("p0", 1), ("p2", 3), ("p3", 4), ("p5", 6)]
    assert path.read_bytes() == b"".join(rows[i] + b"\n" for i in (0, 2, 3, 5))  # valid lines, byte for byte
    side = (tmp_path / "results.jsonl.corrupt").read_bytes().split(b"\n")
    assert side[0].startswith(b"# line 2: not JSON") and side[1] == damaged[1]  # verbatim, with its line number
    assert side[2].startswith(b"# line 5: ") and b"output_ids" in side[2] and side[3] == damaged[4]
    assert side[4] == b"# line 7: half-written last line (no newline)" and side[5] == rows[0][:25]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]  # one line
    assert "3 corrupt line(s) (line 2, 5, 7)" in warning and "4 valid row(s) kept" in warning
    assert [r.to_row() for r in read_results(path, repair=True)] == [r.to_row() for r in kept]  # clean: as is
    assert read_results(tmp_path / "missing.jsonl") == []


def test_rows_of_runs_written_before_the_finish_reason_rename_are_read(tmp_path):
    old = {
        **_row("p0", 2),
        "stop_reason": "max_new_tokens",
        "vanilla_generated_tokens": 2,
        "vanilla_wall_s": 0.2,
        "vanilla_rounds": 2,
        "vanilla_draft_ms": 0.0,
        "vanilla_verify_ms": 2.0,
        "vanilla_stop_reason": "eos",
        "lossless": True,
        "first_difference": None,
    }
    del old["finish_reason"]
    result = PromptResult.from_row(old)
    assert result.speculative.finish_reason == "max_new_tokens" and result.vanilla.finish_reason == "eos"
    assert result.vanilla.output_ids.tolist() == [0, 1] and result.lossless is True


def test_run_directory_names():
    assert run_name("") == "default"
    assert run_name("policy.k=8,policy=static") == "policy.k=8,policy=static"  # safe names stay as they were
    assert run_name("+logger=wandb,dataset.num_prompts=all") == "+logger=wandb,dataset.num_prompts=all"
    name = run_name("policy=static,verifier.model=/models/Qwen2.5-7B")
    assert re.fullmatch(r"policy=static,verifier\.model=Qwen2\.5-7B-[0-9a-f]{8}", name)
    assert name != run_name("policy=static,verifier.model=/other/Qwen2.5-7B")  # the hash tells them apart
    assert len(run_name("x=" + "a" * 300)) <= MAX_NAME and not run_name(".x=1").startswith(".")


def test_run_directory_names_keep_every_override_readable():
    """Issue 22: names were cut so that they lost the overrides that matter (policy=failfast and
    reuse.enabled=true vanished behind two model paths), and generation.stop=["\\n\\n"] became
    generation.stop=___n_n__-5630006c."""
    overrides = (
        "drafter.model=/models/Fast_dLLM_v2_1.5B,policy.n_max=70,policy.tau=0.3,policy=failfast,"
        "reuse.enabled=true,verifier.model=/models/Qwen2.5-7B-Instruct"
    )
    name = run_name(overrides)
    assert "/" not in name and len(name) <= MAX_NAME
    assert name.startswith(
        "drafter.model=Fast_dLLM_v2_1.5B,policy.n_max=70,policy.tau=0.3,policy=failfast,"
        "reuse.enabled=true,verifier.model=Qwen2.5-7B-Instruct-"
    )
    assert re.fullmatch(r"generation\.stop=NLNL-[0-9a-f]{8}", run_name('generation.stop=["\\n\\n"]'))
    assert run_name("dataset.path=../data/my_prompts.jsonl,policy=aimd").startswith(
        "dataset.path=my_prompts.jsonl,policy=aimd-"
    )
    # too long even so: values are cut first, every key stays
    many = ",".join(f"verifier.model=/models/{'x' * 60}" if i == 0 else f"policy.opt{i}={'y' * 20}" for i in range(5))
    name = run_name(many)
    assert len(name) <= MAX_NAME and all(f"policy.opt{i}=" in name for i in range(1, 5)) and "verifier.model=" in name
    # distinct commands never share a directory, whatever the cleaning made of them
    variants = [
        'generation.stop=["\\n\\n"]',
        'generation.stop=["\\n","\\n"]',
        "generation.stop=[NLNL]",
        "verifier.model=/a/m",
        "verifier.model=/b/m",
        "verifier.model=m",
    ]
    assert len({run_name(v) for v in variants}) == len(variants)


# -- in process: an interrupt at every point ---------------------------------------------------------


@pytest.fixture(scope="module")
def reference_run(family, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # not a terminal: the progress lines still come
        summary = run_experiment(compose_cfg(family), run_dir)
    return summary, lines(run_dir / "results.jsonl"), err.getvalue()


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[:2]


def test_one_progress_line_per_prompt_on_stderr_when_not_a_terminal(reference_run):
    summary, rows, err = reference_run
    progress = [line for line in err.splitlines() if line.startswith(f"[{summary['method']}] prompt ")]
    assert len(progress) == PROMPTS
    for i, (line, row) in enumerate(zip(progress, rows)):
        assert line.startswith(f"[{summary['method']}] prompt {i + 1}/{PROMPTS} {row['prompt_id']}: ")
        assert f"{row['generated_tokens']} tokens in " in line and "x vanilla" in line


def test_rows_carry_prompt_id_and_output_ids(reference):
    summary, rows = reference
    assert [r["prompt_id"] for r in rows] == [f"gsm8k/{i}" for i in range(PROMPTS)]
    assert all(len(r["output_ids"]) == r["generated_tokens"] > 0 and r["config_hash"] for r in rows)
    assert summary["partial"] is False and summary["prompts"] == summary["prompts_total"] == PROMPTS


POINTS = [("call", n) for n in range(1, 2 * PROMPTS + 1)] + [("between", i) for i in range(1, PROMPTS + 1)]
#: the fast subset's points: in the first prompt's speculative and vanilla calls, in the last call,
#: between two prompts and after the last row; the others are ``slow``
FAST_POINTS = {("call", 1), ("call", 2), ("call", 2 * PROMPTS), ("between", 2), ("between", PROMPTS)}


@pytest.mark.parametrize(
    "kind,at",
    [pytest.param(k, n, id=f"{k}-{n}", marks=() if (k, n) in FAST_POINTS else pytest.mark.slow) for k, n in POINTS],
)
def test_sigterm_at_any_point_then_resume_gives_the_same_summary(family, reference, tmp_path, monkeypatch, kind, at):
    """SIGTERM right after the n-th generate() call (during a prompt: its row is not written yet),
    or between prompts (after prompt i's row was written)."""
    real, real_progress = run_setup.generate, experiment._progress
    calls = []

    def interrupting(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if kind == "call" and len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    def progress_then_interrupt(method, done, total, result):  # after prompt `done`'s row was written
        real_progress(method, done, total, result)
        if kind == "between" and done == at:  # at == PROMPTS: after the last row, before the summary
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(run_setup, "generate", interrupting)
    monkeypatch.setattr(experiment, "_progress", progress_then_interrupt)
    cfg = compose_cfg(family)
    with pytest.raises(RunInterrupted) as info:
        run_experiment(cfg, tmp_path)
    assert info.value.signame == "SIGTERM" and info.value.exit_code == 143
    done = lines(tmp_path / "results.jsonl")
    assert len(done) == ((at - 1) // 2 if kind == "call" else at)  # spec + vanilla per prompt
    partial = json.loads((tmp_path / "summary.json").read_text())
    assert partial["partial"] is True and partial["interrupted_by"] == "SIGTERM"
    assert partial["prompts"] == len(done) and partial["prompts_total"] == PROMPTS
    # how the machine was while the finished prompts were timed, as in a complete summary
    assert partial["timing_conditions"]["cpu_count"] >= 1 and "timing_trusted" in partial["timing_conditions"]

    calls.clear()
    monkeypatch.setattr(experiment, "_progress", real_progress)
    monkeypatch.setattr(run_setup, "generate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    summary = run_experiment(cfg, tmp_path)  # the same command again
    assert len(calls) == 2 * (PROMPTS - len(done))  # finished prompts are read back, not recomputed
    rows = lines(tmp_path / "results.jsonl")
    assert rows[: len(done)] == done  # untouched on disk
    assert without_timings(rows) == without_timings(reference[1])
    assert without_timings(summary) == without_timings(reference[0])
    assert json.loads((tmp_path / "summary.json").read_text())["partial"] is False


def test_resuming_a_complete_run_loads_no_model_and_says_it_is_complete(
    family, reference, tmp_path, monkeypatch, capsys
):
    """Issue 22: the same command after a finished run loaded both models and printed a fresh timing
    warning about a run that measured nothing."""
    import specpolicy.analysis.machine as machine
    from specpolicy.run.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(sys, "argv", ["specpolicy", *cli_args(family), "hydra.run.dir=outputs/done"])
    monkeypatch.setattr(machine, "judge", lambda conditions: [])  # the first run's timings: trusted
    main()
    first = json.loads((tmp_path / "outputs" / "done" / "summary.json").read_text())
    capsys.readouterr()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(experiment, "make_verifier", no_model)
    monkeypatch.setattr(experiment, "make_drafter", no_model)
    monkeypatch.setattr(machine, "judge", lambda conditions: ["the machine is busy right now"])  # never asked
    main()  # the same command again
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"run complete: all {PROMPTS} prompts of outputs/done are in results.jsonl; nothing to "
        "compute, no model loaded (run.resume=false starts over)"
    )
    assert out[1].startswith(f"ar+failfast on gsm8k, {PROMPTS} prompts x 20 new tokens, cpu float64, greedy")
    assert out[-4:] == [
        "results: outputs/done/ (summary.json, results.jsonl)",
        "next:    python -m specpolicy.analysis.report outputs/done",
        "         python -m specpolicy.analysis.plot outputs/done",
        "         python -m specpolicy.analysis.oracle outputs/done",
    ]
    assert json.loads((tmp_path / "outputs" / "done" / "summary.json").read_text()) == first  # untouched
    # killed after its last row, before its summary: the summary is computed from the rows, still no model
    (tmp_path / "outputs" / "done" / "summary.json").unlink()
    main()
    assert capsys.readouterr().out.startswith("run complete: all 4 prompts")
    again = json.loads((tmp_path / "outputs" / "done" / "summary.json").read_text())
    assert "timing_conditions" not in again  # nothing was timed in this invocation
    drop = ("fields",)  # the field glossary lists timing_conditions only where the summary has them
    assert without_timings({k: v for k, v in again.items() if k not in drop}) == without_timings(
        {k: v for k, v in first.items() if k not in drop}
    )


def test_resume_drops_a_half_written_line_and_refuses_other_settings(family, reference, tmp_path, monkeypatch):
    cfg = compose_cfg(family)
    run_experiment(cfg, tmp_path)
    rows = lines(tmp_path / "results.jsonl")
    with open(tmp_path / "results.jsonl", "w") as f:  # killed while writing the third line
        f.write("".join(json.dumps(r) + "\n" for r in rows[:2]) + json.dumps(rows[2])[:37])
    summary = run_experiment(cfg, tmp_path)
    assert without_timings(summary) == without_timings(reference[0])
    assert without_timings(lines(tmp_path / "results.jsonl")) == without_timings(reference[1])
    with pytest.raises(ValueError, match="run.resume=false"):
        run_experiment(compose_cfg(family, "policy.n=2"), tmp_path)
    fresh = run_experiment(compose_cfg(family, "policy.n=2", "run.resume=false"), tmp_path)  # starts over
    assert fresh["config"]["policy"]["n"] == 2 and len(lines(tmp_path / "results.jsonl")) == PROMPTS


def test_resume_with_a_corrupt_middle_line_recomputes_only_that_prompt(family, reference, tmp_path, monkeypatch):
    """Line 2 of 4 damaged (e.g. a disk error): the other rows are kept and not recomputed, the
    damaged line is kept in results.jsonl.corrupt, and the summary equals an uninterrupted run's."""
    cfg = compose_cfg(family)
    run_experiment(cfg, tmp_path)
    path = tmp_path / "results.jsonl"
    good = path.read_bytes().splitlines(keepends=True)
    damaged = good[1][:40] + b"\x00garbage\n"
    path.write_bytes(good[0] + damaged + b"".join(good[2:]))
    real, calls = run_setup.generate, []
    monkeypatch.setattr(run_setup, "generate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    summary = run_experiment(cfg, tmp_path)
    assert len(calls) == 2  # the damaged prompt only: speculative + vanilla
    after = path.read_bytes().splitlines(keepends=True)
    assert after[:3] == [good[0], *good[2:]]  # the valid rows, untouched, then the recomputed one
    assert sorted(json.loads(line)["prompt_id"] for line in after) == [f"gsm8k/{i}" for i in range(PROMPTS)]
    assert without_timings(summary) == without_timings(reference[0])
    assert (tmp_path / "results.jsonl.corrupt").read_bytes() == b"# line 2: not JSON (JSONDecodeError)\n" + damaged


# -- the command line: SIGKILL / SIGINT, then the same command -----------------------------------

DRIVER = """
import os, sys, time
import specpolicy.run.setup as run_setup  # RunSetup.decode calls its generate
real = run_setup.generate
def slow(*args, **kwargs):  # test only: room to interrupt between prompts
    out = real(*args, **kwargs)
    time.sleep(float(os.environ.get("SLOW_S", "0")))
    return out
run_setup.generate = slow
from specpolicy.run.cli import main
sys.argv = ["specpolicy", *sys.argv[1:]]
main()
"""


def _start(driver: Path, args: list[str], cwd: Path, slow: float) -> subprocess.Popen:
    env = {**os.environ, "SLOW_S": str(slow), "HYDRA_FULL_ERROR": "1", "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.Popen(
        [sys.executable, str(driver), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run_dir(cwd: Path) -> Path:
    dirs = [p for p in (cwd / "outputs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def cli_reference(family, tmp_path_factory):
    """An uninterrupted run of the command (in its own working directory)."""
    cwd = tmp_path_factory.mktemp("cli-reference")
    driver = cwd / "driver.py"
    driver.write_text(DRIVER)
    proc = _start(driver, cli_args(family), cwd, 0.0)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    run_dir = _run_dir(cwd)
    return json.loads((run_dir / "summary.json").read_text()), lines(run_dir / "results.jsonl")


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_or_interrupted_cli_run_resumes_with_the_same_command(family, cli_reference, tmp_path, sig):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = cli_args(family)
    proc = _start(driver, args, tmp_path, 0.4)
    deadline = time.monotonic() + 300
    results = None
    while time.monotonic() < deadline and proc.poll() is None:  # wait for the first finished prompt
        found = list((tmp_path / "outputs").glob("*/results.jsonl")) if (tmp_path / "outputs").exists() else []
        if found and found[0].read_text().count("\n") >= 1:
            results = found[0]
            break
        time.sleep(0.02)
    assert results is not None, proc.communicate()[0]
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    run_dir = _run_dir(tmp_path)
    done = lines(results)
    assert 1 <= len(done) < PROMPTS
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert not (run_dir / "summary.json").exists()
    else:
        assert proc.returncode == 130, out
        partial = json.loads((run_dir / "summary.json").read_text())
        assert partial["partial"] is True and partial["prompts"] == len(done)

    proc = _start(driver, args, tmp_path, 0.0)  # the same command
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "resuming" in out
    assert _run_dir(tmp_path) == run_dir
    rows = lines(results)
    assert rows[: len(done)] == done
    assert [r["prompt_id"] for r in rows] == [f"gsm8k/{i}" for i in range(PROMPTS)]
    assert without_timings(rows) == without_timings(cli_reference[1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"] == cli_reference[0]["config"]
    assert without_timings(summary) == without_timings(cli_reference[0])


def test_the_run_directory_depends_on_the_command_not_on_resume():
    def run_dir(*extra):
        with initialize_config_module("specpolicy.conf", version_base="1.3"):
            return compose("config", overrides=list(extra), return_hydra_config=True).hydra.run.dir

    assert run_dir() == run_dir("run.resume=false") == "outputs/default"
    assert run_dir("policy=static", "policy.k=8") == run_dir("policy=static", "policy.k=8", "run.resume=true")
    assert run_dir("policy=static", "policy.k=8") == "outputs/policy.k=8,policy=static"
    assert run_dir("policy=static", "policy.k=8") != run_dir("policy=static", "policy.k=9")
