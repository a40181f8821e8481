"""``Draft.chain``, the drafters' fast construction of a chain draft, against the dataclass's
``__init__`` it replaces: the same fields (every field of ``Draft``, a field added later included),
the same counted length, equal drafts; and the AR drafter's round-first draft (one token, no cat)
against the cat of its tokens."""

from __future__ import annotations

import dataclasses
import random

import torch

from conftest import random_prompts, tiny_lm
from specpolicy.core.types import LAST_HIDDEN, Draft
from specpolicy.drafters.ar import ARDrafter


def test_chain_equals_the_dataclass_init_on_random_drafts():
    rng = random.Random(0)
    for _ in range(50):
        k = rng.randint(0, 6)
        tokens = torch.randint(0, 100, (k,))
        confs = torch.rand(k)
        probs = torch.rand(k, 5) if rng.random() < 0.5 else None
        stop = rng.random() < 0.5
        extras = {LAST_HIDDEN: torch.rand(k, 3)} if rng.random() < 0.5 else None
        passes = rng.randint(0, 9)
        fast = Draft.chain(tokens, confs, passes, k, probs, stop, extras)
        slow = Draft(tokens, confs, forward_passes=passes, probs=probs, ends_at_stop_token=stop, extras=extras or {})
        slow = slow.counted(k)
        assert fast == slow
        assert fast.__dict__.keys() == slow.__dict__.keys()  # every field, and the counted length
        for f in dataclasses.fields(Draft):
            assert getattr(fast, f.name) is getattr(slow, f.name) or getattr(fast, f.name) == getattr(slow, f.name)
        assert fast.length == k and not fast.is_tree


def test_ar_round_first_draft_is_the_cat_of_its_token(runtime):
    drafter = ARDrafter(tiny_lm(seed=1, layers=2), runtime)
    drafter.prefill(random_prompts(1, seed=2)[0])
    first = drafter.draft(1)
    assert first.length == 1 and first.token_ids.dtype == torch.long and first.confidences.dtype == torch.float32
    assert torch.equal(first.token_ids, torch.cat(drafter._tokens)) and torch.equal(
        first.confidences, torch.cat(drafter._confs)
    )
    longer = drafter.draft(2)  # later calls: the cat of the round's tokens
    assert longer.length == 3 and torch.equal(longer.token_ids[:1], first.token_ids)
    assert torch.equal(longer.confidences[:1], first.confidences)
