#!/usr/bin/env python
"""How much a drafter-side acceptance predictor can know beyond the drafted token's confidence.

    python benchmarks/acceptance_headroom.py --drafter ar --cache /tmp/ar-rollout.pt --out ar.json

Issue 47's question: SpecDec++'s head (``specpolicy.models.acceptance_head``) stops drafting on its
acceptance estimates; it can only beat the raw confidence at a tuned threshold if it RANKS drafted
tokens better (a higher ROC AUC on held-out drafts), not merely if it is better calibrated (a
monotone recalibration changes which threshold is best, not the best decisions). This script fits
small predictors on features of the drafter's own output distribution at each drafted position and
reports their held-out AUC and Brier score beside the confidence's:

* ``confidence``: the drafted token's probability (its logit, standardised);
* ``+entropy``, ``+margin`` (top-1 minus top-2 probability) and ``log p2`` (the runner-up's log
  probability), from ``lm_head(hidden)`` -- the drafter's full distribution;
* ``+position`` (distance from the committed sequence, 1..k) and ``+cumulative`` (the log of the
  product of the confidences so far in the draft).

Each set is fitted as a logistic regression and as a one-hidden-layer MLP (16 SiLU units), Adam,
600 full-batch steps, seed 0, on the training drafts; scored on the held-out drafts. Data: the head
trainer's rollouts (``specpolicy.family.train_acceptance_head.rollout``: the target's greedy
continuation of GSM8K train prompts, ``MixingLengths`` rounds, each drafted token labelled 1 when it
equals the target's greedy token given the draft before it), the same split of drafts (``--holdout``,
``--seed``) as the trainer's, so the bundled head's logged held-out AUC (``config.json``) sits beside them.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from specpolicy.family.train_acceptance_head import _split, brier, load_prompts, roc_auc, rollout

FEATURES = ("confidence", "entropy", "margin", "log_p2", "position", "cumulative")
SETS = {
    "confidence": ("confidence",),
    "+entropy": ("confidence", "entropy"),
    "+entropy+margin+log_p2": ("confidence", "entropy", "margin", "log_p2"),
    "+position": ("confidence", "entropy", "margin", "log_p2", "position"),
    "+cumulative": FEATURES,
}


def output_matrix(drafter) -> torch.Tensor:
    """The drafter's LM head weight ``(V, H)`` float32 (what turns its reported hidden state into logits).
    Raises SystemExit naming ``--drafter`` for a drafter without one."""
    model = getattr(drafter, "model", None)
    head = getattr(model, "lm_head", None)
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if head is None:
        raise SystemExit(f"--drafter {drafter.name}: no lm_head / output embeddings to read the distribution from")
    return head.weight.detach().float().cpu()


def features(rows: list, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per drafted token: ``(n, len(FEATURES))`` float32 features, ``(n,)`` labels, ``(n,)`` confidences."""
    out, labels, confs = [], [], []
    for hidden, conf, label in rows:
        log_p = torch.log_softmax(hidden.float() @ weight.T, dim=-1)  # (k, V)
        p = log_p.exp()
        top2 = p.topk(2, dim=-1).values
        c = conf.float().clamp(1e-6, 1 - 1e-6)
        cols = {
            "confidence": torch.log(c) - torch.log1p(-c),
            "entropy": -(p * log_p).sum(-1),
            "margin": top2[:, 0] - top2[:, 1],
            "log_p2": torch.log(top2[:, 1] + 1e-9),
            "position": torch.arange(1, c.numel() + 1, dtype=torch.float32),
            "cumulative": torch.log(c).cumsum(0),
        }
        out.append(torch.stack([cols[f] for f in FEATURES], dim=1))
        labels.append(label.float())
        confs.append(conf.float())
    return torch.cat(out), torch.cat(labels), torch.cat(confs)


