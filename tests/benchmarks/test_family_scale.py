"""``benchmarks/family_scale.py``: sizes are counted with the tied embedding once, the projections
follow from the measured figures, and the cost bar picks the largest drafter that meets it."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import load_benchmark

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("family_scale")


def test_params_count_the_tied_embedding_once(scale):
    model = scale.build(TINY)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    embedding = 4096 * 32
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert scale.params(model) == embedding + 2 * per_layer + 32  # + the final norm


def test_main_projects_from_what_it_measured(scale, tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "TARGETS", {"small": SMALL, "tiny": TINY})
    monkeypatch.setattr(scale, "DRAFTERS", {"tiny": TINY, "small": SMALL})
    out = tmp_path / "scale.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "family_scale.py",
            "--repeats",
            "2",
            "--train-steps",
            "1",
            "--context",
            "16",
            "--train-tokens",
            "512",
            "--prompts",
            "3",
            "--max-new-tokens",
            "7",
            "--out",
            str(out),
        ],
    )
    scale.main()
    res = json.loads(out.read_text())
    log = json.loads((scale.FAMILY / "training_log.json").read_text())["target"]
    assert res["settings"]["target_stage_tokens"] == pytest.approx(log["wall_s"] * log["tokens_per_s"])
    assert res["targets"]["small"]["target_stage_h"] == pytest.approx(log["wall_s"] / 3600)
    for row in res["targets"].values():
        assert row["step_ms"] > 0 and row["train_tokens_per_s"] > 0
        assert row["target_stage_h_at_this_rate"] == pytest.approx(
            res["settings"]["target_stage_tokens"] / row["train_tokens_per_s"] / 3600
        )
        assert row["target_stage_h"] == pytest.approx(  # today's recorded stage, scaled by the measured rates
            log["wall_s"] / 3600 * res["targets"]["small"]["train_tokens_per_s"] / row["train_tokens_per_s"]
        )
        assert row["vanilla_main_job_s"] == pytest.approx(3 * 7 * row["step_ms"] / 1e3)
        fits = {d: v for d, v in res["drafters"].items() if v["block_pass_ms"] <= 0.5 * row["step_ms"]}
        assert row["largest_drafter"] == (max(fits, key=lambda d: fits[d]["params"]) if fits else None)
    assert res["drafters"]["small"]["params"] > res["drafters"]["tiny"]["params"]


def test_every_timed_forward_sees_the_same_cache(scale):
    """The timed forwards all run on a cache of exactly ``context`` tokens (cropped back after each)."""
    model = scale.build(TINY)
    seen = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["cache"].get_seq_length(), args[0].shape[1])), with_kwargs=True
    )
    scale.forward_ms(model, context=12, new=5, repeats=3)
    assert seen == [(0, 12)] + [(12, 5)] * 4  # the prefill, then one untimed and three timed forwards
