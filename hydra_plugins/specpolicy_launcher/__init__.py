"""specpolicy's Slurm launcher: hydra-submitit-launcher's ``SlurmLauncher`` (the ``slurm`` and
``slurm_cpu`` presets in ``conf/hydra/launcher/``) with three changes:

* ``gpus_per_node: 0`` (or null) requests no GPU at all (the plugin would write
  ``--gpus-per-node=0``, which clusters without GPUs may refuse);
* the jobs are watched with ``squeue`` (``specpolicy.run.slurm.SqueueWatcher``), not ``sacct``: each
  job id is logged at submission, then its state changes and, while it is pending, Slurm's
  reason; a job that ends without a result (``scancel``, a node failure) ends the wait even on
  a cluster without accounting, where submitit would wait forever;
* such a job's error says how to resume the sweep, and is reported in one line without a
  traceback (``specpolicy.core.errors.SweepIncomplete``).

Hydra instantiates launchers only from modules under ``hydra_plugins``, hence this package
(listed in pyproject.toml). Hydra's plugin scan finds it in a regular install; the CLI also
registers it (``register()``), since the scan cannot see packages of an editable install (see
``specpolicy.run.hydra_searchpath``). Without hydra-submitit-launcher (``pip install
"specpolicy[slurm]"``) it defines no launcher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:  # the [slurm] extra is not installed: no launcher to extend
    _SubmititSlurmLauncher = None

if _SubmititSlurmLauncher is not None:

    class SpecpolicySlurmLauncher(_SubmititSlurmLauncher):
        """``hydra/launcher=slurm`` / ``slurm_cpu``: one Slurm job per sweep job (a job array)."""

        def __init__(self, **params: Any) -> None:
            super().__init__(**params)
            if not self.params.get("gpus_per_node"):
                self.params["gpus_per_node"] = None  # no --gpus-per-node line at all

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
            from submitit.core.utils import UncompletedJobError

            from specpolicy.core.errors import SweepIncomplete
            from specpolicy.run.slurm import squeue_watching

            class UncompletedSweepError(UncompletedJobError, SweepIncomplete):
                """submitit's error (for code that catches it), reported by the CLI in one line."""

            with squeue_watching():
                try:
                    return super().launch(job_overrides, initial_job_idx)
                except UncompletedJobError as error:
                    sweep_dir = self.config.hydra.sweep.dir if self.config is not None else "<sweep dir>"
                    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                    raise UncompletedSweepError(
                        f"{first}; the sweep's run directories keep every prompt finished so far: run the same "
                        f"command with hydra.sweep.dir={sweep_dir} to resume it"
                    ) from None


def register() -> None:
    """Register the launcher with Hydra (idempotent; nothing without hydra-submitit-launcher)."""
    if _SubmititSlurmLauncher is not None:
        from hydra.core.plugins import Plugins

        Plugins.instance().register(SpecpolicySlurmLauncher)
