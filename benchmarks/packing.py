#!/usr/bin/env python
"""Padding or packing for the batched verification: which target pass is faster on this machine.

    python benchmarks/packing.py --batch-sizes 2,4,8,16 --out benchmarks/results/packing.json

The batched loop's target pass (``verifiers/hf_batch.py``) PADS: each request is a row of
``1 + longest draft`` new tokens over a cache of ``longest context`` positions, a 4-D mask
hiding each row's padding. The alternative PACKS: every request's new tokens in one row of
``sum_i (1 + k_i)`` tokens over one row holding every request's cache, a block-diagonal mask
keeping each token to its own request (what varlen attention kernels do on GPUs; on this CPU
SDPA takes the mask dense). Padding computes ``B x (1 + max k)`` token rows through every linear
layer and ``B x (1 + max k) x max L`` attention scores; packing ``sum (1 + k_i)`` rows and
``sum (1 + k_i) x sum L_i`` scores. Which wins depends on the spread of the drafts and on how
the linear layers and attention share the time, so this measures both passes of the bundled
target with the same tokens, the same caches and the same masks' content, side by side
(interleaved, median of ``--repeats``), for drafts of one length (a uniform K) and of spread
lengths (per-request K, 0..K). The loop keeps padding unless packing measures faster.

Reported per (batch size, draft shape): padded and packed ms per pass and packed / padded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import start_benchmark  # noqa: E402

from specpolicy.analysis.machine import MachineWatch  # noqa: E402
from specpolicy.core.attention import as_model_mask  # noqa: E402
from specpolicy.core.cache import crop_cache  # noqa: E402
from specpolicy.core.runtime import Runtime  # noqa: E402
from specpolicy.models.loading import load_causal_lm  # noqa: E402


def padded_pass(model, contexts: list[torch.Tensor], drafts: list[torch.Tensor]):
    """The padded layout of requests with context ids ``contexts[i]`` ``(L_i,)`` (cached first) and
    new tokens ``drafts[i]`` ``(1 + k_i,)``: a closure running the target pass (its cache growth
    undone) and returning each request's logits ``(1 + k_i, V)``, and the tokens it computes."""
    b, longest_ctx = len(contexts), max(int(c.shape[0]) for c in contexts)
    width = max(int(d.shape[0]) for d in drafts)
    lengths, widths = torch.tensor([int(c.shape[0]) for c in contexts]), torch.tensor([int(d.shape[0]) for d in drafts])
    ctx_ids = torch.zeros((b, longest_ctx), dtype=torch.long)
    new_ids = torch.zeros((b, width), dtype=torch.long)
    for i, (c, d) in enumerate(zip(contexts, drafts)):  # right-padded rows
        ctx_ids[i, : c.shape[0]], new_ids[i, : d.shape[0]] = c, d
    cache = DynamicCache()
    model(input_ids=ctx_ids, cache=cache, use_cache=True, logits_to_keep=1)  # padding sits after each row's context
    valid = torch.arange(longest_ctx)[None, :] < lengths[:, None]  # (b, L): real context positions
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    real = torch.arange(width)[None, :] < widths[:, None]  # (b, width): real new tokens
    mask = torch.cat([valid[:, None, :].expand(b, width, longest_ctx), causal[None] & real[:, None, :]], dim=2)
    mask = mask | torch.eye(width + longest_ctx, dtype=torch.bool)[longest_ctx:][None]  # padding sees itself
    positions = lengths[:, None] + torch.arange(width)[None]
    attention = as_model_mask(mask[:, None], model.config._attn_implementation, model.dtype)

    def run() -> list[torch.Tensor]:
        logits = model(
            input_ids=new_ids, position_ids=positions, attention_mask=attention, cache=cache, use_cache=True
        ).logits
        crop_cache(cache, longest_ctx)
        return [logits[i, : int(w)] for i, w in enumerate(widths)]

    return run, b * width


