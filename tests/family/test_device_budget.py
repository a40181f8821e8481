"""The family training pipeline's device option and wall-clock budgets (CPU; a fake clock).

``TrainConfig.max_seconds`` cuts the step plan after 20 timed steps and recomputes the LR
schedule over the cut plan (the run still ends at the min LR), with a hard stop at 1.1 x the
budget; ``python -m specpolicy.family --device`` reaches distill, the features and every training
stage, and ``--device cuda`` without CUDA is one line naming ``--device`` before anything loads.
"""

from __future__ import annotations

import argparse
import json
import math
import types
from pathlib import Path

import pytest
import torch

import specpolicy.family.trainer as trainer
from specpolicy.family.data import Example, save_examples
from specpolicy.family.trainer import TrainConfig, budget_steps, lr_at, train

BUNDLE = Path(__file__).resolve().parents[2] / "specpolicy" / "family" / "bundle"


class FakeClock:
    """``time.time`` for the trainer: advanced by the loss function, ``step_s(step)`` seconds a step."""

    def __init__(self, step_s):
        self.now, self.calls, self.step_s = 1000.0, 0, step_s

    def time(self) -> float:
        return self.now

    def loss_fn(self, model, batch, gen):
        self.now += self.step_s(self.calls)
        self.calls += 1
        x = batch["input_ids"].float().mean(-1, keepdim=True)
        return (model(x) ** 2).mean(), int(batch["input_ids"].numel())


def _run(monkeypatch, clock: FakeClock, cfg: TrainConfig, n: int = 400) -> dict:
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(time=clock.time))
    examples = [Example((1, 2), (3, 4)) for _ in range(n)]
    torch.manual_seed(0)
    return train(torch.nn.Linear(1, 1), examples, clock.loss_fn, cfg, pad_id=0, name="t")


def test_budget_cuts_the_plan_and_recomputes_the_schedule(monkeypatch):
    # 1 s a step (the first 5 s: its one-off cost is left out of the measurement), budget 100 s:
    # after 20 steps (24 s) the 0.95 x 100 s fill leaves 71 more steps -> a plan of 91 of 400
    clock = FakeClock(lambda i: 5.0 if i == 0 else 1.0)
    cfg = TrainConfig(batch_tokens=4, lr=1e-2, warmup_steps=20, min_lr_ratio=0.1, log_every=1, max_seconds=100.0)
    st = _run(monkeypatch, clock, cfg)
    assert st["steps_planned"] == 400
    assert st["step_s"] == pytest.approx(1.0)
    assert st["steps"] == st["steps_cut"] == 91 < st["steps_planned"]
    assert st["time_budget_s"] == 100.0 and st["hard_stop"] is False
    assert clock.calls == 91
    lrs = [lr for _, _, lr in st["loss_curve"]]
    # the schedule after the cut is the one of a 91-step plan: it ends at the min LR
    assert lrs[-1] == pytest.approx(lr_at(90, 91, cfg))
    assert lrs[-1] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=0.01)
    assert lrs[30] == pytest.approx(lr_at(30, 91, cfg)) and lrs[30] < lr_at(30, 400, cfg)
    # a rerun with max_steps = steps (no time budget) has the same schedule and data order
    # (warmup_steps >= 20: the steps before the cut ran warmup, which does not depend on the total)
    rerun_cfg = TrainConfig(**{**vars(cfg), "max_seconds": None, "max_steps": 91})
    rerun = _run(monkeypatch, FakeClock(lambda i: 1.0), rerun_cfg)
    assert [lr for _, _, lr in rerun["loss_curve"]] == lrs
    assert rerun["final_loss"] == st["final_loss"]


def test_budget_hard_stop(monkeypatch):
    # steps slow down from 1 s to 10 s after the last re-projection (50 s): the loop stops once past 110 s
    clock = FakeClock(lambda i: 1.0 if i < 60 else 10.0)
    cfg = TrainConfig(batch_tokens=4, lr=1e-2, warmup_steps=5, log_every=1, max_seconds=100.0)
    st = _run(monkeypatch, clock, cfg)
    assert st["hard_stop"] is True and st["replans"] == []
    assert st["steps"] == 66  # after 5 slow steps (110 s) not yet past 110 s: a sixth runs
    assert st["steps"] < st["steps_cut"] == 95


