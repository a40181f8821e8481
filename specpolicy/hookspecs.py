"""Hook specifications of specpolicy's plugin system (pluggy).

Built-in policies, drafters, verifiers and loggers implement these hooks exactly as
third-party plugins do. A third-party package exposes a module in the entry-point group
``specpolicy`` (``[project.entry-points.specpolicy] my_policy = "my_pkg.plugin"``) whose
functions carry ``@specpolicy.hookimpl``.

Factory hooks are ``firstresult``: each implementation returns an instance when ``name``
is its own and ``None`` otherwise.
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
    """Return a run logger (an object implementing the lifecycle hooks below as methods,
    registered as a plugin for the run) for ``name``, or ``None``."""


@hookspec
def specpolicy_config_searchpath() -> list[str]:
    """Extra Hydra config search-path entries (``pkg://my_pkg.conf`` or a directory) so a
    plugin can ship its own ``policy/<name>.yaml`` (etc.)."""


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
