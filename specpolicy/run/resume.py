"""Resumable runs: the same command continues an interrupted run where it stopped.

* The run directory depends only on the command: ``hydra.run.dir`` is
  ``outputs/${specpolicy_run_name:${hydra.job.override_dirname}}`` (``run_name`` below: the
  command-line overrides, ``run.resume`` excluded, made a safe directory name; ``default``
  without overrides).
* ``results.jsonl`` (the ``jsonl`` logger) is the run's state: one line per finished prompt,
  carrying ``prompt_id``, ``output_ids``, every round and the vanilla baseline's figures, and
  the ``config_hash`` of the settings that produced it. With ``run.resume: true`` (default) a
  run reads it back (``load_finished``, through ``specpolicy.analysis.results.read_results``: every valid
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

from specpolicy.analysis.results import RESULTS_FILE, PromptResult, read_results

#: Config sections that decide a prompt's results (``config_hash``); logging, the latency
#: profile, the prompt count, warm-up and resume settings do not.
RESULT_KEYS = ("verifier", "drafter", "policy", "generation", "reuse", "runtime", "seed")
RESOLVER = "specpolicy_run_name"


#: Longest run directory name (characters; file systems allow 255 bytes).
MAX_NAME = 200
#: Characters a run directory name keeps as they are; the others are replaced (``_clean_value``).
SAFE_NAME = re.compile(r"[A-Za-z0-9._=,+@:%~\-]+")
#: How escapes and invisible characters in override values read in a directory name.
READABLE = (("\\n", "NL"), ("\\t", "TAB"), ("\\r", "CR"), ("\n", "NL"), ("\t", "TAB"), ("\r", "CR"))


def split_overrides(override_dirname: str) -> list[str]:
    """The overrides joined in Hydra's ``hydra.job.override_dirname`` (``key=value`` items joined
    by ``,``; commas inside brackets, braces or quotes belong to the value)."""
    parts, depth, quote, current = [], 0, "", ""
    for ch in override_dirname:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    parts.append(current)
    merged: list[str] = []
    for part in parts:  # a piece without "=" continues the previous value (a bare comma in it)
        if merged and "=" not in part:
            merged[-1] += "," + part
        else:
            merged.append(part)
    return merged


def _clean_value(value: str) -> str:
    """An override value as it reads in a directory name: quotes and brackets dropped, a path
    reduced to its last component (``/models/Qwen2.5-7B-Instruct`` -> ``Qwen2.5-7B-Instruct``),
    ``\\n`` / ``\\t`` / ``\\r`` written ``NL`` / ``TAB`` / ``CR``, any other character outside
    ``SAFE_NAME`` an ``_`` (runs of them one); ``empty`` when nothing is left."""
    value = re.sub(
        r"[^,\[\]{}()\s\"']*/[^,\[\]{}()\s\"']*", lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "root", value
    )
    for escape, word in READABLE:
        value = value.replace(escape, word)
    value = re.sub(r"[\"'\[\]{}()]", "", value)
    value = re.sub(r"[^A-Za-z0-9._=,+@:%~\-]+", "_", value)
    return value or "empty"


def _fit(items: list[tuple[str, str | None]], budget: int) -> str:
    """``key=value,...`` within ``budget`` characters: the longest values cut first (to 8
    characters at least, a ``~`` marking the cut), then the longest dotted keys abbreviated but
    their last part (``generation.max_new_tokens`` -> ``g.max_new_tokens``), one at a time; when
    even that is too long, the last overrides give way to ``+N`` (how many are left out). The hash
    the caller appends keeps the name unambiguous whatever was cut."""
    items = list(items)

    def joined(shown: list[tuple[str, str | None]]) -> str:
        return ",".join(f"{k}={v}" if v is not None else k for k, v in shown)

    while len(joined(items)) > budget:
        i = max(range(len(items)), key=lambda j: len(items[j][1] or ""))
        key, value = items[i]
        if value is None or len(value) <= 8:
            break
        items[i] = (key, value[: max(8, len(value) - (len(joined(items)) - budget)) - 1] + "~")
    while len(joined(items)) > budget:
        long = [j for j, (k, _) in enumerate(items) if any(len(part) > 1 for part in k.split(".")[:-1])]
        if not long:
            break
        i = max(long, key=lambda j: len(items[j][0]))
        parts = items[i][0].split(".")
        items[i] = (".".join([part[:1] for part in parts[:-1]] + parts[-1:]), items[i][1])
    for kept in range(len(items), 0, -1):
        text = joined(items[:kept]) + (f",+{len(items) - kept}" if kept < len(items) else "")
        if len(text) <= budget:
            return text
    return joined(items)[:budget]


def run_name(override_dirname: str) -> str:
    """A directory name for a command's overrides (Hydra's ``hydra.job.override_dirname``):
    ``default`` when there are none; the overrides themselves when they are a safe name
    (``SAFE_NAME``) of at most ``MAX_NAME`` characters; otherwise every override with its key in
    full and its value made readable (``_clean_value``: a path's last component, ``NL`` for
    ``\\n``, ...), shortened -- values first -- to fit, plus ``-`` and 8 hex digits of the
    overrides' hash, so that different commands never share a directory. The full overrides are in
    the run's ``.hydra/overrides.yaml`` (the report and the figures page show them)."""
    if not override_dirname:
        return "default"
    if (
        SAFE_NAME.fullmatch(override_dirname)
        and len(override_dirname) <= MAX_NAME
        and not override_dirname.startswith(".")
    ):
        return override_dirname
    digest = hashlib.sha1(override_dirname.encode("utf-8")).hexdigest()[:8]
    items = []
    for override in split_overrides(override_dirname):
        key, sep, value = override.partition("=")
        key = re.sub(r"[^A-Za-z0-9._+~\-]+", ".", key.replace("/", ".")).strip(".") or "key"
        items.append((key, _clean_value(value) if sep else None))
    return f"{_fit(items, MAX_NAME - len(digest) - 1).lstrip('.')}-{digest}"


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
    (``specpolicy.analysis.results.read_results(path, repair=True)``: corrupt lines quarantined, every valid
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


def complete_summary(
    config: Mapping[str, Any],
    prompt_ids: list[str],
    method: str,
    run_dir: str | Path,
    runtime: Callable[[], Mapping[str, Any]] | None = None,
) -> dict[str, Any] | None:
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
    from specpolicy.analysis.results import SUMMARY_FILE, read_summary
    from specpolicy.analysis.summary import summarize

    file = Path(run_dir) / SUMMARY_FILE
    summary = read_summary(file)
    if (
        summary is not None
        and summary.get("partial") is False
        and summary.get("method") == method
        and summary.get("prompts_total") == len(prompt_ids)
        and set(summary.get("per_prompt") or {}) | set(summary.get("skipped_prompts") or {}) == set(prompt_ids)
        and config_fingerprint(summary.get("config") or {}) == fingerprint
    ):
        return summary
    earlier = (summary or {}).get("timing_conditions")  # a partial summary's: the last span that was timed
    summary = summarize(
        method,
        [finished[p] for p in prompt_ids],
        config,
        runtime() if runtime else None,
        prompts_total=len(prompt_ids),
        timing_conditions=earlier,
    )
    file.write_text(json.dumps(summary, indent=2))
    return summary


def discard_unstarted(run_dir: str | Path) -> bool:
    """Remove a run directory the run never started in: one holding only what Hydra writes before
    the run (``.hydra/`` and the job's ``*.log``) -- a command that failed validation, before any
    model loaded or the run lock was taken. Never the working directory (``hydra.run.dir=.``) or
    one above it. A directory holding anything else (a ``run.lock``,
    ``results.jsonl``, ``summary.json``, a file of the user's) is left as it is. Returns whether it
    was removed."""
    import shutil

    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not (run_dir / ".hydra").is_dir():
        return False
    here = Path.cwd().resolve()
    if run_dir.resolve() == here or run_dir.resolve() in here.parents:  # never the working directory
        return False
    for entry in run_dir.iterdir():
        hydra_dir = entry.name == ".hydra" and entry.is_dir() and not entry.is_symlink()
        log = entry.suffix == ".log" and entry.is_file() and not entry.is_symlink()
        if not (hydra_dir or log):
            return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not run_dir.exists()


def complete_line(summary: Mapping[str, Any], run_dir: str | Path) -> str:
    """What a run with nothing left to compute prints (``complete_summary``): that it is complete,
    how to start over, and -- from the summary it wrote when it ran -- whether its timings can be
    trusted."""
    from specpolicy.analysis.machine import untrusted_reasons

    total = summary.get("prompts_total", summary.get("prompts"))
    line = (
        f"run complete: all {total} prompts of {run_dir} are in results.jsonl; nothing to compute, no model "
        f"loaded (run.resume=false starts over)"
    )
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
