"""``python -m specpolicy drafter=falcon policy=falcon-tree`` on a fresh install (issue 46, item 6):
the Falcon drafter is bundled (``specpolicy/family/bundle/falcon-drafter``), so the command composes
with no ``drafter.model`` and runs lossless on the bundled target."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from specpolicy.models.loading import BUNDLED_MODELS, bundled_dir, check_model_source
from specpolicy.run.experiment import run_experiment


def test_the_falcon_drafter_is_bundled():
    assert "falcon-drafter" in BUNDLED_MODELS
    assert (bundled_dir() / "falcon-drafter" / "config.json").is_file()
    check_model_source("drafter.model", "falcon-drafter")  # config.json and complete weights


def test_falcon_tree_runs_on_the_bundled_drafter_with_no_model_flag(tmp_path, capsys):
    overrides = [
        "drafter=falcon",
        "policy=falcon-tree",
        "dataset.num_prompts=1",
        "generation.max_new_tokens=16",
        "run.warmup_prompts=0",
        "runtime.device=cpu",
    ]
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    assert cfg.drafter.model == "falcon-drafter" and cfg.verifier.model == "target"  # the defaults
    summary = run_experiment(cfg, tmp_path / "run")
    assert "falcon+falcon-tree on gsm8k, 1 prompt x 16 new tokens" in capsys.readouterr().out
    assert summary["method"] == "falcon+falcon-tree"
    assert summary["generated_tokens"] == 16 and summary["lossless_fraction"] == 1.0
    assert summary["drafter_forward_passes"] > 0 and summary["mean_accepted_length"] > 0  # trained: it accepts
