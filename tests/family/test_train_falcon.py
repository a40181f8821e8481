"""Coupled Sequential Glancing Distillation (``specpolicy.family.train_falcon``): lambda's schedules,
the glancing selection on a worked example, the second pass's inputs (predicted k positions earlier,
the drawn blocks true), the training pass equal to the drafter's first pass, and a short training
run that lowers the loss and writes the released layout."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_lm
from specpolicy.family.data import Example
from specpolicy.family.feature_store import FeatureStore, extract_features
from specpolicy.family.train_falcon import (
    FalconTrainee,
    falcon_loss,
    glancing_lambda,
    loss_positions,
    new_falcon,
    run_head,
    select_glanced,
)
from specpolicy.models.falcon import load_falcon

VOCAB = 64
SIZE = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)


def test_lambda_schedules():
    assert [glancing_lambda(e, 4) for e in range(4)] == pytest.approx([0.4, 0.3, 0.2, 0.1])  # paper
    assert [glancing_lambda(e, 4, "code") for e in range(4)] == pytest.approx([0.45, 0.3625, 0.275, 0.1875])
    with pytest.raises(ValueError, match="lambda_schedule must be one of paper, code, got 'x'"):
        glancing_lambda(0, 4, "x")


def test_glancing_selection_worked_example():
    # loss positions 3..8 of 10; block starts (k = 2) 0, 2, 4, 6, 8 -- of them 4, 6, 8 are loss positions
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, 3:9] = True
    # 5 mismatches, lambda 0.4: N = floor(2.0) = 2 of the 3 eligible starts
    chosen = select_glanced(mask, torch.tensor([5]), 0.4, 2, torch.Generator().manual_seed(0))
    assert int(chosen.sum()) == 2 and set(chosen[0].nonzero()[:, 0].tolist()) <= {4, 6, 8}
    # N capped at the eligible starts; rows independent; lambda 0 glances nothing
    many = select_glanced(mask.expand(2, 10), torch.tensor([100, 3]), 0.5, 2, torch.Generator().manual_seed(1))
    assert many[0].nonzero()[:, 0].tolist() == [4, 6, 8] and int(many[1].sum()) == 1  # floor(1.5) = 1
    assert not select_glanced(mask, torch.tensor([7]), 0.0, 2, None).any()
    # each draw is uniform over the eligible starts: each drawn 2/3 of the time
    counts = torch.zeros(10)
    g = torch.Generator().manual_seed(2)
    for _ in range(600):
        counts += select_glanced(mask, torch.tensor([5]), 0.4, 2, g)[0].float()
    assert counts[[0, 1, 2, 3, 5, 7, 9]].sum() == 0 and ((counts[[4, 6, 8]] - 400).abs() < 45).all(), counts


def test_loss_positions_predict_response_tokens():
    ids = torch.zeros(2, 9, dtype=torch.long)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 7:] = False
    # position i predicts x_{i+3} (k = 2): a response token (index >= prompt length) inside the sequence
    got = loss_positions(ids, valid, torch.tensor([4, 2]), 2)
    assert got[0].tolist() == [False, True, True, True, True, True, False]
    assert got[1].tolist() == [True, True, True, True, False, False, False]


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, layers=2, vocab=VOCAB).double()


@torch.no_grad()
def test_the_second_pass_feeds_the_drawn_block_starts_their_targets(target, monkeypatch):
    head = new_falcon(target.config, 2, size=SIZE).double().eval()
    model = FalconTrainee(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB - 1, (1, 14), generator=g)
    feats = target(input_ids=ids, output_hidden_states=True).hidden_states[2]

    class Store:
        def batch(self, idx, layers, L, dtype=torch.float32):  # FeatureStore.batch
            return feats  # float64, as the test model is

    batch = {
        "input_ids": ids,
        "valid": torch.ones_like(ids, dtype=torch.bool),
        "prompt_len": torch.tensor([4]),
        "index": torch.tensor([0]),
    }
    seen, drawn = [], {}
    real_head, real_select = run_head, select_glanced

    def spy(m, hidden, tokens):
        seen.append((hidden.clone(), tokens.clone()))
        return real_head(m, hidden, tokens)

    def select(mask, mism, lam, k, gen):
        drawn["mism"], drawn["lam"] = int(mism), lam
        return real_select(mask, torch.tensor([100]), 1.0, k, gen)  # every eligible start

    monkeypatch.setattr("specpolicy.family.train_falcon.run_head", spy)
    monkeypatch.setattr("specpolicy.family.train_falcon.select_glanced", select)
    falcon_loss(Store(), 2, 2, lambda s: 0.4, [0])(model, batch, g)
    (h1, t1), (h2, t2) = seen
    assert torch.equal(h1, feats[:, :12]) and torch.equal(t1, ids[:, 1:13])  # pass 1: the true inputs
    first = real_head(model, h1, t1)
    pred = (first @ model.lm_head.T).argmax(-1)
    want = (feats[:, 2:14] @ model.lm_head.T).argmax(-1)
    mask = loss_positions(ids, batch["valid"], batch["prompt_len"], 2)
    assert drawn == {"mism": int(((pred != want) & mask).sum()), "lam": 0.4}
    for j in range(12):
        if j % 2 == 0 and mask[0, j]:  # a drawn block start: its target, f_{j+2} with x_{j+3}
            assert torch.equal(h2[0, j], feats[0, j + 2]) and t2[0, j] == ids[0, j + 3], j
        else:  # the true input
            assert torch.equal(h2[0, j], h1[0, j]) and t2[0, j] == t1[0, j], j


@torch.no_grad()
def test_the_training_pass_is_the_drafters_first_pass(target):
    """The training pass over a whole sequence (blocks from position 0) gives at the block ending at
    position n - 1 what the drafter's first pass gives with committed x_0..x_n."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.drafters.falcon import FalconDrafter

    head = new_falcon(target.config, 5, size=SIZE).double().eval()
    model = FalconTrainee(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    ids = torch.randint(0, VOCAB - 1, (1, 13), generator=torch.Generator().manual_seed(4))
    feats = target(input_ids=ids, output_hidden_states=True).hidden_states[2]
    out = run_head(model, feats[:, :12], ids[:, 1:13])
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    for n in (2, 6, 10):  # blocks {n-2, n-1} aligned with the training's
        drafter = FalconDrafter(head, target.get_input_embeddings(), target.get_output_embeddings(), 2, rt)
        drafter.prefill(ids[0, : n + 1], features=feats[0, :n])
        want = target.get_output_embeddings()(out[0, n - 2 : n]).argmax(-1)
        assert torch.equal(drafter.draft(2).token_ids, want)


@pytest.mark.slow
def test_a_short_training_run_lowers_the_loss_and_saves_the_released_layout(tmp_path):
    from specpolicy.family.train_falcon import train_falcon
    from specpolicy.family.trainer import TrainConfig

    target = tiny_lm(0, layers=4, vocab=VOCAB).float()
    path = tmp_path / "target"
    target.save_pretrained(path)
    g = torch.Generator().manual_seed(3)  # a learnable language: the count continues from the prompt
    examples = []
    for _ in range(40):
        start = int(torch.randint(6, 30, (1,), generator=g))
        examples.append(Example(tuple(range(start - 3, start)), tuple(range(start, start + 20))))
    extract_features(path, examples, [4], tmp_path / "store", log_every=0)
    cfg = TrainConfig(epochs=15, batch_tokens=256, lr=1e-2, warmup_steps=5, log_every=5, bf16=False)
    stats = train_falcon(
        path,
        examples,
        FeatureStore(tmp_path / "store"),
        cfg,
        tmp_path / "out",
        0,
        size=SIZE,
        train_indices=list(range(36)),
        heldout_indices=list(range(36, 40)),
        val_every=10,
        checkpoint_every=15,
    )
    load_falcon(tmp_path / "out")
    load_falcon(tmp_path / "out.checkpoint")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["k_mask"] == 2
    curve = stats["validation_curve"]
    assert curve[0]["lambda"] == pytest.approx(0.4) and curve[-1]["lambda"] < 0.1
    # held out: the first block's cross-entropy falls and its accuracy rises (a random target's
    # tokens two ahead are hard to learn in 60 steps: no large bar)
    assert curve[-1]["ce_first_block"] < curve[0]["ce_first_block"]
    assert sum(curve[-1]["accuracy_true_inputs"]) > sum(curve[0]["accuracy_true_inputs"]) + 0.1
    assert stats["final_loss"] < stats["first_loss"] and stats["lambda_schedule"] == "paper"


@pytest.mark.slow  # generation, features and training of a tiny Falcon head, then runs of the CLI
def test_train_drafter_falcon_gives_a_drafter_that_runs(family, tmp_path, monkeypatch, capsys):
    import sys

    from specpolicy.family import train_drafter
    from specpolicy.run.cli import main as cli

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Natalia sold {i} clips in April."}) + "\n" for i in range(6)))
    out = tmp_path / "falcon"
    log = train_drafter.main(
        ["falcon", "--target", str(family["target"]), "--prompts", str(prompts), "--out", str(out)]
        + ["--max-new-tokens", "12", "--epochs", "2", "--batch-tokens", "256", "--holdout", "1", "--warmup", "2"]
        + ["--device", "cpu", "--checkpoint-every", "1"]
    )
    assert log["falcon"]["validation_curve"][-1]["step"] == log["falcon"]["steps"]
    assert json.loads((out / "config.json").read_text())["k_mask"] == 2
    with pytest.raises(SystemExit, match="Falcon reads the target's last hidden state only"):
        train_drafter.main(
            ["falcon", "--target", str(family["target"]), "--prompts", str(prompts), "--out", "o"]
            + ["--layer-ids", "0", "1", "2"]
        )
    monkeypatch.chdir(tmp_path)
    for policy in (["policy=falcon-tree", "policy.tree=paper"], ["policy=failfast", "policy.n=2"]):
        monkeypatch.setattr(
            sys,
            "argv",
            ["specpolicy", f"verifier.model={family['target']}", "drafter=falcon", f"drafter.model={out}", *policy]
            + ["runtime=cpu", "runtime.dtype=float64", "dataset.num_prompts=2", "generation.max_new_tokens=16"]
            + ["run.warmup_prompts=0"],
        )
        try:
            cli()
        except SystemExit as exit_:
            assert exit_.code in (0, None), capsys.readouterr().err
    for summary in tmp_path.glob("outputs/*/summary.json"):
        assert json.loads(summary.read_text())["lossless_fraction"] == 1.0
    assert len(list(tmp_path.glob("outputs/*/summary.json"))) == 2
