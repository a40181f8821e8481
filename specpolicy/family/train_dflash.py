"""Training a DFlash drafter on stored target features (DFlash, arXiv 2602.06036, §3.2; SpecForge's
``OnlineDFlashModel`` objective, re-derived here for CPU training).

Each training sequence is the target's greedy continuation of a prompt, with the target's hidden
states at every position (``feature_store``). A training *block* starts at an anchor position a
in ``[prompt_len - 1, n - 2]`` (the token the next round's draft continues: the last prompt token
in a generation's first round) and holds

    [x_a, ..., x_{a+j-1} (given), MASK x (B - 1)]       at positions a .. a+j+B-2

with ``j = 1`` for DFlash's one-pass block and ``j = 1 + m(B - 1)`` for the m-th *extension*
pass (``specpolicy.drafters.dflash``: a draft that goes past B - 1 tokens re-runs the block
with the tokens drafted so far given). The block sees the context features of positions < a
(strictly: the anchor's own features come from the verification that has not happened yet), and
itself bidirectionally; blocks of one sequence do not see each other. The loss is the
cross-entropy of each mask position against the token at that position, weighted by
``exp(-(k - 1) / gamma)`` for the k-th mask (DFlash's decay: early tokens decide acceptance).
Given tokens are the true tokens: a drafted token only matters when every token before it was
accepted, i.e. equal to them, so this is the distribution that inference conditions on.

The draft model's embeddings and LM head are the target's, frozen (not stored with the drafter).
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
from specpolicy.models.checkpoint import stored_int8
from specpolicy.models.dflash import DFlashDraftModel, DFlashSpec, qwen3_config, save_dflash, with_draft_vocabulary

#: The bundled DFlash drafter's architecture (the target's width: it uses the target's embeddings).
DFLASH_SIZE = dict(
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=768
)


class DFlashTrainee(nn.Module):
    """The trained draft model with the target's frozen embedding table (also its LM head: the
    family ties them)."""

    def __init__(self, draft: DFlashDraftModel, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.draft = draft
        self.embed = nn.Parameter(embed.detach().clone(), requires_grad=False)  # (V, H)
        self.lm_head = nn.Parameter(lm_head.detach().clone(), requires_grad=False)  # (V, H)


def new_dflash(
    target_config, mask_token_id: int, block_size: int, target_layer_ids: list[int], seed: int, size: dict | None = None
) -> DFlashDraftModel:
    """A freshly initialised DFlash draft model for a target (its width, vocabulary, RoPE)."""
    raw = dict(
        **target_fields(target_config),
        block_size=block_size,
        num_target_layers=target_config.num_hidden_layers,
        dflash_config=dict(target_layer_ids=list(target_layer_ids), mask_token_id=mask_token_id, block_size=block_size),
        **(size or DFLASH_SIZE),
    )
    torch.manual_seed(seed)
    # Qwen3's initialisation: N(0, 0.02) weights, zero biases, unit norms
    return init_linear(DFlashDraftModel(qwen3_config(raw), DFlashSpec.from_config(raw)), zero_bias=True)


def init_final_norm(draft: DFlashDraftModel, target) -> None:
    """Start the drafter's final norm at the target's (its outputs meet the target's LM head at
    the scale the target's own last hidden states do; a unit norm starts at a loss near 40)."""
    with torch.no_grad():
        draft.norm.weight.copy_(target.model.norm.weight.to(draft.norm.weight.dtype))


def block_layout(
    ids: torch.Tensor,
    valid: torch.Tensor,
    prompt_len: torch.Tensor,
    block_size: int,
    blocks: int,
    given: int,
    mask_token_id: int,
    gamma: float,
    gen: torch.Generator,
) -> dict[str, torch.Tensor]:
    """The training blocks of a batch: ``blocks`` per sequence, each ``[x_a .. x_{a+j-1} (given),
    MASK x (B - 1)]`` at positions ``a .. a + j + B - 2`` with ``j = given`` for every block of the
    batch, anchors ``a`` drawn without replacement from ``[prompt_len - 1, n - 1 - j]`` (n = the
    sequence's length). A row with fewer anchors than ``blocks`` fills the rest with empty blocks
    (no context, no loss).

    Args:
        ids: ``(R, L)`` int64 sequences. valid: ``(R, L)`` bool. prompt_len: ``(R,)`` int64.
    Returns:
        ``tokens``, ``positions``, ``labels`` (-100 = no loss) ``(R, nb, span)`` int64, ``weights``
        ``(R, nb, span)`` float32 (``exp(-(k - 1) / gamma)`` on the k-th mask), ``context_mask``
        ``(R, nb, L)`` bool (the positions before the block's anchor).
    """
    R, L = ids.shape
    span = given + block_size - 1
    n = valid.sum(1)
    where = torch.arange(L)[None]
    ok = (where >= (prompt_len - 1)[:, None]) & (where <= (n - 1 - given)[:, None])  # (R, L) possible anchors
    score = torch.rand(R, L, generator=gen).masked_fill(~ok, 2.0)
    picked = score.argsort(dim=1)[:, : min(blocks, L)]  # (R, nb): random possible anchors first
    real = ok.gather(1, picked)
    anchors = torch.where(real, picked, 0)
    offsets = torch.arange(span)
    positions = anchors[:, :, None] + offsets  # (R, nb, span)
    flat = positions.clamp(max=L - 1).reshape(R, -1)
    seq = ids.gather(1, flat).view_as(positions)
    is_mask = offsets >= given
    labelled = is_mask & (positions < L) & valid.gather(1, flat).view_as(positions) & real[:, :, None]
    decay = torch.exp(-(offsets - given).clamp(min=0).float() / gamma) if gamma > 0 else torch.ones(span)
    return {
        "tokens": torch.where(is_mask, mask_token_id, seq),
        "positions": positions,
        "labels": torch.where(labelled, seq, -100),
        "weights": decay * labelled,
        "context_mask": (where[:, None, :] < anchors[:, :, None]) & valid[:, None, :] & real[:, :, None],
    }


def blocks_output(
    model: DFlashDraftModel, embed: torch.Tensor, layout: dict[str, torch.Tensor], features: torch.Tensor
) -> torch.Tensor:
    """The drafter's outputs ``(R, nb, span, H)`` on a ``block_layout`` given the sequences' features
    ``(R, L, F)``."""
    R, L, _ = features.shape
    ctx = model.context_keys_values(features, torch.arange(L, device=features.device).repeat(R, 1))
    return model.forward_blocks(F.embedding(layout["tokens"], embed), layout["positions"], ctx, layout["context_mask"])


def dflash_loss(
    store: FeatureStore,
    feature_layers: list[int],
    block_size: int,
    mask_token_id: int,
    anchors: int,
    extension_probs: tuple[float, ...],
    gamma: float,
):
    """The loss function for ``trainer.train``: ``(model, batch, gen) -> (loss, n_label_tokens)``.
    Each step draws its number of extension passes m from ``extension_probs`` (its blocks give
    ``j = 1 + m (B - 1)`` tokens) and lays ``anchors * B / span`` blocks per sequence (about the same
    tokens whatever m)."""
    probs = torch.tensor(extension_probs, dtype=torch.float64)

    def loss_fn(model: DFlashTrainee, batch: dict, gen: torch.Generator):
        dev = model.embed.device
        m = int(torch.multinomial(probs, 1, generator=gen))
        given = 1 + m * (block_size - 1)
        span = given + block_size - 1
        ids, valid = batch["input_ids"].cpu(), batch["valid"].cpu()  # the layout is built on the CPU
        layout = {
            k: v.to(dev)
            for k, v in block_layout(
                ids,
                valid,
                batch["prompt_len"].cpu(),
                block_size,
                max(1, anchors * block_size // span),
                given,
                mask_token_id,
                gamma,
                gen,
            ).items()
        }
        feats = store.batch(batch["index"].tolist(), feature_layers, ids.shape[1], torch.bfloat16).to(dev).float()
        out = blocks_output(model.draft, model.embed, layout, feats)
        keep = layout["labels"] != -100
        if not bool(keep.any()):
            return out.sum() * 0.0, 0
        logits = out[keep] @ model.lm_head.T  # (n, V)
        ce = F.cross_entropy(logits.float(), layout["labels"][keep], reduction="none")
        w = layout["weights"][keep]
        return (ce * w).sum() / w.sum().clamp(min=1e-6), int(keep.sum())

    return loss_fn


def feature_layers_for(args, target_dir: str | Path) -> list[int]:
    """The ``hidden_states`` indices the pipeline stores: the DFlash drafter's (ids + 1) and the
    EAGLE-3 head's default (``[2, L // 2, L - 3]``) for the target at ``target_dir``."""
    import json

    from specpolicy.models.eagle3 import default_layer_ids

    layers = json.loads((Path(target_dir) / "config.json").read_text())["num_hidden_layers"]
    return sorted({i + 1 for i in args.dflash_layer_ids} | set(default_layer_ids(layers)))


def train_dflash(
    target_dir: str | Path,
    examples: list[Example],
    store: FeatureStore,
    cfg: TrainConfig,
    out_dir: str | Path,
    pad_id: int,
    mask_token_id: int | None,
    block_size: int = 16,
    target_layer_ids: tuple[int, ...] = (2, 6, 11),
    anchors: int = 16,
    extension_probs: tuple[float, ...] = (0.6, 0.25, 0.1, 0.05),
    gamma: float = 7.0,
    size: dict | None = None,
    init: str | Path | None = None,
    train_indices: list[int] | None = None,
    heldout_indices: list[int] | None = None,
    val_every: int = 200,
    checkpoint_every: int = 0,
    int8: bool = False,
) -> dict:
    """Train the DFlash drafter of ``target_dir`` and save it in the official layout.

    Args:
        examples: the target's greedy continuations (their indices are the store's).
        store: their target features (must hold ``i + 1`` for every id of ``target_layer_ids``).
        train_indices / heldout_indices: the examples trained on (default all) and held out for the
            validation curve (default none), measured every ``val_every`` steps and at the end.
        cfg: optimisation settings (``trainer.TrainConfig``; budgets in epochs/steps).
        block_size: B (one pass drafts B - 1 tokens).
        target_layer_ids: DFlash layer ids of the context (id i = output of layer i).
        anchors: training blocks per sequence and step.
        extension_probs: share of blocks with 0, 1, 2, ... extension passes' given tokens.
        gamma: loss decay over mask positions (0 = none).
        init: a DFlash checkpoint to continue from (its shape, mask token, block size, layer ids and
            draft vocabulary; ``mask_token_id``, ``block_size``, ``target_layer_ids`` and ``size`` are
            then unused). Default: fresh weights.
        checkpoint_every: when > 0, every this many steps (rounded up to a progress line) the
            drafter is saved to ``<out_dir>.checkpoint`` (overwritten; its config gets
            ``train_step``), so a long run leaves a usable drafter at any time.
        int8: store the final drafter's large 2-D weights row-wise as int8 (``save_dflash``).
    Returns:
        the ``trainer.train`` stats plus ``params``, ``block_size``, ``target_layer_ids``, ``anchors``,
        ``extension_probs``, ``gamma``.
    """
    from specpolicy.family.models import load_model
    from specpolicy.models.dflash import load_dflash

    target = load_model(target_dir)
    if init:
        draft = load_dflash(init, f"init={str(init)!r}")
    else:
        draft = new_dflash(target.config, mask_token_id, block_size, list(target_layer_ids), cfg.seed, size)
        init_final_norm(draft, target)
    trainee = DFlashTrainee(draft, target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    del target
    layers = list(draft.spec.feature_layers)
    train_indices, heldout_indices, trained = split_examples(examples, train_indices, heldout_indices)
    loss_fn = dflash_loss(
        store.select(train_indices),
        layers,
        draft.spec.block_size,
        draft.spec.mask_token_id,
        anchors,
        extension_probs,
        gamma,
    )
    curve = []

    def validate(step: int, training: bool) -> None:
        if heldout_indices:
            draft.eval()
            v = validation_loss(draft, trainee.embed, trainee.lm_head, examples, heldout_indices, store, cfg.seed)
            draft.train(training)
            curve.append({"step": step, **v})
            shown = [d for d in (1, 5, 10, 15) if d < draft.spec.block_size]
            shares = v["prefix_share_ge"]
            print(
                f"[dflash-drafter] step {step} held-out ce {v['ce']:.4f} accuracy at d="
                f"{'/'.join(map(str, shown))} {'/'.join(str(v['accuracy_by_distance'][d - 1]) for d in shown)}; "
                f"of {v['n_blocks']} whole blocks, a correct prefix >= {'/'.join(shares)}: "
                f"{'/'.join(str(x) for x in shares.values())}",
                flush=True,
            )

    checkpoint = checkpoint_hook(lambda d, extra: save_dflash(draft, d, extra), out_dir, checkpoint_every)

    t0 = time.time()
    stats = train_validated(trainee, trained, loss_fn, cfg, pad_id, "dflash-drafter", validate, val_every, checkpoint)
    save_dflash(draft, out_dir, int8=int8)
    stats.update(
        params=sum(p.numel() for p in draft.parameters()),
        block_size=draft.spec.block_size,
        target_layer_ids=list(draft.spec.target_layer_ids),
        anchors=anchors,
        extension_probs=list(extension_probs),
        gamma=gamma,
        num_hidden_layers=int(draft.config.num_hidden_layers),
        **({"stored": "int8 row-wise"} if int8 else {}),
        heldout=len(heldout_indices),
        validation_curve=curve,
        wall_s=round(time.time() - t0, 1),
    )
    return stats


def add_draft_vocabulary(
    directory: str | Path, examples: list[Example], size: int, always: tuple[int, ...] = ()
) -> dict:
    """Give the DFlash checkpoint in ``directory`` a draft vocabulary (rewritten in place): the
    ``size`` most frequent response tokens of ``examples``, the ids in ``always`` (stop tokens)
    included (``family.data.draft_vocabulary``), so a pass runs those rows of the target's LM head
    only (the drafter's pass cost; drafts whose tokens lie outside it are lost, hence the coverage
    reported). Training is unchanged: the loss stays over the whole vocabulary. A checkpoint stored
    as int8 stays int8.

    Returns:
        ``{"draft_vocab_size", "draft_vocab_coverage"}`` (share of the examples' response tokens).
    Raises:
        ConfigError: the directory holds no DFlash checkpoint.
        ValueError: ``size`` < 1.
    """
    from specpolicy.models.dflash import load_dflash

    if size < 1:
        raise ValueError(f"size must be >= 1 (draft vocabulary tokens), got {size}")
    model = load_dflash(directory)
    vocab = int(model.config.vocab_size)
    ids = draft_vocabulary(examples, min(size, vocab), vocab, always)
    save_dflash(with_draft_vocabulary(model, ids), directory, int8=stored_int8(directory))
    return {"draft_vocab_size": int(ids.numel()), "draft_vocab_coverage": round(vocabulary_coverage(examples, ids), 5)}


def validation_loss(
    draft: DFlashDraftModel,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    examples: list[Example],
    indices: list[int],
    store: FeatureStore,
    seed: int = 0,
    prefix_thresholds: tuple[int, ...] = (5, 10),
) -> dict:
    """Mean undecayed cross-entropy and top-1 accuracy per mask index k = 1..B-1 on one-pass blocks
    (j = 1), 16 anchors per sequence, on ``indices`` (a held-out slice); eval mode, no grad.

    Also the share of blocks whose longest correct prefix (the accepted length of a greedy
    verification of the whole block, bonus token excluded) reaches each of ``prefix_thresholds``
    tokens (those up to B - 1), over the blocks with all B - 1 positions inside their sequence:
    the share of static k = B - 1 rounds accepting >= 5 / >= 10 tokens (issue 19's in-loop bar),
    teacher-forced at random anchors. The loop's rounds start after a rejection, where drafting is
    harder, so it measures lower there. Every argmax here is over the target's whole vocabulary
    (a checkpoint's draft vocabulary is not applied).

    Returns:
        ``{"ce", "accuracy_by_distance" (B - 1 floats), "prefix_share_ge" ({str(t): share, or None
        without a whole block}), "n_tokens", "n_blocks"}``.
    """
    from specpolicy.family.data import collate

    B = draft.spec.block_size
    gen = torch.Generator().manual_seed(seed)
    dev = embed.device
    hits = torch.zeros(B - 1)
    count = torch.zeros(B - 1)
    ce_sum = 0.0
    prefix_lengths = []
    with torch.no_grad():
        for s in range(0, len(indices), 16):
            idx = indices[s : s + 16]
            batch = collate([examples[i] for i in idx], 0)
            layout = block_layout(
                batch["input_ids"], batch["valid"], batch["prompt_len"], B, 16, 1, draft.spec.mask_token_id, 0.0, gen
            )
            layout = {k: v.to(dev) for k, v in layout.items()}
            length = batch["input_ids"].shape[1]
            feats = store.batch(idx, list(draft.spec.feature_layers), length, torch.bfloat16).to(dev).float()
            out = blocks_output(draft, embed, layout, feats)
            keep = layout["labels"] != -100
            logits = (out[keep] @ lm_head.T).float()
            ce_sum += float(F.cross_entropy(logits, layout["labels"][keep], reduction="sum"))
            k = (torch.arange(B, device=dev) - 1).expand_as(keep)[keep].cpu()  # mask index k - 1 of each label
            hit = (logits.argmax(-1) == layout["labels"][keep]).float().cpu()
            hits.index_add_(0, k, hit)
            count.index_add_(0, k, torch.ones_like(hit))
            right = torch.zeros(keep.shape, dtype=torch.bool, device=dev)
            right[keep] = hit.bool().to(dev)  # (R, nb, B): label position drafted right
            whole = keep[..., 1:].all(-1)  # blocks with all B - 1 positions in their sequence
            prefix_lengths.append(right[..., 1:].int().cumprod(-1).sum(-1)[whole].cpu())
    prefix = torch.cat(prefix_lengths) if prefix_lengths else torch.zeros(0, dtype=torch.long)
    return {
        "ce": round(ce_sum / max(1.0, float(count.sum())), 4),
        "accuracy_by_distance": [round(float(h / max(c, 1)), 4) for h, c in zip(hits, count)],
        "prefix_share_ge": {
            str(t): round(float((prefix >= t).float().mean()), 4) if prefix.numel() else None
            for t in prefix_thresholds
            if t <= B - 1
        },
        "n_tokens": int(count.sum()),
        "n_blocks": int(prefix.numel()),
    }
