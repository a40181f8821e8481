"""Check every job of a sweep before the first runs (Hydra callback ``SweepPreflight``,
configured under ``hydra.callbacks.sweep_preflight`` in ``conf/config.yaml``).

A grid sweep (Hydra's basic sweeper, ``python -m specpolicy -m key=a,b ...``, the
``hydra.sweeper.params`` of an experiment preset included) is expanded as the sweeper will
expand it, every job's config is composed and checked with
``specpolicy.run.validation.validate_config``, and a bad value in any job -- or a job that does not
compose -- stops the sweep before any job runs: one line naming the key, the value, the accepted
range and the job (``#N`` as Hydra numbers it), status 2.

A sweep on Slurm (``hydra/launcher=slurm``, ``slurm_cpu``, ``submitit_slurm``) from a machine
without Slurm's commands stops here too, with one line pointing to ``scripts/slurm-local.sh``
(``specpolicy.run.slurm.no_cluster_line``) -- before Hydra makes the sweep directory.

The values are checked only where the jobs run on this machine (Hydra's basic launcher,
``submitit_local``): the checks read CUDA's presence, files and environment variables, which on
a Slurm node are the node's, so a Slurm job checks itself there. Other sweepers (Optuna) choose values while they run, and each
job checks itself.

Hydra reports a callback's exception as a warning and goes on, so the rejection is raised as
``SweepRejected`` (a ``SystemExit``), which the CLI turns into the line.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
#: Launchers whose jobs run on this machine.
LOCAL_LAUNCHERS = (
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
)
#: Launchers that submit to Slurm: the ``slurm`` / ``slurm_cpu`` presets and the plugin's ``submitit_slurm``.
SLURM_LAUNCHERS = (
    "hydra_plugins.specpolicy_launcher.SpecpolicySlurmLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
)


class SweepRejected(SystemExit):
    """A sweep stopped before its first job: ``error`` is the ``ConfigError`` to report."""

    def __init__(self, error: Exception) -> None:
        super().__init__(2)
        self.error = error


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of a basic-sweeper multirun's jobs, in Hydra's launch order (``#0``,
    ``#1``, ...): ``hydra.sweeper.params`` then the command line's overrides, expanded as
    ``BasicSweeper.sweep`` expands them (cartesian product, one list per job).

    Raises:
        Hydra's override errors (``OverrideParseException``) for an override it cannot parse.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)  # "${...}" stays text, as in Hydra
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides([f"{key}={value}" for key, value in params.items()] + task)
    return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def task_config(config: DictConfig, number: int, overrides: list[str]) -> dict[str, Any]:
    """Job ``number``'s resolved config without its ``hydra`` node, as its task function gets it
    (``hydra:`` interpolations resolve against the job's own Hydra config, as in Hydra's
    ``run_job``; the sweep's Hydra config is restored after).

    Raises:
        Hydra's composition errors for a job that does not compose; OmegaConf's for an
        interpolation that does not resolve.
    """
    import copy

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
    with open_dict(job):
        job.hydra.job.id = job.hydra.job.num = number
    sweep_hydra_config = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(job)
    try:
        task = copy.deepcopy(job)
        with open_dict(task):
            del task["hydra"]
        return OmegaConf.to_container(task, resolve=True)
    finally:
        HydraConfig.instance().cfg = sweep_hydra_config


class SweepPreflight(Callback):
    """``on_multirun_start``: check every job of a local grid sweep (see the module docstring).

    Raises:
        SweepRejected: a sweep on Slurm without Slurm's commands, a job with a bad value, or one
            that does not compose.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from specpolicy.core.errors import ConfigError, hydra_error_line
        from specpolicy.plugins.manager import get_plugin_manager
        from specpolicy.run.validation import validate_config

        launcher = config.hydra.launcher.get("_target_")
        if launcher in SLURM_LAUNCHERS:  # any sweeper: no cluster, no sweep (and no sweep directory)
            from specpolicy.run.slurm import no_cluster_line

            choice = (config.hydra.runtime.get("choices") or {}).get("hydra/launcher") or launcher
            line = no_cluster_line(str(choice))
            if line:
                raise SweepRejected(ConfigError(line))
        if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER or launcher not in LOCAL_LAUNCHERS:
            return
        try:
            jobs = sweep_jobs(config)
        except Exception as error:  # noqa: BLE001 - an override Hydra cannot parse: its own one line
            if hydra_error_line(error) is None:
                raise
            raise SweepRejected(error) from error
        managers: dict[tuple[str, ...], Any] = {}  # one plugin manager per plugins.block
        for number, overrides in enumerate(jobs):
            try:
                task = task_config(config, number, overrides)
                block = tuple((task.get("plugins") or {}).get("block") or ())
                pm = managers.get(block) or managers.setdefault(block, get_plugin_manager(block=list(block)))
                validate_config(task, pm)
            except Exception as error:  # noqa: BLE001 - a bad value, or a job that does not compose
                line = str(error) if isinstance(error, ConfigError) else hydra_error_line(error)
                if line is None:
                    raise
                raise SweepRejected(
                    ConfigError(f"{line} (sweep job #{number}: {' '.join(overrides)}; no job was launched)")
                ) from error
