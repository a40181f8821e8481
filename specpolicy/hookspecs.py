"""Hook specifications of specpolicy's plugin system (pluggy).

Built-in policies, drafters, verifiers and loggers implement these hooks exactly as
third-party plugins do. A third-party package exposes a module in the entry-point group
``specpolicy`` (``[project.entry-points.specpolicy] my_policy = "my_pkg.plugin"``) whose
functions carry ``@specpolicy.hookimpl``.

Factory hooks are ``firstresult``: each implementation returns an instance when ``name``
is its own and ``None`` otherwise. Implementations are called last-registered first, so an
entry-point plugin providing a built-in's name takes precedence over the built-in.

Lifecycle hooks are called by the run driver (``specpolicy.experiment.run_experiment``) on
every registered plugin, including the run's loggers (objects returned by
``specpolicy_make_logger``, registered for the duration of one run):
``run_start`` -> (``round_end``* -> ``prompt_end``) per prompt -> ``run_end``, or
``run_abort`` when the run raises. Hook implementations may accept any subset of a hook's
arguments (pluggy passes them by name).
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "specpolicy"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def specpolicy_make_policy(name: str, config: dict[str, Any]):
    """Return a ``LengthPolicy`` for ``name`` built from ``config`` (the ``policy`` config
    group without its ``name`` key), or ``None`` if ``name`` is not this plugin's."""


@hookspec(firstresult=True)
def specpolicy_make_drafter(name: str, config: dict[str, Any], runtime, verifier):
    """Return a ``Drafter`` for ``name`` on ``runtime``, compatible with ``verifier``
    (same vocabulary), or ``None`` if ``name`` is not this plugin's."""


@hookspec(firstresult=True)
def specpolicy_make_verifier(name: str, config: dict[str, Any], runtime):
    """Return a ``Verifier`` for ``name`` on ``runtime``, or ``None``."""


@hookspec(firstresult=True)
def specpolicy_make_logger(name: str, config: dict[str, Any], run_dir: str):
    """Return a run logger for ``name`` (selected by the ``logger`` config group; ``config``
    is ``logger.<name>``), or ``None``. A logger is an object whose methods carry
    ``@hookimpl`` and implement lifecycle hooks below; it is registered as a plugin for one
    run and unregistered after ``run_end``/``run_abort``."""


@hookspec
def specpolicy_config_searchpath() -> list[str]:
    """Extra Hydra config search-path entries (``pkg://my_pkg.conf``, ``file:///abs/dir`` or a
    plain directory path) so a plugin can ship its own config files (``policy/<name>.yaml``, ``logger/<name>.yaml``,
    ...) and be selected with ``policy=<name>``. Appended after specpolicy's own configs."""


# -- lifecycle hooks, called by the run driver ---------------------------------------------


@hookspec
def specpolicy_run_start(config: dict[str, Any], run_dir: str) -> None:
    """Before the first prompt, with the resolved config."""


@hookspec
def specpolicy_round_end(method: str, prompt_id: str, record) -> None:
    """After every verified round (``record`` is a ``RoundRecord``)."""


@hookspec
def specpolicy_prompt_end(method: str, prompt_id: str, row: dict[str, Any]) -> None:
    """After each prompt, with its ``results.jsonl`` row."""


@hookspec
def specpolicy_run_end(summary: dict[str, Any], run_dir: str) -> None:
    """After the last prompt, with the summary written to ``summary.json``."""


@hookspec
def specpolicy_run_abort(error: BaseException, run_dir: str) -> None:
    """When the run raises after ``run_start`` (instead of ``run_end``); ``error`` is re-raised
    after the hook. Loggers close their files/runs here."""
