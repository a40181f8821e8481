"""Prompts of 4,096 tokens and contexts up to the model's limit: a tiny target whose
``max_position_embeddings`` holds them decodes a 4,096-token prompt token-identical to vanilla,
in float32 and in bfloat16, and generation ends at the context when it is reached."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.drafters.ar import ARDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier

PROMPT_TOKENS = 4096


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_4096_token_prompt_decodes_as_vanilla_up_to_the_context(dtype):
    runtime = Runtime(device="cpu", dtype=dtype, seed=0)
    target = sharpen(tiny_lm(0, max_positions=PROMPT_TOKENS + 24, eos=None)).to(runtime.torch_dtype)
    drafter = sharpen(tiny_lm(1, max_positions=PROMPT_TOKENS + 24, eos=None)).to(runtime.torch_dtype)
    prompt = torch.randint(0, VOCAB - 1, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3))
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 4})
    verifier = HFVerifier(target, runtime, frozenset())
    spec = generate(prompt, verifier, runtime, max_new_tokens=64, drafter=ARDrafter(drafter, runtime), policy=policy)
    van = generate(prompt, HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=64)
    assert spec.finish_reason == van.finish_reason == "max_context"  # the context (4,120 tokens) ends it
    # every position of the context was fed to the target; the last token emitted never is
    assert PROMPT_TOKENS + spec.generated_tokens - 1 == verifier.max_context == PROMPT_TOKENS + 24
    assert spec.output_ids.tolist() == van.output_ids.tolist()
