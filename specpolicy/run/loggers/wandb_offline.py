"""Reading an offline Weights & Biases run without uploading it.

wandb >= 0.19 (the ``wandb-core`` service) keeps an offline run only in its transaction log
``<dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` -- no ``files/wandb-summary.json`` is
written until ``wandb sync`` uploads it. This module decodes that log: a 7-byte W&B header
(``:W&B``, magic, version) followed by LevelDB log-format blocks of 32 KiB, each record a
7-byte chunk header (CRC-32C, length, type FULL/FIRST/MIDDLE/LAST) plus payload, the
payloads being ``wandb_internal_pb2.Record`` protobuf messages. Older wandb versions that do
write ``files/wandb-summary.json`` are read from that file instead.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        payload = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
            pending = b""
        else:
            raise ValueError(f"corrupt W&B transaction log: chunk type {kind} at byte {pos}")


def _set(target: dict[str, Any], item) -> None:
    keys = list(item.nested_key) or [item.key]
    node = target
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = json.loads(item.value_json)


@dataclass
class OfflineRun:
    """What an offline run recorded: ``config`` and ``summary`` (final values, nested dicts),
    ``history`` (one dict per logged step), artifact names by type, the run's
    ``group``/``name``/``project``, and ``complete`` (the run's exit record is on disk: wandb
    writes the log asynchronously, a few ms after ``run.finish()`` returns)."""

    path: Path
    project: str = ""
    group: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[str, list[str]] = field(default_factory=dict)
    complete: bool = False


def find_offline_runs(directory: str | Path) -> list[Path]:
    """Every ``offline-run-*`` directory under ``directory``, oldest first."""
    return sorted(Path(directory).rglob("offline-run-*"), key=lambda p: p.name)


def read_offline_run(run_path: str | Path) -> OfflineRun:
    """Decode an offline run directory (``.../wandb/offline-run-*``) or its ``run-*.wandb`` file.

    Raises:
        FileNotFoundError: when no ``run-*.wandb`` file is there.
        ValueError: for a file that is not a W&B transaction log.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(run_path)
    files = [path] if path.is_file() else sorted(path.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {path}")
    data = files[0].read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{files[0]} is not a W&B transaction log")
    run = OfflineRun(path=files[0].parent)
    for payload in _chunks(data):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.project, run.group, run.name = r.project, r.run_group, r.display_name
            for item in r.config.update:
                _set(run.config, item)
        elif kind == "config":
            for item in record.config.update:
                _set(run.config, item)
        elif kind == "summary":
            for item in record.summary.update:
                _set(run.summary, item)
        elif kind == "history":
            step: dict[str, Any] = {}
            for item in record.history.item:
                _set(step, item)
            run.history.append(step)
        elif kind == "artifact":
            run.artifacts.setdefault(record.artifact.type, []).append(record.artifact.name)
        elif kind == "exit":
            run.complete = True
    legacy = run.path / "files" / "wandb-summary.json"
    if legacy.exists():
        run.summary.update(json.loads(legacy.read_text()))
    return run


def wait_until_complete(run_path: str | Path, timeout_s: float = 10.0, poll_s: float = 0.02) -> OfflineRun:
    """``read_offline_run`` once the run's exit record is on disk, or at ``timeout_s`` seconds
    (then ``complete`` is False). A log still being written may end mid-record; such partial
    reads are retried.

    Raises:
        FileNotFoundError / ValueError: as ``read_offline_run``, at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            run = read_offline_run(run_path)
            if run.complete or time.monotonic() >= deadline:
                return run
        except Exception:  # noqa: BLE001 - partially written log; retry until the deadline
            if time.monotonic() >= deadline:
                raise
        time.sleep(poll_s)
