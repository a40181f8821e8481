"""Errors raised inside a plugin name the plugin (entry-point name and module) and the hook or
method; a failing abort hook never replaces the run's own error."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
from hydra import compose, initialize_config_module

from conftest import overrides
from specpolicy import PluginEntry, hookimpl
from specpolicy.core.errors import BLAME_ATTRIBUTE, PluginBlame, one_line
from specpolicy.core.policy import LengthPolicy, PolicyAnswerError
from specpolicy.plugins.manager import AUTOLOAD_ENV
from specpolicy.run.cli import main
from specpolicy.run.experiment import run_experiment


class _Answer(LengthPolicy):
    """Answers ``answer`` to the empty draft; raises ``error`` instead when given."""

    name = "odd"

    def __init__(self, answer=2, error: Exception | None = None, k: int = 0) -> None:
        self.answer, self.error = answer, error

    def next_length(self, draft) -> int:
        if self.error is not None:
            raise self.error
        return self.answer if draft.length == 0 else 0


class _Dist:
    def __init__(self, name: str, entry_points) -> None:
        self.metadata, self.version, self.entry_points = {"name": name}, "0.1", entry_points


@pytest.fixture
def plugin(monkeypatch):
    """``plugin(module)``: install ``module`` as the entry point ``oddity`` of a fake distribution."""

    def install(module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, module.__name__, module)
        ep = importlib.metadata.EntryPoint("oddity", module.__name__, "specpolicy")
        monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: [_Dist("oddity-dist", [ep])])
        monkeypatch.delenv(AUTOLOAD_ENV, raising=False)

    return install


def policy_module(**policy_kwargs) -> types.ModuleType:
    module = types.ModuleType("oddity_pkg.plugin")

    @hookimpl
    def specpolicy_register():
        return [PluginEntry("policy", "odd", lambda config: _Answer(**policy_kwargs, **config))]

    module.specpolicy_register = specpolicy_register
    return module


def cfg(family, *extra: str):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return compose("config", overrides=[*overrides(family), "policy=static", "policy.name=odd", *extra])


def test_a_policy_answering_a_fraction_is_the_policys_error_not_the_drafters(family, plugin, tmp_path):
    plugin(policy_module(answer=2.5))
    with pytest.raises(PolicyAnswerError) as info:
        run_experiment(cfg(family), tmp_path)
    assert getattr(info.value, BLAME_ATTRIBUTE) == PluginBlame("oddity", "oddity_pkg.plugin", "next_length")
    line, status = one_line(info.value)
    assert status == 1
    assert line == (
        "error in plugin oddity (oddity_pkg.plugin), in next_length: PolicyAnswerError: policy 'odd' "
        "returned 2.5 from next_length (a float); a speculation length must be an integer >= 0 "
        "(--debug shows the traceback)"
    )


def test_a_policy_raising_inside_next_length_is_named_on_the_command_line(
    family, plugin, tmp_path, monkeypatch, capsys
):
    plugin(policy_module(error=RuntimeError("window state lost")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["specpolicy", *overrides(family), "policy=static", "policy.name=odd"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()  # progress bars of model loading, then the error
    assert err[-1] == (
        "error in plugin oddity (oddity_pkg.plugin), in next_length: RuntimeError: window state lost "
        "(--debug shows the traceback)"
    )
    assert not any("Traceback" in line for line in err)


def test_a_failing_abort_hook_is_reported_and_the_original_error_survives(family, plugin, tmp_path, capsys):
    module = policy_module(answer=2)

    @hookimpl
    def specpolicy_prompt_end(row):
        raise RuntimeError("the original error")

    @hookimpl
    def specpolicy_run_abort(error):
        raise OSError(28, "No space left on device")

    module.specpolicy_prompt_end, module.specpolicy_run_abort = specpolicy_prompt_end, specpolicy_run_abort
    plugin(module)
    with pytest.raises(RuntimeError, match="the original error") as info:
        run_experiment(cfg(family), tmp_path)
    assert getattr(info.value, BLAME_ATTRIBUTE) == PluginBlame("oddity", "oddity_pkg.plugin", "specpolicy_prompt_end")
    err = capsys.readouterr().err.splitlines()
    assert (
        "warning: plugin oddity (oddity_pkg.plugin), in specpolicy_run_abort failed while the run was aborting: "
        "OSError: [Errno 28] No space left on device"
    ) in err
    assert (tmp_path / "results.jsonl").exists()  # the jsonl logger's abort hook ran too (file closed)


class _Parsing(LengthPolicy):
    """A plugin policy that parses its own settings (no ``specpolicy_validate_config`` hook)."""

    name = "odd"

    def __init__(self, k=3, window=4) -> None:
        self.k, self.window = int(k), int(window)

    def next_length(self, draft) -> int:
        return max(self.k - draft.length, 0)


def parsing_module(legacy: bool = True) -> types.ModuleType:
    """The plugin as a module of the deprecated factory hook (``legacy``) or with an entry."""
    module = types.ModuleType("oddity_pkg.parsing")
    if not legacy:

        @hookimpl
        def specpolicy_register():
            return [PluginEntry("policy", "odd", lambda config: _Parsing(**config))]

        module.specpolicy_register = specpolicy_register
        return module

    @hookimpl
    def specpolicy_make_policy(name, config):
        return _Parsing(**config) if name == "odd" else None

    module.specpolicy_make_policy = specpolicy_make_policy
    return module


@pytest.mark.parametrize(
    "extra, line",
    [
        (
            ["policy.k=abc", "+entry=1"],
            "error: policy.k='abc' was refused by plugin oddity (oddity_pkg.parsing), in "
            "the factory of policy 'odd': ValueError: invalid literal for int() with base 10: 'abc'",
        ),
        (
            ["policy.k=abc"],
            "error: policy.k='abc' was refused by plugin oddity (oddity_pkg.parsing), in "
            "specpolicy_make_policy: ValueError: invalid literal for int() with base 10: 'abc'",
        ),
        (
            ["+policy.windw=8"],
            "error: policy.windw=8 was refused by plugin oddity (oddity_pkg.parsing), in "
            "specpolicy_make_policy: TypeError: _Parsing.__init__() got an unexpected keyword argument "
            "'windw'",
        ),
        (
            ["policy.k=x", "+policy.window=x"],
            "error: policy 'odd' refused its settings (policy.k='x', policy.window='x') "
            "by plugin oddity (oddity_pkg.parsing), in specpolicy_make_policy: "
            "ValueError: invalid literal for int() with base 10: 'x'",
        ),
    ],
)
def test_a_plugin_factory_refusing_a_value_names_the_key_and_the_plugin(
    family, plugin, tmp_path, monkeypatch, capsys, extra, line
):
    """A plugin without a validator (an entry without ``validate``, or the deprecated hooks without
    ``specpolicy_validate_config``) is checked by building its policy; when its factory raises on
    a value the line names the key (when its value or name is quoted) and the plugin, before any
    model loads (status 2)."""
    plugin(parsing_module(legacy="+entry=1" not in extra))  # the entry's factory, or the deprecated hook
    extra = [e for e in extra if e != "+entry=1"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["specpolicy", *overrides(family), "policy=static", "policy.name=odd", *extra])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]
