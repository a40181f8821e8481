"""Host time per round (``RoundRecord.host_ms``): the round's time outside the model passes goes to
host work, a pass's time never does (``specpolicy.core.passes``). Clocks are faked: no wall time is
asserted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import random_prompts, sharpen, tiny_lm
from specpolicy.core import passes, runtime as runtime_module
from specpolicy.core.decoding import generate
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.runtime import Timer
from specpolicy.drafters.ar import ARDrafter
from specpolicy.verifiers.hf import HFVerifier

POLICY_MS, PASS_MS = 7.0, 100.0  # fake ms: each policy question, each model pass


class FakeClock:
    """A clock that only the test moves: ``Timer`` reads it instead of ``time.perf_counter``."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s

    def advance(self, ms: float) -> None:
        self.s += ms / 1e3


class SlowPolicy(LengthPolicy):
    """k tokens per round; each question 'takes' POLICY_MS on the fake clock."""

    name = "slow"

    def __init__(self, clock: FakeClock, k: int = 3) -> None:
        self.clock, self.k = clock, k

    def __deepcopy__(self, memo):  # a batched run's copy per request: the same (fake) clock
        return SlowPolicy(self.clock, self.k)

    def next_length(self, draft):
        self.clock.advance(POLICY_MS)
        return self.k if draft.length == 0 else 0


@pytest.fixture
def fake_clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(runtime_module, "time", SimpleNamespace(perf_counter=clock))  # the timers' clock only
    return clock


def _slow_passes(model: torch.nn.Module, clock: FakeClock) -> None:
    """Every forward of ``model`` 'takes' PASS_MS on the fake clock (inside the pass: its instance's
    ``forward``, which the pass clock times)."""
    forward = model.forward

    def slow_forward(*args, **kwargs):
        clock.advance(PASS_MS)
        return forward(*args, **kwargs)

    model.forward = slow_forward


def test_host_ms_is_the_policy_time_not_the_passes(runtime, fake_clock):
    target = sharpen(tiny_lm())
    drafter_model = sharpen(tiny_lm(seed=2))
    _slow_passes(target, fake_clock)
    _slow_passes(drafter_model, fake_clock)
    verifier = HFVerifier(target, runtime, frozenset())
    out = generate(
        random_prompts(1)[0],
        verifier,
        runtime,
        max_new_tokens=12,
        drafter=ARDrafter(drafter_model, runtime),
        policy=SlowPolicy(fake_clock),
    )
    assert out.rounds
    for r in out.rounds:
        questions = 2 if r.speculation_length else 1  # ask 3, draft, then stop; or no room at all
        assert r.host_ms == pytest.approx(questions * POLICY_MS, abs=1e-6), r
        # the passes are in draft_ms / verify_ms, not in host_ms
        assert r.verify_ms == pytest.approx(PASS_MS, abs=1e-6)
        assert r.draft_ms >= r.drafter_forward_passes * PASS_MS


def test_vanilla_rounds_have_no_host_time_when_the_loop_takes_none(runtime, fake_clock):
    target = tiny_lm()
    _slow_passes(target, fake_clock)
    out = generate(random_prompts(1)[0], HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=5)
    assert [r.host_ms for r in out.rounds] == [0.0] * 5
    assert all(r.verify_ms == pytest.approx(PASS_MS) for r in out.rounds)


ACCEPT_MS, WALK_MS = 11.0, 13.0  # fake ms: the verifier's acceptance tensor work; the tree-sampling walk


def _slow(monkeypatch, owner, name: str, ms: float, clock: FakeClock) -> None:
    """``owner.name`` 'takes' ``ms`` on the fake clock before doing its work."""
    original = getattr(owner, name)

    def slow(*args, **kwargs):
        clock.advance(ms)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)


def test_the_verifiers_acceptance_tensor_work_is_part_of_its_pass(runtime, fake_clock, monkeypatch):
    """The argmax and acceptance comparison on the logits (``HFVerifier._accept``) count as the target's
    pass, as the kernels queued behind the forward do on CUDA: vanilla and a chain round keep no host time
    for them."""
    from specpolicy.core import tree as tree_module

    _slow(monkeypatch, tree_module, "greedy_path", ACCEPT_MS, fake_clock)  # inside _accept_tree: a pass
    target = sharpen(tiny_lm())
    _slow_passes(target, fake_clock)
    monkeypatch.setattr(HFVerifier, "_accept", _slowed(HFVerifier._accept, fake_clock))
    out = generate(random_prompts(1)[0], HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=5)
    assert [r.host_ms for r in out.rounds] == [0.0] * 5
    assert all(r.verify_ms == pytest.approx(PASS_MS + ACCEPT_MS) for r in out.rounds)
    drafter_model = sharpen(tiny_lm(seed=2))
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        drafter=ARDrafter(drafter_model, runtime),
        policy=SlowPolicy(fake_clock),
    )
    for r in out.rounds:
        assert r.host_ms == pytest.approx((2 if r.speculation_length else 1) * POLICY_MS, abs=1e-6), r
        assert r.verify_ms == pytest.approx(PASS_MS + ACCEPT_MS)


