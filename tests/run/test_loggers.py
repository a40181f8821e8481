"""Run loggers: the lifecycle hooks reach them, ``jsonl`` writes results.jsonl, ``wandb``
(offline, never the network) records the same summary as summary.json, groups multirun jobs,
and falls back to offline with one warning when the service does not answer."""

from __future__ import annotations

import http.server
import importlib.metadata
import json
import socket
import sys
import threading
import types

import pytest
from hydra import compose, initialize_config_module

from conftest import overrides
from specpolicy import hookimpl
from specpolicy.analysis.results import PromptResult
from specpolicy.core.policy import LengthPolicy
from specpolicy.run.experiment import run_experiment
from specpolicy.run.loggers import wandb as wandb_logger
from specpolicy.run.loggers.wandb_offline import find_offline_runs, read_offline_run

WANDB_ENV = (
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WANDB_MODE",
    "WANDB_ENTITY",
    "WANDB_PROJECT",
    "WANDB_RUN_GROUP",
    "WANDB_NAME",
    "WANDB_RUN_ID",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
)


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B confined to tmp_path, offline, no API key: nothing can reach the network."""
    for var in WANDB_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (
        ("WANDB_DIR", "wandb-runs"),
        ("WANDB_CACHE_DIR", "wandb-cache"),
        ("WANDB_DATA_DIR", "wandb-data"),
        ("WANDB_CONFIG_DIR", "wandb-config"),
        ("WANDB_ARTIFACT_DIR", "wandb-artifacts"),
    ):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path / "wandb-runs"


def _scalars(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.slow  # a multirun
def test_multirun_wandb_offline_runs_hold_the_summary_and_share_a_group(family, wandb_offline, tmp_path, monkeypatch):
    sweep_dir = tmp_path / "sweep"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "specpolicy",
            "-m",
            *overrides(family),
            "policy=failfast",
            "policy.tau=0.1,0.9",
            "+logger=wandb",
            f"hydra.sweep.dir={sweep_dir}",
        ],
    )
    from specpolicy.run.cli import main

    main()
    runs = [read_offline_run(p) for p in find_offline_runs(wandb_offline)]
    assert len(runs) == 2
    assert {r.group for r in runs} == {str(sweep_dir)}  # one W&B group per multirun
    assert len({r.name for r in runs}) == 2 and all("policy.tau=" in r.name for r in runs)
    for run in runs:
        assert run.complete  # on disk when the job ended
        job_dir = sweep_dir / run.config["run_dir"].rsplit("/", 1)[-1]
        summary = json.loads((job_dir / "summary.json").read_text())
        scalars = _scalars(summary)
        assert {"speedup_vs_vanilla", "tokens_per_s", "acceptance_rate", "lossless_fraction"} <= set(scalars)
        assert {k: run.summary[k] for k in scalars} == scalars  # the same numbers, bit for bit
        assert run.summary["methods"] == summary["methods"]
        assert run.config["policy"] == summary["config"]["policy"]
        rows = [json.loads(line) for line in (job_dir / "results.jsonl").read_text().splitlines()]
        rounds = [r for row in rows for r in row["rounds"]]
        steps = [h for h in run.history if "round/speculation_length" in h]
        assert [s["round/speculation_length"] for s in steps] == [r["speculation_length"] for r in rounds]
        assert [s["round/accepted_length"] for s in steps] == [r["accepted_length"] for r in rounds]
        assert all({"round/drafter_forward_passes", "round/draft_ms", "round/verify_ms"} <= set(s) for s in steps)
        assert any("prompts" in h for h in run.history)  # the per-prompt table
        assert run.artifacts["results"] == [f"results-{run.path.name.rsplit('-', 1)[-1]}"]
        copy = next(run.path.glob("files/results.jsonl")).read_text().splitlines()
        assert [json.loads(line) for line in copy] == rows


class _Server:
    """A local TCP server that accepts connections and never answers (a hung service)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("service", ["refused", "hung"])
