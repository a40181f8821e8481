"""Read/update ``training_log.json``: one JSON object with one entry per pipeline stage.

Each update rewrites the file atomically (write to ``.tmp`` then rename), so a crash never
leaves a half-written log.
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
    tmp.write_text(json.dumps(log, indent=1) + "\n")
    tmp.replace(p)
    return log
