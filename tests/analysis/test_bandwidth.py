"""The floor's bandwidth: the best of repeated STREAM probes with their spread, aggregated from an
injected clock (no timing asserted), and quoted on the runtime page with that spread."""

from __future__ import annotations

import itertools

import pytest
import torch

from specpolicy.analysis.bandwidth import KERNELS, aggregate, stream_probes, x_floor_range
from specpolicy.analysis.docs_runtime import probes_text, x_floor_cell


def fake_clock(durations):
    """A timer whose successive (start, end) pairs are ``durations`` seconds apart."""
    ticks = itertools.accumulate(d for pair in ((0.0, d) for d in durations) for d in pair)
    return lambda: next(ticks)


def test_the_probes_give_the_best_rate_and_the_spread_of_every_probe():
    repeats, size = 3, 4 * 2**10  # 1,024 float32 elements per array
    durations = [1e-3, 0.5e-3, 2e-3] * len(KERNELS)  # each kernel: 1 ms, 0.5 ms, 2 ms
    result = stream_probes(
        torch.device("cpu"), threads=1, repeats=repeats, array_bytes=size, timer=fake_clock(durations)
    )
    bytes_of = {k: arrays * size for k, arrays in KERNELS.items()}
    assert result["probes"] == {k: [round(b / s / 1e9, 2) for s in (1e-3, 0.5e-3, 2e-3)] for k, b in bytes_of.items()}
    best = 3 * size / 0.5e-3 / 1e9  # add / triad move three arrays: the fastest probe
    assert result["bandwidth_GBps"] == pytest.approx(best)
    assert result["best_by_kernel"]["copy"] == pytest.approx(2 * size / 0.5e-3 / 1e9)
    spread = result["spread"]
    assert spread["count"] == repeats * len(KERNELS)
    assert spread["min"] == pytest.approx(2 * size / 2e-3 / 1e9) and spread["max"] == pytest.approx(best)
    values = sorted(v for vs in result["probes"].values() for v in vs)
    assert spread["median"] == pytest.approx((values[5] + values[6]) / 2, abs=0.01)
    assert result["threads"] == 1 and result["array_bytes"] == size and result["repeats"] == repeats


def test_the_probes_run_with_the_given_threads_and_restore_them():
    before = torch.get_num_threads()
    seen = []

    def clock():
        seen.append(torch.get_num_threads())
        return float(len(seen))

    stream_probes(torch.device("cpu"), threads=2, repeats=1, array_bytes=4096, timer=clock)
    assert set(seen) == {2} and torch.get_num_threads() == before


def test_aggregate_refuses_no_probe_and_x_floor_spans_the_probes():
    with pytest.raises(ValueError, match="no bandwidth probe"):
        aggregate({"copy": []})
    probes = aggregate({"copy": [10.0, 40.0, 20.0]})
    floor = {"read_ms": 1.0, "flops_ms": 0.5, "floor_ms": 1.0}  # read-bound at the best probe (40 GB/s)
    assert x_floor_range(3.0, floor, probes) == pytest.approx((3.0, 0.75))  # at 10 GB/s the read takes 4 ms
    row = {"x_floor": 3.0, "x_floor_slowest_probe": 0.75}
    assert x_floor_cell(row) == "0.8-3.0" and x_floor_cell({"x_floor": 3.0}) == "3.0"
    text = probes_text({"bandwidth_probes": {**probes, "array_bytes": 2**27, "threads": 2}})
    assert "best of 3 STREAM probes" in text and "min / median / max 10.0 / 20.0 / 40.0 GB/s" in text
    assert "single probe" in probes_text({})
