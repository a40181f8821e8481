"""Every command shown in the documentation is run (issue 22: "a documented command cannot
silently stop working again"; issue 30: the rule moved with the README's guides into ``docs/``).

The commands are read from ``README.md`` and every page under ``docs/`` (``DOCUMENTS``): every line
of their fenced ``bash`` blocks (continued lines joined, ``a && b`` as two commands, comments
dropped), every ``$ command`` of their ``text`` blocks with the output printed under it, and every
inline code span that starts with ``python -m specpolicy`` or ``python benchmarks/`` (HTML comments
are not shown, so not read). A command shown on several pages is run once, where it is first shown.
Each command is handled by the first rule of ``RULES`` whose pattern matches
``"<kind>: <command>"``:

* a run, shortened (``SHORT``: 1 prompt, 8 new tokens, no warm-up), of the real command line in
  this process (``specpolicy.run.cli.main``), where the run itself is what is documented (the main
  job, stop strings, resuming, W&B);
* a dry run: the same command line through the CLI -- Hydra's composition, every job of a sweep
  expanded and checked by the sweep preflight -- with ``run_experiment`` replaced by the check
  every run does before it loads a model (``specpolicy.run.validation.validate_config``), where a
  full run adds nothing to composing the command;
* a transcript: the command is run and must print exactly the lines the page shows;
* the readers (``report``, ``plot``, ``oracle``, ``paper_figures``) on real run and sweep
  directories made here by the tiny family (placeholders such as ``outputs/<run>`` and
  ``multirun/<date>/<time>`` point at them);
* benchmarks shortened (1 prompt, 8 tokens, the tiny family), or their arguments parsed by the
  script's own parser where a run takes hours (training) and another test runs it shortened;
* skipped, with the reason, where the command needs a cluster, would run this suite itself, or is
  run by another test.

``test_every_documented_command_has_a_rule`` fails when a documented command matches no rule (a new
documented command cannot go untested), naming its file and line, and when a rule matches no
command (a stale rule).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from conftest import load_benchmark, overrides

ROOT = Path(__file__).resolve().parents[2]
#: The documents whose commands are run: the README, then every page of the docs site.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: Appended to a command that is run: 1 prompt, 8 new tokens, no untimed warm-up prompt.
SHORT = ["dataset.num_prompts=1", "generation.max_new_tokens=8", "run.warmup_prompts=0"]
#: What inline code spans are commands (the others name keys, files, ...).
INLINE = re.compile(r"^(python -m specpolicy|python benchmarks/)")


# -- the commands of the documents ---------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One documented command: ``kind`` (``bash``: a fenced bash block's line; ``transcript``: a
    ``$ ...`` line of a text block, ``expected`` the lines printed under it; ``inline``: a code span
    in the prose), the command as written (one line), the document it is shown in (``source``, a
    path relative to the repository) and its line there."""

    kind: str
    text: str
    line: int
    expected: tuple[str, ...] = ()
    source: str = "README.md"

    @property
    def key(self) -> str:
        return f"{self.kind}: {self.text}"

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _split_and(line: str) -> list[str]:
    parts, quote, current, i = [], "", "", 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif line.startswith("&&", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        current += ch
        i += 1
    return [p.strip() for p in [*parts, current] if p.strip()]


def _hide_html_comments(text: str) -> str:
    """``<!-- ... -->`` blanked out (line breaks kept, so line numbers hold): not shown to a reader."""
    return re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def doc_commands(text: str, source: str = "README.md") -> list[Command]:
    """Every command of one document's text (see the module docstring), in document order; an
    inline span that repeats a fenced command is that command."""
    lines = _hide_html_comments(text).splitlines()
    found: list[Command] = []
    prose: list[str] = []
    fence: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fence = line.lstrip()[3:].strip() if fence is None else None
            prose.append("")
            i += 1
            continue
        if fence is None:
            prose.append(line)
            i += 1
            continue
        prose.append("")
        line = line.strip()
        if fence == "bash":
            first = i
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                prose.append("")
                line = line[:-1] + " " + lines[i].strip()
            for part in _split_and(_strip_comment(line)):
                found.append(Command("bash", " ".join(part.split()), first + 1, source=source))
        elif fence == "text" and line.startswith("$ "):
            expected, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(("$ ", "```")):
                expected.append(lines[j])
                j += 1
            found.append(Command("transcript", line[2:].strip(), i + 1, tuple(expected), source))
        i += 1
    fenced = {c.text for c in found}
    body = "\n".join(prose)
    for match in re.finditer(r"`([^`]+)`", body):
        span = " ".join(match.group(1).split())
        if INLINE.match(span) and span not in fenced:
            found.append(Command("inline", span, body.count("\n", 0, match.start()) + 1, source=source))
    unique: dict[tuple[str, tuple[str, ...]], Command] = {}
    for command in found:
        unique.setdefault((command.key, command.expected), command)
    return list(unique.values())


def documented_commands(documents: list[Path]) -> list[Command]:
    """The commands of every document, each once: where it is first shown (README first), in
    whichever form (a fenced line there, a code span on a later page)."""
    unique: dict[tuple[str, tuple[str, ...]], Command] = {}
    for path in documents:
        for command in doc_commands(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()):
            unique.setdefault((command.text, command.expected), command)
    return list(unique.values())


COMMANDS = documented_commands(DOCUMENTS)


# -- what the commands run on ------------------------------------------------------------------------------


@dataclass
class World:
    """Directories the commands read: the tiny model family, a sweep of static-k AR runs and a sweep
    of FailFast runs over τ (made by the CLI, shortened), stand-ins for model directories."""

    root: Path
    family: dict[str, Path]
    static: Path = field(init=False)
    tau: Path = field(init=False)

    @property
    def run(self) -> Path:
        """A run directory (``outputs/<run>``, ``DIR``)."""
        return self.static / "0"

    def tiny(self, drafter: str = "drafter") -> list[str]:
        """Overrides running on the tiny family (float64 on CPU, the AR drafter), shortened."""
        return [o for o in overrides(self.family, drafter) if not o.startswith("dataset.num_prompts")] + [
            "dataset.num_prompts=1"
        ]


@pytest.fixture(scope="module")
def world(family, tmp_path_factory) -> World:
    from specpolicy.run.cli import main

    w = World(tmp_path_factory.mktemp("readme"), family)
    w.static, w.tau = w.root / "sweeps" / "static-k-ar", w.root / "sweeps" / "tau"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(w.root)
        mp.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
        for directory, sweep in (
            (w.static, ["policy=static", "policy.k=2,4"]),
            (w.tau, ["policy=failfast", "policy.n=2", "policy.tau=0.3,0.6"]),
        ):
            mp.setattr(sys, "argv", ["specpolicy", "-m", *w.tiny(), *sweep, f"hydra.sweep.dir={directory}"])
            main()
    models = w.root / "models"  # the README's /models/... stand in for local model directories
    models.mkdir()
    (models / "Qwen2.5-7B-Instruct").symlink_to(family["target"])
    (models / "Fast_dLLM_v2_1.5B").symlink_to(family["drafter"])
    for name in ("Qwen3-8B", "Llama-3.1-8B-Instruct"):  # targets of the official DFlash / EAGLE-3 examples
        (models / name).symlink_to(family["target"])
    (models / "Qwen3-8B-DFlash-b16").symlink_to(family["dflash"])
    (models / "qwen7b-dflash").symlink_to(family["dflash"])  # a train_drafter --init checkpoint of the 7B stand-in
    (models / "EAGLE3-LLaMA3.1-8B").symlink_to(family["eagle3"])
    return w


class SweepChecked(SystemExit):
    """A dry sweep's every job was composed and checked: stop before launching (Hydra turns other
    exceptions of a callback into warnings and goes on)."""

    def __init__(self, jobs: int) -> None:
        super().__init__(0)
        self.jobs = jobs


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    checked: list[dict]  # the configs a dry run validated, one per job


class Harness:
    """Runs command lines in this process, in a fresh working directory."""

    def __init__(self, world: World, monkeypatch, capsys, tmp_path: Path) -> None:
        self.world, self.mp, self.capsys, self.cwd = world, monkeypatch, capsys, tmp_path
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")

    def cli(self, args: list[str], dry: bool = False) -> Outcome:
        """``python -m specpolicy ARGS``. ``dry``: a run's config is checked as every run checks it
        before loading a model (``validate_config``) and nothing is run; a sweep stops once the sweep
        preflight has composed and checked every job, before the first is launched."""
        from omegaconf import OmegaConf

        import specpolicy.run.cli as cli
        import specpolicy.run.validation as validation
        from specpolicy.plugins.manager import get_plugin_manager
        from specpolicy.run.preflight import SweepPreflight

        checked: list[dict] = []
        validate = validation.validate_config

        def recorded(container, pm):  # what the run, or the sweep preflight for each job, checks
            checked.append(container)
            return validate(container, pm)

        def validate_only(cfg, run_dir, outputs=None):
            recorded(OmegaConf.to_container(cfg, resolve=True), get_plugin_manager(block=list(cfg.plugins.block)))
            return {"speedup_vs_vanilla": 1.0, "lossless_fraction": 1.0}

        preflight = SweepPreflight.on_multirun_start

        def check_every_job_then_stop(callback, config, **kwargs):
            preflight(callback, config, **kwargs)  # SweepRejected for a bad job, as in a real sweep
            raise SweepChecked(len(checked))

        self.capsys.readouterr()
        self.mp.setattr(sys, "argv", ["specpolicy", *args])
        code = 0
        with pytest.MonkeyPatch.context() as local:
            if dry:
                local.setattr(validation, "validate_config", recorded)
                local.setattr(cli, "run_experiment", validate_only)
                local.setattr(SweepPreflight, "on_multirun_start", check_every_job_then_stop)
            try:
                cli.main()
            except SweepChecked:
                code = 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        captured = self.capsys.readouterr()
        return Outcome(code, captured.out, captured.err, checked)

    def main(self, module_main: Callable, args: list[str]) -> tuple[int, str]:
        """A reader's ``main(argv)``; its status and what it printed."""
        self.capsys.readouterr()
        try:
            code = module_main(args)
        except SystemExit as done:
            code = done.code
        return int(code or 0), self.capsys.readouterr().out


@pytest.fixture
def harness(world, monkeypatch, capsys, tmp_path) -> Harness:
    return Harness(world, monkeypatch, capsys, tmp_path)


def _args(command: Command, prefix: str) -> list[str]:
    """The arguments after ``prefix`` (``python -m specpolicy``, ``python benchmarks/x.py``)."""
    assert command.text.startswith(prefix), command.text
    return shlex.split(command.text[len(prefix) :])


def _results_dir(out: str) -> Path:
    match = re.search(r"^results: (.+)/ \(", out, re.M)
    assert match, out
    return Path(shlex.split(match.group(1))[0])


# -- actions -----------------------------------------------------------------------------------------------


def run_shortened(command: Command, h: Harness, extra: tuple[str, ...] = ()) -> Outcome:
    """The command, run for real on 1 prompt of 8 tokens; it must write its summary and be lossless."""
    result = h.cli([*_args(command, "python -m specpolicy"), *SHORT, *extra])
    assert result.code == 0, result.err
    summary = json.loads((_results_dir(result.out) / "summary.json").read_text())
    assert summary["prompts"] == 1 and summary.get("lossless_fraction", 1.0) == 1.0
    return result


def dry(command: Command, h: Harness, replace: dict[str, str] | None = None) -> Outcome:
    """The command through the CLI with every job checked and none run (see the module docstring)."""
    args = _args(command, "python -m specpolicy")
    for old, new in (replace or {}).items():
        args = [a.replace(old, new) for a in args]
    result = h.cli(args, dry=True)
    assert result.code == 0 and result.checked, result.err
    if "-m" in args:
        assert len(result.checked) > 1  # every job of the sweep
    return result


def _offline_hub(command: Command, h: Harness) -> Outcome:
    """``HF_HUB_OFFLINE=1 python -m specpolicy verifier.model=org/name drafter.model=org/name ...``:
    the tiny target and drafter laid out under those ids in a hub cache of the test's
    (``HF_HUB_CACHE``), the hub off limits; then a dry run (each model's snapshot checked as a
    local directory, the drafter against the target's config.json from the cache)."""
    from hub_cache import put_in_hub_cache

    cache = h.cwd / "hub-cache"
    args = _args(command, "HF_HUB_OFFLINE=1 python -m specpolicy")
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("verifier.model", "drafter.model"):
            put_in_hub_cache(cache, value, h.world.family["target" if key == "verifier.model" else "drafter"])
    h.mp.setenv("HF_HUB_CACHE", str(cache))
    h.mp.setenv("HF_HUB_OFFLINE", "1")
    result = h.cli(args, dry=True)
    assert result.code == 0 and result.checked, result.err
    return result


def transcript(command: Command, h: Harness) -> None:
    """The command prints exactly the README's lines (on stderr: user errors), status 2."""
    result = h.cli(_args(command, "python -m specpolicy"))
    assert result.code == 2, (result.out, result.err)
    assert result.err.splitlines() == list(command.expected)


def _no_slurm_transcript(command: Command, h: Harness) -> None:
    """The README's machine without Slurm: ``PATH`` holds none of Slurm's commands and no local
    cluster is up (here both may be: CI's local cluster), then its exact error line -- with the
    local cluster's directory (``$SPECPOLICY_SLURM_DIR``, the README's default
    ``/tmp/specpolicy-slurm``) moved to an empty one of the test's."""
    import specpolicy.run.slurm as slurm

    empty, cluster = h.cwd / "no-slurm-bin", h.cwd / "no-cluster"
    empty.mkdir()
    h.mp.setenv("PATH", str(empty))
    h.mp.setenv("SPECPOLICY_SLURM_DIR", str(cluster))
    assert all(shutil.which(c) is None for c in slurm.SLURM_COMMANDS)
    result = h.cli(_args(command, "python -m specpolicy"))
    assert result.code == 2, (result.out, result.err)
    assert result.err.splitlines() == [line.replace("/tmp/specpolicy-slurm", str(cluster)) for line in command.expected]


def reader(module: str, command: Command, h: Harness, paths: dict[str, str]) -> str:
    """``python -m specpolicy.<module> ...`` with the README's placeholders pointing at ``paths``."""
    import importlib

    text = command.text
    for placeholder, path in paths.items():
        text = text.replace(placeholder, path)
    code, out = h.main(importlib.import_module(f"specpolicy.analysis.{module}").main, shlex.split(text)[3:])
    assert code == 0, out
    return out


def placeholders(w: World) -> dict[str, str]:
    runs = " ".join(str(w.static / n) for n in ("0", "1", "0", "1"))
    return {
        "outputs/<run>": str(w.run),
        "multirun/<date>/<time>": str(w.static),
        "multirun/paper-main/<date>": str(w.static),
        "multirun/failfast-grid/<date>": str(w.static),
        "multirun/concavity/<date>": str(w.static),
        "multirun/static-k-ar/<date>": str(w.static),
        "multirun/tau-sensitivity/<date>": str(w.tau),
        "multirun/nmax-sensitivity/<date>": str(w.tau),
        "benchmarks/results/paper-{gsm8k,math500,aime24,humaneval}/runs/ar": runs,
        "benchmarks/results/paper-gsm8k/runs/failfast": str(w.tau / "0"),
        "DIR": str(w.run),
    }


def tiny_models(w: World) -> list[str]:
    return [
        "--target",
        str(w.family["target"]),
        "--ar-drafter",
        str(w.family["drafter"]),
        "--dllm-drafter",
        str(w.family["drafter"]),
        "--dflash-drafter",
        str(w.family["dflash"]),
        "--eagle3-drafter",
        str(w.family["eagle3"]),
    ]


# -- rules: each command of the README is handled by the first rule whose pattern matches ------------------


def _pip_install(command: Command, h: Harness) -> None:
    """``pip install [torch==X] -e .`` or ``-e ".[extra]"``: this environment is that install -- the
    pinned torch, this project (editable) and every requirement of the extra that ``pyproject.toml``
    declares (read from the file, so an extra the page names but the project lacks fails here)."""
    args = shlex.split(command.text)[2:]
    pins = [a for a in args if "==" in a]
    assert pins in ([], ["torch==2.13.0"]), pins
    if pins:
        assert importlib.metadata.version("torch").split("+")[0] == pins[0].split("==")[1]
    target = args[args.index("-e") + 1]
    assert re.fullmatch(r"\.(\[\w+\])?", target), target
    assert importlib.metadata.version("specpolicy")
    extras = re.findall(r"\[(\w+)\]", target)
    for extra in extras:
        needed = _extra(extra)
        assert needed, f"{command.where}: no extra {extra!r} in pyproject.toml"
        for requirement in needed:  # PackageNotFoundError for one that is not installed
            importlib.metadata.version(re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0])


