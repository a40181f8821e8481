"""What a run tells the person at the terminal when it ends: where its results are, where plugins
put it outside its directory (the hook ``specpolicy_run_outputs``: the W&B run and how to upload
it) and the next commands (report, plot, oracle); after a multirun, its sweep directory (Hydra
callback ``SweepDone``, configured under ``hydra.callbacks`` in ``conf/config.yaml``)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


def shown(path: str | Path) -> str:
    """``path`` as the user should type it: relative to the working directory when inside it,
    shell-quoted when needed."""
    path = Path(path)
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


def next_commands(directory: str | Path) -> list[str]:
    """The commands that read a run or sweep directory: the report table, the figures, the oracle."""
    d = shown(directory)
    return [
        f"python -m specpolicy.analysis.report {d}",
        f"python -m specpolicy.analysis.plot {d}",
        f"python -m specpolicy.analysis.oracle {d}",
    ]


#: Width of the labels of ``run_done``'s lines (``results: ``, ``next:    ``): what follows lines up.
LABEL_WIDTH = 9


def run_done(run_dir: str | Path, in_sweep: bool = False, elsewhere: Sequence[str] = ()) -> list[str]:
    """Lines printed after a run: where its results are; where plugins put its outputs outside the
    run directory (``elsewhere``: the lines of the hook ``specpolicy_run_outputs``, e.g. the W&B run
    and how to upload it; a first line's ``label:`` is aligned with ``results:``); then (outside a
    sweep, which prints them once at its end) the next commands."""
    d = Path(run_dir)
    files = ", ".join(f for f in ("summary.json", "results.jsonl") if (d / f).exists()) or "nothing written"
    lines = [f"results: {shown(d)}/ ({files})"]
    for line in elsewhere:
        label, sep, rest = line.partition(": ")
        if sep and len(label) < LABEL_WIDTH and " " not in label:
            lines.append(f"{label + ':':{LABEL_WIDTH}s}{rest}")
        else:
            lines.append(" " * LABEL_WIDTH + line)
    if not in_sweep:
        lines += _next(d)
    return lines


def _next(directory: str | Path) -> list[str]:
    commands = next_commands(directory)
    return [f"next:    {commands[0]}", *(f"         {c}" for c in commands[1:])]


def sweep_done(sweep_dir: str | Path, jobs: int | None = None) -> list[str]:
    """Lines printed after a multirun: its sweep directory and the next commands."""
    count = f"{jobs} jobs, " if jobs is not None else ""
    return [f"sweep results: {shown(sweep_dir)}/ ({count}one directory per job)", *_next(sweep_dir)]


class SweepDone(Callback):
    """Hydra callback: at the end of a multirun, print its sweep directory and the next commands."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_absolute():
            sweep_dir = Path(os.getcwd()) / sweep_dir
        jobs = (
            sum(1 for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir())
            if sweep_dir.is_dir()
            else None
        )
        print("\n".join(sweep_done(sweep_dir, jobs)), flush=True)
