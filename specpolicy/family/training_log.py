"""Read/update ``training_log.json``: one JSON object with one entry per pipeline stage.

Each update rewrites the file atomically (write to ``.tmp`` then rename), so a crash never
leaves a half-written log. One stage a line, each compact (:func:`dumps`): the file is part of the
48 MB bundle and a stage's diff stays one line.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_log(path: str | Path) -> dict:
    """The log as a dict (``{}`` if the file does not exist).

    Raises:
        json.JSONDecodeError: the file exists but is not valid JSON.
    """
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else {}


def update_log(path: str | Path, key: str, value) -> dict:
    """Set ``log[key] = value`` and write the file; returns the whole log."""
    log = read_log(path)
    log[key] = value
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(dumps(log))
    tmp.replace(p)
    return log


def dumps(log: dict) -> str:
    """``log`` as JSON text with one top-level key a line, each value without spaces."""
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in log.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"
