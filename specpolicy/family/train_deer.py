"""Train a DEER drafter (Cheng et al., arXiv 2512.15176, §3): a dLLM drafter aligned to the target
in two stages, drafting a block in ONE denoising step.

DEER's stages, on the bundled block-diffusion layout (:mod:`specpolicy.family.block_diffusion`:
blocks of 32 ABSOLUTE positions, block-causal attention, the ``[noisy ; clean]`` dual stream, the
token shift), with the target's own greedy continuations (the distilled data) as the text:

* **Stage I, AR-style distillation** (paper §3.2): the answer cut at a random point and the whole
  suffix masked; masked-diffusion cross-entropy on the masked continuation. With block-causal
  attention a block's predictions see only the clean earlier blocks, so every block of an answer
  is one such example: per (row, block) a cut ``c ~ U{0..31}`` and the response tokens at offsets
  ``>= c`` masked (:func:`specpolicy.family.block_diffusion.sample_suffix_noise` with uniform
  cuts), the loss averaged over the masked tokens (the paper's ``1/t`` weighting is this average
  when ``t`` is the masked share).
* **Stage II, "scribe" refinement** (§3.3): only the last ``R ~ U(1, R_max)`` answer tokens
  masked and token ``i`` (``i = 1`` next to the prefix) weighted ``alpha^(R - i)``, alpha 1.01:
  the heaviest weight where a one-pass draft starts. Per (row, block) the answer so far ends at the
  block's end (where a one-pass draft of this layout ends), so the masked tokens are the block's
  last ``R`` response tokens (fewer when the block holds fewer: ``R`` is then their count); the
  loss is the weighted mean ``sum_i w_i CE_i / sum_i w_i``. **Retuned:** ``R_max = 32`` (paper
  96): a draft of this layout never spans more than a block of 32, and the family's answers are
  ~100-200 tokens.

The drafter is trained as a LoRA adapter (``peft``) on the bundled dLLM drafter (its q/k/v/o and
MLP projections, rank 16: ~0.43 MB in bfloat16), or, ``--from-scratch``, as full weights of the same
architecture from a random start. Paper optimisation (0.5B drafter): lr 1e-4 (stage I), 5e-5
(stage II), 1 epoch; **retuned** here for a LoRA on a 2.4M-parameter drafter and a CPU budget:
lr 2e-3 / 1e-3, a fixed step budget (``--stage1-steps`` / ``--stage2-steps``).

Usage (one thread, seeded, checkpoints every ``--checkpoint-every`` steps)::

    OMP_NUM_THREADS=1 python -m specpolicy.family.train_deer \\
        --distill /tmp/famwork/distill/target_greedy.jsonl --out /tmp/deer/deer-drafter

Output (``--out``): a LoRA run writes ``adapter_config.json`` + ``adapter_model.safetensors``
(a ``peft`` adapter directory; weights bfloat16) and ``deer.json`` (the base, the stages, the
block size, mask token and vocabulary); a from-scratch run a full model directory
(``save_model``) and ``deer.json``. :func:`specpolicy.models.deer.load_deer` reads either (the adapter merged into the base
with ``merge_and_unload``, so drafting costs what the dLLM drafter costs). The curves (training loss,
held-out loss of both stages' objectives at every checkpoint) go to ``--log``
(``training_log.json``, one entry per stage).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specpolicy.family.block_diffusion import (
    BLOCK_SIZE,
    dual_stream_mask,
    sample_suffix_noise,
    shift_source,
    to_attention_mask,
)
from specpolicy.family.data import Example, collate, fit_length, read_examples
from specpolicy.family.trainer import TrainConfig, train
from specpolicy.family.training_log import update_log
from specpolicy.models.deer import ADAPTER_WEIGHTS, DEER_META

#: DEER's stage II weight base (paper §3.3: 1.01; 1.02 was noisy, 1.05 diverged).
ALPHA = 1.01
#: DEER's stage II span, R ~ U(1, 96) (paper) -- and this testbed's (one block of 32).
R_MAX_PAPER = 96
R_MAX = 32
#: LoRA target modules: every projection of the Qwen2 decoder layers.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_RANK = 16


# -- the two stages' masks and weights ------------------------------------------------------


def stage1_targets(response: torch.Tensor, gen: torch.Generator, block_size: int = BLOCK_SIZE):
    """Stage I: per (row, block) a uniform cut, the block's response tokens from it on masked.

    Args:
        response: ``(B, L) bool`` response tokens, ``L % block_size == 0``.
        gen: CPU generator.
    Returns:
        ``(masked (B, L) bool, targets (B, L) bool, weights (B, L) float32)``: ``targets`` a suffix
        of each block's response tokens, ``masked`` = ``targets`` minus block offset 0 (predicted
        from the clean stream, as at inference), weights 1 on targets.
    """
    masked, targets = sample_suffix_noise(response, gen, block_size, block_size, 0.0)
    return masked, targets, targets.float()


def scribe_weights(response: torch.Tensor, r: torch.Tensor, alpha: float = ALPHA, block_size: int = BLOCK_SIZE):
    """Stage II's targets and weights for given spans (the rule, without randomness).

    Args:
        response: ``(B, L) bool`` response tokens, ``L % block_size == 0``.
        r: ``(B, L // block_size) int64`` R per (row, block), >= 1.
        alpha: the weight base.
    Returns:
        ``(targets (B, L) bool, weights (B, L) float32)``: in each block the last
        ``R' = min(R, #response tokens of the block)`` response tokens; target ``i`` (1 = next to
        the prefix) weighted ``alpha^(R' - i)`` (so the block's last target weighs 1); 0 elsewhere.
    """
    B, L = response.shape
    resp = response.view(B, L // block_size, block_size)
    from_end = resp.flip(-1).int().cumsum(-1).flip(-1)  # response tokens at offsets >= o (1 = the last)
    targets = resp & (from_end <= r[..., None])
    weights = torch.where(targets, alpha ** (from_end - 1).float(), torch.zeros((), dtype=torch.float32))
    return targets.view(B, L), weights.view(B, L)


def stage2_targets(
    response: torch.Tensor,
    gen: torch.Generator,
    block_size: int = BLOCK_SIZE,
    r_max: int = R_MAX,
    alpha: float = ALPHA,
):
    """Stage II: per (row, block) ``R ~ U{1..r_max}`` and :func:`scribe_weights`.

    Returns:
        ``(masked, targets, weights)`` as :func:`stage1_targets` (``masked`` excludes offset 0).
    """
    B, L = response.shape
    r = torch.randint(1, r_max + 1, (B, L // block_size), generator=gen)
    targets, weights = scribe_weights(response, r, alpha, block_size)
    offset = torch.arange(L) % block_size
    return targets & (offset > 0)[None], targets, weights


def deer_loss(model, batch: dict, masked, targets, weights, mask_id: int, block_size: int = BLOCK_SIZE):
    """Weighted masked-diffusion loss of one batch: ``sum w_i CE_i / sum w_i`` over the targets.

    Args:
        model: a ``Qwen2ForCausalLM`` (LoRA layers injected in place, or full weights).
        batch: :func:`specpolicy.family.data.collate` output (``L % block_size == 0``).
        masked, targets: ``(B, L) bool``; weights: ``(B, L) float32``.
    Returns:
        (0-d float32 loss, number of target tokens).
    """
    ids, valid = batch["input_ids"], batch["valid"]
    B, L = ids.shape
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    attn = to_attention_mask(dual_stream_mask(valid, block_size), model.config._attn_implementation)
    hidden = model.model(
        input_ids=torch.cat([noisy, ids], 1),
        position_ids=torch.arange(L, device=ids.device).repeat(2)[None].expand(B, -1),
        attention_mask=attn,
    ).last_hidden_state  # (B, 2L, H)
    rows, cols = targets.nonzero(as_tuple=True)
    logits = model.lm_head(hidden[rows, shift_source(L, block_size, ids.device)[cols]]).float()
    ce = F.cross_entropy(logits, ids[rows, cols], reduction="none")
    w = weights[rows, cols]
    return (ce * w).sum() / w.sum().clamp(min=1e-9), int(rows.numel())


# -- the model: LoRA on the bundled dLLM drafter, or full weights ---------------------------


def lora_model(base_dir: str | Path, rank: int = LORA_RANK, seed: int = 0):
    """The base dLLM drafter (float32) with LoRA layers injected in place (``peft``; alpha = 2 rank,
    no dropout); returns ``(model, peft_model)`` -- ``model`` is the ``Qwen2ForCausalLM`` to train."""
    from peft import LoraConfig, get_peft_model

    from specpolicy.family.models import load_model
    from specpolicy.models.loading import resolve_model_path

    model = load_model(resolve_model_path(str(base_dir)), torch.float32, "sdpa")
    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(LORA_MODULES), bias="none")
    peft_model = get_peft_model(model, cfg)
    return model, peft_model


def save_adapter(peft_model, out: str | Path, base: str, meta: dict) -> int:
    """Write the adapter (``adapter_config.json``, ``adapter_model.safetensors`` in bfloat16) and
    ``deer.json``; returns the adapter weights' size in bytes."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = peft_model.peft_config["default"]
    cfg.base_model_name_or_path = base
    cfg.save_pretrained(str(out))
    state = {
        k: v.detach().to(torch.bfloat16).contiguous().cpu()
        for k, v in get_peft_model_state_dict(peft_model, save_embedding_layers=False).items()
    }
    save_file(state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out / DEER_META).write_text(json.dumps({**meta, "base": base, "kind": "lora"}, indent=1) + "\n")
    return (out / ADAPTER_WEIGHTS).stat().st_size


