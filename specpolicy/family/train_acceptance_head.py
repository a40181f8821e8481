"""Train SpecDec++'s acceptance prediction head for any drafter (bundled or your own).

    python -m specpolicy.family.train_drafter acceptance-head --drafter ar --out /tmp/ar-head
    python -m specpolicy.family.train_drafter acceptance-head --drafter eagle3 model=/models/my-eagle3 \\
        --target /models/my-target --prompts my_prompts.jsonl --out /models/my-eagle3/acceptance-head

Source: Huang, Guo & Wang 2024, SpecDec++ (arXiv 2405.19715), §4 (training the head) and the
reference code (Kaffaljidhmah2/SpecDec_pp ``specdec_pp/train.py``: weighted BCE with the mismatch
weight, the token-mixing ratio r = 0.15, ``wrap_model.py``: the head).

Data, through the ``Drafter`` interface only (so it works for any drafter): the real decoding loop
(``specpolicy.core.decoding.generate``) runs the drafter against the target, greedily, on TRAINING
prompts (by default ``gsm8k-train``, the GSM8K train questions bundled in ``specpolicy.data``: the
split the family was distilled on, never the held-out test prompts the benchmarks use). The committed sequence is then the target's own greedy continuation
(the family's distillation, as SpecDec++'s prefixes are the target's continuations). The length
policy ``MixingLengths`` drafts up to ``max_draft`` tokens a round and, at each position, stops with
probability r: that position's token then comes from the target (the round's correction or bonus
token) and carries no loss. This is the authors' token mixing -- each position of their training
sequence holds the target's token with probability r (no loss) and the drafter's otherwise -- as
rounds: the first r-position of a round is the target's token, and the drafted tokens before it are
labelled. Each drafted token's record: the drafter's last hidden state (``Draft.extras[LAST_HIDDEN]``,
what its LM head reads), its confidence, and its label, 1 when it equals the target's greedy token at
that position given the draft before it (``Verification.target_token_ids``), i.e. min(1, p/q) for greedy
decoding; every position of a draft is labelled, before and after the first mismatch, as the target's
token given the drafted prefix is known for each. Greedy rollouts only: no soft labels from sampling.

Loss: SpecDec++'s weighted BCE (mismatch weight w = 6, normalised by ``w * #0 + #1``); AdamW; seeded.
The head reads the hidden state and the logit of the token's confidence by default (``--inputs
hidden+confidence``, starting as the confidence itself; ``specpolicy.models.acceptance_head``): on the
bundled drafters the paper's hidden-state-only head (``--inputs hidden``) had a higher held-out ECE and
Brier score than the raw confidence for AR, EAGLE-3 and DFlash (the bundled heads' training logs).
The weighted optimum of a calibrated logit is shifted by ``-log w`` (the odds of acceptance divided
by w); ``--prior-correction`` (default on) adds ``log w`` back to the accepted class's output bias
after training, so the saved head's probabilities are calibrated (ECE/Brier are measured on them;
the uncorrected head's metrics are logged too). Drafts (rounds) are split into training and held-out
ones; ``training_log.json`` holds the loss curves and the held-out calibration of head and raw
confidence (ECE over 15 bins, Brier score, ROC AUC).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import LAST_HIDDEN, Draft, Verification

#: Default training prompts: the bundled GSM8K train questions (``specpolicy.data``, ``gsm8k-train``: the
#: first 1000 rows of the split the bundled family was distilled on, never the benchmarks' test prompts).
DEFAULT_PROMPTS = "gsm8k-train"
#: SpecDec++'s settings (README, ``train.py``): mixing ratio, mismatch weight, residual blocks.
MIXING_RATIO, MISMATCH_WEIGHT, NUM_LAYERS = 0.15, 6.0, 3
ECE_BINS = 15


class MixingLengths(LengthPolicy):
    """The rollout's length policy: a round drafts ``L = min(max_draft, G)`` tokens, G geometric
    (each position stops with probability ``ratio``; G = 0 is a plain round), drawn at the empty
    draft from its own seeded generator."""

    name = "acceptance-head-mixing"

    def __init__(self, max_draft: int, ratio: float, seed: int) -> None:
        self.max_draft, self.ratio = max_draft, ratio
        self.rng = random.Random(seed)

    def next_length(self, draft: Draft) -> int:
        if draft.length:
            self.draft_stop_reason = "policy_bound"
            return 0
        length = 0
        while length < self.max_draft and self.rng.random() >= self.ratio:
            length += 1
        return length


class DraftRecorder:
    """Wraps a drafter's ``commit`` to record each verified draft's rows: hidden ``(k, H)``,
    confidence ``(k,)`` and label ``(k,)`` (1: equals the target's greedy token there)."""

    def __init__(self, drafter) -> None:
        self.rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.missing = 0  # drafts without hidden states (the drafter did not report them)
        self._commit = drafter.commit
        drafter.commit = self.commit

    def commit(self, draft: Draft, verification: Verification) -> None:
        k = draft.length - draft.reused_tokens
        if k > 0 and draft.parents is None:
            hidden = draft.extras.get(LAST_HIDDEN)
            if hidden is None or hidden.shape[0] < k:
                self.missing += 1
            else:
                label = (draft.token_ids[:k] == verification.target_token_ids[:k]).float()
                self.rows.append((hidden[:k].float().cpu(), draft.confidences[:k].float().cpu(), label.cpu()))
        self._commit(draft, verification)


# -- metrics ---------------------------------------------------------------------------------------


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, weight: float = MISMATCH_WEIGHT) -> torch.Tensor:
    """SpecDec++'s loss: ``sum(w * (1 - y) * -log p0 + y * -log p1) / (w * sum(1 - y) + sum(y))``.

    Args:
        logits: ``(n, 2)`` float (index 1: accepted). labels: ``(n,)`` float in [0, 1] (soft labels allowed).
        weight: w, the mismatch (label 0) weight.
    Returns:
        the scalar loss (float32).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    y = labels.float()
    total = -(weight * (1 - y) * logp[:, 0] + y * logp[:, 1]).sum()
    return total / (weight * (1 - y).sum() + y.sum())


def ece(probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: ``sum_b |B_b|/n * |mean(y in b) - mean(p in b)|`` over ``bins``
    equal-width bins of [0, 1] (the last bin closed), empty bins skipped."""
    p, y = np.asarray(probs, float), np.asarray(labels, float)
    index = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = index == b
        if m.any():
            total += m.sum() / p.size * abs(y[m].mean() - p[m].mean())
    return float(total)


