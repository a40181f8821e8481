"""Hydra: every config in conf/ composes, every policy/drafter/verifier choice instantiates."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from specpolicy.core.runtime import Runtime
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy, make_verifier

CONF = Path(str(resources.files("specpolicy.conf")))
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("_"))


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(*overrides: str):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(
    "group,choice",  # the 106 method presets are slow here (each composes and validates in test_method_presets)
    [pytest.param(g, c, marks=pytest.mark.slow) if g == "method" else (g, c) for g in GROUPS for c in _choices(g)],
)
def test_every_config_composes(group, choice):
    cfg = _compose(f"{group}={choice}")
    assert cfg[group] is not None
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_user_facing_keys_exist():
    cfg = _compose()
    for key in ("dataset.name", "dataset.path", "dataset.num_prompts", "generation.max_new_tokens", "seed"):
        assert OmegaConf.select(cfg, key, throw_on_missing=True) is not None or key == "dataset.path"
    assert (cfg.policy.name, cfg.drafter.name, cfg.verifier.name) == ("failfast", "fastdllm", "hf")


@pytest.mark.parametrize("choice", _choices("policy"))
def test_every_policy_instantiates(choice):
    cfg = _compose(f"policy={choice}")
    policy = make_policy(get_plugin_manager(autoload=False), OmegaConf.to_container(cfg.policy))
    assert policy.name == cfg.policy.name


def test_bundled_verifier_and_every_drafter_instantiate():
    runtime = Runtime(device="cpu", dtype="float32")
    pm = get_plugin_manager(autoload=False)
    cfg = _compose()
    verifier = make_verifier(pm, OmegaConf.to_container(cfg.verifier), runtime)
    for choice in _choices("drafter"):  # every drafter's default model is bundled: no drafter.model
        drafter = make_drafter(pm, OmegaConf.to_container(_compose(f"drafter={choice}").drafter), runtime, verifier)
        assert drafter.name == choice


def test_unknown_plugin_name_is_a_clear_error():
    with pytest.raises(ValueError, match="no registered plugin provides policy 'nope'"):
        make_policy(get_plugin_manager(autoload=False), {"name": "nope"})