def packed_pass(model, contexts: list[torch.Tensor], drafts: list[torch.Tensor]):
    """The packed layout of the same requests (see ``padded_pass``): one row of every context, one
    row of every request's new tokens, a block-diagonal causal mask."""
    lengths = [int(c.shape[0]) for c in contexts]
    widths = [int(d.shape[0]) for d in drafts]
    owner_ctx = torch.repeat_interleave(torch.arange(len(contexts)), torch.tensor(lengths))  # (sum L,)
    ctx_positions = torch.cat([torch.arange(n) for n in lengths])
    ctx_mask = (owner_ctx[:, None] == owner_ctx[None, :]) & (ctx_positions[:, None] >= ctx_positions[None, :])
    cache = DynamicCache()
    model(
        input_ids=torch.cat(contexts)[None],
        position_ids=ctx_positions[None],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
        attention_mask=as_model_mask(ctx_mask[None, None], model.config._attn_implementation, model.dtype),
    )
    owner_new = torch.repeat_interleave(torch.arange(len(drafts)), torch.tensor(widths))  # (sum (1 + k),)
    offset = torch.cat([torch.arange(w) for w in widths])  # each new token's place in its request's draft
    sees_ctx = owner_new[:, None] == owner_ctx[None, :]
    sees_new = (owner_new[:, None] == owner_new[None, :]) & (offset[:, None] >= offset[None, :])
    mask = torch.cat([sees_ctx, sees_new], dim=1)
    positions = (torch.tensor(lengths)[owner_new] + offset)[None]
    attention = as_model_mask(mask[None, None], model.config._attn_implementation, model.dtype)
    new_ids, total_ctx = torch.cat(drafts)[None], sum(lengths)

    def run() -> list[torch.Tensor]:
        logits = model(
            input_ids=new_ids, position_ids=positions, attention_mask=attention, cache=cache, use_cache=True
        ).logits[0]
        crop_cache(cache, total_ctx)
        return list(logits.split(widths))

    return run, int(owner_new.shape[0])


def measure(
    model, batch_sizes: list[int], k: int, context: tuple[int, int], repeats: int, seed: int
) -> list[dict[str, Any]]:
    """Padded vs packed ms per pass for each batch size and draft shape (uniform K, spread 0..K),
    after checking that both passes give every request the same logits."""
    rows = []
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    for b in batch_sizes:
        lengths = torch.randint(context[0], context[1] + 1, (b,), generator=generator).tolist()
        contexts = [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]
        for shape, ks in (
            ("uniform", [k] * b),
            ("spread", torch.randint(0, k + 1, (b,), generator=generator).tolist()),
        ):
            drafts = [torch.randint(0, vocab, (1 + n,), generator=generator) for n in ks]
            padded, padded_tokens = padded_pass(model, contexts, drafts)
            packed, packed_tokens = packed_pass(model, contexts, drafts)
            for x, y in zip(padded(), packed()):  # the same pass, two layouts
                if not torch.allclose(x, y, atol=1e-3, rtol=1e-3):
                    raise RuntimeError(
                        f"padded and packed logits differ at batch size {b} ({shape}) by "
                        f"{float((x - y).abs().max()):.3g}"
                    )
            times: dict[str, list[float]] = {"padded": [], "packed": []}
            for r in range(repeats + 1):  # the first round is a warm-up; the order alternates
                order = (("padded", padded), ("packed", packed))
                for name, run in order if r % 2 else order[::-1]:
                    start = time.perf_counter()
                    run()
                    if r:
                        times[name].append((time.perf_counter() - start) * 1e3)
            padded_ms, packed_ms = statistics.median(times["padded"]), statistics.median(times["packed"])
            rows.append(
                {
                    "batch_size": b,
                    "drafts": shape,
                    "draft_lengths": ks,
                    "context_lengths": lengths,
                    "padded_tokens": padded_tokens,
                    "packed_tokens": packed_tokens,
                    "padded_ms": padded_ms,
                    "packed_ms": packed_ms,
                    "packed_over_padded": packed_ms / padded_ms,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="benchmarks/packing.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="target")
    p.add_argument("--batch-sizes", default="2,4,8,16")
    p.add_argument("--k", type=int, default=6, help="draft length (uniform) / the largest (spread)")
    p.add_argument("--context", default="120,260", help="context lengths drawn from this range (tokens)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    start_benchmark(args.threads)
    runtime = Runtime(device="cpu", dtype="float32", seed=args.seed)
    model = load_causal_lm(args.target, runtime)
    low, high = (int(x) for x in args.context.split(","))
    watch = MachineWatch()
    watch.start()
    with torch.inference_mode():
        rows = measure(
            model, [int(b) for b in args.batch_sizes.split(",")], args.k, (low, high), args.repeats, args.seed
        )
    result = {
        "settings": {**vars(args), "torch_threads": torch.get_num_threads()},
        "timing_conditions": watch.stop([]),
        "passes": rows,
    }
    print(
        f"{'B':>3} {'drafts':>8} {'padded tok':>10} {'packed tok':>10} {'padded ms':>9} {'packed ms':>9} "
        f"{'packed/padded':>13}"
    )
    for r in rows:
        print(
            f"{r['batch_size']:>3} {r['drafts']:>8} {r['padded_tokens']:>10} {r['packed_tokens']:>10} "
            f"{r['padded_ms']:>9.2f} {r['packed_ms']:>9.2f} {r['packed_over_padded']:>13.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
