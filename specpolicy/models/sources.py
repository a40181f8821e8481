"""Where a model comes from: a bundled name (``specpolicy/family/bundle/<name>``), a local
directory or a Hugging Face hub id, resolved and checked without loading anything.

The lowest of the model modules: :mod:`specpolicy.models.checkpoint` (checking a drafter's
checkpoint against the target) and :mod:`specpolicy.models.loading` (loading causal LMs and
tokenizers) both read it, and it imports neither.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from specpolicy.core.errors import ConfigError

#: Models of the bundled family (``specpolicy/family/bundle/<name>``), trained by ``python -m specpolicy.family``.
BUNDLED_MODELS = (
    "target",
    "ar-drafter",
    "dllm-drafter",
    "dflash-drafter",
    "eagle3-drafter",
    "dart-drafter",
    "falcon-drafter",
)


def bundled_dir() -> Path:
    """Directory holding the bundled model family."""
    return Path(str(resources.files("specpolicy.family") / "bundle"))


def resolve_model_path(name_or_path: str) -> str:
    """Map a bundled model name (one of :data:`BUNDLED_MODELS`) to its directory;
    return existing local paths and hub ids (e.g. ``Qwen/Qwen2.5-7B-Instruct``) unchanged.

    Raises:
        FileNotFoundError: for a bundled name whose weights are missing.
    """
    if name_or_path in BUNDLED_MODELS:
        path = bundled_dir() / name_or_path
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"bundled model {name_or_path!r} not found at {path}; train it with `python -m specpolicy.family`"
            )
        return str(path)
    return str(Path(name_or_path).expanduser()) if Path(name_or_path).expanduser().exists() else name_or_path


#: A Hugging Face hub repository id: ``name`` or ``org/name`` (letters, digits, ``-_.``).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_model_source(key: str, value: Any) -> None:
    """Check a model setting (``verifier.model``, ``drafter.model``) without loading anything:
    a bundled name must have its files; a local path (absolute, ``./``, ``~`` or existing) must
    be a directory with ``config.json`` and complete safetensors weights (``check_weights``);
    anything else must look like a hub id (``org/name``: it is loaded from the local Hugging
    Face cache or the hub later).

    Raises:
        ConfigError: naming ``key``, the value and what was expected or is wrong.
    """
    accepted = f"a bundled model ({', '.join(BUNDLED_MODELS)}), a local model directory or a hub id (org/name)"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be {accepted}, got {value!r}")
    if value in BUNDLED_MODELS:
        try:
            directory = Path(resolve_model_path(value))
        except FileNotFoundError as exc:
            raise ConfigError(f"{key}={value!r}: {exc}") from exc
    else:
        directory = Path(value).expanduser()
        if not (directory.is_absolute() or value.startswith((".", "~")) or directory.exists()):
            if not HUB_ID.fullmatch(value):
                raise ConfigError(f"{key}={value!r} is not {accepted}")
            return
        if not directory.exists():
            raise ConfigError(f"{key}={value!r}: no such local directory (expected {accepted})")
        if not directory.is_dir():
            raise ConfigError(f"{key}={value!r} is a file; a local model is a directory with config.json and weights")
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{key}={value!r}: the directory has no config.json (not a Hugging Face model directory)")
    check_weights(f"{key}={value!r}", directory)


def check_weights(key: str, directory: Path) -> None:
    """Open the header of every ``*.safetensors`` file of ``directory`` (the ``safetensors``
    library checks that the file covers every tensor it declares; no tensor is read) and check
    that every shard named by ``model.safetensors.index.json`` exists.

    Args:
        key: how the model was named, for messages (e.g. ``verifier.model='/models/x'``).
    Raises:
        ConfigError: naming ``key`` and the truncated, corrupt or missing file.
    """
    from safetensors import SafetensorError, safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{key}: {index} is not a valid safetensors index ({exc})") from exc
        for shard in shards:
            if not (directory / shard).is_file():
                raise ConfigError(f"{key}: weights file {directory / shard} (named in {index.name}) is missing")
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            size = file.stat().st_size
            raise ConfigError(
                f"{key}: weights file {file} is truncated or corrupt ({size} bytes; safetensors: "
                f"{exc}); re-download or re-save the model"
            ) from exc
