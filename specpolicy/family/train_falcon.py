"""Training a Falcon head on stored target features with Coupled Sequential Glancing Distillation
(Falcon, arXiv 2412.12639, §3.3; Bestpay-inc/Falcon ``train/glance.py``, re-derived for CPU training).

Drafter position i pairs the target's top-layer feature f_i (``hidden_states[L]``, after the final
norm: what the LM head reads) with the embedding of x_{i+1}; its output is trained towards
f_{i+k}, whose LM-head distribution is the target's for x_{i+k+1} (``specpolicy.models.falcon``).
Positions form blocks of k under the relaxed causal mask, aligned at the sequence's start.

One training step (per batch):

1. A no-grad pass over the true inputs predicts every position's feature and token (argmax of the
   target's LM head on it).
2. Glancing (``glance.py``): ``mismatches`` = loss positions whose predicted token differs from the
   target's (argmax of the LM head on f_{i+k}); per row, N = floor(lambda * mismatches) block
   starts (aligned at position 0, as the relaxed mask's blocks), drawn uniformly (seeded) among
   those that are loss positions, are fed their TARGETS -- the true feature f_{i+k} with the true
   token x_{i+k+1}, coupled -- in place of (f_i, x_{i+1}); every other position keeps its true
   input (teacher forcing, as the drafter's first pass sees). As released for k = 2, only the
   block's start glances. The released code also adds uniform noise to the input features
   (EAGLE-1's augmentation); we add none.
3. A second pass with gradients over those inputs; loss, on every loss position (as released)::

       SmoothL1(out, f_{i+k}) + 0.1 * [0.9 * KL_T(p_target || p_draft) + 0.1 * CE(p_draft, argmax p_target)]

   with T = 0.95. Departures, stated: the released KL weights the tempered log-ratio by the
   untempered target p; we use the tempered KL. The released CE label is a Gumbel-softmax draw
   from p_target; ours is its argmax (the distilled data are the target's greedy continuations).

lambda decays by epoch e of E: the PAPER's ``0.4 * (E - e) / E`` (the default here); the released
code uses ``0.35 * (E - e) / E + 0.1`` (``lambda_schedule="code"``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specpolicy.family.data import Example, batch_plan, collate
from specpolicy.family.feature_store import FeatureStore
from specpolicy.family.trainer import (
    TrainConfig,
    checkpoint_hook,
    init_linear,
    split_examples,
    target_fields,
    train_validated,
)
from specpolicy.models.falcon import DEFAULT_K, FalconDraftModel, FalconSpec, llama_config, load_falcon, save_falcon

#: The bundled-target Falcon head: the target's width, ONE decoder layer with a small MLP
#: (intermediate 512, against the target's 768), 4 heads / 2 KV heads of 64. About 1.9 M parameters,
#: 1.3 M of them the LSTM (2 x 4H x (2H + H) + 2 x 4H x 2H, biases).
FALCON_SIZE = dict(
    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512
)
#: Loss weights (``glance.py``: v_w 1.0, p_w 0.1; 0.9 KL + 0.1 CE; T 0.95).
FEATURE_WEIGHT, TOKEN_WEIGHT, KL_SHARE, TEMPERATURE = 1.0, 0.1, 0.9, 0.95
LAMBDA_SCHEDULES = ("paper", "code")


def glancing_lambda(epoch: int, epochs: int, schedule: str = "paper") -> float:
    """lambda at 0-based ``epoch`` of ``epochs``: paper ``0.4 (E - e) / E``; code ``0.35 (E - e) / E + 0.1``.

    Raises:
        ValueError: an unknown ``schedule``.
    """
    if schedule not in LAMBDA_SCHEDULES:
        raise ValueError(f"lambda_schedule must be one of {', '.join(LAMBDA_SCHEDULES)}, got {schedule!r}")
    frac = (epochs - epoch) / epochs
    return 0.4 * frac if schedule == "paper" else 0.35 * frac + 0.1


class FalconTrainee(nn.Module):
    """The trained head with the target's frozen embedding table and LM head."""

    def __init__(self, head: FalconDraftModel, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        self.embed = nn.Parameter(embed.detach().clone(), requires_grad=False)  # (V, H)
        self.lm_head = nn.Parameter(lm_head.detach().clone(), requires_grad=False)  # (V, H)


def new_falcon(target_config, seed: int, k: int = DEFAULT_K, size: dict | None = None) -> FalconDraftModel:
    """A freshly initialised Falcon head for a target (its width and vocabulary)."""
    raw = dict(
        **target_fields(target_config),
        k_mask=k,
        **(size or FALCON_SIZE),
    )
    torch.manual_seed(seed)
    return init_linear(FalconDraftModel(llama_config(raw), FalconSpec.from_config(raw)))


def select_glanced(
    loss_mask: torch.Tensor, mismatches: torch.Tensor, lam: float, k: int, gen: torch.Generator | None
) -> torch.Tensor:
    """Which positions glance: per row, ``floor(lam * mismatches)`` block starts (positions ``i % k == 0``,
    blocks aligned at position 0 as the relaxed mask's) drawn uniformly without replacement among
    the block starts that are loss positions (capped at all of them).

    Args:
        loss_mask: ``(R, n) bool`` loss positions. mismatches: ``(R,) int64`` per row.
        lam: lambda. k: block size. gen: the random stream (on the CPU).
    Returns:
        ``(R, n) bool``, True at the drawn block starts.
    """
    R, n = loss_mask.shape
    eligible = loss_mask[:, ::k]  # (R, blocks): each block's start
    want = torch.minimum((lam * mismatches.double()).floor().long(), eligible.sum(-1))
    scores = torch.rand(eligible.shape, generator=gen).to(loss_mask.device)
    scores = scores.masked_fill(~eligible, 2.0)  # ineligible starts sort last
    rank = scores.argsort(-1).argsort(-1)  # each start's rank in a random order
    chosen = torch.zeros_like(loss_mask)
    chosen[:, ::k] = rank < want[:, None]
    return chosen


def falcon_inputs(model: FalconTrainee, ids: torch.Tensor, feats: torch.Tensor, k: int):
    """Per position i < n = L - k: the true input (f_i, x_{i+1}) and the target f_{i+k}.

    Returns:
        ``(hidden (R, n, H), tokens (R, n) int64, target (R, n, H))``.
    """
    n = ids.shape[1] - k
    return feats[:, :n], ids[:, 1 : n + 1], feats[:, k : k + n]


def loss_positions(ids: torch.Tensor, valid: torch.Tensor, plen: torch.Tensor, k: int) -> torch.Tensor:
    """``(R, L - k) bool``: positions i whose predicted token x_{i+k+1} is a response token of the sequence."""
    R, L = ids.shape
    n = L - k
    pos = torch.arange(n, device=ids.device)[None] + k + 1  # the token each position predicts
    inside = pos < L
    return inside & valid.gather(1, pos.clamp(max=L - 1).expand(R, n)) & (pos >= plen[:, None])


def run_head(model: FalconTrainee, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The head over whole sequences from position 0 under the relaxed mask: ``(R, n, H)``."""
    R, n = tokens.shape
    positions = torch.arange(n, device=tokens.device)[None].expand(R, n)
    out, _, _ = model.head(F.embedding(tokens, model.embed), hidden, positions)
    return out


def falcon_loss(store: FeatureStore, top_layer: int, k: int, lam_of_step, schedule_steps: list[int]):
    """The loss function for ``trainer.train``: ``(model, batch, gen) -> (loss, n_label_tokens)``.

    Args:
        lam_of_step: ``step -> lambda`` (the step counted by this function's calls).
        schedule_steps: a one-element list, the calls so far (read by the caller for logs).
    """

    def loss_fn(model: FalconTrainee, batch: dict, gen: torch.Generator):
        ids, valid, plen = batch["input_ids"], batch["valid"], batch["prompt_len"]
        R, L = ids.shape
        feats = store.batch(batch["index"].tolist(), [top_layer], L).to(ids.device)
        hidden, tokens, target = falcon_inputs(model, ids, feats, k)
        mask = loss_positions(ids, valid, plen, k)
        lam = lam_of_step(schedule_steps[0])
        schedule_steps[0] += 1
        with torch.no_grad():  # the LM head only where a loss is taken (the prompt needs none)
            target_logits = (target[mask] @ model.lm_head.T).float()  # (m, V)
            target_token = target_logits.argmax(-1)
            predicted = run_head(model, hidden, tokens)
            pred_token = torch.zeros_like(tokens)
            pred_token[mask] = (predicted[mask] @ model.lm_head.T).argmax(-1)
            wrong = torch.zeros_like(mask)
            wrong[mask] = pred_token[mask] != target_token
            glanced = select_glanced(mask, wrong.sum(-1), lam, k, gen)
            # glancing: a drawn block start is fed its target -- f_{i+k} with x_{i+k+1} -- the rest
            # keeps the true inputs
            target_ids = F.pad(ids[:, k + 1 :], (0, 1))[:, : tokens.shape[1]]  # x_{i+k+1}
            new_hidden = torch.where(glanced[..., None], target, hidden)
            new_tokens = torch.where(glanced, target_ids, tokens)
        out = run_head(model, new_hidden.to(hidden.dtype), new_tokens)[mask]  # (m, H)
        count = max(int(mask.sum()), 1)
        feature = F.smooth_l1_loss(out.float(), target[mask].float(), reduction="none").mean(-1).sum() / count
        logits = (out @ model.lm_head.T).float()
        log_q_t = torch.log_softmax(logits / TEMPERATURE, -1)
        log_p_t = torch.log_softmax(target_logits / TEMPERATURE, -1)
        kl = (log_p_t.exp() * (log_p_t - log_q_t)).sum() / count
        ce = F.cross_entropy(logits, target_token, reduction="sum") / count
        loss = FEATURE_WEIGHT * feature + TOKEN_WEIGHT * (KL_SHARE * kl + (1 - KL_SHARE) * ce)
        return loss, int(mask.sum())

    return loss_fn


@torch.no_grad()
def validation_metrics(
    model: FalconTrainee, examples: list[Example], indices: list[int], store: FeatureStore, top_layer: int, k: int
) -> dict:
    """Held-out accuracy with true inputs (the first drafted block, by offset in the block) and with
    the inputs predicted k positions earlier (the second block), and the first block's cross-entropy."""
    hits, counts, ce, n_ce = torch.zeros(2, k), torch.zeros(2, k), 0.0, 0
    dev = model.lm_head.device  # batches move to the model; the counts stay on the CPU
    for s in range(0, len(indices), 16):
        idx = indices[s : s + 16]
        batch = collate([examples[i] for i in idx], 0)
        ids, valid, plen = (batch[k_].to(dev) for k_ in ("input_ids", "valid", "prompt_len"))
        L = ids.shape[1]
        feats = store.batch(idx, [top_layer], L, torch.bfloat16).to(dev).float()
        hidden, tokens, target = falcon_inputs(model, ids, feats, k)
        mask = loss_positions(ids, valid, plen, k)
        target_token = (target @ model.lm_head.T).argmax(-1)
        first = run_head(model, hidden, tokens)
        logits = first @ model.lm_head.T
        pred = logits.argmax(-1)
        shifted = F.pad(mask, (k, 0))[:, : mask.shape[1]]
        second = run_head(
            model,
            torch.where(shifted[..., None], F.pad(first, (0, 0, k, 0))[:, : hidden.shape[1]], hidden),
            torch.where(shifted, F.pad(pred, (k, 0))[:, : tokens.shape[1]], tokens),
        )
        pred2 = (second @ model.lm_head.T).argmax(-1)
        offset = torch.arange(mask.shape[1], device=dev) % k
        for j in range(k):
            sel = mask & (offset[None] == j)
            hits[0, j] += float(((pred == target_token) & sel).sum())
            counts[0, j] += float(sel.sum())
            sel2 = sel & shifted
            hits[1, j] += float(((pred2 == target_token) & sel2).sum())
            counts[1, j] += float(sel2.sum())
        ce += float(F.cross_entropy(logits[mask].float(), target_token[mask], reduction="sum"))
        n_ce += int(mask.sum())
    acc = (hits / counts.clamp(min=1)).tolist()
    return {
        "ce_first_block": round(ce / max(n_ce, 1), 4),
        "accuracy_true_inputs": [round(x, 4) for x in acc[0]],
        "accuracy_predicted_inputs": [round(x, 4) for x in acc[1]],
    }


def train_falcon(
    target_dir: str | Path,
    examples: list[Example],
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    pad_id: int,
    k: int = DEFAULT_K,
    size: dict | None = None,
    lambda_schedule: str = "paper",
    train_indices: list[int] | None = None,
    heldout_indices: list[int] | None = None,
    val_every: int = 200,
    init: str | Path | None = None,
    checkpoint_every: int = 0,
) -> dict:
    """Train the Falcon head of ``target_dir`` with CSGD and save it in the released layout.

    Args:
        examples: the target's greedy continuations (their indices are the store's).
        store: their target features; must hold ``hidden_states[L]`` (L = the target's layers).
        cfg: optimisation settings; lambda decays over ``cfg.epochs`` (when ``cfg.max_steps`` cuts the
            plan short, its E "epochs" are spread over the steps planned: a short run still decays).
        k: tokens per pass. size: the head's architecture (default ``FALCON_SIZE``).
        lambda_schedule: ``"paper"`` (0.4 (E - e) / E, default) or ``"code"`` (0.35 (E - e) / E + 0.1).
        train_indices / heldout_indices: trained on (default all) / held out for the validation
            curve every ``val_every`` steps and at the end.
        init: a Falcon checkpoint to continue from (its shape and k; ``k`` and ``size`` unused).
        checkpoint_every: when > 0, every this many steps (rounded up to a progress line) the head is
            saved to ``<out_dir>.checkpoint`` (overwritten; its config gets ``train_step``).
    Returns:
        the ``trainer.train`` stats plus ``params``, ``k``, ``lambda_schedule``, ``feature_layer``,
        ``validation_curve``, ``wall_s``.
    Raises:
        KeyError: the store lacks the top-layer feature.
        ValueError: an unknown ``lambda_schedule``.
    """
    from specpolicy.family.models import load_model

    glancing_lambda(0, max(cfg.epochs, 1), lambda_schedule)  # checks the name
    target = load_model(target_dir)
    top = int(target.config.num_hidden_layers)
    if top not in store.layers:
        raise KeyError(f"the feature store holds hidden_states {store.layers}, not the top layer {top}")
    train_indices, heldout_indices, trained = split_examples(examples, train_indices, heldout_indices)
    head = load_falcon(init, f"init={str(init)!r}") if init else new_falcon(target.config, cfg.seed, k, size)
    k = head.k
    trainee = FalconTrainee(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    del target
    per_epoch = max(1, len(batch_plan([len(e) for e in trained], cfg.batch_tokens, cfg.seed, 0, cfg.pad_to_multiple)))
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(per_epoch * cfg.epochs, cfg.max_steps)
    calls = [0]

    def lam_of_step(step: int) -> float:  # epoch e of E, the E epochs spread over the steps planned
        return glancing_lambda(min(step * cfg.epochs // total, cfg.epochs - 1), cfg.epochs, lambda_schedule)

    curve = []

    def validate(step: int, training: bool) -> None:
        if heldout_indices:
            head.eval()
            v = validation_metrics(trainee, examples, heldout_indices, store, top, k)
            head.train(training)
            curve.append({"step": step, "lambda": round(lam_of_step(step), 4), **v})
            print(f"[falcon-drafter] step {step} held-out {v}", flush=True)

    checkpoint = checkpoint_hook(lambda d, extra: save_falcon(head, d, extra), out_dir, checkpoint_every)

    t0 = time.time()
    stats = train_validated(
        trainee,
        trained,
        falcon_loss(store.select(train_indices), top, k, lam_of_step, calls),
        cfg,
        pad_id,
        "falcon-drafter",
        validate,
        val_every,
        checkpoint,
    )
    save_falcon(head, out_dir)
    stats.update(
        params=sum(p.numel() for p in head.parameters()),
        k=k,
        lambda_schedule=lambda_schedule,
        feature_layer=top,
        heldout=len(heldout_indices),
        validation_curve=curve,
        wall_s=round(time.time() - t0, 1),
    )
    return stats
