"""GSM8K rows -> tokenized chat examples, length-bucketed batch plans, and padded batches.

An :class:`Example` is one chat turn: the prompt ids (``<|im_start|>user\\n{question}
<|im_end|>\\n<|im_start|>assistant\\n``) and the response ids (the answer text followed
by ``<|im_end|>``). The loss is taken on response tokens only.

Batches are right-padded with the pad id (``<|endoftext|>``); every tensor of a batch
has shape ``(B, L)`` where ``L`` is the longest example of the batch rounded up to
``pad_to_multiple``.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from specpolicy.family.tokenizer import encode_prompt, encode_response, read_gsm8k

MAX_LEN = 384


@dataclass(frozen=True)
class Example:
    """One tokenized chat example.

    Attributes:
        prompt_ids: prompt token ids (chat template with generation prompt).
        response_ids: response token ids (normally ending with ``<|im_end|>``).
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def fit_length(examples: list[Example], max_len: int = MAX_LEN, overflow: str = "drop") -> tuple[list[Example], dict]:
    """Enforce ``len(example) <= max_len``.

    Args:
        overflow: ``"drop"`` removes longer examples; ``"truncate"`` cuts their response
            (examples whose prompt alone leaves < 1 response token are dropped).
    Returns:
        (kept examples in input order, stats dict with ``n_in``, ``n_out``, ``n_dropped``,
        ``n_truncated``, ``max_len``).
    Raises:
        ValueError: unknown ``overflow``.
    """
    if overflow not in ("drop", "truncate"):
        raise ValueError(f"overflow must be 'drop' or 'truncate', got {overflow!r}")
    out, dropped, truncated = [], 0, 0
    for ex in examples:
        if len(ex) <= max_len:
            out.append(ex)
        elif overflow == "truncate" and len(ex.prompt_ids) < max_len:
            out.append(Example(ex.prompt_ids, ex.response_ids[: max_len - len(ex.prompt_ids)]))
            truncated += 1
        else:
            dropped += 1
    stats = dict(n_in=len(examples), n_out=len(out), n_dropped=dropped, n_truncated=truncated, max_len=max_len)
    return out, stats


def load_examples(
    path: str | Path, tokenizer, max_len: int = MAX_LEN, overflow: str = "drop", limit: int | None = None
) -> tuple[list[Example], dict]:
    """Tokenize a GSM8K jsonl file into chat examples.

    Args:
        path: GSM8K jsonl (``question``, ``answer``); answers are kept verbatim,
            ``<<...>>`` calculator notes included.
        tokenizer: the family tokenizer.
        max_len: maximum prompt+response tokens (see :func:`fit_length`).
        limit: use only the first ``limit`` rows (smoke runs).
    Returns:
        (examples, stats) as :func:`fit_length`.
    Raises:
        FileNotFoundError, ValueError: see :func:`specpolicy.family.tokenizer.read_gsm8k`.
    """
    rows = read_gsm8k(path)[:limit]
    exs = [
        Example(tuple(encode_prompt(tokenizer, r["question"])), tuple(encode_response(tokenizer, r["answer"])))
        for r in rows
    ]
    return fit_length(exs, max_len, overflow)


def save_examples(examples: list[Example], path: str | Path, extra: list[dict] | None = None) -> None:
    """Write examples as jsonl ``{"prompt_ids": [...], "response_ids": [...], **extra[i]}``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        for i, ex in enumerate(examples):
            row = {"prompt_ids": list(ex.prompt_ids), "response_ids": list(ex.response_ids)}
            if extra is not None:
                row.update(extra[i])
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)


def read_examples(path: str | Path) -> list[Example]:
    """Read a jsonl written by :func:`save_examples` (e.g. the distilled data).

    Raises:
        FileNotFoundError: missing file. KeyError: a row lacks ``prompt_ids``/``response_ids``.
    """
    with open(path) as f:
        return [Example(tuple(r["prompt_ids"]), tuple(r["response_ids"])) for r in map(json.loads, f) if r]


def batch_plan(
    lengths: list[int], max_tokens: int, seed: int, epoch: int, pad_to_multiple: int = 1, chunk: int = 2048
) -> list[list[int]]:
    """Deterministic length-bucketed batches for one epoch.

    Examples are shuffled with ``random.Random(seed * 100003 + epoch)``, sorted by length
    inside chunks of ``chunk`` examples, cut into batches whose padded size
    ``B * roundup(max_len, pad_to_multiple)`` is <= ``max_tokens`` (at least one example
    per batch), and the batch order is shuffled.

    Args:
        lengths: token length of each example.
        max_tokens: padded-token budget per batch.
    Returns:
        list of batches, each a list of example indices; every index appears once.
    """
    rng = random.Random(seed * 100003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for s in range(0, len(order), chunk):
        part = sorted(order[s : s + chunk], key=lambda i: lengths[i])
        cur: list[int] = []
        for i in part:
            L = -(-lengths[i] // pad_to_multiple) * pad_to_multiple
            if cur and (len(cur) + 1) * L > max_tokens:  # sorted ascending: L is the batch max
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples: list[Example], pad_id: int, pad_to_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-pad examples into a batch.

    Returns:
        dict with
        * ``input_ids``: ``(B, L) int64``, pad id after each sequence;
        * ``valid``: ``(B, L) bool``, True on real tokens;
        * ``response``: ``(B, L) bool``, True on response tokens (loss positions);
        * ``prompt_len``: ``(B,) int64``.
        ``L`` = longest example rounded up to ``pad_to_multiple``.
    Raises:
        ValueError: empty ``examples``.
    """
    if not examples:
        raise ValueError("empty batch")
    L = max(len(e) for e in examples)
    L = -(-L // pad_to_multiple) * pad_to_multiple
    B = len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    valid = torch.zeros((B, L), dtype=torch.bool)
    resp = torch.zeros((B, L), dtype=torch.bool)
    plen = torch.zeros(B, dtype=torch.long)
    for b, e in enumerate(examples):
        p, n = len(e.prompt_ids), len(e)
        ids[b, :n] = torch.tensor(e.prompt_ids + e.response_ids, dtype=torch.long)
        valid[b, :n] = True
        resp[b, p:n] = True
        plen[b] = p
    return {"input_ids": ids, "valid": valid, "response": resp, "prompt_len": plen}


def draft_vocabulary(examples: list[Example], size: int, vocab_size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """A drafter's draft vocabulary (EAGLE-3's ``d2t``; DFlash's opt-in one): the ``size`` most
    frequent response tokens of ``examples`` (ties: smaller id first), the ids in ``always`` (stop
    tokens: a drafter that cannot draft one drafts past every end) first, sorted by id:
    ``(size,) int64``."""
    counts = Counter(t for e in examples for t in e.response_ids)
    first = set(always)
    ranked = sorted(range(vocab_size), key=lambda t: (t not in first, -counts.get(t, 0), t))[:size]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def vocabulary_coverage(examples: list[Example], ids: torch.Tensor) -> float:
    """Share of the response tokens of ``examples`` that are among ``ids`` (target ids)."""
    counts = Counter(t for e in examples for t in e.response_ids)
    return sum(counts[int(t)] for t in ids) / max(1, sum(counts.values()))
