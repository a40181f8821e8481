#!/usr/bin/env python
"""What a larger bundled family would cost on this machine (issue 13's "larger target" route).

    python benchmarks/family_scale.py --out benchmarks/results/family-scale.json

For Qwen2 models of the family's shape at growing sizes (random weights: cost does not depend
on the values), measured on this CPU with the family's settings:

* ``step_ms`` -- one target decoding step: 1 new token on a KV cache of ``--context`` (256)
  tokens, float32, as in the loop (median of ``--repeats``);
* ``block_pass_ms`` -- one dLLM drafter pass as FailFast runs it: a 32-token block on the same
  cache (median);
* ``train_tokens_per_s`` -- forward + backward + AdamW step in the family trainer's precision
  (bfloat16 autocast where the CPU runs it natively, float32 elsewhere) and settings
  (``specpolicy/family/trainer.py``), on batches of ``--train-tokens`` (2048) padded tokens,
  after one untimed step.

From them, with today's recipe held fixed (a lower bound: a larger model wants more epochs):

* ``vanilla_main_job_s`` -- the vanilla half of the main job (20 prompts x 256 new tokens x
  ``step_ms``), which the main job decodes beside FailFast;
* ``target_stage_h`` -- the ``target`` stage's wall time at this size, two ways: today's stage
  as recorded when the family was trained (``wall_s`` in ``training_log.json``, 4 epochs of GSM8K
  train) x (today's size's tokens/s / this size's), both measured here; and, lower
  (``target_stage_h_at_this_rate``), the padded tokens that stage processed (``wall_s`` x
  ``tokens_per_s``) / this size's tokens/s -- lower because this run's batches (2048 tokens in
  rows of 256) train faster than the recorded stage did (8192-token batches of rows up to 384,
  on the machine as it ran then);
* ``largest_drafter`` -- the largest drafter size of ``DRAFTERS`` whose block pass is at most
  0.5 of this target's step (issue 13's cost bar).

Sizes run in one process, one after another, each measured alone; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from specpolicy.core.cache import crop_cache
from specpolicy.family.models import SIZES
from specpolicy.family.trainer import TrainConfig, make_optimizer, uses_bf16

FAMILY = Path(__file__).resolve().parents[1] / "specpolicy" / "family" / "bundle"


def shape(layers: int, width: int, kv_heads: int) -> dict:
    """Qwen2Config kwargs of a larger size, shaped like the target: heads of 64 dims, MLP 3x width."""
    return dict(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        num_key_value_heads=kv_heads,
        intermediate_size=3 * width,
    )


#: Target sizes (Qwen2Config kwargs): today's first (the reference of ``target_stage_h``), then
#: wider and deeper.
TARGETS = {
    "12x256 (today)": SIZES["target"],
    "12x384": shape(12, 384, 2),
    "16x512": shape(16, 512, 2),
    "24x768": shape(24, 768, 4),
    "24x1024": shape(24, 1024, 4),
}
#: Drafter sizes: today's, the session-4 capacity probe (the target's shape), and between.
DRAFTERS = {
    "4x192 (today)": SIZES["dllm-drafter"],
    "4x256": shape(4, 256, 2),
    "6x384": shape(6, 384, 2),
    "12x256 (probe)": SIZES["target"],
    "8x512": shape(8, 512, 2),
    "12x768": shape(12, 768, 4),
}


def build(kwargs: dict, vocab: int = 4096) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 of the family's shape (tied embeddings, vocab 4096)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab, max_position_embeddings=1024, tie_word_embeddings=True, use_sliding_window=False, **kwargs
    )
    return Qwen2ForCausalLM(cfg)


def params(model: torch.nn.Module) -> int:
    """Parameters, the tied embedding counted once."""
    return sum(p.numel() for p in model.parameters())


@torch.inference_mode()
def forward_ms(model: Qwen2ForCausalLM, context: int, new: int, repeats: int) -> float:
    """Median ms of one forward of ``new`` tokens on a KV cache of ``context`` tokens (float32)."""
    model.eval()
    prefix = torch.randint(4, 4000, (1, context))
    cache = DynamicCache()
    model(prefix, cache=cache, use_cache=True)
    ids = torch.randint(4, 4000, (1, new))
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        model(ids, cache=cache, use_cache=True)
        times.append((time.perf_counter() - t0) * 1e3)
        crop_cache(cache, context)
    return statistics.median(times[1:])


def train_tokens_per_s(model: Qwen2ForCausalLM, tokens: int, steps: int) -> float:
    """Padded tokens/s of forward + backward + AdamW in the family trainer's precision (``uses_bf16``)."""
    model.train()
    cfg = TrainConfig()
    opt = make_optimizer(model, cfg)
    seq = 256
    ids = torch.randint(4, 4000, (max(1, tokens // seq), seq))
    elapsed = 0.0
    for step in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=uses_bf16(cfg)):
            loss = model(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        if step:  # the first step warms up allocator and kernels
            elapsed += time.perf_counter() - t0
    return ids.numel() * steps / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=256, help="KV-cache tokens before the timed forward")
    ap.add_argument("--repeats", type=int, default=20, help="timed forwards per figure (median)")
    ap.add_argument("--train-tokens", type=int, default=2048, help="padded tokens per training batch")
    ap.add_argument("--train-steps", type=int, default=2, help="timed training steps per size")
    ap.add_argument("--prompts", type=int, default=20, help="main-job prompts (vanilla half)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    log = json.loads((FAMILY / "training_log.json").read_text())
    stage_tokens = log["target"]["wall_s"] * log["target"]["tokens_per_s"]  # padded tokens of today's stage

    drafters = {}
    for name, kw in DRAFTERS.items():
        m = build(kw)
        drafters[name] = {"params": params(m), "block_pass_ms": forward_ms(m, a.context, 32, a.repeats)}
        print(
            f"drafter {name:16s} {drafters[name]['params'] / 1e6:7.1f}M  block pass {drafters[name]['block_pass_ms']:7.1f} ms",
            flush=True,
        )
        del m

    targets, today_tokens_per_s = {}, None
    for name, kw in TARGETS.items():
        m = build(kw)
        row = {
            "params": params(m),
            "step_ms": forward_ms(m, a.context, 1, a.repeats),
            "train_tokens_per_s": train_tokens_per_s(m, a.train_tokens, a.train_steps),
        }
        row["vanilla_main_job_s"] = a.prompts * a.max_new_tokens * row["step_ms"] / 1e3
        today_tokens_per_s = today_tokens_per_s or row["train_tokens_per_s"]  # TARGETS' first: today's size
        row["target_stage_h"] = log["target"]["wall_s"] * today_tokens_per_s / row["train_tokens_per_s"] / 3600
        row["target_stage_h_at_this_rate"] = stage_tokens / row["train_tokens_per_s"] / 3600
        fits = [d for d, v in drafters.items() if v["block_pass_ms"] <= 0.5 * row["step_ms"]]
        row["largest_drafter"] = max(fits, key=lambda d: drafters[d]["params"]) if fits else None
        targets[name] = row
        print(
            f"target  {name:16s} {row['params'] / 1e6:7.1f}M  step {row['step_ms']:7.1f} ms  "
            f"train {row['train_tokens_per_s']:7.0f} tok/s  vanilla main job {row['vanilla_main_job_s']:6.0f} s  "
            f"target stage {row['target_stage_h_at_this_rate']:4.1f}-{row['target_stage_h']:4.1f} h  largest drafter <= 0.5 step: {row['largest_drafter']}",
            flush=True,
        )
        del m

    out = {
        "settings": vars(a)
        | {
            "out": str(a.out) if a.out else None,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "target_stage_tokens": stage_tokens,
            "target_stage_s": log["target"]["wall_s"],
        },
        "drafters": drafters,
        "targets": targets,
    }
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
