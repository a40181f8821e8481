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


def goodput_table_size(H: int) -> int:
    """Floats of ``goodput_tables``' output buffer for a horizon of ``H`` lengths."""
    return H * H + 2 * (H + 1) * H + 3 * H


def goodput_table_views(out: np.ndarray, H: int) -> tuple[np.ndarray, ...]:
    """``(unseen_gain (H, H), cost_later (H + 1, H), cost_first (H,), probe_cost_later (H + 1, H),
    probe_cost_first (H,), go_on (H,))``: views of ``goodput_tables``' flat output buffer ``out``
    (``(goodput_table_size(H),) float64``), made once per buffer."""
    a, b = H * H, H * H + (H + 1) * H
    c = b + H
    d = c + (H + 1) * H
    return (
        out[:a].reshape(H, H),
        out[a:b].reshape(H + 1, H),
        out[b:c],
        out[c:d].reshape(H + 1, H),
        out[d : d + H],
        out[d + H : d + 2 * H],
    )


@njit(cache=True)
def _least_survival(g: float, c: float, scratch: np.ndarray, bits: np.ndarray) -> float:
    """The least float64 ``s >= 0`` with ``g * s - c > 0.0`` (float64, no fused multiply-add: as
    ``goodput_best`` computes a value), +inf when none; ``g`` finite and >= 0, ``c`` not NaN. The
    value rises with ``s`` (a rounded product and difference are monotone), so ``s`` passes iff it
    is at least this one (``c`` finite: no NaN value on the way). Found next to ``c / g`` and pinned to one ulp by bisecting the floats' bit
    patterns (``scratch``, ``(1,) float64``, and ``bits``, its int64 view)."""
    if g * 0.0 - c > 0.0:
        return 0.0
    top = 1.7976931348623157e308  # the largest float64
    if not g * top - c > 0.0:
        return math.inf
    scratch[0] = top
    hi = bits[0]  # passes
    lo = 0  # the bits of 0.0: fails
    guess = c / g if g > 0.0 else top
    if guess > 0.0 and guess < top:  # a bracket around the guess, widened by doubling steps
        scratch[0] = guess
        x = bits[0]
        step = 1
        if g * guess - c > 0.0:
            hi = x
            while x - step > lo:
                bits[0] = x - step
                if not g * scratch[0] - c > 0.0:
                    lo = x - step
                    break
                hi = x - step
                step *= 2
        else:
            lo = x
            while x + step < hi:
                bits[0] = x + step
                if g * scratch[0] - c > 0.0:
                    hi = x + step
                    break
                lo = x + step
                step *= 2
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        bits[0] = mid
        if g * scratch[0] - c > 0.0:
            hi = mid
        else:
            lo = mid
    bits[0] = hi
    return scratch[0]


