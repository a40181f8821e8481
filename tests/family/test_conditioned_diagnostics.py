"""``python -m specpolicy.family.diagnostics --kind dflash|eagle3``: one-pass drafts from the target's
features of each committed prefix, passes per draft length (DFlash: one per block; EAGLE-3: one per
token), and the measured pass cost from a run's rounds."""

from __future__ import annotations

import json

import pytest

from specpolicy.family.diagnostics import main, pass_cost


@pytest.mark.slow  # target generation and drafts on the tiny family
@pytest.mark.parametrize(
    "kind, passes",
    [
        ("dflash", {"8": 2, "16": 3, "32": 5}),  # block 8: 7 tokens per pass
        ("eagle3", {"8": 8, "16": 16, "32": 32}),
    ],
)
def test_feature_drafters_are_diagnosed(family, tmp_path, kind, passes):
    out = tmp_path / "d.json"
    res = main(
        [
            "--kind",
            kind,
            "--drafter",
            str(family[kind]),
            "--target",
            str(family["target"]),
            "--datasets",
            "gsm8k",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "40",
            "--stride",
            "9",
            "--max-distance",
            "32",
            "--out",
            str(out),
        ]
    )
    g = res["gsm8k"]
    assert res["kind"] == kind and json.loads(out.read_text())["gsm8k"]["n_drafts"] == g["n_drafts"] > 0
    assert len(g["agreement"]) == 32 and set(g["longest_correct_prefix"]) == {"8", "16", "32"}
    assert g["passes_by_length"] == pytest.approx(passes)
    assert 0.0 <= g["ece"] <= 1.0


def test_pass_cost_is_draft_ms_per_pass_over_a_vanilla_step(tmp_path):
    rows = [
        {
            "rounds": [{"draft_ms": 3.0, "drafter_forward_passes": 1}, {"draft_ms": 5.0, "drafter_forward_passes": 2}],
            "vanilla_rounds": 2,
            "vanilla_verify_ms": 24.0,
        }
    ]  # results.jsonl keeps vanilla's totals
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pass_cost(path) == {
        "pass_ms": pytest.approx(8 / 3, abs=1e-3),
        "target_step_ms": 12.0,
        "pass_over_target_step": pytest.approx(8 / 3 / 12, abs=1e-3),
    }
