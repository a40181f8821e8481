"""Serving numbers for the batched loop: when requests arrive, and what each one saw.

Arrivals: all at once (offline throughput) or a Poisson process at ``rate`` requests/s (seeded
exponential inter-arrival times), the usual open-loop load of serving benchmarks (vLLM's
``benchmark_serving``, SPEED-Bench). Per request: time to first token (TTFT: arrival to the
first emitted token, ms), time per output token (TPOT: first token to the last, over the tokens
after the first, ms) and end-to-end latency; summarised as mean, p50 and p99 over requests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

ARRIVALS = ("all_at_once", "poisson")


def arrival_times(num_requests: int, process: str = "all_at_once", rate: float = 0.0, seed: int = 0) -> list[float]:
    """Arrival time of each request in seconds from the start, non-decreasing.

    Args:
        num_requests: requests, >= 0.
        process: ``"all_at_once"`` (every request at 0) or ``"poisson"`` (exponential gaps of
            mean ``1 / rate``, the first request at 0).
        rate: requests per second, > 0 for ``"poisson"``.
        seed: the gaps' random seed.
    Raises:
        ValueError: naming ``generation.arrival`` or ``generation.arrival_rate`` and the accepted values.
    """
    if process not in ARRIVALS:
        raise ValueError(f"generation.arrival must be one of {', '.join(ARRIVALS)}, got {process!r}")
    if process == "all_at_once":
        return [0.0] * num_requests
    if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
        raise ValueError(
            f"generation.arrival_rate must be a number > 0 (requests/s) for poisson arrivals, got {rate!r}"
        )
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(num_requests):
        if i:
            now += rng.expovariate(rate)
        times.append(now)
    return times


@dataclass(frozen=True)
class RequestTiming:
    """One request's times in seconds from the run's start (``time.perf_counter`` based).

    Attributes:
        arrival_s: when it arrived; admitted_s: when its prefill began; first_token_s: when its
        first token was emitted (end of the round that emitted it); finish_s: when its last was.
        tokens: tokens it generated.
    """

    arrival_s: float
    admitted_s: float
    first_token_s: float
    finish_s: float
    tokens: int

    @property
    def ttft_ms(self) -> float:
        """Time to first token, ms (queueing included)."""
        return (self.first_token_s - self.arrival_s) * 1e3

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first, ms (0 for a one-token output)."""
        return (self.finish_s - self.first_token_s) * 1e3 / (self.tokens - 1) if self.tokens > 1 else 0.0

    @property
    def latency_ms(self) -> float:
        """Arrival to the last token, ms."""
        return (self.finish_s - self.arrival_s) * 1e3


def summarize(timings: list[RequestTiming], wall_s: float) -> dict[str, float]:
    """Throughput (generated tokens/s over all requests and the run's wall time) and the mean,
    p50 and p99 of TTFT, TPOT and latency in ms (NaN without requests)."""
    out: dict[str, float] = {
        "requests": float(len(timings)),
        "tokens": float(sum(t.tokens for t in timings)),
        "wall_s": wall_s,
    }
    out["throughput_tokens_per_s"] = out["tokens"] / wall_s if wall_s > 0 and timings else float("nan")
    for name in ("ttft_ms", "tpot_ms", "latency_ms"):
        values = np.array([getattr(t, name) for t in timings], dtype=float)
        stem = name.removesuffix("_ms")
        for label, value in (
            ("mean", values.mean() if values.size else float("nan")),
            ("p50", np.percentile(values, 50) if values.size else float("nan")),
            ("p99", np.percentile(values, 99) if values.size else float("nan")),
        ):
            out[f"{stem}_{label}_ms"] = float(value)
    return out


def first_token_s(result) -> float:
    """Seconds from a batch-1 loop's start on a prompt to its first emitted token: the prefill and
    the first round's drafting and verification (``result``: a ``GenerationResult``; a vanilla
    baseline read back from ``results.jsonl`` carries its mean step time in every round), at most
    the prompt's ``wall_s``."""
    first = result.rounds[0].draft_ms + result.rounds[0].verify_ms if result.rounds else 0.0
    return min((result.prefill_ms + first) / 1e3, result.wall_s)


def one_after_another(
    service: list[tuple[float, float, int]], arrivals: list[float]
) -> tuple[list[RequestTiming], float]:
    """The timings of requests served one at a time in order (first come, first served), each
    taking its measured time: what the batch-1 loop's requests see when they arrive at ``arrivals``.

    Args:
        service: per request, ``(seconds from admission to its last token, seconds from admission
            to its first token, tokens generated)``.
        arrivals: per request, seconds from the start (``arrival_times``), as many as ``service``.
    Returns:
        ``(timings, wall_s)``: a ``RequestTiming`` per request, and the seconds from the start to
        the last finish (``summarize``'s ``wall_s``, as the batched loop's).
    """
    timings, free_s = [], 0.0  # when the single server is next free
    for (busy_s, first_s, tokens), arrival in zip(service, arrivals, strict=True):
        admitted = max(free_s, arrival)
        timings.append(RequestTiming(arrival, admitted, admitted + first_s, admitted + busy_s, tokens))
        free_s = admitted + busy_s
    return timings, free_s
