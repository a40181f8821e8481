"""Compiled host kernels of the length policies (issue 48, item 5: host work per round): ``numba``
``njit`` functions, compiled on first call and cached on disk (``cache=True``), as
``specpolicy.core.compiled``'s searches are.

``calibration_count`` and ``calibration_estimates`` are ``AcceptanceCalibration``'s counting and
estimates (``specpolicy.core.calibration``, the calibration goodput refreshes its tables from).
``goodput_tables`` builds ``policy=goodput``'s decision tables (``GoodputPolicy._refresh``) in one
call: the gain curves of the undrafted positions and the cost tables, which numpy built with about
25 calls over ``(H + 1) x H`` arrays. ``goodput_best`` is its plan's last step (``GoodputPolicy._plan``):
``value = gain * survival - cost`` over the first ``m`` lengths, its first argmax and whether it is
positive. Each restates the numpy expression it replaces with the same float64 operations in the
same order, element for element (a cumulative product and sum accumulate left to right as numpy's
do; no fast-math, so no fused multiply-add), so the tables and the decisions are bit-identical
(``tests/policies/test_goodput_compiled.py`` compares them with the numpy code on random inputs).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def goodput_tables(
    unseen: np.ndarray,
    first_tokens: float,
    first_passes: float,
    later_tokens: float,
    later_passes: float,
    token_ms: float,
    draft_ms_per_token: float,
    pass_ms: float,
    verify_step: float,
    first_pass: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``GoodputPolicy._refresh``'s tables for a horizon of ``H`` = ``unseen.size`` lengths.

    Args:
        unseen: ``(H,) float64`` the estimate for an undrafted token at positions 1..H.
        first_tokens / first_passes: tokens and passes of a round's first chunk (``first_chunk``'s
            numerator and denominator); later_tokens / later_passes: of a later chunk.
        token_ms: ms per added token (verification slope + drafting ms per token);
            draft_ms_per_token: drafting ms per token; pass_ms: ms of a later drafter pass;
            verify_step: a draft's verification step (ms); first_pass: what the round's first pass
            costs beyond a later one (ms); lam: ``lambda``, tokens per ms.
    Returns:
        ``(unseen_gain (H, H), cost_later (H + 1, H), cost_first (H,), probe_cost_later (H + 1, H),
        probe_cost_first (H,))``, float64: ``unseen_gain[k, j]`` = the sum over ``i <= j`` of the
        product of ``unseen[k .. k + i]`` (ones past ``H``); ``cost_later[r, m - 1]`` = ``lam`` x the
        ms of adding ``m`` tokens with ``r`` decoded ahead; ``cost_first`` = a round's first chunk's;
        the probe's the same without the verification's ms.
    """
    H = unseen.size
    gain = np.empty((H, H))
    for k in range(H):
        product = 1.0
        total = 0.0
        for j in range(H):
            u = unseen[k + j] if k + j < H else 1.0
            product = u if j == 0 else product * u
            total = product if j == 0 else total + product
            gain[k, j] = total
    later_size = max(later_tokens, 1.0)
    first_size = max(first_tokens, 1.0)
    chunks = np.empty(H + 1)
    first_chunks = np.empty(H + 1)
    for b in range(H + 1):
        chunks[b] = math.ceil(float(b) / later_size)
        first_chunks[b] = math.ceil(max(float(b) - first_size, 0.0) / later_size)
    cost_later = np.empty((H + 1, H))
    probe_later = np.empty((H + 1, H))
    for r in range(H + 1):
        for m in range(1, H + 1):
            passes = later_passes * chunks[max(m - r, 0)]
            cost_later[r, m - 1] = lam * (float(m) * token_ms + passes * pass_ms)
            probe_later[r, m - 1] = lam * (float(m) * draft_ms_per_token + passes * pass_ms)
    cost_first = np.empty(H)
    probe_first = np.empty(H)
    for m in range(1, H + 1):
        passes = first_passes + later_passes * first_chunks[m]
        cost_first[m - 1] = lam * (float(m) * token_ms + verify_step + passes * pass_ms + first_pass)
        probe_first[m - 1] = lam * (float(m) * draft_ms_per_token + passes * pass_ms + first_pass)
    return gain, cost_later, cost_first, probe_later, probe_first


