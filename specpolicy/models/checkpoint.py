"""Reading and writing draft-model checkpoint directories (``config.json`` + weights).

Official DFlash and EAGLE-3 checkpoints hold ``config.json`` and ``model.safetensors`` (sharded
with ``model.safetensors.index.json``) or, in older EAGLE releases, ``pytorch_model.bin``. Nothing
here runs remote code; ``.bin`` files are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specpolicy.core.errors import ConfigError
from specpolicy.models.sources import check_model_source, local_config_path, resolve_model_path


def read_config(directory: str | Path, key: str) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory as a dict.

    Args:
        directory: the checkpoint directory.
        key: how the user named it, for messages (e.g. ``drafter.model='/ckpt'``).
    Raises:
        ConfigError: naming ``key`` when the directory or its ``config.json`` is missing or invalid.
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{key}: {Path(directory)} has no config.json (expected a draft-model checkpoint directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{key}: {path} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{key}: {path} must hold a JSON object")
    return config


def hf_config(config_class: type, config: dict[str, Any]):
    """A transformers config of ``config_class`` (``Qwen3Config``, ``LlamaConfig``) from a
    checkpoint's config.json dict; fields the class does not know are kept as attributes."""
    return config_class(
        **{k: v for k, v in config.items() if k not in ("architectures", "model_type", "transformers_version")}
    )


def decoder_fields(config, head_dim: int) -> dict[str, Any]:
    """The config.json fields of a transformers decoder config (``LlamaConfig``, ``Qwen3Config``)
    that the draft heads' checkpoints write alike (``hf_config`` reads them back): sizes, heads,
    ``head_dim`` (the attention module's), activation, norm epsilon, vocabulary, positions and
    ``rope_theta``; ``num_hidden_layers`` and the head's own fields are the caller's."""
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": float(config.rope_parameters["rope_theta"]),
    }


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory: every ``*.safetensors``, else ``pytorch_model*.bin``."""
    d = Path(directory)
    return sorted(d.glob("*.safetensors")) or sorted(d.glob("pytorch_model*.bin"))


def load_weights(directory: str | Path, key: str) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, on the CPU, in the stored dtypes.

    Raises:
        ConfigError: naming ``key`` when the directory has no weight files.
    """
    from safetensors.torch import load_file

    files = weight_files(directory)
    if not files:
        raise ConfigError(f"{key}: {Path(directory)} has no model.safetensors or pytorch_model.bin")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(
            load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu", weights_only=True)
        )
    return dequantize_int8(state)


#: Suffix of the per-row scale that marks a weight stored as int8 (``save_checkpoint(..., int8=True)``).
INT8_SCALE = ".int8_scale"