def _slowed(method, clock: FakeClock):
    def slow(self, *args, **kwargs):
        clock.advance(ACCEPT_MS)
        return method(self, *args, **kwargs)

    return slow


@pytest.mark.parametrize("sampled", [False, True])
def test_a_trees_greedy_path_is_part_of_the_pass_its_sampling_walk_is_host_work(
    runtime, fake_clock, monkeypatch, sampled
):
    """Greedy: the tree's path from the argmax (``_accept_tree``) is the target's pass; sampling: the
    recursive rejection walk (``tree.sample_path``) decides on the host, so it is host work."""
    from specpolicy.core import tree as tree_module
    from specpolicy.core.sampling import SamplingConfig
    from specpolicy.policies.eagle2_tree import Eagle2TreePolicy

    _slow(monkeypatch, tree_module, "greedy_path", ACCEPT_MS, fake_clock)
    _slow(monkeypatch, tree_module, "greedy_nodes", ACCEPT_MS, fake_clock)  # the verifier's host path's
    _slow(monkeypatch, tree_module, "sample_path", WALK_MS, fake_clock)
    target = sharpen(tiny_lm())
    _slow_passes(target, fake_clock)
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        drafter=ARDrafter(sharpen(tiny_lm(seed=2)), runtime),
        policy=Eagle2TreePolicy(depth=3, top_k=2, total_tokens=5),
        sampling=SamplingConfig(temperature=1.0) if sampled else None,
    )
    trees = [r for r in out.rounds if r.draft_parents]
    assert trees
    for r in trees:
        assert r.host_ms == pytest.approx(WALK_MS if sampled else 0.0, abs=1e-6), r
        assert r.verify_ms == pytest.approx(PASS_MS + (WALK_MS if sampled else ACCEPT_MS))  # the verify call's ms


def test_the_drafters_choice_of_tokens_is_part_of_its_pass(runtime, fake_clock, monkeypatch):
    """The softmax's most likely token on a drafter pass's logits (``ARDrafter._choose``) is tensor work
    on the pass's output, as the verifier's argmax is: drafting ms, not host ms."""
    target = sharpen(tiny_lm())
    drafter_model = sharpen(tiny_lm(seed=2))
    _slow_passes(target, fake_clock)
    _slow_passes(drafter_model, fake_clock)
    _slow(monkeypatch, ARDrafter, "_choose_rows", ACCEPT_MS, fake_clock)
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        drafter=ARDrafter(drafter_model, runtime),
        policy=SlowPolicy(fake_clock),
    )
    for r in out.rounds:
        assert r.host_ms == pytest.approx((2 if r.speculation_length else 1) * POLICY_MS, abs=1e-6), r
        assert r.draft_ms == pytest.approx(r.drafter_forward_passes * (PASS_MS + ACCEPT_MS) + r.host_ms), r


def test_easyspecs_layer_parallel_pass_is_a_pass_not_host_work(runtime, fake_clock, monkeypatch):
    """EasySpec's layer-parallel pass runs the model's layers one by one, never its forward
    (``EasySpecDrafter._parallel_pass``): it is named in the drafter's ``timed_calls``, so the loop
    times it as a drafter pass, not as host work."""
    from specpolicy.drafters.easyspec import EasySpecDrafter

    target = sharpen(tiny_lm())
    drafter_model = sharpen(tiny_lm(seed=2, layers=4))
    _slow_passes(target, fake_clock)
    _slow_passes(drafter_model, fake_clock)  # the round's exact first pass (the model's forward)
    _slow(monkeypatch, EasySpecDrafter, "_parallel_pass", PASS_MS, fake_clock)
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        drafter=EasySpecDrafter(drafter_model, runtime, 2),
        policy=SlowPolicy(fake_clock),
    )
    assert any(r.drafter_forward_passes > 1 for r in out.rounds)  # layer-parallel passes ran
    for r in out.rounds:
        assert r.host_ms == pytest.approx((2 if r.speculation_length else 1) * POLICY_MS, abs=1e-6), r
        assert r.draft_ms == pytest.approx(r.drafter_forward_passes * PASS_MS + r.host_ms), r


