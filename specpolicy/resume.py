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
from collections.abc import Callable, Iterator, Mapping
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


def complete_summary(config: Mapping[str, Any], prompt_ids: list[str], method: str, run_dir: str | Path,
                     runtime: Callable[[], Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """The summary of a run that has nothing left to compute, or None when it has.

    With ``run.resume`` on and every prompt of ``prompt_ids`` already in ``results.jsonl``
    (``load_finished``; prompts skipped as too long included), the same command would load the
    models only to read everything back. Then: the run's ``summary.json`` when it is that run's
    complete summary (not partial, the same method, settings and prompts); else (killed between
    its last prompt and its summary, or a partial summary) a summary computed from the rows alone,
    written to ``summary.json``, whose ``timing_conditions`` are the partial summary's (the last
    span that was timed; none without one): nothing is timed now.
    ``runtime``: gives ``Runtime.describe()`` for a computed summary (called only then).

    Raises:
        ValueError: as ``load_finished``, for rows of other settings.
    """
    if not (config.get("run") or {}).get("resume", False):
        return None
    fingerprint = config_fingerprint(config)
    finished = load_finished(results_path(config, run_dir), fingerprint, set(prompt_ids))
    if len(finished) < len(prompt_ids):
        return None
    from specpolicy.results import SUMMARY_FILE, read_summary
    from specpolicy.summary import summarize

    file = Path(run_dir) / SUMMARY_FILE
    summary = read_summary(file)
    if summary is not None and summary.get("partial") is False and summary.get("method") == method \
            and summary.get("prompts_total") == len(prompt_ids) \
            and set(summary.get("per_prompt") or {}) | set(summary.get("skipped_prompts") or {}) == set(prompt_ids) \
            and config_fingerprint(summary.get("config") or {}) == fingerprint:
        return summary
    earlier = (summary or {}).get("timing_conditions")  # a partial summary's: the last span that was timed
    summary = summarize(method, [finished[p] for p in prompt_ids], config, runtime() if runtime else None,
                        prompts_total=len(prompt_ids), timing_conditions=earlier)
    file.write_text(json.dumps(summary, indent=2))
    return summary


def complete_line(summary: Mapping[str, Any], run_dir: str | Path) -> str:
    """What a run with nothing left to compute prints (``complete_summary``): that it is complete,
    how to start over, and -- from the summary it wrote when it ran -- whether its timings can be
    trusted."""
    from specpolicy.machine import untrusted_reasons

    total = summary.get("prompts_total", summary.get("prompts"))
    line = (f"run complete: all {total} prompts of {run_dir} are in results.jsonl; nothing to compute, no model "
            f"loaded (run.resume=false starts over)")
    reasons = untrusted_reasons(summary)
    if reasons:
        line += f"; when it ran, its timings could not be trusted: {'; '.join(reasons)}"
    return line


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
