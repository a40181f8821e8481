"""Prompt sets: the bundled GSM8K test, MATH-500, AIME 2024 and HumanEval, or any JSONL file."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

#: Bundled sets: ``dataset.name`` -> (file inside specpolicy/data, text field).
BUNDLED = {
    "gsm8k": ("gsm8k/test.jsonl", "question"),
    "math500": ("math500/test.jsonl", "problem"),
    "aime24": ("aime24/test.jsonl", "problem"),
    "humaneval": ("humaneval/HumanEval.jsonl.gz", "prompt"),
}
#: Fields tried, in order, for the prompt text of a user-supplied JSONL file.
TEXT_FIELDS = ("prompt", "question", "problem", "text")
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (``<dataset>/<row>`` or the row's ``id``/``task_id``; a repeated id
    gets ``#<row>`` appended) and its user message. The id is the same in every run of the same
    dataset, so it keys ``results.jsonl`` rows when a run resumes."""

    prompt_id: str
    text: str

    def token_ids(self, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
        """``(P,) int64`` ids of the prompt through the tokenizer's chat template (generation prompt added)."""
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": self.text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return torch.tensor(ids, dtype=torch.long)


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _user_text(name: str, row: dict, field: str) -> str:
    text = row[field]
    if name == "humaneval":
        return f"Complete the following Python function.\n```python\n{text}```"
    if name in ("math500", "aime24") and MATH_INSTRUCTION not in text:
        return f"{text}\n{MATH_INSTRUCTION}"
    return text


def load_prompts(name: str, path: str | None = None, num_prompts: int | None = None, offset: int = 0) -> list[Prompt]:
    """Load a prompt set.

    Args:
        name: a bundled set (gsm8k, math500, aime24, humaneval), or any label when ``path`` is given.
        path: a JSONL file (optionally .gz) overriding the bundled data; each row needs one of
            the fields ``prompt``, ``question``, ``problem``, ``text`` and may carry ``id``.
        num_prompts: keep the first ``num_prompts`` rows after ``offset`` (None or <= 0: all).
        offset: rows to skip first.
    Raises:
        ValueError: naming ``dataset.name`` for an unknown set, ``dataset.path`` for a missing
            file or a row without a text field.
    """
    if path:
        file = Path(path).expanduser()
        if not file.exists():
            raise ValueError(f"dataset.path={path!r} does not exist")
        rows = _read_jsonl(file)
        field = next((f for f in TEXT_FIELDS if rows and f in rows[0]), None)
        if field is None:
            raise ValueError(f"dataset.path={path!r}: rows need one of the fields {', '.join(TEXT_FIELDS)}")
    else:
        if name not in BUNDLED:
            raise ValueError(f"dataset.name={name!r} is not bundled; choose one of {', '.join(BUNDLED)} or set dataset.path")
        rel, field = BUNDLED[name]
        rows = _read_jsonl(Path(str(resources.files("specpolicy") / "data" / rel)))
    if offset < 0:
        raise ValueError(f"dataset.offset must be >= 0, got {offset}")
    selected = list(enumerate(rows))[offset:]
    if num_prompts is not None and num_prompts > 0:
        selected = selected[:num_prompts]
    prompts, seen = [], set()
    for i, row in selected:
        pid = str(row.get("id") or row.get("task_id") or f"{name}/{i}")
        if pid in seen:  # ids key results.jsonl rows (resume): keep them unique, stably
            pid = f"{pid}#{i}"
        seen.add(pid)
        prompts.append(Prompt(prompt_id=pid, text=_user_text(name, row, field)))
    return prompts