def test_budget_projects_the_plan_again_when_the_first_steps_were_slow(monkeypatch):
    # the first 20 steps 2 s each (e.g. other processes starting beside this one), then 0.5 s
    clock = FakeClock(lambda i: 2.0 if i < 20 else 0.5)
    cfg = TrainConfig(batch_tokens=4, lr=1e-2, warmup_steps=5, min_lr_ratio=0.1, log_every=1, max_seconds=100.0)
    st = _run(monkeypatch, clock, cfg, n=1000)
    # cut at 20 steps (40 s): 20 + (95 - 40) / 2 = 47 steps, ending at 54 s of 100. Past 25% of
    # the budget and 10 steps after the cut (45 s): 0.5 s a step since it -> 30 + (95 - 45) / 0.5 = 130
    assert st["steps_cut"] == st["steps"] == 130
    assert st["replans"] == [[30, 0.5, 130]]  # at 50 s the projection is unchanged
    assert clock.now - 1000.0 <= 100.0  # within the budget, not stopped by the hard stop
    assert st["hard_stop"] is False
    assert st["loss_curve"][-1][2] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=0.01)  # still ends at min LR
    assert clock.now - 1000.0 == pytest.approx(95.0)  # 40 + 110 x 0.5 (without re-projection: 54)


def test_budget_projects_again_before_a_plan_cut_from_slow_first_steps_ends(monkeypatch):
    # the first 20 steps 0.5 s each, then 0.05 s (CUDA warming up beside other processes starting):
    # the cut plan, 20 + (95 - 10) / 0.5 = 190 steps, would end at 18.5 s, before 25% of the budget
    clock = FakeClock(lambda i: 0.5 if i < 20 else 0.05)
    cfg = TrainConfig(batch_tokens=4, lr=1e-2, warmup_steps=5, min_lr_ratio=0.1, log_every=1, max_seconds=100.0)
    st = _run(monkeypatch, clock, cfg, n=5000)
    # 25% of the cut plan's 170 later steps (43, at 12.15 s): 0.05 s a step -> 63 + (95 - 12.15) / 0.05
    assert st["replans"][0] == [63, 0.05, 1720]
    assert st["steps"] > 1500 and clock.now - 1000.0 > 85.0  # the budget filled (without: 190 steps, 18.5 s)
    assert clock.now - 1000.0 <= 100.0 and st["hard_stop"] is False
    assert st["loss_curve"][-1][2] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=0.01)  # still ends at min LR


def test_budget_shortens_a_warmup_the_cut_plan_never_leaves(monkeypatch):
    clock = FakeClock(lambda i: 1.0)
    cfg = TrainConfig(batch_tokens=4, lr=1e-2, warmup_steps=100, log_every=1, max_seconds=50.0)
    st = _run(monkeypatch, clock, cfg)
    assert st["steps"] == 47  # 20 + (47.5 - 20) / 1
    assert st["loss_curve"][-1][2] == pytest.approx(cfg.min_lr_ratio * cfg.lr, rel=0.05)


def test_no_budget_no_budget_stats(monkeypatch):
    st = _run(monkeypatch, FakeClock(lambda i: 1.0), TrainConfig(batch_tokens=4, max_steps=30), n=50)
    assert st["steps"] == 30 and "time_budget_s" not in st and "steps_planned" not in st


def test_budget_steps_rule():
    assert budget_steps(400, 20, 24.0, 1.0, 100.0) == 91
    assert budget_steps(50, 20, 24.0, 1.0, 100.0) == 50  # never more than the plan
    assert budget_steps(400, 20, 120.0, 1.0, 100.0) == 20  # never fewer than the steps run
    with pytest.raises(ValueError, match="max_seconds"):
        train(torch.nn.Linear(1, 1), [Example((1,), (2,))], None, TrainConfig(max_seconds=0), 0)


# -- the pipeline's --device ------------------------------------------------------------------


