#!/usr/bin/env python
"""Host work per round, by method and by component: what each round spends outside the drafter's and
the target's model passes (``RoundRecord.host_ms``, ``specpolicy.core.passes``), and where.

    python benchmarks/host_work.py --num-prompts 3 --max-new-tokens 64 --out host.json
    python benchmarks/host_work.py --method dart+dart-tree=drafter=dart,policy=dart-tree --repeat 3
    python benchmarks/host_work.py --neighbours --repeat 3 --passes-on-core 1 --paired-control

Methods are the peers benchmark's (``benchmarks/peers.py``: ``conf/method/`` presets by name, or
``NAME=drafter=D,policy=P,...`` one-offs); without ``--method`` every row of the peers table
(``peers.DEFAULT_METHODS``) and of the neighbours table (the ``--method`` list of
``benchmarks/results/neighbours-gsm8k-30x256.json``). Each method decodes the prompts ``--repeat``
times, the methods interleaved (each repeat runs every method in turn, in alternating order, each
after an untimed decode of the first prompt: ``measure_all``), so that the machine's drift over a
run of minutes reaches them all alike; per method:

* ``host_probe_us``: ``host_probe_us`` (a fixed piece of host work, timed before each of the
  method's readings): the machine's host speed while the method was read; the result's
  ``host_probe_us`` holds its median and range over the run, for comparing runs taken at other times;
* ``host_ms_per_round``: the loop's own figure (mean ``RoundRecord.host_ms``), from runs WITHOUT the
  component timers, the least over the repeats (a loaded machine only adds to it), and its share of
  the ``--profile`` target step (13.5 ms for ``a6000-qwen7b``);
* ``components``: exclusive host ms per round of each component, from one more run with timers
  (``time.perf_counter_ns``, a stack: a component's time excludes the components and passes it
  calls): ``policy.next_length``, ``policy.update``, ``policy.draft_tree`` (a tree policy's own
  search: DART's, EAGLE-2's, the block tree, Falcon's), ``path_search`` (DiffuSpec's CPS,
  ``PathSearch.search`` and ``search_np``), ``ngram`` (n-gram lookups: ``NGramModel``, the suffix drafter's),
  ``drafter.draft`` (``draft`` and the loop's ``draft_many``) / ``drafter.alternatives`` /
  ``drafter.commit`` (the drafter's host work around its passes), ``verify`` (the target's host work around its pass: a tree's mask and positions,
  the tree-sampling walk, cache bookkeeping; the argmax and acceptance comparison on its logits are
  part of the pass), and ``loop`` (the rest of ``host_ms``: the loop's bookkeeping, the timers' own cost included).

The machine's load inflates every figure alike: compare components with each other, and time
absolute figures alone (``--repeat`` keeps the least).

On this CPU every model pass runs on the core the host work runs on and streams the weights through
that core's private caches (L1, L2), so the host work after a pass finds them refilled with weights;
on a GPU the passes run on the device. ``--passes-on-core C`` separates the two: the host (this
thread) is pinned to ``--host-core`` and every outermost pass (``PassClock``'s entry points) runs on
a thread pinned to core ``C``, torch on one thread, the caller waiting (the handoff is part of the
pass, not of host work). ``C`` equal to ``--host-core`` is the control: the same handoff, the passes
on the host's core. With ``--paired-control`` each repeat decodes the prompts twice, back to back,
once with the passes on core ``C`` and once with the same thread moved to the host's core, in
alternating order; ``host_ms_per_round_control`` / ``control_repeats`` hold the control's readings
and ``same_rounds`` whether both decoded the same rounds (a pair taken minutes apart on a shared
machine drifts more than it differs).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import peers  # noqa: E402
import torch  # noqa: E402

from specpolicy.core import compiled_tree  # noqa: E402
from specpolicy.core.latency import load_profile  # noqa: E402
from specpolicy.core.passes import PassClock, pass_entry_points  # noqa: E402
from specpolicy.core.path_search import PathSearch  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402
from specpolicy.models.ngram import NGramModel  # noqa: E402

NEIGHBOURS = Path(__file__).resolve().parent / "results" / "neighbours-gsm8k-30x256.json"
#: Host components: (name, (owner, method) where owner is "policy", "drafter", "verifier", "drafter class"
#: (the loop's drafting call, ``type(drafter).draft_many``) or a class).
COMPONENTS: tuple[tuple[str, Any, str], ...] = (
    ("policy.next_length", "policy", "next_length"),
    ("policy.update", "policy", "update"),
    ("policy.draft_tree", "policy", "draft_tree"),
    ("path_search", PathSearch, "search"),
    ("path_search", PathSearch, "search_np"),
    ("ngram", NGramModel, "trie_probs_np"),
    ("ngram", NGramModel, "trie_probs"),
    ("ngram", NGramModel, "trie_tables"),
    ("ngram", NGramModel, "log_probs"),
    ("ngram", "drafter", "lookup"),
    ("drafter.draft", "drafter class", "draft_many"),
    ("drafter.draft", "drafter", "draft"),
    ("drafter.alternatives", "drafter", "alternatives"),
    ("drafter.commit", "drafter", "commit"),
    ("verify", "verifier", "verify"),
)


class Exclusive:
    """Exclusive time of nested named calls (``time.perf_counter_ns``): a call's time less the time of
    the timed calls it makes. Passes are timed too (``pass``), so no component holds a pass."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.clock = clock
        self.ns: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [name, start ns, children's ns]

    def open(self, name: str) -> None:
        """Open a timed call of ``name`` (closed by ``_close``)."""
        self._stack.append([name, self.clock(), 0])

    def wrap(self, name: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            self._stack.append([name, self.clock(), 0])
            try:
                return method(*args, **kwargs)
            finally:
                frame = self._stack.pop()
                elapsed = self.clock() - frame[1]
                self.ns[frame[0]] += elapsed - frame[2]
                if self._stack:
                    self._stack[-1][2] += elapsed

        return timed

    @contextmanager
    def watching(self, policy: Any, drafter: Any, verifier: Any) -> Iterator[Exclusive]:
        """Wrap the components of ``COMPONENTS`` and the passes (``pass_entry_points`` of the drafter,
        the verifier and the policy: an acceptance head) while entered."""
        owners = {"policy": policy, "drafter": drafter, "verifier": verifier}
        owners["drafter class"] = None if drafter is None else type(drafter)
        undo: list[Callable[[], None]] = []
        own = (*pass_entry_points(drafter), *pass_entry_points(verifier), *pass_entry_points(policy))
        members = [("pass", m) for m in own]
        members += [(name, (owners.get(owner, owner), method)) for name, owner, method in COMPONENTS]
        hooked: set = set()
        for name, member in members:
            if member is None or id(member) in hooked:
                continue
            if hasattr(member, "register_forward_pre_hook"):  # a module: a pass
                hooked.add(id(member))
                pre = member.register_forward_pre_hook(lambda mod, args: self._stack.append(["pass", self.clock(), 0]))
                post = member.register_forward_hook(lambda mod, args, out: self._close(), always_call=True)
                undo += [pre.remove, post.remove]
                continue
            obj, method = member
            if obj is None or not hasattr(obj, method) or (id(obj), method) in hooked:
                continue
            hooked.add((id(obj), method))
            if isinstance(obj, type) and isinstance(inspect.getattr_static(obj, method), classmethod):
                # a classmethod (the loop calls ``type(drafter).draft_many``): wrapped bound to this class
                held = obj.__dict__.get(method)
                setattr(obj, method, staticmethod(self.wrap(name, getattr(obj, method))))
                undo.append(lambda o=obj, m=method, h=held: delattr(o, m) if h is None else setattr(o, m, h))
            elif isinstance(obj, type):  # a class's method: every instance's calls
                original = obj.__dict__[method]
                setattr(obj, method, self.wrap(name, original))
                undo.append(lambda o=obj, m=method, f=original: setattr(o, m, f))
            else:
                held = vars(obj).get(method)
                setattr(obj, method, self.wrap(name, getattr(obj, method)))
                undo.append(lambda o=obj, m=method, h=held: vars(o).pop(m, None) if h is None else setattr(o, m, h))
        try:
            yield self
        finally:
            for step in reversed(undo):
                step()

    def _close(self) -> None:
        frame = self._stack.pop()
        elapsed = self.clock() - frame[1]
        self.ns[frame[0]] += elapsed - frame[2]
        if self._stack:
            self._stack[-1][2] += elapsed


#: the ``Exclusive`` tracer of the run being traced (``measure_all``), for ``passes_on``'s handoffs
TRACING: list[Exclusive] = []


class PassThread:
    """Runs each call it is given on one thread pinned to ``core``, the caller waiting for it (its
    grad and inference modes carried over: torch keeps them per thread); an exception re-raised in
    the caller. ``jobs`` counts the calls run.

    Raises:
        RuntimeError: from ``run`` once the thread has stopped (``stop``, or it died).
    """

    def __init__(self, core: int) -> None:
        self._go, self._done = threading.Event(), threading.Event()
        self._job: tuple = ()
        self._result: tuple = ()
        self.core, self._on, self.jobs = core, -1, 0
        self.thread = threading.Thread(target=self._serve, daemon=True, name="passes")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if not self._job:  # ``stop``
                return
            try:
                if self._on != self.core:  # moved (``core`` set): this thread only (Linux: pid 0 is the caller)
                    os.sched_setaffinity(0, {self.core})
                    self._on = self.core
                method, args, kwargs, grad, inference = self._job
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    self._result = (True, method(*args, **kwargs))
            except BaseException as error:  # noqa: BLE001 -- re-raised in the caller
                self._result = (False, error)
            self._done.set()

    def run(self, method: Callable, args: tuple, kwargs: dict) -> Any:
        if threading.current_thread() is self.thread:  # a pass inside a pass: already here
            return method(*args, **kwargs)
        if not self.thread.is_alive():
            raise RuntimeError("the passes' thread has stopped")
        self._job = (method, args, kwargs, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        self._done.clear()
        self._go.set()
        while not self._done.wait(1.0):
            if not self.thread.is_alive():
                raise RuntimeError("the passes' thread died during a pass")
        self.jobs += 1
        ok, value = self._result
        self._result = ()
        if ok:
            return value
        raise value

    def stop(self) -> None:
        """End the thread (after the call it runs, if any)."""
        self._job = ()
        self._go.set()


@contextmanager
def passes_on(core: int, host_core: int) -> Iterator[PassThread]:
    """While entered: this thread (the host work) pinned to ``host_core``, torch on one thread, and
    every outermost pass the loop's ``PassClock`` times on the CPU run on a ``PassThread`` pinned to
    ``core`` (yielded: its ``core`` may be changed between rounds). On exit the process is as it
    was: its cores, torch's threads, ``PassClock``. CPU runs only (CUDA passes are timed by events)."""
    cores, threads, timed = os.sched_getaffinity(0), torch.get_num_threads(), PassClock.__dict__["_timed"]
    worker: PassThread | None = None

    def _timed(self: PassClock, method: Callable) -> Callable:
        if self._cuda:
            return timed(self, method)
        clock = time.perf_counter  # ``PassClock``'s CPU clock

        def timed_on_core(*args, **kwargs):
            if self._depth:  # a nested entry point: already on the passes' thread
                return method(*args, **kwargs)
            self._depth = 1
            tracer = TRACING[0] if TRACING else None  # the handoff is the pass's, for the components too
            if tracer is not None:
                tracer.open("pass")
            started = clock()
            try:
                return cast(PassThread, worker).run(method, args, kwargs)
            finally:
                self._cpu_s += clock() - started
                self._depth = 0
                if tracer is not None:
                    tracer._close()

        return timed_on_core

    try:
        os.sched_setaffinity(0, {host_core})
        torch.set_num_threads(1)
        worker = PassThread(core)
        PassClock._timed = _timed  # type: ignore[method-assign]
        yield worker
    finally:
        PassClock._timed = timed  # type: ignore[method-assign]
        if worker is not None:
            worker.stop()
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)


def neighbours_methods() -> list[str]:
    """The neighbours table's ``--method`` list (its results file's settings)."""
    if not NEIGHBOURS.exists():
        return []
    return list(json.loads(NEIGHBOURS.read_text())["settings"].get("method") or [])


#: the host probe's fixed work: a 1 MB array (numpy's pass over it) and two small tensors (torch's dispatch)
_PROBE_ARRAY = np.linspace(0.0, 1.0, 131072)
_PROBE_TENSORS = (torch.zeros(16), torch.ones(16))


def host_probe_us(repeat: int = 3) -> float:
    """The machine's host speed at this moment: the least of ``repeat`` timings (microseconds) of one
    fixed piece of host work of the kinds a round does -- Python bookkeeping (2,000 dict and list
    operations), 40 small torch ops on the CPU and a numpy pass over 1 MB. Taken before each method's
    readings (``measure_all``): the machine's host speed while they were taken, so that runs taken
    at different times can be compared."""
    best = float("inf")
    a, b = _PROBE_TENSORS
    for _ in range(repeat):
        start = time.perf_counter()
        table: dict[int, list[int]] = {}
        for i in range(500):
            table.setdefault(i % 31, []).append(i)
            table[i % 31][-1] += 1
        for _ in range(20):
            torch.add(a, b)
            a.sum()
        float(_PROBE_ARRAY.sum())
        best = min(best, time.perf_counter() - start)
    return best * 1e6


#: ``round_like_work``'s inputs: a round's draft tokens as a CPU tensor, and a preallocated host buffer
_ROUND_TOKENS = torch.arange(8)
_ROUND_BUFFER = np.zeros(16, dtype=np.int64)


def round_like_work() -> int:
    """A fixed piece of host work of the kinds a round does between its passes, on small data: the loop's
    bookkeeping (100 dict and list operations), the host read of a draft's tokens (``numpy`` view, a
    copy into a buffer, ``torch.from_numpy``, ``tolist``), a fresh numpy array and 4 small torch ops.
    Returns a checksum (so nothing is optimised away)."""
    table: dict[int, list[int]] = {}
    for i in range(100):
        table.setdefault(i % 7, []).append(i)
    _ROUND_BUFFER[:8] = _ROUND_TOKENS.numpy()
    tokens = torch.from_numpy(_ROUND_BUFFER).tolist()
    fresh = np.empty(8, dtype=np.float32)
    fresh[:] = 1.0
    joined = torch.cat([_ROUND_TOKENS, _ROUND_TOKENS])[3:9]
    return len(table) + tokens[3] + int(fresh.shape[0]) + int(joined.sum())


def after_pass_probe(
    model: torch.nn.Module,
    device: torch.device,
    samples: int = 15,
    wait: Callable[[float], None] = time.sleep,
) -> dict[str, float]:
    """How a pass of the target slows the host work that follows it: ``round_like_work`` timed right
    after a pass of ``model`` (9 tokens on a cache of 150, as a round's verification; on CUDA followed
    by the sync a round makes before it reads the outcome), right after the host then waited as long as
    that pass took with no pass (``wait(seconds)``, ``time.sleep``: the host asleep), the two
    alternating sample by sample, and back to back with itself (warm).

    The second reading tells time alone from the pass: on this shared CPU the host's caches also lose
    its code and data while it merely sleeps (its core idle, the machine's other work); on this CPU a
    pass also streams the target's weights through them. A host that spins while a GPU works (CUDA's
    default sync on a machine with spare cores) may lose less.

    Returns:
        ``{"after_pass_us": median over ``samples`` passes, "after_wait_us": median over as many waits,
        "warm_us": median of as many back-to-back runs, "factor": after_pass_us / warm_us,
        "wait_factor": after_wait_us / warm_us, "pass_ms": the median pass's wall-clock ms, "samples":
        samples}`` (microseconds unless named).
    """
    from specpolicy.core.cache import buffered_cache, crop_cache

    ids = torch.arange(159, device=device)[None] % int(model.config.vocab_size)
    cache = buffered_cache(160)
    after, waited, warm, passes = [], [], [], []
    with torch.no_grad():
        model(input_ids=ids[:, :150], cache=cache, use_cache=True)
        for _ in range(samples):  # a pass then the work; a wait as long as that pass then the work
            begun = time.perf_counter()
            model(input_ids=ids[:, 150:], cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            round_like_work()
            after.append(time.perf_counter() - start)
            passes.append(start - begun)
            crop_cache(cache, 150)  # the pass's 9 positions dropped
            wait(passes[-1])
            start = time.perf_counter()
            round_like_work()
            waited.append(time.perf_counter() - start)
    pass_s = statistics.median(passes)
    round_like_work()
    for _ in range(samples):
        start = time.perf_counter()
        round_like_work()
        warm.append(time.perf_counter() - start)
    after_us, wait_us = statistics.median(after) * 1e6, statistics.median(waited) * 1e6
    warm_us = statistics.median(warm) * 1e6
    return {
        "after_pass_us": after_us,
        "after_wait_us": wait_us,
        "warm_us": warm_us,
        "factor": after_us / warm_us,
        "wait_factor": wait_us / warm_us,
        "pass_ms": pass_s * 1e3,
        "samples": samples,
    }


def measure_all(
    bench: peers.Bench,
    specs: list[peers.MethodSpec],
    ids: list,
    repeat: int,
    clock: Callable[[], int] = time.perf_counter_ns,
    control: tuple[PassThread, int] | None = None,
    log: Callable[[str], None] = lambda line: None,
    deadline: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Every method's host ms per round (least over ``repeat`` untimed passes over ``ids``) and its
    components (one timed pass), the methods INTERLEAVED: each repeat decodes ``ids`` with every
    method in turn (forward on even repeats, backward on odd ones), so the machine's drift over the
    run reaches every method alike rather than the methods measured in its worst minutes; each
    method's readings, and its run with the component timers, follow an untimed decode of the first
    prompt, so they find its code and data as a run of that method keeps them, not as the previous
    method left them; ``host_probe_us`` is taken before that decode (its own memory traffic would
    cool it). The run with the timers adds their cost, so its ``traced_host_ms_per_round`` should
    not fall below ``host_ms_per_round``: a check of the readings' conditions.
    ``control``: ``(the passes' thread, the host's core)``: each repeat also decodes ``ids`` with the
    passes on the host's core (``host_ms_per_round_control``), back to back with the reading it pairs."""
    decoders: dict[str, Callable] = {}
    parts: dict[str, tuple[Any, Any]] = {}
    for spec in specs:
        drafter, policy = bench.parts(spec)
        hidden = bench.wire(spec, policy, drafter)  # policy.acceptance=head: its head, the drafter's hidden states
        decode = bench.decoder(spec, drafter, policy, hidden)
        decode(ids[0])  # warm-up, untimed
        decoders[spec.name], parts[spec.name] = decode, (drafter, policy)
    # the models' and tables' objects out of the garbage collector's generations (vLLM does the same
    # after start-up): a full collection over ~500k objects costs 30-150 ms, landing in whatever
    # round triggers it; the rounds' own short-lived objects are still collected
    gc.collect()
    gc.freeze()  # undone at the end (a later call's models must be collectable)
    per_round: dict[str, list[float]] = defaultdict(list)
    per_round_control: dict[str, list[float]] = defaultdict(list)
    signatures: dict[str, set] = defaultdict(set)  # each reading's rounds (drafts and outcomes)
    counts: dict[str, int] = {}  # rounds a reading decoded
    probes: dict[str, list[float]] = defaultdict(list)  # ``host_probe_us`` before each method's readings
    try:
        for i in range(repeat):
            if i and deadline is not None and time.monotonic() > deadline:
                log(f"deadline: {i} of {repeat} repeats read")
                break
            log(f"repeat {i + 1}/{repeat}")
            for name in decoders if i % 2 == 0 else reversed(decoders):
                probes[name].append(host_probe_us())  # first: its own memory traffic would cool the warm-up's caches
                decoders[name](ids[0])  # untimed: the method's code and data warm again, as a run of it keeps them
                readings = [False, True] if control is not None else [False]
                for on_host_core in readings if i % 2 == 0 else readings[::-1]:  # the control second, then first
                    rounds = _decoded(ids, decoders[name], control if on_host_core else None)
                    (per_round_control if on_host_core else per_round)[name].append(
                        sum(r.host_ms for r in rounds) / len(rounds)
                    )
                    signatures[name].add(tuple((r.draft_token_ids, r.draft_parents, r.accepted_length) for r in rounds))
                    counts[name] = len(rounds)
        rows = {}
        for name, decode in decoders.items():
            drafter, policy = parts[name]
            components: dict[str, float] = {}
            n, traced_host = counts[name], None  # past the deadline: the readings kept, no components
            if deadline is None or time.monotonic() <= deadline:
                decode(ids[0])  # untimed, as before every reading: the timed run finds the method warm too
                tracer = Exclusive(clock)
                with tracer.watching(policy, drafter, bench.verifier):
                    TRACING.append(tracer)
                    try:
                        rounds = _decoded(ids, decode, None)
                    finally:
                        TRACING.clear()
                n = len(rounds)
                components = {part: ns / 1e6 / n for part, ns in sorted(tracer.ns.items()) if part != "pass"}
                traced_host = sum(r.host_ms for r in rounds) / n
                components["loop"] = traced_host - sum(components.values())
            rows[name] = {
                "host_ms_per_round": min(per_round[name]),
                "host_ms_per_round_repeats": per_round[name],
                "rounds": n,
                "traced_host_ms_per_round": traced_host,
                "host_probe_us": probes[name],
                **(
                    {
                        "host_ms_per_round_control": min(per_round_control[name]),
                        "control_repeats": per_round_control[name],
                        # the readings decoded the same rounds (False: rounds that follow measured costs, goodput)
                        "same_rounds": len(signatures[name]) == 1,
                    }
                    if control is not None
                    else {}
                ),
                "components": components,
            }
    finally:
        gc.unfreeze()
    return rows


#: host calls that write through buffer addresses their inputs hold (the KV cache's rows moved in
#: place, ``specpolicy.core.compiled_tree.keep_nodes``; its Python entry ``cache.keep_nodes`` passes
#: the cache's layers too, which ``_copied`` refuses): a replay after the run could write into memory
#: since freed. Compared by identity, whatever module names them.
ADDRESSED = (compiled_tree.keep_nodes,)
#: ``warm_split``: at most this many calls of a function captured per method (their inputs held in memory)
MAX_CAPTURED = 400


def resolve_function(target: str) -> tuple[Callable, list[tuple[Any, str]]]:
    """``module:name`` -> the function (a Python function or a numba dispatcher) and every ``(loaded
    module, name)`` that binds it (the module it lives in and those that imported it by name), for
    rebinding.

    Raises:
        ValueError: ``target`` is not ``module:name``, names no function of an importable module, or
            names one of ``ADDRESSED``.
    """
    import importlib

    module_name, _, name = target.partition(":")
    if not module_name or not name or module_name.startswith(".") or module_name.endswith("__main__"):
        raise ValueError(f"--warm-split={target}: expected module:function (e.g. specpolicy.policies.dart_tree:_run)")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except Exception as exc:  # noqa: BLE001 -- any failure to import or find it: the user's value, in one line
        raise ValueError(f"--warm-split={target}: {type(exc).__name__}: {exc}") from None
    if not (inspect.isfunction(function) or hasattr(function, "py_func")):  # a function or a numba dispatcher
        raise ValueError(f"--warm-split={target}: {name} is a {type(function).__name__}, not a function")
    if any(function is addressed for addressed in ADDRESSED):
        raise ValueError(
            f"--warm-split={target}: writes through buffer addresses held in its inputs, which a replay "
            "after the run may find freed; not replayable (ADDRESSED)"
        )
    bound = [(module, name) for module in list(sys.modules.values()) if getattr(module, name, None) is function]
    return function, bound


@contextmanager
def _rebound(targets: dict[str, tuple[Callable, list]], make: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Each target's function replaced by ``make(target, function)`` wherever it is bound, while entered."""
    undo = []
    try:
        for target, (function, bound) in targets.items():
            wrapper = make(target, function)
            for module, attr in bound:
                setattr(module, attr, wrapper)
                undo.append((module, attr, function))
        yield
    finally:
        for module, attr, function in undo:
            setattr(module, attr, function)


class NotReplayable(Exception):
    """A captured call's input that a copy would not reproduce (``_copied``)."""


def _copied(value: Any) -> Any:
    """``value`` with its numpy arrays (contiguous ones, their layout kept) and tensors (their strides
    kept) copied, tuples, named tuples and lists through, scalars, strings and None as they are: a
    call's inputs as they were before it wrote into them.

    Raises:
        NotReplayable: for a strided array view (its copy is laid out otherwise), and for any other
            object (a cache, a dict: a replay would change the run's own)."""
    if isinstance(value, np.ndarray):
        if not (value.flags.c_contiguous or value.flags.f_contiguous):
            raise NotReplayable(f"a strided {value.dtype} array view of shape {value.shape}")
        return value.copy(order="K")
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_copied(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return value
    raise NotReplayable(f"a {type(value).__name__}")


def _copied_call(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A call's positional and keyword arguments, ``_copied`` (raises as it does)."""
    return _copied(args), {key: _copied(value) for key, value in kwargs.items()}


#: ``--warm-split``: how many times each captured call is replayed warm
WARM_REPLAYS = 20


def warm_split(
    bench: peers.Bench, specs: list[peers.MethodSpec], ids: list, targets: list[str], replays: int = WARM_REPLAYS
) -> dict[str, dict[str, dict[str, Any]]]:
    """How much of a host function's time in the run is its own work: per method and per function
    (``module:name``, called from Python: a compiled kernel's entry, a policy's helper), its mean time
    per call in the run and replayed warm.

    Each method decodes ``ids`` three times: an untimed warm-up; a decode that copies each call's
    inputs (``_copied``: numpy arrays, tensors, scalars; at most ``MAX_CAPTURED`` calls) before the
    call; a decode that times each call in place (``time.perf_counter_ns``, nothing else added around
    it: the in-run reading), the garbage collector off (a collection lands in whatever call triggers
    it). The same prompts give the same calls: ``RuntimeError`` if their counts differ; ``same_rounds``
    says whether the two decodes' rounds (drafts and outcomes) were the same. Then each captured call
    is run ``replays + 1`` times back to back on fresh copies of its inputs (copied outside the timing;
    the first untimed), the collector off: the warm reading, the mean of its replays, averaged over the
    calls. Warm is a best case -- the call's code, its inputs (just copied) and the branch predictors
    primed -- so ``own_share`` bounds the call's own work from below.

    Returns:
        ``{method: {function: {"calls": per decode, "calls_per_round", "in_run_us", "warm_us",
        "own_share": warm_us / in_run_us, "in_run_median_us", "warm_median_us", "same_rounds"}}}``
        (microseconds a call; the medians over the calls: the in-run ones' and the calls' warm
        means'); a function the method calls with an input ``_copied`` cannot copy: its in-run
        readings, ``warm_us`` / ``own_share`` None and ``not_replayed`` saying why; one it never calls:
        ``{"calls": 0}``.

    Raises:
        ValueError: a target that names no function (``resolve_function``).
        RuntimeError: the two decodes made different numbers of calls.
    """
    resolved = {t: resolve_function(t) for t in dict.fromkeys(targets)}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for spec in specs:
        drafter, policy = bench.parts(spec)
        decode = bench.decoder(spec, drafter, policy, bench.wire(spec, policy, drafter))
        decode(ids[0])  # untimed: compiled kernels loaded, the method's code and data warm
        resolved = {t: resolve_function(t) for t in resolved}  # its modules, imported by now, bound too
        captured: dict[str, list] = defaultdict(list)
        refused: dict[str, str] = {}
        counted: dict[str, int] = defaultdict(int)
        timed: dict[str, list[int]] = defaultdict(list)

        def capture(target: str, function: Callable) -> Callable:
            def call(*args, **kwargs):
                counted[target] += 1
                if target not in refused and len(captured[target]) < MAX_CAPTURED:
                    try:
                        captured[target].append(_copied_call(args, kwargs))
                    except NotReplayable as exc:
                        refused[target] = f"an input is {exc}"
                return function(*args, **kwargs)

            return call

        def time_it(target: str, function: Callable) -> Callable:
            clock, seen = time.perf_counter_ns, timed[target]

            def call(*args, **kwargs):
                start = clock()
                try:
                    return function(*args, **kwargs)
                finally:
                    seen.append(clock() - start)

            return call

        def signature(rounds: list) -> tuple:
            return tuple((r.draft_token_ids, r.draft_parents, r.accepted_length) for r in rounds)

        with _rebound(resolved, capture):
            first = signature([r for prompt in ids for r in decode(prompt).rounds])
        gc.collect()
        with _rebound(resolved, time_it), _collector_off():
            rounds = [r for prompt in ids for r in decode(prompt).rounds]
        rows: dict[str, dict[str, Any]] = {}
        for target, (function, _) in resolved.items():
            calls, seen = captured[target], timed[target]
            if counted[target] != len(seen):
                raise RuntimeError(
                    f"{spec.name}: {target} was called {counted[target]} and then {len(seen)} times "
                    "decoding the same prompts"
                )
            if not seen:
                rows[target] = {"calls": 0}
                continue
            row: dict[str, Any] = {
                "calls": len(seen),
                "calls_per_round": len(seen) / len(rounds),
                "in_run_us": statistics.mean(seen) / 1e3,
                "in_run_median_us": statistics.median(seen) / 1e3,
                "same_rounds": signature(rounds) == first,
            }
            if target in refused:
                rows[target] = {**row, "warm_us": None, "own_share": None, "not_replayed": refused[target]}
                continue
            warm = []
            with _collector_off():
                for args, kwargs in calls:
                    readings = []
                    for _ in range(replays + 1):  # the first untimed: the call's code and inputs warm
                        fresh_args, fresh_kwargs = _copied_call(args, kwargs)
                        start = time.perf_counter_ns()
                        function(*fresh_args, **fresh_kwargs)
                        readings.append(time.perf_counter_ns() - start)
                    warm.append(statistics.mean(readings[1:]))
            warm_us = statistics.mean(warm) / 1e3
            rows[target] = {
                **row,
                "warm_us": warm_us,
                "warm_median_us": statistics.median(warm) / 1e3,
                "own_share": warm_us / row["in_run_us"],
                "replayed_calls": len(calls),
            }
        out[spec.name] = rows
    return out


@contextmanager
def _collector_off() -> Iterator[None]:
    """The garbage collector disabled while entered (re-enabled as it was)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _decoded(ids: list, decode: Callable, control: tuple[PassThread, int] | None) -> list:
    """Every round of decoding ``ids``; with ``control`` ``(the passes' thread, the host's core)``,
    the passes moved to the host's core for it (and back, whatever happens)."""
    if control is None:
        return [r for prompt in ids for r in decode(prompt).rounds]
    worker, core = control[0], control[0].core
    worker.core = control[1]
    try:
        return [r for prompt in ids for r in decode(prompt).rounds]
    finally:
        worker.core = core


def print_table(rows: dict[str, dict[str, Any]], step_ms: float, profile: str, goal_ms: float) -> None:
    from rich.console import Console
    from rich.table import Table

    names = sorted({c for r in rows.values() for c in r["components"]})
    table = Table(title=f"host ms per round (outside model passes); share of {profile}'s {step_ms} ms target step")
    paired = all("host_ms_per_round_control" in r for r in rows.values())
    control = ("passes on the host's core",) if paired else ()
    for title in ("method", "host ms / round", "share", f"<= {goal_ms}", *control, *names):
        table.add_column(title, justify="left" if title == "method" else "right")
    for name, r in rows.items():
        host = r["host_ms_per_round"]
        cells = [f"{r['components'].get(c, 0.0):.3f}" for c in names]
        shown = [f"{r['host_ms_per_round_control']:.3f}"] if paired else []
        table.add_row(name, f"{host:.3f}", f"{host / step_ms:.1%}", "yes" if host <= goal_ms else "NO", *shown, *cells)
    Console(width=250).print(table)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="benchmarks/host_work.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--method", action="append", default=None, help="a preset name or NAME=OVERRIDES (repeated)")
    p.add_argument(
        "--neighbours",
        action="store_true",
        help="the neighbours table's methods only (issue 48's bar); --method, when given, chooses instead",
    )
    p.add_argument("--repeat", type=int, default=2, help="untimed passes per method; the least counts")
    p.add_argument("--profile", default="a6000-qwen7b", help="latency profile whose target step the share divides by")
    p.add_argument("--goal-ms", type=float, default=0.4)
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time the components with the thread's CPU clock (time.thread_time_ns): steadier on a loaded machine; "
        "their sum then misses waits, and 'loop' (host_ms less the components) absorbs the difference",
    )
    p.add_argument(
        "--passes-on-core",
        type=int,
        default=None,
        help="run every model pass on a thread pinned to this core, the host work pinned to --host-core "
        "(torch on one thread); equal to --host-core: the control (module docstring)",
    )
    p.add_argument("--host-core", type=int, default=0, help="the host work's core with --passes-on-core")
    p.add_argument(
        "--paired-control",
        action="store_true",
        help="with --passes-on-core: each repeat also decodes with the passes on --host-core (module docstring)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds from the start after which no new repeat starts (one always runs) and no component "
        "run (its methods' components left empty): a time-limited run still writes its result",
    )
    p.add_argument(
        "--warm-split",
        action="append",
        default=None,
        metavar="MODULE:FUNCTION",
        help="instead of the table: per method, this host function's mean time per call in the run and "
        "warm, replayed on its captured inputs (warm_split; repeated); --repeat, --deadline-s and --cpu-clock "
        "do not apply",
    )
    p.add_argument("--out", default=None, help="JSON output")
    peers.add_model_arguments(p)
    args = p.parse_args(argv)
    if args.warm_split:
        if args.passes_on_core is not None:
            p.error("--warm-split: times functions on the host's own core; drop --passes-on-core")
        for target in args.warm_split:
            try:
                resolve_function(target)
            except ValueError as exc:
                p.error(str(exc))
    if args.paired_control and args.passes_on_core is None:
        p.error("--paired-control needs --passes-on-core (the core the passes move from)")
    if args.passes_on_core is not None:
        if args.device not in ("cpu", "auto") or (args.device == "auto" and torch.cuda.is_available()):
            p.error(f"--passes-on-core: runs on the CPU only (--device {args.device}); pass --device cpu")
        cores = sorted(os.sched_getaffinity(0))
        for flag, core in (("--passes-on-core", args.passes_on_core), ("--host-core", args.host_core)):
            if core not in cores:
                p.error(f"{flag}={core}: not a core this process may run on (allowed: {cores})")
    texts = args.method or (
        neighbours_methods() if args.neighbours else [*peers.DEFAULT_METHODS, *neighbours_methods()]
    )
    try:
        specs = [peers.parse_method(t) for t in dict.fromkeys(texts)]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    deadline = None if args.deadline_s is None else time.monotonic() + args.deadline_s
    log = peers.start_benchmark(args.threads)
    bench = peers.Bench(args)
    ids = [q.token_ids(bench.tokenizer) for q in load_prompts(args.dataset, None, args.num_prompts)]
    if args.warm_split:
        split = warm_split(bench, specs, ids, args.warm_split, replays=WARM_REPLAYS)
        for name, rows in split.items():
            for target, row in rows.items():
                if not row["calls"]:
                    log(f"{name}  {target}: not called")
                    continue
                said = f"{name}  {target}: {row['calls_per_round']:.2f} calls a round, {row['in_run_us']:.1f} us a call in the run"
                if row["warm_us"] is None:
                    log(f"{said}; not replayed: {row['not_replayed']}")
                else:
                    log(f"{said}, {row['warm_us']:.1f} us warm ({100 * row['own_share']:.0f}%)")
        result = {"settings": {**vars(args), "replays": WARM_REPLAYS}, "warm_split": split}
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
        return result
    with ExitStack() as stack:
        control = None
        if args.passes_on_core is not None:
            worker = stack.enter_context(passes_on(args.passes_on_core, args.host_core))
            control = (worker, args.host_core) if args.paired_control else None
        clock = time.thread_time_ns if args.cpu_clock else time.perf_counter_ns
        log(f"{len(specs)} methods, interleaved: {', '.join(spec.name for spec in specs)}")
        # the after-pass probe first: a run cut short by its deadline still has it
        after = after_pass_probe(bench.verifier.model, bench.runtime.torch_device)
        rows = measure_all(bench, specs, ids, args.repeat, clock, control, log, deadline)
    step_ms = load_profile(args.profile).target_ms_per_token
    neighbours = {peers.parse_method(t).name for t in neighbours_methods()}
    for name, r in rows.items():
        r["host_step_share"] = r["host_ms_per_round"] / step_ms
        r["in_neighbours_table"] = name in neighbours  # issue 48's bar reads these rows
    print_table(rows, step_ms, args.profile, args.goal_ms)
    probes = sorted(us for r in rows.values() for us in r["host_probe_us"])
    probe = {"median": probes[len(probes) // 2], "min": probes[0], "max": probes[-1]}
    log(
        f"host probe (host_probe_us, before each reading): median {probe['median']:.0f} us, {probe['min']:.0f}-{probe['max']:.0f}"
    )
    log(
        f"round-like host work (after_pass_probe): {after['after_pass_us']:.1f} us right after a target pass, "
        f"{after['after_wait_us']:.1f} us after waiting a pass's {after['pass_ms']:.1f} ms with no pass, "
        f"{after['warm_us']:.1f} us warm ({after['factor']:.1f}x, {after['wait_factor']:.1f}x)"
    )
    result = {
        "settings": {**vars(args), "target_step_ms": step_ms, "interleaved": True},
        "host_probe_us": probe,
        "after_pass_probe": after,
        "methods": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
