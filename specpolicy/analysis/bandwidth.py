"""The machine's memory bandwidth for the runtime page's floor, measured so that it holds still:
the best of repeated STREAM-style probes, with their spread kept beside it.

Method (McCalpin's STREAM, "Memory Bandwidth and Machine Balance in Current High Performance
Computers", IEEE TCCA Newsletter 1995): four kernels over float32 arrays ``a``, ``b``, ``c`` of
``n`` elements each, every array much larger than the last-level cache (``array_bytes``: at least
4 x the LLC that sysfs reports, at least 128 MiB), written into preallocated outputs (no allocation
is timed):

======  ==================  =================================
kernel  operation           bytes counted per run (STREAM's)
======  ==================  =================================
copy    ``c = a``           2 x 4n (read a, write c)
scale   ``b = s * c``       2 x 4n
add     ``c = a + b``       3 x 4n
triad   ``a = b + s * c``   3 x 4n
======  ==================  =================================

Each kernel runs ``repeats`` times (after one untimed pass that touches every page); a probe's
rate is its bytes / its seconds (GB/s, 1e9 bytes). The bandwidth quoted is the best probe of all
(the machine's demonstrated rate, the floor's lowest time: STREAM reports each kernel's best), and
``spread`` keeps min / median / max over every probe, with every value, so a reader sees how far
one probe could have moved the floor. On CPU the probes run with the run's torch threads
(``torch.set_num_threads(threads)``, restored after); on CUDA the same kernels are device-to-device
(the arrays on the device, synchronised around each timed run).

A single 256 MB reduction read 75.7 GB/s in one published run and 29.3 GB/s in another on the same
kind of machine; the best of many probes is what moves least with the host's other work.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

#: STREAM's kernels: name -> arrays read + written per element.
KERNELS: dict[str, int] = {"copy": 2, "scale": 2, "add": 3, "triad": 3}
#: Smallest array of a probe (bytes), whatever the cache sysfs reports.
MIN_ARRAY_BYTES = 128 * 2**20
#: Scalar of scale and triad (STREAM's 3.0).
SCALAR = 3.0


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache sysfs reports (``/sys/devices/system/cpu/cpu0/cache/index*/size``),
    in bytes; None where it is not readable."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def default_array_bytes(device: torch.device) -> int:
    """Bytes per array: 4 x the last-level cache (CPU; CUDA: 4 x the device's L2), at least
    ``MIN_ARRAY_BYTES``."""
    if device.type == "cuda":
        cache = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    else:
        cache = last_level_cache_bytes() or 0
    return max(MIN_ARRAY_BYTES, 4 * int(cache))


def aggregate(rates: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """The probes' summary: ``bandwidth_GBps`` (the best probe of any kernel), ``best_by_kernel``,
    ``spread`` (``min`` / ``median`` / ``max`` over every probe, and ``count``) and ``probes`` (every
    value, GB/s, by kernel, rounded to 0.01).

    Raises:
        ValueError: when there is no probe.
    """
    values = [float(v) for vs in rates.values() for v in vs]
    if not values:
        raise ValueError("no bandwidth probe to aggregate")
    return {
        "bandwidth_GBps": max(values),
        "best_by_kernel": {k: max(vs) for k, vs in rates.items() if vs},
        "spread": {
            "min": min(values),
            "median": statistics.median(values),
            "max": max(values),
            "count": len(values),
        },
        "probes": {k: [round(float(v), 2) for v in vs] for k, vs in rates.items()},
    }


def stream_probes(
    device: torch.device,
    threads: int | None = None,
    repeats: int = 10,
    array_bytes: int | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Measure the memory bandwidth of ``device`` by STREAM's four kernels (module doc), each
    ``repeats`` times; ``aggregate`` of the rates, with ``threads``, ``array_bytes`` and ``repeats``.

    Args:
        device: where the arrays live (CPU: host memory; CUDA: device memory).
        threads: CPU torch threads for the probes (the run's; None: the current setting), restored after.
        repeats: timed runs per kernel, >= 1.
        array_bytes: bytes per array (default ``default_array_bytes``).
        timer: seconds, monotonic (tests inject a fake clock; nothing else is measured).
    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    size = int(array_bytes or default_array_bytes(device))
    n = max(1, size // 4)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        a = torch.full((n,), 1.0, dtype=torch.float32, device=device)
        b = torch.full((n,), 2.0, dtype=torch.float32, device=device)
        c = torch.zeros(n, dtype=torch.float32, device=device)
        runs: dict[str, Callable[[], Any]] = {
            "copy": lambda: c.copy_(a),
            "scale": lambda: torch.mul(c, SCALAR, out=b),
            "add": lambda: torch.add(a, b, out=c),
            "triad": lambda: torch.add(b, c, alpha=SCALAR, out=a),
        }
        rates: dict[str, list[float]] = {k: [] for k in KERNELS}
        for name, run in runs.items():
            run()  # untimed: every page touched, kernels loaded
            sync()
            for _ in range(repeats):
                start = timer()
                run()
                sync()
                seconds = timer() - start
                rates[name].append(KERNELS[name] * 4 * n / max(seconds, 1e-12) / 1e9)
    finally:
        torch.set_num_threads(previous)
    return {
        **aggregate(rates),
        "threads": threads if threads is not None else previous,
        "array_bytes": 4 * n,
        "repeats": repeats,
        "device": str(device),
    }


def x_floor_range(ms_per_token: float, floor: Mapping[str, float], probes: Mapping[str, Any]) -> tuple[float, float]:
    """``(x floor at the best probe, x floor at the slowest probe)``: ``ms_per_token`` over the
    floor (``max(read_ms, flops_ms)``) with the weight read at the best probe's bandwidth (``floor``
    as measured) and at the slowest probe's (``read_ms`` scaled by best / slowest; FLOPs unchanged)."""
    slow_read = floor["read_ms"] * probes["bandwidth_GBps"] / probes["spread"]["min"]
    return ms_per_token / floor["floor_ms"], ms_per_token / max(slow_read, floor["flops_ms"])