def _extra(name: str) -> list[str]:
    """The requirements of ``[project.optional-dependencies]``'s ``name`` in pyproject.toml (read
    with re: tomllib is Python 3.11+, the project runs on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text[text.index("[project.optional-dependencies]") :]
    section = section[: section.find("\n[", 1)] if "\n[" in section[1:] else section
    match = re.search(rf"^{re.escape(name)} = \[(.*?)\]\s*(#.*)?$", section, flags=re.M | re.S)
    return re.findall(r'"([^"]+)"', re.sub(r"#[^\n]*", "", match.group(1))) if match else []


def _mkdocs_build(command: Command, h: Harness) -> None:
    """The docs build as the README says, strict (no broken link, no unresolved API page), into a
    scratch site directory."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(h.cwd / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (h.cwd / "site" / "index.html").is_file()


def _resume(command: Command, h: Harness) -> None:
    """The run, then the same command (complete: nothing loaded), then run.resume=false (starts over)."""
    base = [a for a in _args(command, "python -m specpolicy") if a != "run.resume=false"]
    first = h.cli([*base, *SHORT])
    assert first.code == 0, first.err
    again = h.cli([*base, *SHORT])
    assert again.out.startswith("run complete:"), again.out
    over = h.cli([*base, "run.resume=false", *SHORT])
    assert over.code == 0 and "run complete" not in over.out and " 1 prompt x " in over.out


