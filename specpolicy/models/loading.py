"""Loading Hugging Face causal LMs and tokenizers: bundled names, local paths or hub ids.

transformers draws a progress bar per load ("Loading weights", the hub's downloads) on stderr;
here it does only when stderr is a terminal (``progress_bars_on_terminals``), so a log file
(``python -m specpolicy > run.log 2>&1``) gets no bar. Resolving and checking a model's source
(bundled name, local directory, hub id) is :mod:`specpolicy.models.sources`; its names are
re-exported here for the loaders' callers.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
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
from specpolicy.models.sources import (  # noqa: F401 - where a model comes from, re-exported for loaders
    BUNDLED_MODELS,
    HUB_ID,
    bundled_dir,
    check_model_source,
    check_weights,
    resolve_model_path,
)


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