@njit(cache=True)
def _least_to_extend(
    gain: np.ndarray, cost: np.ndarray, m: int, ratio: np.ndarray, scratch: np.ndarray, bits: np.ndarray
) -> float:
    """The least float64 ``s >= 0`` for which some ``j < m`` has ``gain[j] * s - cost[j] > 0`` (+inf:
    none; NaN when a gain is negative or not finite, or a cost not finite: not exact, as where
    ``goodput_best`` may meet a NaN value and stop). Each ``j``'s own
    least ``s`` (``_least_survival``) lies within a few ulps of ``cost[j] / gain[j]``, so it is searched
    only for the ``j`` whose ratio is within a relative 1e-12 of the row's least (far wider than those
    ulps; every ``j`` when that ratio is subnormal, where ulps are not relative); a zero cost needs
    the least ``s`` at the largest gain only (the product rises with the gain); a negative one passes
    at 0. ``ratio``: ``(>= m,) float64`` scratch."""
    least_ratio = math.inf
    zero_gain = 0.0  # the largest gain with a zero cost
    at_zero = False  # a length pays at 0 already (a negative cost): nothing is less
    for j in range(m):
        g = gain[j]
        c = cost[j]
        if not (g >= 0.0 and g < math.inf) or not (c > -math.inf and c < math.inf):
            return math.nan
        at_zero = at_zero or g * 0.0 - c > 0.0
        ratio[j] = math.inf
        if g > 0.0:
            if c == 0.0:
                zero_gain = max(zero_gain, g)
            else:
                ratio[j] = c / g
                least_ratio = min(least_ratio, ratio[j])
    if at_zero:
        return 0.0
    least = math.inf
    if zero_gain > 0.0:
        least = _least_survival(zero_gain, 0.0, scratch, bits)
    bound = least_ratio * (1.0 + 1e-12) if least_ratio > 1e-290 else math.inf
    for j in range(m):
        if ratio[j] <= bound and gain[j] > 0.0 and cost[j] != 0.0:
            least = min(least, _least_survival(gain[j], cost[j], scratch, bits))
    return least


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
    out: np.ndarray,
) -> bool:
    """``GoodputPolicy._refresh``'s tables for a horizon of ``H`` = ``unseen.size`` lengths, written
    into ``out`` (``(goodput_table_size(H),) float64``; its parts: ``goodput_table_views``).

    Args:
        unseen: ``(H,) float64`` the estimate for an undrafted token at positions 1..H.
        first_tokens / first_passes: tokens and passes of a round's first chunk (``first_chunk``'s
            numerator and denominator); later_tokens / later_passes: of a later chunk.
        token_ms: ms per added token (verification slope + drafting ms per token);
            draft_ms_per_token: drafting ms per token; pass_ms: ms of a later drafter pass;
            verify_step: a draft's verification step (ms); first_pass: what the round's first pass
            costs beyond a later one (ms); lam: ``lambda``, tokens per ms.
        out: the output buffer, float64.
    Returns:
        Whether ``go_on`` is exact for every row (False when a row's gains or first costs hold a
        NaN, an infinite or a negative gain: then it must not be used). The views:
        ``unseen_gain[k, j]`` = the sum over ``i <= j`` of the product of ``unseen[k .. k + i]``
        (ones past ``H``); ``cost_later[r, m - 1]`` = ``lam`` x the ms of adding ``m`` tokens with
        ``r`` decoded ahead; ``cost_first`` = a round's first chunk's; the probe's the same without
        the verification's ms; ``go_on[k]`` = the least survival ``s >= 0`` for which some length
        ``L`` in ``k+1..H`` has ``unseen_gain[k, L - k - 1] * s - cost_later[0, L - k - 1] > 0``
        (+inf: none) -- ``goodput_best(unseen_gain[k], cost_later[0], s, H - k)``'s ``positive``
        is ``s >= go_on[k]``, to the last bit (module docstring).
    """
    H = unseen.size
    gain = out[: H * H].reshape((H, H))
    at = H * H
    cost_later = out[at : at + (H + 1) * H].reshape((H + 1, H))
    at += (H + 1) * H
    cost_first = out[at : at + H]
    at += H
    probe_later = out[at : at + (H + 1) * H].reshape((H + 1, H))
    at += (H + 1) * H
    probe_first = out[at : at + H]
    go_on = out[at + H : at + 2 * H]
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
    for r in range(H + 1):
        for m in range(1, H + 1):
            passes = later_passes * chunks[max(m - r, 0)]
            cost_later[r, m - 1] = lam * (float(m) * token_ms + passes * pass_ms)
            probe_later[r, m - 1] = lam * (float(m) * draft_ms_per_token + passes * pass_ms)
    for m in range(1, H + 1):
        passes = first_passes + later_passes * first_chunks[m]
        cost_first[m - 1] = lam * (float(m) * token_ms + verify_step + passes * pass_ms + first_pass)
        probe_first[m - 1] = lam * (float(m) * draft_ms_per_token + passes * pass_ms + first_pass)
    exact = True
    scratch = np.empty(1)
    bits = scratch.view(np.int64)
    ratio = np.empty(H)
    for k in range(H):
        go_on[k] = _least_to_extend(gain[k], cost_later[0], H - k, ratio, scratch, bits)
        exact = exact and not math.isnan(go_on[k])
    return exact


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


@njit(cache=True)
def goodput_refresh(
    reached: np.ndarray,
    accepted: np.ndarray,
    confidence_sum: np.ndarray,
    cells: np.ndarray,
    edges: np.ndarray,
    bin_prior: np.ndarray,
    s0: float,
    s1: float,
    prior_acceptance: float,
    conf: np.ndarray,
    counts: np.ndarray,
    position_bins: np.ndarray,
    p_rows: np.ndarray,
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
    out: np.ndarray,
) -> bool:
    """``GoodputPolicy._refresh`` in one call: the drafts verified since the last refresh counted into
    the calibration (``calibration_count``: ``conf``, their reached tokens' confidences in order,
    ``(n,) float64``; ``counts`` ``(2, d) int64``, each draft's reached tokens and accepted length),
    its estimates (``calibration_estimates``) laid out by draft position -- ``p_rows[i]`` ``(H,
    confidence bins)`` and ``unseen[i]`` ``(H,)`` are the estimates of position bin
    ``position_bins[i]`` -- and the decision tables from ``unseen`` into ``out`` (``goodput_tables``,
    whose result it returns). The arguments up to ``prior_acceptance`` are the calibration's
    (``AcceptanceCalibration.kernel_args``: its counts are written in place), those from
    ``first_tokens`` on ``goodput_tables``'. The same operations as the calls it joins, in the same
    order: the same counts, estimates and tables to the last bit."""
    if counts.shape[1]:
        calibration_count(reached, accepted, confidence_sum, cells, edges, conf, counts[0], counts[1])
    table, unseen_q = calibration_estimates(reached, accepted, bin_prior, s0, s1, prior_acceptance)
    for i in range(position_bins.size):
        q = position_bins[i]
        p_rows[i, :] = table[q, :]
        unseen[i] = unseen_q[q]
    return goodput_tables(
        unseen,
        first_tokens,
        first_passes,
        later_tokens,
        later_passes,
        token_ms,
        draft_ms_per_token,
        pass_ms,
        verify_step,
        first_pass,
        lam,
        out,
    )