def test_fastdllms_choice_of_tokens_is_part_of_its_pass(runtime, fake_clock, monkeypatch):
    """Fast-dLLM's choice of tokens from a block pass's logits (``FastDLLMDrafter._choose``) is
    tensor work on the pass's output, as the AR drafter's is: drafting ms, not host ms."""
    from specpolicy.drafters.fastdllm import FastDLLMDrafter
    from test_lossless import _drafter

    target = sharpen(tiny_lm())
    drafter = _drafter("fastdllm", runtime, True)
    _slow_passes(target, fake_clock)
    _slow_passes(drafter.model, fake_clock)
    _slow(monkeypatch, FastDLLMDrafter, "_choose", ACCEPT_MS, fake_clock)
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        drafter=drafter,
        policy=SlowPolicy(fake_clock),
    )
    assert any(r.speculation_length for r in out.rounds)
    for r in out.rounds:
        assert r.host_ms == pytest.approx((2 if r.speculation_length else 1) * POLICY_MS, abs=1e-6), r


HEAD_MS = 17.0  # fake ms: each forward of an acceptance head


@pytest.mark.parametrize("policy_name", ["specdecpp", "failfast"])
def test_an_acceptance_heads_forward_is_a_pass_not_host_work(runtime, fake_clock, policy_name, monkeypatch):
    """SpecDec++'s acceptance head (``policy.acceptance=head``) is a network on the drafter's side: the
    policy names it (``LengthPolicy.timed_calls``), so the loop times it as a pass -- in the round's
    drafting ms, never in its host ms."""
    from specpolicy.models.acceptance_head import AcceptancePredictionHead, FusedAcceptanceHead
    from specpolicy.policies.failfast import FailFastPolicy
    from specpolicy.policies.specdecpp import SpecDecPPPolicy

    target = sharpen(tiny_lm())
    drafter_model = sharpen(tiny_lm(seed=2))
    _slow_passes(target, fake_clock)
    _slow_passes(drafter_model, fake_clock)
    torch.manual_seed(0)
    head = AcceptancePredictionHead(drafter_model.config.hidden_size, 2).eval()
    head_rows: list[int] = []
    fused_probs = FusedAcceptanceHead.acceptance_probs

    def slow_head(self, hidden, confidences=None):  # what a decision runs: the head's fused forward
        head_rows.append(int(hidden.shape[0]))
        fake_clock.advance(HEAD_MS)
        return fused_probs(self, hidden, confidences)

    monkeypatch.setattr(FusedAcceptanceHead, "acceptance_probs", slow_head)
    policy = (
        SpecDecPPPolicy(h=0.5, min_length=1, max_length=6, acceptance="head")
        if policy_name == "specdecpp"
        else FailFastPolicy(n=2, tau=0.3, n_max=6, acceptance="head")
    )
    policy.acceptance_choice.use_head(head)
    step = policy.acceptance_choice.estimate.step
    assert isinstance(step, FusedAcceptanceHead) and policy.timed_calls == ((step, "acceptance_probs"),)
    drafter = ARDrafter(drafter_model, runtime)
    drafter.report_hidden = True
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=16,
        drafter=drafter,
        policy=policy,
    )
    assert head_rows and out.rounds
    assert [r.host_ms for r in out.rounds] == pytest.approx([0.0] * len(out.rounds), abs=1e-6)
    passes = sum(r.drafter_forward_passes for r in out.rounds)
    assert sum(r.draft_ms for r in out.rounds) == pytest.approx(PASS_MS * passes + HEAD_MS * len(head_rows))
    assert "acceptance_probs" not in vars(step)  # the clock left nothing


def test_a_model_free_drafter_is_all_host_time(runtime, fake_clock):
    """Without pass entry points (``pass_entry_points`` is empty) the drafter's work is host work."""
    target = tiny_lm()
    _slow_passes(target, fake_clock)

    class NoPasses(ARDrafter):
        @property
        def timed_calls(self) -> tuple:
            return ()

        @classmethod
        def draft_many(cls, drafters, num_tokens):  # the loop's drafting call, at R = 1 too
            fake_clock.advance(5.0)
            return super().draft_many(drafters, num_tokens)

    drafter_model = tiny_lm(seed=2)
    _slow_passes(drafter_model, fake_clock)  # not an entry point: counted as host work
    out = generate(
        random_prompts(1)[0],
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=6,
        drafter=NoPasses(drafter_model, runtime),
        policy=SlowPolicy(fake_clock, k=2),
    )
    for r in out.rounds:
        expected = (2 if r.speculation_length else 1) * POLICY_MS
        expected += 5.0 * (r.speculation_length > 0) + PASS_MS * r.drafter_forward_passes
        assert r.host_ms == pytest.approx(expected, abs=1e-6), r


