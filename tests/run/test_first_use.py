"""What a new user stumbled on (issue 30, 6), through the command line: a command that fails
validation leaves no empty run directory, and the sweep report does not count one as a died job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import specpolicy.run.resume as resume
from conftest import overrides
from specpolicy.analysis.report import dead_jobs, main as report_main
from specpolicy.run.cli import main


def cli(monkeypatch, *args: str) -> int:
    """``python -m specpolicy ARGS`` in this process; its exit status (0 when it returned)."""
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    try:
        main()
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    return tmp_path


# -- b. a command that fails validation leaves no run directory ---------------------------------


def test_a_command_that_fails_validation_leaves_no_run_directory(here, monkeypatch, capsys):
    assert cli(monkeypatch, "policy.tau=1.5") == 2
    assert capsys.readouterr().err.splitlines() == ["error: policy.tau must be in [0, 1], got 1.5"]
    outputs = here / "outputs"
    assert not outputs.exists() or list(outputs.iterdir()) == []  # Hydra made outputs/policy.tau=1.5: gone
    assert report_main([str(here)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"error: no summary.json under {here}"]  # no died job listed


def test_a_run_directory_holding_anything_else_is_kept(here, monkeypatch, capsys):
    run = here / "run"
    (run / "notes").mkdir(parents=True)  # the user's, or an earlier run's
    (run / "results.jsonl").write_text("")
    assert cli(monkeypatch, f"hydra.run.dir={run}", "policy.tau=1.5") == 2
    assert (run / "results.jsonl").is_file() and (run / "notes").is_dir() and (run / ".hydra").is_dir()
    # the working directory itself is never removed, even when it holds only what Hydra wrote
    assert cli(monkeypatch, "hydra.run.dir=.", "policy.tau=1.5") == 2
    assert here.is_dir() and (here / ".hydra").is_dir()


def test_the_report_does_not_count_a_run_that_never_started_as_died(family, here, monkeypatch, capsys):
    """One finished run, one command that failed validation (its directory left behind as before
    the fix: ``discard_unstarted`` off) and one job that died after taking its run lock."""
    assert cli(monkeypatch, *overrides(family), "policy=static", "policy.k=2") == 0
    monkeypatch.setattr(resume, "discard_unstarted", lambda run_dir: False)
    assert cli(monkeypatch, *overrides(family), "policy=static", "policy.k=-1") == 2
    left = [d for d in (here / "outputs").iterdir() if "policy.k=-1" in d.name]
    assert len(left) == 1 and sorted(p.name for p in left[0].iterdir()) == [".hydra", "cli.log"]
    capsys.readouterr()
    assert dead_jobs(here / "outputs") == []
    assert report_main([str(here / "outputs")]) == 0
    assert "without a summary.json" not in capsys.readouterr().out
    # a job that took its run lock and then died is still listed
    (left[0] / "run.lock").touch()
    assert [job["run"] for job in dead_jobs(here / "outputs")] == [left[0].name]


# -- c. a key the policy does not take: the plugin's own line, no "+key=VALUE" hint -------------


@pytest.mark.parametrize(
    "args, line",
    [
        (["policy=static", "policy.tau=0.3"], "error: unknown key policy.tau; policy has keys k"),
        (["policy=static", "policy.tau.x=1"], "error: unknown key policy.tau; policy has keys k"),
        (
            ["logger.jsonl.fil=x.jsonl"],
            "error: unknown key logger.jsonl.fil; logger.jsonl has keys file (did you mean logger.jsonl.file?)",
        ),
    ],
)
def test_a_key_no_plugin_accepts_is_named_with_the_keys_the_plugin_takes(args, line, here, monkeypatch, capsys):
    assert cli(monkeypatch, *args) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [line] and "+" not in err[0]
    # the same line as adding the key on purpose, which the plugin's validation refuses
    added = [a if a.split("=", 1)[0] in ("policy", "drafter") else "+" + a for a in args]
    assert cli(monkeypatch, *added) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_a_key_outside_the_plugin_groups_keeps_hydras_hint(here, monkeypatch, capsys):
    assert cli(monkeypatch, "generation.max_new_token=3") == 2  # a close match: named, no "+"
    assert capsys.readouterr().err.splitlines()[0].endswith("(did you mean generation.max_new_tokens?)")


def test_a_key_the_plugin_accepts_keeps_the_plus_hint(here, monkeypatch, capsys):
    """A plugin may take keys its config file does not set: when its validation accepts the key
    (here: any key), adding it with ``+`` works, so Hydra's hint stays."""
    import specpolicy.run.validation as validation

    monkeypatch.setattr(validation, "validate_plugin_config", lambda *args, **kwargs: None)
    assert cli(monkeypatch, "policy=static", "policy.tau=0.3") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unknown key policy.tau; policy has keys k, name; to add a new key on purpose: +policy.tau=VALUE"
    ]


# -- d. the same command again: it is complete, and prints its table --------------------------


#: The summary's title: what the run ran (issue 30, 6a).
TITLE = "ar+static on gsm8k, 2 prompts x 16 new tokens, cpu float64, greedy"


def _table(lines: list[str]) -> list[str]:
    """The run summary: from its title (``<method> on ...``) to its oracle sentence."""
    start = next(i for i, line in enumerate(lines) if line.rstrip() == TITLE)
    end = next(i for i, line in enumerate(lines) if line.startswith("oracle: "))
    return lines[start : end + 1]


def test_the_same_command_again_prints_the_stored_table(family, here, monkeypatch, capsys):
    args = [*overrides(family), "policy=static", "policy.k=3"]
    assert cli(monkeypatch, *args) == 0
    first = capsys.readouterr().out.splitlines()
    assert cli(monkeypatch, *args) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[0].startswith("run complete: all 2 prompts of outputs/") and "run.resume=false starts over" in again[0]
    assert _table(again) == _table(first)  # the same table, read back from summary.json
    assert again[-4].startswith("results: outputs/")
