"""Random targets of the architectures users bring, built from the real ``config.json`` of
Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B and Mistral-7B-v0.3 (``tests/models/families/*.json``, the
published files' fields), cut for the CPU suite: fewer layers, a smaller width and vocabulary and
a shorter context, while keeping what tells the families apart -- the RoPE (``rope_theta``,
Llama-3's ``rope_scaling`` of type ``llama3``), ``head_dim`` (128, which a cut width no longer
divides into: the explicit-``head_dim`` path), the grouped-query ratio of query to key/value heads,
Qwen2's q/k/v biases, Qwen3's q/k norms, the norm epsilon, tied or untied embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

FAMILY_DIR = Path(__file__).resolve().parent / "models" / "families"
#: The families, by their fixture's name.
FAMILIES = ("llama-3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b-v0.3")


def real_config(name: str) -> dict:
    """The published ``config.json`` of family ``name`` as a dict."""
    return json.loads((FAMILY_DIR / f"{name}.json").read_text())


def cut_config(
    name: str, layers: int = 2, hidden: int | None = 64, vocab: int | None = 256, kv_heads: int = 1, context: int = 1024
) -> dict:
    """Family ``name``'s ``config.json`` cut to ``layers`` layers, width ``hidden`` (None: the
    real one, heads as published), ``kv_heads`` key/value heads with the published ratio of query
    heads to them, ``head_dim`` kept, an intermediate size of twice the width, ``vocab`` tokens
    (None: the real vocabulary; the last one the EOS) and ``context`` positions (the RoPE's own
    ``original_max_position_embeddings`` are kept)."""
    config = real_config(name)
    heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    config.update(num_hidden_layers=layers, head_dim=head_dim, max_position_embeddings=context)
    if hidden is not None:
        config.update(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_key_value_heads=kv_heads,
            num_attention_heads=kv_heads * (heads // kv),
        )
    if vocab is not None:
        config.update(vocab_size=vocab, bos_token_id=0, eos_token_id=vocab - 1)
    if config.get("max_window_layers"):
        config["max_window_layers"] = layers
    for key in ("architectures", "torch_dtype", "transformers_version"):
        config.pop(key, None)
    return config


def family_lm(
    name: str, seed: int = 0, sharpen: float = 6.0, tie: bool | None = None, dtype=torch.float64, **cut
) -> PreTrainedModel:
    """A random causal LM of family ``name`` (``cut_config(name, **cut)``) in ``dtype``, eval mode,
    its LM head scaled by ``sharpen`` (random weights give near-uniform logits; a sharper head makes
    a drafter close to the target get its tokens accepted); ``tie``: tie the embeddings (None: as
    published)."""
    raw = cut_config(name, **cut)
    if tie is not None:
        raw["tie_word_embeddings"] = tie
    config = CONFIG_MAPPING[raw.pop("model_type")](**raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
    if not config.tie_word_embeddings:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    return model


def perturbed(model: PreTrainedModel, scale: float = 0.3, seed: int = 7) -> PreTrainedModel:
    """A copy of ``model`` with noise (``scale`` x the weights' spread) on its LM head: a drafter
    close to the target but not equal, so drafts are accepted and rejected."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        w = other.get_output_embeddings().weight
        generator = torch.Generator().manual_seed(seed)
        w.add_(scale * w.std() * torch.randn(w.shape, generator=generator, dtype=torch.float64).to(w.dtype))
    return other


def write_family_checkpoint(name: str, directory: Path, **cut) -> Path:
    """Family ``name``'s cut model saved as a Hugging Face model directory (``config.json`` with
    its published fields cut, ``model.safetensors``) in float32."""
    model = family_lm(name, dtype=torch.float32, **cut)
    model.save_pretrained(directory)
    return Path(directory)
