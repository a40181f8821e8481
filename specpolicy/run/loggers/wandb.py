"""``wandb`` logger: Weights & Biases tracking of a run.

What is logged: the resolved run config; every verified round (``round/speculation_length``,
``round/accepted_length``, ``round/emitted_tokens``, ``round/drafter_forward_passes``,
``round/reused_tokens``, ``round/draft_ms``, ``round/verify_ms``, with ``round/prompt_index``);
a per-prompt table (``prompts``, figures from ``specpolicy.analysis.metrics.prompt_values``); the summary
(every ``summary.json`` key but ``config``) as the run summary; ``results.jsonl`` + ``summary.json``
as an artifact of type ``results``; and, with ``log_plots``, the run's figures and trajectory
pages, made by ``python -m specpolicy.analysis.plot`` in a child process (matplotlib stays out of the run's
process, and a plotting failure is a warning). Jobs of one Hydra multirun share a W&B group (the
sweep directory).

Modes: ``mode: auto`` (default) uses ``$WANDB_MODE`` when set, else ``online`` when an API key
is configured (``$WANDB_API_KEY`` or a ``~/.netrc`` entry for the W&B host), else ``offline``.
An online run falls back to offline with one warning when the service does not answer within
``probe_timeout_s`` seconds -- one budget for the HTTP probe and the start of the run online
(``wandb.Settings(init_timeout=...)`` gets what the probe left), so a service that accepts
connections and never answers, or answers the probe and then hangs, costs at most that -- or
when ``wandb.init`` fails; a W&B error later in the run is logged once and disables the logger. The run itself never fails or waits because of W&B.

Timing: ``round_end`` is called inside the timed decoding loop, so it only appends the record
to a list; the W&B calls happen at ``prompt_end``, outside the measured wall-clock time.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from specpolicy.analysis.metrics import prompt_values
from specpolicy.analysis.results import RESULTS_FILE, SUMMARY_FILE, PromptResult
from specpolicy.core.errors import ConfigError
from specpolicy.core.types import RoundRecord
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.run.validation import check_init

NAME = "wandb"
DEFAULT_BASE_URL = "https://api.wandb.ai"
MODES = ("auto", "online", "offline", "disabled")
#: Least seconds given to ``wandb.init`` online after the probe used most of ``probe_timeout_s``.
MIN_INIT_S = 0.5
#: Seconds ``wandb.init`` may take offline (no server involved: starting W&B's local service).
OFFLINE_INIT_S = 60.0
CONFIG_KEYS = (
    "project",
    "entity",
    "mode",
    "group",
    "name",
    "tags",
    "dir",
    "log_rounds",
    "probe_timeout_s",
    "log_plots",
)
log = logging.getLogger(__name__)

#: ``RoundRecord`` fields logged per round (``round/<field>``).
ROUND_FIELDS = (
    "speculation_length",
    "accepted_length",
    "emitted_tokens",
    "drafter_forward_passes",
    "reused_tokens",
    "draft_ms",
    "verify_ms",
)
#: Columns of the per-prompt table.
TABLE_COLUMNS = (
    "prompt_id",
    "prompt_tokens",
    "generated_tokens",
    "rounds",
    "acceptance_rate",
    "mean_accepted_length",
    "wall_s",
    "tokens_per_s",
    "vanilla_wall_s",
    "speedup_vs_vanilla",
    "lossless",
    "first_difference",
    "finish_reason",
    "output_text",
)
#: Seconds the figures (``python -m specpolicy.analysis.plot``) may take before they are skipped.
PLOT_TIMEOUT_S = 300.0


def base_url() -> str:
    """The W&B service URL: ``$WANDB_BASE_URL`` or https://api.wandb.ai."""
    return os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL


