"""``train_drafter acceptance-head``: a tiny end-to-end training of SpecDec++'s head on a bundled drafter."""

from __future__ import annotations

import json

import pytest
import torch

from specpolicy.family.train_acceptance_head import MixingLengths
from specpolicy.family.train_drafter import main
from specpolicy.models.acceptance_head import load_head


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = ["Tom has 3 apples and buys 4 more. How many apples?", "A train goes 60 km in 2 hours. Speed?"]
    path.write_text("".join(json.dumps({"question": q}) + "\n" for q in rows))
    return path


def test_mixing_lengths_stop_with_the_ratio():
    policy = MixingLengths(max_draft=8, ratio=0.15, seed=0)
    from specpolicy.core.types import Draft

    lengths = [policy.next_length(Draft.empty()) for _ in range(4000)]
    assert max(lengths) == 8 and min(lengths) == 0
    zero = lengths.count(0) / len(lengths)
    assert abs(zero - 0.15) < 0.03  # the first position stops with probability r
    assert abs(lengths.count(8) / len(lengths) - 0.85**8) < 0.03  # no stop in 8 positions
    assert policy.next_length(Draft(torch.arange(3), torch.ones(3))) == 0


def test_bad_option_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^--mixing-ratio=1.5 must be in \[0, 1\)$"):
        main(["acceptance-head", "--drafter", "ar", "--mixing-ratio", "1.5", "--out", str(tmp_path / "h")])


def test_tiny_training_writes_a_head_the_run_loads(tmp_path):
    out = tmp_path / "head"
    args = ["--drafter", "ar", "--prompts", str(_prompts(tmp_path)), "--num-prompts", "2", "--max-new-tokens", "24"]
    log = main(
        ["--kind", "acceptance-head", *args, "--epochs", "3", "--out", str(out), "--cache", str(tmp_path / "c.pt")]
    )
    assert (out / "model.safetensors").is_file() and (out / "training_log.json").is_file()
    assert len(log["curve"]) == 3 and log["tokens"]["train"] > 0 and log["tokens"]["held_out"] > 0
    calibration = log["held_out_calibration"]
    for who in ("head", "confidence"):
        assert set(calibration[who]) == {"ece", "brier", "auc"}
        assert 0.0 <= calibration[who]["ece"] <= 1.0 and 0.0 <= calibration[who]["brier"] <= 1.0
    head = load_head(out, drafter_hidden_size=192)
    assert head.metadata["drafter"] == "ar" and head.metadata["training"]["mixing_ratio"] == 0.15
    again = main(
        ["acceptance-head", *args, "--epochs", "3", "--out", str(tmp_path / "again"), "--cache", str(tmp_path / "c.pt")]
    )
    assert again["tokens"] == log["tokens"]  # the cached rollout, the same seeded split
    assert again["held_out_calibration"]["head"] == pytest.approx(calibration["head"])


def test_default_prompts_are_the_bundled_gsm8k_train_questions(tmp_path):
    from specpolicy.family.train_acceptance_head import DEFAULT_PROMPTS, build_parser, read_prompts

    assert build_parser().parse_args(["--drafter", "ar", "--out", "x"]).prompts == DEFAULT_PROMPTS == "gsm8k-train"
    prompts = read_prompts(DEFAULT_PROMPTS, 0, 2)  # resolved by specpolicy.data: no machine-specific path
    assert len(prompts) == 2 and prompts[0].text.startswith("Natalia sold clips")
    test_rows = {p.text for p in read_prompts("gsm8k", 0, 1000)}
    assert not test_rows & {p.text for p in read_prompts(DEFAULT_PROMPTS, 0, 1000)}  # never a benchmark's prompt
    assert read_prompts(str(_prompts(tmp_path)), 1, 1)[0].text.startswith("A train")  # a JSONL file still works


def test_bad_prompts_are_one_line_before_any_model_loads(tmp_path):
    with pytest.raises(
        SystemExit, match=r"^--prompts 'nowhere.jsonl' is neither a bundled prompt set \(.*gsm8k-train.*\) nor a file$"
    ):
        main(["acceptance-head", "--drafter", "ar", "--prompts", "nowhere.jsonl", "--out", str(tmp_path / "h")])
    with pytest.raises(SystemExit, match=r"^--prompt-offset=5000 is past the last prompt of --prompts='gsm8k-train'"):
        main(["acceptance-head", "--drafter", "ar", "--prompt-offset", "5000", "--out", str(tmp_path / "h")])
