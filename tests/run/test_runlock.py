"""One process per run directory: a second live process gets one line naming the holder and
writes nothing; a lock left by a dead process is taken over with a message."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import overrides
from specpolicy.run.runlock import HOLDER_FILE, RunLock, RunLocked

#: The CLI; with $GATE_FILE set, each decoding waits (at most 300 s) until that file exists, so a
#: second process can start while the first holds the run directory.
DRIVER = """
import os, sys, time
import specpolicy.run.setup as run_setup  # RunSetup.decode calls its generate
real = run_setup.generate
def gated(*args, **kwargs):
    out = real(*args, **kwargs)
    gate, deadline = os.environ.get("GATE_FILE"), time.monotonic() + 300
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return out
run_setup.generate = gated
from specpolicy.run.cli import main
sys.argv = ["specpolicy", *sys.argv[1:]]
main()
"""


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has this id (until the kernel reuses it)


def test_a_second_holder_is_refused_with_the_holders_pid_and_host(tmp_path):
    with RunLock(tmp_path) as first:
        assert first.taken_over is None
        holder = json.loads((tmp_path / HOLDER_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(RunLocked) as info:
            RunLock(tmp_path).acquire()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(
            f"run directory {tmp_path} is in use by PID {os.getpid()} on host {socket.gethostname()} since "
        )
        assert message.endswith("choose another directory with hydra.run.dir=DIR")
    assert not (tmp_path / HOLDER_FILE).exists()  # released: the next run starts clean
    with RunLock(tmp_path) as again:
        assert again.taken_over is None


def test_the_stale_lock_of_a_dead_process_is_taken_over_with_a_message(tmp_path):
    pid = dead_pid()
    (tmp_path / HOLDER_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": 0}))
    with RunLock(tmp_path) as lock:
        assert lock.taken_over == (
            f"taking over the stale lock of PID {pid} on host {socket.gethostname()} since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(0))} in {tmp_path} "
            f"(its process is gone)"
        )
        assert json.loads((tmp_path / HOLDER_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.slow  # two CLI runs in subprocesses
def test_two_processes_running_the_same_command_never_duplicate_results(family, tmp_path):
    """The second process exits at once with status 2 and one line naming the first; the first
    finishes; results.jsonl holds every prompt once."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = [*overrides(family), "dataset.num_prompts=3", "generation.max_new_tokens=4"]
    gate = tmp_path / "gate"
    env = {**os.environ, "GATE_FILE": str(gate), "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    first = subprocess.Popen(
        [sys.executable, str(driver), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    holders = []
    while time.monotonic() < deadline and first.poll() is None and not holders:
        holders = list((tmp_path / "outputs").glob(f"*/{HOLDER_FILE}")) if (tmp_path / "outputs").exists() else []
        time.sleep(0.05)
    assert holders, first.communicate()
    run_dir = holders[0].parent
    try:
        second = subprocess.run(
            [sys.executable, str(driver), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        gate.touch()  # the first process goes on
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert second.returncode == 2
    (line,) = second.stderr.splitlines()
    assert line.startswith(
        f"error: run directory {run_dir.resolve()} is in use by PID {first.pid} on host {socket.gethostname()} since "
    )
    assert line.endswith(
        ": one process per run directory; wait for it to finish, or choose another directory with hydra.run.dir=DIR"
    )
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    assert json.loads((run_dir / "summary.json").read_text())["prompts"] == 3
    assert not (run_dir / HOLDER_FILE).exists()
