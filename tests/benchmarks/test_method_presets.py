"""``conf/method/`` is the one list of named methods: every preset composes and validates as
``python -m specpolicy method=<name>`` would (no model loads), every method the benchmarks run by
default is a preset, ``--method`` takes a preset by name or a one-off, a name that is no preset is
one line naming the accepted ones, and the peers table's footer names only rows it has."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import load_benchmark
from specpolicy.core.errors import ConfigError
from specpolicy.models.loading import bundled_dir
from specpolicy.plugins.manager import get_plugin_manager
from specpolicy.run.validation import validate_config

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "method").glob("*.yaml"))


@pytest.mark.slow  # one Hydra composition per preset (~0.1-0.5 s each) and each plugin's check; no model loads
def test_every_preset_composes_and_validates_and_the_defaults_run_on_their_benchmark_s_drafters():
    peers, runtime = load_benchmark("peers"), load_benchmark("runtime")
    pm = get_plugin_manager()
    falcon_bundled = (bundled_dir() / "falcon-drafter" / "config.json").is_file()
    checked: list[dict] = []
    aliases = peers.preset_aliases()

    def compose_preset(name: str) -> dict:
        return OmegaConf.to_container(compose("config", overrides=[f"method={name}"]), resolve=True)

    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        for name in PRESETS:
            config = OmegaConf.to_container(compose("config", overrides=[f"method={name}"]), resolve=True)
            assert config["method"]["name"] == name
            drafter = config["drafter"]["name"]
            assert drafter in peers.BENCH_DRAFTERS, name
            assert name not in runtime.DEFAULT_METHODS or drafter in runtime.RUNTIME_DRAFTERS, name
            same = {k: v for k, v in config.items() if k != "method"}
            target = config["method"].get("alias_of")
            if target:  # a deprecated name: the same configuration as the preset it names, which is none
                assert target in PRESETS and target not in aliases, name
                assert same == {k: v for k, v in compose_preset(target).items() if k != "method"}, name
                continue
            key = {**same, "sweep": config["method"].get("sweep")}  # a calibrated row differs by its sweep
            assert key not in checked, f"{name}: the same configuration as another preset: make one an alias"
            checked.append(key)
            try:
                validate_config(config, pm)
            except ConfigError as exc:  # the Falcon drafter's weights: not in every install's bundle
                assert not falcon_bundled and str(exc).startswith("drafter.model='falcon-drafter'"), (name, exc)


def test_every_default_method_of_the_benchmarks_is_a_preset_and_none_a_deprecated_name():
    names = ("peers", "runtime", "paper_table", "overhead", "batched", "ceiling")
    peers, runtime, paper, overhead, batched, ceiling = (load_benchmark(n) for n in names)
    defaults = {
        *peers.DEFAULT_METHODS,
        *runtime.DEFAULT_METHODS,
        *(preset for preset, _ in paper.PAPER_ROWS.values()),
        *paper.CALIBRATED.values(),
        *overhead.DEFAULT_METHODS,
        *batched.DEFAULT_METHODS,
        *ceiling.METHODS,
    }
    assert defaults <= set(PRESETS)
    aliases = peers.preset_aliases()
    assert not defaults & set(aliases), sorted(defaults & set(aliases))
    assert set(aliases.values()) <= set(PRESETS) - set(aliases)  # each names a preset that is no alias
    assert peers.preset_names() == PRESETS  # the names --method accepts (the deprecated ones too)


def test_a_deprecated_preset_name_loads_its_preset_with_one_warning_line(monkeypatch):
    import warnings

    from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning
    from specpolicy.run import validation

    peers = load_benchmark("peers")
    monkeypatch.setattr(validation, "_WARNED_ALIASES", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old, again = peers.parse_method("dflash-failfast"), peers.parse_method("dflash-failfast")
    lines = [str(w.message) for w in caught if issubclass(w.category, SpecpolicyDeprecationWarning)]
    lines = [line for line in lines if line.startswith("method=")]  # an installed plugin's own may come first
    assert lines == [
        "method=dflash-failfast is a deprecated name of method=dflash+failfast (the same configuration): "
        "use method=dflash+failfast"
    ]  # once per process
    new = peers.parse_method("dflash+failfast")
    assert (old.name, again.name, old.policy, old.drafter, old.reuse) == (
        "dflash-failfast",
        "dflash-failfast",
        new.policy,
        new.drafter,
        new.reuse,
    )


def test_a_preset_by_name_carries_its_settings_description_and_sweep():
    peers = load_benchmark("peers")
    spec = peers.parse_method("dflash+failfast-best")
    assert (spec.drafter, spec.policy["name"], spec.reuse) == ("dflash", "failfast", False)
    assert spec.description.startswith("FailFast's rule retuned for DFlash")
    assert spec.sweep[0] == "policy.n=3,policy.tau=0.5" and len(spec.sweep) == 9
    picked = spec.variant(spec.sweep[0])
    assert (picked.name, picked.policy["n"], picked.policy["tau"]) == ("dflash+failfast-best", 3, 0.5)
    assert picked.description.endswith("; calibrated: policy.n=3,policy.tau=0.5")
    reuse = peers.parse_method("fastdllm+failfast+reuse")
    assert reuse.reuse and reuse.policy["name"] == "failfast" and not reuse.sweep
    plus = peers.parse_method("fastdllm-default")  # a drafter setting of its own: threshold 0.9
    assert plus.drafter_settings == {"threshold": 0.9}


def test_a_one_off_parses_and_may_start_from_a_preset():
    peers = load_benchmark("peers")
    spec = peers.parse_method("mine=method=dflash+failfast,policy.n=3")
    assert (spec.name, spec.drafter, spec.policy["n"], spec.policy["tau"]) == ("mine", "dflash", 3, 0.45)
    assert spec.description is None and spec.given == "mine=method=dflash+failfast,policy.n=3"
    plain = peers.parse_method("k3=drafter=ar,policy=static,policy.k=3")
    assert (plain.drafter, plain.policy) == ("ar", {"name": "static", "k": 3}) and not plain.sweep


@pytest.mark.parametrize("script", ["peers", "runtime", "paper_table"])
def test_an_unknown_name_is_one_line_naming_the_accepted_ones(script, capsys, monkeypatch):
    bench = load_benchmark(script)
    if hasattr(bench, "Bench"):
        monkeypatch.setattr(bench, "Bench", lambda args: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as info:
        bench.parse_args(["--method", "dflash+nosuch"])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(
        f"benchmarks/{script}.py: error: argument --method: 'dflash+nosuch' is not a method preset (conf/method/); "
        "accepted: ar+failfast, ar+failfast+reuse, "
    ), lines[-1]
    assert "dflash+failfast-best" in lines[-1] and "dflash-failfast," not in lines[-1]  # no deprecated name
    assert "or a one-off NAME=drafter=D,policy=P" in lines[-1]


def test_the_runtime_benchmark_refuses_a_drafter_it_does_not_compile(capsys):
    with pytest.raises(SystemExit):
        load_benchmark("runtime").parse_args(["--method", "dart+dart-tree"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "benchmarks/runtime.py: error: --method dart+dart-tree: runs drafter=dart; this benchmark runs the drafters "
        "ar, eagle3, dflash at their configs' settings"
    )


def _results(**given: str | None) -> dict:
    row = {"drafter": "ar", "mean_accepted_length": 1.0, "mean_speculation_length_drafted": 2.0}
    return {
        "tuned_profile": "a6000-qwen32b",
        "methods": {name: {**row, **({"cost_profile": p} if p else {})} for name, p in given.items()},
    }


def test_the_tuned_table_footer_names_only_the_rows_given_the_profile_s_costs(capsys):
    peers = load_benchmark("peers")
    peers.print_tuned_table(_results(**{"ar+goodput": None, "mine": "a6000-qwen32b", "other": "a6000-qwen7b"}))
    footer = capsys.readouterr().out.split("└")[-1]
    assert "mine: given that profile's costs" in " ".join(footer.split())
    assert "goodput-a6000-qwen32b" not in footer and "other" not in footer  # rows the table lacks or priced elsewhere
    peers.print_tuned_table(_results(**{"ar+goodput": None}))
    assert "given that profile's costs" not in capsys.readouterr().out


def test_a_method_named_twice_is_one_line_before_any_model_loads(capsys, monkeypatch):
    peers = load_benchmark("peers")
    monkeypatch.setattr(peers, "Bench", lambda args: pytest.fail("a model was loaded"))
    argv = ["--builtins", "--method", "dflash+failfast", "--methods", r"^dflash\+failfast$", "--num-prompts", "1"]
    with pytest.raises(SystemExit) as info:
        peers.main(argv)
    assert info.value.code == (
        "benchmarks/peers.py: error: --method dflash+failfast: already among the methods (--builtins runs it)"
    )