def test_unreachable_service_falls_back_to_offline_with_one_warning(
    service, wandb_offline, tmp_path, monkeypatch, caplog
):
    server = _Server() if service == "hung" else None
    monkeypatch.delenv("WANDB_MODE")  # auto: an API key is configured, so W&B would go online
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", server.url if server else _closed_port_url())
    assert wandb_logger.resolve_mode("auto") == "online"
    import wandb

    modes, real_init = [], wandb.init

    def init(*args, **kwargs):
        modes.append(kwargs["mode"])
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    probes, real_reachable = [], wandb_logger.reachable

    def reachable(url, timeout_s):  # the probe's own bound: its thread is joined for timeout_s at most
        probes.append((timeout_s, real_reachable(url, timeout_s)))
        return probes[-1][1]

    monkeypatch.setattr(wandb_logger, "reachable", reachable)
    logger = wandb_logger.WandbLogger(mode="auto", probe_timeout_s=0.5, log_plots=False)  # figures: test_plot.py
    try:
        logger.specpolicy_run_start(config={"policy": {"name": "static"}}, run_dir=str(tmp_path))
    finally:
        if server:
            server.close()
    # the probe failed within its 0.5 s, so W&B never tried to start the run online (whose own
    # init timeout is 90 s): one offline start only
    assert probes == [(0.5, False)] and modes == ["offline"]
    assert logger.run is not None and logger.run.settings.mode == "offline"
    logger.specpolicy_prompt_end(
        result=PromptResult.from_row(
            {
                "prompt_id": "p",
                "prompt_tokens": 3,
                "output_ids": [4, 5],
                "rounds": [],
                "wall_s": 0.5,
                "finish_reason": "eos",
                "output_text": "hi",
            }
        )
    )
    logger.specpolicy_run_end(summary={"method": "ar+static", "speedup_vs_vanilla": 1.25}, run_dir=str(tmp_path))
    assert len(logger.warnings) == 1 and "unreachable" in logger.warnings[0]
    assert [r.message for r in caplog.records if r.name == wandb_logger.__name__] == logger.warnings
    (run,) = [read_offline_run(p) for p in find_offline_runs(wandb_offline)]
    assert run.complete and run.summary["speedup_vs_vanilla"] == 1.25


class _HangingService:
    """A local W&B look-alike bound to 127.0.0.1: answers the HTTP probe (HEAD), then accepts every
    other request and never answers it -- until ``close()`` or ``HANG_LIMIT_S`` (it stops itself)."""

    HANG_LIMIT_S = 60.0

    def __init__(self) -> None:
        stop = self.stop = threading.Event()
        self.posts: list[str] = []
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 - http.server's naming
                self.send_response(200)
                self.end_headers()

            def do_POST(self):  # noqa: N802
                posts.append(self.path)
                stop.wait(_HangingService.HANG_LIMIT_S)

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(self.HANG_LIMIT_S, self.close)
        self.timer.daemon = True
        self.timer.start()

    def close(self) -> None:
        self.stop.set()
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()


def test_a_service_that_answers_the_probe_then_hangs_costs_at_most_the_probe_timeout(
    wandb_offline, tmp_path, monkeypatch
):
    """The online start of the run gets what the probe left of probe_timeout_s (W&B's own default
    is 90 s; the old fixed 15 s made this fallback take ~17 s)."""
    import wandb

    service = _HangingService()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", service.url)
    timeouts = []
    real_init = wandb.init

    def init(*args, **kwargs):
        timeouts.append((kwargs["mode"], kwargs["settings"].init_timeout))
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    logger = wandb_logger.WandbLogger(mode="auto", probe_timeout_s=1.0, log_plots=False)
    try:
        logger.specpolicy_run_start(config={"policy": {"name": "static"}}, run_dir=str(tmp_path))
    finally:
        service.close()
    assert service.posts  # the service was really asked to start the run, and hung
    # the online start got what the probe left of the 1 s budget (not W&B's 90 s), then offline
    assert timeouts[0][0] == "online" and 0 < timeouts[0][1] <= 1.0
    assert [mode for mode, _ in timeouts] == ["online", "offline"]
    assert logger.run is not None and logger.run.settings.mode == "offline"
    (warning,) = logger.warnings
    assert warning.startswith(f"W&B service {service.url} did not start the run within 1 s (")
    assert "\n" not in warning and warning.endswith(
        "logging offline instead -- upload later with `wandb sync <run dir>/wandb/offline-run-*`"
    )
    logger.specpolicy_run_end(summary={"method": "ar+static"}, run_dir=str(tmp_path))


