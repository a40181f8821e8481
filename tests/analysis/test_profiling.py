"""``ForwardTimer`` counts every outermost forward pass; ``benchmarks/overhead.py`` accounts for
every pass of a run (counts only: timings are never asserted)."""

from __future__ import annotations

import pytest
import torch

from conftest import load_benchmark, random_prompts, tiny_lm
from specpolicy.analysis.profiling import ForwardTimer, PolicyTimer
from specpolicy.core.decoding import generate
from specpolicy.drafters.ar import ARDrafter
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


def test_forward_timer_counts_outermost_calls_of_each_model(runtime):
    target, small = tiny_lm(seed=0), tiny_lm(seed=1, layers=1)
    verifier = HFVerifier(target, runtime, frozenset())
    prompt = random_prompts(1)[0]
    seen = []
    with ForwardTimer(on_call=seen.append, target=target, drafter=small, again=target) as ft:
        out = generate(
            prompt, verifier, runtime, max_new_tokens=20, drafter=ARDrafter(small, runtime), policy=StaticPolicy(3)
        )
    assert set(ft.calls) == {"target", "drafter"}  # the same module twice is watched once
    assert ft.calls["target"] == len(out.rounds) + 1  # one pass per round + the prompt's prefill
    assert ft.calls["drafter"] == sum(r.drafter_forward_passes for r in out.rounds)
    assert seen.count("target") == ft.calls["target"] and ft.ms["target"] > 0
    calls = dict(ft.calls)
    target(torch.tensor([[1, 2]]))  # hooks removed on exit
    assert ft.calls == calls
    ft.reset()
    assert ft.calls == {"target": 0, "drafter": 0} and ft.ms == {"target": 0.0, "drafter": 0.0}


def test_policy_timer_counts_every_decision_and_update_then_unwraps(runtime):
    target, small = tiny_lm(seed=0), tiny_lm(seed=1, layers=1)
    verifier = HFVerifier(target, runtime, frozenset())
    policy = StaticPolicy(3)
    with PolicyTimer(policy) as pt:
        out = generate(
            random_prompts(1)[0], verifier, runtime, max_new_tokens=20, drafter=ARDrafter(small, runtime), policy=policy
        )
    drafted = sum(1 for r in out.rounds if r.speculation_length)
    assert pt.calls["update"] == len(out.rounds) - 1  # every round but the last (generation ended there)
    assert pt.calls["next_length"] >= 2 * drafted  # static k: ask for k, then stop
    assert pt.total_ms == pt.ms["next_length"] + pt.ms["update"] > 0
    assert "next_length" not in vars(policy) and "update" not in vars(policy)  # the class's methods again
    with PolicyTimer(None) as none:  # vanilla decoding: nothing to time
        pass
    assert none.total_ms == 0.0

    def mine(draft):
        return 0

    policy.next_length = mine  # an instance-level override, and nested timers: each put back on exit
    with PolicyTimer(policy) as outer:
        with PolicyTimer(policy) as inner:
            policy.next_length(None)
        assert vars(policy)["next_length"] is not mine  # the outer timer's wrapper again
        policy.next_length(None)
    assert vars(policy)["next_length"] is mine and "update" not in vars(policy)
    assert (inner.calls["next_length"], outer.calls["next_length"]) == (1, 2)


@pytest.mark.slow  # a benchmark run
def test_overhead_benchmark_accounts_for_every_pass(family, tmp_path):
    module = load_benchmark("overhead")
    fam = family
    result = module.main(
        [
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "12",
            "--target",
            str(fam["target"]),
            "--ar-drafter",
            str(fam["drafter"]),
            "--dllm-drafter",
            str(fam["drafter"]),
            "--dflash-drafter",
            str(fam["dflash"]),
            "--eagle3-drafter",
            str(fam["eagle3"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--warmup",
            "0",
            "--out",
            str(tmp_path / "o.json"),
        ]
    )
    rows = result["methods"]
    assert set(rows) == {"vanilla", *module.DEFAULT_METHODS}
    for name, r in rows.items():
        assert r["target_forward_calls"] == r["rounds"] + 2, name  # + one prefill per prompt
        assert 0 < r["forward_ms"] and r["outside_forward_ms"] == r["wall_ms"] - r["forward_ms"]
        assert r["tokens"] == 24
        assert 0 <= r["policy_ms"] <= r["outside_forward_ms"] and (r["policy_ms"] == 0) == (name == "vanilla")
    assert rows["vanilla"]["drafter_forward_calls"] == 0 and rows["suffix+failfast"]["drafter_forward_calls"] == 0
    assert rows["ar+static-k5"]["drafter_forward_calls"] > 0
    for name in ("dflash+failfast", "eagle3+eagle2-tree-d6k4t16", "dflash+block-tree"):  # every module a pass calls
        assert rows[name]["drafter_forward_ms"] > 0 and rows[name]["drafter_forward_calls"] > 0, name
    assert (tmp_path / "o.json").exists()


def test_only_outermost_calls_count_and_a_name_may_watch_several_modules():
    model = tiny_lm(0)
    head = model.get_output_embeddings()
    with ForwardTimer(target=model, drafter=[head, model.get_input_embeddings()]) as ft:
        model(input_ids=torch.tensor([[1, 2, 3]]))  # the head and embeddings run inside: target only
        head(torch.zeros(1, 32, dtype=torch.float64))  # called directly: the drafter's
        model.get_input_embeddings()(torch.tensor([4]))
    assert (ft.calls["target"], ft.calls["drafter"]) == (1, 2)


def test_a_watched_method_is_timed_as_a_pass_and_restored_on_exit():
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.logits(x)

        def logits(self, x):  # a pass that bypasses forward
            return self.proj(x)

    head = Head()
    x = torch.zeros(1, 4)
    with ForwardTimer(drafter=[head, (head, "logits"), (head, "logits")]) as ft:
        assert "logits" in vars(head)  # wrapped on the instance while entered
        head.logits(x)  # called directly: one pass
        head(x)  # forward calls logits inside: still one pass
    assert ft.calls["drafter"] == 2 and ft.ms["drafter"] > 0
    assert "logits" not in vars(head)  # the class's method again
    head.logits(x)
    assert ft.calls["drafter"] == 2