def api_key_configured(url: str | None = None) -> bool:
    """True when ``$WANDB_API_KEY`` is set or ``~/.netrc`` (``$NETRC``) has an entry for the
    host of ``url`` (default ``base_url()``). Never contacts the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(url or base_url()).hostname or ""
    try:
        auth = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def reachable(url: str, timeout_s: float) -> bool:
    """Whether the W&B service at ``url`` answers an HTTP HEAD request within ``timeout_s``
    seconds (any HTTP status counts as an answer). Name resolution, connection and response
    are all bounded: the probe runs in a daemon thread that is abandoned at the deadline."""
    import urllib.error
    import urllib.request

    ok = threading.Event()

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
                ok.set()
        except urllib.error.HTTPError:  # the server answered (401, 404, ...): reachable
            ok.set()
        except (OSError, ValueError):  # refused, DNS failure, timeout, malformed URL
            pass

    thread = threading.Thread(target=probe, daemon=True, name="specpolicy-wandb-probe")
    thread.start()
    thread.join(timeout_s)
    return ok.is_set()


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (W&B errors span several lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def resolve_mode(mode: str) -> str:
    """``online``/``offline``/``disabled`` for a configured ``mode`` (see module docstring).

    Raises:
        ValueError: naming ``logger.wandb.mode`` for a value outside auto/online/offline/disabled.
    """
    if mode not in MODES:
        raise ValueError(f"logger.wandb.mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env:
        return {"dryrun": "offline", "run": "online", "shared": "online"}.get(env, env)
    return "online" if api_key_configured() else "offline"


def _hydra_job() -> tuple[str | None, str | None]:
    """(group, name) from the Hydra job: the sweep dir in a multirun, the job's overrides."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return None, None
        hc = HydraConfig.get()
        group = str(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
        name = str(hc.job.override_dirname) or None
        if hc.mode == RunMode.MULTIRUN:
            name = f"{hc.job.num}:{name}" if name else f"job-{hc.job.num}"
        return group, name
    except Exception:  # noqa: BLE001 - naming is cosmetic; never fail a run for it
        return None, None


def where_lines(run) -> list[str]:
    """Where a W&B run went, for the lines under the CLI's ``results:`` line: an offline run's
    directory and the command that uploads it (``wandb sync <dir>``), or an online run's URL."""
    from specpolicy.run.messages import shown

    if run.settings.mode == "offline":
        directory = shown(run.settings.sync_dir)
        return [f"W&B: offline run {directory}/ (not uploaded)", f"upload: wandb sync {directory}"]
    url = getattr(run, "url", None)
    return [f"W&B: {url}" if url else f"W&B: run {run.id} of project {run.project} (online)"]


def _prompt_row(result: PromptResult) -> list[Any]:
    """One row of the per-prompt table (``TABLE_COLUMNS``)."""
    values = prompt_values(result.speculative, result.vanilla)
    values.update(
        prompt_id=result.prompt_id,
        prompt_tokens=result.prompt_tokens,
        vanilla_wall_s=result.vanilla.wall_s if result.vanilla is not None else None,
        lossless=result.lossless,
        first_difference=result.first_difference,
        finish_reason=result.speculative.finish_reason,
        output_text=result.output_text,
    )
    return [values.get(c) for c in TABLE_COLUMNS]


class WandbLogger:
    """Logs one specpolicy run to Weights & Biases (see the module docstring).

    Args:
        project / entity / group / name / tags: W&B run fields (``group``/``name`` None: from
            the Hydra job, see ``conf/logger/wandb.yaml``).
        mode: auto | online | offline | disabled.
        dir: directory for W&B's files (None: ``$WANDB_DIR``, else the run directory).
        log_rounds: log one W&B step per verified round.
        log_plots: at the end, log the paper's figures of the run (``specpolicy.analysis.plot``: length
            CDFs, latency breakdown, acceptance over rounds as images; trajectory pages as HTML).
        probe_timeout_s: seconds to wait for the service before falling back to offline.
    """

    def __init__(
        self,
        *,
        project: str = "specpolicy",
        entity: str | None = None,
        mode: str = "auto",
        group: str | None = None,
        name: str | None = None,
        tags: list[str] | tuple[str, ...] = (),
        dir: str | None = None,
        log_rounds: bool = True,
        probe_timeout_s: float = 3.0,
        log_plots: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"logger.wandb.mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not probe_timeout_s > 0:
            raise ValueError(f"logger.wandb.probe_timeout_s must be > 0 seconds, got {probe_timeout_s!r}")
        self.project, self.entity, self.mode = project, entity, mode
        self.group, self.name, self.tags = group, name, list(tags or ())
        self.dir, self.log_rounds, self.probe_timeout_s = dir, bool(log_rounds), float(probe_timeout_s)
        self.log_plots = bool(log_plots)
        self.run = None
        # what specpolicy_run_outputs says: where the W&B run is, why nothing was logged, why logging stopped
        self.location: list[str] = []
        self.off: str | None = None
        self.stopped: str | None = None
        self.warnings: list[str] = []
        self._rounds: list[RoundRecord] = []  # of the current prompt
        self._results: list[PromptResult] = []
        self._prompt_index = 0

    # -- helpers -------------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning(message)

    def _guard(self, what: str, fn, *args, **kwargs) -> Any:
        """Call a W&B function; on error warn once, finish the run quietly and disable logging."""
        if self.run is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - W&B must never fail the run
            self._warn(f"W&B {what} failed ({exc!r}); W&B logging is off for the rest of this run")
            self.stopped = f"{what} failed: {type(exc).__name__}"
            run, self.run = self.run, None
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001
                pass
            return None

    def _init(self, wandb, mode: str, config: dict[str, Any], run_dir: str, init_timeout: float = OFFLINE_INIT_S):
        """``wandb.init``; ``init_timeout`` bounds the wait for the service to start the run (online:
        what is left of ``probe_timeout_s`` after the probe)."""
        group, name = _hydra_job()
        wandb_dir = Path(self.dir or os.environ.get("WANDB_DIR") or run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group or group,
            name=self.name or name,
            tags=self.tags or None,
            dir=str(wandb_dir),
            mode=mode,
            config={**config, "run_dir": str(run_dir)},
            reinit="finish_previous",
            settings=wandb.Settings(console="off", init_timeout=init_timeout, silent=True, base_url=base_url()),
        )

    def _log_plots(self, run, summary: dict[str, Any], run_dir: str) -> None:
        """Write the run's figures to ``<run dir>/plots`` with ``python -m specpolicy.analysis.plot`` (a child
        process, at most ``PLOT_TIMEOUT_S`` seconds) and log the PNGs as ``plots/<name>`` images and
        up to 8 trajectory pages as ``trajectories/<prompt>`` HTML. A plotting failure (e.g.
        matplotlib missing) warns and leaves the W&B run as it is."""
        out = Path(run_dir) / "plots"
        try:
            import wandb

            with tempfile.TemporaryDirectory(prefix="specpolicy-wandb-plots-") as tmp:
                with open(Path(tmp) / RESULTS_FILE, "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(r.to_row()) + "\n" for r in self._results)
                (Path(tmp) / SUMMARY_FILE).write_text(json.dumps(summary), encoding="utf-8")
                proc = subprocess.run(
                    [sys.executable, "-m", "specpolicy.analysis.plot", tmp, "--out", str(out), "--max-pages", "8"],
                    capture_output=True,
                    text=True,
                    timeout=PLOT_TIMEOUT_S,
                )
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise RuntimeError(f"python -m specpolicy.analysis.plot exited with {proc.returncode}: {last}")
            media = {f"plots/{f.stem}": wandb.Image(str(f)) for f in sorted(out.glob("*.png"))}
            media.update(
                {
                    f"trajectories/{f.stem}": wandb.Html(f.read_text(encoding="utf-8"))
                    for f in sorted(out.glob("trajectories/*/*.html"))
                }
            )
        except Exception as exc:  # noqa: BLE001 - figures are a bonus, never a failure
            self._warn(f"W&B plots skipped ({exc!r})")
            return
        self._guard("log", run.log, media)

    # -- lifecycle hooks -------------------------------------------------------------------

    @hookimpl
    def specpolicy_run_start(self, config: dict[str, Any], run_dir: str) -> None:
        import wandb

        self._rounds, self._results, self._prompt_index = [], [], 0
        self.location, self.off, self.stopped = [], None, None
        mode = resolve_mode(self.mode)
        if mode == "disabled":
            self.off = "logger.wandb.mode or WANDB_MODE is disabled"
            return
        # One budget, probe_timeout_s, for everything that waits on the service: the probe, then the
        # start of the run online. A service that accepts connections but never answers, or answers
        # the probe and then hangs, costs at most that much before the run logs offline.
        deadline = time.monotonic() + self.probe_timeout_s
        if mode == "online" and not reachable(base_url(), self.probe_timeout_s):
            self._warn(
                f"W&B service {base_url()} is unreachable (no answer within {self.probe_timeout_s:g} s); "
                "logging offline instead -- upload later with `wandb sync <run dir>/wandb/offline-run-*`"
            )
            mode = "offline"
        try:
            budget = max(deadline - time.monotonic(), MIN_INIT_S) if mode == "online" else OFFLINE_INIT_S
            self.run = self._init(wandb, mode, config, run_dir, budget)
        except Exception as exc:  # noqa: BLE001
            reason = _first_line(exc)
            if mode != "online":
                self._warn(f"W&B init failed ({reason}); W&B logging is off for this run")
                self.off = f"init failed: {reason}"
                return
            self._warn(
                f"W&B service {base_url()} did not start the run within {self.probe_timeout_s:g} s "
                f"({reason}); logging offline instead -- upload later with "
                "`wandb sync <run dir>/wandb/offline-run-*`"
            )
            try:
                self.run = self._init(wandb, "offline", config, run_dir)
            except Exception as exc2:  # noqa: BLE001
                self._warn(f"W&B offline init failed too ({_first_line(exc2)}); W&B logging is off for this run")
                self.off = f"init failed: {_first_line(exc2)}"
                self.run = None
        if self.run is not None:
            self.location = where_lines(self.run)

    @hookimpl
    def specpolicy_round_end(self, record: RoundRecord) -> None:
        if self.log_rounds and self.run is not None:  # inside the timed loop: append only
            self._rounds.append(record)

    @hookimpl
    def specpolicy_prompt_end(self, result: PromptResult) -> None:
        if result.skipped:  # a prompt over the context: recorded in results.jsonl, never decoded
            return
        rounds, self._rounds = self._rounds, []
        self._results.append(result)
        index = self._prompt_index
        self._prompt_index += 1
        for record in rounds:
            if self.run is None:
                return
            metrics = {f"round/{f}": getattr(record, f) for f in ROUND_FIELDS}
            metrics["round/prompt_index"] = index
            self._guard("log", self.run.log, metrics)

    @hookimpl(trylast=True)  # after the jsonl logger closed results.jsonl
    def specpolicy_run_end(self, summary: dict[str, Any], run_dir: str) -> None:
        if self.run is None:
            return
        import wandb

        run = self.run
        table = self._guard(
            "table", wandb.Table, columns=list(TABLE_COLUMNS), data=[_prompt_row(r) for r in self._results]
        )
        if table is not None:
            self._guard("log", run.log, {"prompts": table})
        self._guard("summary", run.summary.update, {k: v for k, v in summary.items() if k != "config"})
        if self.run is not None and self.log_plots:
            self._log_plots(run, summary, run_dir)
        if self.run is not None:
            files_dir = Path(run.dir)
            results = files_dir / RESULTS_FILE
            with open(results, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r.to_row()) + "\n" for r in self._results)
            artifact = self._guard(
                "artifact",
                wandb.Artifact,
                name=f"results-{run.id}",
                type="results",
                metadata={k: v for k, v in summary.items() if isinstance(v, (int, float, str))},
            )
            if artifact is not None:
                self._guard("artifact", artifact.add_file, str(results), name=RESULTS_FILE)
                summary_file = Path(run_dir) / SUMMARY_FILE
                if summary_file.exists():
                    self._guard("artifact", artifact.add_file, str(summary_file), name=SUMMARY_FILE)
                self._guard("artifact", run.log_artifact, artifact)
        offline_log = getattr(run.settings, "sync_file", None) if run.settings.mode == "offline" else None
        self._guard("finish", run.finish)
        self.run = None
        if offline_log:  # wandb writes the offline log asynchronously: have it on disk when the run ends
            from specpolicy.run.loggers.wandb_offline import wait_until_complete

            try:
                if not wait_until_complete(offline_log, timeout_s=10.0).complete:
                    self._warn(f"W&B offline run log {offline_log} still incomplete after 10 s")
            except Exception as exc:  # noqa: BLE001
                self._warn(f"W&B offline run log {offline_log} unreadable ({exc!r})")

    @hookimpl
    def specpolicy_run_outputs(self) -> list[str] | None:
        """Where the W&B run went (``where_lines``: an offline run's directory and the ``wandb sync``
        command, or the URL), whether logging stopped early, or why nothing was logged."""
        if self.off:
            return [f"W&B: nothing logged ({self.off})"]
        if self.stopped:
            return [
                f"W&B: logging stopped early ({self.stopped}; see the warning above); the run so far:",
                *self.location,
            ]
        return self.location or None

    @hookimpl
    def specpolicy_run_abort(self) -> None:
        if self.run is not None:
            self._guard("finish", self.run.finish, exit_code=1)
            self.run = None


def validate(config: dict[str, Any]) -> None:
    """``logger=wandb``: wandb installed, known keys, ``mode`` and ``probe_timeout_s`` (by building
    the logger: nothing is contacted)."""
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise ConfigError('logger=wandb needs the wandb package: pip install "specpolicy[wandb]"') from exc
    check_init("logger.wandb", WandbLogger, config)


def build(config: dict[str, Any], run_dir: str) -> WandbLogger:
    """Factory for ``logger=wandb``. Config keys: ``project``, ``entity``, ``mode``, ``group``,
    ``name``, ``tags``, ``dir``, ``log_rounds``, ``probe_timeout_s`` (conf/logger/wandb.yaml).

    Raises:
        ImportError: when wandb is not installed (``pip install "specpolicy[wandb]"``).
        ValueError: for an unknown key, an invalid ``mode`` or ``probe_timeout_s``.
    """
    try:
        import wandb  # noqa: F401 - fail before any model is loaded
    except ImportError as exc:
        raise ImportError('logger=wandb needs the wandb package: pip install "specpolicy[wandb]"') from exc
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown logger.wandb key(s) {unknown}; known: {', '.join(CONFIG_KEYS)}")
    return WandbLogger(**config)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``logger=wandb`` (``build``, checked by ``validate``)."""
    return [PluginEntry("logger", NAME, build, validate, "Weights & Biases tracking of a run")]