def test_resolve_mode(monkeypatch, tmp_path):
    for var in WANDB_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_logger.resolve_mode("auto") == "offline"  # no key anywhere
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert wandb_logger.resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_logger.resolve_mode("auto") == "offline"
    assert wandb_logger.resolve_mode("disabled") == "disabled"
    with pytest.raises(ValueError, match="logger.wandb.mode"):
        wandb_logger.resolve_mode("sometimes")
    with pytest.raises(ValueError, match=r"unknown logger.wandb key\(s\) \['projekt'\]"):
        wandb_logger.build(config={"projekt": "x"}, run_dir=str(tmp_path))


class _Boom(LengthPolicy):
    """Speculates 2 tokens; raises when the second prompt starts."""

    name = "boom"

    def __init__(self) -> None:
        self.prompts = 0

    def reset(self) -> None:
        self.prompts += 1
        if self.prompts == 2:
            raise RuntimeError("boom on prompt 2")

    def next_length(self, draft) -> int:
        return max(2 - draft.length, 0)


def test_lifecycle_hooks_in_order_and_abort_closes_the_loggers(family, tmp_path, monkeypatch):
    """A third-party plugin sees run_start, round_end* + prompt_end per prompt, then run_abort
    with the error; the jsonl logger has the finished prompt on disk; the error propagates."""
    events = []
    mod = types.ModuleType("fake_lifecycle_plugin")

    @hookimpl
    def specpolicy_make_policy(name, config):
        return _Boom() if name == "boom" else None

    @hookimpl
    def specpolicy_run_start(config, run_dir):
        events.append(("run_start", config["policy"]["name"]))

    @hookimpl
    def specpolicy_round_end(method, prompt_id, record):
        events.append(("round_end", prompt_id, record.speculation_length))

    @hookimpl
    def specpolicy_prompt_end(method, prompt_id, row):
        events.append(("prompt_end", prompt_id))

    @hookimpl
    def specpolicy_run_abort(error, run_dir):
        events.append(("run_abort", str(error)))

    for fn in (
        specpolicy_make_policy,
        specpolicy_run_start,
        specpolicy_round_end,
        specpolicy_prompt_end,
        specpolicy_run_abort,
    ):
        setattr(mod, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    dist = types.SimpleNamespace(
        metadata={"name": "lifecycle"},
        version="0",
        entry_points=[importlib.metadata.EntryPoint("lifecycle", mod.__name__, "specpolicy")],
    )
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: [dist])
    monkeypatch.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides(family))
    cfg.policy = {"name": "boom"}
    with pytest.raises(RuntimeError, match="boom on prompt 2"):
        run_experiment(cfg, tmp_path)
    assert events[0] == ("run_start", "boom")
    assert events[-1] == ("run_abort", "boom on prompt 2")
    assert events[-2][0] == "prompt_end"
    rounds = events[1:-2]
    assert rounds and all(e[0] == "round_end" and e[1] == events[-2][1] for e in rounds)
    assert rounds[0][2] == 2 and all(e[2] <= 2 for e in rounds)
    rows = (tmp_path / "results.jsonl").read_text().splitlines()  # the finished prompt, flushed and closed
    assert len(rows) == 1 and json.loads(rows[0])["prompt_id"] == events[-2][1]
    assert len(json.loads(rows[0])["rounds"]) == len(rounds)
    assert not (tmp_path / "summary.json").exists()


