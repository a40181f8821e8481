"""A prompt longer than the context is reported before decoding starts, skipped with its reason
in results.jsonl and the summary, and a resume reads it back instead of failing on it again; a
``generation.max_new_tokens`` the context cannot hold is one warning line once the context is known."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hydra import compose, initialize_config_module

from conftest import overrides
from specpolicy.run.experiment import run_experiment
from specpolicy.run.skips import max_new_tokens_line


def test_an_over_context_prompt_is_skipped_recorded_and_resumed(family, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "Natalia sold clips."},
        {"question": "clips " * 2500, "id": "huge"},
        {"prompt": "How many clips?"},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *overrides(family),
                f"dataset.path={prompts}",
                "dataset.name=mine",
                "dataset.num_prompts=all",
                "verifier.max_context=600",
            ],
        )
    run_dir = tmp_path / "run"
    summary = run_experiment(cfg, run_dir)
    out = capsys.readouterr().out
    assert f"skipping prompt huge ({prompts}:2): " in out and "over the context limit of 599" in out
    assert out.index("skipping prompt huge") < out.index(
        "prompts.jsonl, 2 prompts x 16 new tokens"
    )  # reported before the table
    written = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in written] == ["mine/0", "huge", "mine/2"]
    assert written[1]["skipped"].startswith("prompt of ") and "longer than the 599 tokens" in written[1]["skipped"]
    assert written[1]["rounds"] == [] and written[1]["output_ids"] == []
    assert summary["prompts"] == 2 and summary["prompts_total"] == 3
    assert summary["skipped_prompts"] == {"huge": written[1]["skipped"]}
    assert set(summary["per_prompt"]) == {"mine/0", "mine/2"}
    assert summary["lossless_fraction"] == 1.0
    assert "skipped 1 of 3 prompts longer than the context" in out

    again = run_experiment(cfg, run_dir)  # the same command: complete (the skip is read back), no failure
    assert "run complete: all 3 prompts" in capsys.readouterr().out
    assert [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()] == written
    assert again["skipped_prompts"] == summary["skipped_prompts"] and again["prompts"] == 2


def test_max_new_tokens_beyond_the_context_is_one_warning_line_naming_key_value_and_context():
    target, drafter = SimpleNamespace(max_context=1024), SimpleNamespace(max_context=0)  # a drafter without a limit
    assert max_new_tokens_line(256, [100, 180], target, drafter) is None  # every prompt can reach it
    assert max_new_tokens_line(100_000_000, [100, 180], target, drafter) == (
        "generation.max_new_tokens=100000000 is more than the context holds: it is 1024 tokens (verifier.max_context, "
        "or the models' max_position_embeddings), so every prompt (100-180 tokens with the chat template) ends at the "
        "context after at most 845-925 new tokens (finish_reason max_context)"
    )
    assert max_new_tokens_line(900, [100, 180], target, SimpleNamespace(max_context=0)) == (
        "generation.max_new_tokens=900 is more than the context holds: it is 1024 tokens (verifier.max_context, or the "
        "models' max_position_embeddings), so 1 of 2 prompts (180 tokens with the chat template) end at the context "
        "after at most 845 new tokens (finish_reason max_context)"
    )
    assert "it is 512 tokens" in max_new_tokens_line(900, [100], target, SimpleNamespace(max_context=512))


def test_a_run_warns_of_max_new_tokens_beyond_the_context_and_loses_nothing(family, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Natalia sold clips."}) + "\n")
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *overrides(family),
                f"dataset.path={prompts}",
                "dataset.name=mine",
                "verifier.max_context=48",
                "generation.max_new_tokens=100000000",
            ],
        )
    summary = run_experiment(cfg, tmp_path / "run")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning: generation.max_new_tokens=100000000 is more than the context holds: it is 48 tokens"
    )
    row = json.loads((tmp_path / "run" / "results.jsonl").read_text())
    assert row["finish_reason"] == "max_context"
    assert len(row["output_ids"]) == 48 - row["prompt_tokens"] + 1  # what the line promised: at most, and reached
    assert f"after at most {len(row['output_ids'])} new tokens" in warnings[0]
    assert summary["prompts"] == 1
