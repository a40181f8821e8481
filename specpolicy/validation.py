"""Validate before loading: every config value is checked before any model is loaded.

``validate_config(cfg, pm)`` runs first in ``specpolicy.experiment.run_experiment``:

* the groups that plugins own -- ``policy``, ``drafter``, ``verifier`` and each ``logger`` --
  through the hook ``specpolicy_validate_config(group, name, config)`` (``firstresult``: the
  plugin that owns ``name`` checks its keys and answers True; built-ins implement it like any
  third-party plugin). A policy whose plugin does not implement the hook is checked by building
  it (policies are cheap); a drafter, verifier or logger whose name no plugin claims is an
  error when every plugin providing that kind implements the hook (nobody else could build it);
* the groups the core owns: ``generation``, ``run``, ``reuse``, ``runtime``, ``seed``,
  ``profile`` and ``dataset`` (the prompt file is read here: every bad row is reported with
  ``file:line``, ``specpolicy.datasets``).

``specpolicy.preflight`` runs ``validate_config`` on every job of a sweep before the first is launched.

Every failure is a ``ConfigError`` whose message names the key, the value and the accepted
range. The small checkers below (``integer``, ``number``, ``choice``, ``boolean``,
``check_keys``, ``check_init``) are what plugins use in their own validate hooks.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from specpolicy.errors import ConfigError, unknown_key_message

#: Groups whose choices plugins provide, and the factory hook of each.
PLUGIN_GROUPS = {
    "policy": "specpolicy_make_policy",
    "drafter": "specpolicy_make_drafter",
    "verifier": "specpolicy_make_verifier",
    "logger": "specpolicy_make_logger",
}


# -- checkers for plugins' validate hooks ---------------------------------------------------------


def check_keys(group: str, config: Mapping[str, Any], known: Iterable[str]) -> None:
    """ConfigError for the first key of ``config`` not in ``known`` (with the closest known key)."""
    known = list(known)
    for key in config:
        if key not in known:
            raise ConfigError(unknown_key_message(f"{group}.{key}", known, f"{group}."))


def check_init(group: str, cls: type, config: Mapping[str, Any], *skip: str) -> Any:
    """Check ``config``'s keys against the keyword parameters of ``cls.__init__`` (less ``skip``,
    e.g. ``"runtime"``, passed as None), then build ``cls(**config)`` -- for classes that validate
    their own arguments and are cheap to build (policies, the suffix drafter, loggers). Returns
    the instance."""
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    check_keys(group, config, [p.name for p in params])
    return cls(**dict.fromkeys(skip), **config)


def integer(key: str, value: Any, minimum: int | None = None, maximum: int | None = None,
            note: str = "") -> int:
    """``value`` as an int when it is an integer (not a bool) in ``[minimum, maximum]``;
    otherwise ConfigError ``<key> must be an integer >= minimum[ and <= maximum][ (note)], got <value>``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        bounds = " and ".join(b for b in (f">= {minimum}" if minimum is not None else "",
                                          f"<= {maximum}" if maximum is not None else "") if b)
        raise ConfigError(f"{key} must be an integer{' ' + bounds if bounds else ''}"
                          f"{f' ({note})' if note else ''}, got {value!r}")
    return int(value)


