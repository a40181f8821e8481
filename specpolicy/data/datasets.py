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

from specpolicy.core.errors import ConfigError

#: Bundled sets: ``dataset.name`` -> (file inside specpolicy/data, text field).
BUNDLED = {
    "gsm8k": ("gsm8k/test.jsonl", "question"),
    "gsm8k-train": ("gsm8k/train.jsonl", "question"),  # training prompts (acceptance heads), never a benchmark's
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


#: Bad lines of a prompt file named in one report; the others are counted ("and N more").
MAX_REPORTED = 20
#: What a JSON value is called, by its Python type.
_JSON_KINDS = {
    list: "an array ([...])",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def _read_jsonl(path: Path, key: str, fields: tuple[str, ...]) -> list[tuple[int, dict, str]]:
    """``(line number, row, text field)`` of every non-blank line of a JSONL file (optionally
    .gz), the text field chosen per row (the first of ``fields`` holding a non-empty string).

    Raises:
        ConfigError: one line naming every bad line at once -- not UTF-8, not JSON (said in
            plain words: a string not closed, a missing comma, ...), not a JSON object, a lone
            surrogate, no prompt text -- ``<file>:<line>: ...`` for one, ``<file>: N bad lines:
            line 2: ...; line 4: ...`` for several (the first ``MAX_REPORTED``, then "and N
            more"); naming ``key`` for an unreadable or empty file.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[tuple[int, dict, str]] = []
    problems: list[tuple[int, str]] = []
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    row = _parse_line(raw)
                    if row is not None:
                        rows.append((number, row, _text_field(row, fields)))
                except ValueError as exc:
                    problems.append((number, str(exc)))
    except OSError as exc:  # unreadable, or a .gz file that is not gzip
        raise ConfigError(f"{key}={str(path)!r} cannot be read: {exc}") from exc
    if problems:
        rule = (
            f"each line of {key} must be one JSON object (UTF-8) with a non-empty string in one of the fields "
            f"{', '.join(fields)}"
        )
        if len(problems) == 1:
            ((number, problem),) = problems
            raise ConfigError(f"{path}:{number}: {problem}; {rule}")
        shown = "; ".join(f"line {number}: {problem}" for number, problem in problems[:MAX_REPORTED])
        more = len(problems) - MAX_REPORTED
        more_lines = ", ".join(str(n) for n, _ in problems[MAX_REPORTED:][:10])
        tail = (
            f"; and {more} more (line{'s' if more > 1 else ''} {more_lines}{', ...' if more > 10 else ''})"
            if more > 0
            else ""
        )
        raise ConfigError(f"{path}: {len(problems)} bad lines: {shown}{tail}; {rule}")
    if not rows:
        raise ConfigError(f"{key}={str(path)!r} holds no rows (an empty file); it needs one JSON object per line")
    return rows


def _parse_line(raw: bytes) -> dict | None:
    """One JSONL line as a dict (None when blank); ValueError saying in plain words what is wrong."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from exc
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {json_problem(exc)}") from exc
    if not isinstance(row, dict):
        raise ValueError(f"{_JSON_KINDS.get(type(row), 'a JSON value')}, not a JSON object ({{...}})")
    _check_encodable(row)
    return row


def json_problem(error: json.JSONDecodeError) -> str:
    """What is wrong with one line of JSON, in plain words, from Python's ``JSONDecodeError``
    (whose "Invalid control character at" means, on a JSONL line, a string that is not closed
    before the line ends)."""
    line = error.doc
    end = len(line.rstrip("\r\n"))
    col, at_end = error.colno, error.pos >= end
    msg = error.msg
    if msg.startswith("Invalid control character"):
        char = line[error.pos] if error.pos < len(line) else ""
        if at_end or char in "\r\n":
            return 'a string is not closed: the line ends inside it (a closing " is missing)'
        return f"a raw control character {char!r} inside a string at column {col}; write it as {json.dumps(char)[1:-1]}"
    if msg.startswith("Unterminated string"):
        return f'the string starting at column {col} is not closed (a closing " is missing)'
    if msg.startswith("Expecting ',' delimiter") or (msg.startswith("Expecting property name") and at_end):
        if at_end:
            return "the line ends before the object is closed (a } is missing)"
        return f"a comma or a closing bracket is missing at column {col}"
    if msg.startswith("Expecting ':' delimiter"):
        return f"a colon is missing after the key, at column {col}"
    if msg.startswith("Expecting property name"):
        return (
            f"a key in double quotes is expected at column {col} (JSON has no single quotes and no comma "
            f"before a closing }})"
        )
    if msg.startswith("Expecting value"):
        if at_end:
            return "the line ends where a value is expected"
        if col == 1:
            return "the line is not JSON (a JSON object starts with {)"
        return (
            f"no JSON value at column {col} (strings need double quotes; true, false and null are lower case; "
            f"no comma before a closing bracket)"
        )
    if msg.startswith("Extra data"):
        return f"more than one JSON value on the line (extra text from column {col})"
    if msg.startswith("Invalid \\escape"):
        return f"a backslash at column {col} starts no JSON escape (write a backslash as \\\\)"
    if msg.startswith("Invalid \\uXXXX escape"):
        return f"a \\u escape at column {col} needs 4 hexadecimal digits"
    return f"not JSON at column {col} ({msg})"


def _check_encodable(value: Any) -> None:
    """ValueError when a string in ``value`` holds a lone surrogate (JSON ``\\ud800``..``\\udfff``
    without its pair): such text has no UTF-8 form and no tokenizer takes it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"the text holds a lone surrogate ({value[exc.start]!r} at character {exc.start}), "
                f"which is not valid Unicode text"
            ) from exc
    elif isinstance(value, dict):
        for item in value.values():
            _check_encodable(item)
    elif isinstance(value, list):
        for item in value:
            _check_encodable(item)


def _text_field(row: dict, fields: tuple[str, ...]) -> str:
    """The first of ``fields`` that ``row`` holds as a non-empty string (chosen per row);
    ValueError otherwise."""
    for name in fields:
        if isinstance(row.get(name), str) and row[name].strip():
            return name
    present = ", ".join(sorted(row)) or "none"
    raise ValueError(
        f"no prompt text: none of the fields {', '.join(fields)} holds a non-empty string (its fields: {present})"
    )


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
        raise ConfigError(
            f"dataset.num_prompts must be an integer >= 1, or all (every prompt after dataset.offset), got {value!r}"
        )
    return value


def load_prompts(name: str, path: str | None = None, num_prompts: int | None = None, offset: int = 0) -> list[Prompt]:
    """Load a prompt set.

    Args:
        name: a bundled set (gsm8k, gsm8k-train, math500, aime24, humaneval), or any label when ``path`` is given.
        path: a JSONL file (optionally .gz) overriding the bundled data; each row needs one of
            the fields ``prompt``, ``question``, ``problem``, ``text`` (the first one present is
            used, row by row) and may carry ``id``.
        num_prompts: keep the first ``num_prompts`` rows after ``offset`` (an integer >= 1), or
            None for all of them.
        offset: rows to skip first (>= 0, before the last row: an offset past it is an error, not
            an empty run).
    Raises:
        ConfigError (a ValueError): naming ``dataset.name`` for an unknown set, ``dataset.path``
            for a missing or empty file, ``dataset.num_prompts`` / ``dataset.offset`` out of
            range, and ``<file>:<line>`` for every bad row of the file at once (not UTF-8,
            malformed JSON in plain words, not an object, a lone surrogate, no text field).
    """
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(
                f"dataset.path={path!r} does not exist"
                if not file.exists()
                else f"dataset.path={path!r} is a directory, not a JSONL file"
            )
        numbered = _read_jsonl(file, "dataset.path", TEXT_FIELDS)
    else:
        if name not in BUNDLED:
            raise ConfigError(
                f"dataset.name={name!r} is not bundled; choose one of {', '.join(BUNDLED)} or set dataset.path"
            )
        rel, field = BUNDLED[name]
        file = Path(str(resources.files("specpolicy.data") / rel))
        numbered = _read_jsonl(file, "dataset.name", (field,))
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"dataset.offset must be an integer >= 0, got {offset!r}")
    if num_prompts is not None:
        num_prompts = num_prompts_value(num_prompts)
    if offset >= len(numbered):
        source = f"dataset.path={path!r}" if path else f"dataset.name={name!r}"
        raise ConfigError(
            f"dataset.offset={offset} is past the last prompt of {source} ({len(numbered)} rows; "
            f"accepted 0..{len(numbered) - 1})"
        )
    selected = list(enumerate(numbered))[offset:]
    if num_prompts is not None:
        selected = selected[:num_prompts]
    prompts, seen = [], set()
    for i, (line, row, field) in selected:
        where = f"{file}:{line}"
        text = row[field]
        pid = str(row.get("id") or row.get("task_id") or f"{name}/{i}")
        if pid in seen:  # ids key results.jsonl rows (resume): keep them unique, stably
            pid = f"{pid}#{i}"
        seen.add(pid)
        prompts.append(Prompt(prompt_id=pid, text=_user_text(name, text), source=where))
    return prompts
