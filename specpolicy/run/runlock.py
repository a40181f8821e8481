"""One process per run directory: a lock held for the whole run.

Two processes running the same command share its run directory (``outputs/<overrides>/``); both
would append every prompt to ``results.jsonl``. ``RunLock`` prevents that:

* ``<run dir>/run.lock`` is locked with ``filelock.FileLock`` (``fcntl.flock`` on Unix: the
  operating system releases it when the holder exits in any way, SIGKILL included);
* ``<run dir>/run.lock.json`` names the holder: PID, host, start time and command line. It is
  written once the lock is held and removed when the run releases it, so a holder file left
  behind means the previous holder died (killed, power loss): the new run takes the lock over and
  says so in one line (``taken_over``), checking, when the holder ran on this host, that its PID
  is gone.
* A second live process does not wait: ``RunLocked`` (a ``UserError``: one line, exit status 2)
  names the holder.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from specpolicy.core.errors import UserError

LOCK_FILE = "run.lock"
HOLDER_FILE = "run.lock.json"


class RunLocked(UserError):
    """The run directory is in use by another live process (named in the message)."""


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this host (signal 0; a process of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    since = (
        time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else ""
    )
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}{since}"


class RunLock:
    """The lock of one run directory (see the module docstring); a context manager.

    Args:
        run_dir: the run directory (created if missing).
    Attributes:
        taken_over: after ``acquire``, a one-line message when a dead holder's lock was taken
            over, else None.
    Raises (``acquire``):
        RunLocked: when another live process holds the directory.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.lock_path = self.run_dir / LOCK_FILE
        self.holder_path = self.run_dir / HOLDER_FILE
        self._lock: FileLock | None = None
        self.taken_over: str | None = None

    def read_holder(self) -> dict[str, Any] | None:
        """The holder file's content (None when absent or unreadable)."""
        try:
            holder = json.loads(self.holder_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.lock_path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            holder = self.read_holder()
            who = _describe(holder) if holder else "another process (it has not recorded itself yet)"
            raise RunLocked(
                f"run directory {self.run_dir} is in use by {who}: one process per run directory; "
                f"wait for it to finish, or choose another directory with hydra.run.dir=DIR"
            ) from None
        self._lock = lock
        previous = self.read_holder()
        if previous is not None:  # the previous holder died without releasing: its lock is stale
            here = previous.get("host") == socket.gethostname()
            pid = previous.get("pid")
            state = (
                "its process is gone"
                if here and isinstance(pid, int) and not pid_alive(pid)
                else "its lock was free"
                if here
                else "on another host; its lock was free"
            )
            self.taken_over = f"taking over the stale lock of {_describe(previous)} in {self.run_dir} ({state})"
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "command": " ".join(sys.argv),
        }
        tmp = self.holder_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(holder), encoding="utf-8")
        os.replace(tmp, self.holder_path)
        return self

    def release(self) -> None:
        """Remove the holder file and release the lock (idempotent)."""
        if self._lock is None:
            return
        try:
            holder = self.read_holder()
            if holder is not None and holder.get("pid") == os.getpid():
                self.holder_path.unlink(missing_ok=True)
        finally:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
