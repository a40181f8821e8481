"""HF verifier: one pass per round, cache cropped (never recomputed), bonus/correction, EOS."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from conftest import EOS, random_prompts, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.types import Draft
from specpolicy.verifiers.hf import HFVerifier


def _fresh_cache(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    model(input_ids=ids[None], cache=cache, use_cache=True)
    return cache


def _assert_cache_equal(a: DynamicCache, b: DynamicCache) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers):
        torch.testing.assert_close(la.keys, lb.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(la.values, lb.values, rtol=0, atol=1e-10)


def _draft(ids) -> Draft:
    ids = torch.as_tensor(ids, dtype=torch.long)
    return Draft(ids, torch.ones(len(ids)), forward_passes=1)


def _greedy(model, runtime, prompt, n) -> torch.Tensor:
    v = HFVerifier(model, runtime, frozenset())
    return generate(prompt, v, runtime, max_new_tokens=n).output_ids


@pytest.mark.parametrize("wrong_at", [0, 2, 5])
def test_rejection_crops_cache_to_fresh_prefill(runtime, wrong_at):
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    greedy = _greedy(model, runtime, prompt, 6)
    draft_ids = greedy.clone()
    draft_ids[wrong_at] = (draft_ids[wrong_at] + 1) % 60
    v = HFVerifier(model, runtime, frozenset())
    v.prefill(prompt)
    result = v.verify(_draft(draft_ids))
    assert result.accepted_length == wrong_at
    assert result.next_token == int(greedy[wrong_at])  # the correction token
    committed = torch.cat([prompt, greedy[: wrong_at + 1]])
    # Cache = committed sequence minus the pending (correction) token.
    _assert_cache_equal(v.cache, _fresh_cache(model, committed[:-1]))


def test_full_acceptance_gives_bonus_token(runtime):
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    greedy = _greedy(model, runtime, prompt, 7)
    v = HFVerifier(model, runtime, frozenset())
    v.prefill(prompt)
    result = v.verify(_draft(greedy[:6]))
    assert result.accepted_length == 6
    assert result.next_token == int(greedy[6])
    assert result.target_token_ids.shape == (7,)
    _assert_cache_equal(v.cache, _fresh_cache(model, torch.cat([prompt, greedy[:6]])))


def test_empty_draft_is_one_vanilla_step(runtime):
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    v = HFVerifier(model, runtime, frozenset())
    v.prefill(prompt)
    result = v.verify(Draft.empty())
    assert result.accepted_length == 0
    assert result.next_token == int(model(prompt[None]).logits[0, -1].argmax())


def test_eos_inside_accepted_draft_ends_generation(runtime):
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    greedy = _greedy(model, runtime, prompt, 12)
    eos = int(greedy[4])  # pretend the 5th greedy token is EOS
    first = int((greedy == eos).int().argmax())
    v = HFVerifier(model, runtime, frozenset({eos}))
    out = generate(prompt, v, runtime, max_new_tokens=12)
    assert out.finish_reason == "eos"
    assert out.output_ids.tolist() == greedy[: first + 1].tolist()


def test_prompt_longer_than_context_is_rejected(runtime):
    v = HFVerifier(tiny_lm(), runtime, frozenset({EOS}), max_context=16)
    with pytest.raises(ValueError, match="prompt_ids"):
        v.prefill(torch.zeros(16, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt_ids"):
        v.prefill(torch.zeros(0, dtype=torch.long))


def test_a_new_prompt_reuses_the_emptied_cache_and_decodes_as_a_fresh_verifier(runtime):
    """The next prompt's prefill empties the last prompt's buffered cache in place (its buffers kept:
    ``emptied_cache``); the second prompt's rounds and cache equal a fresh verifier's, and a prompt
    that does not fit the buffers gets new ones."""
    model = tiny_lm()
    first = random_prompts(1)[0]
    second = first.flip(0)  # as long: it fits the buffers the first prompt's prefill made
    v = HFVerifier(model, runtime, frozenset())
    v.prefill(first)
    v.verify(_draft(_greedy(model, runtime, first, 5)))
    cache, buffers = v.cache, [layer._key_buffer for layer in v.cache.layers]
    v.prefill(second)
    assert v.cache is cache and all(layer._key_buffer is b for layer, b in zip(cache.layers, buffers))
    fresh = HFVerifier(model, runtime, frozenset())
    fresh.prefill(second)
    assert v.cached_length == fresh.cached_length == second.shape[0] - 1
    draft = _greedy(model, runtime, second, 6)
    draft[3] = (draft[3] + 1) % 60
    mine, theirs = v.verify(_draft(draft)), fresh.verify(_draft(draft))
    assert mine.accepted_length == theirs.accepted_length == 3 and mine.next_token == theirs.next_token
    _assert_cache_equal(v.cache, fresh.cache)
    longer = torch.cat([second] * 4)  # its room (prompt + BUFFER_STEP tokens) passes the buffers'
    v.prefill(longer)
    assert v.cache is not cache and v.cached_length == longer.shape[0] - 1


def test_a_prefill_outside_inference_mode_after_a_decode_and_a_refused_prompt_keep_the_cache_usable(runtime):
    """``generate`` decodes in inference mode, so the cache's buffers are inference tensors: a prefill
    outside it (an oracle's replay, under no_grad) gets new buffers rather than writing them; a prompt
    the target refuses leaves the last prompt's cache as it was."""
    model = tiny_lm()
    prompt = random_prompts(1)[0]
    v = HFVerifier(model, runtime, frozenset())
    expected = generate(prompt, v, runtime, max_new_tokens=4).output_ids
    decoded = v.cache
    assert decoded.layers[0]._key_buffer.is_inference()
    with torch.no_grad():
        v.prefill(prompt)  # raised "Inplace update to inference tensor outside InferenceMode" when reused
    assert v.cache is not decoded and v.cached_length == prompt.shape[0] - 1
    held = v.cached_length
    with pytest.raises(ValueError, match="the target accepts"):
        v.prefill(torch.zeros(v.max_context + 5, dtype=torch.long))
    assert v.cached_length == held
    assert torch.equal(generate(prompt, v, runtime, max_new_tokens=4).output_ids, expected)
