"""Plugin system: built-ins and entry-point plugins on one path (``specpolicy_register`` and its
``PluginEntry`` objects), precedence, the deprecated factory hooks, autoload switch, blocking,
hook validation, config search path of plugins, and ``--list-plugins``."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
import warnings

import pluggy
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from specpolicy import PluginEntry, hookimpl
from specpolicy.core.errors import ConfigError
from specpolicy.core.policy import LengthPolicy
from specpolicy.plugins import manager
from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning
from specpolicy.plugins.manager import (
    AUTOLOAD_ENV,
    BUILTIN_PLUGINS,
    PluginError,
    config_searchpath,
    get_plugin_manager,
    make_loggers,
    make_policy,
    plugin_infos,
    registered,
    registry,
)
from specpolicy.run.validation import validate_plugin_config


class _Fixed(LengthPolicy):
    def __init__(self, name: str, k: int = 1) -> None:
        self.name, self.k = name, k

    def next_length(self, draft) -> int:
        return max(self.k - draft.length, 0)


def _plugin_module(
    module_name: str, policy_name: str, searchpath: object = None, legacy: bool = False
) -> types.ModuleType:
    """A module declaring the policy ``policy_name`` in ``specpolicy_register`` (``legacy``: in
    the deprecated ``specpolicy_make_policy`` instead; optionally ``specpolicy_config_searchpath``),
    like a third-party package's plugin module."""
    mod = types.ModuleType(module_name)
    if legacy:

        @hookimpl
        def specpolicy_make_policy(name, config):
            return _Fixed(name, **config) if name == policy_name else None

        mod.specpolicy_make_policy = specpolicy_make_policy
    else:

        def validate(config):
            if config.get("k", 1) < 1:
                raise ConfigError(f"policy.k must be an integer >= 1, got {config['k']!r}")

        @hookimpl
        def specpolicy_register():
            factory = lambda config, name: _Fixed(name, **config)  # noqa: E731 - takes name too
            return [PluginEntry("policy", policy_name, factory, validate, f"{policy_name}: k tokens a round")]

        mod.specpolicy_register = specpolicy_register
    if searchpath is not None:

        @hookimpl
        def specpolicy_config_searchpath():
            return searchpath

        mod.specpolicy_config_searchpath = specpolicy_config_searchpath
    return mod


class _FakeDist:
    """The slice of ``importlib.metadata.Distribution`` pluggy reads."""

    def __init__(self, name: str, version: str, entry_points: list[importlib.metadata.EntryPoint]) -> None:
        self.metadata = {"name": name}
        self.version = version
        self.entry_points = entry_points


@pytest.fixture
def fake_dists(monkeypatch):
    """Install fake distributions: ``add(dist_name, ep_name, module)`` declares ``module`` in
    the entry-point group ``specpolicy`` of a fake distribution (plus one unrelated group)."""
    dists: list[_FakeDist] = []
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: list(dists))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)

    def add(dist_name: str, ep_name: str, module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, module.__name__, module)
        eps = [
            importlib.metadata.EntryPoint(ep_name, module.__name__, "specpolicy"),
            importlib.metadata.EntryPoint("other", "does.not.exist", "console_scripts"),
        ]
        dists.append(_FakeDist(dist_name, "1.2.3", eps))

    return add


def test_entry_point_plugin_builds_its_policy_and_reports_its_distribution(fake_dists):
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed"))
    pm = get_plugin_manager()
    policy = make_policy(pm, {"name": "fixed", "k": 3})
    assert isinstance(policy, _Fixed) and policy.k == 3
    infos = {i.name: i for i in plugin_infos(pm)}
    assert infos["fixed"].origin == "specpolicy-fixed 1.2.3 (entry point)"
    assert infos["fixed"].hooks == ("register",)
    assert [(e.kind, e.name) for e in infos["fixed"].entries] == [("policy", "fixed")]
    # built-ins come through the very same hook and are listed as such
    assert make_policy(pm, {"name": "static", "k": 2}).name == "static"
    assert all(infos[name].origin == "built-in" for name in BUILTIN_PLUGINS)


