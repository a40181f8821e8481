"""Where a model comes from: a bundled name (``specpolicy/family/bundle/<name>``), a local
directory or a Hugging Face hub id, resolved and checked without loading anything.

The lowest of the model modules: :mod:`specpolicy.models.checkpoint` (checking a drafter's
checkpoint against the target) and :mod:`specpolicy.models.loading` (loading causal LMs and
tokenizers) both read it, and it imports neither.
"""

from __future__ import annotations

import json
import os
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


def hub_offline() -> bool:
    """Whether the Hugging Face hub is off limits (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``
    set to 1 / on / yes / true, as ``huggingface_hub`` reads them), read now: a test or a launcher
    may set it after ``huggingface_hub`` was imported."""
    from huggingface_hub.constants import _is_true

    return _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (``models--org--name/{refs,snapshots,blobs}``) as
    ``huggingface_hub.constants`` places it -- ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``,
    else ``$HF_HOME/hub`` (``HF_HOME`` default ``$XDG_CACHE_HOME/huggingface``, ``~/.cache``) --
    read now rather than when ``huggingface_hub`` was imported."""
    home = os.getenv(
        "HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    )
    hub = os.getenv("HF_HUB_CACHE", os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def cached_snapshot(repo_id: str) -> str | None:
    """The local snapshot directory of hub model ``repo_id`` (``org/name``) in the hub cache
    (``hub_cache_dir``), without any network: ``huggingface_hub.snapshot_download`` with
    ``local_files_only`` (the revision ``refs/main`` names, its ``snapshots/<sha>/``). None when the
    cache does not hold it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, local_files_only=True, cache_dir=hub_cache_dir())
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def local_config_path(name_or_path: str) -> Path | None:
    """The ``config.json`` of a bundled name, a local directory or a hub id already in the local
    hub cache (``huggingface_hub.try_to_load_from_cache``), found without any network and without
    loading anything; None when there is none here."""
    try:
        path = Path(resolve_model_path(name_or_path))
    except FileNotFoundError:
        return None
    if (path / "config.json").is_file():
        return path / "config.json"
    if not HUB_ID.fullmatch(name_or_path) or "/" not in name_or_path:
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name_or_path, "config.json", cache_dir=hub_cache_dir())
    except ValueError:  # not a valid repo id after all
        return None
    return Path(cached) if isinstance(cached, str) else None


def resolve_model_path(name_or_path: str) -> str:
    """Map a bundled model name (one of :data:`BUNDLED_MODELS`) to its directory; return existing
    local paths unchanged; a hub id (e.g. ``Qwen/Qwen2.5-7B-Instruct``) unchanged, or, when the hub
    is off limits (``hub_offline``), its snapshot directory in the local hub cache
    (``cached_snapshot``) when it is there.

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
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    if hub_offline() and HUB_ID.fullmatch(name_or_path) and "/" in name_or_path:
        return cached_snapshot(name_or_path) or name_or_path
    return name_or_path


#: A Hugging Face hub repository id: ``name`` or ``org/name`` (letters, digits, ``-_.``).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_model_source(key: str, value: Any) -> None:
    """Check a model setting (``verifier.model``, ``drafter.model``) without loading anything:
    a bundled name must have its files; a local path (absolute, ``./``, ``~`` or existing) must
    be a directory with ``config.json`` and complete safetensors weights (``check_weights``);
    anything else must look like a hub id (``org/name``: it is loaded from the local Hugging
    Face cache or the hub later). With the hub off limits (``HF_HUB_OFFLINE=1``, ``hub_offline``)
    a hub id must be in the local hub cache (``cached_snapshot``), whose snapshot is then checked
    as a local directory.

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
            if not hub_offline():
                return
            snapshot = cached_snapshot(value) if "/" in value else None
            if snapshot is None:
                raise ConfigError(
                    f"{key}={value!r}: hub id not in the local Hugging Face cache {hub_cache_dir()} and "
                    "HF_HUB_OFFLINE=1 forbids downloading it (download it first, or set HF_HUB_CACHE / HF_HOME "
                    "to the cache that holds it)"
                )
            directory = Path(snapshot)
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
