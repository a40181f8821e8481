"""Training a DART head on stored target features: prefix-shared masked training (Liang et al.,
arXiv 2601.19278, §3.3 and App. B; the released code is inference only, so this is the paper's
recipe re-derived for CPU training).

Pair i of a sequence (``fc`` of the target's features at position i, the embedding of token
x_{i+1}; ``specpolicy.models.dart``) predicts x_{i+2}. At inference the last committed pair is
followed by ``D = draft_length`` (7) mask positions that predict x_{i+3} .. x_{i+2+D}. Training
gives EVERY prefix its own mask block in one pass: mask j of prefix i sits at position i + j,
attends to the pairs 0..i and to masks 1..j of its own block (a block-sparse mask; no block sees
another's masks), exactly what the drafter's pass over a cache of i + 1 pairs sees. Since every
mask position carries the same vector ``mask_rep``, its q/k/v are computed once and rotated to
each position.

Loss (the paper's): ``sum_t gamma^(t - 1) KL(q_target,t || p_draft,t)`` over the d = D + 1 steps,
gamma 0.6, each step's KL the mean over the positions whose predicted token is a response token
and whose prefix covers the prompt. ``q_target`` is the target's next-token distribution at the
predicted position, from its last hidden state (``hidden_states[L]``, after the final norm) and
its LM head, restricted to the draft vocabulary and renormalised (the draft head cannot put mass
elsewhere). The draft vocabulary is the ``draft_vocab_size`` most frequent response tokens
(``d2t``), the stop token always among them.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from specpolicy.family.data import Example, collate, draft_vocabulary, vocabulary_coverage
from specpolicy.family.feature_store import FeatureStore
from specpolicy.family.train_eagle3 import adopt_draft_vocabulary, set_draft_vocabulary
from specpolicy.family.trainer import (
    TrainConfig,
    checkpoint_hook,
    init_linear,
    split_examples,
    target_fields,
    train_validated,
)
from specpolicy.models.dart import DRAFT_LENGTH, DartDraftModel, DartSpec, load_dart, save_dart
from specpolicy.models.eagle3 import llama_config

#: The bundled DART head (the target's width: it embeds with the target's embeddings): ~1.18M
#: parameters with a 1024-token draft vocabulary (fc 196k, attention 328k, MLP 393k, LM head 262k).
DART_SIZE = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512)
#: The paper's step decay gamma.
GAMMA = 0.6


class DartTrainee(nn.Module):
    """The trained head with the target's frozen embedding table and LM-head rows of the draft vocabulary."""

    def __init__(self, head: DartDraftModel, embed: torch.Tensor, target_head: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        self.embed = nn.Parameter(embed.detach().clone(), requires_grad=False)  # (V, H)
        self.target_head = nn.Parameter(target_head.detach().clone(), requires_grad=False)  # (Vd, H)


def new_dart(target_config, draft_ids: torch.Tensor, seed: int, size: dict | None = None) -> DartDraftModel:
    """A freshly initialised DART head for a target over the draft vocabulary ``draft_ids`` (target ids, sorted)."""
    raw = dict(
        **target_fields(target_config),
        draft_vocab_size=int(draft_ids.numel()),
        target_hidden_size=target_config.hidden_size,
        num_hidden_layers=1,
        draft_length=DRAFT_LENGTH,
        **(size or DART_SIZE),
    )
    torch.manual_seed(seed)
    model = DartDraftModel(llama_config(raw), DartSpec.from_config(raw))
    init_linear(model)
    with torch.no_grad():
        model.midlayer.mask_rep.normal_(std=1.0)
    set_draft_vocabulary(model, draft_ids)
    return model


def prefix_shared_forward(head: DartDraftModel, embed: torch.Tensor, ids: torch.Tensor, features: torch.Tensor):
    """Every prefix with its own mask block, in one pass.

    Args:
        embed: ``(V, H)`` the target's embedding table. ids: ``(R, L)`` int64 tokens.
        features: ``(R, L, 3 H_t)`` the target's features.
    Returns:
        ``(R, n, D + 1, H)`` outputs (n = L - 1): ``[:, i, 0]`` is pair i's (predicts x_{i+2}),
        ``[:, i, j]`` mask j of prefix i's block (predicts x_{i+2+j}).
    """
    R, L = ids.shape
    n, D = L - 1, head.spec.draft_length
    layer = head.midlayer
    attn = layer.self_attn
    h, kvh, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
    groups = h // kvh
    hidden = head.fc(features[:, :n])  # (R, n, H)
    x = layer.attention_input(F.embedding(ids[:, 1:], embed), hidden)
    idx = torch.arange(n, device=ids.device)
    cos, sin = head.rotary_emb(x, idx[None].expand(R, n))
    q, k, v = attn.qkv(x, cos, sin)
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # (R, h, n, hd)
    causal = idx[None, :] <= idx[:, None]
    pair_att = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)  # (R, h, n, hd)
    # the masks: one vector, so one projection, rotated to positions i + j
    mpos = (idx[:, None] + torch.arange(1, D + 1, device=ids.device)[None]).reshape(1, -1)  # (1, n D)
    mcos, msin = head.rotary_emb(x, mpos)  # (1, n D, hd)
    mcos, msin = mcos.view(n, D, hd)[None], msin.view(n, D, hd)[None]
    rep = layer.mask_rep.to(x.dtype)

    def rot(t: torch.Tensor, heads: int) -> torch.Tensor:  # (heads * hd,) -> (heads, n, D, hd)
        t = t.view(heads, 1, 1, hd)
        return t * mcos + rotate_half(t.expand(heads, n, D, hd)) * msin

    qm = rot(attn.q_proj(rep), h)
    km = rot(attn.k_proj(rep), kvh).repeat_interleave(groups, 0)
    vm = attn.v_proj(rep).view(kvh, 1, hd).repeat_interleave(groups, 0)  # (h, 1, hd): no RoPE on values
    scale = hd**-0.5
    s_pair = torch.einsum("hijd,rhkd->rhijk", qm, k) * scale  # (R, h, n, D, n)
    s_pair = s_pair.masked_fill(~causal[:, None, :], float("-inf"))
    s_mask = torch.einsum("hijd,hild->hijl", qm, km) * scale  # (h, n, D, D)
    block = torch.ones(D, D, dtype=torch.bool, device=ids.device).tril()
    s_mask = s_mask.masked_fill(~block, float("-inf"))
    p = torch.softmax(torch.cat([s_pair, s_mask[None].expand(R, -1, -1, -1, -1)], dim=-1), dim=-1)
    mask_att = torch.einsum("rhijk,rhkd->rhijd", p[..., :n], v) + p[..., n:].sum(-1, keepdim=True) * vm[None, :, None]
    pair_out = layer.finish(hidden, pair_att)  # (R, n, H)
    residual = rep[: hidden.shape[-1]].expand(R, n * D, -1)
    mask_out = layer.finish(residual, mask_att.reshape(R, h, n * D, hd))  # (R, n D, H)
    return torch.cat([pair_out[:, :, None], mask_out.reshape(R, n, D, -1)], dim=2)