def _stop(command: Command, h: Harness) -> None:
    """The documented stop string, on 1 prompt of 64 new tokens: it cuts the bundled GSM8K answer
    (``finish_reason`` ``stop_string``, as vanilla decoding's), lossless. An example that visibly
    does nothing -- every prompt ending at EOS or ``max_new_tokens`` -- fails here."""
    result = h.cli(
        [
            *_args(command, "python -m specpolicy"),
            "dataset.num_prompts=1",
            "generation.max_new_tokens=64",
            "run.warmup_prompts=0",
        ]
    )
    assert result.code == 0, result.err
    run = _results_dir(result.out)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["generation"]["stop"], summary["config"]["generation"]
    (row,) = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert row["finish_reason"] == row["vanilla_finish_reason"] == "stop_string", (
        row["finish_reason"],
        row["output_text"],
    )
    assert row["lossless"] and row["generated_tokens"] < 64


def _log_without_bars(command: Command, h: Harness) -> None:
    """The run with stdout and stderr going to a file (here: captured, not a terminal): it
    completes and the log gets no progress bar -- neither the loading bar nor a prompt's."""
    result = h.cli([*h.world.tiny(), *SHORT])
    assert result.code == 0, result.err
    printed = result.out + result.err
    assert "Loading weights" not in printed and "%|" not in printed, printed


def _wandb(command: Command, h: Harness) -> None:
    """Offline, confined to the test's directory (no API key, no network), on the tiny family."""
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT", "HTTP_PROXY", "HTTPS_PROXY"):
        h.mp.delenv(var, raising=False)
    h.mp.setenv("WANDB_MODE", "offline")
    h.mp.setenv("WANDB_SILENT", "true")
    h.mp.setenv("NETRC", str(h.cwd / "no-netrc"))
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        (h.cwd / var.lower()).mkdir()
        h.mp.setenv(var, str(h.cwd / var.lower()))
    result = h.cli([*_args(command, "python -m specpolicy"), *h.world.tiny(), "logger.wandb.log_plots=false"])
    assert result.code == 0, result.err
    assert re.search(r"^W&B: +offline run .+/ \(not uploaded\)$", result.out, re.M), result.out
    assert re.search(r"^upload: +wandb sync ", result.out, re.M)


