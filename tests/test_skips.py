"""A prompt longer than the context is reported before decoding starts, skipped with its reason
in results.jsonl and the summary, and a resume reads it back instead of failing on it again."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_module

from conftest import overrides

from specpolicy.experiment import run_experiment


def test_an_over_context_prompt_is_skipped_recorded_and_resumed(family, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Natalia sold clips."}, {"question": "clips " * 2500, "id": "huge"},
            {"prompt": "How many clips?"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*overrides(family), f"dataset.path={prompts}", "dataset.name=mine",
                                           "dataset.num_prompts=all", "verifier.max_context=600"])
    run_dir = tmp_path / "run"
    summary = run_experiment(cfg, run_dir)
    out = capsys.readouterr().out
    assert f"skipping prompt huge ({prompts}:2): " in out and "over the context limit of 599" in out
    assert out.index("skipping prompt huge") < out.index("on 2 prompts")  # reported before the table
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
