"""Counting and timing model forward passes from outside (forward hooks), for benchmarks.

``ForwardTimer`` registers a forward pre-hook and a forward hook on each named module and
accumulates, per name, the number of calls and the wall-clock milliseconds spent inside them
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
    """Per-name forward-call counts and milliseconds of watched modules.

    Only OUTERMOST calls count: a watched module called while another watched call is running
    (a submodule inside a watched model, the target's embeddings inside the target's forward) adds
    nothing, so no time is counted twice. A name may watch several modules: a drafter whose pass
    calls its own network and the target's embeddings and LM head directly (DFlash, EAGLE-3:
    ``timed_modules``) is timed as the sum of those calls.

    Args:
        modules: ``name=module`` (or ``name=[modules]``) pairs to watch (``torch.nn.Module``); a
            module already watched under an earlier name is not watched again.
        on_call: optional ``f(name)`` called after each completed (outermost) forward call.
    Usage::

        with ForwardTimer(target=model) as ft:
            model.generate(...)
        ft.calls["target"], ft.ms["target"]
    """

    def __init__(self, on_call: Callable[[str], None] | None = None, **modules) -> None:
        self.modules: dict[str, list[torch.nn.Module]] = {}
        seen: list[torch.nn.Module] = []
        for name, group in modules.items():
            group = [group] if group is None or isinstance(group, torch.nn.Module) else list(group)
            members = [m for m in group if m is not None and all(m is not s for s in seen)]
            seen += members
            if members:
                self.modules[name] = members
        self.on_call = on_call
        self.calls = {name: 0 for name in self.modules}
        self.ms = {name: 0.0 for name in self.modules}
        self._stack: list[str | None] = []  # running watched calls: the name when it counts, None when nested
        self._start = {name: 0.0 for name in self.modules}
        self._handles: list = []

    def _sync(self, module: torch.nn.Module) -> None:
        p = next(module.parameters(), None)
        if p is not None and p.device.type == "cuda":
            torch.cuda.synchronize(p.device)

    def __enter__(self) -> "ForwardTimer":
        for name, members in self.modules.items():
            def pre(mod, args, _name=name):
                outermost = not self._stack
                self._stack.append(_name if outermost else None)
                if outermost:
                    self._sync(mod)
                    self._start[_name] = time.perf_counter()

            def post(mod, args, output, _name=name):
                top = self._stack.pop()
                if top is not None:
                    self._sync(mod)
                    self.ms[top] += (time.perf_counter() - self._start[top]) * 1e3
                    self.calls[top] += 1
                    if self.on_call is not None:
                        self.on_call(top)

            for module in members:
                self._handles.append(module.register_forward_pre_hook(pre))
                self._handles.append(module.register_forward_hook(post))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()

    def reset(self) -> None:
        """Zero the counts and times (hooks stay registered)."""
        for name in self.modules:
            self.calls[name], self.ms[name] = 0, 0.0


class PolicyTimer:
    """Milliseconds and calls a length policy spends deciding (``next_length``) and learning
    (``update``): its own host time inside the loop, for benchmarks.

    The two methods are wrapped on the instance (``time.perf_counter`` around each call, about a
    microsecond of its own) and restored on exit (an instance-level override, or an outer
    ``PolicyTimer``, is put back); a ``None`` policy is timed as zero.

    Args:
        policy: a ``specpolicy.policy.LengthPolicy`` or None.
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

    def __enter__(self) -> "PolicyTimer":
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