def _my_prompts(h: Harness, bad: bool) -> None:
    rows = [
        '{"prompt": "Natalia sold clips to 48 of her friends."}',
        '{"question": "How many clips?"}',
        '{"text": "Janet has 16 ducks."}',
        '{"problem": "What is 2 + 3?"}',
    ]
    if bad:  # the README's error: line 2 a string not closed, line 4 an array, line 5 no text field
        rows[1], rows[3] = '{"prompt": "How many clips?}', '["What is 2 + 3?"]'
        rows.append('{"answer": "72"}')
    (h.cwd / "my_prompts.jsonl").write_text("\n".join(rows) + "\n")


def _slurm(command: Command, h: Harness) -> None:
    """The sweep's jobs checked with the basic launcher, and the Slurm launcher's config composed
    (submitting needs a cluster: tests/run/test_slurm.py runs sweeps on a local one)."""
    from hydra import compose, initialize_config_module

    args = _args(command, "python -m specpolicy")
    launcher = [a for a in args if a.startswith(("hydra/launcher=", "hydra.launcher."))]
    dry(
        command,
        h,
        {a: "hydra/launcher=basic" if a.startswith("hydra/launcher=") else "hydra.verbose=false" for a in launcher},
    )
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=launcher, return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    for override in launcher[1:]:
        key, value = override.split("=", 1)
        assert str(cfg.hydra.launcher[key.split(".")[-1]]) == value


def _slurm_local(command: Command, h: Harness) -> None:
    script = ROOT / shlex.split(command.text)[0]
    subprocess.run(["bash", "-n", str(script)], check=True)  # it parses
    assert re.search(rf"^\s+{shlex.split(command.text)[1]}\)", script.read_text(), re.M)  # a subcommand


def _help(command: Command, h: Harness) -> None:
    result = h.cli(_args(command, "python -m specpolicy"))
    assert result.code == 0 and result.out.startswith("specpolicy:"), result.out[:200]


def _list_plugins(command: Command, h: Harness) -> None:
    result = h.cli(_args(command, "python -m specpolicy"))
    assert result.code == 0 and result.out.startswith("plugins (entry-point group 'specpolicy'")
    assert re.search(r"^  specpolicy\.policies\.failfast ", result.out, re.M), result.out


def _my_policy(command: Command, h: Harness) -> None:
    """A third-party plugin's policy: the example package's ``policy=entropy`` stands for
    ``my_policy`` (its configs found through the plugin's search path)."""
    h.mp.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD")
    result = h.cli([*_args(command, "python -m specpolicy")[:-1], "policy=entropy"], dry=True)
    assert result.code == 0 and result.checked[0]["policy"]["name"] == "entropy", result.err


def _peers(command: Command, h: Harness) -> None:
    """The built-in AR static row, or -- a command adding methods with ``--method`` -- its first one
    whose drafter the tiny family has (DART, Falcon and DEER have no tiny checkpoint here: their
    tests build their own)."""
    out = h.cwd / "peers.json"
    args = _args(command, "python benchmarks/peers.py")
    added = [i for i, a in enumerate(args[:-1]) if a == "--method"]
    tiny = [i for i in added if not re.search(r"(^|,|=)drafter=(dart|falcon|deer)(,|$)", args[i + 1])]
    keep = tiny[0] if tiny else None
    method = args[keep + 1].partition("=")[0] if keep is not None else "ar+static-k5"
    for i in reversed(added):  # one added method only: each one builds its drafter
        if i != keep:
            del args[i : i + 2]
    load_benchmark("peers").main(
        [
            *args,
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "8",
            "--methods",
            "^" + re.escape(method) + "$",
            "--no-oracle",
            "--sweep-prompts",
            "1",
            "--warmup",
            "0",
            "--out",
            str(out),
            *tiny_models(h.world),
        ]
    )
    assert {"vanilla", method} <= set(json.loads(out.read_text())["methods"])


def _paper_table_run(command: Command, h: Harness) -> None:
    from tiny_other_drafters import save_tiny_other_drafters

    out = h.cwd / "paper"
    other = save_tiny_other_drafters(h.world.family, h.cwd / "drafters")  # the DART, Falcon and DEER rows
    load_benchmark("paper_table").main(
        [
            *_args(command, "python benchmarks/paper_table.py"),
            "--num-prompts",
            "1",
            "--calibration-prompts",
            "1",
            "--k-grid",
            "3",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
            "--out",
            str(out),
            *tiny_models(h.world),
            *(a for name in ("dart", "falcon", "deer") for a in (f"--{name}-drafter", str(other[name]))),
        ]
    )
    assert (out / "table1.md").is_file() and (out / "appendix_b.md").is_file()


def _paper_table_args(command: Command, h: Harness) -> None:
    """The gsm8k line runs shortened; the other data sets' lines are the same script: their
    arguments are checked (the evaluation and calibration slices fit the data set)."""
    args = load_benchmark("paper_table").parse_args(_args(command, "python benchmarks/paper_table.py"))
    assert args.dataset in command.text


def _paper_table_combine(command: Command, h: Harness) -> None:
    """On the committed per-data-set results, written to a scratch directory."""
    args = _args(command, "python benchmarks/paper_table.py")
    (braced,) = [a for a in args if "{" in a]
    head, names, tail = re.fullmatch(r"(.*)\{(.*)\}(.*)", braced).groups()
    dirs = [str(ROOT / f"{head}{name}{tail}") for name in names.split(",")]
    load_benchmark("paper_table").main(["combine", *dirs, "--out", str(h.cwd / "paper")])
    assert (h.cwd / "paper" / "table1.md").is_file()


def _ceiling(command: Command, h: Harness) -> None:
    args = [
        str(ROOT / a) if a.startswith("benchmarks/results/peers") else a
        for a in _args(command, "python benchmarks/ceiling.py")
    ]
    out = h.cwd / "ceiling.json"
    load_benchmark("ceiling").main(
        [*args, "--num-prompts", "1", "--max-new-tokens", "8", "--out", str(out), *tiny_models(h.world)]
    )
    assert out.is_file()


def _overhead(command: Command, h: Harness) -> None:
    out = h.cwd / "overhead.json"
    load_benchmark("overhead").main(
        [
            *_args(command, "python benchmarks/overhead.py"),
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
            "--out",
            str(out),
            *tiny_models(h.world),
        ]
    )
    assert out.is_file()


