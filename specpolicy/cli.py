"""Command line: ``python -m specpolicy [group=choice ...] [key=value ...]`` (Hydra).

``python -m specpolicy --list-plugins`` prints the registered plugins and their origin.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specpolicy.experiment import run_experiment


@hydra.main(config_path="pkg://specpolicy.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float:
    summary = run_experiment(cfg, HydraConfig.get().runtime.output_dir)
    return float(summary.get("speedup_vs_vanilla", 0.0))  # the value Hydra sweepers optimise


def list_plugins() -> None:
    """Print every registered plugin and where it came from."""
    from specpolicy.plugins import describe_plugins, get_plugin_manager

    for name, origin in describe_plugins(get_plugin_manager()):
        print(f"{name:45s} {origin}")


def main() -> None:
    if "--list-plugins" in sys.argv[1:]:
        list_plugins()
        return
    _hydra_main()
