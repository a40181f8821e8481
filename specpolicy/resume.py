"""Resumable runs: the same command continues an interrupted run where it stopped.

* The run directory depends only on the command: ``hydra.run.dir`` is
  ``outputs/${specpolicy_run_name:${hydra.job.override_dirname}}`` (``run_name`` below: the
  command-line overrides, ``run.resume`` excluded, made a safe directory name; ``default``
  without overrides).
* ``results.jsonl`` (the ``jsonl`` logger) is the run's state: one line per finished prompt,
  carrying ``prompt_id``, ``output_ids``, every round and the vanilla baseline's figures, and
  the ``config_hash`` of the settings that produced it. With ``run.resume: true`` (default) a
  run reads it back (``load_finished``, through ``specpolicy.results.read_results``: every valid
  row is kept; a corrupt line anywhere -- e.g. a half-written last line of a killed process --
  is moved verbatim to ``results.jsonl.corrupt`` with its line number and reported in one line,
  and its prompt is computed again), skips the prompts already there and appends the others;
  the summary is built from all results, so it equals an uninterrupted run's summary except for
  timings. ``run.resume: false`` starts over.
* SIGINT / SIGTERM (``interruptible``) raise ``RunInterrupted``: the run writes a partial
  ``summary.json`` (``"partial": true``) of the finished prompts and exits non-zero
  (130 / 143). A killed process (SIGKILL, power loss) leaves ``results.jsonl`` to resume from.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from specpolicy.results import RESULTS_FILE, PromptResult, read_results

#: Config sections that decide a prompt's results (``config_hash``); logging, the latency
#: profile, the prompt count, warm-up and resume settings do not.
RESULT_KEYS = ("verifier", "drafter", "policy", "generation", "reuse", "runtime", "seed")
RESOLVER = "specpolicy_run_name"


def run_name(override_dirname: str) -> str:
    """A directory name for a command's overrides (Hydra's ``hydra.job.override_dirname``):
    ``default`` when there are none; the overrides themselves when they are a safe name of at
    most 120 characters; otherwise a cleaned, shortened form plus 8 hex digits of their hash
    (paths in overrides, e.g. ``verifier.model=/models/x``, contain ``/``)."""
    if not override_dirname:
        return "default"
    safe = re.sub(r"[^A-Za-z0-9._=,+@:%\-]", "_", override_dirname)
    if safe != override_dirname or len(safe) > 120 or safe.startswith("."):
        digest = hashlib.sha1(override_dirname.encode("utf-8")).hexdigest()[:8]
        safe = f"{safe.lstrip('.')[:100]}-{digest}"
    return safe


def register_resolver() -> None:
    """Register the ``specpolicy_run_name`` OmegaConf resolver used by ``hydra.run.dir``."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda dirname="": run_name(str(dirname or "")))


register_resolver()


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """12 hex digits identifying the settings that decide a prompt's results (``RESULT_KEYS``
    of the resolved config, the dataset's name, path and offset, and ``run.vanilla_baseline``)."""
    dataset = config.get("dataset") or {}
    relevant = {k: config.get(k) for k in RESULT_KEYS}
    relevant["dataset"] = {k: dataset.get(k) for k in ("name", "path", "offset")}
    relevant["vanilla_baseline"] = (config.get("run") or {}).get("vanilla_baseline")
    blob = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:12]


def results_path(config: Mapping[str, Any], run_dir: str | Path) -> Path | None:
    """Where the ``jsonl`` logger of this config writes (``logger.jsonl.file`` under the run
    directory), or None when the run has no ``jsonl`` logger (then nothing can be resumed)."""
    loggers = config.get("logger")
    if not isinstance(loggers, Mapping) or "jsonl" not in loggers:
        return None
    file = (loggers.get("jsonl") or {}).get("file") or RESULTS_FILE
    return Path(run_dir) / str(file)


def load_finished(path: Path | None, fingerprint: str, prompt_ids: set[str]) -> dict[str, PromptResult]:
    """Finished prompts of an earlier run of the same command: ``prompt_id -> PromptResult`` for the
    rows of ``path`` whose prompt is in ``prompt_ids``. The file is repaired first
    (``specpolicy.results.read_results(path, repair=True)``: corrupt lines quarantined, every valid
    row kept), so appending continues a clean file.

    Raises:
        ValueError: when a row was produced by other settings (its ``config_hash`` differs).
    """
    if path is None:
        return {}
    finished: dict[str, PromptResult] = {}
    for result in read_results(path, repair=True):
        if result.prompt_id not in prompt_ids:
            continue
        if result.config_hash and result.config_hash != fingerprint:
            raise ValueError(
                f"{path} holds results of other settings (config hash {result.config_hash} != {fingerprint}); "
                f"resume needs the same settings: pass run.resume=false to start over, or choose another "
                f"hydra.run.dir"
            )
        finished[result.prompt_id] = result
    return finished


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run (``signum``; exit status ``128 + signum``)."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signame = signal.Signals(self.signum).name
        super().__init__(f"interrupted by {self.signame}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``RunInterrupted`` (in the main thread; a
    no-op elsewhere). The previous handlers are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def shielded() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM are ignored (main thread only), e.g. while the partial
    summary is written after an interrupt; the previous handlers are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
