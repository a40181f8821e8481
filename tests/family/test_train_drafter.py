"""``python -m specpolicy.family.train_drafter``: a user's own target and prompt file in, an official-layout
DFlash / EAGLE-3 checkpoint out, which then drafts losslessly from the command line; bad options
are one line before the target loads."""

from __future__ import annotations

import json

import pytest

from specpolicy.family import train_drafter


def _prompts(tmp_path, n=6):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Natalia sold {i} clips in April."}) + "\n" for i in range(n)))
    return path


@pytest.mark.slow  # generation, features and training of a tiny drafter, then a run of the CLI
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_a_users_target_gets_a_drafter_that_runs(family, tmp_path, kind, monkeypatch, capsys):
    out = tmp_path / kind
    extra = (
        ["--block-size", "6", "--layer-ids", "0", "1", "--draft-layers", "1", "--draft-vocab", "50"]
        if kind == "dflash"
        else ["--layer-ids", "0", "1", "2", "--draft-vocab", "100", "--ttt", "3"]
    )
    log = train_drafter.main(
        [
            kind,
            "--target",
            str(family["target"]),
            "--prompts",
            str(_prompts(tmp_path)),
            "--out",
            str(out),
            "--max-new-tokens",
            "12",
            "--epochs",
            "2",
            "--batch-tokens",
            "256",
            "--holdout",
            "1",
            "--warmup",
            "2",
            "--device",
            "cpu",
            *extra,
        ]
    )
    assert log["device"] == "cpu" and log["continuations"]["n"] == 6
    assert log[kind]["validation_curve"][-1]["step"] == log[kind]["steps"]
    assert json.loads((out / "training_log.json").read_text())[kind]["steps"] == log[kind]["steps"]
    config = json.loads((out / "config.json").read_text())
    if kind == "dflash":
        assert config["dflash_config"]["target_layer_ids"] == [0, 1] and config["block_size"] == 6
        assert config["dflash_config"]["draft_vocab_size"] == 50 and 0 < log[kind]["draft_vocab_coverage"] <= 1
    else:
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    # a second run continues that checkpoint (--init: its shape and vocabulary), saving as it goes
    more = tmp_path / f"{kind}-more"
    log2 = train_drafter.main(
        [
            kind,
            "--target",
            str(family["target"]),
            "--prompts",
            str(_prompts(tmp_path)),
            "--out",
            str(more),
            "--work",
            f"{out}.work",
            "--max-new-tokens",
            "12",
            "--epochs",
            "1",
            "--batch-tokens",
            "256",
            "--holdout",
            "1",
            "--warmup",
            "2",
            "--device",
            "cpu",
            "--init",
            str(out),
            "--checkpoint-every",
            "1",
            *(["--ttt", "3"] * (kind == "eagle3")),
        ]
    )
    ce = "ce" if kind == "dflash" else "ce_step0"
    first, second = log[kind]["validation_curve"], log2[kind]["validation_curve"]
    assert first[-1][ce] < first[0][ce]  # the first run learnt ...
    assert abs(second[0][ce] - first[-1][ce]) < 0.05 * first[-1][ce]  # ... and the second starts where it ended
    assert json.loads((more / "config.json").read_text()) == config  # the same layout, vocabulary included
    assert json.loads((tmp_path / f"{kind}-more.checkpoint" / "config.json").read_text())["train_step"] >= 1
    # the checkpoint drafts through the command line, lossless
    import sys

    from specpolicy.run.cli import main as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "specpolicy",
            f"verifier.model={family['target']}",
            f"drafter={kind}",
            f"drafter.model={out}",
            "policy=static",
            "policy.k=4",
            "runtime=cpu",
            "runtime.dtype=float64",
            "dataset.num_prompts=2",
            "generation.max_new_tokens=16",
            "run.warmup_prompts=0",
        ],
    )
    try:
        cli()
    except SystemExit as exit_:
        assert exit_.code in (0, None), capsys.readouterr().err
    summary = json.loads(next(tmp_path.glob("outputs/*/summary.json")).read_text())
    assert summary["lossless_fraction"] == 1.0


