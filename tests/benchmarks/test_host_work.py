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