def test_device_cuda_without_cuda_is_one_line_before_anything_loads(monkeypatch, tmp_path):
    from specpolicy.family import pipeline

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        pipeline.main(["--device", "cuda", "--out", str(out), "--stages", "distill"])
    msg = str(e.value)
    assert "--device" in msg and "\n" not in msg
    assert not out.exists()
    assert pipeline.resolve_device("auto") == "cpu"
    with pytest.raises(SystemExit, match="--max-seconds-per-stage"):
        pipeline.main(["--max-seconds-per-stage", "0", "--out", str(out)])


def test_device_and_budget_reach_every_stage(monkeypatch, tmp_path):
    """--device / --max-seconds-per-stage reach distill, extract_features, the DFlash and DART
    TrainConfigs and train_deer's options (the stages captured, nothing trained)."""
    import specpolicy.family.distill as distill_mod
    import specpolicy.family.feature_store as fs_mod
    import specpolicy.family.train_dart as dart_mod
    import specpolicy.family.train_deer as deer_mod
    import specpolicy.family.train_dflash as dflash_mod
    from specpolicy.family import pipeline

    monkeypatch.setattr(pipeline, "resolve_device", lambda d: "cuda:7" if d == "cuda" else d)
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    for m in ("tokenizer", "target"):
        (out / m).symlink_to(BUNDLE / m)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}) + "\n")
    seen: dict = {}

    def fake_distill(target, examples, tok, out_path, *args, **kw):
        seen["distill"] = kw["device"]
        save_examples([Example((5, 6, 7), (8, 9, 2))] * 4, out_path)
        return {}

    def fake_features(target, examples, layers, out_dir, batch_tokens, **kw):
        seen["features"] = kw["device"]
        return {}

    def fake_train(name):
        def f(target, exs, store, cfg, *args, **kw):
            seen[name] = (cfg.device, cfg.max_seconds)
            return {}

        return f

    def fake_deer(a: argparse.Namespace):
        seen["deer"] = (a.device, a.max_seconds, a.stage1_steps)
        return {}

    monkeypatch.setattr(distill_mod, "distill", fake_distill)
    monkeypatch.setattr(fs_mod, "extract_features", fake_features)
    monkeypatch.setattr(fs_mod, "FeatureStore", lambda d: None)
    monkeypatch.setattr(dflash_mod, "train_dflash", fake_train("dflash"))
    monkeypatch.setattr(dart_mod, "train_dart", fake_train("dart"))
    monkeypatch.setattr(deer_mod, "run", fake_deer)
    pipeline.main(
        ["--device", "cuda", "--out", str(out), "--work", str(work), "--data", str(data), "--holdout", "1"]
        + ["--max-seconds-per-stage", "240", "--deer-args", "--stage1-steps 7"]
        + ["--stages", "distill", "features", "dflash-drafter", "dart-drafter", "deer-drafter"]
    )
    assert seen == {
        "distill": "cuda:7",
        "features": "cuda:7",
        "dflash": ("cuda:7", 240.0),
        "dart": ("cuda:7", 240.0),
        "deer": ("cuda:7", 240.0, 7),
    }


def test_deer_splits_its_budget_by_steps(monkeypatch, tmp_path):
    import specpolicy.family.train_deer as deer_mod

    cfgs = []

    def fake_train(model, exs, loss_fn, cfg, pad_id, name, on_log):
        cfgs.append(cfg)
        return {"steps": cfg.max_steps}

    monkeypatch.setattr(deer_mod, "train", fake_train)
    monkeypatch.setattr(deer_mod, "heldout_losses", lambda *a, **k: {"stage1": 0.0, "stage2": 0.0})
    monkeypatch.setattr(deer_mod, "save_adapter", lambda *a, **k: 0)
    distill = tmp_path / "d.jsonl"
    save_examples([Example((5, 6, 7), (8, 9, 2))] * 6, distill)
    a = deer_mod.build_parser().parse_args(
        ["--distill", str(distill), "--out", str(tmp_path / "deer"), "--heldout", "2", "--max-seconds", "90"]
        + ["--stage1-steps", "200", "--stage2-steps", "100", "--device", "cpu"]
    )
    deer_mod.run(a)
    assert [c.max_seconds for c in cfgs] == [60.0, 30.0]
    assert all(c.device == "cpu" and c.bf16 is False for c in cfgs)
    assert math.isclose(sum(c.max_seconds for c in cfgs), 90.0)
