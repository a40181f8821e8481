"""The oracle length policy: DP == brute force, match lengths from rounds and by replay, the
oracle is never beaten by a real policy under the same costs, the CLI on a run directory."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.analysis.oracle import (
    CostModel,
    compare,
    main,
    match_lengths_from_rounds,
    policy_ms,
    replay_match_lengths,
    solve,
)
from specpolicy.analysis.results import PromptResult
from specpolicy.core.decoding import generate
from specpolicy.core.types import GenerationResult, RoundRecord
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


def _cost(pass_ms=1.0, verify_base=10.0, verify_slope=0.0, per_token=0.0):
    return CostModel(
        draft_ms_per_pass=pass_ms,
        draft_ms_per_token=per_token,
        passes_base=0.0,
        passes_per_token=1.0,
        verify_ms_base=verify_base,
        verify_ms_per_token=verify_slope,
    )


def test_cheap_drafting_takes_every_matched_token_and_expensive_drafting_none():
    M = [3, 2, 1, 0, 1, 0, 0]
    best = solve(M, _cost(pass_ms=1.0, verify_base=10.0))
    assert best.schedule == ((0, 3), (4, 1), (6, 0))  # 4 + 2 + 1 tokens
    assert best.ms == pytest.approx((3 + 10) + (1 + 10) + 10)
    vanilla = solve(M, _cost(pass_ms=20.0, verify_base=10.0))  # a pass costs more than a target step
    assert vanilla.schedule == tuple((i, 0) for i in range(7)) and vanilla.ms == pytest.approx(70.0)
    capped = solve(M, _cost(), max_length=1)
    assert max(length for _, length in capped.schedule) == 1


def _brute_force(M, cost):
    n, best = len(M), float("inf")

    def go(i, acc):
        nonlocal best
        if i >= n:
            best = min(best, acc)
            return
        for length in range(min(M[i], n - i - 1) + 1):
            go(i + length + 1, acc + cost.round_ms(length))

    go(0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dynamic_program_equals_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    M = [rng.randint(0, n) for _ in range(n)]
    cost = _cost(pass_ms=rng.uniform(0, 6), verify_base=rng.uniform(1, 10), verify_slope=rng.uniform(0, 3))
    assert solve(M, cost).ms == pytest.approx(_brute_force(M, cost))


def _rec(k, a, e=None):
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=a,
        emitted_tokens=a + 1 if e is None else e,
        drafter_forward_passes=k,
        reused_tokens=0,
        draft_ms=float(k),
        verify_ms=10.0 + k,
    )


def test_match_lengths_from_rounds():
    # round 1: 2 of 5 accepted (emits 3), round 2: 3 of 3 (censored, emits 4), round 3: cut at 2 tokens
    M, censored = match_lengths_from_rounds([_rec(5, 2), _rec(3, 3), _rec(4, 4, e=2)], 9)
    assert M == [2, 1, 0, 3, 2, 1, 0, 1, 0]
    assert censored == [False] * 3 + [True] * 4 + [True, True]
    with pytest.raises(ValueError, match="emit 9 tokens but the output has 10"):
        match_lengths_from_rounds([_rec(5, 2), _rec(3, 3), _rec(4, 4, e=2)], 10)


def test_cost_model_fit():
    rounds = [_rec(k, 0) for k in (1, 3, 5, 5)]  # draft_ms = passes = k, verify_ms = 10 + k
    cost = CostModel.fit(rounds, vanilla_verify_ms=[10.0, 10.0])
    assert (cost.draft_ms_per_pass, cost.passes_base, cost.passes_per_token) == pytest.approx((1.0, 0.0, 1.0))
    assert (cost.verify_ms_base, cost.verify_ms_per_token) == pytest.approx((10.0, 1.0))
    assert cost.round_ms(0) == pytest.approx(10.0) and cost.round_ms(4) == pytest.approx(4 + 14)
    free = CostModel.fit([RoundRecord(0, 4, 1, 2, 0, 0, draft_ms=0.4, verify_ms=12.0)], [10.0])  # model-free
    assert free.draft_ms_per_pass == 0.0 and free.draft_ms_per_token == pytest.approx(0.1)


@pytest.fixture(scope="module")
def models():
    """The target and a drafter that agrees with it often but not always (the target with a
    slightly perturbed LM head: accepted lengths 0..4 of 4 on these prompts)."""
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    drafter = copy.deepcopy(target)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        drafter.lm_head.weight.add_(0.02 * torch.randn(drafter.lm_head.weight.shape, generator=g, dtype=torch.float64))
    return target, drafter


def test_replay_agrees_with_recorded_rounds_and_no_policy_beats_the_oracle(runtime, models):
    target, small = models
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    prompt = random_prompts(3)[0]
    runs = {}
    for name, policy in [
        ("static-2", StaticPolicy(2)),
        ("static-6", StaticPolicy(6)),
        ("failfast", FailFastPolicy(n=3, tau=0.3, n_max=12)),
    ]:
        out = generate(prompt, verifier, runtime, max_new_tokens=40, drafter=ARDrafter(small, runtime), policy=policy)
        runs[name] = out
        output_ids = out.output_ids
    M, passes = replay_match_lengths(ARDrafter(small, runtime), prompt, output_ids, max_length=12)
    assert len(M) == len(output_ids) and all(p == list(range(len(p))) for p in passes)  # AR: one pass per token
    assert sum(M) > 0
    for name, out in runs.items():
        rec, censored = match_lengths_from_rounds(out.rounds, out.generated_tokens)
        for i, (m, c) in enumerate(zip(rec, censored)):  # AR greedy drafting is self-consistent
            assert (m <= M[i]) if c else (m == M[i]), (name, i)
    cost = CostModel.fit([r for out in runs.values() for r in out.rounds], [1.0])
    exact = solve(M, cost, 12, passes)
    for name, out in runs.items():
        assert exact.ms <= policy_ms(out.rounds, cost) + 1e-9, name
        report = compare({"p": out}, cost, 12, match=[(M, passes)])
        assert 0.0 < report["fraction_of_oracle"] <= 1.0 + 1e-9
        assert report["per_prompt"][0]["oracle_ms"] == pytest.approx(exact.ms)
        from_rounds = compare({"p": out}, cost, 12)  # censored: never better than the exact oracle
        assert from_rounds["oracle_ms"] >= exact.ms - 1e-9
        assert from_rounds["fraction_of_oracle"] <= 1.0 + 1e-9


def test_replay_works_for_every_drafter(runtime, models):
    target, small = models
    verifier = HFVerifier(target, runtime, frozenset())
    prompt = random_prompts(1)[0]
    output = generate(prompt, verifier, runtime, max_new_tokens=30).output_ids
    dllm = FastDLLMDrafter(
        small, runtime, SimpleNamespace(mask_token_id=VOCAB - 2), block_size=16, small_block_size=4, threshold=0.05
    )
    for drafter in (dllm, SuffixDrafter(runtime, min_match=1)):
        M, passes = replay_match_lengths(drafter, prompt, output, max_length=10)
        assert len(M) == 30 and all(0 <= m <= min(10, 30 - i - 1) for i, m in enumerate(M))
        assert all(len(p) == m + 1 and p == sorted(p) for p, m in zip(passes, M))
        if isinstance(drafter, SuffixDrafter):
            assert all(x == 0 for p in passes for x in p)


def generate_plain(tokens: int, verify_ms: float) -> GenerationResult:
    """A vanilla result of ``tokens`` plain rounds of ``verify_ms`` each."""
    rounds = tuple(RoundRecord(i, 0, 0, 1, 0, 0, draft_ms=0.0, verify_ms=verify_ms) for i in range(tokens))
    return GenerationResult(torch.arange(tokens), rounds, "max_new_tokens", wall_s=0.1, prefill_ms=0.0)


def test_cli_writes_oracle_json(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rounds = tuple(replace(r, index=i) for i, r in enumerate((_rec(5, 2), _rec(3, 3), _rec(4, 1))))
    spec = GenerationResult(torch.arange(9), rounds, "max_new_tokens", wall_s=0.1, prefill_ms=0.0)
    vanilla = generate_plain(9, verify_ms=10.0)
    (run / "results.jsonl").write_text(json.dumps(PromptResult.of("gsm8k/0", 5, spec, vanilla).to_row()) + "\n")
    (run / "summary.json").write_text(json.dumps({"method": "ar+static", "methods": {}}))
    assert main([str(tmp_path)]) == 0
    res = json.loads((run / "oracle.json").read_text())
    assert res["method"] == "ar+static" and 0 < res["fraction_of_oracle"] <= 1
    assert res["per_prompt"][0]["prompt_id"] == "gsm8k/0"
    assert "of the oracle" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 1


def test_the_profile_cost_fraction_is_clock_free_where_the_measured_one_follows_the_load():
    """The same rounds timed on an idle and on a loaded machine (verification 3x slower, drafting
    not): the oracle fraction with measured costs moves, the one with a profile's costs does not,
    and it prices the policy's rounds as the MODELED speedup does (``latency.modeled_speedup``)."""
    from specpolicy.analysis.oracle import analyse
    from specpolicy.core.latency import load_profile, modeled_speedup

    profile = load_profile("a6000-qwen7b")

    def run(load: float):
        rounds = tuple(
            replace(r, index=i, verify_ms=r.verify_ms * load)
            for i, r in enumerate((_rec(5, 2), _rec(3, 3), _rec(4, 1), _rec(0, 0), _rec(6, 6)))
        )
        tokens = sum(r.emitted_tokens for r in rounds)
        spec = GenerationResult(torch.arange(tokens), rounds, "max_new_tokens", wall_s=0.1, prefill_ms=0.0)
        vanilla = generate_plain(tokens, verify_ms=10.0 * load)
        return analyse([PromptResult.of("gsm8k/0", 5, spec, vanilla)], profile=profile), rounds, tokens

    (idle, rounds, tokens), (loaded, _, _) = run(1.0), run(3.0)
    assert idle["fraction_of_oracle"] != pytest.approx(loaded["fraction_of_oracle"])
    assert idle["profile_costs"] == loaded["profile_costs"] and idle["profile_costs"]["profile"] == "a6000-qwen7b"
    assert 0 < idle["profile_costs"]["fraction_of_oracle"] <= 1
    assert idle["profile_costs"]["policy_speedup_modeled"] == pytest.approx(modeled_speedup(rounds, tokens, profile))