def test_autoload_switch_env_and_argument(fake_dists, monkeypatch):
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed"))
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    pm = get_plugin_manager()
    assert pm.get_plugin("fixed") is None
    with pytest.raises(ValueError, match="no registered plugin provides policy 'fixed'"):
        make_policy(pm, {"name": "fixed"})
    assert get_plugin_manager(autoload=True).get_plugin("fixed") is not None  # explicit wins
    monkeypatch.setenv(AUTOLOAD_ENV, "0")  # "0" means: not disabled
    assert get_plugin_manager().get_plugin("fixed") is not None


def test_block_by_entry_point_name_and_builtin_module(fake_dists):
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed"))
    pm = get_plugin_manager(block=["fixed", "specpolicy.policies.static"])
    for name in ("fixed", "static"):
        with pytest.raises(ValueError, match=f"no registered plugin provides policy '{name}'"):
            make_policy(pm, {"name": name})
    assert make_policy(pm, {"name": "failfast"}).name == "failfast"
    assert "fixed" not in {i.name for i in plugin_infos(pm)}


@pytest.mark.parametrize("legacy", [False, True], ids=["entry", "deprecated-hook"])
def test_later_registered_plugin_takes_precedence_for_a_builtin_name(fake_dists, legacy):
    fake_dists("specpolicy-static2", "static2", _plugin_module("fake_static_plugin", "static", legacy=legacy))
    pm = get_plugin_manager()
    policy = make_policy(pm, {"name": "static", "k": 4})
    assert isinstance(policy, _Fixed) and policy.k == 4  # the third-party implementation, not the built-in
    assert registry(pm)["policy", "static"].plugin == ("specpolicy.policies.static" if legacy else "static2")
    # the built-in wins again once the plugin is blocked
    assert type(make_policy(get_plugin_manager(block=["static2"]), {"name": "static", "k": 4})) is not _Fixed


def test_the_registry_holds_every_builtin_once_with_a_description():
    reg = registry(get_plugin_manager(autoload=False))
    assert {("policy", "failfast"), ("drafter", "dflash"), ("verifier", "hf"), ("logger", "jsonl")} <= set(reg)
    assert len(reg) == len(BUILTIN_PLUGINS)  # one entry per built-in module
    assert all(
        r.plugin in BUILTIN_PLUGINS and r.entry.description and "\n" not in r.entry.description for r in reg.values()
    )


def test_an_entrys_validator_checks_before_anything_loads(fake_dists):
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed"))
    pm = get_plugin_manager()
    validate_plugin_config(pm, "policy", "fixed", {"k": 2})
    with pytest.raises(ConfigError, match=r"^policy.k must be an integer >= 1, got 0$"):
        validate_plugin_config(pm, "policy", "fixed", {"k": 0})
    with pytest.raises(ConfigError, match="no registered plugin provides drafter 'fixed'"):
        validate_plugin_config(pm, "drafter", "fixed", {})