def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Brier score: ``mean((p - y)^2)``."""
    return float(np.mean((np.asarray(probs, float) - np.asarray(labels, float)) ** 2))


def roc_auc(probs: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by the rank statistic (ties share their average rank); NaN when one class is absent."""
    p, y = np.asarray(probs, float), np.asarray(labels, float) > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(p.size)
    sorted_p = p[order]
    i = 0
    while i < p.size:  # average ranks over ties
        j = i
        while j + 1 < p.size and sorted_p[j + 1] == sorted_p[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def calibration(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """``{"ece", "brier", "auc"}`` of ``probs`` against ``labels``."""
    return {"ece": ece(probs, labels), "brier": brier(probs, labels), "auc": roc_auc(probs, labels)}


def by_distance(head: np.ndarray, confidence: np.ndarray, labels: np.ndarray, distance: np.ndarray) -> list[dict]:
    """Calibration by draft position (distance d = 1, 2, ... from the committed sequence): per d, the
    tokens, their acceptance rate, and ECE and Brier of the head and of the raw confidence (the
    diagnostics' calibration by distance, ``specpolicy.family.diagnostics``, for the head)."""
    rows = []
    for d in np.unique(distance).astype(int).tolist():
        m = distance == d
        rows.append(
            {
                "distance": d,
                "tokens": int(m.sum()),
                "acceptance": float(labels[m].mean()),
                "head_ece": ece(head[m], labels[m]),
                "head_brier": brier(head[m], labels[m]),
                "confidence_ece": ece(confidence[m], labels[m]),
                "confidence_brier": brier(confidence[m], labels[m]),
            }
        )
    return rows


# -- data and training -----------------------------------------------------------------------------


def rollout(
    verifier,
    drafter,
    runtime,
    prompts: list[torch.Tensor],
    max_new_tokens: int,
    max_draft: int,
    ratio: float,
    seed: int,
) -> tuple[list, int]:
    """Decode ``prompts`` greedily with ``drafter`` and ``MixingLengths``; returns ``(rows per draft, drafts without hidden states)``."""
    from specpolicy.core.decoding import generate

    drafter.report_hidden = True
    recorder = DraftRecorder(drafter)
    policy = MixingLengths(max_draft, ratio, seed)
    for prompt in prompts:
        generate(prompt, verifier, runtime, max_new_tokens=max_new_tokens, drafter=drafter, policy=policy)
    return recorder.rows, recorder.missing


@torch.no_grad()
def start_as_confidence(head, weight: float) -> None:
    """Initialise a ``hidden+confidence`` head as the confidence itself: residual blocks zero (the
    identity), output logit = the confidence's logit - log ``weight`` (the weighted loss's optimum
    shift, undone by the prior correction after training)."""
    for block in head.blocks:
        block.linear.weight.zero_()
        block.linear.bias.zero_()
    head.out.weight.zero_()
    head.out.weight[1, -1] = 1.0
    head.out.bias.copy_(torch.tensor([0.0, -math.log(weight)]))


def train_head(
    train: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    num_layers: int = NUM_LAYERS,
    inputs: str = "hidden",
    weight: float = MISMATCH_WEIGHT,
    epochs: int = 30,
    batch_size: int = 256,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> tuple[Any, list[dict[str, float]], int]:
    """Train an ``AcceptancePredictionHead`` on ``train = (hidden (n, H), confidences (n,), labels (n,))``
    with the weighted BCE and AdamW (cosine schedule), keeping the epoch of least loss on the
    validation drafts ``val`` (early stopping: the rollouts are small, the head overfits them).

    Returns:
        ``(head, curve, best epoch)``: one curve entry per epoch, training and validation loss.
    """
    from specpolicy.models.acceptance_head import AcceptancePredictionHead

    torch.manual_seed(seed)
    x, c, y = train
    head = AcceptancePredictionHead(int(x.shape[1]), num_layers, inputs=inputs)
    with torch.no_grad():
        if head.reads_confidence:
            start_as_confidence(head, weight)
        else:  # start at the data's base rate (under the weighted loss's -log w shift)
            rate = float(y.float().mean().clamp(1e-3, 1 - 1e-3))
            head.out.bias.copy_(torch.tensor([0.0, math.log(rate / (1 - rate)) - math.log(weight)]))
    steps = max(1, epochs * math.ceil(x.shape[0] / batch_size))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    curve: list[dict[str, float]] = []
    best, best_state, best_epoch = float("inf"), None, 0
    for epoch in range(epochs):
        head.train()
        order = torch.randperm(x.shape[0], generator=gen)
        total, seen = 0.0, 0
        for start in range(0, x.shape[0], batch_size):
            idx = order[start : start + batch_size]
            loss = weighted_bce(head(x[idx], c[idx]), y[idx], weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * idx.numel()
            seen += idx.numel()
        head.eval()
        with torch.no_grad():
            val_loss = float(weighted_bce(head(val[0], val[1]), val[2], weight)) if val[0].shape[0] else total / seen
        curve.append({"epoch": epoch + 1, "train_loss": total / max(seen, 1), "val_loss": val_loss})
        if val_loss < best:
            best, best_epoch = val_loss, epoch + 1
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
    if best_state is not None:
        head.load_state_dict(best_state)
    return head.eval(), curve, best_epoch


def _split(rows: list, holdout: float, seed: int) -> tuple[list, list]:
    """Drafts split at random into (training, held-out), ``holdout`` the held-out fraction."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = int(round(len(rows) * holdout))
    return [rows[i] for i in order[cut:]], [rows[i] for i in order[:cut]]


def _stack(rows: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not rows:
        return torch.empty(0, 1), torch.empty(0), torch.empty(0)
    return tuple(torch.cat([r[i] for r in rows]) for i in range(3))  # type: ignore[return-value]


def read_prompts(source: str, offset: int, count: int) -> list:
    """``count`` prompts (``specpolicy.data.datasets.Prompt``) from row ``offset`` of ``source``: a
    bundled prompt set's name (``specpolicy.data.datasets.BUNDLED``; ``gsm8k-train`` by default) or a
    JSONL file (a ``prompt``, ``question``, ``problem`` or ``text`` field per row), read by
    ``specpolicy.data.datasets.load_prompts`` (no model needed).

    Raises:
        ValueError: one line naming ``--prompts``, ``--prompt-offset`` or ``--num-prompts`` (a missing
            file, a bad row, an offset past the last row).
    """
    from specpolicy.data.datasets import BUNDLED, load_prompts as load_set

    path = None if source in BUNDLED else source
    try:
        return load_set(source if path is None else "prompts", path, count, offset)
    except ValueError as exc:
        message = str(exc)
        for key, flag in (
            ("dataset.path", "--prompts"),
            ("dataset.name", "--prompts"),
            ("dataset.offset", "--prompt-offset"),
            ("dataset.num_prompts", "--num-prompts"),
        ):
            message = message.replace(key, flag)
        raise ValueError(message) from None


def load_prompts(source: str, tokenizer, offset: int, count: int) -> list[torch.Tensor]:
    """``read_prompts``'s prompts through ``tokenizer``'s chat template, as ``(P,) int64``."""
    return [p.token_ids(tokenizer) for p in read_prompts(source, offset, count)]


def drafter_config(name: str, overrides: list[str]) -> dict[str, Any]:
    """The drafter's config node: ``conf/drafter/<name>.yaml`` (when the package has one) with
    ``KEY=VALUE`` overrides (values parsed as YAML)."""
    from importlib import resources

    import yaml

    conf = resources.files("specpolicy.conf") / "drafter" / f"{name}.yaml"
    node: dict[str, Any] = {"name": name}
    if conf.is_file():
        node.update(yaml.safe_load(conf.read_text()) or {})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"drafter override {item!r} must be KEY=VALUE (e.g. model=/models/my-drafter)")
        node[key.removeprefix("drafter.")] = yaml.safe_load(value)
    return node


def drafter_hidden_size(drafter) -> int | None:
    """H of a drafter's last hidden state, from its model's config (None when it cannot be told)."""
    model = getattr(drafter, "model", None)
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    return int(size) if isinstance(size, int) else None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m specpolicy.family.train_drafter acceptance-head",
        description="Train SpecDec++'s acceptance head for a drafter (bundled or your own).",
    )
    ap.add_argument("overrides", nargs="*", help="drafter settings KEY=VALUE (e.g. model=/models/my-drafter)")
    ap.add_argument("--drafter", required=True, help="drafter name (ar, eagle3, dflash, dart, falcon, or a plugin's)")
    ap.add_argument("--target", default="target", help="the target: bundled name or local directory")
    ap.add_argument(
        "--prompts",
        default=DEFAULT_PROMPTS,
        help="training prompts: a bundled set's name (default gsm8k-train: GSM8K train questions bundled in "
        "specpolicy/data) or a JSONL file; never the benchmarks' test set",
    )
    ap.add_argument("--prompt-offset", type=int, default=0, help="first prompt row used")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    ap.add_argument("--max-draft", type=int, default=8, help="tokens a rollout round drafts at most")
    ap.add_argument("--mixing-ratio", type=float, default=MIXING_RATIO, help="r: stop probability per position")
    ap.add_argument("--weight", type=float, default=MISMATCH_WEIGHT, help="mismatch (label 0) weight of the BCE")
    ap.add_argument("--num-layers", type=int, default=NUM_LAYERS)
    ap.add_argument(
        "--inputs",
        choices=("hidden", "hidden+confidence"),
        default="hidden+confidence",
        help="what the head reads: the hidden state and the token's confidence (default: the bundled heads'; "
        "it starts as the confidence) or the hidden state alone (the paper's)",
    )
    ap.add_argument("--cache", default=None, help="rollout records file: read when it exists, else written")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=None, help="AdamW's rate (default 3e-5; 1e-3 with --inputs hidden)")
    ap.add_argument("--holdout", type=float, default=0.2, help="fraction of drafts held out for calibration")
    ap.add_argument("--val", type=float, default=0.15, help="fraction of training drafts for early stopping")
    ap.add_argument("--no-prior-correction", action="store_true", help="keep the weighted loss's bias (-log w)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (model.safetensors, config.json, training_log.json)")
    return ap


def check_args(a: argparse.Namespace) -> None:
    """One line naming the first bad option (before any model loads)."""
    checks = [
        ("--num-prompts", a.num_prompts >= 1, ">= 1"),
        ("--max-new-tokens", a.max_new_tokens >= 1, ">= 1"),
        ("--max-draft", a.max_draft >= 1, ">= 1"),
        ("--mixing-ratio", 0.0 <= a.mixing_ratio < 1.0, "in [0, 1)"),
        ("--weight", a.weight > 0, "> 0"),
        ("--num-layers", a.num_layers >= 0, ">= 0"),
        ("--epochs", a.epochs >= 1, ">= 1"),
        ("--holdout", 0.0 < a.holdout < 1.0, "in (0, 1)"),
        ("--val", 0.0 <= a.val < 1.0, "in [0, 1)"),
        ("--prompt-offset", a.prompt_offset >= 0, ">= 0"),
    ]
    for flag, ok, accepted in checks:
        if not ok:
            raise SystemExit(f"{flag}={getattr(a, flag[2:].replace('-', '_'))!r} must be {accepted}")
    from specpolicy.data.datasets import BUNDLED

    if a.prompts not in BUNDLED and not Path(a.prompts).is_file():
        raise SystemExit(f"--prompts {a.prompts!r} is neither a bundled prompt set ({', '.join(BUNDLED)}) nor a file")
    try:
        read_prompts(a.prompts, a.prompt_offset, a.num_prompts)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def run(a: argparse.Namespace) -> dict:
    """Roll out, train, evaluate and save (module docstring); returns the training log."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.models.acceptance_head import save_head
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_verifier

    check_args(a)
    if a.lr is None:
        a.lr = 1e-3 if a.inputs == "hidden" else 3e-5
    torch.manual_seed(a.seed)
    started = time.perf_counter()
    cache = Path(a.cache) if a.cache else None
    node = drafter_config(a.drafter, a.overrides)
    hidden_size = None
    if cache is not None and cache.is_file():
        saved = torch.load(cache)
        rows, missing, hidden_size = saved["rows"], saved["missing"], saved["hidden_size"]
    else:
        runtime = Runtime.from_config({"device": "cpu", "dtype": "float32"}, seed=a.seed)
        pm = get_plugin_manager()
        verifier = make_verifier(pm, {"name": "hf", "model": a.target}, runtime)
        drafter = make_drafter(pm, node, runtime, verifier)
        hidden_size = drafter_hidden_size(drafter)
        prompts = load_prompts(a.prompts, verifier.tokenizer, a.prompt_offset, a.num_prompts)
        rows, missing = rollout(
            verifier, drafter, runtime, prompts, a.max_new_tokens, a.max_draft, a.mixing_ratio, a.seed
        )
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"rows": rows, "missing": missing, "hidden_size": hidden_size}, cache)
    if not rows:
        raise SystemExit(f"--drafter {a.drafter}: no draft reported its hidden states (Draft.extras['{LAST_HIDDEN}'])")
    rollout_s = time.perf_counter() - started
    train_rows, held_rows = _split(rows, a.holdout, a.seed)
    fit_rows, val_rows = _split(train_rows, a.val, a.seed + 1)
    xt, ct, yt = _stack(fit_rows)
    xh, ch, yh = _stack(held_rows)
    head, curve, best_epoch = train_head(
        (xt, ct, yt),
        _stack(val_rows),
        num_layers=a.num_layers,
        inputs=a.inputs,
        weight=a.weight,
        epochs=a.epochs,
        lr=a.lr,
        seed=a.seed,
    )
    with torch.no_grad():
        held_loss = float(weighted_bce(head(xh, ch), yh, a.weight))
    raw = head.acceptance_probs(xh, ch).numpy()
    if not a.no_prior_correction:
        with torch.no_grad():
            head.out.bias[1] += math.log(a.weight)
    probs = head.acceptance_probs(xh, ch).numpy()
    distance = np.concatenate([np.arange(1, r[2].numel() + 1) for r in held_rows]) if held_rows else np.zeros(0)
    metrics: dict[str, Any] = {
        "head": calibration(probs, yh.numpy()),
        "by_distance": by_distance(probs, ch.numpy(), yh.numpy(), distance),
        "head_uncorrected": calibration(raw, yh.numpy()),
        "confidence": calibration(ch.numpy(), yh.numpy()),
        "held_out_tokens": int(yh.numel()),
        "held_out_acceptance": float(yh.mean()),
        "held_out_weighted_bce": held_loss,
    }
    settings = {
        "target": a.target,
        "prompts": a.prompts,
        "prompt_offset": a.prompt_offset,
        "num_prompts": a.num_prompts,
        "max_new_tokens": a.max_new_tokens,
        "max_draft": a.max_draft,
        "mixing_ratio": a.mixing_ratio,
        "mismatch_weight": a.weight,
        "epochs": a.epochs,
        "best_epoch": best_epoch,
        "inputs": a.inputs,
        "val": a.val,
        "lr": a.lr,
        "optimizer": "AdamW (weight decay 0.01, cosine)",
        "holdout": a.holdout,
        "prior_correction": not a.no_prior_correction,
        "seed": a.seed,
        "drafter_config": node,
    }
    head.metadata = {
        "drafter": a.drafter,
        "drafter_hidden_size": hidden_size or int(xt.shape[1]),
        "training": settings,
        "calibration": metrics,
    }
    out = save_head(head, a.out)
    log = {
        "kind": "acceptance-head",
        "drafter": a.drafter,
        "settings": settings,
        "drafts": {"train": len(fit_rows), "val": len(val_rows), "held_out": len(held_rows), "without_hidden": missing},
        "tokens": {"train": int(yt.numel()), "held_out": int(yh.numel())},
        "curve": curve,
        "held_out_calibration": metrics,
        "rollout_s": round(rollout_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=2) + "\n")
    h, c = metrics["head"], metrics["confidence"]
    print(
        f"{a.drafter}: held-out {yh.numel()} tokens; head ECE {h['ece']:.4f} Brier {h['brier']:.4f} AUC {h['auc']:.3f}"
        f" | confidence ECE {c['ece']:.4f} Brier {c['brier']:.4f} AUC {c['auc']:.3f} -> {out}"
    )
    return log


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point (also ``python -m specpolicy.family.train_drafter acceptance-head ...``)."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
