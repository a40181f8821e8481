"""``python -m specpolicy.family.diagnostics --kind dflash|eagle3|dart|falcon|deer``: one-pass drafts
from the target's features of each committed prefix (DEER: from the prefix alone), passes per draft
length (DFlash: one per block; EAGLE-3: one per token; DART: one per 8 tokens; Falcon: one per 2;
DEER: one per absolute block of 32 crossed), each kind's bundled default drafter, and the measured pass cost
from a run's rounds."""

from __future__ import annotations

import json

import pytest

from specpolicy.family import diagnostics
from specpolicy.family.diagnostics import main, pass_cost
from tiny_other_drafters import save_tiny_other_drafters


@pytest.fixture(scope="module")
def drafters(family, tmp_path_factory):
    return {**family, **save_tiny_other_drafters(family, tmp_path_factory.mktemp("drafters"))}


@pytest.mark.slow  # target generation and drafts on the tiny family
@pytest.mark.parametrize(
    "kind, passes",
    [
        ("dflash", {"8": 2, "16": 3, "32": 5}),  # block 8: 7 tokens per pass
        ("eagle3", {"8": 8, "16": 16, "32": 32}),
        ("dart", {"8": 1, "16": 2, "32": 4}),  # d = 8 per pass, later passes on the drafted tokens
        ("falcon", {"8": 4, "16": 8, "32": 16}),  # k = 2 per pass
        ("deer", None),  # one pass per absolute block of 32 the draft reaches (+ the boundary pass)
    ],
)
def test_feature_drafters_are_diagnosed(drafters, tmp_path, kind, passes):
    family = drafters
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
    if passes is None:
        p = g["passes_by_length"]
        assert 1.0 <= p["8"] <= p["16"] <= p["32"] <= 3.0  # a 32-token draft crosses one boundary at most
    else:
        assert g["passes_by_length"] == pytest.approx(passes)
    assert 0.0 <= g["ece"] <= 1.0


def test_every_kind_defaults_to_a_bundled_drafter():
    from specpolicy.models.loading import bundled_dir

    assert set(diagnostics.DEFAULT_DRAFTERS) == set(diagnostics.KINDS)
    for kind, name in diagnostics.DEFAULT_DRAFTERS.items():
        files = {p.name for p in (bundled_dir() / name).iterdir()}
        assert files & {"config.json", "deer.json"}, (kind, name, files)
    assert diagnostics.DEFAULT_DRAFTERS["falcon"] == "falcon-drafter"


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