def _host_work(command: Command, h: Harness) -> None:
    """One method (the AR static row: every method runs the same code around its passes), 1 prompt,
    8 tokens, one repeat, on the tiny family; the result holds its host ms per round and components.
    ``--warm-split``: the command's first method and every function, the first one's row read."""
    out = h.cwd / "host.json"
    args = _args(command, "python benchmarks/host_work.py")
    if "--warm-split" in args:  # the split: its first method with every function, 1 prompt x 8 tokens
        method = args[args.index("--method") + 1]
        targets = [args[i + 1] for i, flag in enumerate(args) if flag == "--warm-split"]
        load_benchmark("host_work").main(
            ["--num-prompts", "1", "--max-new-tokens", "8", "--method", method]
            + [part for target in targets for part in ("--warm-split", target)]
            + ["--out", str(out), *tiny_models(h.world)]
        )
        split = json.loads(out.read_text())["warm_split"][method]
        assert set(split) == set(targets)  # a row for every function, called or not
        assert split[targets[0]]["calls"] > 0 and split[targets[0]]["warm_us"] > 0
        return
    load_benchmark("host_work").main(
        [*args, "--num-prompts", "1", "--max-new-tokens", "8", "--repeat", "1", "--method", "ar+static-k5"]
        + ["--out", str(out), *tiny_models(h.world)]
    )
    result = json.loads(out.read_text())
    row = result["methods"]["ar+static-k5"]
    assert row["host_ms_per_round"] > 0 and "verify" in row["components"]
    # the machine's host speed beside the reading (one repeat: one probe), and its range over the run
    assert len(row["host_probe_us"]) == 1 and 0 < result["host_probe_us"]["min"] == row["host_probe_us"][0]
    assert result["after_pass_probe"]["warm_us"] > 0 and result["after_pass_probe"]["samples"] == 15


#: the shortened ``benchmarks/runtime.py`` runs of this process: where each command is shown, and
#: what its run ran (``_what_runs``)
_RUNTIME_RUNS: list[tuple[str, dict]] = []
#: runtime.py's flags that change nothing a shortened run runs or checks (the deadline is read
#: before the second prompt only: a one-prompt run never reaches it)
_INERT = ("out", "note", "deadline_s")


def _what_runs(args: list[str]) -> dict:
    """What a shortened ``benchmarks/runtime.py`` run with ``args`` runs here, from the script's own
    parser: its settings, with the methods (``specs``), HF's rows (``hf``), the sampled and the
    eager-copies batched rows as what a later run can be a part of. Without CUDA, ``--device auto``
    is the CPU, ``--dtype auto`` float32 (the CPU's) and ``--cuda-modes`` is dropped (the CPU builds
    one compiled side)."""
    parsed = vars(load_benchmark("runtime").parse_args(args))
    what = {key: value for key, value in parsed.items() if key not in (*_INERT, "method", "methods", "no_hf")}
    what["specs"] = {spec.given for spec in parsed["specs"]}
    what["hf"] = not parsed["no_hf"]
    if not torch.cuda.is_available():
        what["device"] = "cpu" if what["device"] == "auto" else what["device"]
        what["dtype"] = "float32" if what["dtype"] == "auto" else what["dtype"]
        del what["cuda_modes"]
    return what


def _covers(earlier: dict, later: dict) -> bool:
    """Whether the earlier run ran everything the later one runs: the same settings, the later's
    methods among the earlier's, HF's, sampled and eager-copies rows only where the earlier ran them."""
    parts = ("specs", "hf", "batch_temperature", "batch_copies")
    same = all(earlier[key] == later[key] for key in later if key not in parts)
    return (
        same
        and later["specs"] <= earlier["specs"]
        and earlier["hf"] >= later["hf"]
        and earlier["batch_copies"] >= later["batch_copies"]
        and later["batch_temperature"] in (0.0, earlier["batch_temperature"])
    )


def _runtime_bench(command: Command, h: Harness) -> None:
    """``benchmarks/runtime.py`` shortened: 1 prompt, 8 tokens, one bucket, one run of each batched
    row, the tiny family. A command whose shortened run an earlier one of this process already made
    (``_covers``) -- the same command shown again with another ``--out``; on a machine without CUDA a
    GPU command that runs, there, a part of an earlier command's run (some of its methods, without
    Hugging Face's rows, at float32, the CPU's default) -- is not run again: its arguments are
    parsed by the script's parser, and it is skipped."""
    out = h.cwd / "runtime.json"
    args = _args(command, "python benchmarks/runtime.py")
    if "--device" in args and not torch.cuda.is_available():  # a GPU row's command, its flags checked on the CPU
        args[args.index("--device") + 1] = "cpu"
    # 1 prompt, 8 tokens, one bucket (12 graphs compiled, not 16: about 15 CPU-s less; several buckets are
    # tests/models/test_static_qwen.py's); one run of each batched row (the runs repeat for the timing only)
    shortened = ["--num-prompts", "1", "--max-new-tokens", "8", "--buckets", "8", "--batch-repeats", "1"]
    what = _what_runs([*args, *shortened])
    earlier = next((where for where, ran in _RUNTIME_RUNS if _covers(ran, what)), None)
    if earlier is not None:
        pytest.skip(f"runs a part of the run of {earlier} on this machine, checked there")
    _RUNTIME_RUNS.append((command.where, what))
    # --buckets: the runtime.buckets of the benchmark's runtimes (CompileSettings), no module state to restore
    load_benchmark("runtime").main([*args, *shortened, "--out", str(out), *tiny_models(h.world)])
    result = json.loads(out.read_text())
    assert result["rows"]["vanilla@compiled"]["identical"]
    batched = result["batched"]
    assert "vanilla-batch4@compiled" in batched
    assert all(row["identical"] for row in batched.values() if row["identical"] is not None)  # greedy: = vanilla
    sampled = [name for name, row in batched.items() if row["identical"] is None]
    assert bool(sampled) == ("--batch-temperature" in args) and all(batched[name]["tokens"] for name in sampled)
    assert any(name.endswith("-copies") for name in batched) == ("--batch-copies" in args)


def _tune_failfast(command: Command, h: Harness) -> None:
    """Run shortened on the tiny family (2 prompts, a 2-point grid), its JSON to a scratch path."""
    out = h.cwd / "tune.json"
    result = load_benchmark("tune_failfast").main(
        [
            *_args(command, "python benchmarks/tune_failfast.py"),
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
            "--n-grid",
            "2,4",
            "--tau-grid",
            "0.6",
            "--static-k",
            "4",
            "--out",
            str(out),
            *tiny_models(h.world),
        ]
    )
    assert out.is_file() and all(row["lossless"] == 2 for row in result["rows"])


