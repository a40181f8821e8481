"""Prompt sets: the bundled GSM8K test, MATH-500, AIME 2024 and HumanEval, or any JSONL file."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from specpolicy.errors import ConfigError

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
    gets ``#<row>`` appended), its user message and where it was read (``file:line``). The id is
    the same in every run of the same dataset, so it keys ``results.jsonl`` rows when a run resumes."""

    prompt_id: str
    text: str
    #: ``<file>:<line>`` the prompt was read from (for messages about it).
    source: str = ""

    def token_ids(self, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
        """``(P,) int64`` ids of the prompt through the tokenizer's chat template (generation prompt added)."""
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": self.text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return torch.tensor(ids, dtype=torch.long)


def _read_jsonl(path: Path, key: str) -> list[tuple[int, dict]]:
    """``(line number, row)`` of every non-blank line of a JSONL file (optionally .gz).

    Raises:
        ConfigError: ``<file>:<line>: ...`` for the first line that is not UTF-8, not JSON, not
            a JSON object, or holds a lone surrogate (``\\udc80``: not encodable text), with the
            numbers of the other bad lines; naming ``key`` for an unreadable or empty file.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[tuple[int, dict]] = []
    problems: list[tuple[int, str]] = []
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    row = _parse_line(raw, key)
                except ValueError as exc:
                    problems.append((number, str(exc)))
                    continue
                if row is not None:
                    rows.append((number, row))
    except OSError as exc:  # unreadable, or a .gz file that is not gzip
        raise ConfigError(f"{key}={str(path)!r} cannot be read: {exc}") from exc
    if problems:
        (number, message), more = problems[0], [str(n) for n, _ in problems[1:]]
        also = (f" (also bad: line{'s' if len(more) > 1 else ''} {', '.join(more[:10])}"
                f"{', ...' if len(more) > 10 else ''})" if more else "")
        raise ConfigError(f"{path}:{number}: {message}{also}")
    if not rows:
        raise ConfigError(f"{key}={str(path)!r} holds no rows (an empty file); it needs one JSON object per line")
    return rows


def _parse_line(raw: bytes, key: str) -> dict | None:
    """One JSONL line as a dict (None when blank); ValueError saying what is wrong with it."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                         f"{key} must be a UTF-8 JSONL file") from exc
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON (column {exc.colno}: {exc.msg.removesuffix(' at')}); each line of {key} must be "
                         f"one JSON object") from exc
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object; each line of {key} must be one JSON object")
    _check_encodable(row)
    return row


def _check_encodable(value: Any) -> None:
    """ValueError when a string in ``value`` holds a lone surrogate (JSON ``\\ud800``..``\\udfff``
    without its pair): such text has no UTF-8 form and no tokenizer takes it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text holds a lone surrogate ({value[exc.start]!r} at character {exc.start}), "
                             f"which is not valid Unicode text") from exc
    elif isinstance(value, dict):
        for item in value.values():
            _check_encodable(item)
    elif isinstance(value, list):
        for item in value:
            _check_encodable(item)


def _text_field(row: dict, where: str, fields: tuple[str, ...], key: str) -> str:
    """The first of ``fields`` that ``row`` holds as a non-empty string (chosen per row)."""
    for name in fields:
        if isinstance(row.get(name), str) and row[name].strip():
            return name
    present = ", ".join(sorted(row)) or "none"
    raise ConfigError(f"{where}: no prompt text: a row of {key} needs a non-empty string in one of the fields "
                      f"{', '.join(fields)} (its fields: {present})")


def _user_text(name: str, text: str) -> str:
    if name == "humaneval":
        return f"Complete the following Python function.\n```python\n{text}```"
    if name in ("math500", "aime24") and MATH_INSTRUCTION not in text:
        return f"{text}\n{MATH_INSTRUCTION}"
    return text


def num_prompts_value(value: Any) -> int | None:
    """``dataset.num_prompts`` as a count: an integer >= 1, or None for every prompt (the
    config values ``all`` and ``null``).

    Raises:
        ConfigError: for anything else (``-1`` and ``0`` included: ask for every prompt with ``all``).
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"dataset.num_prompts must be an integer >= 1, or all (every prompt after "
                          f"dataset.offset), got {value!r}")
    return value


def load_prompts(name: str, path: str | None = None, num_prompts: int | None = None, offset: int = 0) -> list[Prompt]:
    """Load a prompt set.

    Args:
        name: a bundled set (gsm8k, math500, aime24, humaneval), or any label when ``path`` is given.
        path: a JSONL file (optionally .gz) overriding the bundled data; each row needs one of
            the fields ``prompt``, ``question``, ``problem``, ``text`` (the first one present is
            used, row by row) and may carry ``id``.
        num_prompts: keep the first ``num_prompts`` rows after ``offset`` (an integer >= 1), or
            None for all of them.
        offset: rows to skip first (>= 0).
    Raises:
        ConfigError (a ValueError): naming ``dataset.name`` for an unknown set, ``dataset.path``
            for a missing or empty file, ``dataset.num_prompts`` / ``dataset.offset`` out of
            range, and ``<file>:<line>`` for every kind of bad row (not UTF-8, malformed JSON,
            not an object, a lone surrogate, no text field).
    """
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"dataset.path={path!r} does not exist" if not file.exists()
                              else f"dataset.path={path!r} is a directory, not a JSONL file")
        numbered = _read_jsonl(file, "dataset.path")
        fields = TEXT_FIELDS
    else:
        if name not in BUNDLED:
            raise ConfigError(f"dataset.name={name!r} is not bundled; choose one of {', '.join(BUNDLED)} "
                              f"or set dataset.path")
        rel, field = BUNDLED[name]
        file = Path(str(resources.files("specpolicy") / "data" / rel))
        numbered = _read_jsonl(file, "dataset.name")
        fields = (field,)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"dataset.offset must be an integer >= 0, got {offset!r}")
    if num_prompts is not None:
        num_prompts = num_prompts_value(num_prompts)
    selected = list(enumerate(numbered))[offset:]
    if num_prompts is not None:
        selected = selected[:num_prompts]
    prompts, seen = [], set()
    for i, (line, row) in selected:
        where = f"{file}:{line}"
        text = row[_text_field(row, where, fields, "dataset.path" if path else "dataset.name")]
        pid = str(row.get("id") or row.get("task_id") or f"{name}/{i}")
        if pid in seen:  # ids key results.jsonl rows (resume): keep them unique, stably
            pid = f"{pid}#{i}"
        seen.add(pid)
        prompts.append(Prompt(prompt_id=pid, text=_user_text(name, text), source=where))
    return prompts
