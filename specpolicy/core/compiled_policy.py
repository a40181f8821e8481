"""Compiled host kernels of the length policies (issue 48, item 5: host work per round): ``numba``
``njit`` functions, compiled on first call and cached on disk (``cache=True``), as
``specpolicy.core.compiled``'s searches are.

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