def _targets(out: torch.Tensor, ids, valid, plen, hs_last, target_head):
    """The rows scored at each step: ``(rows (N, H), target log-probs (N, Vd), step (N,), target ids (N,))``."""
    R, n, d, _ = out.shape
    L = ids.shape[1]
    i = torch.arange(n, device=ids.device)[:, None]
    t = torch.arange(d, device=ids.device)[None]
    pos = i + t + 2  # (n, d) the position each output predicts
    inside = pos < L
    pos = pos.clamp(max=L - 1)
    ok = inside[None] & valid[:, pos] & (i[None] >= plen[:, None, None] - 2)  # (R, n, d)
    r, ii, tt = ok.nonzero(as_tuple=True)
    src = ii + tt + 1  # the target's state that predicts position ii + tt + 2
    q = torch.log_softmax((hs_last[r, src].float() @ target_head.float().T), dim=-1)
    return out[r, ii, tt], q, tt, ids[r, ii + tt + 2]


def dart_loss(store: FeatureStore, feature_layers: list[int], last_layer: int, gamma: float):
    """The loss for ``trainer.train``: ``(model, batch, gen) -> (loss, n_scored)``."""

    def loss_fn(model: DartTrainee, batch: dict, gen: torch.Generator):
        ids, valid, plen = batch["input_ids"], batch["valid"], batch["prompt_len"]
        L = ids.shape[1]
        idx = batch["index"].tolist()
        # bf16 as stored, moved, then widened on the device (half the copy, no CPU float pass)
        feats = store.batch(idx, feature_layers, L, torch.bfloat16).to(ids.device).float()
        hs_last = store.batch(idx, [last_layer], L, torch.bfloat16).to(ids.device).float()
        out = prefix_shared_forward(model.head, model.embed, ids, feats)
        rows, q, step, _ = _targets(out, ids, valid, plen, hs_last, model.target_head)
        if rows.shape[0] == 0:
            return out.sum() * 0.0, 0
        logp = torch.log_softmax(model.head.logits(rows).float(), dim=-1)
        kl = (q.exp() * (q - logp)).sum(-1)  # (N,)
        d = out.shape[2]
        counts = torch.bincount(step, minlength=d).clamp(min=1).float()
        weights = gamma ** torch.arange(d, dtype=torch.float32, device=ids.device) / counts
        return (kl * weights[step]).sum(), int(rows.shape[0])

    return loss_fn