def save_full(model, tokenizer, out: str | Path, meta: dict) -> int:
    """Write full weights (``save_model``, bfloat16) and ``deer.json``; returns the weights' size."""
    from specpolicy.family.models import save_model

    out = Path(out)
    save_model(
        model,
        tokenizer,
        out,
        extra_config={"bd_block_size": meta["block_size"], "mask_token_id": meta["mask_token_id"]},
    )
    (out / DEER_META).write_text(json.dumps({**meta, "kind": "full"}, indent=1) + "\n")
    return (out / "model.safetensors").stat().st_size


# -- held-out curves and the run --------------------------------------------------------------


@torch.no_grad()
def heldout_losses(
    model, examples: list[Example], mask_id: int, pad_id: int, seed: int = 1234, batch: int = 16
) -> dict:
    """Both stages' objectives on held-out examples (fixed masks from ``seed``): ``{"stage1": .., "stage2": ..}``."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device  # the masks are drawn on the CPU (a CPU generator), then moved
    res = {}
    for name, fn in (("stage1", stage1_targets), ("stage2", stage2_targets)):
        gen = torch.Generator().manual_seed(seed)
        tot, n = 0.0, 0.0
        for i in range(0, len(examples), batch):
            b = collate(examples[i : i + batch], pad_id, BLOCK_SIZE)
            masked, targets, weights = (t.to(dev) for t in fn(b["response"], gen))
            loss, _ = deer_loss(model, {k: v.to(dev) for k, v in b.items()}, masked, targets, weights, mask_id)
            w = float(weights.sum())
            tot += float(loss) * w
            n += w
        res[name] = round(tot / max(n, 1e-9), 4)
    model.train(was)
    return res


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specpolicy.family.train_deer", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--distill", required=True, help="distilled data (target_greedy.jsonl of the family's distill stage)"
    )
    ap.add_argument(
        "--base", default="dllm-drafter", help="the dLLM drafter the adapter trains on (bundled name or dir)"
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--log", default=None, help="training log (default <out>/../training_log.json)")
    ap.add_argument("--log-key", default="deer-drafter", help="entry prefix in the log")
    ap.add_argument("--from-scratch", action="store_true", help="full weights from a random start (not the LoRA)")
    ap.add_argument("--init", default=None, help="resume: a DEER output (adapter or full) to start from")
    ap.add_argument("--rank", type=int, default=LORA_RANK)
    ap.add_argument("--stage1-steps", type=int, default=300)
    ap.add_argument("--stage2-steps", type=int, default=150)
    ap.add_argument("--stage1-lr", type=float, default=2e-3, help="paper 1e-4 (full 0.5B drafter)")
    ap.add_argument("--stage2-lr", type=float, default=1e-3, help="paper 5e-5")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--r-max", type=int, default=R_MAX, help=f"stage II span R ~ U(1, r_max) (paper {R_MAX_PAPER})")
    ap.add_argument("--alpha", type=float, default=ALPHA)
    ap.add_argument("--heldout", type=int, default=128, help="last N distilled examples held out (curves)")
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="where the drafter trains (cpu, cuda)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="wall-clock budget of both stages together (trainer.TrainConfig.max_seconds), split in proportion "
        "to --stage1-steps / --stage2-steps (default: none, budgets in steps only)",
    )
    return ap


def run(a: argparse.Namespace) -> dict:
    """Both stages; returns the log entries written."""
    from specpolicy.family.models import count_params, load_model, new_model
    from specpolicy.family.tokenizer import load_tokenizer
    from specpolicy.models.loading import resolve_model_path

    torch.set_num_threads(a.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(a.out)
    log_path = Path(a.log) if a.log else out.parent / "training_log.json"
    base_dir = resolve_model_path(a.base)
    tok = load_tokenizer(base_dir)
    mask_id = tok.mask_token_id
    exs, _ = fit_length(read_examples(a.distill), a.max_len)
    train_exs, held = exs[: -a.heldout], exs[-a.heldout :]
    peft_model = None
    if a.from_scratch:
        init = a.init
        model = load_model(init, torch.float32, "sdpa") if init else new_model("dllm-drafter", tok, a.seed)
        model.config._attn_implementation = "sdpa"
    else:
        model, peft_model = lora_model(base_dir, a.rank, a.seed)
        if a.init:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(peft_model, load_file(str(Path(a.init) / ADAPTER_WEIGHTS)))
    meta = {
        "paper": "DEER arXiv 2512.15176",
        "block_size": BLOCK_SIZE,
        "mask_token_id": mask_id,
        "vocab_size": int(model.config.vocab_size),
        "alpha": a.alpha,
        "r_max": a.r_max,
        "r_max_paper": R_MAX_PAPER,
        "rank": None if a.from_scratch else a.rank,
        "seed": a.seed,
    }

    def save(where, extra) -> int:
        m = {**meta, **extra}
        return save_full(model, tok, where, m) if a.from_scratch else save_adapter(peft_model, where, a.base, m)

    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    entries = {}
    total_steps = max(1, max(0, a.stage1_steps) + max(0, a.stage2_steps))
    for stage, steps, lr, fn in (
        ("stage1", a.stage1_steps, a.stage1_lr, stage1_targets),
        ("stage2", a.stage2_steps, a.stage2_lr, lambda r, g: stage2_targets(r, g, BLOCK_SIZE, a.r_max, a.alpha)),
    ):
        if steps <= 0:
            continue
        cfg = TrainConfig(
            epochs=50,
            max_steps=steps,
            batch_tokens=a.batch_tokens,
            lr=lr,
            warmup_steps=min(20, steps // 5 + 1),
            seed=a.seed + (0 if stage == "stage1" else 1),
            bf16=False if a.device == "cpu" else None,  # float32 on the CPU; bf16 autocast where it pays
            pad_to_multiple=BLOCK_SIZE,
            log_every=a.log_every,
            device=a.device,
            max_seconds=None if a.max_seconds is None else a.max_seconds * steps / total_steps,
        )
        heldout_curve = [[0, heldout_losses(model, held, mask_id, tok.pad_token_id)]]
        last = [0]

        def loss_fn(m, batch, gen, fn=fn):  # the masks from the CPU generator, moved to the batch's device
            dev = batch["input_ids"].device
            masked, targets, weights = (t.to(dev) for t in fn(batch["response"].cpu(), gen))
            return deer_loss(m, batch, masked, targets, weights, mask_id)

        def on_log(step, m, stage=stage, steps=steps, last=last, heldout_curve=heldout_curve):
            if step - last[0] >= a.checkpoint_every or step == steps:
                last[0] = step
                heldout_curve.append([step, heldout_losses(m, held, mask_id, tok.pad_token_id)])
                save(f"{out}.checkpoint", {"stage": stage, "train_step": step})
                print(f"[deer {stage}] held-out {heldout_curve[-1]}", flush=True)

        t0 = time.time()
        st = train(model, train_exs, loss_fn, cfg, tok.pad_token_id, name=f"deer-{stage}", on_log=on_log)
        if heldout_curve[-1][0] != st["steps"]:  # a time budget cut the plan: measure where it ended
            heldout_curve.append([st["steps"], heldout_losses(model, held, mask_id, tok.pad_token_id)])
        st.update(
            heldout_curve=heldout_curve,
            trainable_params=trainable,
            params=count_params(model),
            wall_s=round(time.time() - t0, 1),
            from_scratch=a.from_scratch,
            base=None if a.from_scratch else a.base,
            n_train=len(train_exs),
            n_heldout=len(held),
            **{k: meta[k] for k in ("alpha", "r_max", "r_max_paper", "rank")},
        )
        entries[f"{a.log_key}-{stage}"] = st
        update_log(log_path, f"{a.log_key}-{stage}", st)
    size = save(out, {"stage": "done"})
    entries[f"{a.log_key}-weights"] = {"path": str(out), "weights_bytes": size}
    update_log(log_path, f"{a.log_key}-weights", entries[f"{a.log_key}-weights"])
    print(f"[deer] saved {out} ({size} bytes of weights); log {log_path}", flush=True)
    return entries


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point (``python -m specpolicy.family.train_deer``)."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
