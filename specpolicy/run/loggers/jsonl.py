"""``jsonl`` logger: ``results.jsonl`` in the run directory, one JSON line per prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from specpolicy.analysis.results import RESULTS_FILE, read_results
from specpolicy.core.errors import ConfigError
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.run.validation import check_keys

NAME = "jsonl"


class JsonlLogger:
    """Writes each prompt's ``results.jsonl`` row (``specpolicy.analysis.results.PromptResult.to_row``:
    prompt id, output ids/text, finish reason, wall-clock seconds, per-round records, and the
    vanilla comparison) as one line, flushed as soon as the prompt finishes, so a crashed or
    running job's finished prompts are on disk. The file is truncated at ``run_start``, unless
    the run resumes (config ``run.resume: true``): then corrupt lines (e.g. a half-written last
    line) are quarantined and new rows are appended (``specpolicy.run.resume``).

    Args:
        path: the output file.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    @hookimpl
    def specpolicy_run_start(self, config: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        resume = bool(((config or {}).get("run") or {}).get("resume", False))
        if resume:
            read_results(self.path, repair=True)  # quarantine corrupt lines before appending
        self._file = open(self.path, "a" if resume else "w", encoding="utf-8")

    @hookimpl
    def specpolicy_prompt_end(self, row: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("jsonl logger: prompt_end before run_start")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    @hookimpl
    def specpolicy_run_end(self) -> None:
        self.close()

    @hookimpl
    def specpolicy_run_abort(self) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def validate(config: dict[str, Any]) -> None:
    """``logger=jsonl``: the only key, ``file``, must be a non-empty file name."""
    check_keys("logger.jsonl", config, ("file",))
    file = config.get("file", RESULTS_FILE)
    if not isinstance(file, str) or not file.strip():
        raise ConfigError(
            f"logger.jsonl.file must be a file name (relative to the run directory, or absolute), got {file!r}"
        )


def build(config: dict[str, Any], run_dir: str) -> JsonlLogger:
    """Factory for ``logger=jsonl``. Config key: ``file`` (default ``results.jsonl``, relative
    to the run directory, or absolute).

    Raises:
        ValueError: for an empty ``file``.
    """
    file = config.get("file", RESULTS_FILE)
    if not file:
        raise ValueError("logger.jsonl.file must be a file name, got an empty value")
    return JsonlLogger(Path(run_dir) / str(file))


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``logger=jsonl`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry("logger", NAME, build, validate, "results.jsonl in the run directory, one JSON line per prompt")
    ]
