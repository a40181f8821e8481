"""Sequence-level distillation data: the trained target's greedy continuations of training prompts.

The target is loaded as inference loads it (bf16 weights upcast to float32) and run under
bf16 autocast by default (``bf16=False`` for exact fp32 greedy outputs); prompts are left-padded and decoded greedily in batches with a KV cache until
every row has emitted ``<|im_end|>`` or ``max_new_tokens`` tokens.

Output jsonl rows: ``{"prompt_ids": [...], "response_ids": [...], "finished": bool,
"source_index": int}``; ``response_ids`` are the target's greedy tokens, ending with
``<|im_end|>`` when ``finished``. The drafters train on ``prompt + response``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specpolicy.family.data import Example, save_examples
from specpolicy.family.models import load_model


@torch.no_grad()
def greedy_generate(
    model,
    prompts: list[list[int]],
    eos_id: int,
    pad_id: int,
    max_new_tokens: int = 256,
    batch_size: int = 64,
    bf16: bool = False,
    log_every: int = 0,
    compact_every: int = 8,
    top_k: int = 0,
) -> list[list[int]] | tuple[list[list[int]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Batched greedy decoding with left padding and a KV cache.

    Position ids count real tokens only (so each row is computed as if unpadded).

    Args:
        model: a causal LM (``Qwen2ForCausalLM``), eval mode.
        prompts: token id lists, each non-empty.
        eos_id: stop token (included in the output when produced).
        max_new_tokens: cap on generated tokens per prompt.
        batch_size: prompts per batch (prompts are grouped by length; output order = input order).
        bf16: run under bf16 autocast (faster, may flip near-ties; default fp32 = inference).
        log_every: print progress every this many batches (0 = silent).
        compact_every: finished rows are removed from the batch (and KV cache) once they
            are >= 1/compact_every of the live rows.
        top_k: when > 0, also keep the model's ``top_k`` most likely next tokens and their
            log-probabilities at every generated position (the soft targets of distillation,
            free here: the logits are computed for the greedy choice anyway).
    Returns:
        one list of generated token ids per prompt; with ``top_k > 0`` a pair ``(ids, soft)``
        where ``soft[i] = (token ids (n_i, top_k) int16, log-probabilities (n_i, top_k)
        float16)`` for the ``n_i`` generated tokens of prompt ``i`` (row ``t`` is the
        distribution that token ``t`` was chosen from).
    Raises:
        ValueError: an empty prompt.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    dev = next(model.parameters()).device  # the model's device (CPU, or CUDA for a user's target)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int] | None] = [None] * len(prompts)
    soft: list = [None] * len(prompts)
    t0 = time.time()
    nb = -(-len(order) // batch_size)
    for bi, s in enumerate(range(0, len(order), batch_size)):
        idx = order[s : s + batch_size]
        B = len(idx)
        P = max(len(prompts[i]) for i in idx)
        ids = torch.full((B, P), pad_id, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for r, i in enumerate(idx):
            p = prompts[i]
            ids[r, P - len(p) :] = torch.tensor(p)
            attn[r, P - len(p) :] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out_tok = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        n_gen = torch.zeros(B, dtype=torch.long, device=dev)
        if top_k:
            top_ids = torch.zeros((B, max_new_tokens, top_k), dtype=torch.int16, device=dev)
            top_lp = torch.zeros((B, max_new_tokens, top_k), dtype=torch.float16, device=dev)
        rows = torch.arange(B, device=dev)  # batch row held by each cache row
        done = torch.zeros(B, dtype=torch.bool, device=dev)  # per cache row
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
            cache = out.cache
            last_pos = pos[:, -1]
            for t in range(max_new_tokens):
                last = out.logits[:, -1].float()
                nxt = last.argmax(-1)
                live = ~done
                out_tok[rows[live], t] = nxt[live]
                if top_k:
                    lp, ti = last.log_softmax(-1).topk(top_k, dim=-1)
                    top_ids[rows[live], t] = ti[live].to(torch.int16)
                    top_lp[rows[live], t] = lp[live].to(torch.float16)
                n_gen[rows[live]] = t + 1
                done = done | (nxt == eos_id)
                if bool(done.all()) or t + 1 == max_new_tokens:
                    break
                # drop finished rows once they are a fair share of the batch (a cache copy is not free)
                if int(done.sum()) * compact_every >= len(rows):
                    keep = (~done).nonzero().squeeze(1)
                    cache.batch_select_indices(keep)
                    rows, nxt, attn, last_pos, done = rows[keep], nxt[keep], attn[keep], last_pos[keep], done[keep]
                nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
                attn = torch.cat([attn, torch.ones((attn.shape[0], 1), dtype=attn.dtype, device=dev)], 1)
                last_pos = last_pos + 1
                out = model(
                    input_ids=nxt[:, None],
                    attention_mask=attn,
                    position_ids=last_pos[:, None],
                    cache=cache,
                    use_cache=True,
                )
                cache = out.cache
        out_tok, n_gen = out_tok.cpu(), n_gen.tolist()  # one copy to the host per batch, not one per row
        if top_k:
            top_ids, top_lp = top_ids.cpu(), top_lp.cpu()
        for r, i in enumerate(idx):
            results[i] = out_tok[r, : n_gen[r]].tolist()
            if top_k:
                soft[i] = (top_ids[r, : n_gen[r]].clone(), top_lp[r, : n_gen[r]].clone())
        if log_every and ((bi + 1) % log_every == 0 or bi + 1 == nb):
            el = time.time() - t0
            print(
                f"[distill] batch {bi + 1}/{nb} elapsed {el:.0f}s eta {el / (bi + 1) * (nb - bi - 1):.0f}s", flush=True
            )
    if top_k:
        return results, soft  # type: ignore[return-value]
    return results  # type: ignore[return-value]


def distill(
    target_dir: str | Path,
    examples: list[Example],
    tokenizer,
    out_path: str | Path,
    num_prompts: int | None = None,
    max_new_tokens: int = 256,
    batch_size: int = 64,
    seed: int = 0,
    bf16: bool = True,
    top_k: int = 0,
    device: str = "cpu",
) -> dict:
    """Generate the target's greedy outputs for (a seeded subset of) the training prompts.

    Args:
        target_dir: saved target dir.
        examples: training examples (their prompts are used; responses ignored).
        out_path: jsonl to write (see module docstring).
        num_prompts: how many prompts (a seeded random subset); None = all.
        bf16: decode under bf16 autocast (~3x faster than fp32 on a CPU with native bf16 kernels,
            far slower where they are emulated: see ``trainer.bf16_autocast_pays``; outputs equal
            the fp32 greedy outputs up to rare near-tie flips, which is harmless for training data).
        top_k: when > 0, also save the target's top-``top_k`` next-token log-probabilities at
            every response position to :func:`soft_targets_path` ``(out_path)`` (see
            :func:`save_soft_targets`).
        device: where the target decodes (``"cpu"``, ``"cuda"``); outputs are saved from the CPU.
    Returns:
        stats: ``n``, ``n_finished`` (ended with ``<|im_end|>``), ``mean_response_len``,
        ``wall_s``, ``tokens_per_s`` (generated tokens / s).
    """
    import random

    idx = list(range(len(examples)))
    if num_prompts is not None and num_prompts < len(idx):
        idx = sorted(random.Random(seed).sample(idx, num_prompts))
    model = load_model(target_dir, torch.float32, "sdpa").to(device)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    t0 = time.time()
    prompts = [list(examples[i].prompt_ids) for i in idx]
    outs = greedy_generate(model, prompts, eos, pad, max_new_tokens, batch_size, bf16=bf16, log_every=5, top_k=top_k)
    if top_k:
        outs, soft = outs
        save_soft_targets(soft, soft_targets_path(out_path))
    wall = time.time() - t0
    exs = [Example(tuple(p), tuple(o)) for p, o in zip(prompts, outs)]
    extra = [{"finished": bool(o and o[-1] == eos), "source_index": i} for o, i in zip(outs, idx)]
    save_examples(exs, out_path, extra)
    n_tok = sum(len(o) for o in outs)
    return dict(
        n=len(exs),
        n_finished=sum(e["finished"] for e in extra),
        mean_response_len=round(n_tok / max(1, len(exs)), 1),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        bf16=bf16,
        top_k=top_k,
        device=str(device),
        wall_s=round(wall, 1),
        tokens_per_s=round(n_tok / max(wall, 1e-9), 1),
    )


def soft_targets_path(distill_path: str | Path) -> Path:
    """Where the soft targets of a distilled jsonl live: ``<stem>.topk.pt`` beside it."""
    p = Path(distill_path)
    return p.with_name(p.stem + ".topk.pt")


def save_soft_targets(soft: list[tuple[torch.Tensor, torch.Tensor]], path: str | Path) -> None:
    """Save per-example top-k soft targets (rows in the distilled jsonl's order) as one file:
    ``{"offsets": (n+1,) int64, "ids": (N, k) int16, "logprobs": (N, k) float16}`` with example
    ``i``'s response positions at rows ``offsets[i]:offsets[i+1]``."""
    lens = torch.tensor([0] + [int(a.shape[0]) for a, _ in soft])
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    torch.save(
        {
            "offsets": lens.cumsum(0),
            "ids": torch.cat([a for a, _ in soft]),
            "logprobs": torch.cat([b for _, b in soft]),
        },
        tmp,
    )
    tmp.replace(p)


def load_soft_targets(path: str | Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`save_soft_targets`: one ``(ids (n_i, k) int16, logprobs (n_i, k)
    float16)`` pair per example.

    Raises:
        FileNotFoundError: no such file.
    """
    d = torch.load(path)
    o = d["offsets"].tolist()
    return [(d["ids"][a:b], d["logprobs"][a:b]) for a, b in zip(o[:-1], o[1:])]
