"""Loading Hugging Face causal LMs and tokenizers: bundled names, local paths or hub ids."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specpolicy.runtime import Runtime

#: Models of the bundled family (``specpolicy/assets/family/<name>``), trained by ``python -m specpolicy.family``.
BUNDLED_MODELS = ("target", "ar-drafter", "dllm-drafter")


def bundled_dir() -> Path:
    """Directory holding the bundled model family."""
    return Path(str(resources.files("specpolicy") / "assets" / "family"))


def resolve_model_path(name_or_path: str) -> str:
    """Map a bundled model name (``target``, ``ar-drafter``, ``dllm-drafter``) to its directory;
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


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Tokenizer of a bundled model, local directory or hub id (never ``trust_remote_code``)."""
    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def load_causal_lm(name_or_path: str, runtime: Runtime, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """A causal LM in eval mode on ``runtime.torch_device`` with ``runtime.torch_dtype`` weights.

    Works for any architecture transformers knows natively (Qwen2/Qwen2.5, Llama, ...);
    Fast-dLLM v2 checkpoints load here too, as plain Qwen2 weights.
    """
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name_or_path), dtype=runtime.torch_dtype, attn_implementation=attn_implementation
    )
    return model.to(runtime.torch_device).eval()


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


@torch.no_grad()
def check_same_vocabulary(target_vocab_size: int, drafter_vocab_size: int, drafter: str) -> None:
    """Raise ``ValueError`` naming ``drafter`` when drafter and target vocabularies differ."""
    if target_vocab_size != drafter_vocab_size:
        raise ValueError(
            f"drafter {drafter!r} has vocabulary size {drafter_vocab_size} but the target has {target_vocab_size}; "
            "drafter and verifier must share one tokenizer"
        )
