"""The model-free ``suffix`` drafter: suffix matching, frequency confidence, incremental index,
short drafts in the loop (no infinite loop), losslessness with every policy (x draft reuse)."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier
from test_lossless import POLICIES, _policy, assert_lossless


def _ids(xs):
    return torch.tensor(xs, dtype=torch.long)


def _commit(drafter: SuffixDrafter, draft: Draft, accepted: int, next_token: int) -> None:
    target = torch.cat([draft.token_ids[:accepted], _ids([next_token])])
    drafter.commit(draft, Verification(accepted, next_token, target))


def test_proposes_the_continuation_of_the_longest_matching_suffix(runtime):
    d = SuffixDrafter(runtime, min_match=1, max_match=8)
    d.prefill(_ids([1, 2, 3, 4, 9, 3, 5, 1, 2, 3]))
    draft = d.draft(3)
    # "1 2 3" occurred once, followed by 4 (the shorter context "3" was followed by 4 and 5);
    # then "... 3 4" -> 9, "... 4 9" -> 3.
    assert draft.token_ids.tolist() == [4, 9, 3]
    assert draft.confidences.dtype == torch.float32 and draft.token_ids.dtype == torch.long
    assert draft.confidences.tolist() == [1.0, 1.0, 1.0]
    assert draft.forward_passes == 0 and draft.reused_tokens == 0


def test_confidence_is_the_frequency_of_the_continuation_and_ties_go_to_the_most_recent(runtime):
    d = SuffixDrafter(runtime, min_match=2, max_match=2)
    d.prefill(_ids([5, 6, 7, 0, 5, 6, 8, 0, 5, 6, 7, 1, 5, 6]))  # (5, 6) -> 7, 8, 7
    draft = d.draft(1)
    assert draft.token_ids.tolist() == [7]
    assert draft.confidences.tolist() == pytest.approx([2 / 3])
    d.prefill(_ids([5, 6, 7, 0, 5, 6, 8, 1, 5, 6]))  # (5, 6) -> 7, 8: a tie, 8 is the most recent
    draft = d.draft(1)
    assert draft.token_ids.tolist() == [8]
    assert draft.confidences.tolist() == pytest.approx([0.5])


def test_no_match_gives_a_short_or_empty_draft(runtime):
    d = SuffixDrafter(runtime, min_match=2)
    d.prefill(_ids([1, 2, 3, 4]))  # no context of length >= 2 repeats
    assert d.draft(5).length == 0
    assert d.draft(1).length == 0  # stays empty for the round
    d.prefill(_ids([1, 2, 3, 1, 2]))  # "1 2" -> 3, then "2 3" -> 1, "3 1" -> 2, "1 2" -> 3 ...
    assert d.draft(4).token_ids.tolist() == [3, 1, 2, 3]
    d.prefill(_ids([7, 1, 2, 8, 1, 2]))  # "1 2" -> 8, "2 8" -> 1, "8 1" -> 2, ...
    assert d.draft(2).token_ids.tolist() == [8, 1]
    assert d.draft(2).token_ids.tolist() == [8, 1, 2, 8]  # extends the same round's draft


def test_min_confidence_stops_the_draft(runtime):
    d = SuffixDrafter(runtime, min_match=2, max_match=2, min_confidence=0.6)
    d.prefill(_ids([5, 6, 7, 0, 5, 6, 8, 1, 5, 6]))
    assert d.draft(3).length == 0


def _index_state(d: SuffixDrafter):
    return d._tokens, {n: {c: {t: e[0] for t, e in f.items()} for c, f in idx.items()} for n, idx in d._index.items()}


def test_commit_indexes_incrementally_like_a_fresh_prefill(runtime):
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 6, (60,), generator=g)  # small alphabet: many repeated contexts
    live = SuffixDrafter(runtime, min_match=1, max_match=5)
    live.prefill(seq[:10])
    pos = 10
    while pos < 60:
        draft = live.draft(4)
        truth = seq[pos:].tolist()
        accepted = 0
        while (
            accepted < draft.length and accepted < len(truth) - 1 and int(draft.token_ids[accepted]) == truth[accepted]
        ):
            accepted += 1
        _commit(live, draft, accepted, truth[accepted])
        pos += accepted + 1
        fresh = SuffixDrafter(runtime, min_match=1, max_match=5)
        fresh.prefill(seq[:pos])
        assert _index_state(live) == _index_state(fresh)


def test_commit_indexes_reused_tokens_too(runtime):
    d = SuffixDrafter(runtime, min_match=1, max_match=3)
    d.prefill(_ids([1, 2]))
    foreign = Draft(_ids([40, 41]), torch.ones(2), forward_passes=0, reused_tokens=2)
    _commit(d, foreign, 2, 42)  # committed: 40 41 42, none proposed by the drafter
    assert d._tokens == [1, 2, 40, 41, 42]
    assert d.lookup([40])[0] == 41


class _Silent(Drafter):
    """Proposes nothing, ever: the loop must fall back to plain decoding rounds."""

    name = "silent"

    def __init__(self):
        self.calls = 0

    def prefill(self, prompt_ids):
        pass

    def draft(self, num_tokens):
        self.calls += 1
        return Draft.empty()

    def commit(self, draft, verification):
        pass


def test_a_drafter_returning_fewer_tokens_does_not_loop_forever(runtime):
    target = tiny_lm()
    verifier = HFVerifier(target, runtime, frozenset())
    prompt = random_prompts(1)[0]
    ref = generate(prompt, verifier, runtime, max_new_tokens=12)
    silent = _Silent()
    out = generate(prompt, verifier, runtime, max_new_tokens=12, drafter=silent, policy=StaticPolicy(k=8))
    assert out.output_ids.tolist() == ref.output_ids.tolist()
    assert [r.speculation_length for r in out.rounds] == [0] * 12
    assert silent.calls == 11  # one call per round, never retried (the last round has no room to draft)


def test_suffix_drafter_drafts_repetitive_output_and_is_lossless(runtime):
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)  # confident: greedy output falls into loops
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    drafter = SuffixDrafter(runtime)
    accepted = 0
    for prompt in random_prompts(4):
        ref = generate(prompt, verifier, runtime, max_new_tokens=60)
        out = generate(prompt, verifier, runtime, max_new_tokens=60, drafter=drafter, policy=StaticPolicy(k=6))
        assert out.output_ids.tolist() == ref.output_ids.tolist()
        assert all(r.drafter_forward_passes == 0 for r in out.rounds)
        accepted += sum(r.accepted_length for r in out.rounds)
    assert accepted > 20  # the test is not vacuous: the drafter really proposed accepted tokens


@pytest.mark.parametrize("reuse", [False, True], ids=["no-reuse", "reuse"])
@pytest.mark.parametrize(  # the fast subset: a static length and FailFast; the other policies slow
    "policy", [p if p in ("static", "failfast") else pytest.param(p, marks=pytest.mark.slow) for p in sorted(POLICIES)]
)
def test_suffix_drafter_is_lossless_with_every_policy(runtime, policy, reuse):
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    p = _policy(policy)
    for min_match in (1, 3):
        d = SuffixDrafter(runtime, min_match=min_match, max_match=8)
        for prompt in random_prompts(3):
            assert_lossless(prompt, verifier, runtime, d, p, reuse)


def test_config_and_plugin(runtime):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=["drafter=suffix", "policy=failfast"])
    pm = get_plugin_manager(autoload=False)
    drafter = make_drafter(pm, OmegaConf.to_container(cfg.drafter), runtime, verifier=None)
    assert isinstance(drafter, SuffixDrafter) and drafter.name == "suffix"
    assert (drafter.min_match, drafter.max_match) == (2, 16)
    make_policy(pm, OmegaConf.to_container(cfg.policy))
    with pytest.raises(ValueError, match="unknown drafter.suffix key"):
        make_drafter(pm, {"name": "suffix", "min_len": 3}, runtime, verifier=None)


@pytest.mark.parametrize(
    "kwargs,key",
    [({"min_match": 0}, "min_match"), ({"max_match": 1}, "max_match"), ({"min_confidence": 1.5}, "min_confidence")],
)
def test_bad_values_name_the_key(runtime, kwargs, key):
    with pytest.raises(ValueError, match=f"drafter.{key}"):
        SuffixDrafter(runtime, **kwargs)
    with pytest.raises(ValueError, match="prompt_ids"):
        SuffixDrafter(runtime).prefill(_ids([]))
