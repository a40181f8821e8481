"""Sizes of the family's models and their save/load helpers.

Every model of the family is a ``transformers.Qwen2ForCausalLM`` with tied input/output
embeddings, so all of them load with ``AutoModelForCausalLM.from_pretrained(dir)``.
Weights are stored in **bfloat16** (``model.safetensors``); :func:`load_model` upcasts them
to float32 by default. Each model dir also holds the tokenizer, so
``AutoTokenizer.from_pretrained(dir)`` works offline.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

#: Architecture of each model, as ``Qwen2Config`` keyword arguments.
SIZES: dict[str, dict] = {
    "target": dict(
        hidden_size=256, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768
    ),
    "ar-drafter": dict(
        hidden_size=192, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1, intermediate_size=512
    ),
    # A tiny size for tests and smoke runs.
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
    ),
}
#: The dLLM drafter shares the AR drafter's architecture (it starts from its weights).
SIZES["dllm-drafter"] = SIZES["ar-drafter"]

MAX_POSITION_EMBEDDINGS = 1024


def make_config(size: str, tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None) -> Qwen2Config:
    """``Qwen2Config`` for one of :data:`SIZES`, wired to the tokenizer's special ids.

    Args:
        size: a key of :data:`SIZES`.
        tokenizer: the family tokenizer (for eos/pad ids).
        vocab_size: embedding rows; defaults to ``len(tokenizer)``.
    Raises:
        KeyError: unknown size.
        ValueError: ``vocab_size < len(tokenizer)``.
    """
    vocab = vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} < tokenizer size {len(tokenizer)}")
    cfg = Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SIZES[size],
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def new_model(
    size: str, tokenizer: PreTrainedTokenizerBase, seed: int, vocab_size: int | None = None
) -> Qwen2ForCausalLM:
    """A freshly initialised float32 model (seeded with ``torch.manual_seed(seed)``)."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(make_config(size, tokenizer, vocab_size))
    model.tie_weights()
    return model


def count_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def save_model(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    extra_config: dict | None = None,
    max_new_tokens: int = 256,
) -> Path:
    """``save_pretrained`` the model in bfloat16 with the tokenizer and a greedy generation config.

    The in-memory model is not modified (a bf16 copy is saved).

    Args:
        extra_config: extra fields written into ``config.json`` (e.g. ``bd_block_size``).
    Returns:
        ``Path(out_dir)``.
    """
    import copy

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    for k, v in (extra_config or {}).items():
        setattr(m.config, k, v)
    m.config.dtype = "bfloat16"
    m.generation_config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    m.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    share_tokenizer(out)
    return out


def share_tokenizer(model_dir: str | Path) -> bool:
    """Replace ``model_dir/tokenizer.json`` by a relative symlink to the family's shared
    ``../tokenizer/tokenizer.json`` when the two are byte-identical (the bundled target and dLLM /
    AR drafters share one tokenizer: 0.26 MB each that the 48 MB bundle need not hold three more
    times). The directory stays a complete Hugging Face model directory on any system that keeps
    symlinks (``AutoTokenizer.from_pretrained`` follows the link).

    Returns:
        True when the link was made (or already there), False when there is nothing to share.
    """
    own = Path(model_dir) / "tokenizer.json"
    shared = Path(model_dir).parent / "tokenizer" / "tokenizer.json"
    if own.is_symlink():
        return own.resolve() == shared.resolve()
    if not (own.is_file() and shared.is_file()) or own.read_bytes() != shared.read_bytes():
        return False
    own.unlink()
    own.symlink_to(Path("..") / "tokenizer" / "tokenizer.json")
    return True


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"
) -> Qwen2ForCausalLM:
    """Load a family model dir (weights stored bf16) as ``dtype``, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
    return model.eval()


def is_saved(path: str | Path) -> bool:
    """True when ``path`` holds a complete saved model (config, weights, tokenizer)."""
    p = Path(path)
    return all((p / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json"))