def test_init_is_checked_before_anything_loads(family, tmp_path):
    prompts = str(_prompts(tmp_path))
    base = ["--target", str(family["target"]), "--prompts", prompts, "--out", "o"]
    with pytest.raises(SystemExit) as err:
        train_drafter.main(["dflash", *base, "--init", str(tmp_path / "nowhere")])
    assert str(err.value).startswith(f"error: --init={str(tmp_path / 'nowhere')!r}") and "\n" not in str(err.value)
    for kind, other, name in (("dflash", "eagle3", "EAGLE-3"), ("eagle3", "dflash", "DFlash")):
        with pytest.raises(SystemExit) as err:  # a checkpoint of the other kind
            train_drafter.main([kind, *base, "--init", str(family[other])])
        assert str(err.value).startswith(f"error: --init={str(family[other])!r}: the checkpoint is {name} ")
        assert "\n" not in str(err.value)
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text((family["dflash"] / "config.json").read_text())
    with pytest.raises(SystemExit) as err:
        train_drafter.main(["dflash", *base, "--init", str(empty)])
    assert str(err.value) == f"error: --init={str(empty)!r} has no weights (no *.safetensors nor pytorch_model*.bin)"
    with pytest.raises(SystemExit) as err:  # the checkpoint has its shape; a dflash draft vocabulary stays open
        train_drafter.main(
            [
                "dflash",
                *base,
                "--init",
                str(family["dflash"]),
                "--block-size",
                "8",
                "--draft-layers",
                "2",
                "--draft-vocab",
                "10",
            ]
        )
    assert str(err.value) == (
        f"error: --init={str(family['dflash'])!r} continues a checkpoint with its own shape; "
        "drop --draft-layers, --block-size"
    )
    with pytest.raises(SystemExit) as err:
        train_drafter.main(["eagle3", *base, "--init", str(family["eagle3"]), "--draft-vocab", "10"])
    assert str(err.value).endswith("continues a checkpoint with its own shape; drop --draft-vocab")
    with pytest.raises(SystemExit) as err:
        train_drafter.main(["dflash", *base, "--checkpoint-every", "-1"])
    assert str(err.value) == "error: --checkpoint-every=-1; it must be an integer >= 0"


def test_a_draft_vocabulary_larger_than_the_targets_is_one_line(family, tmp_path):
    vocab = json.loads((family["target"] / "config.json").read_text())["vocab_size"]
    with pytest.raises(SystemExit) as err:
        train_drafter.main(
            [
                "dflash",
                "--target",
                str(family["target"]),
                "--prompts",
                str(_prompts(tmp_path)),
                "--out",
                "o",
                "--draft-vocab",
                str(vocab + 1),
            ]
        )
    assert (
        str(err.value) == f"error: --draft-vocab={vocab + 1}; it must be at most the target's vocabulary size ({vocab})"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["dflash", "--target", "/nonexistent", "--prompts", "x", "--out", "o"],
            "error: --target='/nonexistent' is not a local Hugging Face model directory (no config.json)",
        ),
        (
            ["dflash", "--prompts", "{prompts}", "--out", "o", "--block-size", "1"],
            "error: --block-size=1; it must be an integer >= 2",
        ),
        (
            ["dflash", "--prompts", "{prompts}", "--out", "o", "--layer-ids", "0", "7"],
            "error: --layer-ids [0, 7]: the target has 2 layers (ids 0..1)",
        ),
        (
            ["eagle3", "--prompts", "{prompts}", "--out", "o", "--layer-ids", "0", "1"],
            "error: --layer-ids [0, 1]: EAGLE-3 fuses exactly three layers",
        ),
        (
            ["eagle3", "--prompts", "{prompts}", "--out", "o", "--draft-layers", "2"],
            "error: --draft-layers=2; an EAGLE-3 head has 1 layer",
        ),
    ],
)
def test_bad_options_are_one_line_before_anything_loads(family, tmp_path, argv, message):
    prompts = _prompts(tmp_path)
    argv = [str(prompts) if a == "{prompts}" else a for a in argv]
    if "--target" not in argv:
        argv += ["--target", str(family["target"])]
    with pytest.raises(SystemExit) as err:
        train_drafter.main(argv)
    assert str(err.value) == message
