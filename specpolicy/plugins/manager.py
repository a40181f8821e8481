"""The plugin manager: built-ins and third-party plugins registered the same way.

Every policy, drafter, verifier and logger -- built-in or not -- is declared by a plugin: a
module (or object) registered in one pluggy ``PluginManager`` whose ``specpolicy_register``
hook returns its ``PluginEntry`` objects (kind, name, factory, validator, description).
``registry`` maps each (kind, name) to the entry of the last plugin declaring it; instances
are built only through the entries' factories (``make_policy`` ...), which record the plugin
that built each object so errors name it (``blame``). Built-ins are the modules of
``BUILTIN_PLUGINS``; third-party plugins are found through the entry-point group
``specpolicy``. Set the environment variable ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD=1`` to skip
them, or block a plugin by name with the config key ``plugins.block``.

Only pluggy's public API is used: each plugin's own hook functions are found with
``PluginManager.parse_hookimpl_opts`` over ``list_name_plugin`` (registration order) and called
one plugin at a time, so every answer and every error is traced to its plugin. The hooks of
earlier versions (``specpolicy_make_*``, ``specpolicy_validate_config``) keep working with one
``SpecpolicyDeprecationWarning`` per plugin; their precedence against entries follows
registration order as before (the last registered plugin first).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from specpolicy.core.errors import BLAME_ATTRIBUTE, PluginBlame, PluginError
from specpolicy.plugins import hookspecs
from specpolicy.plugins.hookspecs import PluginEntry

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
    _warn_deprecated_hooks(pm)
    _MANAGERS.add(pm)
    return pm


#: (plugin name, module) already warned about in this process (one line per plugin).
_WARNED: set[tuple[str, str]] = set()


def _warn_deprecated_hooks(pm: pluggy.PluginManager) -> None:
    """One ``SpecpolicyDeprecationWarning`` per process for each plugin implementing a hook of
    earlier versions (``LEGACY_HOOKS``), attributed to the plugin's first such function."""
    for name, plugin in plugins(pm):
        impls = hook_functions(pm, name, plugin)
        legacy = [hook for hook in LEGACY_HOOKS if hook in impls]
        if not legacy or (name, _module_of(plugin)) in _WARNED:
            continue
        _WARNED.add((name, _module_of(plugin)))
        function = impls[legacy[0]].function
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        warnings.warn_explicit(
            f"plugin {name} ({_module_of(plugin)}) implements {', '.join(legacy)}, deprecated "
            f"(a later version drops them): declare its entries with the hook specpolicy_register, "
            f"returning specpolicy.PluginEntry objects (docs/how-to/write-a-policy.md)",
            hookspecs.SpecpolicyDeprecationWarning,
            filename=code.co_filename if code else _module_of(plugin),
            lineno=code.co_firstlineno if code else 0,
            module=_module_of(plugin),
        )


# -- each plugin's own hook functions, through pluggy's public API -------------------------------

#: The factory hooks of earlier versions, per kind (deprecated: ``specpolicy_register``).
LEGACY_FACTORIES = {
    "policy": "specpolicy_make_policy",
    "drafter": "specpolicy_make_drafter",
    "verifier": "specpolicy_make_verifier",
    "logger": "specpolicy_make_logger",
}
LEGACY_VALIDATOR = "specpolicy_validate_config"
LEGACY_HOOKS = (*LEGACY_FACTORIES.values(), LEGACY_VALIDATOR)


@dataclass(frozen=True)
class HookFunction:
    """One plugin's implementation of one hook: the function, its pluggy options (``tryfirst``,
    ``trylast``, ...) and where it comes from (``blame``: plugin name, module, hook)."""

    function: Callable[..., Any]
    options: Mapping[str, Any]
    blame: PluginBlame


def plugins(pm: pluggy.PluginManager) -> list[tuple[str, Any]]:
    """``(name, plugin)`` of every registered, unblocked plugin, in registration order."""
    return [(name, plugin) for name, plugin in pm.list_name_plugin() if plugin is not None]


def hook_functions(pm: pluggy.PluginManager, name: str, plugin: Any) -> dict[str, HookFunction]:
    """Hook name -> ``HookFunction`` for the specpolicy hooks ``plugin`` (registered as ``name``)
    implements, found as pluggy finds them when registering (``parse_hookimpl_opts``, honouring
    ``specname``)."""
    found = {}
    for attr in dir(plugin):
        try:
            options = pm.parse_hookimpl_opts(plugin, attr)
        except Exception:  # noqa: BLE001 - an attribute that cannot be read implements nothing
            continue
        if options is None:
            continue
        hook = options.get("specname") or attr
        found[hook] = HookFunction(getattr(plugin, attr), options, PluginBlame(name, _module_of(plugin), hook))
    return found