def quantize_int8(state: dict[str, torch.Tensor], min_numel: int = 4096) -> dict[str, torch.Tensor]:
    """Row-wise symmetric int8 storage of the 2-D floating tensors of ``state`` with at least
    ``min_numel`` elements: ``w`` (rows, cols) becomes ``round(w / s)`` as int8 plus ``s`` (rows,)
    float32 stored under ``<name>.int8_scale``, ``s = max|w_row| / 127``; other tensors unchanged.

    One byte a weight instead of two (bfloat16): used for the bundled drafters that share the
    family's 48 MB; the round trip error is at most ``s / 2`` per weight. Read back by
    :func:`dequantize_int8` (``load_weights`` does it), so loaders never see the format.
    """
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        if w.is_floating_point() and w.dim() == 2 and w.numel() >= min_numel:
            w32 = w.detach().float()
            scale = (w32.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
            out[name] = torch.round(w32 / scale[:, None]).clamp_(-127, 127).to(torch.int8)
            out[name + INT8_SCALE] = scale
        else:
            out[name] = w
    return out


def stored_int8(directory: str | Path) -> bool:
    """Whether the checkpoint in ``directory`` stores weights as int8 (:func:`quantize_int8`): one
    of its safetensors files holds a ``<name>.int8_scale`` tensor; False when it has none."""
    from safetensors import safe_open

    for path in weight_files(directory):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                if any(k.endswith(INT8_SCALE) for k in f.keys()):
                    return True
    return False


def dequantize_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`quantize_int8`: every int8 tensor with a ``<name>.int8_scale`` companion
    becomes ``int8 * scale`` in float32 (shape (rows, cols)); a state without such pairs is
    returned as it is."""
    scales = {k.removesuffix(INT8_SCALE): v for k, v in state.items() if k.endswith(INT8_SCALE)}
    if not scales:
        return state
    return {
        k: (v.float() * scales[k][:, None].float() if k in scales else v)
        for k, v in state.items()
        if not k.endswith(INT8_SCALE)
    }


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], key: str, ignore: tuple[str, ...] = ()) -> None:
    """Copy ``state`` into ``module``'s parameters and persistent buffers (shapes checked).

    Args:
        ignore: key prefixes of ``state`` that are not the module's (e.g. embeddings a checkpoint
            carries though the target's are used).
    Raises:
        ConfigError: naming ``key`` and the missing, unexpected or mis-shaped tensors.
    """
    own = module.state_dict()
    state = {k.removeprefix("model."): v for k, v in state.items()}  # some exports prefix every key
    state = {k: v for k, v in state.items() if not k.startswith(ignore)}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"{key}: the checkpoint does not fit the model: missing {missing[:6]}"
            f"{' ...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}"
            f"{' ...' if len(unexpected) > 6 else ''}"
        )
    bad = [
        f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})"
        for k, v in own.items()
        if tuple(state[k].shape) != tuple(v.shape)
    ]
    if bad:
        raise ConfigError(f"{key}: tensor shapes do not fit the config: {', '.join(bad[:4])}")
    module.load_state_dict({k: state[k].to(own[k].dtype) for k in own})


def save_checkpoint(
    directory: str | Path,
    config: dict[str, Any],
    state: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.bfloat16,
    int8: bool = False,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (floating tensors cast to ``dtype``).

    Args:
        int8: store the large 2-D weights row-wise as int8 (:func:`quantize_int8`, one byte a
            weight; the official loaders do not read this form, ours do through ``load_weights``).
    Returns:
        ``Path(directory)``.
    """
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = quantize_int8(state) if int8 else state
    tensors = {
        k: (v.detach().to(dtype) if v.is_floating_point() and not k.endswith(INT8_SCALE) else v.detach())
        .contiguous()
        .cpu()
        for k, v in state.items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def target_config_of(run_config: dict | None) -> dict | None:
    """The target's ``config.json`` as a dict, read without loading the model or any network, when
    the run's ``verifier.model`` is a bundled name, a local directory or a hub id in the local hub
    cache (``specpolicy.models.sources.local_config_path``); None otherwise (a hub id not cached,
    another verifier): the drafter then checks itself against the loaded target."""
    verifier = (run_config or {}).get("verifier") or {}
    model = verifier.get("model")
    if not isinstance(model, str) or not model:
        return None
    try:
        path = local_config_path(model)
        return json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None


def check_checkpoint(model: str, run_config: dict | None, fits, spec_of) -> None:
    """The ``specpolicy_validate_config`` check of a drafter that reads the target, before anything
    loads: the checkpoint's directory, ``config.json`` and weights files, and -- when the target is
    bundled or local -- the checkpoint against the target's ``config.json``.

    Args:
        model: ``drafter.model`` (a bundled name or a checkpoint directory).
        run_config: the whole run config (``target_config_of`` reads the target from it).
        fits: ``fits(draft_config, target_config, key)`` raising ``ConfigError`` when they do not fit.
        spec_of: ``spec_of(draft_config, key)`` raising ``ConfigError`` for a malformed checkpoint.
    Raises:
        ConfigError: naming ``drafter.model``, the value and what is wrong.
    """
    check_model_source("drafter.model", model)
    key = f"drafter.model={model!r}"
    try:
        directory = resolve_model_path(model)
    except FileNotFoundError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    draft_config = read_config(directory, key)
    target = target_config_of(run_config)
    if target is not None:
        fits(draft_config, target, key)
    else:
        spec_of(draft_config, key)
