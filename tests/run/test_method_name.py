"""A method's printed name is its preset's name (one declaration, one name): ``method_name`` of a
``method=<preset>`` run is the preset's file name, whatever drafter and policy it sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from specpolicy.run.experiment import method_name

CONF = Path(__file__).resolve().parents[2] / "conf" / "method"
PRESETS = sorted(p.stem for p in CONF.glob("*.yaml"))


def test_every_preset_is_named_by_its_file_with_a_one_line_description():
    """``method.name`` (what ``method_name`` prints) is the file's name; composing each preset:
    tests/benchmarks/test_method_presets.py."""
    assert len(PRESETS) > 60  # the one list of named methods: every benchmark row and page row
    for name in PRESETS:
        node = OmegaConf.load(CONF / f"{name}.yaml").method
        assert node.name == name
        assert isinstance(node.description, str) and 20 < len(node.description) and "\n" not in node.description


@pytest.mark.parametrize(
    "method, drafter_policy",
    [
        ("diffuspec-dflash", "dflash+adl"),  # was printed as dflash+adl: the neighbours' row WITHOUT the path search
        ("dflash+adl", "dflash+adl"),
        ("failfast", "fastdllm+failfast"),
        ("fastdllm+failfast+reuse", "fastdllm+failfast+reuse"),
    ],
)
def test_a_preset_is_named_by_its_file_not_by_its_drafter_and_policy(method, drafter_policy):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"method={method}"])
        assert method_name(cfg) == method
        plain = compose("config", overrides=[f"drafter={cfg.drafter.name}", f"policy={cfg.policy.name}"])
        plain.reuse.enabled = cfg.reuse.enabled
        assert method_name(plain) == drafter_policy  # without a preset: <drafter>+<policy>[+reuse]
    assert method_name(compose_free()) == "fastdllm+failfast"


def compose_free():
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return compose("config", overrides=[])