@njit(cache=True)
def goodput_best(gain: np.ndarray, cost: np.ndarray, survival: float, m: int) -> tuple[int, bool]:
    """The first index ``j < m`` maximising ``gain[j] * survival - cost[j]`` (numpy's ``argmax``:
    the first of equal maxima, or the first NaN) and whether that value is > 0. ``m`` >= 1; ``gain`` and ``cost``
    ``(>= m,) float64``."""
    best = 0
    top = gain[0] * survival - cost[0]
    if math.isnan(top):
        return 0, False
    for j in range(1, m):
        value = gain[j] * survival - cost[j]
        if math.isnan(value):  # numpy's argmax stops at the first NaN, which is not > 0
            return j, False
        if value > top:
            best, top = j, value
    return best, top > 0.0


@njit(cache=True)
def calibration_count(
    reached: np.ndarray,
    accepted: np.ndarray,
    confidence_sum: np.ndarray,
    cells: np.ndarray,
    edges: np.ndarray,
    conf: np.ndarray,
    lengths: np.ndarray,
    accepted_lengths: np.ndarray,
) -> None:
    """``AcceptanceCalibration.observe_many``'s counting, in place: for draft ``d`` its first
    ``lengths[d]`` (reached) tokens, confidences ``conf`` (all drafts' in order, ``(sum lengths,)
    float64``), the token at 1-based position ``i`` goes to cell ``cells[i - 1] + bin`` (``bin``:
    the count of ``edges`` <= its confidence, NaN past every edge: numpy's ``searchsorted(edges, c,
    side="right")``) and counts as accepted when ``i <= accepted_lengths[d]``. As the numpy code, the
    batch's counts and confidence sums are accumulated per cell first (``bincount``: in input order
    from 0) and then added to ``reached`` / ``accepted`` / ``confidence_sum`` (C-contiguous, float64)."""
    size = reached.size
    counts = np.zeros(size, dtype=np.int64)
    hits = np.zeros(size, dtype=np.int64)
    sums = np.zeros(size)
    start = 0
    for d in range(lengths.size):
        for i in range(lengths[d]):
            c = conf[start + i]
            b = edges.size
            if not math.isnan(c):
                b = 0
                while b < edges.size and edges[b] <= c:
                    b += 1
            cell = cells[i] + b
            counts[cell] += 1
            if i + 1 <= accepted_lengths[d]:
                hits[cell] += 1
            sums[cell] += c
        start += lengths[d]
    cols = reached.shape[1]
    for j in range(size):
        q, b = j // cols, j % cols
        reached[q, b] += counts[j]
        accepted[q, b] += hits[j]
        confidence_sum[q, b] += sums[j]


@njit(cache=True)
def calibration_estimates(
    reached: np.ndarray, accepted: np.ndarray, bin_prior: np.ndarray, s0: float, s1: float, prior_acceptance: float
) -> tuple[np.ndarray, np.ndarray]:
    """``AcceptanceCalibration.table()`` and ``unseen()`` in one call: ``(position bins, confidence
    bins)`` and ``(position bins,)`` float64, the module's formulas element for element. The counts
    are whole numbers, so their sums are exact in any order (numpy's pairwise sums give the same)."""
    rows, cols = reached.shape
    pooled = np.empty(cols)
    for b in range(cols):
        a_b = 0.0
        r_b = 0.0
        for q in range(rows):
            a_b += accepted[q, b]
            r_b += reached[q, b]
        pooled[b] = (a_b + s0 * bin_prior[b]) / (r_b + s0)
    table = np.empty((rows, cols))
    a_all = 0.0
    r_all = 0.0
    a_q = np.zeros(rows)
    r_q = np.zeros(rows)
    for q in range(rows):
        for b in range(cols):
            table[q, b] = (accepted[q, b] + s1 * pooled[b]) / (reached[q, b] + s1)
            a_q[q] += accepted[q, b]
            r_q[q] += reached[q, b]
        a_all += a_q[q]
        r_all += r_q[q]
    overall = (a_all + s0 * prior_acceptance) / (r_all + s0)
    unseen = np.empty(rows)
    for q in range(rows):
        unseen[q] = (a_q[q] + s1 * overall) / (r_q[q] + s1)
    return table, unseen
