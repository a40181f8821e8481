"""Loading Hugging Face causal LMs and tokenizers: bundled names, local paths or hub ids.

transformers draws a progress bar per load ("Loading weights", the hub's downloads) on stderr;
here it does only when stderr is a terminal (``progress_bars_on_terminals``), so a log file
(``python -m specpolicy > run.log 2>&1``) gets no bar.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specpolicy.core.errors import ConfigError
from specpolicy.core.runtime import Runtime
from specpolicy.models.checkpoint import hf_config

#: Models of the bundled family (``specpolicy/family/bundle/<name>``), trained by ``python -m specpolicy.family``.
BUNDLED_MODELS = ("target", "ar-drafter", "dllm-drafter", "dflash-drafter", "eagle3-drafter", "dart-drafter")


def bundled_dir() -> Path:
    """Directory holding the bundled model family."""
    return Path(str(resources.files("specpolicy.family") / "bundle"))


def resolve_model_path(name_or_path: str) -> str:
    """Map a bundled model name (``target``, ``ar-drafter``, ``dllm-drafter``, ``dflash-drafter``,
    ``eagle3-drafter``) to its directory;
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


def check_attention(key: str, value: Any, supported: tuple[str, ...] | None = None) -> str:
    """Check an ``attn_implementation`` setting: one of ``supported`` when given, else ``eager``
    or a name registered in transformers' ``ALL_ATTENTION_FUNCTIONS`` (``sdpa``,
    ``flash_attention_2``, ...), or a hub kernel (``org/name``).

    Raises:
        ConfigError: naming ``key``, the value and the choices.
    """
    if supported is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        supported = ("eager", *(k for k in ALL_ATTENTION_FUNCTIONS.keys() if "|" not in k))
        if isinstance(value, str) and HUB_ID.fullmatch(value) and "/" in value:
            return value
    if value not in supported:
        raise ConfigError(f"{key} must be one of {', '.join(supported)}, got {value!r}")
    return value


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


@contextlib.contextmanager
def progress_bars_on_terminals() -> Iterator[None]:
    """Within the block, transformers' and the Hugging Face hub's progress bars are off unless
    ``sys.stderr`` (where tqdm draws them) is a terminal; their previous state is restored after."""
    from transformers.utils import logging as hf_logging

    stream = sys.stderr
    on_terminal = bool(getattr(stream, "isatty", None)) and stream.isatty()
    if on_terminal or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Tokenizer of a bundled model, local directory or hub id (never ``trust_remote_code``);
    progress bars only on a terminal."""
    with progress_bars_on_terminals():
        return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def load_causal_lm(name_or_path: str, runtime: Runtime, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """A causal LM in eval mode on ``runtime.torch_device`` with ``runtime.torch_dtype`` weights,
    never with ``trust_remote_code``.

    Architectures transformers knows (Qwen2/Qwen2.5, Llama, ...) load through
    ``AutoModelForCausalLM``. A checkpoint whose ``model_type`` transformers does not know but
    which is Qwen-based -- ``Efficient-Large-Model/Fast_dLLM_v2_1.5B`` has ``model_type``
    ``"Fast_dLLM_Qwen"``, architecture ``Fast_dLLM_QwenForCausalLM`` with an ``auto_map`` to
    remote code, and Qwen2 parameter names -- loads as ``Qwen2ForCausalLM`` with a
    ``Qwen2Config`` built from its ``config.json``. transformers' loading bars are drawn only on a
    terminal (``progress_bars_on_terminals``).

    Raises:
        ValueError: for an unknown ``model_type`` that is not Qwen-based.
    """
    with progress_bars_on_terminals():
        return _load_causal_lm(name_or_path, runtime, attn_implementation)


def _load_causal_lm(name_or_path: str, runtime: Runtime, attn_implementation: str) -> PreTrainedModel:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = resolve_model_path(name_or_path)
    config_dict = _read_config_dict(path)
    model_type = None if config_dict is None else config_dict.get("model_type")
    if config_dict is None or model_type in CONFIG_MAPPING:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=runtime.torch_dtype, attn_implementation=attn_implementation
        )
    else:
        archs = " ".join(config_dict.get("architectures") or [])
        if "qwen" not in f"{model_type} {archs}".lower():
            raise ValueError(
                f"model {name_or_path!r} has model_type {model_type!r}, unknown to transformers and not Qwen-based; "
                "only Qwen-based custom checkpoints (e.g. Fast_dLLM_v2) load without remote code"
            )
        model = Qwen2ForCausalLM.from_pretrained(
            path,
            config=qwen2_config_from_fastdllm(config_dict),
            dtype=runtime.torch_dtype,
            attn_implementation=attn_implementation,
        )
    return model.to(runtime.torch_device).eval()


def _read_config_dict(path_or_id: str) -> dict[str, Any] | None:
    """``config.json`` of a local directory or hub id as a dict (None when it cannot be read)."""
    local = Path(path_or_id) / "config.json"
    if local.is_file():
        return json.loads(local.read_text(encoding="utf-8"))
    try:  # a hub id: the cached (or downloaded) config file, never remote code
        from transformers.utils import cached_file

        resolved = cached_file(path_or_id, "config.json")
    except Exception:  # noqa: BLE001 - fall back to the plain loader, which reports the real error
        return None
    return json.loads(Path(resolved).read_text(encoding="utf-8")) if resolved else None


def qwen2_config_from_fastdllm(config_dict: dict[str, Any]) -> Qwen2Config:
    """A ``Qwen2Config`` from a Fast_dLLM_v2 ``config.json`` dict (``model_type``
    ``"Fast_dLLM_Qwen"``, remote-code ``auto_map``): the same hyper-parameters with the
    remote-code fields dropped; extra fields such as ``bd_size`` are kept as attributes."""
    cfg = hf_config(Qwen2Config, {k: v for k, v in config_dict.items() if k != "auto_map"})
    cfg.architectures = ["Qwen2ForCausalLM"]
    return cfg


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> frozenset[int]:
    """Every token id that ends generation: the model's generation config EOS ids and the tokenizer's EOS."""
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def context_length(model: PreTrainedModel) -> int:
    """Maximum positions of the model (``max_position_embeddings``), in tokens."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 0)


def check_same_vocabulary(
    target_tokenizer: PreTrainedTokenizerBase, drafter_tokenizer: PreTrainedTokenizerBase, drafter: str
) -> None:
    """Raise ``ValueError`` naming ``drafter`` when its tokenizer differs from the target's.

    Tokenizers are compared, not embedding sizes: Qwen2.5 models pad their embedding matrices
    differently (151936 rows for 1.5B, 152064 for 7B-32B) yet share one tokenizer.
    """
    t_vocab, d_vocab = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        raise ValueError(
            f"drafter {drafter!r} has a different vocabulary from the target ({len(d_vocab)} vs {len(t_vocab)} "
            "tokens); drafter and verifier must share one tokenizer"
        )
