"""Shared fixtures: tiny Qwen2 models built in the test (float64 so argmax near-ties cannot flip)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specpolicy.runtime import Runtime

# Tiny models: one thread is faster than two (no sync overhead) and leaves a core to other work.
torch.set_num_threads(1)

VOCAB = 64
EOS = VOCAB - 1


def tiny_lm(seed: int = 0, layers: int = 2, vocab: int = VOCAB, hidden: int = 32) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 causal LM in float64, eval mode."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=EOS,
    )
    return Qwen2ForCausalLM(config).double().eval()


def sharpen(model: Qwen2ForCausalLM, factor: float = 8.0) -> Qwen2ForCausalLM:
    """Scale the LM head so the model is confident (long accepted drafts, FailFast extensions)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(device="cpu", dtype="float64", seed=0)


def random_prompts(n: int, seed: int = 1, vocab: int = VOCAB) -> list[torch.Tensor]:
    """``n`` random prompts ((P,) int64, lengths 3..40, no EOS) for losslessness checks."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 31, 32, 33, 17, 40, 8, 64][:n] if n <= 8 else [int(x) for x in torch.randint(3, 40, (n,), generator=g)]
    return [torch.randint(0, vocab - 1, (length,), generator=g) for length in lengths]
