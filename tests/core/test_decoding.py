"""The decoding loop: vanilla == target greedy, max_new_tokens / EOS cuts inside a draft, bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.policy import LengthPolicy
from specpolicy.drafters.ar import ARDrafter
from specpolicy.verifiers.hf import HFVerifier


class FixedLength(LengthPolicy):
    name = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k

    def next_length(self, draft):
        return self.k if draft.length == 0 else 0


@torch.no_grad()
def test_vanilla_matches_uncached_greedy(runtime):
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    out = generate(prompt, HFVerifier(model, runtime, frozenset()), runtime, max_new_tokens=10).output_ids
    seq = prompt.clone()
    for _ in range(10):
        seq = torch.cat([seq, model(seq[None]).logits[0, -1].argmax()[None]])
    assert out.tolist() == seq[prompt.shape[0] :].tolist()


@pytest.mark.parametrize("max_new_tokens", list(range(1, 14)))
def test_max_new_tokens_cuts_inside_an_accepted_draft(runtime, max_new_tokens):
    target = sharpen(tiny_lm())
    drafter = ARDrafter(target, runtime)  # the target itself: every draft token is accepted
    verifier = HFVerifier(target, runtime, frozenset())
    prompt = random_prompts(1)[0]
    ref = generate(prompt, verifier, runtime, max_new_tokens=max_new_tokens)
    out = generate(prompt, verifier, runtime, max_new_tokens=max_new_tokens, drafter=drafter, policy=FixedLength(5))
    assert out.output_ids.tolist() == ref.output_ids.tolist()
    assert len(out.output_ids) == max_new_tokens
    assert sum(r.emitted_tokens for r in out.rounds) == max_new_tokens
    assert all(r.speculation_length <= max_new_tokens - 1 for r in out.rounds)


@pytest.mark.parametrize("eos_position", range(0, 12))
def test_eos_at_every_position_of_a_draft(runtime, eos_position):
    target = sharpen(tiny_lm())
    prompt = random_prompts(1)[0]
    greedy = generate(prompt, HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=12).output_ids
    eos = int(greedy[eos_position])
    expected = greedy[: int((greedy == eos).int().argmax()) + 1].tolist()
    verifier = HFVerifier(target, runtime, frozenset({eos}))
    out = generate(
        prompt, verifier, runtime, max_new_tokens=12, drafter=ARDrafter(target, runtime), policy=FixedLength(6)
    )
    assert out.output_ids.tolist() == expected
    assert out.finish_reason == "eos"
    assert sum(r.emitted_tokens for r in out.rounds) == len(expected)


def test_bad_arguments(runtime):
    model = tiny_lm()
    verifier = HFVerifier(model, runtime, frozenset())
    prompt = random_prompts(1)[0]
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(prompt, verifier, runtime, max_new_tokens=0)
    with pytest.raises(ValueError, match="drafter and policy"):
        generate(prompt, verifier, runtime, max_new_tokens=5, drafter=ARDrafter(model, runtime))
    with pytest.raises(ValueError, match="negative"):
        generate(prompt, verifier, runtime, max_new_tokens=5, drafter=ARDrafter(model, runtime), policy=FixedLength(-1))


@pytest.mark.parametrize("with_drafter", [False, True])
def test_generation_stops_cleanly_when_the_context_is_full(runtime, with_drafter):
    target = sharpen(tiny_lm())
    prompt = random_prompts(2)[1][:6]
    verifier = HFVerifier(target, runtime, frozenset(), max_context=20)
    kwargs = {"drafter": ARDrafter(target, runtime), "policy": FixedLength(5)} if with_drafter else {}
    out = generate(prompt, verifier, runtime, max_new_tokens=50, **kwargs)
    assert out.finish_reason == "max_context"
    assert len(prompt) + len(out.output_ids) == 21  # the last token is emitted, never fed
    ref = generate(prompt, HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=15).output_ids
    assert out.output_ids.tolist() == ref.tolist()