def fit_and_score(x: torch.Tensor, y: torch.Tensor, xh: torch.Tensor, yh: torch.Tensor, units: int) -> dict:
    """A logistic regression (``units`` 0) or an MLP fitted on ``(x, y)``; held-out AUC and Brier."""
    torch.manual_seed(0)
    width = x.shape[1]
    model = (
        torch.nn.Linear(width, 1)
        if units == 0
        else torch.nn.Sequential(torch.nn.Linear(width, units), torch.nn.SiLU(), torch.nn.Linear(units, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(600):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y).backward()
        opt.step()
    with torch.no_grad():
        probs = torch.sigmoid(model(xh)[:, 0]).numpy()
    return {"auc": roc_auc(probs, yh.numpy()), "brier": brier(probs, yh.numpy())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", required=True, help="bundled drafter: ar, eagle3 (one with an LM head)")
    ap.add_argument("--cache", default=None, help="rollout records (the head trainer's --cache file): read or written")
    ap.add_argument(
        "--num-prompts", type=int, default=150, help="GSM8K train prompts rolled out (the bundled heads': 150)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--holdout", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON output")
    a = ap.parse_args(argv)

    from specpolicy.core.runtime import Runtime
    from specpolicy.family.train_acceptance_head import DEFAULT_PROMPTS, MIXING_RATIO, drafter_config
    from specpolicy.models.acceptance_head import default_head_dir
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_verifier

    runtime = Runtime.from_config({"device": "cpu", "dtype": "float32"}, seed=a.seed)
    pm = get_plugin_manager()
    verifier = make_verifier(pm, {"name": "hf", "model": "target"}, runtime)
    node = drafter_config(a.drafter, [])
    drafter = make_drafter(pm, node, runtime, verifier)
    cache = Path(a.cache) if a.cache else None
    if cache is not None and cache.is_file():
        rows = torch.load(cache)["rows"]
    else:
        prompts = load_prompts(DEFAULT_PROMPTS, verifier.tokenizer, 0, a.num_prompts)
        rows, _ = rollout(verifier, drafter, runtime, prompts, a.max_new_tokens, a.max_draft, MIXING_RATIO, a.seed)
        if cache is not None:
            torch.save({"rows": rows, "missing": 0, "hidden_size": None}, cache)
    train, held = _split(rows, a.holdout, a.seed)
    x, y, _ = features(train, output_matrix(drafter))
    xh, yh, conf_h = features(held, output_matrix(drafter))
    mean, std = x.mean(0), x.std(0) + 1e-6
    result: dict = {
        "drafter": a.drafter,
        "settings": {k: v for k, v in vars(a).items() if k not in ("cache", "out")},
        "tokens": {"train": int(y.numel()), "held_out": int(yh.numel())},
        "held_out_acceptance": float(yh.mean()),
        "raw_confidence": {"auc": roc_auc(conf_h.numpy(), yh.numpy()), "brier": brier(conf_h.numpy(), yh.numpy())},
        "sets": {},
    }
    for name, cols in SETS.items():
        idx = [FEATURES.index(c) for c in cols]
        xs, xhs = (x[:, idx] - mean[idx]) / std[idx], (xh[:, idx] - mean[idx]) / std[idx]
        result["sets"][name] = {
            "logistic": fit_and_score(xs, y, xhs, yh, 0),
            "mlp16": fit_and_score(xs, y, xhs, yh, 16),
        }
    head_dir = default_head_dir(node)
    head_config = head_dir / "config.json" if head_dir is not None else None
    if head_config is not None and head_config.is_file():
        logged = json.loads(head_config.read_text()).get("calibration", {})
        same = logged.get("held_out_tokens") == int(yh.numel())  # the trainer's split of the same rollout
        result["bundled_head"] = {**(logged.get("head") or {}), "same_held_out_drafts": same}
    best = max(max(s["logistic"]["auc"], s["mlp16"]["auc"]) for s in result["sets"].values())
    result["best_auc_gain_over_confidence"] = best - result["raw_confidence"]["auc"]
    print(f"{a.drafter}: held-out tokens {yh.numel()}, acceptance {float(yh.mean()):.3f}")
    print(
        f"  raw confidence      AUC {result['raw_confidence']['auc']:.4f}  Brier {result['raw_confidence']['brier']:.4f}"
    )
    for name, s in result["sets"].items():
        lo, ml = s["logistic"], s["mlp16"]
        print(f"  {name:24s} AUC {lo['auc']:.4f} / {ml['auc']:.4f}  Brier {lo['brier']:.4f} / {ml['brier']:.4f}")
    if result.get("bundled_head"):
        where = "the same held-out drafts" if result["bundled_head"]["same_held_out_drafts"] else "its own rollout"
        print(
            f"  bundled head         AUC {result['bundled_head'].get('auc', float('nan')):.4f} ({where}, config.json)"
        )
    if math.isfinite(result["best_auc_gain_over_confidence"]):
        print(f"  best AUC gain over the confidence: {result['best_auc_gain_over_confidence']:+.4f}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
