"""Evaluation of the family on GSM8K test prompts (run at the end of the pipeline, or standalone).

Usage::

    python -m specpolicy.family.evaluate --out specpolicy/family/bundle \\
        --test-data /work/shared/data/gsm8k/test.jsonl --n 50

All models are loaded as inference loads them (bf16 weights upcast to float32, fp32 compute).

Measured on the first ``n`` test prompts:

* target greedy outputs (``max_new_tokens`` = 256): fraction ending with ``#### <number>``,
  fraction using at least one number of the question, fraction with the gold answer;
* AR drafter: teacher-forced top-1 agreement with the target's greedy tokens (response
  tokens incl. ``<|im_end|>``), and the exact result of greedy speculative decoding with a
  static speculation length k (acceptance = accepted / drafted tokens);
* dLLM drafter: the realistic drafting condition: the committed prefix (prompt + target
  tokens so far) is clean, the rest of the current 32-block is masked, one forward pass
  proposes up to k tokens (not crossing the block end); top-1 agreement per draft distance
  and the same speculative-decoding simulation.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch

from specpolicy.family.block_diffusion import BLOCK_SIZE, block_causal_mask, to_attention_mask
from specpolicy.family.distill import greedy_generate
from specpolicy.family.models import load_model
from specpolicy.family.tokenizer import encode_prompt, load_tokenizer, read_gsm8k
from specpolicy.family.training_log import update_log

_NUM = re.compile(r"\d+(?:\.\d+)?")
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def _numbers(text: str) -> set[str]:
    out = set()
    for n in _NUM.findall(text.replace(",", "")):
        n = n.rstrip("0").rstrip(".") if "." in n else n
        out.add(n.lstrip("0") or "0")
    return out


def answer_metrics(question: str, output: str, gold_answer: str | None = None) -> dict:
    """Format checks of one generated solution.

    Args:
        output: decoded text (without ``<|im_end|>``).
        gold_answer: the GSM8K answer (its ``#### N`` is the gold number), optional.
    Returns:
        ``ends_with_answer`` (bool), ``uses_question_number`` (bool: a number of the
        question appears in the output before ``####``), ``correct`` (bool or None).
    """
    m = _FINAL.search(output.strip())
    body = output.split("####")[0]
    uses = bool(_numbers(question) & _numbers(body))
    correct = None
    if gold_answer is not None:
        g = _FINAL.search(gold_answer.strip())
        correct = bool(m and g and _numbers(m.group(1)) == _numbers(g.group(1)))
    return {"ends_with_answer": bool(m), "uses_question_number": uses, "correct": correct}


def simulate_rounds(match_fn, length: int, k: int) -> tuple[int, int, int]:
    """Greedy speculative decoding of a known target sequence of ``length`` tokens.

    Args:
        match_fn: ``(c, d) -> list[bool]`` whether draft tokens ``c..c+d-1`` (proposed with
            committed prefix length ``c``) equal the target's tokens; ``d <= k``.
    Returns:
        (drafted tokens, accepted tokens, rounds).
    """
    c = drafted = accepted = rounds = 0
    while c < length:
        d = min(k, length - c)
        ms = match_fn(c, d)
        a = 0
        while a < len(ms) and ms[a]:
            a += 1
        drafted += len(ms)
        accepted += a
        rounds += 1
        c += a + 1
    return drafted, accepted, rounds


@torch.no_grad()
def ar_agreement(model, sequences: list[tuple[list[int], list[int]]], k: int = 5) -> dict:
    """Teacher-forced top-1 agreement of an AR drafter with given responses, and static-k
    speculative acceptance (exact for greedy verification: a draft token conditions only on
    earlier draft tokens, which equal the target's while they are accepted).

    Args:
        sequences: (prompt ids, target response ids) pairs.
    Returns:
        ``top1`` (agreement over all response tokens), ``acceptance_k`` (accepted/drafted),
        ``tokens_per_round`` (committed tokens per target forward), ``k``.
    """
    agree = total = drafted = accepted = rounds = 0
    for p, r in sequences:
        ids = torch.tensor([p + r])
        logits = model(input_ids=ids).logits[0]
        pred = logits[len(p) - 1 : len(p) + len(r) - 1].argmax(-1)
        match = (pred == torch.tensor(r)).tolist()
        agree += sum(match)
        total += len(r)
        d, a, n = simulate_rounds(lambda c, dd: match[c : c + dd], len(r), k)  # noqa: B023 - called within this iteration
        drafted, accepted, rounds = drafted + d, accepted + a, rounds + n
    return {
        "top1": round(agree / max(1, total), 4),
        "acceptance_k": round(accepted / max(1, drafted), 4),
        "tokens_per_round": round(total / max(1, rounds), 3),
        "k": k,
        "n_tokens": total,
    }


@torch.no_grad()
def dllm_block_draft(model, prefix: list[int], mask_id: int, pad_id: int, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """One-pass block draft: ``prefix`` clean, the rest of its current block masked.

    The input is ``prefix`` + mask tokens up to the end of the block containing position
    ``len(prefix)``, under the single-stream block-causal mask; the token at ``i`` is read
    from the logits at ``i - 1``.

    Returns:
        ``(n,) int64`` top-1 tokens for positions ``len(prefix) .. block_end - 1``.
    """
    return dllm_block_draft_batch(model, [prefix], mask_id, pad_id, block_size)[0]


@torch.no_grad()
def dllm_block_draft_batch(
    model, prefixes: list[list[int]], mask_id: int, pad_id: int, block_size: int = BLOCK_SIZE
) -> list[torch.Tensor]:
    """Batched :func:`dllm_block_draft` (right padding)."""
    ends = [(len(p) // block_size + 1) * block_size for p in prefixes]
    L = max(ends)
    B = len(prefixes)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    valid = torch.zeros((B, L), dtype=torch.bool)
    for b, (p, e) in enumerate(zip(prefixes, ends)):
        ids[b, : len(p)] = torch.tensor(p)
        ids[b, len(p) : e] = mask_id
        valid[b, :e] = True
    attn = to_attention_mask(block_causal_mask(valid, block_size), model.config._attn_implementation)
    logits = model(input_ids=ids, attention_mask=attn).logits
    return [logits[b, len(p) - 1 : e - 1].argmax(-1) for b, (p, e) in enumerate(zip(prefixes, ends))]


@torch.no_grad()
def dllm_agreement(
    model,
    sequences: list[tuple[list[int], list[int]]],
    mask_id: int,
    pad_id: int,
    k: int = 5,
    block_size: int = BLOCK_SIZE,
) -> dict:
    """Speculative-decoding simulation with the one-pass block drafter (drafts never cross
    the current block's end), all sequences advanced in lockstep and batched.

    Returns:
        ``top1_by_distance`` (agreement at draft distance 0..k-1 over all rounds),
        ``top1`` (over all drafted tokens), ``acceptance_k``, ``tokens_per_round``, ``k``,
        ``top1_first_token_by_block_offset`` (distance-0 agreement for committed-prefix
        offsets in the block bucketed as 0, 1-7, 8-15, 16-23, 24-31).
    """
    state = [0] * len(sequences)
    by_d = [[0, 0] for _ in range(k)]
    by_off = {"0": [0, 0], "1-7": [0, 0], "8-15": [0, 0], "16-23": [0, 0], "24-31": [0, 0]}
    drafted = accepted = rounds = total = 0
    while True:
        active = [i for i, (p, r) in enumerate(sequences) if state[i] < len(r)]
        if not active:
            break
        prefixes = [sequences[i][0] + sequences[i][1][: state[i]] for i in active]
        drafts = dllm_block_draft_batch(model, prefixes, mask_id, pad_id, block_size)
        for i, pre, dr in zip(active, prefixes, drafts):
            r, c = sequences[i][1], state[i]
            d = min(k, len(r) - c, len(dr))
            ms = [int(dr[j]) == r[c + j] for j in range(d)]
            for j, m in enumerate(ms):
                by_d[j][0] += m
                by_d[j][1] += 1
            off = len(pre) % block_size
            key = "0" if off == 0 else "1-7" if off < 8 else "8-15" if off < 16 else "16-23" if off < 24 else "24-31"
            by_off[key][0] += ms[0]
            by_off[key][1] += 1
            a = 0
            while a < d and ms[a]:
                a += 1
            drafted, accepted, rounds = drafted + d, accepted + a, rounds + 1
            state[i] = c + a + 1
    total = sum(len(r) for _, r in sequences)
    return {
        "top1_by_distance": [round(a / max(1, n), 4) for a, n in by_d],
        "top1": round(sum(a for a, _ in by_d) / max(1, sum(n for _, n in by_d)), 4),
        "top1_first_token_by_block_offset": {key: round(a / max(1, n), 4) for key, (a, n) in by_off.items()},
        "acceptance_k": round(accepted / max(1, drafted), 4),
        "tokens_per_round": round(total / max(1, rounds), 3),
        "k": k,
        "rounds": rounds,
    }


def evaluate(
    out_dir: str | Path,
    test_path: str | Path,
    n: int = 50,
    max_new_tokens: int = 256,
    k: int = 5,
    log_path: str | Path | None = None,
    n_samples_print: int = 3,
) -> dict:
    """Run every measurement listed in the module docstring.

    Args:
        out_dir: family dir holding ``target/``, ``ar-drafter/``, ``dllm-drafter/`` (missing
            drafters are skipped).
        test_path: GSM8K test jsonl; the first ``n`` rows are used.
        log_path: if given, the results are written under key ``"eval"``.
    Returns:
        results dict.
    Raises:
        FileNotFoundError: no target in ``out_dir``.
    """
    out_dir = Path(out_dir)
    t0 = time.time()
    if not (out_dir / "target" / "config.json").exists():
        raise FileNotFoundError(f"no target model in {out_dir / 'target'}")
    tok = load_tokenizer(out_dir / "target")
    rows = read_gsm8k(test_path)[:n]
    target = load_model(out_dir / "target")
    prompts = [encode_prompt(tok, r["question"]) for r in rows]
    outs = greedy_generate(target, prompts, tok.eos_token_id, tok.pad_token_id, max_new_tokens, batch_size=64)
    texts = [tok.decode([t for t in o if t != tok.eos_token_id]) for o in outs]
    mets = [answer_metrics(r["question"], t, r["answer"]) for r, t in zip(rows, texts)]
    res: dict = {
        "n_prompts": len(rows),
        "target": {
            "frac_ends_with_answer": round(sum(m["ends_with_answer"] for m in mets) / len(rows), 4),
            "frac_uses_question_number": round(sum(m["uses_question_number"] for m in mets) / len(rows), 4),
            "frac_both": round(sum(m["ends_with_answer"] and m["uses_question_number"] for m in mets) / len(rows), 4),
            "frac_correct": round(sum(bool(m["correct"]) for m in mets) / len(rows), 4),
            "frac_finished": round(sum(bool(o) and o[-1] == tok.eos_token_id for o in outs) / len(rows), 4),
            "mean_output_tokens": round(sum(len(o) for o in outs) / len(rows), 1),
        },
        "samples": [{"question": r["question"], "output": t} for r, t in zip(rows[:n_samples_print], texts)],
    }
    for s in res["samples"]:
        print("=" * 80 + "\nQ: " + s["question"] + "\n--- target:\n" + s["output"], flush=True)
    print("target:", res["target"], flush=True)
    seqs = [(p, o) for p, o in zip(prompts, outs) if o]
    if (out_dir / "ar-drafter" / "config.json").exists():
        res["ar_drafter"] = ar_agreement(load_model(out_dir / "ar-drafter"), seqs, k)
        print("ar-drafter:", res["ar_drafter"], flush=True)
    if (out_dir / "dllm-drafter" / "config.json").exists():
        dm = load_model(out_dir / "dllm-drafter")
        bs = int(getattr(dm.config, "bd_block_size", BLOCK_SIZE))
        mid = int(getattr(dm.config, "mask_token_id", tok.mask_token_id))
        res["dllm_drafter"] = dllm_agreement(dm, seqs, mid, tok.pad_token_id, k, bs)
        print("dllm-drafter:", res["dllm_drafter"], flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    if log_path is not None:
        update_log(log_path, "eval", res)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="specpolicy/family/bundle", help="family dir")
    ap.add_argument("--test-data", default="/work/shared/data/gsm8k/test.jsonl")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--no-log", action="store_true", help="do not write training_log.json")
    a = ap.parse_args(argv)
    evaluate(a.out, a.test_data, a.n, a.max_new_tokens, a.k, None if a.no_log else Path(a.out) / "training_log.json")


if __name__ == "__main__":
    main()
