"""The plugin manager: built-ins and third-party plugins registered the same way.

Every policy, drafter, verifier and logger -- built-in or not -- is a module (or object)
whose functions carry ``@specpolicy.hookimpl`` and is registered in one pluggy
``PluginManager``; instances are built only through the factory hooks
(``specpolicy_make_policy`` ...), never by name lookups here. Built-ins are the modules of
``BUILTIN_PLUGINS``; third-party plugins are found through the entry-point group
``specpolicy``. Set the environment variable ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD=1`` to skip
them, or block a plugin by name with the config key ``plugins.block``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from specpolicy.core.errors import BLAME_ATTRIBUTE, PluginBlame, PluginError
from specpolicy.plugins import hookspecs

#: Modules of the built-in plugins, registered under their own module names.
BUILTIN_PLUGINS = (
    "specpolicy.verifiers.hf",
    "specpolicy.drafters.ar",
    "specpolicy.drafters.fastdllm",
    "specpolicy.drafters.suffix",
    "specpolicy.drafters.dflash",
    "specpolicy.drafters.eagle3",
    "specpolicy.drafters.easyspec",
    "specpolicy.drafters.dart",
    "specpolicy.drafters.deer",
    "specpolicy.drafters.falcon",
    "specpolicy.policies.static",
    "specpolicy.policies.failfast",
    "specpolicy.policies.specdecpp",
    "specpolicy.policies.aimd",
    "specpolicy.policies.adl",
    "specpolicy.policies.goodput",
    "specpolicy.policies.goodput_batch",
    "specpolicy.policies.batch_schedule",
    "specpolicy.policies.eagle2_tree",
    "specpolicy.policies.failfast_tree",
    "specpolicy.policies.block_tree",
    "specpolicy.policies.dart_tree",
    "specpolicy.policies.falcon_tree",
    "specpolicy.run.loggers.jsonl",
    "specpolicy.run.loggers.wandb",
)

AUTOLOAD_ENV = "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD"
#: Prefix of the names under which a run's loggers are registered (``logger:<name>``).
LOGGER_PREFIX = "logger:"


def autoload_enabled() -> bool:
    """False when ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD`` is set to anything but ``""``/``0``."""
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() in ("", "0", "false", "no")


def get_plugin_manager(block: Iterable[str] = (), autoload: bool | None = None) -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the built-ins and (unless disabled) the
    entry-point plugins of group ``specpolicy``.

    Args:
        block: plugin names (built-in module names or entry-point names) not to register.
        autoload: load entry-point plugins; default: unless ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD`` is set.
    Raises:
        PluginError: when an entry-point plugin fails to import (naming how to skip it).
        pluggy.PluginValidationError: when a plugin implements an unknown hook
            (``check_pending``) or a hook with wrong argument names.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in block:
        pm.set_blocked(name)
    for module_name in BUILTIN_PLUGINS:
        if not pm.is_blocked(module_name):
            pm.register(importlib.import_module(module_name), name=module_name)
    if autoload is None:
        autoload = autoload_enabled()
    if autoload:
        try:
            pm.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
        except (ImportError, AttributeError, SyntaxError) as exc:
            raise PluginError(
                f"loading a plugin of the entry-point group {hookspecs.PROJECT_NAME!r} failed: {exc!r}; "
                f"block it with plugins.block=[NAME] or set {AUTOLOAD_ENV}=1 to skip all third-party plugins"
            ) from exc
    pm.check_pending()
    return pm


def _make(kind: str, hook, name: str, **kwargs: Any):
    """The first non-None answer of a ``firstresult`` factory hook, calling the implementations in
    pluggy's order (last registered first, ``tryfirst``/``trylast`` respected) one by one, so the
    object can be traced to the plugin that built it (``provider``)."""
    kwargs["name"] = name
    for impl in reversed(hook.get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:  # factories have none; nothing to wrap around
            continue
        obj = impl.function(*(kwargs[arg] for arg in impl.argnames))
        if obj is not None:
            _remember_provider(obj, PluginBlame(impl.plugin_name, _module_of(impl.plugin), hook.name))
            return obj
    raise ValueError(f"no registered plugin provides {kind} {name!r}; see `python -m specpolicy --list-plugins`")


#: object -> the plugin whose factory built it (``_make``); weak, so runs do not keep objects alive.
_PROVIDERS: weakref.WeakKeyDictionary[Any, PluginBlame] = weakref.WeakKeyDictionary()


def _remember_provider(obj: Any, blame: PluginBlame) -> None:
    try:
        _PROVIDERS[obj] = blame
    except TypeError:  # not weak-referenceable or not hashable: errors in it are blamed by frame only
        pass


def provider(obj: Any) -> PluginBlame | None:
    """The plugin (name, module, factory hook) that built ``obj`` through a ``make_*`` function, or None."""
    try:
        return _PROVIDERS.get(obj)
    except TypeError:
        return None


def _module_of(plugin: Any) -> str:
    """The module implementing a registered plugin (a module, or an object such as a run logger)."""
    return plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__


def blame(error: BaseException, pm: pluggy.PluginManager) -> PluginBlame | None:
    """Which plugin ``error`` was raised in, recorded on the error (attribute
    ``specpolicy.core.errors.BLAME_ATTRIBUTE``; the CLI prints it in one line), or None.

    The traceback is read from the outermost frame in: the first frame that is a hook
    implementation of a registered plugin names that plugin and hook; the first frame that is a
    method of an object a plugin built (the run's policy, drafter, verifier: ``provider``) names
    that plugin and the method (``next_length``, ``draft``, ...). An error the loop
    raises about a policy's answer (``specpolicy.core.policy.PolicyAnswerError``) names that policy's
    plugin and ``next_length``. A blame already recorded is kept."""
    from specpolicy.core.policy import PolicyAnswerError

    found = getattr(error, BLAME_ATTRIBUTE, None)
    if found is not None:
        return found
    if isinstance(error, PolicyAnswerError) and provider(error.policy) is not None:
        p = provider(error.policy)
        found = PluginBlame(p.name, p.module, "next_length")
    impls = {}
    for caller in vars(pm.hook).values():
        for impl in getattr(caller, "get_hookimpls", lambda: [])():
            code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
            if code is not None:
                impls[code] = (impl, caller.name)
    tb = error.__traceback__
    while found is None and tb is not None:
        frame = tb.tb_frame
        if frame.f_code in impls:
            impl, hook_name = impls[frame.f_code]
            found = PluginBlame(impl.plugin_name, _module_of(impl.plugin), hook_name)
        else:
            built = provider(frame.f_locals.get("self"))
            if built is not None:
                found = PluginBlame(built.name, built.module, frame.f_code.co_name)
        tb = tb.tb_next
    if found is not None:
        try:
            setattr(error, BLAME_ATTRIBUTE, found)
        except AttributeError:
            pass
    return found


def call_each(hook, **kwargs: Any) -> list[tuple[PluginBlame, BaseException]]:
    """Call every implementation of a lifecycle hook (pluggy's order), each even when an earlier
    one raised (e.g. on ``specpolicy_run_abort``: every logger gets to close its files); return
    ``(plugin, error)`` for each implementation that raised ``Exception``."""
    failures = []
    for impl in reversed(hook.get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            impl.function(*(kwargs[arg] for arg in impl.argnames))
        except Exception as exc:  # noqa: BLE001 - reported by the caller, never hides the run's error
            failures.append((PluginBlame(impl.plugin_name, _module_of(impl.plugin), hook.name), exc))
    return failures


def make_policy(pm: pluggy.PluginManager, config: dict[str, Any]):
    """Instantiate the policy named by ``config['name']`` through ``specpolicy_make_policy``."""
    cfg = dict(config)
    return _make("policy", pm.hook.specpolicy_make_policy, cfg.pop("name"), config=cfg)


def make_verifier(pm: pluggy.PluginManager, config: dict[str, Any], runtime):
    """Instantiate the verifier named by ``config['name']``."""
    cfg = dict(config)
    return _make("verifier", pm.hook.specpolicy_make_verifier, cfg.pop("name"), config=cfg, runtime=runtime)


def make_drafter(pm: pluggy.PluginManager, config: dict[str, Any], runtime, verifier):
    """Instantiate the drafter named by ``config['name']``, checked against ``verifier``."""
    cfg = dict(config)
    return _make(
        "drafter", pm.hook.specpolicy_make_drafter, cfg.pop("name"), config=cfg, runtime=runtime, verifier=verifier
    )


def make_loggers(pm: pluggy.PluginManager, config: Mapping[str, Any] | None, run_dir: str | Path) -> dict[str, Any]:
    """Instantiate one logger per key of ``config`` (the composed ``logger`` node, e.g.
    ``{"jsonl": {...}, "wandb": {...}}``) through ``specpolicy_make_logger``; not registered yet.

    Raises:
        ValueError: for a name no plugin provides.
    """
    return {
        name: _make("logger", pm.hook.specpolicy_make_logger, str(name), config=dict(cfg or {}), run_dir=str(run_dir))
        for name, cfg in (config or {}).items()
    }


@contextlib.contextmanager
def registered(pm: pluggy.PluginManager, loggers: Mapping[str, Any]) -> Iterator[None]:
    """Register ``loggers`` (from ``make_loggers``) as plugins ``logger:<name>`` for the block's
    duration, so the lifecycle hooks reach them; unregistered on exit, also on errors.

    Raises:
        pluggy.PluginValidationError: for a logger implementing an unknown hook.
    """
    names = []
    try:
        for name, logger in loggers.items():
            names.append(pm.register(logger, name=LOGGER_PREFIX + name))
        pm.check_pending()
        yield
    finally:
        for name in names:
            if name is not None and pm.get_plugin(name) is not None:
                pm.unregister(name=name)


#: How to go on without a broken third-party plugin (appended to a ``PluginError``'s message).
WAY_OUT = f"fix or uninstall the plugin, or set {AUTOLOAD_ENV}=1 to skip every third-party plugin"


def _searchpath_entry(entry: Any, where: PluginBlame) -> str:
    """A plugin's search-path entry as Hydra takes it (a plain directory becomes
    ``file://<absolute path>``), after checking that it names an existing package or directory."""
    if not isinstance(entry, (str, os.PathLike)):
        raise PluginError(
            f"{where}: returned a list holding {entry!r} ({type(entry).__name__}); each entry must be a "
            f"string such as 'pkg://my_pkg.conf' or a directory; {WAY_OUT}"
        )
    entry = str(entry)
    if "://" in entry and not entry.startswith(("pkg://", "file://")):
        raise PluginError(
            f"{where}: returned the config search path {entry!r}; use pkg:// or file:// "
            f"(or a plain directory); {WAY_OUT}"
        )
    if not entry.startswith(("pkg://", "file://")):
        entry = "file://" + str(Path(entry).expanduser().resolve())
    if entry.startswith("file://"):
        if not Path(entry[len("file://") :]).is_dir():
            raise PluginError(
                f"{where}: returned the config search path {entry!r}, which is not a directory; {WAY_OUT}"
            )
        return entry
    package = entry[len("pkg://") :].strip("/").replace("/", ".")
    try:
        spec = importlib.util.find_spec(package) if package else None
    except (ImportError, ValueError):  # a parent that is not a package
        spec = None
    if spec is None or spec.submodule_search_locations is None:
        raise PluginError(
            f"{where}: returned the config search path {entry!r}, but there is no package "
            f"{package!r} to hold config files (is it installed, with its conf/ files?); {WAY_OUT}"
        )
    return entry


def config_searchpath(pm: pluggy.PluginManager) -> list[tuple[str, str]]:
    """``(plugin name, Hydra search-path entry)`` for every entry plugins return from
    ``specpolicy_config_searchpath`` (a list of entries, or None), in registration order. Plain
    directories become ``file://<absolute path>``.

    Raises:
        PluginError: naming the plugin and the hook, for an answer that is not a list (e.g. the
            string ``"pkg://my_pkg.conf"`` instead of ``["pkg://my_pkg.conf"]``), an entry with a
            scheme other than ``pkg://`` and ``file://``, an entry naming no package or directory,
            or a hook that raises.
    """
    out = []
    for impl in pm.hook.specpolicy_config_searchpath.get_hookimpls():  # registration order
        where = PluginBlame(impl.plugin_name, _module_of(impl.plugin), "specpolicy_config_searchpath")
        try:
            result = impl.function()
        except Exception as exc:  # noqa: BLE001 - a plugin's own failure, named in one line
            raise PluginError(f"{where}: raised {type(exc).__name__}: {exc}; {WAY_OUT}") from exc
        if result is None:
            continue
        if not isinstance(result, (list, tuple)):
            example = f"[{result!r}]" if isinstance(result, (str, os.PathLike)) else "['pkg://my_pkg.conf']"
            raise PluginError(
                f"{where}: returned {result!r} ({type(result).__name__}), not a list of search-path "
                f"entries; return e.g. {example}; {WAY_OUT}"
            )
        for entry in result:
            out.append((impl.plugin_name, _searchpath_entry(entry, where)))
    return out


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin: ``name`` (what ``plugins.block`` takes), ``origin`` ("built-in",
    or the distribution and version that declared the entry point) and the specpolicy hooks
    it implements (``make_policy``, ``round_end``, ...)."""

    name: str
    origin: str
    hooks: tuple[str, ...]


def plugin_infos(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every registered plugin (see ``PluginInfo``), built-ins first."""
    dists = {
        id(plugin): f"{dist.project_name} {dist.version} (entry point)" for plugin, dist in pm.list_plugin_distinfo()
    }
    prefix = hookspecs.PROJECT_NAME + "_"
    infos = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            continue
        origin = dists.get(id(plugin)) or ("built-in" if name in BUILTIN_PLUGINS else "registered at run time")
        hooks = tuple(sorted(h.name.removeprefix(prefix) for h in pm.get_hookcallers(plugin) or ()))
        infos.append(PluginInfo(name, origin, hooks))
    return infos


def describe_plugins(pm: pluggy.PluginManager) -> list[tuple[str, str]]:
    """``(plugin name, where it came from)`` for every registered plugin."""
    return [(info.name, info.origin) for info in plugin_infos(pm)]
