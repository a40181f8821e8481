"""Draft reuse by suffix matching (FailFast App. E): hand-built drafts, token ids as tensors."""

from __future__ import annotations

import pytest
import torch

from specpolicy.core.reuse import DraftReuse
from specpolicy.core.types import Draft, Verification

# Letters as token ids, so tests read like the paper's example.
VOCAB = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
BIG_ROOM = 1000


def ids(letters: str) -> torch.Tensor:
    return torch.tensor([VOCAB[c] for c in letters.replace(" ", "")], dtype=torch.long)


def letters(t: torch.Tensor) -> str:
    inv = {i: c for c, i in VOCAB.items()}
    return "".join(inv[int(i)] for i in t)


def draft(s: str, conf: list[float] | None = None, forward_passes: int = 3, reused: int = 0) -> Draft:
    tok = ids(s)
    if conf is None:
        conf = [0.5] * len(tok)
    return Draft(tok, torch.tensor(conf, dtype=torch.float32), forward_passes=forward_passes, reused_tokens=reused)


def verdict(d: Draft, accepted: int) -> Verification:
    """A verification that accepts ``accepted`` tokens of ``d`` (target tokens are arbitrary after them)."""
    target = torch.cat([d.token_ids[:accepted], torch.full((d.length + 1 - accepted,), VOCAB["z"])])
    return Verification(accepted_length=accepted, next_token=int(target[accepted]), target_token_ids=target)


def observed(prev: str, accepted: int, min_match: int = 2, conf: list[float] | None = None) -> DraftReuse:
    reuse = DraftReuse(min_match=min_match)
    d = draft(prev, conf)
    reuse.observe(d, verdict(d, accepted))
    return reuse


def test_paper_example():
    """App. E: rejected tail ``x e f g h i j`` and draft ``a b c d e f g`` give ``a b c d e f g h i j``."""
    # Previous round: "p q" accepted, "x" rejected (first rejection), tail = "x e f g h i j".
    conf = [0.9, 0.9, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    reuse = observed("pq xefghij", accepted=2, conf=conf)
    new = draft("abcdefg", forward_passes=4)
    out = reuse.extend(new, BIG_ROOM)
    assert letters(out.token_ids) == "abcdefghij"
    assert out.reused_tokens == 3
    assert out.forward_passes == 4  # reuse costs no drafter pass
    assert out.token_ids.dtype == torch.long and out.confidences.dtype == torch.float32
    # The appended tokens keep the confidences they had in the tail ("h i j": 0.5, 0.6, 0.7).
    assert torch.equal(out.confidences[:7], new.confidences)
    assert out.confidences[7:].tolist() == pytest.approx([0.5, 0.6, 0.7])


def test_draft_shorter_or_longer_than_tail():
    reuse = observed("xefghij", accepted=0)
    assert letters(reuse.extend(draft("fg"), BIG_ROOM).token_ids) == "fghij"
    reuse = observed("efgh", accepted=0)
    assert letters(reuse.extend(draft("abcdefg"), BIG_ROOM).token_ids) == "abcdefgh"


def test_longest_suffix_is_preferred():
    # Tail "x g q e f g r s": the suffix "g" occurs at 1 (followed by "q e f g r s"), the longer
    # suffix "e f g" at 3..5 (followed by "r s"). The longest match wins, even with min_match=1.
    reuse = observed("xgqefgrs", accepted=0, min_match=1)
    out = reuse.extend(draft("abefg"), BIG_ROOM)
    assert letters(out.token_ids) == "abefgrs"
    assert out.reused_tokens == 2


def test_no_match_returns_draft_unchanged():
    reuse = observed("xefghij", accepted=0)
    d = draft("abcd")
    out = reuse.extend(d, BIG_ROOM)
    assert out is d and out.reused_tokens == 0


def test_match_ending_at_last_tail_token_gives_nothing():
    reuse = observed("xefg", accepted=0)
    d = draft("abefg")  # "e f g" ends at the tail's last token: nothing follows it
    assert reuse.extend(d, BIG_ROOM) is d


def test_min_match():
    tail = "xefghij"
    d = draft("abcg")  # only the 1-token suffix "g" occurs in the tail
    assert observed(tail, 0, min_match=2).extend(d, BIG_ROOM) is d
    assert letters(observed(tail, 0, min_match=1).extend(d, BIG_ROOM).token_ids) == "abcghij"
    d3 = draft("afg")  # 2-token suffix "f g"
    assert observed(tail, 0, min_match=3).extend(d3, BIG_ROOM) is d3
    assert letters(observed(tail, 0, min_match=2).extend(d3, BIG_ROOM).token_ids) == "afghij"
    # A draft shorter than min_match is never extended.
    short = draft("g")
    assert observed(tail, 0, min_match=2).extend(short, BIG_ROOM) is short


def test_min_match_must_be_positive():
    with pytest.raises(ValueError, match="reuse.min_match"):
        DraftReuse(min_match=0)


def test_room_limit():
    reuse = observed("xefghij", accepted=0)
    d = draft("abcdefg")
    out = reuse.extend(d, room=9)  # room for 2 more tokens
    assert letters(out.token_ids) == "abcdefghi"
    assert out.reused_tokens == 2
    assert reuse.extend(d, room=7) is d  # no room left
    assert reuse.extend(d, room=3) is d  # less room than the draft (the loop never does this)


def test_nothing_before_first_observe_and_after_reset():
    reuse = DraftReuse()
    d = draft("abcdefg")
    assert reuse.extend(d, BIG_ROOM) is d
    prev = draft("xefghij")
    reuse.observe(prev, verdict(prev, 0))
    assert reuse.extend(d, BIG_ROOM).length == 10
    reuse.reset()  # a new prompt: the previous prompt's tail must not leak
    assert reuse.extend(d, BIG_ROOM) is d


def test_fully_accepted_round_leaves_no_tail():
    reuse = observed("xefghij", accepted=0)
    full = draft("abcd")
    reuse.observe(full, verdict(full, 4))  # everything accepted: empty tail replaces the old one
    d = draft("abcdefg")
    assert reuse.extend(d, BIG_ROOM) is d


def test_tail_is_replaced_each_round():
    reuse = observed("xefghij", accepted=0)
    second = draft("qrsefgkl")
    reuse.observe(second, verdict(second, 3))  # new tail "e f g k l"
    assert letters(reuse.extend(draft("abefg"), BIG_ROOM).token_ids) == "abefgkl"


def test_reused_tokens_accumulate():
    reuse = observed("xefghij", accepted=0)
    d = draft("abcdefg", reused=1)
    assert reuse.extend(d, BIG_ROOM).reused_tokens == 4