def number(key: str, value: Any, low: float, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> float:
    """``value`` as a float when it is a finite number in the interval (``[low, high]``, ends
    open as asked); otherwise ConfigError ``<key> must be a number in [low, high], got <value>``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"
        raise ConfigError(f"{key} must be a number in {interval}, got {value!r}")
    return float(value)


def choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` when it is one of ``choices``; otherwise ConfigError listing them."""
    choices = list(choices)
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def boolean(key: str, value: Any) -> bool:
    """``value`` when it is true or false; otherwise ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


# -- the whole config --------------------------------------------------------------------------


def validate_config(config: Mapping[str, Any], pm) -> list:
    """Check every value of the resolved ``config`` (a plain dict) before anything is loaded;
    return the prompts (``specpolicy.datasets.Prompt``), read while checking ``dataset``.

    Raises:
        ConfigError: naming the first bad key, its value and the accepted range.
    """
    _check_core(config)
    for group in ("policy", "drafter", "verifier"):
        node = dict(config.get(group) or {})
        if "name" not in node:
            raise ConfigError(f"{group}.name is missing: choose one with {group}=NAME")
        validate_plugin_config(pm, group, str(node.pop("name")), node, config)
    for name, node in (config.get("logger") or {}).items():
        validate_plugin_config(pm, "logger", str(name), dict(node or {}), config)
    return _check_dataset(config.get("dataset") or {})


def validate_plugin_config(pm, group: str, name: str, config: dict[str, Any],
                           run_config: Mapping[str, Any] | None = None) -> None:
    """Have the plugin that owns ``group`` choice ``name`` check ``config`` (see module docstring);
    ``run_config``: the whole run config, for checks across groups (None: the group alone).

    Raises:
        ConfigError: for a bad value, or a name no registered plugin provides.
    """
    try:
        claimed = pm.hook.specpolicy_validate_config(group=group, name=name, config=dict(config),
                                                     run_config=dict(run_config or {}))
        if not claimed and group == "policy":  # a policy without the hook: build it (cheap)
            from specpolicy.plugins import make_policy

            make_policy(pm, {"name": name, **config})
            claimed = True
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # a plugin's own range check, or its factory failing on a value
        raise ConfigError(refusal_message(pm, group, name, config, exc)) from exc
    if claimed:
        return
    factory = PLUGIN_GROUPS[group]
    providers = {impl.plugin_name for impl in getattr(pm.hook, factory).get_hookimpls()}
    validators = {impl.plugin_name for impl in pm.hook.specpolicy_validate_config.get_hookimpls()}
    if providers <= validators:  # every plugin that could build it has declined
        raise ConfigError(f"no registered plugin provides {group} {name!r}; see `python -m specpolicy --list-plugins`")


def refusal_message(pm, group: str, name: str, config: Mapping[str, Any], error: BaseException) -> str:
    """The one line for a plugin's ``ValueError`` / ``TypeError`` about ``group`` choice ``name``:
    its own message when it names a key of the group (``policy.n must be ...``,
    ``logger.wandb.mode ...``); otherwise the key whose value
    (or name) the message quotes -- ``policy.k='abc'`` for ``invalid literal for int() with base
    10: 'abc'`` -- or, when none can be told, every setting, then the plugin and hook that raised
    it (``specpolicy.plugins.blame``) and the plugin's own words."""
    from specpolicy.plugins import blame

    text = str(error)
    prefix = f"logger.{name}." if group == "logger" else f"{group}."  # how the user writes the group's keys
    if prefix in text:  # the plugin's own message names its key
        return text
    where = blame(error, pm)
    by = f" by {where}" if where is not None else f" by the plugin providing {group} {name!r}"
    quoted = [key for key, value in config.items()
              if re.search(rf"(?<![\w.]){re.escape(repr(value))}(?![\w.])", text)]
    if len(quoted) != 1:
        quoted = [key for key in config if re.search(rf"['\"]{re.escape(str(key))}['\"]", text)]
    if len(quoted) == 1:
        key = quoted[0]
        subject = f"{prefix}{key}={config[key]!r} was refused"
    else:
        settings = ", ".join(f"{prefix}{key}={value!r}" for key, value in config.items()) or "no settings"
        subject = f"{group} {name!r} refused its settings ({settings})"
    return f"{subject}{by}: {type(error).__name__}: {text}"


def _check_core(config: Mapping[str, Any]) -> None:
    """The keys the core owns (``generation``, ``run``, ``reuse``, ``runtime``, ``seed``, ``profile``)."""
    from specpolicy.summary import profile_from
    from specpolicy.runtime import Runtime
    from specpolicy.sampling import SamplingConfig
    from specpolicy.stopping import StopStrings, config_strings

    integer("seed", config.get("seed", 0))
    generation = config.get("generation") or {}
    integer("generation.max_new_tokens", generation.get("max_new_tokens"), 1)
    try:
        SamplingConfig.from_config(generation)  # temperature, top_k, top_p
        stop = generation.get("stop")
        if stop is not None and (isinstance(stop, str) or len(stop)):
            StopStrings(None, config_strings(stop if isinstance(stop, str) else list(stop)))  # non-empty strings
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    _check_batch(config)
    run = config.get("run") or {}
    boolean("run.vanilla_baseline", run.get("vanilla_baseline", True))
    integer("run.warmup_prompts", run.get("warmup_prompts", 0), 0)
    boolean("run.resume", run.get("resume", False))
    reuse = config.get("reuse") or {}
    boolean("reuse.enabled", reuse.get("enabled", False))
    integer("reuse.min_match", reuse.get("min_match", 2), 1)
    runtime = config.get("runtime") or {}
    try:
        Runtime(device=str(runtime.get("device", "auto")), dtype=str(runtime.get("dtype", "auto")), seed=0)
        profile_from(dict(config))  # a bad `profile` fails now, not after the run
    except (ValueError, TypeError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str is a repr
        raise ConfigError(str(message)) from exc


def _check_batch(config: Mapping[str, Any]) -> None:
    """``generation.batch_size`` / ``arrival`` / ``arrival_rate``, and what the batched loop cannot
    run yet (draft trees, another verifier than ``hf``)."""
    from specpolicy.serving import ARRIVALS

    generation = config.get("generation") or {}
    batch = integer("generation.batch_size", generation.get("batch_size", 1), 1)
    arrival = choice("generation.arrival", generation.get("arrival", "all_at_once"), ARRIVALS)
    rate = generation.get("arrival_rate", 0.0)
    if arrival == "poisson":
        number("generation.arrival_rate", rate, 0.0, low_open=True)
    if batch == 1:
        return
    why = f"generation.batch_size={batch} runs the batched loop, which "
    if (config.get("policy") or {}).get("name") in ("eagle2-tree", "block-tree", "failfast-tree"):
        raise ConfigError(why + f"verifies chains: policy={config['policy']['name']} drafts trees "
                          "(use generation.batch_size=1)")
    if (config.get("verifier") or {}).get("name", "hf") != "hf":
        raise ConfigError(why + f"verifies with the hf target: verifier={config['verifier']['name']} is not batched")


def _check_dataset(dataset: Mapping[str, Any]) -> list:
    from specpolicy.datasets import load_prompts, num_prompts_value

    offset = integer("dataset.offset", dataset.get("offset", 0), 0)
    count = num_prompts_value(dataset.get("num_prompts"))
    name = dataset.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"dataset.name must be a name, got {name!r}")
    return load_prompts(name, dataset.get("path"), count, offset)
