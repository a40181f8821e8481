"""Counting and timing model forward passes from outside (forward hooks), for benchmarks.

``ForwardTimer`` registers a forward pre-hook and a forward hook on each named module (or wraps a
named method, for a pass that bypasses ``forward``) and accumulates, per name, the number of calls and the wall-clock milliseconds spent inside them
(``time.perf_counter``; on CUDA the hooks synchronise the device first so the time is the
pass's, which perturbs pipelining: use it for CPU timings or accept the sync). Nested calls of
the same module count once (the outermost). Used by ``benchmarks/overhead.py`` (time outside
forward passes) and ``benchmarks/peers.py`` (drafter passes and per-round times of Hugging
Face assisted generation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class ForwardTimer:
    """Per-name forward-call counts and milliseconds of watched modules and methods.

    Only OUTERMOST calls count: a watched call made while another watched call is running (a
    submodule inside a watched model, the target's embeddings inside the target's forward) adds
    nothing, so no time is counted twice. A name may watch several callables: a drafter whose pass
    calls its network, a method of it that bypasses ``forward`` and the target's embeddings and LM
    head directly (DFlash, EAGLE-3: ``timed_calls``) is timed as the sum of those calls. Watch the
    entry points of a pass, not every submodule: each watched call costs a few microseconds of
    hooks, which land outside the timed windows.

    Args:
        modules: ``name=member`` (or ``name=[members]``) pairs to watch; a member is a
            ``torch.nn.Module`` (its forward, through hooks) or an ``(object, "method")`` pair (the
            method is wrapped on the instance while the timer is entered, and restored on exit). A
            member already watched under an earlier name is not watched again.
        on_call: optional ``f(name)`` called after each completed (outermost) call.
    Usage::

        with ForwardTimer(target=model, drafter=[head, (head, "logits")]) as ft:
            model.generate(...)
        ft.calls["target"], ft.ms["target"]
    """

    def __init__(self, on_call: Callable[[str], None] | None = None, **modules) -> None:
        self.modules: dict[str, list[torch.nn.Module | tuple[object, str]]] = {}
        seen: list = []
        for name, group in modules.items():
            group = [group] if group is None or isinstance(group, torch.nn.Module) or _is_method(group) else list(group)
            members = [m for m in group if m is not None and not any(_same(m, s) for s in seen)]
            seen += members
            if members:
                self.modules[name] = members
        self.on_call = on_call
        self.calls = {name: 0 for name in self.modules}
        self.ms = {name: 0.0 for name in self.modules}
        self._stack: list[str | None] = []  # running watched calls: the name when it counts, None when nested
        self._start = {name: 0.0 for name in self.modules}
        self._handles: list = []
        self._wrapped: list[tuple[object, str, object]] = []  # (object, method, what its instance held or _NONE)

    @staticmethod
    def _cuda_device(member) -> torch.device | None:
        """The CUDA device a member's parameters are on (its calls are synchronised), else None."""
        module = member if isinstance(member, torch.nn.Module) else member[0]
        p = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
        return p.device if p is not None and p.device.type == "cuda" else None

    def _sync(self, member) -> None:
        device = self._devices.get(id(member))
        if device is not None:
            torch.cuda.synchronize(device)

    def _enter(self, name: str, member) -> None:
        outermost = not self._stack
        self._stack.append(name if outermost else None)
        if outermost:
            self._sync(member)
            self._start[name] = time.perf_counter()

    def _exit(self, member) -> None:
        top = self._stack.pop()
        if top is not None:
            self._sync(member)
            self.ms[top] += (time.perf_counter() - self._start[top]) * 1e3
            self.calls[top] += 1
            if self.on_call is not None:
                self.on_call(top)

    def __enter__(self) -> ForwardTimer:
        # looked up once: a hook's own cost lands outside the timed windows, in the caller's time
        self._devices = {id(m): self._cuda_device(m) for members in self.modules.values() for m in members}
        for name, members in self.modules.items():
            for member in members:
                if not _is_method(member):
                    self._handles.append(
                        member.register_forward_pre_hook(lambda mod, args, _n=name, _m=member: self._enter(_n, _m))
                    )
                    self._handles.append(member.register_forward_hook(lambda mod, args, out, _m=member: self._exit(_m)))
                else:
                    obj, method = member
                    self._wrapped.append((obj, method, vars(obj).get(method, _NONE)))
                    setattr(obj, method, self._timed(name, member, getattr(obj, method)))
        return self

    def _timed(self, name: str, member, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            self._enter(name, member)
            try:
                return method(*args, **kwargs)
            finally:
                self._exit(member)

        return timed

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for obj, method, held in reversed(self._wrapped):
            if held is _NONE:
                vars(obj).pop(method, None)  # the class's method again
            else:
                setattr(obj, method, held)
        self._wrapped.clear()
        self._stack.clear()

    def reset(self) -> None:
        """Zero the counts and times (hooks stay registered)."""
        for name in self.modules:
            self.calls[name], self.ms[name] = 0, 0.0


_NONE = object()  # a method the instance did not hold itself (its class's)


def _is_method(member) -> bool:
    """Whether ``member`` is an ``(object, "method")`` pair."""
    return isinstance(member, tuple) and len(member) == 2 and isinstance(member[1], str)


def _same(a, b) -> bool:
    """Whether two watched members are the same module, or the same (object, method) pair."""
    if _is_method(a) and _is_method(b):
        return a[0] is b[0] and a[1] == b[1]
    return a is b


class PolicyTimer:
    """Milliseconds and calls a length policy spends deciding (``next_length``) and learning
    (``update``): its own host time inside the loop, for benchmarks.

    The two methods are wrapped on the instance (``time.perf_counter`` around each call, about a
    microsecond of its own) and restored on exit (an instance-level override, or an outer
    ``PolicyTimer``, is put back); a ``None`` policy is timed as zero.

    Args:
        policy: a ``specpolicy.core.policy.LengthPolicy`` or None.
    Usage::

        with PolicyTimer(policy) as pt:
            generate(..., policy=policy)
        pt.ms["next_length"], pt.calls["update"], pt.total_ms
    """

    METHODS = ("next_length", "update")

    def __init__(self, policy) -> None:
        self.policy = policy
        self.ms = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)

    @property
    def total_ms(self) -> float:
        """Milliseconds in ``next_length`` and ``update`` together."""
        return sum(self.ms.values())

    def __enter__(self) -> PolicyTimer:
        if self.policy is not None:
            # what the instance itself held (an override, or an outer timer's wrapper), restored on exit
            self._own = {name: vars(self.policy)[name] for name in self.METHODS if name in vars(self.policy)}
            for name in self.METHODS:
                setattr(self.policy, name, self._timed(name, getattr(self.policy, name)))
        return self

    def _timed(self, name: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.ms[name] += (time.perf_counter() - t0) * 1e3
                self.calls[name] += 1

        return timed

    def __exit__(self, *exc) -> None:
        if self.policy is not None:
            for name in self.METHODS:
                if name in self._own:
                    setattr(self.policy, name, self._own[name])
                else:
                    vars(self.policy).pop(name, None)  # the class's method again