def validation_metrics(model: DartTrainee, examples, indices, store, layers, last_layer) -> dict:
    """Per step t (1..d): top-1 agreement of the head with the target's greedy token (the response
    token) and the mean KL, on held-out ``indices``; eval mode, no grad."""
    head = model.head
    d = head.block_size
    dev = model.embed.device  # batches move to the model; the sums come back to the CPU
    hits, counts, kls = torch.zeros(d), torch.zeros(d), torch.zeros(d)
    with torch.no_grad():
        for s in range(0, len(indices), 16):
            idx = indices[s : s + 16]
            batch = collate([examples[i] for i in idx], 0)
            ids, valid, plen = (batch[k].to(dev) for k in ("input_ids", "valid", "prompt_len"))
            L = ids.shape[1]
            feats = store.batch(idx, layers, L, torch.bfloat16).to(dev).float()
            hs_last = store.batch(idx, [last_layer], L, torch.bfloat16).to(dev).float()
            out = prefix_shared_forward(head, model.embed, ids, feats)
            rows, q, step, tgt = _targets(out, ids, valid, plen, hs_last, model.target_head)
            logp = torch.log_softmax(head.logits(rows).float(), dim=-1)
            hit = head.to_target_ids(logp.argmax(-1)) == tgt
            hits += torch.bincount(step, weights=hit.float(), minlength=d).cpu()
            counts += torch.bincount(step, minlength=d).cpu()
            kls += torch.bincount(step, weights=(q.exp() * (q - logp)).sum(-1), minlength=d).cpu()
    return {
        "kl_by_step": [round(float(k / max(c, 1)), 4) for k, c in zip(kls, counts)],
        "accuracy_by_step": [round(float(h / max(c, 1)), 4) for h, c in zip(hits, counts)],
    }


def train_dart(
    target_dir: str | Path,
    examples: list[Example],
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    pad_id: int,
    draft_vocab_size: int = 1024,
    gamma: float = GAMMA,
    size: dict | None = None,
    train_indices: list[int] | None = None,
    heldout_indices: list[int] | None = None,
    val_every: int = 200,
    init: str | Path | None = None,
    checkpoint_every: int = 0,
    stop_ids: tuple[int, ...] = (),
) -> dict:
    """Train the DART head of ``target_dir`` and save it in the DART layout.

    Args:
        examples: the target's greedy continuations (their indices are the store's).
        store: their target features; it must hold the default EAGLE-3 layers ``[2, L//2, L-3]``
            and the last hidden state ``L``.
        cfg: optimisation settings. draft_vocab_size: rows of the LM head (most frequent response
            tokens, ``stop_ids`` always in). gamma: the step decay.
        init: a DART checkpoint to continue from (its shape and draft vocabulary).
        checkpoint_every: when > 0, the head is saved to ``<out_dir>.checkpoint`` every this many steps.
    Returns:
        the ``trainer.train`` stats plus ``params``, ``draft_vocab_size``, ``draft_vocab_coverage``,
        ``gamma``, ``feature_layers``, ``validation_curve``, ``wall_s``.
    Raises:
        ValueError: a store without the layers the head reads.
    """
    from specpolicy.family.models import load_model

    target = load_model(target_dir)
    vocab = int(target.config.vocab_size)
    num_layers = int(target.config.num_hidden_layers)
    train_indices, heldout_indices, trained = split_examples(examples, train_indices, heldout_indices)
    if init:
        head = load_dart(init, f"init={str(init)!r}")
        draft_ids = adopt_draft_vocabulary(head)
    else:
        draft_ids = draft_vocabulary(trained, min(draft_vocab_size, vocab), vocab, stop_ids)
        head = new_dart(target.config, draft_ids, cfg.seed, size)
    layers = list(head.spec.feature_layers(num_layers))
    missing = sorted(set(layers + [num_layers]) - set(store.layers))
    if missing:
        raise ValueError(f"the feature store {store.directory} lacks hidden_states {missing} (has {store.layers})")
    trainee = DartTrainee(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight[draft_ids])
    del target
    coverage = vocabulary_coverage(trained, draft_ids)
    curve = []

    def validate(step: int, training: bool) -> None:
        if heldout_indices and not (curve and curve[-1]["step"] == step):  # a progress line may have measured it
            head.eval()
            v = validation_metrics(trainee, examples, heldout_indices, store, layers, num_layers)
            head.train(training)
            curve.append({"step": step, **v})
            print(f"[dart-drafter] step {step} held-out accuracy by step {v['accuracy_by_step']}", flush=True)

    checkpoint = checkpoint_hook(lambda d, extra: save_dart(head, d, num_layers, extra), out_dir, checkpoint_every)

    t0 = time.time()
    stats = train_validated(
        trainee,
        trained,
        dart_loss(store.select(train_indices), layers, num_layers, gamma),
        cfg,
        pad_id,
        "dart-drafter",
        validate,
        val_every,
        checkpoint,
    )
    save_dart(head, out_dir, num_layers)
    stats.update(
        params=sum(p.numel() for p in head.parameters()),
        draft_vocab_size=int(draft_ids.numel()),
        draft_vocab_coverage=round(coverage, 5),
        gamma=gamma,
        feature_layers=layers,
        heldout=len(heldout_indices),
        validation_curve=curve,
        wall_s=round(time.time() - t0, 1),
    )
    return stats