def test_a_deprecated_factory_hook_works_with_one_warning_per_plugin(fake_dists, monkeypatch):
    monkeypatch.setattr(manager, "_WARNED", set())
    fake_dists("specpolicy-old", "old", _plugin_module("fake_old_plugin", "old", legacy=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = get_plugin_manager()
        get_plugin_manager()  # a second manager in the same process: no second line
    lines = [str(w.message) for w in caught if issubclass(w.category, SpecpolicyDeprecationWarning)]
    assert lines == [
        "plugin old (fake_old_plugin) implements specpolicy_make_policy, deprecated (a later version drops "
        "them): declare its entries with the hook specpolicy_register, returning specpolicy.PluginEntry objects "
        "(docs/how-to/write-a-policy.md)"
    ]
    assert issubclass(SpecpolicyDeprecationWarning, DeprecationWarning)
    assert make_policy(pm, {"name": "old", "k": 3}).k == 3
    validate_plugin_config(pm, "policy", "old", {"k": 3})  # no validate hook: checked by building it


def _register_module(module_name: str, answer) -> types.ModuleType:
    mod = types.ModuleType(module_name)

    @hookimpl
    def specpolicy_register():
        return answer()

    mod.specpolicy_register = specpolicy_register
    return mod


def _static(config):
    return _Fixed("dup", **config)


@pytest.mark.parametrize(
    "answer, problem",
    [
        (
            lambda: [PluginEntry("policy", "dup", _static), PluginEntry("policy", "dup", _static)],
            "declares policy 'dup' twice",
        ),
        (
            lambda: [PluginEntry("polcy", "dup", _static)],
            "raised ValueError: PluginEntry kind 'polcy' is not one of policy, drafter, verifier, logger",
        ),
        (lambda: PluginEntry("policy", "dup", _static), "returned PluginEntry(kind='policy', name='dup', factory="),
        (lambda: [("policy", "dup", _static)], "returned [('policy', 'dup', <function _static"),
    ],
    ids=["duplicate", "bad-kind", "not-a-list", "not-an-entry"],
)
def test_a_duplicate_or_invalid_entry_is_one_line_naming_the_plugin(fake_dists, monkeypatch, capsys, answer, problem):
    fake_dists("specpolicy-dup", "dup", _register_module("fake_dup", answer))
    from specpolicy.run.cli import main

    monkeypatch.setattr(sys, "argv", ["specpolicy", "--list-plugins"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: plugin dup (fake_dup), in specpolicy_register: {problem}")
    assert line.endswith(WAY_OUT)


def test_a_factory_returning_none_is_named(fake_dists):
    fake_dists(
        "specpolicy-none",
        "none",
        _register_module("fake_none", lambda: [PluginEntry("policy", "x", lambda config: None)]),
    )
    with pytest.raises(PluginError, match=r"^plugin none \(fake_none\), in the factory of policy 'x': returned None"):
        make_policy(get_plugin_manager(), {"name": "x"})


def test_misspelled_hook_is_rejected_at_startup(fake_dists):
    mod = types.ModuleType("fake_typo_plugin")

    @hookimpl
    def specpolicy_make_polcy(name, config):  # typo: no such hook
        return None

    mod.specpolicy_make_polcy = specpolicy_make_polcy
    fake_dists("specpolicy-typo", "typo", mod)
    with pytest.raises(pluggy.PluginValidationError, match="specpolicy_make_polcy"):
        get_plugin_manager()


def test_broken_entry_point_names_the_ways_out(fake_dists, monkeypatch):
    dists = []
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: dists)
    dists.append(
        _FakeDist("broken", "0.1", [importlib.metadata.EntryPoint("broken", "no_such_module_xyz", "specpolicy")])
    )
    with pytest.raises(PluginError, match=r"plugins.block=\[NAME\].*SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD"):
        get_plugin_manager()
    assert get_plugin_manager(block=["broken"]).get_plugin("broken") is None


def test_config_searchpath_normalises_entries(fake_dists, tmp_path):
    fake_dists("specpolicy-a", "a", _plugin_module("fake_a", "a", ["pkg://specpolicy.conf", str(tmp_path)]))
    entries = config_searchpath(get_plugin_manager())
    assert entries == [("a", "pkg://specpolicy.conf"), ("a", f"file://{tmp_path.resolve()}")]


WAY_OUT = "fix or uninstall the plugin, or set SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD=1 to skip every third-party plugin"


def test_a_searchpath_hook_answering_a_string_is_named_in_one_line_on_every_command(fake_dists, monkeypatch, capsys):
    """The README's search path returned as a string, not a list: ``--list-plugins`` iterated its
    characters and crashed with a traceback, and ``policy=mine`` said only "no config"."""
    fake_dists("specpolicy-mine", "mine", _plugin_module("fake_mine", "mine", "pkg://fake_mine.conf"))
    line = (
        "error: plugin mine (fake_mine), in specpolicy_config_searchpath: returned 'pkg://fake_mine.conf' (str), "
        f"not a list of search-path entries; return e.g. ['pkg://fake_mine.conf']; {WAY_OUT}"
    )
    from specpolicy.run.cli import main

    for args in (["--list-plugins"], ["policy=mine"]):
        monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
        with pytest.raises(SystemExit) as info:
            main()
        assert info.value.code == 1
        assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize(
    "answer, problem",
    [
        (
            ["pkg://fake_bad_nowhere.conf"],
            "returned the config search path 'pkg://fake_bad_nowhere.conf', but there is "
            "no package 'fake_bad_nowhere.conf' to hold config files (is it installed, with "
            "its conf/ files?)",
        ),
        (["/no/such/dir"], "returned the config search path 'file:///no/such/dir', which is not a directory"),
        (
            [42],
            "returned a list holding 42 (int); each entry must be a string such as 'pkg://my_pkg.conf' or a directory",
        ),
        (
            {"policy": "conf"},
            "returned {'policy': 'conf'} (dict), not a list of search-path entries; return e.g. ['pkg://my_pkg.conf']",
        ),
    ],
)
def test_a_bad_searchpath_answer_names_the_plugin(fake_dists, answer, problem):
    fake_dists("specpolicy-bad", "bad", _plugin_module("fake_bad", "bad", answer))
    with pytest.raises(PluginError) as info:
        config_searchpath(get_plugin_manager())
    assert str(info.value) == f"plugin bad (fake_bad), in specpolicy_config_searchpath: {problem}; {WAY_OUT}"


def test_config_searchpath_rejects_unknown_scheme(fake_dists):
    fake_dists("specpolicy-b", "b", _plugin_module("fake_b", "b", ["http://example.invalid/conf"]))
    with pytest.raises(PluginError, match="pkg:// or file://"):
        config_searchpath(get_plugin_manager())


def test_plugin_config_files_compose_through_hydra(fake_dists, tmp_path):
    """A plugin's own ``policy/<name>.yaml`` is selectable with ``policy=<name>``."""
    conf = tmp_path / "conf"
    (conf / "policy").mkdir(parents=True)
    (conf / "policy" / "fixed.yaml").write_text("name: fixed\nk: 7\n")
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed", [str(conf)]))
    from specpolicy.run.hydra_searchpath import register

    register()
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=["policy=fixed"])
    assert OmegaConf.to_container(cfg.policy) == {"name": "fixed", "k": 7}
    assert make_policy(get_plugin_manager(), OmegaConf.to_container(cfg.policy)).k == 7


def test_loggers_are_plugins_registered_for_the_run_only(tmp_path):
    pm = get_plugin_manager(autoload=False)
    loggers = make_loggers(pm, {"jsonl": {"file": "out.jsonl"}}, tmp_path)
    with registered(pm, loggers):
        assert pm.get_plugin("logger:jsonl") is loggers["jsonl"]
        pm.hook.specpolicy_run_start(config={}, run_dir=str(tmp_path))
        pm.hook.specpolicy_prompt_end(method="m", prompt_id="p0", row={"prompt_id": "p0"}, result=None)
        pm.hook.specpolicy_run_end(summary={}, run_dir=str(tmp_path))
    assert pm.get_plugin("logger:jsonl") is None
    assert (tmp_path / "out.jsonl").read_text() == '{"prompt_id": "p0"}\n'
    with pytest.raises(ValueError, match="no registered plugin provides logger 'nope'"):
        make_loggers(pm, {"nope": {}}, tmp_path)


def test_list_plugins_prints_names_origins_and_plugin_configs(fake_dists, tmp_path, capsys):
    conf = tmp_path / "conf"
    (conf / "policy").mkdir(parents=True)
    (conf / "policy" / "fixed.yaml").write_text("name: fixed\n")
    fake_dists("specpolicy-fixed", "fixed", _plugin_module("fake_fixed_plugin", "fixed", [str(conf)]))
    from specpolicy.run.cli import list_plugins

    list_plugins([])
    out = capsys.readouterr().out
    assert "specpolicy.policies.failfast" in out and "built-in" in out
    assert "fixed" in out and "specpolicy-fixed 1.2.3 (entry point)" in out
    provided = out.splitlines()
    assert "  policy    fixed           fixed: k tokens a round  [fixed]" in provided
    assert any(line.startswith("  drafter   dflash ") and "[specpolicy.drafters.dflash]" in line for line in provided)
    assert f"file://{conf.resolve()}  policy/fixed" in out
    list_plugins(["plugins.block=[fixed]"])
    out = capsys.readouterr().out
    assert "specpolicy-fixed" not in out and "blocked: fixed" in out
