"""What a length policy knows of the batch it runs in (the batched loop, ``specpolicy.core.batching``).

Verification stops being nearly free once the target is compute-bound: a round's target pass
costs more the more tokens it verifies over all requests, and that cost, not a request's own
draft, decides whether one more draft token pays (SmartSpec, Liu et al. 2024, arXiv 2406.14066,
§4: goodput = expected emitted tokens per unit of batch time; vLLM schedules K by batch size,
vllm-project/vllm#32374). The loop therefore hands every request's policy a ``BatchContext``
before the round's drafting (``LengthPolicy.batch``; None in the batch-1 loop), holding the
measured cost of a batched verification as a function of the tokens verified
(``VerifyCost``), and lets a policy class plan the whole round's lengths at once
(``LengthPolicy.plan_round``). Policies that ignore both (every batch-1 policy, third-party
plugins) run unchanged, each request with its own copy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


class VerifyCost:
    """Milliseconds of a round of the batched loop besides drafting -- the batched verification
    and the loop's work per request -- as a function of the tokens the verification pass computes:
    ``rows x (1 + longest draft)`` with padded rows (``verifiers/hf_batch.py``). The same measured
    curve serves for a round's drafting as a function of the drafter passes of all its requests
    (``BatchContext.draft_cost``: a fixed part per round and a part per pass, whatever their
    shares, with no model of either). Measured:
    per token count, the least of its last ``window`` observed ms (robust to the one-sided noise
    of a shared CPU: a pass is never faster than its cost, often slower -- first calls of a shape,
    allocator growth, other work; measured at batch 16, passes of 84-103 ms among 20-25 ms ones
    early in a process, which as averages kept speculation off for most of a run), made
    non-decreasing (isotonic), interpolated linearly between observed counts;
    outside them, extended with the local slope (``prior_slope_ratio`` of the mean ms per token
    until two counts are seen). Once three or more counts above the smallest are seen, the curve
    from the second smallest count on is their weighted least-squares line (``affine_from``), not
    an interpolation: one sample per count is noisy, and the isotonic fit turns that noise into
    flat steps that make a longer draft look free (measured at batch 1: mean K swinging between 4
    and 10 over runs). Not one line over every count: on this CPU a forward over 8 rows costs 8 ms
    at one token per row and 12 ms at two (``benchmarks/batched.py``), which a straight line
    through both ends would miss; the smallest count (no draft, or one pass) keeps its own value.

    Args:
        window: observations per token count the estimate is the least of, >= 1.
        prior_slope_ratio: the slope's share of the per-token cost before it can be fitted, [0, 1].
    """

    def __init__(self, window: int = 3, prior_slope_ratio: float = 0.5) -> None:
        self.window, self.prior_slope_ratio = window, prior_slope_ratio
        self._recent: dict[int, deque] = {}  # tokens -> its last ``window`` observed ms (the estimate: their least)
        self._count: dict[int, int] = {}  # tokens -> samples
        self._fit: dict[int, float] | None = None  # ``observed``, until the next observation
        self._arrays: tuple | None = None  # counts, ms, slope, line of ``_fit`` (``ms``'s, once per observation)
        self.samples = 0

    def observe(self, tokens: int, ms: float) -> None:
        """Add one verification: ``tokens`` computed (>= 1), ``ms`` its wall time."""
        self._recent.setdefault(tokens, deque(maxlen=self.window)).append(ms)
        self._count[tokens] = self._count.get(tokens, 0) + 1
        self._fit = self._arrays = None
        self.samples += 1

    @property
    def observed(self) -> dict[int, float]:
        """Token count -> its current ms estimate (non-decreasing in the count), for every count
        seen, sorted by count."""
        if self._fit is None:
            keys = sorted(self._recent)
            self._fit = dict(
                zip(
                    keys,
                    _isotonic([min(self._recent[n]) for n in keys], [min(self._count[n], MAX_WEIGHT) for n in keys]),
                )
            )
        return self._fit

    def seed(self, other: VerifyCost) -> None:
        """Start from ``other``'s estimates (an earlier run's curve of the same batch), each count's
        weight capped at ``MAX_WEIGHT``; this curve's own observations then move them."""
        for tokens, recent in other._recent.items():
            if tokens not in self._recent:
                self._recent[tokens] = deque([min(recent)], maxlen=self.window)
                self._count[tokens] = min(other._count[tokens], MAX_WEIGHT)
                self.samples += other._count[tokens]
        self._fit = self._arrays = None

    @property
    def largest(self) -> int:
        """The largest token count observed (0 before any)."""
        return max(self._recent, default=0)

    def slope(self) -> float:
        """ms per token beyond the observed counts (>= 0): the slope between the two largest
        observed counts (the local slope: the step from one token per row to two, far steeper, does
        not count there); before two counts are seen, ``prior_slope_ratio`` of the ms per token."""
        if not self._recent:
            return 0.0
        points = self.observed
        n, ms = list(points.keys()), list(points.values())
        if len(n) < 2:
            return self.prior_slope_ratio * ms[0] / n[0]
        return max((ms[-1] - ms[-2]) / (n[-1] - n[-2]), 0.0)

    def ms(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """Modeled milliseconds of a verification computing ``tokens`` tokens (any array shape;
        0 before any observation)."""
        if not self._recent:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        if self._arrays is None:  # once per observation, not per call (a plan calls this a few times)
            points = self.observed
            self._arrays = (
                np.array(list(points.keys()), dtype=float),
                np.array(list(points.values())),
                self.slope(),
                self.affine_from(),
            )
        n, ms, slope, line = self._arrays
        x = np.asarray(tokens, dtype=float)
        if line is not None:  # from the second smallest count on: the fitted line
            start, at_start, per_token = line
            above = at_start + per_token * (x - start)
            return np.where(
                x < n[0],
                ms[0] * x / n[0],
                np.where(x < start, ms[0] + (at_start - ms[0]) * (x - n[0]) / (start - n[0]), above),
            )
        inside = np.interp(x, n, ms)  # below the smallest count: in proportion to it (never 0 or less)
        return np.where(x < n[0], ms[0] * x / n[0], np.where(x > n[-1], ms[-1] + slope * (x - n[-1]), inside))

    def affine_from(self) -> tuple[float, float, float] | None:
        """``(second smallest count, the line's ms there, its ms per token >= 0)``: the weighted
        least-squares line (weights: samples per count, at most ``MAX_WEIGHT``) through the
        isotonic estimates of every count from the second smallest on; None with fewer than three
        such counts. The line's value there is at least the smallest count's (a line through costs
        that turn steeply up, past the compute-bound knee, would dip below it)."""
        points = self.observed
        n = np.array(list(points.keys())[1:], dtype=float)
        if n.shape[0] < 3:
            return None
        ms = np.array(list(points.values())[1:])
        w = np.array([min(self._count[int(c)], MAX_WEIGHT) for c in n], dtype=float)
        mean_n, mean_ms = np.average(n, weights=w), np.average(ms, weights=w)
        per_token = max(float(np.sum(w * (n - mean_n) * (ms - mean_ms)) / np.sum(w * (n - mean_n) ** 2)), 0.0)
        smallest = list(points.values())[0]  # never below the smallest count's cost (a convex knee would)
        return float(n[0]), max(float(mean_ms + per_token * (n[0] - mean_n)), smallest), per_token


#: The most weight one token count's estimate gets in the isotonic fit (``VerifyCost.observed``).
MAX_WEIGHT = 8


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares
    (pool-adjacent-violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights):
        blocks.append([v, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(int(n))]


@dataclass(frozen=True)
class BatchContext:
    """The batch a request's round runs in, set on its policy (``LengthPolicy.batch``) before drafting.

    Attributes:
        requests: requests in flight this round (rows of the target pass).
        row: this request's row.
        verify_cost: the measured cost of a batched verification (``VerifyCost``, shared by the batch).
        planned_length: the speculation length ``plan_round`` gave this request this round (tokens),
            or None when the policy class plans nothing.
        draft_cost: the measured drafting cost of a round (``VerifyCost`` over drafter passes: ms
            of every request's drafting and commit against the passes of all requests, a pass
            over many requests at once counting once per request), shared by the batch; None
            outside the batched loop.
    """

    requests: int
    row: int
    verify_cost: VerifyCost
    planned_length: int | None = None
    draft_cost: VerifyCost | None = None