def _batched(command: Command, h: Harness) -> None:
    """The README's options parse; the run, shortened (2 prompts, batch sizes 1 and 2, K = 1, one
    repeat) on the tiny family, writes its JSON and figure, every method lossless."""
    module = load_benchmark("batched")
    module.parse_args(_args(command, "python benchmarks/batched.py"))
    out, figure = h.cwd / "batched.json", h.cwd / "batched.png"
    result = module.main(
        [
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "6",
            "--batch-sizes",
            "1,2",
            *("--method", "eagle3+static-k1", "--method", "eagle3+batch-schedule", "--method", "eagle3+goodput-batch"),
            "--repeats",
            "1",
            "--out",
            str(out),
            "--figure",
            str(figure),
            "--dtype",
            "float64",
            "--device",
            "cpu",
            *tiny_models(h.world),
        ]
    )
    assert out.is_file() and figure.is_file()
    assert all(
        s["lossless"] for row in result["batch_sizes"].values() for name, s in row.items() if not name.startswith("_")
    )


def _packing(command: Command, h: Harness) -> None:
    """Run shortened on the tiny target (batch sizes 2 and 3, one repeat): both layouts give every
    request the same logits (the script checks), the JSON is written."""
    out = h.cwd / "packing.json"
    result = load_benchmark("packing").main(
        [
            "--target",
            str(h.world.family["target"]),
            "--batch-sizes",
            "2,3",
            "--context",
            "3,9",
            "--k",
            "3",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    assert out.is_file() and len(result["passes"]) == 4


def _batched_lossless(command: Command, h: Harness) -> None:
    """Run shortened on the tiny family (2 prompts, two drafters and policies, batch sizes 1 and 2)."""
    out = h.cwd / "lossless.json"
    result = load_benchmark("batched_lossless").main(
        [
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "6",
            "--batch-sizes",
            "1,2",
            "--drafters",
            "ar,eagle3",
            "--policies",
            "static,goodput-batch",
            "--dtype",
            "float64",
            "--device",
            "cpu",
            "--out",
            str(out),
            *tiny_models(h.world),
        ]
    )
    assert result["all_lossless"] and out.is_file()


def _train_drafter(command: Command, h: Harness) -> None:
    """Generation, features and training take hours for a real target: the options are checked as
    the command checks them before the target loads, on the tiny target standing in for /models/."""
    from specpolicy.family.train_drafter import build_parser, check_args

    _my_prompts(h, bad=False)
    text = command.text.replace("/models/", f"{h.world.root}/models/")
    args = build_parser().parse_args(
        _args(Command(command.kind, text, command.line), "python -m specpolicy.family.train_drafter")
    )
    h.mp.chdir(h.cwd)
    assert check_args(args)["num_hidden_layers"] >= 1


def _train_acceptance_head(command: Command, h: Harness) -> None:
    """The rollouts take minutes (tests/family/test_train_acceptance_head.py trains a tiny head): the
    command's arguments are parsed by the trainer's own parser."""
    from specpolicy.family.train_acceptance_head import build_parser

    args = _args(command, "python -m specpolicy.family.train_drafter")
    assert args[0] == "acceptance-head"
    parsed = build_parser().parse_args(args[1:])
    assert parsed.drafter and parsed.out


def _family(command: Command, h: Harness) -> None:
    """Training takes about two hours on GSM8K train (../shared/data); the arguments are checked by
    the pipeline's parser (tests/family/test_family.py trains a tiny family)."""
    from specpolicy.family.pipeline import build_parser

    text = re.sub(r"<[^>]+>", "some-model-dir", command.text)  # <today's dllm-drafter>, <target>
    build_parser().parse_args(_args(Command(command.kind, text, command.line), "python -m specpolicy.family"))


def _help_lists(options: list[str], run_help: Callable[[], None], h: Harness) -> None:
    h.capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run_help()
    assert done.value.code in (0, None)
    text = h.capsys.readouterr().out
    for option in options:
        assert option in text, option


def _diagnostics(command: Command, h: Harness) -> None:
    """It drafts 64 tokens from every 12th position of 50 prompts (minutes): its help must list every
    option the README names."""
    from specpolicy.family.diagnostics import main

    _help_lists(re.findall(r"--[a-z-]+", command.text), lambda: main(["--help"]), h)


def _family_scale(command: Command, h: Harness) -> None:
    """It times forward passes and training steps of five model sizes (a timing job, 71 s alone):
    tests/benchmarks/test_family_scale.py runs it shortened; here its help must list the options the README
    names."""
    module = load_benchmark("family_scale")
    h.mp.setattr(sys, "argv", ["family_scale.py", "--help"])
    _help_lists(re.findall(r"--[a-z-]+", command.text), module.main, h)


def _easyspec_depth(command: Command, h: Harness) -> None:
    """It runs the 12-layer target as its own drafter four times (minutes):
    tests/benchmarks/test_easyspec_depth.py runs it shortened; here its help must list the options the
    page names."""
    module = load_benchmark("easyspec_depth")
    h.mp.setattr(sys, "argv", ["easyspec_depth.py", "--help"])
    _help_lists(re.findall(r"--[a-z-]+", command.text), module.main, h)


def _paper_figures_synopsis(command: Command, h: Harness) -> None:
    """The synopsis of the four commands of the Analysis figures block (each run by its own rule)."""
    from specpolicy.analysis.paper_figures import main

    _help_lists(["concavity", "easy-regions", "reliability", "sensitivity"], lambda: main(["--help"]), h)


def _module_help(command: Command, h: Harness) -> None:
    """Prose naming a reader (``python -m specpolicy.analysis.report``): it runs (its ``--help``); the same
    module on a directory is run by another rule."""
    import importlib

    module = importlib.import_module(command.text.split()[2])
    _help_lists(["usage:"], lambda: module.main(["--help"]), h)


def _alternatives(command: Command, h: Harness) -> None:
    """``drafter=<fastdllm|suffix>``: each alternative, dry."""
    (choices,) = re.findall(r"<([\w|]+)>", command.text)
    for choice in choices.split("|"):
        dry(Command(command.kind, re.sub(r"<[\w|]+>", choice, command.text), command.line), h)


@dataclass(frozen=True)
class Rule:
    """Commands whose ``"<kind>: <command>"`` fully matches ``pattern`` are ``run`` (or skipped,
    ``skip`` saying why); ``how`` says what is done, in words."""

    pattern: str
    how: str
    run: Callable[[Command, Harness], None] | None = None
    skip: str | None = None


def _real_scale(command: Command, h: Harness) -> None:
    """``benchmarks/real_scale.py`` at tiny shapes on CPU (2 layers, width 64; one target and one
    drafter, widths 1 and 4, KV 16 and 64; the replay capped at 4 rounds of a run made here): the
    profile writes its table and profile, the replay its rows."""
    text = command.text
    for placeholder, path in placeholders(h.world).items():
        text = text.replace(placeholder, path)
    args = shlex.split(text)[2:]
    tiny = ["--tiny", "--device", "cpu", "--warmup", "0", "--repeats", "1"]
    if args[0] == "profile":
        out = h.cwd / "profiles"
        tiny += ["--targets", "qwen2.5-7b", "--drafters", "eagle3", "--widths", "1,4", "--kv", "16,64"]
    else:
        out = h.cwd / "replay.json"
        tiny += ["--max-rounds", "4"]
    assert load_benchmark("real_scale").main([*args, *tiny, "--out", str(out)]) == 0
    if args[0] == "profile":
        assert json.loads((out / "cpu-tiny-qwen2.5-7b.json").read_text())["measured"] is True
        assert (out / "cpu-tiny-qwen2.5-7b.yaml").is_file()
    else:
        assert json.loads(out.read_text())["rows"][0]["rounds"] == 4


def _reader(module: str) -> Callable[[Command, Harness], None]:
    return lambda c, h: reader(module, c, h, placeholders(h.world))


CLI = r"(bash|inline): python -m specpolicy"
RULES = [
    Rule(
        r"bash: pip install (torch==\S+ -e (\.|\"\.\[\w+\]\")|-e \"\.\[\w+\]\")",
        "the environment is that install",
        _pip_install,
    ),
    Rule(
        r"bash: pip install -e \.",
        "",
        skip="a plugin package's own install, in its directory: "
        "tests/docs/test_plugin_howto.py installs the how-to pages' packages",
    ),
    Rule(r"bash: mkdocs build --strict", "the docs build, strict, to a scratch directory", _mkdocs_build),
    Rule(
        r"bash: python -m pytest -q( -m \"not slow\")?",
        "",
        skip="the test suite itself: run from inside the suite it would recurse",
    ),
    Rule(rf"{CLI} policy=failfast drafter=fastdllm", "the main job, shortened (bundled family)", run_shortened),
    Rule(rf"{CLI} run\.resume=false", "run, the same command (complete), then run.resume=false (starts over)", _resume),
    Rule(rf"{CLI} .*generation\.stop=.*", "run shortened: stop strings", _stop),
    Rule(
        rf"{CLI} > run\.log 2>&1",
        "run shortened, tiny family: output not a terminal, no progress bars",
        _log_without_bars,
    ),
    Rule(rf"{CLI} \+logger=wandb", "run shortened, W&B offline, tiny family", _wandb),
    Rule(rf"{CLI} --list-plugins", "run", _list_plugins),
    Rule(rf"{CLI} --help", "run", _help),
    Rule(
        rf"{CLI} dataset\.path=my_prompts\.jsonl",
        "dry, on a prompt file of mixed rows",
        lambda c, h: (_my_prompts(h, bad=False), dry(c, h)),
    ),
    Rule(
        r"transcript: python -m specpolicy dataset\.path=my_prompts\.jsonl",
        "run on the bad file the README describes: its exact error",
        lambda c, h: (_my_prompts(h, bad=True), transcript(c, h)),
    ),
    Rule(
        r"transcript: python -m specpolicy -m .*hydra/launcher=slurm.*",
        "run with no Slurm command on PATH: its exact error line",
        _no_slurm_transcript,
    ),
    Rule(r"transcript: python -m specpolicy .*", "run: its exact error line", transcript),
    Rule(
        rf"{CLI} verifier\.model=/models/\S+ drafter=(dflash|eagle3) drafter\.model=/models/\S+",
        "dry, tiny official-layout checkpoints of the tiny target standing in for the /models/ ones",
        lambda c, h: dry(c, h, {"/models/": f"{h.world.root}/models/"}),
    ),
    Rule(
        r"bash: python -m specpolicy\.family\.train_drafter acceptance-head .*",
        "arguments parsed by the trainer's parser (tests/family/test_train_acceptance_head.py trains a tiny head)",
        _train_acceptance_head,
    ),
    Rule(
        r"bash: python -m specpolicy\.family\.train_drafter (dflash|eagle3) .*",
        "options checked before the target would load (tests/family/test_train_drafter.py trains both, shortened)",
        _train_drafter,
    ),
    Rule(
        rf"{CLI} verifier\.model=/models/\S+ drafter\.model=/models/\S+",
        "dry, the /models/ directories standing in for local model directories",
        lambda c, h: dry(c, h, {"/models/": f"{h.world.root}/models/"}),
    ),
    Rule(
        r"bash: HF_HUB_OFFLINE=1 python -m specpolicy .*",
        "dry, offline, on a hub cache the test lays out with the tiny family under the hub ids",
        _offline_hub,
    ),
    Rule(
        rf"{CLI} .*hydra/launcher=slurm.*", "jobs checked with the basic launcher; the Slurm launcher composed", _slurm
    ),
    Rule(
        rf"{CLI} policy=my_policy",
        "dry, the example plugin's policy=entropy for my_policy",
        lambda c, h: (
            _my_policy(c, h)
            if importlib.util.find_spec("specpolicy_entropy")
            else pytest.skip("the example plugin is not installed (pip install ./examples/third-party-policy)")
        ),
    ),
    Rule(
        rf"{CLI} (policy=mine policy\.k=\d+|drafter=lookup .*)",
        "",
        skip="a how-to page's plugin package: tests/docs/test_plugin_howto.py installs it and runs this command",
    ),
    Rule(rf"{CLI} .*<[\w|]+>.*", "dry, each alternative", _alternatives),
    Rule(rf"{CLI}( [-+\w.=,/'\"\[\]]+)*", "dry: composed, every job checked before a model would load", dry),
    Rule(
        r"(bash|inline): python -m specpolicy\.analysis\.(report|plot|oracle) (\S+/<\S+>(/<\S+>)?|DIR)",
        "run on a sweep / run made here",
        lambda c, h: _reader(c.text.split()[2].split(".")[-1])(c, h),
    ),
    Rule(r"inline: python -m specpolicy\.analysis\.(report|plot|oracle)( RUN| <run>)?", "its --help", _module_help),
    Rule(
        r"bash: python -m specpolicy\.analysis\.paper_figures .*",
        "run on sweeps / runs made here",
        _reader("paper_figures"),
    ),
    Rule(
        r"inline: python -m specpolicy\.analysis\.paper_figures (FIGURE DIR\.\.\.|--out \S+)",
        "its --help lists the four figures",
        _paper_figures_synopsis,
    ),
    Rule(r"(bash|inline): python benchmarks/peers\.py .*", "run shortened: 1 prompt, one method, tiny family", _peers),
    Rule(r"bash: python benchmarks/paper_table\.py --dataset gsm8k .*", "run shortened, tiny family", _paper_table_run),
    Rule(r"bash: python benchmarks/paper_table\.py combine .*", "run on the committed results", _paper_table_combine),
    Rule(r"(bash|inline): python benchmarks/paper_table\.py --dataset .*", "arguments checked", _paper_table_args),
    Rule(r"bash: python benchmarks/ceiling\.py .*", "run shortened, tiny family", _ceiling),
    Rule(r"(bash|inline): python benchmarks/overhead\.py .*", "run shortened, tiny family", _overhead),
    Rule(r"(bash|inline): python benchmarks/host_work\.py .*", "run shortened: one method, tiny family", _host_work),
    Rule(r"(bash|inline): python benchmarks/runtime\.py .*", "run shortened: 1 bucket, tiny family", _runtime_bench),
    Rule(
        r"(bash|inline): python benchmarks/tune_failfast\.py .*",
        "run shortened: 2 prompts, 2 grid points, tiny family",
        _tune_failfast,
    ),
    Rule(r"(bash|inline): python benchmarks/packing\.py .*", "run shortened, tiny target", _packing),
    Rule(r"(bash|inline): python benchmarks/batched_lossless\.py .*", "run shortened, tiny family", _batched_lossless),
    Rule(
        r"(bash|inline): python benchmarks/batched\.py .*",
        "run shortened: 2 prompts, batch sizes 1 and 2, tiny family",
        _batched,
    ),
    Rule(
        r"(bash|inline): python benchmarks/real_scale\.py (profile|replay) .*",
        "run at tiny shapes on CPU: one target, one drafter, 2 widths, 2 KV lengths; the replay 4 rounds",
        _real_scale,
    ),
    Rule(r"(bash|inline): python benchmarks/family_scale\.py .*", "its --help lists the options", _family_scale),
    Rule(r"(bash|inline): python benchmarks/easyspec_depth\.py .*", "its --help lists the options", _easyspec_depth),
    Rule(
        r"(bash|inline): python -m specpolicy\.analysis\.docs( --check)?",
        "",
        skip="the results pages' generator: tests/analysis/test_docs_pages.py runs it (the committed pages equal "
        "what it renders)",
    ),
    Rule(
        r"(bash|inline): python -m specpolicy\.run\.reference( --check)?",
        "",
        skip="the reference pages' generator: tests/run/test_reference.py runs it (the committed pages equal "
        "what it renders)",
    ),
    Rule(
        r"bash: mv results\.json benchmarks/results/\S+\.json",
        "",
        skip="moves a benchmark's output into benchmarks/results/ (the benchmark before it is run shortened)",
    ),
    Rule(r"(bash|inline): python -m specpolicy\.family .*", "arguments checked", _family),
    Rule(r"(bash|inline): python -m specpolicy\.family\.diagnostics .*", "its --help lists the options", _diagnostics),
    Rule(r"bash: scripts/slurm-local\.sh up", "syntax checked; the subcommand exists", _slurm_local),
]


def rule_for(command: Command) -> Rule | None:
    return next((rule for rule in RULES if re.fullmatch(rule.pattern, command.key)), None)


def uncovered(commands: list[Command]) -> list[str]:
    """The commands no rule covers, as ``<file> line N: <kind>: <command>``."""
    return [f"{c.where}: {c.key}" for c in commands if rule_for(c) is None]


def test_every_documented_command_has_a_rule():
    """A documented command that no rule covers fails here, naming its file and line (name it in
    RULES); so does a rule that no longer matches any command."""
    sources = {c.source for c in COMMANDS}
    assert len(COMMANDS) > 40 and "README.md" in sources and "docs/getting-started.md" in sources
    missing = uncovered(COMMANDS)
    assert not missing, "documented commands without a rule in tests/docs/test_doc_commands.py:\n" + "\n".join(missing)
    used = {id(rule_for(c)) for c in COMMANDS}
    stale = [rule.pattern for rule in RULES if id(rule) not in used]
    assert not stale, f"rules that match no documented command: {stale}"


def test_every_page_of_the_docs_is_read():
    """A page added under docs/ is read without a change here (README first, then every page)."""
    assert DOCUMENTS[0].name == "README.md"
    for page in (
        "index.md",
        "getting-started.md",
        "concepts.md",
        "how-to/own-checkpoints.md",
        "how-to/write-a-policy.md",
    ):
        assert ROOT / "docs" / page in DOCUMENTS, page


def test_a_new_kind_of_documented_command_is_uncovered_until_a_rule_names_it():
    new = doc_commands(
        "\n".join(
            [
                "```bash",
                "python -m specpolicy.newtool outputs/<run>",
                "python benchmarks/new_benchmark.py --x 1",
                "python -m specpolicy policy=static policy.k=3",
                "./run-me.sh",
                "```",
                "```text",
                "$ python -m specpolicy.analysis.report --bad",
                "error: ...",
                "```",
            ]
        ),
        "docs/how-to/new.md",
    )
    assert uncovered(new) == [
        "docs/how-to/new.md line 2: bash: python -m specpolicy.newtool outputs/<run>",
        "docs/how-to/new.md line 3: bash: python benchmarks/new_benchmark.py --x 1",
        "docs/how-to/new.md line 5: bash: ./run-me.sh",
        "docs/how-to/new.md line 8: transcript: python -m specpolicy.analysis.report --bad",
    ]


def test_the_extraction_reads_every_form_of_command():
    commands = doc_commands(
        "\n".join(
            [
                "Run `python -m specpolicy policy=static` or `python -m specpolicy.analysis.report DIR`; not `policy.k`.",
                "```bash",
                "pip install x && python -m specpolicy a=1   # a comment",
                "python benchmarks/x.py --a 1 \\",
                "    --b 2",
                "```",
                "```text",
                "$ python -m specpolicy bad=1",
                "error: bad",
                "```",
                "`python -m specpolicy a=1` again",
                "<!-- made by `python -m specpolicy.hidden` -->",
            ]
        )
    )
    assert [(c.kind, c.text, c.expected) for c in commands] == [
        ("bash", "pip install x", ()),
        ("bash", "python -m specpolicy a=1", ()),
        ("bash", "python benchmarks/x.py --a 1 --b 2", ()),
        ("transcript", "python -m specpolicy bad=1", ("error: bad",)),
        ("inline", "python -m specpolicy policy=static", ()),
        ("inline", "python -m specpolicy.analysis.report DIR", ()),
    ]
    assert commands[2].line == 4 and commands[2].where == "README.md line 4"


def test_a_command_shown_on_several_pages_is_run_once_where_it_is_first_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("```bash\npython -m specpolicy a=1\n```\n")
    (tmp_path / "docs" / "page.md").write_text("Run `python -m specpolicy a=1` or `python -m specpolicy b=2`.\n")
    commands = documented_commands([tmp_path / "README.md", tmp_path / "docs" / "page.md"])
    assert [(c.where, c.key) for c in commands] == [
        ("README.md line 2", "bash: python -m specpolicy a=1"),
        ("docs/page.md line 1", "inline: python -m specpolicy b=2"),
    ]


@pytest.mark.slow  # runs the documented commands (in this process), a few minutes on 2 cores
@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.source}:L{c.line}-{c.kind}" for c in COMMANDS])
def test_documented_command_runs(command: Command, harness: Harness):
    rule = rule_for(command)
    assert rule is not None, f"no rule for {command.where}: {command.key}"
    if rule.skip:
        pytest.skip(rule.skip)
    rule.run(command, harness)
