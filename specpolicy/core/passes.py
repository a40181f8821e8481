"""Model-pass time inside the loop: what a round spends in the drafter's and the target's forward
passes, so that the rest of the round -- its HOST work (policy decisions, tree and path searches,
n-gram lookups, sampling and acceptance bookkeeping, commit, the loop's own work) -- can be
reported as ``RoundRecord.host_ms``.

What counts as a pass: an outermost call of one of a model's pass entry points -- the drafter's
``timed_calls`` (its network, the methods of it that bypass ``forward``, the choice of its tokens
from its logits and the top-k over its own distributions) or else its ``model``; the target's
``timed_calls`` (``verifiers/hf.py``: its model, the verification's logits -> tokens tensor work,
and, on the compiled runtime, the static runner's passes) or else its ``model``; and the policy's
``timed_calls`` (``LengthPolicy.timed_calls``: SpecDec++'s acceptance head,
``specpolicy.core.acceptance``, a network on the drafter's side whose forward and softmax are a
pass, however small).

The definition, on both devices: the device's tensor work on a pass's outputs that follows it with no
host decision in between -- the target's vocabulary argmax, the acceptance comparison of the draft
with it (a cumulative product, the greedy tree path), speculative sampling's ratios and draws, and the
one sync that reads the result -- is part of the pass (the verifier's ``_accept`` methods). On a GPU
these are kernels the host only launches, queued behind the forward; counting them as host work on
the CPU would charge vanilla decoding with host time a GPU run does not show. Host work is what
decides in Python: policies, tree and path searches, n-gram lookups, the tree-sampling walk
(``tree.sample_path``), building a tree's mask and positions, cache bookkeeping, the loop itself. A model-free drafter
(``suffix``) has no pass: all its work is host work. Each pass is timed with the runtime's timers
(``Runtime.timer``), so the definition is the same on both devices:

* CPU: a pass is synchronous; its time is the wall-clock ms inside the call (``time.perf_counter``),
  and host ms = the round's wall-clock ms - the passes' ms.
* CUDA: the round and each pass are bracketed by CUDA events on the current stream; a pass's time
  is the device time between its events, and host ms = the round's device-timeline span - the
  passes' spans: the time the device spent NOT running a pass of the round, i.e. the host work
  that kept it waiting (host work that overlaps a queued pass is not counted: it is out of the
  way). Events add no synchronisation; the loop reads them once per round.

Nested entry points (a submodule inside a watched model) count once (the outermost), as in
``specpolicy.analysis.profiling.ForwardTimer``, the benchmarks' hook timer this mirrors.

On the compiled runtime (``runtime.compile``) only the compiled runners' own entry points are
watched -- ``(runner, "method")`` pairs whose runner has a true ``compiled`` attribute (the static
runners' ``run``, ``run_rows``, ``chain``, ``passes``), called from eager Python: a hook on a module
or a wrapper on a method that a compiled graph calls would be traced into that graph -- and the
methods an object names in its ``eager_pass_methods`` (only ever called from eager Python: the
verifiers' ``_accept``). A compiled
pass whose runner names no such entry point (DFlash's shared-cache passes, so far) is counted as
host time there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from specpolicy.core import runtime as runtime_module
from specpolicy.core.runtime import Runtime, Timer


def pass_entry_points(model: Any) -> tuple:
    """The pass entry points of a drafter, a verifier or a policy: its ``timed_calls`` when it names them (a
    tuple of ``torch.nn.Module`` and ``(object, "method")`` pairs), else its ``model`` when that is a
    ``torch.nn.Module``, else ``()`` (a model-free drafter: no passes)."""
    if model is None:
        return ()
    calls = getattr(model, "timed_calls", None)
    if calls is not None:
        return tuple(calls)
    inner = getattr(model, "model", None)
    return (inner,) if isinstance(inner, torch.nn.Module) else ()


class PassClock:
    """Times every outermost pass of the watched entry points with ``runtime.timer()``.

    Use as a context manager (method wrappers -- a module's: its instance's ``forward`` -- removed on exit);
    ``watch`` adds entry points while it is entered (a request's drafter copy at admission).
    Methods are wrapped on the INSTANCE: enter the clock after an object is copied, never before
    (a copy would carry the wrapper of the original).

    Args:
        runtime: the run's runtime (its timers: perf_counter on CPU, CUDA events on CUDA).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._timers: list[Timer] = []  # CUDA: each outermost pass's events, read by ``take_ms``
        self._cuda = runtime.torch_device.type == "cuda"
        self._cpu_s = 0.0  # CPU: the passes' seconds since the last ``take_ms`` (perf_counter, no Timer per pass)
        self._started = 0.0  # CPU: perf_counter() at the open outermost pass's start
        self._depth = 0
        self._hooked: set = set()  # (id, method) of watched methods (a module's: "forward")
        self._wrapped: list[tuple[object, str, object]] = []

    def __enter__(self) -> PassClock:
        return self

    def __exit__(self, *exc) -> None:
        for obj, method, held in reversed(self._wrapped):
            if held is _NONE:
                vars(obj).pop(method, None)
            else:
                setattr(obj, method, held)
        self._wrapped.clear()
        self._hooked.clear()
        self._depth = 0

    def watch(self, members: Iterable) -> None:
        """Time the passes of ``members`` (``pass_entry_points``); already-watched ones are skipped."""
        for member in members:
            if member is None or (self.runtime.compile and not _compiled_entry(member)):
                continue
            # a module: its instance's ``forward`` is wrapped (``Module._call_impl`` calls
            # ``self.forward``), not hooked: a module with hooks takes torch's slower call path, host
            # work the timing itself would add to every pass
            obj, method = (member, "forward") if isinstance(member, torch.nn.Module) else member
            key = (id(obj), method)
            if key in self._hooked:
                continue
            self._hooked.add(key)
            self._wrapped.append((obj, method, vars(obj).get(method, _NONE)))
            setattr(obj, method, self._timed(getattr(obj, method)))

    def unwatch(self, obj: object) -> None:
        """Stop timing the methods wrapped on ``obj`` (a request's drafter copy that leaves; its
        modules, shared with the other copies, stay hooked)."""
        kept = []
        for wrapped in self._wrapped:
            owner, method, held = wrapped
            if owner is not obj:
                kept.append(wrapped)
            elif held is _NONE:
                vars(owner).pop(method, None)
            else:
                setattr(owner, method, held)
        self._wrapped = kept
        self._hooked = {key for key in self._hooked if not (isinstance(key, tuple) and key[0] == id(obj))}

    def _enter(self) -> None:
        self._depth += 1
        if self._depth == 1:
            if not self._cuda:  # the CPU's timer, without a Timer object per pass (host work per pass)
                self._started = runtime_module.time.perf_counter()  # the CPU Timer's clock
                return
            timer = self.runtime.timer()
            timer.__enter__()
            self._timers.append(timer)

    def _exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            if not self._cuda:
                self._cpu_s += runtime_module.time.perf_counter() - self._started
                return
            self._timers[-1].__exit__()

    def _timed(self, method: Callable) -> Callable:
        if self._cuda:

            def timed(*args, **kwargs):
                self._enter()
                try:
                    return method(*args, **kwargs)
                finally:
                    self._exit()

            return timed
        clock = runtime_module.time.perf_counter  # the CPU Timer's clock, bound when the clock watches

        def timed_cpu(*args, **kwargs):  # ``_enter`` / ``_exit`` inlined: no Python call per pass but this one
            if self._depth:  # a nested entry point: its outermost pass is being timed
                return method(*args, **kwargs)
            self._depth = 1
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                self._cpu_s += clock() - started
                self._depth = 0

        return timed_cpu

    def discard(self) -> None:
        """Forget the passes timed so far (the prefills of admission), without reading them."""
        self._timers.clear()
        self._cpu_s = 0.0

    def take_ms(self) -> float:
        """Milliseconds of the passes timed since the last ``take_ms`` / ``discard``, then forgets
        them (on CUDA: reads their events, which waits for the last of them)."""
        total = sum(timer.ms for timer in self._timers) + self._cpu_s * 1e3
        self._timers.clear()
        self._cpu_s = 0.0
        return total


_NONE = object()  # a method the instance did not hold itself (its class's)


def _compiled_entry(member: Any) -> bool:
    """Whether ``member`` may be watched on the compiled runtime: ``(runner, "method")`` with a true
    ``runner.compiled``, or ``(obj, "method")`` with the method in ``obj.eager_pass_methods`` (never a
    module: its forward may run inside a compiled graph)."""
    if not (isinstance(member, tuple) and len(member) == 2):
        return False
    obj, method = member
    return bool(getattr(obj, "compiled", False)) or method in getattr(obj, "eager_pass_methods", ())
