"""Validate before loading: every config value is checked before any model is loaded, and a user
error prints ONE line (the key, the value, the accepted range), no traceback, exit status 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import overrides
from specpolicy.run.cli import main

#: Runs the CLI with every model and tokenizer load replaced by a marker (exit 99).
DRIVER = """
import os, sys
import specpolicy.models.loading as models
def refuse(*args, **kwargs):
    with open(os.environ["LOAD_MARKER"], "a") as f:
        f.write(f"loaded {args[:1]}\\n")
    raise SystemExit(99)
models.load_causal_lm = refuse
models.load_tokenizer = refuse
from specpolicy.run.cli import main
sys.argv = ["specpolicy", *sys.argv[1:]]
main()
"""


@pytest.fixture
def no_loads(monkeypatch):
    """Every model and tokenizer load in this process is recorded (and refused)."""
    import specpolicy.drafters.ar as ar
    import specpolicy.drafters.fastdllm as fastdllm
    import specpolicy.run.experiment as experiment
    import specpolicy.verifiers.hf as hf

    loads = []

    def refuse(*args, **kwargs):
        loads.append(args[:1])
        raise AssertionError(f"a model or tokenizer was loaded: {args[:1]}")

    for module in (ar, fastdllm, hf, experiment):  # every module that loads (raising=False: not all do)
        monkeypatch.setattr(module, "load_causal_lm", refuse, raising=False)
        monkeypatch.setattr(module, "load_tokenizer", refuse, raising=False)
    return loads


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, list[str], str]:
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    with pytest.raises(SystemExit) as info:
        main()
    out, err = capsys.readouterr()
    return info.value.code, err.strip().splitlines(), out


def test_out_of_range_value_is_one_line_before_any_model_loads(tmp_path):
    """A real process: exactly one line on stderr, status 2, no model or tokenizer loaded."""
    driver, marker = tmp_path / "driver.py", tmp_path / "loads.txt"
    driver.write_text(DRIVER)
    env = {**os.environ, "LOAD_MARKER": str(marker), "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, str(driver), "policy.tau=1.5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["error: policy.tau must be in [0, 1], got 1.5"]
    assert not marker.exists()
    assert not (tmp_path / "outputs" / "policy.tau=1.5" / "results.jsonl").exists()


@pytest.mark.slow  # a subprocess (the one-line error's real process stays in the fast subset)
def test_debug_flag_keeps_the_traceback(tmp_path):
    driver, marker = tmp_path / "driver.py", tmp_path / "loads.txt"
    driver.write_text(DRIVER)
    env = {**os.environ, "LOAD_MARKER": str(marker), "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, str(driver), "policy.tau=1.5", "--debug"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "specpolicy.core.errors.ConfigError: policy.tau must be in [0, 1], got 1.5"
    )
    assert not marker.exists()


def _truncated_copy(source, destination):
    shutil.copytree(source, destination)
    weights = destination / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return destination


@pytest.mark.parametrize(
    "case",
    [
        "typo",
        "choice",
        "num_prompts",
        "missing_model",
        "truncated",
        "bad_row",
        "max_new_tokens",
        "warmup",
        "threshold",
        "block_size",
        "unknown_drafter_key",
        "max_context",
        "reuse",
        "wandb_mode",
        "top_p",
        "device",
        "device_name",
        "threads",
    ],
)
def test_every_group_is_checked_before_loading(case, family, tmp_path, monkeypatch, capsys, no_loads):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    base = overrides(family)
    bad_file = tmp_path / "prompts.jsonl"
    bad_file.write_bytes(b'{"prompt": "ok"}\n{"prompt": "x"\n')
    truncated = _truncated_copy(family["drafter"], tmp_path / "cut")
    cases = {
        "typo": (["policy.tua=0.3"], "error: unknown key policy.tua; policy has keys "),  # + the close match
        "choice": (
            ["policy=failfst"],
            "error: no config 'failfst' in group policy; choices: adl, aimd, batch-schedule, "
            "block-tree, dart-tree, diffuspec, eagle2-tree, failfast, failfast-tree, falcon-tree, goodput, "
            "goodput-batch, heuristic, specdecpp, static "
            "(did you mean policy=failfast?)",
        ),
        "num_prompts": (
            ["dataset.num_prompts=-1"],
            "error: dataset.num_prompts must be an integer >= 1, or all (every prompt after dataset.offset), got -1",
        ),
        "missing_model": (
            ["verifier.model=/nonexistent"],
            "error: verifier.model='/nonexistent': no such local directory (expected a bundled model "
            "(target, ar-drafter, dllm-drafter, dflash-drafter, eagle3-drafter, dart-drafter, falcon-drafter), a local model "
            "directory or a hub id (org/name))",
        ),
        "truncated": (
            [f"drafter.model={truncated}"],
            f"error: drafter.model='{truncated}': weights file {truncated}/model.safetensors is truncated or corrupt",
        ),
        "bad_row": ([f"dataset.path={bad_file}"], f"error: {bad_file}:2: malformed JSON"),
        "max_new_tokens": (
            ["generation.max_new_tokens=0"],
            "error: generation.max_new_tokens must be an integer >= 1, got 0",
        ),
        "warmup": (["run.warmup_prompts=-1"], "error: run.warmup_prompts must be an integer >= 0, got -1"),
        "threshold": (
            ["drafter=fastdllm", f"drafter.model={family['drafter']}", "drafter.threshold=1.5"],
            "error: drafter.threshold must be a number in [0, 1], got 1.5",
        ),
        "block_size": (
            ["drafter=fastdllm", f"drafter.model={family['drafter']}", "drafter.small_block_size=5"],
            "error: drafter.small_block_size must be an integer in [1, block_size=32] dividing block_size, got 5",
        ),
        "unknown_drafter_key": (
            ["+drafter.thresold=0.2"],
            "error: unknown key drafter.thresold; drafter has keys attn_implementation, model",
        ),
        "max_context": (
            ["verifier.max_context=-5"],
            "error: verifier.max_context must be an integer >= 0 (tokens; 0 = the model's), got -5",
        ),
        "reuse": (["reuse.min_match=0"], "error: reuse.min_match must be an integer >= 1, got 0"),
        "wandb_mode": (
            ["+logger=wandb", "logger.wandb.mode=sometimes"],
            "error: logger.wandb.mode must be one of auto, online, offline, disabled, got 'sometimes'",
        ),
        "top_p": (["generation.top_p=0"], "error: generation.top_p must be a number in (0, 1] (1 = no top-p), got 0"),
        "device": (
            ["runtime.dtype=int8"],
            "error: runtime.dtype='int8' is not one of auto, float32, float64, bfloat16, float16",
        ),
        "device_name": (
            ["runtime.device=bogus"],
            "error: runtime.device='bogus' is not a device; use auto, cpu, cuda or cuda:N",
        ),
        "threads": (["runtime.threads=0"], "error: runtime.threads must be an integer >= 1, got 0"),
    }
    extra, expected = cases[case]
    code, err, _ = run_cli(monkeypatch, capsys, *base, *extra)
    assert code == 2
    assert len(err) == 1 and err[0].startswith(expected), err
    if case == "typo":
        assert "keys acceptance, acceptance_head, confidence_scope, n, n_max, tau " in err[0] and err[0].endswith(
            "(did you mean policy.tau?)"
        )
    assert no_loads == []
