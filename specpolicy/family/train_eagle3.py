"""Training an EAGLE-3 head on stored target features, with training-time test (EAGLE-3,
arXiv 2503.01840, §3.2; SpecForge's ``OnlineEagle3Model``, re-derived here for CPU training).

Drafter position i pairs the target's fused feature ``fc(f_i)`` with the embedding of the token
x_{i+1} and predicts x_{i+2} (step 0). At inference every later draft token is predicted from the
drafter's OWN output fed back as the feature, so training unrolls T steps ("training-time
test"): step j at index i takes the step-(j-1) output at index i with the embedding of the true
token x_{i+j+1}, sits at position i + j and predicts x_{i+j+2}. Its attention sees the step-0
keys of indices <= i (the committed pairs with real features) and the keys of steps 1..j at its
own index (the chain it drafted) -- exactly what the drafter's cache holds at inference
(``specpolicy.drafters.eagle3``). Given tokens are the true (target-greedy) tokens: a draft token
only matters when every token before it was accepted. Losses are taken where the predicted token
is a response token and the committed sequence covers the prompt, weighted ``0.8 ** j``.

The draft vocabulary is the ``draft_vocab_size`` most frequent target tokens of the training
responses (``d2t``: draft id -> target id offset); labels outside it carry no loss.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specpolicy.family.data import Example, draft_vocabulary, vocabulary_coverage
from specpolicy.family.feature_store import FeatureStore
from specpolicy.family.trainer import (
    TrainConfig,
    checkpoint_hook,
    init_linear,
    split_examples,
    target_fields,
    train_validated,
)
from specpolicy.models.eagle3 import (
    Eagle3DraftModel,
    Eagle3Spec,
    llama_config,
    load_eagle3,
    save_eagle3,
)

#: The bundled EAGLE-3 head's architecture (the target's width: it embeds with the target's embeddings).
EAGLE3_SIZE = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=768)


class Eagle3Trainee(nn.Module):
    """The trained head with the target's frozen embedding table."""

    def __init__(self, head: Eagle3DraftModel, embed: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        self.embed = nn.Parameter(embed.detach().clone(), requires_grad=False)  # (V, H)


def new_eagle3(
    target_config, draft_ids: torch.Tensor, seed: int, layer_ids: list[int] | None = None, size: dict | None = None
) -> Eagle3DraftModel:
    """A freshly initialised EAGLE-3 head for a target, over the draft vocabulary ``draft_ids``
    (target ids, sorted)."""
    raw = dict(
        **target_fields(target_config),
        draft_vocab_size=int(draft_ids.numel()),
        target_hidden_size=target_config.hidden_size,
        num_hidden_layers=1,
        **(size or EAGLE3_SIZE),
    )
    if layer_ids is not None:
        raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    torch.manual_seed(seed)
    model = Eagle3DraftModel(llama_config(raw), Eagle3Spec.from_config(raw))
    init_linear(model)
    set_draft_vocabulary(model, draft_ids)
    return model


def ttt_forward(
    head: Eagle3DraftModel, embed: torch.Tensor, ids: torch.Tensor, features: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Unroll the head ``steps`` times over whole sequences (training-time test).

    Args:
        embed: ``(V, H)`` the target's embedding table.
        ids: ``(R, L)`` int64 token ids. features: ``(R, L, 3 H_t)`` the target's features.
    Returns:
        per step j, the outputs ``(R, L - 1, H)``; index i of step j predicts x_{i+j+2}.
    """
    R, L = ids.shape
    n = L - 1
    attn = head.midlayer.self_attn
    scale = attn.head_dim**-0.5
    groups = attn.num_heads // attn.num_kv_heads
    idx = torch.arange(n, device=ids.device)
    causal = idx[None, :] <= idx[:, None]  # (n, n) key index <= query index
    hidden = head.fc(features[:, :n])  # (R, n, H)
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    k0 = v0 = None
    outs = []
    for j in range(steps):
        tok = F.pad(ids[:, j + 1 :], (0, j))[:, :n]  # index i: x_{i+j+1} (zeros past the end)
        embeds = F.embedding(tok, embed)
        positions = (idx + j)[None].expand(R, n)
        cos, sin = head.rotary_emb(embeds, positions)
        q, k, v = attn.qkv(head.midlayer.attention_input(embeds, hidden), cos, sin)
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        if j == 0:
            k0, v0 = k, v
        else:
            diag_k.append(k)
            diag_v.append(v)
        s0 = (q @ k0.transpose(-1, -2)) * scale  # (R, h, n, n)
        s0 = s0.masked_fill(~causal, float("-inf"))
        sd = [(q * dk).sum(-1, keepdim=True) * scale for dk in diag_k]  # each (R, h, n, 1)
        p = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)
        attended = p[..., :n] @ v0
        for s, dv in enumerate(diag_v):
            attended = attended + p[..., n + s : n + s + 1] * dv
        out = head.midlayer.finish(hidden, attended)
        outs.append(out)
        hidden = out
    return outs


def eagle3_loss(store: FeatureStore, feature_layers: list[int], steps: int, decay: float, vocab_size: int):
    """The loss function for ``trainer.train``: ``(model, batch, gen) -> (loss, n_label_tokens)``."""

    def loss_fn(model: Eagle3Trainee, batch: dict, gen: torch.Generator):
        ids, valid, plen = batch["input_ids"], batch["valid"], batch["prompt_len"]
        R, L = ids.shape
        feats = store.batch(batch["index"].tolist(), feature_layers, L).to(ids.device)
        outs = ttt_forward(model.head, model.embed, ids, feats, steps)
        t2d = torch.cumsum(model.head.t2d.long(), 0) - 1  # target id -> draft id (where t2d)
        n = L - 1
        i = torch.arange(n, device=ids.device)[None]
        total, weight_sum, count = 0.0, 0.0, 0
        for j, out in enumerate(outs):
            pos = i + j + 2  # (1, n) position each index predicts
            inside = pos < L
            tgt = ids.gather(1, pos.clamp(max=L - 1).expand(R, n))
            ok = (
                inside
                & valid.gather(1, pos.clamp(max=L - 1).expand(R, n))
                & (i >= plen[:, None] - 2)
                & model.head.t2d[tgt]
            )
            if not bool(ok.any()):
                continue
            logits = model.head.logits(out[ok]).float()
            ce = F.cross_entropy(logits, t2d[tgt[ok]])
            w = decay**j
            total = total + w * ce
            weight_sum += w
            count += int(ok.sum())
        return total / max(weight_sum, 1e-9), count

    return loss_fn


def validation_metrics(
    head: Eagle3DraftModel,
    embed: torch.Tensor,
    examples: list[Example],
    indices: list[int],
    store: FeatureStore,
    layers: list[int],
    steps: int,
) -> dict:
    """Top-1 accuracy of each unrolled step j (the (j+1)-th draft token given the earlier ones
    right) and the step-0 cross-entropy on held-out ``indices``; eval mode, no grad."""
    from specpolicy.family.data import collate

    hits, counts, ce, n0 = torch.zeros(steps), torch.zeros(steps), 0.0, 0
    t2d = torch.cumsum(head.t2d.long(), 0) - 1
    with torch.no_grad():
        for s in range(0, len(indices), 16):
            idx = indices[s : s + 16]
            batch = {k: v.to(embed.device) for k, v in collate([examples[i] for i in idx], 0).items()}
            ids, valid, plen = batch["input_ids"], batch["valid"], batch["prompt_len"]
            R, L = ids.shape
            outs = ttt_forward(head, embed, ids, store.batch(idx, layers, L).to(embed.device), steps)
            i = torch.arange(L - 1, device=embed.device)[None]
            for j, out in enumerate(outs):
                pos = (i + j + 2).clamp(max=L - 1).expand(R, L - 1)
                tgt = ids.gather(1, pos)
                ok = (i + j + 2 < L) & valid.gather(1, pos) & (i >= plen[:, None] - 2)
                logits = head.logits(out[ok]).float()
                pred = head.to_target_ids(logits.argmax(-1))
                hits[j] += float((pred == tgt[ok]).sum())
                counts[j] += int(ok.sum())
                if j == 0:
                    known = head.t2d[tgt[ok]]
                    ce += float(F.cross_entropy(logits[known], t2d[tgt[ok][known]], reduction="sum"))
                    n0 += int(known.sum())
    return {
        "ce_step0": round(ce / max(n0, 1), 4),
        "accuracy_by_step": [round(float(h / max(c, 1)), 4) for h, c in zip(hits, counts)],
    }


def set_draft_vocabulary(head: torch.nn.Module, draft_ids: torch.Tensor) -> None:
    """Make ``draft_ids`` (``(Vd,) int64`` target ids, sorted) the draft vocabulary of a fresh
    EAGLE-3-style head: ``d2t[d] = draft_ids[d] - d``, ``t2d`` true on them."""
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        head.t2d.zero_()
        head.t2d[draft_ids] = True


def adopt_draft_vocabulary(head: torch.nn.Module) -> torch.Tensor:
    """The draft vocabulary of a loaded EAGLE-3-style head (``--init``), ``(Vd,) int64`` target ids;
    its ``t2d`` is rebuilt from ``d2t`` (the loss reads t2d; some exports leave it out and the
    loaders then zero it)."""
    draft_ids = head.to_target_ids(torch.arange(head.spec.draft_vocab_size))
    with torch.no_grad():
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    return draft_ids


def train_eagle3(
    target_dir: str | Path,
    examples: list[Example],
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    pad_id: int,
    draft_vocab_size: int = 2048,
    steps: int = 7,
    decay: float = 0.8,
    layer_ids: list[int] | None = None,
    size: dict | None = None,
    train_indices: list[int] | None = None,
    heldout_indices: list[int] | None = None,
    val_every: int = 200,
    init: str | Path | None = None,
    checkpoint_every: int = 0,
) -> dict:
    """Train the EAGLE-3 head of ``target_dir`` and save it in the EAGLE-3 layout.

    Args:
        examples: the target's greedy continuations (their indices are the store's).
        store: their target features (must hold the feature layers: default ``[2, L//2, L-3]``).
        train_indices / heldout_indices: the examples trained on (default all) and held out for the
            validation curve (default none), measured every ``val_every`` steps and at the end.
        cfg: optimisation settings (budgets in epochs/steps).
        draft_vocab_size: rows of the head's LM head (the most frequent response tokens).
        steps: training-time-test unroll length T. decay: loss weight ``decay ** j`` of step j.
        layer_ids: the feature layers (INPUT of layer i); None = the default, not written out.
        init: an EAGLE-3 checkpoint to continue from (its shape, feature layers and draft
            vocabulary; ``draft_vocab_size``, ``layer_ids`` and ``size`` are then unused). Default:
            fresh weights.
        checkpoint_every: when > 0, every this many steps (rounded up to a progress line) the head
            is saved to ``<out_dir>.checkpoint`` (overwritten; its config gets ``train_step``).
    Returns:
        the ``trainer.train`` stats plus ``params``, ``draft_vocab_size``, ``draft_vocab_coverage``
        (share of response tokens in the draft vocabulary), ``steps``, ``decay``, ``feature_layers``.
    """
    from specpolicy.family.models import load_model

    target = load_model(target_dir)
    vocab = int(target.config.vocab_size)
    train_indices, heldout_indices, trained = split_examples(examples, train_indices, heldout_indices)
    if init:
        head = load_eagle3(init, f"init={str(init)!r}")
        draft_ids = adopt_draft_vocabulary(head)
    else:
        draft_ids = draft_vocabulary(trained, min(draft_vocab_size, vocab), vocab)
        head = new_eagle3(target.config, draft_ids, cfg.seed, layer_ids, size)
    num_layers = int(target.config.num_hidden_layers)
    layers = list(head.spec.feature_layers(num_layers))
    trainee = Eagle3Trainee(head, target.get_input_embeddings().weight)
    del target
    coverage = vocabulary_coverage(trained, draft_ids)
    curve = []

    def validate(step: int, training: bool) -> None:
        if heldout_indices:
            head.eval()
            v = validation_metrics(head, trainee.embed, examples, heldout_indices, store, layers, steps)
            head.train(training)
            curve.append({"step": step, **v})
            print(
                f"[eagle3-drafter] step {step} held-out ce {v['ce_step0']:.4f} accuracy by step "
                f"{' '.join(str(x) for x in v['accuracy_by_step'])}",
                flush=True,
            )

    checkpoint = checkpoint_hook(lambda d, extra: save_eagle3(head, d, num_layers, extra), out_dir, checkpoint_every)

    t0 = time.time()
    stats = train_validated(
        trainee,
        trained,
        eagle3_loss(store.select(train_indices), layers, steps, decay, vocab),
        cfg,
        pad_id,
        "eagle3-drafter",
        validate,
        val_every,
        checkpoint,
    )
    save_eagle3(head, out_dir, num_layers)
    stats.update(
        params=sum(p.numel() for p in head.parameters()),
        draft_vocab_size=int(draft_ids.numel()),
        draft_vocab_coverage=round(coverage, 5),
        ttt_steps=steps,
        decay=decay,
        feature_layers=layers,
        heldout=len(heldout_indices),
        validation_curve=curve,
        wall_s=round(time.time() - t0, 1),
    )
    return stats