def test_summary_written_without_any_logger(family, tmp_path):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*overrides(family), "policy=static", "policy.k=3", "logger=[]"])
    summary = run_experiment(cfg, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["tokens_per_s"] == summary["tokens_per_s"]
    assert not (tmp_path / "results.jsonl").exists()
    assert summary["lossless_fraction"] == 1.0 and summary["acceptance_rate"] == 1.0  # target drafts for itself


def test_wandb_error_mid_run_warns_once_and_never_fails_the_run(wandb_offline, tmp_path, monkeypatch):
    from specpolicy.core.types import RoundRecord

    logger = wandb_logger.WandbLogger(mode="offline")
    logger.specpolicy_run_start(config={}, run_dir=str(tmp_path))
    run = logger.run

    def broken_log(*args, **kwargs):
        raise ConnectionError("service went away")

    monkeypatch.setattr(run, "log", broken_log)
    record = RoundRecord(
        index=0,
        speculation_length=3,
        accepted_length=2,
        emitted_tokens=3,
        drafter_forward_passes=3,
        reused_tokens=0,
        draft_ms=1.0,
        verify_ms=2.0,
    )
    result = PromptResult.from_row(
        {
            "prompt_id": "p",
            "prompt_tokens": 3,
            "output_ids": [1, 2, 3],
            "rounds": [],
            "wall_s": 0.1,
            "finish_reason": "eos",
            "output_text": "x",
        }
    )
    for _ in range(2):
        logger.specpolicy_round_end(record=record)
        logger.specpolicy_round_end(record=record)
        logger.specpolicy_prompt_end(result=result)
    logger.specpolicy_run_end(summary={"method": "m"}, run_dir=str(tmp_path))
    logger.specpolicy_run_abort()
    assert len(logger.warnings) == 1 and "service went away" in logger.warnings[0]
    assert logger.run is None
    where = logger.specpolicy_run_outputs()  # what the CLI prints under results:
    assert (
        where[0] == "W&B: logging stopped early (log failed: ConnectionError; see the warning above); the run so far:"
    )
    assert where[1].startswith("W&B: offline run ") and where[2].startswith("upload: wandb sync ")


def test_the_cli_says_where_the_wandb_run_went_and_how_to_upload_it(
    family, wandb_offline, tmp_path, monkeypatch, capsys
):
    """Issue 22: with +logger=wandb the results: line listed only summary.json and results.jsonl."""
    from specpolicy.run.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "specpolicy",
            *overrides(family),
            "dataset.num_prompts=1",
            "+logger=wandb",
            "logger.wandb.log_plots=false",
            "hydra.run.dir=outputs/w",
        ],
    )
    main()
    out = capsys.readouterr().out.splitlines()
    start = out.index("results: outputs/w/ (summary.json, results.jsonl)")
    (offline,) = find_offline_runs(wandb_offline)
    directory = offline.relative_to(tmp_path).as_posix()
    assert out[start + 1 : start + 4] == [
        f"W&B:     offline run {directory}/ (not uploaded)",
        f"upload:  wandb sync {directory}",
        "next:    python -m specpolicy.analysis.report outputs/w",
    ]
    assert read_offline_run(offline).complete  # what `wandb sync` uploads is there
    # mode disabled: said so, nothing else
    monkeypatch.setattr(sys, "argv", [*sys.argv[:-1], "logger.wandb.mode=disabled", "hydra.run.dir=outputs/off"])
    main()
    out = capsys.readouterr().out.splitlines()
    start = out.index("results: outputs/off/ (summary.json, results.jsonl)")
    assert out[start + 1] == "W&B:     nothing logged (logger.wandb.mode or WANDB_MODE is disabled)"
