"""Hydra ``SearchPathPlugin`` that appends the config directories specpolicy plugins return
from the hook ``specpolicy_config_searchpath`` (e.g. ``pkg://my_plugin.conf`` holding
``policy/my_policy.yaml``), so ``python -m specpolicy policy=my_policy`` finds a plugin's
configs with no change to specpolicy.

It acts only on apps whose primary config is ``pkg://specpolicy.conf`` (the CLI, or
``hydra.initialize_config_module("specpolicy.conf")``). Hydra finds it through the shim
``hydra_plugins.specpolicy_searchpath`` in a regular install; the CLI also registers it
explicitly (``register()``), since Hydra's namespace scan cannot see packages of an editable
(``pip install -e``) install. Compose-API users of an editable install call ``register()``.

Config files are looked up before the run's config is composed, so ``plugins.block`` cannot
hide them; ``SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD=1`` does (no entry-point plugin is loaded).
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

SPECPOLICY_CONF = "pkg://specpolicy.conf"


class SpecpolicySearchPathPlugin(SearchPathPlugin):
    """Appends every plugin's ``specpolicy_config_searchpath`` entries (provider
    ``specpolicy-plugin:<plugin name>``) after specpolicy's own configs.

    Raises (from Hydra's config loading):
        specpolicy.plugins.manager.PluginError: for a broken entry-point plugin or a bad entry.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(element.path == SPECPOLICY_CONF for element in search_path.get_path()):
            return  # another Hydra app
        from specpolicy.plugins.manager import config_searchpath, get_plugin_manager

        present = {element.path for element in search_path.get_path()}
        for plugin, entry in config_searchpath(get_plugin_manager()):
            if entry not in present:
                search_path.append(provider=f"specpolicy-plugin:{plugin}", path=entry)
                present.add(entry)


def register() -> None:
    """Register the plugin with Hydra (idempotent)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(SpecpolicySearchPathPlugin)
