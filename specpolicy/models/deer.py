"""DEER checkpoints (arXiv 2512.15176): a dLLM drafter aligned to the target, stored as a LoRA
adapter on a block-diffusion drafter or as full weights.

A DEER checkpoint directory holds either

* a ``peft`` LoRA adapter -- ``adapter_config.json``, ``adapter_model.safetensors`` -- and
  ``deer.json`` naming its ``base`` (a bundled name such as ``dllm-drafter``, or a directory) and
  its ``vocab_size``; loading merges the adapter into the base (``merge_and_unload``), so the
  drafter costs what the base costs; or
* full weights (a ``Qwen2ForCausalLM`` directory with ``bd_block_size`` / ``mask_token_id`` in its
  config, and the tokenizer) and ``deer.json``.

``specpolicy.family.train_deer`` writes both forms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from specpolicy.core.errors import ConfigError
from specpolicy.core.runtime import Runtime

DEER_META = "deer.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The bundled DEER drafter's name (``specpolicy/family/bundle/deer-drafter`` once bundled).
BUNDLED_NAME = "deer-drafter"


def resolve_deer_path(name_or_path: str) -> Path:
    """``deer-drafter`` -> the bundle's directory; anything else a path (``~`` expanded)."""
    from specpolicy.models.loading import bundled_dir

    if name_or_path == BUNDLED_NAME:
        return bundled_dir() / BUNDLED_NAME
    return Path(name_or_path).expanduser()


def deer_meta(directory: Path) -> dict[str, Any]:
    """``deer.json`` of a checkpoint directory (``{}`` when absent)."""
    p = directory / DEER_META
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def deer_base(directory: Path) -> str | None:
    """The base an adapter directory names (``deer.json``'s ``base``, else the adapter config's
    ``base_model_name_or_path``); None for a full-weights directory."""
    if not (directory / ADAPTER_CONFIG).is_file():
        return None
    base = deer_meta(directory).get("base")
    if base:
        return str(base)
    return json.loads((directory / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")


def check_deer_checkpoint(key: str, value: Any, target_vocab_size: int | None = None) -> None:
    """Check a DEER checkpoint without loading it: the directory, the adapter's weights and base, or
    the full weights; and, when known, its vocabulary against the target's.

    Args:
        key: the setting's name for messages (``drafter.model``).
        value: the setting (``deer-drafter`` or a directory).
        target_vocab_size: the target's ``vocab_size`` (its config), or None when unknown.
    Raises:
        ConfigError: one line naming ``key``, the value and what was expected.
    """
    from specpolicy.models.loading import check_model_source, check_weights, resolve_model_path

    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be {BUNDLED_NAME!r} or a DEER checkpoint directory, got {value!r}")
    d = resolve_deer_path(value)
    if not d.is_dir():
        hint = (
            " (not bundled yet: train it with python -m specpolicy.family.train_deer)" if value == BUNDLED_NAME else ""
        )
        raise ConfigError(f"{key}={value!r}: no DEER checkpoint directory at {d}{hint}")
    base = deer_base(d)
    if base is None and (d / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"{key}={value!r}: {ADAPTER_WEIGHTS} without {ADAPTER_CONFIG} in {d}")
    if base is not None:
        if not (d / ADAPTER_WEIGHTS).is_file():
            raise ConfigError(f"{key}={value!r}: the DEER adapter's weights {d / ADAPTER_WEIGHTS} are missing")
        check_weights(f"{key}={value!r}", d)
        check_model_source(f"{key}={value!r} (its base)", base)
        vocab = deer_meta(d).get("vocab_size")
        if vocab is None:
            cfg = Path(resolve_model_path(base)) / "config.json"
            vocab = json.loads(cfg.read_text(encoding="utf-8")).get("vocab_size") if cfg.is_file() else None
    elif (d / "config.json").is_file():
        check_model_source(key, str(d))
        vocab = deer_meta(d).get("vocab_size") or json.loads((d / "config.json").read_text()).get("vocab_size")
    else:
        raise ConfigError(
            f"{key}={value!r}: {d} holds neither a DEER adapter ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}) nor full "
            "weights (config.json + model.safetensors)"
        )
    if target_vocab_size is not None and vocab is not None and int(vocab) != int(target_vocab_size):
        raise ConfigError(
            f"{key}={value!r}: a DEER checkpoint of a {vocab}-token vocabulary; the target has {target_vocab_size} "
            "(expected a drafter trained on the target's tokenizer)"
        )


def load_deer(name_or_path: str, runtime: Runtime, attn_implementation: str = "sdpa") -> tuple[PreTrainedModel, str]:
    """A DEER drafter as a plain causal LM in eval mode on ``runtime``'s device and dtype.

    An adapter is merged into its base in float32 (``PeftModel.from_pretrained(base, dir)
    .merge_and_unload()``), then cast to ``runtime.torch_dtype``.

    Returns:
        ``(model, tokenizer source)``: the tokenizer is the base's (adapter) or the directory's.
    Raises:
        ConfigError: see :func:`check_deer_checkpoint` (the vocabulary is checked against the
            target by the caller).
    """
    from specpolicy.models.loading import load_causal_lm, resolve_model_path

    check_deer_checkpoint("drafter.model", name_or_path)
    d = resolve_deer_path(name_or_path)
    base = deer_base(d)
    if base is None:
        return load_causal_lm(str(d), runtime, attn_implementation), str(d)
    from peft import PeftModel

    model = load_causal_lm(base, runtime, attn_implementation).float()  # the base's stored weights are exact here
    merged = PeftModel.from_pretrained(model, str(d)).merge_and_unload()
    merged = merged.to(device=runtime.torch_device, dtype=runtime.torch_dtype).eval()
    return merged, resolve_model_path(base)