def _call(function: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """``function`` called with the keyword arguments it names (any subset, as pluggy passes a
    hook's arguments; all of them when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass everything
        return function(**kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return function(**kwargs)
    return function(**{p.name: kwargs[p.name] for p in params if p.name in kwargs})


def _blamed(where: PluginBlame, function: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """``_call``, recording ``where`` on an ``Exception`` it raises (unless one is recorded:
    ``blame``), so the CLI's one line names the plugin."""
    try:
        return _call(function, kwargs)
    except Exception as exc:
        if getattr(exc, BLAME_ATTRIBUTE, None) is None:
            with contextlib.suppress(AttributeError):
                setattr(exc, BLAME_ATTRIBUTE, where)
        raise


# -- the registry: what every plugin declares with specpolicy_register ---------------------------


@dataclass(frozen=True)
class Registered:
    """A ``PluginEntry`` and the plugin that declared it (``plugin``: its registered name, what
    ``plugins.block`` takes; ``module``: the module implementing it)."""

    entry: PluginEntry
    plugin: str
    module: str

    def where(self, role: str) -> PluginBlame:
        """The blame for an error in the entry's ``role`` (``factory`` or ``validator``)."""
        return PluginBlame(self.plugin, self.module, f"the {role} of {self.entry.kind} {self.entry.name!r}")


def declared(pm: pluggy.PluginManager, name: str, plugin: Any) -> list[Registered]:
    """The entries ``plugin`` (registered as ``name``) declares in ``specpolicy_register``; []
    when it does not implement the hook.

    Raises:
        PluginError: naming the plugin, for a hook that raises, an answer that is not a list of
            ``PluginEntry``, or a (kind, name) declared twice.
    """
    impl = hook_functions(pm, name, plugin).get("specpolicy_register")
    if impl is None:
        return []
    where = impl.blame
    try:
        answer = _call(impl.function, {})
    except Exception as exc:  # noqa: BLE001 - a plugin's own failure (a bad PluginEntry included), one line
        raise PluginError(f"{where}: raised {type(exc).__name__}: {exc}; {WAY_OUT}") from exc
    if not isinstance(answer, (list, tuple)) or not all(isinstance(e, PluginEntry) for e in answer):
        raise PluginError(f"{where}: returned {answer!r}, not a list of specpolicy.PluginEntry; {WAY_OUT}")
    seen: set[tuple[str, str]] = set()
    for entry in answer:
        if (entry.kind, entry.name) in seen:
            raise PluginError(f"{where}: declares {entry.kind} {entry.name!r} twice; {WAY_OUT}")
        seen.add((entry.kind, entry.name))
    return [Registered(entry, name, where.module) for entry in answer]


def registry(pm: pluggy.PluginManager) -> dict[tuple[str, str], Registered]:
    """``(kind, name) -> Registered`` for every entry plugins declare, in registration order: a
    later plugin's entry replaces an earlier one's of the same (kind, name) (an entry-point plugin
    overrides a built-in).

    Raises:
        PluginError: as ``declared``.
    """
    out: dict[tuple[str, str], Registered] = {}
    for name, plugin in plugins(pm):
        for registered in declared(pm, name, plugin):
            out[registered.entry.kind, registered.entry.name] = registered
    return out


def _providers(pm: pluggy.PluginManager, kind: str, name: str) -> Iterator[Registered | HookFunction]:
    """What may provide ``kind`` ``name``, most precedent first (the last registered plugin first):
    a plugin's entry for it, or a plugin's deprecated factory hook (which answers None for names
    not its own)."""
    for plugin_name, plugin in reversed(plugins(pm)):
        mine = [r for r in declared(pm, plugin_name, plugin) if (r.entry.kind, r.entry.name) == (kind, name)]
        if mine:
            yield mine[0]
            continue
        legacy = hook_functions(pm, plugin_name, plugin).get(LEGACY_FACTORIES[kind])
        if legacy is not None:
            yield legacy


def _make(pm: pluggy.PluginManager, kind: str, name: str, **kwargs: Any):
    """The instance of ``kind`` ``name`` built by its most precedent provider (``_providers``),
    remembered as that plugin's (``provider``).

    Raises:
        ValueError: no registered plugin provides it.
        PluginError: an entry's factory returned None.
    """
    kwargs["name"] = name
    for source in _providers(pm, kind, name):
        if isinstance(source, Registered):
            where = source.where("factory")
            obj = _blamed(where, source.entry.factory, kwargs)
            if obj is None:
                raise PluginError(f"{where}: returned None; a factory returns the {kind} or raises; {WAY_OUT}")
        else:
            where = source.blame
            obj = _blamed(where, source.function, kwargs)
            if obj is None:
                continue
        _remember_provider(obj, where)
        return obj
    raise ValueError(f"no registered plugin provides {kind} {name!r}; see `python -m specpolicy --list-plugins`")


def validate(
    pm: pluggy.PluginManager, kind: str, name: str, config: dict[str, Any], run_config: dict[str, Any]
) -> bool:
    """Have the provider of ``kind`` ``name`` check ``config`` (a copy; ``run_config``: the whole
    run config, or ``{}``) before anything loads: an entry's ``validate``, else -- for a policy
    -- by building it; a plugin's deprecated ``specpolicy_validate_config``. Returns False when
    no plugin provides the name: none declares it, none claims it in a deprecated validate hook,
    and none with a deprecated factory hook but no validate hook could build it.

    Raises:
        ConfigError / ValueError / TypeError: the provider's refusal (blamed on it: ``blame``).
        ValueError: for a policy no plugin provides.
    """
    for plugin_name, plugin in reversed(plugins(pm)):
        mine = [r for r in declared(pm, plugin_name, plugin) if (r.entry.kind, r.entry.name) == (kind, name)]
        if mine:
            entry = mine[0].entry
            if entry.validate is not None:
                arguments = {"config": dict(config), "run_config": dict(run_config), "name": name}
                _blamed(mine[0].where("validator"), entry.validate, arguments)
            elif kind == "policy":  # policies are cheap: building one checks it
                _blamed(mine[0].where("factory"), entry.factory, {"config": dict(config), "name": name})
            return True
        legacy = hook_functions(pm, plugin_name, plugin).get(LEGACY_VALIDATOR)
        arguments = {"group": kind, "name": name, "config": dict(config), "run_config": dict(run_config)}
        if legacy is not None and _blamed(legacy.blame, legacy.function, arguments):
            return True
    if kind == "policy":  # a policy of a deprecated factory hook without a validate hook: build it
        make_policy(pm, {"name": name, **config})
        return True
    return any(
        LEGACY_FACTORIES[kind] in impls and LEGACY_VALIDATOR not in impls
        for impls in (hook_functions(pm, n, p) for n, p in plugins(pm))
    )


#: object -> the plugin whose factory built it (``_make``); weak, so runs do not keep objects alive.
_PROVIDERS: weakref.WeakKeyDictionary[Any, PluginBlame] = weakref.WeakKeyDictionary()


def _remember_provider(obj: Any, blame: PluginBlame) -> None:
    try:
        _PROVIDERS[obj] = blame
    except TypeError:  # not weak-referenceable or not hashable: errors in it are blamed by frame only
        pass


def provider(obj: Any) -> PluginBlame | None:
    """The plugin (name, module, factory) that built ``obj`` through a ``make_*`` function, or None."""
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

    An error raised by an entry's factory or validator is recorded as that plugin's when it is
    raised (``_make``, ``validate``). Otherwise the traceback is read from the outermost frame
    in: the first frame that is a hook implementation of a registered plugin names that plugin
    and hook; the first frame that is a method of an object a plugin built (the run's policy,
    drafter, verifier: ``provider``) names that plugin and the method (``next_length``,
    ``draft``, ...). An error the loop raises about a policy's answer
    (``specpolicy.core.policy.PolicyAnswerError``) names that policy's plugin and
    ``next_length``. A blame already recorded is kept."""
    from specpolicy.core.policy import PolicyAnswerError

    found = getattr(error, BLAME_ATTRIBUTE, None)
    if found is not None:
        return found
    if isinstance(error, PolicyAnswerError) and provider(error.policy) is not None:
        p = provider(error.policy)
        found = PluginBlame(p.name, p.module, "next_length")
    impls = {}
    for name, plugin in plugins(pm):
        for impl in hook_functions(pm, name, plugin).values():
            code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
            if code is not None:
                impls[code] = impl.blame
    tb = error.__traceback__
    while found is None and tb is not None:
        frame = tb.tb_frame
        if frame.f_code in impls:
            found = impls[frame.f_code]
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


#: Managers built by ``get_plugin_manager`` (weak), to find the one a ``HookCaller`` belongs to.
_MANAGERS: weakref.WeakSet[pluggy.PluginManager] = weakref.WeakSet()


def call_each(pm: pluggy.PluginManager | Any, hook: str | None = None, /, **kwargs: Any):
    """Call every plugin's implementation of the lifecycle hook named ``hook`` in pluggy's order
    (``tryfirst`` ones first, ``trylast`` ones last, otherwise the last registered first), each
    even when an earlier one raised (e.g. on ``specpolicy_run_abort``: every logger gets to close
    its files); return ``(plugin, error)`` for each implementation that raised ``Exception``.

    ``call_each(pm.hook.NAME, **kwargs)`` (a hook caller of a manager from
    ``get_plugin_manager``; the form of earlier versions) is accepted as ``call_each(pm, "NAME",
    **kwargs)``.

    Raises:
        TypeError: a hook caller of a manager ``get_plugin_manager`` did not build.
    """
    if hook is None:  # call_each(pm.hook.NAME, ...): the caller's manager
        caller, hook = pm, getattr(pm, "name", "")
        pm = next((m for m in list(_MANAGERS) if getattr(m.hook, hook, None) is caller), None)
        if pm is None:
            raise TypeError(f"call_each({caller!r}): pass the plugin manager and the hook's name, call_each(pm, NAME)")
    found = [impl for n, p in reversed(plugins(pm)) if (impl := hook_functions(pm, n, p).get(hook)) is not None]
    order = [i for i in found if i.options.get("tryfirst")]
    order += [i for i in found if not i.options.get("tryfirst") and not i.options.get("trylast")]
    order += [i for i in found if i.options.get("trylast") and not i.options.get("tryfirst")]
    failures = []
    for impl in order:
        if impl.options.get("hookwrapper") or impl.options.get("wrapper"):
            continue
        try:
            _call(impl.function, kwargs)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, never hides the run's error
            failures.append((impl.blame, exc))
    return failures


def make_policy(pm: pluggy.PluginManager, config: dict[str, Any]):
    """Instantiate the policy named by ``config['name']`` through its plugin's entry (``registry``).

    Raises:
        ValueError: a name no plugin provides, or the factory's refusal (blamed on its plugin).
    """
    cfg = dict(config)
    return _make(pm, "policy", cfg.pop("name"), config=cfg)


def make_verifier(pm: pluggy.PluginManager, config: dict[str, Any], runtime):
    """Instantiate the verifier named by ``config['name']`` (as ``make_policy``)."""
    cfg = dict(config)
    return _make(pm, "verifier", cfg.pop("name"), config=cfg, runtime=runtime)


def make_drafter(pm: pluggy.PluginManager, config: dict[str, Any], runtime, verifier):
    """Instantiate the drafter named by ``config['name']``, checked against ``verifier`` (as ``make_policy``)."""
    cfg = dict(config)
    return _make(pm, "drafter", cfg.pop("name"), config=cfg, runtime=runtime, verifier=verifier)


def make_loggers(pm: pluggy.PluginManager, config: Mapping[str, Any] | None, run_dir: str | Path) -> dict[str, Any]:
    """Instantiate one logger per key of ``config`` (the composed ``logger`` node, e.g.
    ``{"jsonl": {...}, "wandb": {...}}``) through its plugin's entry; not registered yet.

    Raises:
        ValueError: for a name no plugin provides.
    """
    return {
        name: _make(pm, "logger", str(name), config=dict(cfg or {}), run_dir=str(run_dir))
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
    for name, plugin in plugins(pm):  # registration order
        impl = hook_functions(pm, name, plugin).get("specpolicy_config_searchpath")
        if impl is None:
            continue
        where = impl.blame
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
            out.append((name, _searchpath_entry(entry, where)))
    return out


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin: ``name`` (what ``plugins.block`` takes), ``origin`` ("built-in",
    or the distribution and version that declared the entry point), the specpolicy hooks it
    implements (``register``, ``round_end``, ...) and the entries it declares (``PluginEntry``)."""

    name: str
    origin: str
    hooks: tuple[str, ...]
    entries: tuple[PluginEntry, ...] = ()


def plugin_infos(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every registered plugin (see ``PluginInfo``), built-ins first.

    Raises:
        PluginError: a plugin's ``specpolicy_register`` fails (``declared``)."""
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
        infos.append(PluginInfo(name, origin, hooks, tuple(r.entry for r in declared(pm, name, plugin))))
    return infos


def describe_plugins(pm: pluggy.PluginManager) -> list[tuple[str, str]]:
    """``(plugin name, where it came from)`` for every registered plugin."""
    return [(info.name, info.origin) for info in plugin_infos(pm)]
