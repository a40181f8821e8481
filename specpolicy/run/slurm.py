"""Watching Slurm jobs with ``squeue``, for the ``slurm`` / ``slurm_cpu`` launcher presets
(``hydra_plugins/specpolicy_launcher``).

submitit decides whether a job without a result file has ended by asking ``sacct``. On a
cluster without accounting ``sacct`` has no answer, so a job that ends without a result -- an
``scancel``led array task, a node failure -- looks unfinished forever and the launcher waits
forever, without a word. ``SqueueWatcher`` asks ``squeue`` instead, which every cluster
answers: a job it lists has that state; a job it no longer lists (Slurm forgets finished jobs
after ``MinJobAge`` seconds, and a cancelled pending array task at once) has ended. It logs
each job id at submission, every state change, and while a job is pending Slurm's reason
(``squeue %r``: ``Resources``, ``Priority``, ``JobArrayTaskLimit``, ``ReqNodeNotAvail``, ...)
-- again every ``remind_s`` seconds while it stays pending.

Before a sweep on Slurm, ``no_cluster_line`` tells whether this machine can reach a cluster at
all (Slurm's commands on ``PATH``); the sweep preflight (``specpolicy.run.preflight``) stops a sweep
that cannot with one line pointing to ``scripts/slurm-local.sh``, before anything is created.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from submitit.core.core import InfoWatcher

log = logging.getLogger(__name__)

#: Slurm job states (``squeue %T``) of a job that has not ended: it may still write a result.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "PREEMPTED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
    }
)
#: The state given to a job that ``squeue`` no longer lists.
GONE = "ENDED"
#: Pending reasons that no wait resolves: the request exceeds what the partition offers.
UNSATISFIABLE = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints"})
#: Slurm's commands a sweep needs on this machine: sbatch submits, srun starts each job's task
#: (submitit refuses to start without it), squeue follows the jobs.
SLURM_COMMANDS = ("sbatch", "srun", "squeue")
UNSATISFIABLE_HINT = (
    "the partition cannot run this request: ask for less (hydra.launcher.cpus_per_task, mem_gb, "
    "gpus_per_node, timeout_min) or choose another hydra.launcher.partition, and scancel the job"
)


class SqueueWatcher(InfoWatcher):
    """submitit's job watcher (``Job.watcher``) on ``squeue`` instead of ``sacct``.

    ``get_info(job_id)`` is ``{"State": <squeue %T>, "Reason": <squeue %r>}`` (``State``
    ``ENDED`` once squeue no longer lists the job; ``{}`` before the first call). Calls are
    spaced as submitit spaces its own (2 s, 4 s, 8 s, ... after a submission), at most
    ``delay_s`` seconds apart. A failing ``squeue`` (controller busy) keeps the last states and
    logs a warning."""

    def __init__(self, delay_s: float = 30.0, remind_s: float = 300.0) -> None:
        super().__init__(delay_s=delay_s)
        self.remind_s = remind_s
        self._seen: set[str] = set()  # ids squeue has listed at least once
        self._logged: dict[str, tuple[str, str, float]] = {}  # id -> (state, reason, when logged)

    def register_job(self, job_id: str) -> None:
        if job_id not in self._registered:
            log.info("Slurm job %s submitted", job_id)
        super().register_job(job_id)

    def _make_command(self) -> list[str] | None:
        ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
        if not ids:
            return None
        return ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%r", f"--jobs={','.join(ids)}"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        """``squeue --format=%i|%T|%r`` lines as ``job id -> {"State", "Reason"}``."""
        if isinstance(string, bytes):
            string = string.decode()
        info: dict[str, dict[str, str]] = {}
        for line in string.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[0]:
                info[parts[0]] = {"State": parts[1].split()[0] if parts[1] else "UNKNOWN", "Reason": parts[2]}
        return info

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode=mode).get("State") or "UNKNOWN"

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        state = self.get_state(job_id, mode=mode)
        return state != "UNKNOWN" and state not in ACTIVE_STATES

    def update(self) -> None:
        asked = sorted(self._registered - self._finished)
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            log.warning("squeue failed (%r); Slurm job states may be out of date", error)
            self._last_status_check = time.time()
            return
        if out.returncode == 0:
            info = self.read_info(out.stdout)
        elif "Invalid job id" in out.stderr:  # none of the jobs asked about is listed any more
            info = {}
        else:
            log.warning("squeue failed (%s); Slurm job states may be out of date", out.stderr.strip())
            self._last_status_check = time.time()
            return
        self._seen.update(info)
        for job_id in asked:
            self._info_dict[job_id] = info.get(job_id, {"State": GONE, "Reason": "no longer listed by squeue"})
            self._report(job_id)
        self._last_status_check = time.time()
        self._finished.update(j for j in asked if self.is_done(j, mode="cache"))

    def _report(self, job_id: str) -> None:
        """Log a job's state when it changed, and its pending reason again every ``remind_s``
        while it stays pending. The id of a whole job array is not reported (squeue lists its
        tasks, ``<id>_<index>``)."""
        if job_id not in self._seen and "_" not in job_id:
            return
        state, reason = self._info_dict[job_id]["State"], self._info_dict[job_id]["Reason"]
        now = time.time()
        last_state, last_reason, last_time = self._logged.get(job_id, ("", "", 0.0))
        repeated = (state, reason) == (last_state, last_reason)
        if repeated and (state != "PENDING" or now - last_time < self.remind_s):
            return
        if state == "PENDING":
            message = f"{'still ' if repeated else ''}PENDING, reason: {reason}"
            if reason in UNSATISFIABLE:
                message += f" -- {UNSATISFIABLE_HINT}"
        elif state == GONE:
            message = f"ended ({reason})"
        else:
            message = state
        log.info("Slurm job %s %s", job_id, message)
        self._logged[job_id] = (state, reason, now)


@contextmanager
def squeue_watching(watcher: SqueueWatcher | None = None) -> Iterator[SqueueWatcher]:
    """Within the block, submitit's Slurm jobs are watched by ``watcher`` (a new
    ``SqueueWatcher`` by default). submitit shares one watcher among all ``SlurmJob`` objects,
    as a class attribute, and creates the jobs of an array itself, so the class attribute is
    swapped for the block and restored after it."""
    from submitit.slurm.slurm import SlurmJob

    watcher = watcher if watcher is not None else SqueueWatcher()
    previous = SlurmJob.__dict__["watcher"]
    SlurmJob.watcher = watcher
    try:
        yield watcher
    finally:
        SlurmJob.watcher = previous


def no_cluster_line(launcher: str, path: str | None = None) -> str | None:
    """One line when ``hydra/launcher=<launcher>`` cannot reach a Slurm cluster from this machine
    (any of ``SLURM_COMMANDS`` missing on ``path``, default ``$PATH``), saying how to get one --
    the local cluster of ``scripts/slurm-local.sh`` and the exports it writes (``env.sh`` in
    ``$SPECPOLICY_SLURM_DIR``, default ``/tmp/specpolicy-slurm``) -- or to run the sweep here;
    None when every command is there."""
    missing = [c for c in SLURM_COMMANDS if shutil.which(c, path=path) is None]
    if not missing:
        return None
    env = Path(os.environ.get("SPECPOLICY_SLURM_DIR", "/tmp/specpolicy-slurm")) / "env.sh"
    if env.is_file():
        how = (
            f"a local cluster is up: run `source {env}` (the exports `scripts/slurm-local.sh env` prints) "
            f"in this shell first"
        )
    else:
        how = (
            f"to try it on this machine, start a local cluster with `scripts/slurm-local.sh up` (root) and run "
            f"`source {env}` (the exports `scripts/slurm-local.sh env` prints)"
        )
    return (
        f"hydra/launcher={launcher} submits the sweep to Slurm, but {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not on PATH (no Slurm cluster here); {how}; or run the "
        f"sweep on this machine with hydra/launcher=basic. Nothing was launched or created"
    )
