"""specpolicy's default sweeper (``hydra/sweeper=specpolicy``): Hydra's ``BasicSweeper`` -- the
same grid, batches and ``hydra.sweeper.params`` -- that, before it launches the first job, composes
every job of the sweep and checks its values (``specpolicy.validation.validate_sweep``). A bad
value anywhere in a grid is then one line naming the key, the value, the accepted range and the
job, with status 2 and nothing run -- not a failure after the jobs before it have run (on a Slurm
cluster, after their time in the queue).

Hydra instantiates sweepers only from modules under ``hydra_plugins``, hence this package (listed
in pyproject.toml); the CLI also registers it (``register()``), since Hydra's plugin scan cannot
see the packages of an editable install."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf, open_dict


class SpecpolicySweeper(BasicSweeper):
    """``BasicSweeper`` that checks every job's config before launching the first batch."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        # BasicSweeper.__init__'s state, set here: it calls ``super(BasicSweeper, self)``, and
        # Hydra's plugin scan re-executes its module, so that name may no longer be our base.
        Sweeper.__init__(self)
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context = self.config = self.launcher = None

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Before the first batch: compose and check every job of the sweep (Hydra composes only
        the batch). Later batches: Hydra's own check.

        Raises:
            ConfigError: a job's bad value (``validate_sweep``); Hydra's errors for a job that
                does not compose.
        """
        if self.batch_index != 1 or self.overrides is None:
            return super().validate_batch_is_legal(batch)
        from specpolicy.validation import validate_sweep

        jobs = [list(job) for chunk in self.overrides for job in chunk]
        validate_sweep((number, job, self._task_config(number, job)) for number, job in enumerate(jobs))

    def _task_config(self, number: int, overrides: list[str]) -> dict:
        """Job ``number``'s resolved config without its ``hydra`` node, as the task function gets
        it (``hydra:`` interpolations resolve against the job's own Hydra config, as in Hydra's
        ``run_job``)."""
        assert self.hydra_context is not None and self.config is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = number
        sweep_hydra_config = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            task = copy.deepcopy(config)
            with open_dict(task):
                del task["hydra"]
            return OmegaConf.to_container(task, resolve=True)
        finally:
            HydraConfig.instance().cfg = sweep_hydra_config


def register() -> None:
    """Register the sweeper with Hydra (idempotent)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(SpecpolicySweeper)