def test_pass_clock_counts_outermost_calls_once_and_restores_methods(runtime, fake_clock):
    model = tiny_lm()

    class Holder:
        def step(self, x):
            fake_clock.advance(3.0)
            return model(x)  # a watched module inside a watched method: one pass

    holder = Holder()
    _slow_passes(model, fake_clock)
    with passes.PassClock(runtime) as clock:
        clock.watch([model, (holder, "step")])
        clock.watch([model])  # already watched: not hooked twice
        holder.step(torch.tensor([[1, 2]]))
        model(torch.tensor([[1]]))
        fake_clock.advance(50.0)  # host work between passes
        assert clock.take_ms() == pytest.approx(3.0 + 2 * PASS_MS)
        assert clock.take_ms() == 0.0
    assert "step" not in vars(holder)  # the class's method again
    assert not model._forward_pre_hooks


def test_pass_entry_points_prefer_timed_calls():
    model = tiny_lm()
    assert passes.pass_entry_points(None) == ()

    class Plain:
        pass

    plain = Plain()
    plain.model = model
    assert passes.pass_entry_points(plain) == (model,)
    plain.timed_calls = ((plain, "x"),)
    assert passes.pass_entry_points(plain) == ((plain, "x"),)
    assert passes.pass_entry_points(object()) == ()


def test_timer_reads_the_patched_clock(fake_clock):
    with Timer(cuda=False) as t:
        fake_clock.advance(12.5)
    assert t.ms == pytest.approx(12.5)


def test_a_batched_round_shares_its_host_time_and_copies_leave_unwatched(runtime, fake_clock):
    from specpolicy.core.batching import generate_batch

    target = sharpen(tiny_lm())
    drafter_model = sharpen(tiny_lm(seed=2))
    _slow_passes(target, fake_clock)
    _slow_passes(drafter_model, fake_clock)
    drafter = ARDrafter(drafter_model, runtime)
    out = generate_batch(
        random_prompts(2),
        HFVerifier(target, runtime, frozenset()),
        runtime,
        max_new_tokens=8,
        batch_size=2,
        drafter=drafter,
        policy=SlowPolicy(fake_clock),
    )
    rounds = [r for result in out.results.values() for r in result.rounds]
    assert rounds and all(r.host_ms is not None for r in rounds)
    # each round's host time is its policies' questions (POLICY_MS each), shared by the requests in it:
    # over the run, the host ms add up to every question asked, none of the passes' time
    questions = sum(2 if r.speculation_length else 1 for r in rounds)
    assert sum(r.host_ms for r in rounds) == pytest.approx(questions * POLICY_MS, abs=1e-6)
    assert not drafter_model._forward_pre_hooks and not target._forward_pre_hooks  # the clock left nothing


def test_the_compiled_runtime_watches_only_the_compiled_runners_entry_points(fake_clock):
    """A hook or wrapper a compiled graph could call is never installed under ``runtime.compile``."""
    from specpolicy.core.runtime import Runtime

    model = tiny_lm()

    class Runner:
        compiled = True

        def run(self, x):
            fake_clock.advance(PASS_MS)
            return x

    class Head:
        def logits(self, x):  # called inside a compiled graph in the real runners
            return x

    class Verifier:
        eager_pass_methods = ("accept",)  # called from eager Python only: watched there too

        def accept(self, x):
            fake_clock.advance(ACCEPT_MS)
            return x

        def layout(self, x):
            return x

    runner, head, verifier = Runner(), Head(), Verifier()
    with passes.PassClock(Runtime(device="cpu", compile=True)) as clock:
        clock.watch([model, (head, "logits"), (runner, "run"), (verifier, "accept"), (verifier, "layout")])
        assert not model._forward_pre_hooks and "logits" not in vars(head) and "run" in vars(runner)
        assert "accept" in vars(verifier) and "layout" not in vars(verifier)
        runner.run(1)
        verifier.accept(1)
        assert clock.take_ms() == pytest.approx(PASS_MS + ACCEPT_MS)
    assert "run" not in vars(runner) and "accept" not in vars(verifier)
