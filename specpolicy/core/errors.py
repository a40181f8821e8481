"""Errors meant for the person at the terminal, and the one line each is reported as.

* ``UserError`` (``ConfigError``, ``specpolicy.run.runlock.RunLocked``): something the user can fix
  -- a config value out of range, a bad prompt file, a run directory in use. The CLI prints ONE
  line (``error: ...``) naming the key, the value and the accepted range, no traceback, and
  exits with status 2 (``EXIT_USER``).
* An error raised inside a plugin (a factory, a lifecycle hook, or a method of the policy,
  drafter or verifier it built) carries a ``PluginBlame`` (``specpolicy.plugins.manager.blame``): the
  CLI prints one line naming the plugin (entry-point name and module) and the hook or method,
  and exits with status 1.
* Hydra's composition errors (a misspelled key or config choice) become one line with the
  keys that exist and the closest match (``difflib``), status 2 (``hydra_error_line``).
* ``SweepIncomplete``: a sweep's job ended without a result (``scancel``, a node failure); one
  line naming the job and how to resume the sweep, status 1.
* ``PluginError``: an installed plugin that cannot be loaded or answers a hook with something
  invalid (e.g. a string where a list is due); one line naming the plugin, the hook and the way
  out, status 1.

``--debug`` (or ``HYDRA_FULL_ERROR=1``) keeps the full traceback instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Exit status of a user error (as argparse uses for usage errors).
EXIT_USER = 2
#: Exit status of any other failure.
EXIT_FAILURE = 1


class UserError(Exception):
    """An error the user can fix; its message is the whole report (one line, no traceback)."""


class ConfigError(UserError, ValueError):
    """A config value that cannot run: the message names the key, the value and the accepted
    range (e.g. ``policy.tau must be in [0, 1], got 1.5``). Raised before any model is loaded."""


class SweepIncomplete(Exception):
    """A launched sweep job ended without a result (cancelled, its node failed). Not a bug: the
    message (the job, and the command that resumes the sweep) is the whole report, status 1."""


class PluginError(RuntimeError):
    """A plugin could not be loaded or returned something invalid from a hook. Not the user's
    doing and not a bug of specpolicy: the message (the plugin, the hook, what was wrong and how
    to skip the plugin) is the whole report, status 1."""


@dataclass(frozen=True)
class PluginBlame:
    """Where an error was raised: the plugin's registered ``name`` (an entry-point name, or the
    module name of a built-in -- what ``plugins.block`` takes), the ``module`` implementing it
    and the ``hook`` (a hook such as ``specpolicy_make_drafter`` or a method such as
    ``next_length``)."""

    name: str
    module: str
    hook: str

    def __str__(self) -> str:
        where = self.name if self.name == self.module else f"{self.name} ({self.module})"
        return f"plugin {where}, in {self.hook}"


#: Attribute under which ``specpolicy.plugins.manager.blame`` records a ``PluginBlame`` on an exception.
BLAME_ATTRIBUTE = "specpolicy_blame"


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``word`` (``difflib.get_close_matches``, cutoff 0.6), or None."""
    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return found[0] if found else None


def unknown_key_message(full_key: str, known: Iterable[str], prefix: str = "") -> str:
    """``unknown key policy.tua; policy has keys n, n_max, tau (did you mean policy.tau?)``
    (``prefix``: the parent's dotted path with a trailing dot, ``""`` at the top level)."""
    known = sorted(str(k) for k in known)
    near = closest(full_key.rsplit(".", 1)[-1], known)
    where = prefix.rstrip(".") or "the top level"
    hint = f" (did you mean {prefix}{near}?)" if near else ""
    return f"unknown key {full_key}; {where} has keys {', '.join(known) if known else 'none'}{hint}"


def hydra_error_line(error: BaseException) -> str | None:
    """One line for a Hydra composition / override error, or None when ``error`` is not one.

    A misspelled key (``policy.tua=0.3``, Hydra: "append with +policy.tua") becomes
    ``unknown key policy.tua; policy has keys ... (did you mean policy.tau?)``; a misspelled
    choice (``policy=failfst``) ``no config 'failfst' in group policy; choices: ... (did you mean
    failfast?)``; other override errors keep the first line of Hydra's message."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, choice = str(error.missing_cfg_file).rpartition("/")
        near = closest(choice, error.options)
        return f"no config {choice!r} in group {group or 'config'}; choices: {', '.join(error.options)}" + (
            f" (did you mean {group}={near}?)" if near else ""
        )
    cause = error.__cause__ if isinstance(error, HydraException) else error
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
        parent = getattr(cause, "parent_node", None)
        known: list[Any] = list(parent.keys()) if parent is not None and hasattr(parent, "keys") else []
        full_key = str(cause.full_key)
        prefix = full_key.rsplit(".", 1)[0] + "." if "." in full_key else ""
        line = unknown_key_message(full_key, known, prefix)
        return line if "did you mean" in line else f"{line}; to add a new key on purpose: +{full_key}=VALUE"
    if isinstance(error, OverrideParseException):
        return f"cannot parse the override {error.override!r}: {_flat(error.message)}"
    if isinstance(error, (HydraException, OmegaConfBaseException)):
        text = str(error).strip().splitlines()
        return text[0] if text else type(error).__name__
    return None


def one_line(error: BaseException) -> tuple[str, int] | None:
    """``(line, exit status)`` for an error that has a one-line report -- a ``UserError``, a
    Hydra composition error, an incomplete sweep, a ``PluginError`` or an error blamed on a
    plugin -- or None (report the traceback)."""
    if isinstance(error, UserError):
        return f"error: {_flat(str(error))}", EXIT_USER
    if isinstance(error, (SweepIncomplete, PluginError)):
        return f"error: {_flat(str(error))}", EXIT_FAILURE
    line = hydra_error_line(error)
    if line is not None:
        return f"error: {_flat(line)}", EXIT_USER
    blame = getattr(error, BLAME_ATTRIBUTE, None)
    if blame is not None:
        return (
            f"error in {blame}: {type(error).__name__}: {_flat(str(error))} (--debug shows the traceback)",
            EXIT_FAILURE,
        )
    return None


def _flat(text: str) -> str:
    """One line: newlines (e.g. of an exception from a library) become ' | '."""
    return " | ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())
