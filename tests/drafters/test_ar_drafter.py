"""AR drafter: greedy tokens and confidences, cache rolled back to the committed prefix."""

from __future__ import annotations

import pytest
import torch

from conftest import random_prompts, tiny_lm
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.ar import ARDrafter
from test_verifier import _assert_cache_equal, _fresh_cache


def _verdict(draft: Draft, accepted: int, next_token: int) -> Verification:
    target = torch.cat([draft.token_ids[:accepted], torch.tensor([next_token])])
    return Verification(accepted, next_token, target)


@torch.no_grad()
def test_draft_is_greedy_with_max_prob_confidence(runtime):
    model = tiny_lm(seed=3)
    prompt = random_prompts(1)[0]
    d = ARDrafter(model, runtime)
    d.prefill(prompt)
    draft = d.draft(3)
    draft = d.draft(2)  # extension continues the same draft
    assert draft.length == 5 and draft.forward_passes == 5
    seq = prompt.clone()
    for tok, conf in zip(draft.token_ids, draft.confidences):
        probs = torch.softmax(model(seq[None]).logits[0, -1], -1)
        assert int(tok) == int(probs.argmax())
        assert float(conf) == pytest.approx(float(probs.max()), abs=1e-6)  # confidences are float32
        seq = torch.cat([seq, tok[None]])


@pytest.mark.parametrize("accepted", [0, 2, 4, 5])
def test_commit_rolls_cache_back_to_committed_prefix(runtime, accepted):
    model = tiny_lm(seed=3)
    prompt = random_prompts(1)[0]
    d = ARDrafter(model, runtime)
    d.prefill(prompt)
    draft = d.draft(5)
    d.commit(draft, _verdict(draft, accepted, next_token=7))
    committed = torch.cat([prompt, draft.token_ids[:accepted], torch.tensor([7])])
    cached = d.cache.get_seq_length()
    assert cached + d._unfed.shape[0] == committed.shape[0]
    assert torch.equal(d._unfed, committed[cached:])
    _assert_cache_equal(d.cache, _fresh_cache(model, committed[:cached]))
    # The next draft continues the committed sequence exactly as a fresh drafter would.
    fresh = ARDrafter(model, runtime)
    fresh.prefill(committed)
    assert torch.equal(d.draft(3).token_ids, fresh.draft(3).token_ids)


def test_commit_of_reused_tokens_and_empty_rounds(runtime):
    model = tiny_lm(seed=3)
    prompt = random_prompts(1)[0]
    d = ARDrafter(model, runtime)
    d.prefill(prompt)
    empty = Draft.empty()
    d.commit(empty, _verdict(empty, 0, next_token=9))  # a round with speculation length 0
    draft = d.draft(2)
    reused = Draft(torch.cat([draft.token_ids, torch.tensor([1, 2])]), torch.ones(4), 2, reused_tokens=2)
    d.commit(reused, _verdict(reused, 4, next_token=3))  # accepted past the drafter's own tokens
    committed = torch.cat([prompt, torch.tensor([9]), reused.token_ids, torch.tensor([3])])
    fresh = ARDrafter(model, runtime)
    fresh.prefill(committed)
    assert torch.equal(d.draft(4).token_ids, fresh.draft(4).token_ids)


def test_bad_input(runtime):
    d = ARDrafter(tiny_lm(), runtime)
    with pytest.raises(ValueError, match="prompt_ids"):
        d.prefill(torch.zeros(0, dtype=torch.long))
    d.prefill(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_tokens"):
        d.draft(0)
