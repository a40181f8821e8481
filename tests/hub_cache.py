"""A Hugging Face hub cache laid out as ``huggingface_hub`` lays it, built by a test (no network):
``models--org--name/refs/main`` (the commit), ``snapshots/<commit>/<file>`` (relative links) and
``blobs/<sha256>`` (the bytes)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def put_in_hub_cache(cache: Path, repo_id: str, source: Path) -> Path:
    """Lay ``source``'s files out in the hub cache ``cache`` as ``huggingface_hub`` does for model
    ``repo_id``: each file's bytes in ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` a relative
    link to it, ``refs/main`` the commit. Returns the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot
