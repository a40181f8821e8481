"""``benchmarks/host_work.py``: a component's host time excludes the components and passes it calls
(a fake clock: no wall time asserted)."""

from __future__ import annotations

import torch

from conftest import load_benchmark


class Ticks:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def test_components_are_timed_exclusive_of_what_they_call():
    host_work = load_benchmark("host_work")
    ticks = Ticks()
    model = torch.nn.Linear(2, 2)
    model.register_forward_hook(lambda *a: setattr(ticks, "ns", ticks.ns + 100))  # a pass: 100 ns

    class Drafter:
        timed_calls = (model,)

        def draft(self, n):
            ticks.ns += 7  # host work around the pass
            model(torch.zeros(1, 2))
            return n

        def commit(self, *args):
            ticks.ns += 3

    class Policy:
        def next_length(self, draft):
            ticks.ns += 5
            return drafter.draft(2)  # nested: the drafter's time is its own

    drafter, policy = Drafter(), Policy()
    tracer = host_work.Exclusive(ticks)
    with tracer.watching(policy, drafter, None):
        policy.next_length(None)
        drafter.commit()
    assert dict(tracer.ns) == {"policy.next_length": 5, "drafter.draft": 7, "pass": 100, "drafter.commit": 3}
    assert "next_length" not in vars(policy) and "draft" not in vars(drafter)  # unwrapped on exit
    assert not model._forward_pre_hooks


def test_passes_on_a_core_run_there_with_the_callers_modes_and_leave_the_process_as_it_was():
    """``--passes-on-core``: every outermost pass ``PassClock`` times runs on the passes' thread, pinned
    to its core (moved when told), with the caller's grad mode, an error raised in the caller; the host
    thread pinned to its core and torch on one thread while entered; the cores, threads and
    ``PassClock`` restored on exit."""
    import os
    import threading

    import pytest

    from specpolicy.core.passes import PassClock
    from specpolicy.core.runtime import Runtime

    host_work = load_benchmark("host_work")
    cores, threads, timed = sorted(os.sched_getaffinity(0)), torch.get_num_threads(), PassClock.__dict__["_timed"]
    seen = []

    class Seen(torch.nn.Linear):  # a pass that notes where it runs (a hook would run in the caller)
        def forward(self, x):
            where = (threading.current_thread().name, os.sched_getaffinity(0), torch.get_num_threads())
            seen.append((*where, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            return super().forward(x)

    model = Seen(2, 2)
    with host_work.passes_on(cores[-1], cores[0]) as worker:
        assert os.sched_getaffinity(0) == {cores[0]} and torch.get_num_threads() == 1
        with PassClock(Runtime(device="cpu")) as clock:
            clock.watch((model,))
            with torch.no_grad():
                assert not model(torch.ones(1, 2)).requires_grad
            with torch.inference_mode():
                assert model(torch.ones(1, 2)).is_inference()
            worker.core = cores[0]
            assert model(torch.ones(1, 2)).requires_grad
            assert clock.take_ms() > 0
        with pytest.raises(ZeroDivisionError):
            worker.run(lambda: 1 / 0, (), {})
        assert worker.jobs == 4  # three passes, then the error's call
    assert seen == [
        ("passes", {cores[-1]}, 1, False, False),
        ("passes", {cores[-1]}, 1, False, True),
        ("passes", {cores[0]}, 1, True, False),
    ]
    assert sorted(os.sched_getaffinity(0)) == cores and torch.get_num_threads() == threads
    assert PassClock.__dict__["_timed"] is timed
    worker.thread.join(5)
    with pytest.raises(RuntimeError, match="stopped"):  # a wrapper kept past the context cannot hang
        worker.run(lambda: None, (), {})


def test_passes_on_a_core_is_refused_off_the_cpu_before_any_model_loads(capsys):
    import pytest

    host_work = load_benchmark("host_work")
    with pytest.raises(SystemExit):
        host_work.main(["--passes-on-core", "0", "--device", "cuda"])
    assert "--passes-on-core: runs on the CPU only (--device cuda)" in capsys.readouterr().err


def test_decoding_with_the_passes_on_another_core_is_decoding():
    """The passes moved to a thread change no token and no round (the AR drafter with FailFast,
    greedy): the same outputs and drafts as the passes on the host's thread."""
    import os

    from conftest import random_prompts, sharpen, tiny_lm
    from specpolicy.core.decoding import generate
    from specpolicy.core.runtime import Runtime
    from specpolicy.drafters.ar import ARDrafter
    from specpolicy.policies.failfast import FailFastPolicy
    from specpolicy.verifiers.hf import HFVerifier

    host_work = load_benchmark("host_work")
    rt = Runtime(device="cpu", dtype="float32", seed=0)
    verifier = HFVerifier(sharpen(tiny_lm(0, layers=2)), rt, frozenset())
    drafter = ARDrafter(sharpen(tiny_lm(0, layers=1)), rt)
    cores = sorted(os.sched_getaffinity(0))

    def decode():
        rounds = []
        for prompt in random_prompts(2):
            out = generate(
                prompt, verifier, rt, max_new_tokens=24, drafter=drafter, policy=FailFastPolicy(n=2, tau=0.3, n_max=8)
            )
            rounds.append((out.output_ids.tolist(), [(r.draft_token_ids, r.accepted_length) for r in out.rounds]))
        return rounds

    alone = decode()
    with host_work.passes_on(cores[-1], cores[0]) as worker:
        moved = decode()
    assert worker.jobs > 0  # the passes were handed over
    assert moved == alone and any(accepted for _, rounds in alone for _, accepted in rounds)


def test_the_after_pass_probe_times_the_work_after_each_pass_after_a_pass_long_wait_and_warm():
    """``after_pass_probe``: a prefill of 150 tokens, then per sample one pass of 9 tokens on that cache
    (rolled back after it) followed by the timed round-like work, then a wait as long as that pass (no
    pass) followed by the work; the warm readings follow neither."""
    import statistics

    import pytest

    from conftest import tiny_lm

    host_work = load_benchmark("host_work")
    model = tiny_lm()
    seen: list[tuple[int, int]] = []  # (tokens in the pass, tokens cached before it)
    forward = model.forward

    def counted(*args, **kwargs):
        seen.append((int(kwargs["input_ids"].shape[1]), kwargs["cache"].get_seq_length()))
        return forward(*args, **kwargs)

    model.forward = counted
    calls, waits = [], []
    work = host_work.round_like_work
    host_work.round_like_work = lambda: calls.append((len(seen), len(waits))) or work()
    try:
        probe = host_work.after_pass_probe(model, torch.device("cpu"), samples=4, wait=waits.append)
    finally:
        host_work.round_like_work = work
    assert seen == [(150, 0)] + [(9, 150)] * 4
    # after each pass, then after a wait with no pass between, alternating; then warm: no pass, no wait
    assert calls[:8] == [(2, 0), (2, 1), (3, 1), (3, 2), (4, 2), (4, 3), (5, 3), (5, 4)]
    assert calls[8:] == [(5, 4)] * 5
    assert all(w > 0 for w in waits)  # each as long as the pass before it
    assert probe["pass_ms"] == pytest.approx(statistics.median(waits) * 1e3)
    assert probe["after_pass_us"] > 0 and probe["after_wait_us"] > 0 and probe["warm_us"] > 0
    assert probe["factor"] == probe["after_pass_us"] / probe["warm_us"]
    assert probe["wait_factor"] == probe["after_wait_us"] / probe["warm_us"]


def test_a_deadline_keeps_the_readings_taken_and_skips_the_rest():
    """``measure_all(deadline=...)``: past the deadline no new repeat starts (the first always runs) and
    no component run; every method keeps its readings and its rounds, its components empty."""
    import time
    from types import SimpleNamespace

    host_work = load_benchmark("host_work")
    decoded: list[str] = []

    def decoder(name):
        def decode(prompt):
            decoded.append(name)
            rounds = [SimpleNamespace(host_ms=0.5, draft_token_ids=(1,), draft_parents=(), accepted_length=1)] * 3
            return SimpleNamespace(rounds=rounds)

        return decode

    bench = SimpleNamespace(
        parts=lambda spec: (None, None),
        wire=lambda spec, policy, drafter: None,
        decoder=lambda spec, drafter, policy, hidden: decoder(spec.name),
        verifier=None,
    )
    specs = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    rows = host_work.measure_all(bench, specs, [0, 1], repeat=3, deadline=time.monotonic() - 1)
    for name in ("a", "b"):
        assert rows[name]["host_ms_per_round_repeats"] == [0.5]  # one repeat of the three
        assert rows[name]["rounds"] == 6 and rows[name]["components"] == {}
        assert rows[name]["traced_host_ms_per_round"] is None
    # per method: the warm-up when built, then one repeat's warm-up and two prompts; no component run
    assert decoded == ["a", "b"] + ["a"] * 3 + ["b"] * 3


def test_warm_split_replays_each_call_on_its_inputs_as_they_were_and_restores_the_function():
    """``warm_split``: a function bound in its module and, imported by name, in another; each method's
    decode calls it through the other. The capture copies each call's inputs before the call writes
    into them, every replay runs on fresh copies (it sees the inputs as the run did), the counts and
    calls per round are the decodes', and the bindings are restored, an exception in a decode
    included; a method that never calls it has a row of no calls; a call with an input no copy
    reproduces is timed in the run and not replayed; decodes that call it a different number of
    times are refused."""
    import sys
    import types
    from types import SimpleNamespace

    import numpy as np
    import pytest

    host_work = load_benchmark("host_work")
    seen: list[int] = []

    def kernel(values, scale=1):  # reads its input, then writes into it (as the compiled kernels do)
        seen.append(int(values[0]))
        values += scale
        return int(values.sum())

    home, user = types.ModuleType("warm_split_home"), types.ModuleType("warm_split_user")
    home.kernel = user.kernel = kernel
    sys.modules.update(warm_split_home=home, warm_split_user=user)
    calls_a = iter(range(1000))

    def rounds(n):
        return [SimpleNamespace(host_ms=0.1, draft_token_ids=(1,), draft_parents=(), accepted_length=1)] * n

    def decoder(name):
        def decode(prompt):
            if name == "a":  # two calls a prompt, on a fresh array whose first value counts the calls
                for _ in range(2):
                    user.kernel(np.full(4, next(calls_a), dtype=np.int64), scale=3)
            if name == "held":  # an input that is neither an array nor a scalar: its copy is not the run's
                user.kernel(np.zeros(2, dtype=np.int64), scale=SimpleNamespace())
            if name == "raises":
                raise KeyError("a decode that fails")
            return SimpleNamespace(rounds=rounds(2))

        return decode

    def odd_kernel(values, scale=1):
        return 0

    bench = SimpleNamespace(
        parts=lambda spec: (None, None),
        wire=lambda spec, policy, drafter: None,
        decoder=lambda spec, drafter, policy, hidden: decoder(spec.name),
    )
    specs = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    try:
        split = host_work.warm_split(bench, specs, [0, 1], ["warm_split_home:kernel"], replays=3)
        assert home.kernel is kernel and user.kernel is kernel  # restored
        row = split["a"]["warm_split_home:kernel"]
        assert split["b"] == {"warm_split_home:kernel": {"calls": 0}}
        assert row["calls"] == 4 and row["calls_per_round"] == 1.0  # 4 calls over 2 prompts x 2 rounds
        assert row["own_share"] == row["warm_us"] / row["in_run_us"] and row["warm_us"] > 0
        assert row["replayed_calls"] == 4 and row["same_rounds"] is True
        # warm-up 0-1, captured 2-5, timed 6-9; then each captured call 4 times (1 untimed + 3) as it saw it
        assert seen[:10] == list(range(10))
        assert seen[10:] == [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4
        with pytest.raises(ValueError, match="--warm-split=warm_split_home:absent"):
            host_work.warm_split(bench, specs, [0], ["warm_split_home:absent"])
        # an input a copy would not reproduce: timed in the run, not replayed, the reason said
        home.kernel = user.kernel = odd_kernel
        held = host_work.warm_split(bench, [SimpleNamespace(name="held")], [0], ["warm_split_home:kernel"])
        row = held["held"]["warm_split_home:kernel"]
        assert row["calls"] == 1 and row["in_run_us"] > 0 and row["warm_us"] is None and row["own_share"] is None
        assert row["not_replayed"] == "an input is a SimpleNamespace"
        home.kernel = user.kernel = kernel
        with pytest.raises(KeyError):
            host_work.warm_split(bench, [SimpleNamespace(name="raises")], [0], ["warm_split_home:kernel"])
        assert home.kernel is kernel and user.kernel is kernel  # restored after the exception too

        def uneven(spec, drafter, policy, hidden):
            def decode(prompt):
                for _ in range(next(counts)):
                    user.kernel(np.zeros(2, dtype=np.int64))
                return SimpleNamespace(rounds=rounds(1))

            return decode

        counts = iter([1, 1, 2])  # the warm-up, the capture, the timing: the last two differ
        bench.decoder = uneven
        with pytest.raises(RuntimeError, match="called 1 and then 2 times"):
            host_work.warm_split(bench, specs[:1], [0], ["warm_split_home:kernel"])
        assert user.kernel is kernel
    finally:
        del sys.modules["warm_split_home"], sys.modules["warm_split_user"]


def test_copied_keeps_layouts_and_refuses_what_a_copy_would_not_reproduce():
    """``_copied``: contiguous arrays (C or Fortran order kept) and tensors (strides kept) copied,
    named tuples rebuilt, scalars as they are; a strided view or another object refused."""
    from collections import namedtuple

    import numpy as np
    import pytest

    host_work = load_benchmark("host_work")
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    pair = namedtuple("pair", "a b")
    copied = host_work._copied((fortran, pair(np.ones(2), 3), [torch.arange(4).reshape(2, 2).t()], None, np.int64(2)))
    assert copied[0].flags.f_contiguous and np.array_equal(copied[0], fortran) and copied[0] is not fortran
    assert isinstance(copied[1], pair) and copied[1].b == 3
    assert copied[2][0].stride() == (1, 2) and copied[4] == 2
    with pytest.raises(host_work.NotReplayable, match="a strided int64 array view of shape"):
        host_work._copied(np.arange(10)[::2])
    with pytest.raises(host_work.NotReplayable, match="a dict"):
        host_work._copied(({"a": 1},))


def test_a_warm_split_target_that_names_no_function_is_refused_in_one_line_before_any_model_loads(capsys, monkeypatch):
    """A bad ``--warm-split`` value: the argument parser's error line names the flag and the value,
    and nothing loads (``peers.Bench`` is never built); whatever the import raises."""
    import pytest

    host_work = load_benchmark("host_work")

    def no_models(*args, **kwargs):
        raise AssertionError("models loaded")

    monkeypatch.setattr(host_work.peers, "Bench", no_models)
    for argv, said in (
        (["--warm-split", "no_colon"], "--warm-split=no_colon: expected module:function"),
        (["--warm-split", ".relative:f"], "--warm-split=.relative:f: expected module:function"),
        (
            ["--warm-split", "specpolicy.__main__:main"],
            "--warm-split=specpolicy.__main__:main: expected module:function",
        ),
        (["--warm-split", "specpolicy.core.path_search:absent"], "--warm-split=specpolicy.core.path_search:absent: "),
        (["--warm-split", "no_such_module_x:f"], "--warm-split=no_such_module_x:f: ModuleNotFoundError"),
        (
            ["--warm-split", "specpolicy.core.path_search:PathSearch"],
            "--warm-split=specpolicy.core.path_search:PathSearch: PathSearch is a type, not a function",
        ),
        (
            ["--warm-split", "math:floor", "--passes-on-core", "0"],
            "--warm-split: times functions on the host's own core",
        ),
        (
            ["--warm-split", "specpolicy.core.compiled_tree:keep_nodes"],
            "--warm-split=specpolicy.core.compiled_tree:keep_nodes: writes through buffer addresses",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            host_work.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"error: {said}" in err, err
