"""A run's life cycle: the command line (``cli``), composing and validating the config
(``validation``, ``preflight``), the experiment at batch 1 and batched (``experiment``,
``batch_experiment``), resuming and locking a run directory, skipped prompts, Slurm, Hydra's
search path and the run loggers (``loggers``).

Importing it registers the ``hydra.run.dir`` resolver (``specpolicy.run.resume``), which every
process that composes a specpolicy config needs.
"""

from specpolicy.run import resume as _resume  # noqa: F401  (registers the hydra.run.dir resolver)
