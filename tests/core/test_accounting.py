"""Drafter pass accounting: the official FailFast harness's count rebuilt from round records, the
commit passes it removes checked against a real ``fastdllm`` drafter, and the modeled-latency option."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.analysis.results import PromptResult
from specpolicy.analysis.summary import summarize
from specpolicy.core.accounting import carried_passes, official_passes, with_pass_accounting
from specpolicy.core.decoding import generate
from specpolicy.core.latency import LatencyProfile, load_profile
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.types import GenerationResult, RoundRecord
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


def r(k: int, a: int, passes: int, reused: int = 0) -> RoundRecord:
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=a,
        emitted_tokens=a + 1,
        drafter_forward_passes=passes,
        reused_tokens=reused,
        draft_ms=0.0,
        verify_ms=0.0,
    )


def prompt_result(rounds, prompt_tokens: int) -> PromptResult:
    tokens = sum(x.emitted_tokens for x in rounds)
    output = GenerationResult(torch.zeros(tokens, dtype=torch.long), tuple(rounds), "max_new_tokens", 1.0, 0.0)
    return PromptResult("p", prompt_tokens, output)


# A 40-token prompt, B = 32 (small blocks of 8), worked by hand:
ROUNDS = [
    r(10, 3, 2),  # L=40: 40..49 = 2 small blocks. Official: + prompt prefill (40 > 32).
    r(20, 20, 3),  # L=44: 44..63, no boundary. Official: prefill output of [0,32) reused (same blocks).
    r(31, 0, 5),  # L=65: commit wrote [32,64) (carried 1) + 4 small blocks. Official: re-prefill [0,64) instead.
    r(31, 30, 5),  # L=66: 66..96, crosses 96 (boundary pass), 96 is a block's first token: official +1.
    r(5, 1, 1),  # L=97: official re-prefills [0,96) (the kept output is the boundary pass's).
    r(0, 0, 0),  # a plain round (no draft)
    r(3, 0, 1),  # L=100
]


def test_official_count_of_hand_worked_rounds():
    assert carried_passes(ROUNDS, 40) == [0, 0, 1, 0, 0, 0, 0]
    assert official_passes(ROUNDS, 40) == [3, 3, 5, 6, 2, 0, 1]


def test_official_count_on_block_boundaries():
    # A prompt of exactly 64 tokens: round 1's first token comes from the prefill in both, but the
    # official harness still spends an unmasking pass on a one-token draft, and counts the prefill.
    assert official_passes([r(1, 1, 0)], 64) == [2]
    assert official_passes([r(9, 2, 2)], 64) == [3]
    # A short prompt (<= one block): no prefill pass in either.
    assert official_passes([r(5, 0, 1)], 20) == [1]
    with pytest.raises(ValueError, match="not a fastdllm run"):  # commit's pass must be in the next round
        official_passes([r(20, 20, 3), r(1, 0, 0)], 44)


def test_carried_passes_match_the_drafter(runtime):
    """``carried_passes`` recomputes what the real drafter's ``commit`` charged to each round."""
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    model = sharpen(tiny_lm(seed=0, layers=1))
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    seen = 0
    for prompt in random_prompts(6):
        d = FastDLLMDrafter(
            model,
            runtime,
            SimpleNamespace(mask_token_id=VOCAB - 2),
            block_size=16,
            small_block_size=4,
            threshold=0.05,
            stop_token_ids=[VOCAB - 1],
        )
        carries = []
        commit = d.commit

        def recording_commit(draft, verification, _commit=commit, _d=d):
            _commit(draft, verification)
            carries.append(_d._carry)

        d.commit = recording_commit
        for policy, reuse in (
            (StaticPolicy(7), None),
            (FailFastPolicy(n=4, tau=0.3, n_max=40), None),
            (FailFastPolicy(n=4, tau=0.3, n_max=40), DraftReuse(1)),
        ):
            carries.clear()
            out = generate(prompt, verifier, runtime, max_new_tokens=60, drafter=d, policy=policy, reuse=reuse)
            want = [0] + carries[: len(out.rounds) - 1]
            assert carried_passes(out.rounds, int(prompt.shape[0]), 16) == want
            official = official_passes(out.rounds, int(prompt.shape[0]), 16)
            assert all(o >= 0 for o in official) and len(official) == len(out.rounds)
            seen += sum(want)
    assert seen > 0  # the commit pass happened


def test_pass_accounting_option_of_the_modeled_latency():
    profile = load_profile("a6000-qwen7b")
    assert profile.pass_accounting == "project"
    official = LatencyProfile.from_config(
        {"name": "a6000-qwen7b", "drafter_pass_ms": 6.1, "target_ms_per_token": 13.5, "pass_accounting": "official"}
    )
    with pytest.raises(ValueError, match="profile.pass_accounting must be one of project, official, got 'paper'"):
        LatencyProfile.from_config({"name": "x", "pass_accounting": "paper"})
    results = [prompt_result(ROUNDS, 40)]
    summaries = {}
    for name, prof in (("project", profile), ("official", official)):
        config = {
            "profile": {
                k: getattr(prof, k)
                for k in (
                    "name",
                    "drafter_pass_ms",
                    "target_ms_per_token",
                    "verify_ms_per_draft_token",
                    "pass_accounting",
                )
            },
            "drafter": {"name": "fastdllm", "block_size": 32},
        }
        summaries[name] = summarize("fastdllm+failfast", results, config)["modeled"]
    project, off = summaries["project"], summaries["official"]
    assert off["pass_accounting"] == "official" and "official pass accounting" in off["label"]
    proj_passes, off_passes = sum(x.drafter_forward_passes for x in ROUNDS), sum(official_passes(ROUNDS, 40))
    assert (proj_passes, off_passes) == (17, 20)
    assert off["ms"] - project["ms"] == pytest.approx((off_passes - proj_passes) * 6.1)
    # Other drafters keep their counts.
    ar = with_pass_accounting([(ROUNDS, 40)], "official", "ar")
    assert ar == ROUNDS


def test_official_accounting_needs_prompt_lengths():
    config = {
        "profile": {"name": "x", "drafter_pass_ms": 1.0, "target_ms_per_token": 1.0, "pass_accounting": "official"},
        "drafter": {"name": "fastdllm"},
    }
    with pytest.raises(ValueError, match="prompt_tokens"):
        summarize("fastdllm+failfast", [prompt_result(ROUNDS[:1], 0)], config)
