"""The plugin manager: built-ins and third-party plugins registered the same way.

Third-party plugins are found through the entry-point group ``specpolicy``. Set the
environment variable ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD=1`` to skip them, or block a
plugin by name with the config key ``plugins.block``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import Any

import pluggy

from specpolicy import hookspecs

#: Modules of the built-in plugins, registered under their own module names.
BUILTIN_PLUGINS = (
    "specpolicy.verifiers.hf",
    "specpolicy.drafters.ar",
    "specpolicy.drafters.fastdllm",
    "specpolicy.policies.static",
    "specpolicy.policies.failfast",
    "specpolicy.policies.specdecpp",
    "specpolicy.policies.aimd",
)

AUTOLOAD_ENV = "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD"


def get_plugin_manager(block: Iterable[str] = (), autoload: bool | None = None) -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the built-ins and (unless disabled) the
    entry-point plugins of group ``specpolicy``.

    Args:
        block: plugin names (built-in module names or entry-point names) not to register.
        autoload: load entry-point plugins; default: unless ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD`` is set.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in block:
        pm.set_blocked(name)
    for module_name in BUILTIN_PLUGINS:
        if not pm.is_blocked(module_name):
            pm.register(importlib.import_module(module_name), name=module_name)
    if autoload is None:
        autoload = not os.environ.get(AUTOLOAD_ENV)
    if autoload:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
    pm.check_pending()
    return pm


def _make(kind: str, hook, name: str, **kwargs: Any):
    obj = hook(name=name, **kwargs)
    if obj is None:
        raise ValueError(f"no registered plugin provides {kind} {name!r}; see `python -m specpolicy --list-plugins`")
    return obj


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


def describe_plugins(pm: pluggy.PluginManager) -> list[tuple[str, str]]:
    """``(plugin name, where it came from)`` for every registered plugin."""
    dists = {id(plugin): f"{dist.project_name} {dist.version}" for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        origin = dists.get(id(plugin)) or ("built-in" if name in BUILTIN_PLUGINS else "registered at run time")
        rows.append((name, origin))
    return rows
