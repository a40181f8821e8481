"""Calibrated acceptance probabilities: how a drafted token's confidence and its position in the
draft map to the probability that the target accepts it, given that every earlier token of the
draft was accepted.

The quantity. For a round that drafted ``k`` tokens with confidences ``c_1..c_k`` and had ``a``
of them accepted, the tokens ``1..min(a + 1, k)`` were *reached* (all earlier tokens accepted);
of those, ``1..a`` were accepted and token ``a + 1`` (if drafted) was rejected; the tokens after
it are unobserved. The estimate is

    p(c, i) = P(token i accepted | tokens 1..i-1 accepted, its confidence c),

the per-position conditional acceptance probability with which the expected number of tokens a
round emits is ``1 + sum_j prod_{i<=j} p_i`` (SpecDec++, Huang et al. 2024, arXiv 2405.19715,
§3: the acceptance events of a draft form a Markov chain; the stop rule needs exactly these
conditional probabilities, which SpecDec++ predicts with a trained head -- here they are counted
online from verified rounds instead).

Method: histogram binning (Zadrozny & Elkan 2001, "Obtaining calibrated probability estimates
from decision trees and naive Bayesian classifiers") over a grid of confidence bins x position
bins, with Beta pseudo-counts (empirical-Bayes shrinkage) in two levels so that the estimate is
sensible before data arrives and where a cell is sparse:

* confidence bin ``b``, pooled over positions: ``p_b = (A_b + s0 * m_b) / (R_b + s0)``, where
  ``A``/``R`` count accepted/reached tokens and the prior mean ``m_b`` is the bin's midpoint
  confidence (before any data, a token's acceptance probability is its confidence: the
  drafter's own belief, the stand-in ``policy=specdecpp`` uses);
* cell (position bin ``q``, confidence bin ``b``): ``p_qb = (A_qb + s1 * p_b) / (R_qb + s1)``;
* a position whose token is not drafted yet (its confidence unknown): ``u_q = (A_q + s1 * u) /
  (R_q + s1)`` with ``u = (A + s0 * prior_acceptance) / (R + s0)`` pooled over everything.

``s0 = prior_strength`` and ``s1 = position_strength`` are pseudo-counts (tokens). Counts are
plain sums (no forgetting), so the estimate converges to the observed conditional acceptance of
each cell. Everything is on the host: ``observe`` counts a batch of drafts and the estimates are
computed in one compiled call each (``specpolicy.core.compiled_policy``: the numpy rule they
replaced, the same floats), the lookups are a few vectorised operations; never a per-token Python loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from specpolicy.core.compiled_policy import calibration_count, calibration_estimates

#: Left edges of the confidence bins (the last bin is [0.99, 1]): tenths, finer close to 1, where
#: most tokens of a good drafter lie and acceptance changes fastest.
CONFIDENCE_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
#: First draft position (1-based) of each position bin; the last bin holds every later position.
POSITION_STARTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 25, 33, 49)
#: Draft positions whose bins are precomputed (longer drafts widen the table on first sight).
MAX_POSITION = 256
#: How the ``goodput`` policy feeds its calibration: each of the first ``BATCH_WARMUP`` verified
#: rounds at once, then batches of ``BATCH_ROUNDS`` rounds (``observe_many``: the fixed cost of
#: the numpy calls is paid once per batch; ``online_predictions`` replays the same schedule).
BATCH_WARMUP = 32
BATCH_ROUNDS = 8


class AcceptanceCalibration:
    """Online binned estimate of ``p(c, i)`` (see the module docstring).

    Args:
        prior_strength: ``s0``, pseudo-tokens of the prior per confidence bin, > 0 (default 4).
        position_strength: ``s1``, pseudo-tokens tying a position bin to the pooled estimate, > 0
            (default 8).
        prior_acceptance: prior mean acceptance of a position not drafted yet, in [0, 1] (default 0.5).
        confidence_edges: left edges of the confidence bins, increasing, starting at 0.
        position_starts: first position of each position bin, increasing, starting at 1.
    Raises:
        ValueError: naming the argument when out of range.
    """

    def __init__(
        self,
        prior_strength: float = 4.0,
        position_strength: float = 8.0,
        prior_acceptance: float = 0.5,
        confidence_edges: Sequence[float] = CONFIDENCE_EDGES,
        position_starts: Sequence[int] = POSITION_STARTS,
    ) -> None:
        for key, value in (("prior_strength", prior_strength), ("position_strength", position_strength)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{key} must be a number > 0, got {value!r}")
        if (
            isinstance(prior_acceptance, bool)
            or not isinstance(prior_acceptance, (int, float))
            or not 0.0 <= prior_acceptance <= 1.0
        ):
            raise ValueError(f"prior_acceptance must be in [0, 1], got {prior_acceptance!r}")
        edges = np.asarray(confidence_edges, dtype=np.float64)
        if edges.ndim != 1 or edges.size < 1 or edges[0] != 0.0 or np.any(np.diff(edges) <= 0) or edges[-1] >= 1.0:
            raise ValueError(f"confidence_edges must increase from 0 and stay below 1, got {list(confidence_edges)}")
        starts = np.asarray(position_starts, dtype=np.int64)
        if starts.ndim != 1 or starts.size < 1 or starts[0] != 1 or np.any(np.diff(starts) <= 0):
            raise ValueError(f"position_starts must increase from 1, got {list(position_starts)}")
        self.prior_strength = float(prior_strength)
        self.position_strength = float(position_strength)
        self.prior_acceptance = float(prior_acceptance)
        self.confidence_edges = edges
        self._edges_past_first = np.ascontiguousarray(edges[1:])  # ``confidence_bin``'s edges
        self.position_starts = starts
        #: prior mean of each confidence bin: its midpoint.
        self.bin_prior = (edges + np.append(edges[1:], 1.0)) / 2.0
        shape = (starts.size, edges.size)
        self._cells = self.position_bin(np.arange(1, MAX_POSITION + 1)) * edges.size  # row offsets, positions 1..
        self.reached = np.zeros(shape)  # tokens reached (earlier ones all accepted), per (position bin, confidence bin)
        self.accepted = np.zeros(shape)  # of those, accepted
        self.confidence_sum = np.zeros(shape)  # sum of their confidences (for plots: mean confidence of a bin)
        self._table: np.ndarray | None = None  # cached estimates (position bin, confidence bin)
        self._unseen: np.ndarray | None = None  # cached estimates per position bin (confidence unknown)

    # -- data ----------------------------------------------------------------------------------

    def confidence_bin(self, confidences: np.ndarray) -> np.ndarray:
        """Bin index of each confidence (``(n,) float`` -> ``(n,) int64``; below 0 counts as 0, above 1 as 1)."""
        return np.searchsorted(self.confidence_edges[1:], confidences, side="right")  # edges <= c, past the first

    def position_bin(self, positions: np.ndarray) -> np.ndarray:
        """Bin index of each 1-based draft position (``(n,) int`` -> ``(n,) int64``)."""
        return np.searchsorted(self.position_starts, np.maximum(np.asarray(positions), 1), side="right") - 1

    def observe(self, confidences: Sequence[float] | np.ndarray, accepted_length: int) -> None:
        """Count one verified draft: ``confidences`` of its drafted tokens in order (``(k,)``),
        ``accepted_length`` of them accepted (0..k). Tokens after the first rejection are
        unobserved and not counted.

        Raises:
            ValueError: for ``accepted_length`` outside ``[0, k]``.
        """
        self.observe_many([(confidences, accepted_length)])

    def observe_many(self, drafts: Iterable[tuple[Sequence[float] | np.ndarray, int]]) -> None:
        """Count several verified drafts at once, each ``(confidences (k,), accepted_length)`` as in
        ``observe``; one set of vectorised operations for all of them (a policy that batches its
        rounds pays the fixed cost of the numpy calls once per batch).

        Raises:
            ValueError: for an ``accepted_length`` outside ``[0, k]`` (nothing is counted then).
        """
        confs, reached, accepted = [], [], []
        for conf, a in drafts:
            conf = np.asarray(conf, dtype=np.float64).reshape(-1)
            k = conf.size
            if not 0 <= a <= k:
                raise ValueError(f"accepted_length must be in [0, {k}] (the draft's length), got {a}")
            r = min(a + 1, k)
            if r:
                confs.append(conf[:r])
                reached.append(r)
                accepted.append(a)
        if not reached:
            return
        lengths = np.array(reached)
        longest = max(reached)
        if longest > self._cells.size:  # a draft longer than any seen so far: widen the offsets
            self._cells = self.position_bin(np.arange(1, 2 * longest + 1)) * self.confidence_edges.size
        # one compiled call: each reached token's flat (position bin, confidence bin) cell counted in
        # reached / accepted / confidence_sum, as np.bincount's per-cell sums added to them
        calibration_count(
            self.reached,
            self.accepted,
            self.confidence_sum,
            self._cells,
            self._edges_past_first,
            np.concatenate(confs),
            lengths,
            np.array(accepted),
        )
        self._table = self._unseen = None

    def kernel_args(self, longest: int = 0) -> tuple:
        """What a compiled call that counts drafts in place and estimates reads
        (``specpolicy.core.compiled_policy.goodput_refresh``: ``policy=goodput``'s refresh, the counting of
        ``observe_many`` and the estimates of ``table()`` / ``unseen()`` in one call): ``(reached,
        accepted, confidence_sum, cell offsets, edges past the first, bin_prior, prior_strength,
        position_strength, prior_acceptance)``, the cell offsets covering drafts of ``longest`` reached
        tokens (widened as ``observe_many`` widens them). The cached estimates are dropped: the counts
        are about to change."""
        if longest > self._cells.size:  # a draft longer than any seen so far: widen the offsets
            self._cells = self.position_bin(np.arange(1, 2 * longest + 1)) * self.confidence_edges.size
        self._table = self._unseen = None
        return (
            self.reached,
            self.accepted,
            self.confidence_sum,
            self._cells,
            self._edges_past_first,
            self.bin_prior,
            self.prior_strength,
            self.position_strength,
            self.prior_acceptance,
        )

    def reset(self) -> None:
        """Forget every observation (back to the prior)."""
        for counts in (self.reached, self.accepted, self.confidence_sum):
            counts.fill(0.0)
        self._table = self._unseen = None

    @property
    def observations(self) -> int:
        """Tokens counted so far (reached tokens)."""
        return int(self.reached.sum())

    # -- estimates -------------------------------------------------------------------------------

    def pooled(self) -> np.ndarray:
        """``(confidence bins,) float64``: ``p_b``, the estimate per confidence bin pooled over positions."""
        s0 = self.prior_strength
        return (self.accepted.sum(axis=0) + s0 * self.bin_prior) / (self.reached.sum(axis=0) + s0)

    def table(self) -> np.ndarray:
        """``(position bins, confidence bins) float64``: ``p_qb`` for every cell (cached until the
        next ``observe``)."""
        if self._table is None:
            self._table, self._unseen = self._estimate()
        return self._table

    def unseen(self) -> np.ndarray:
        """``(position bins,) float64``: ``u_q``, the estimate for a token not drafted yet at each
        position bin (its confidence unknown), cached until the next ``observe``."""
        if self._unseen is None:
            self._table, self._unseen = self._estimate()
        return self._unseen

    def _estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """``(table(), unseen())`` in one compiled call (``calibration_estimates``: the module
        docstring's formulas, element for element)."""
        return calibration_estimates(
            self.reached,
            self.accepted,
            self.bin_prior,
            self.prior_strength,
            self.position_strength,
            self.prior_acceptance,
        )

    def probability(self, confidences: Sequence[float] | np.ndarray, first_position: int = 1) -> np.ndarray:
        """``p(c, i)`` for consecutive draft tokens: ``confidences`` ``(n,)`` of the tokens at
        positions ``first_position .. first_position + n - 1`` (1-based). Returns ``(n,) float64``."""
        conf = np.asarray(confidences, dtype=np.float64).reshape(-1)
        pos = np.arange(first_position, first_position + conf.size)
        return self.table()[self.position_bin(pos), self.confidence_bin(conf)]

    def unseen_curve(self, max_position: int) -> np.ndarray:
        """``(max_position,) float64``: the estimate for an undrafted token at positions ``1..max_position``."""
        return self.unseen()[self.position_bin(np.arange(1, max_position + 1))]

    def reliability(self) -> dict[str, Any]:
        """Per confidence bin, pooled over positions, for reliability diagrams: ``left`` (bin edges),
        ``mean_confidence`` (NaN where empty), ``reached``, ``accepted``, ``observed``
        (accepted / reached, NaN where empty) and ``estimate`` (``p_b``), each ``(bins,)``."""
        reached = self.reached.sum(axis=0)
        accepted = self.accepted.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            observed = np.where(reached > 0, accepted / reached, np.nan)
            mean_conf = np.where(reached > 0, self.confidence_sum.sum(axis=0) / reached, np.nan)
        return {
            "left": self.confidence_edges.copy(),
            "mean_confidence": mean_conf,
            "reached": reached,
            "accepted": accepted,
            "observed": observed,
            "estimate": self.pooled(),
        }

    def __repr__(self) -> str:
        return (
            f"AcceptanceCalibration(prior_strength={self.prior_strength}, position_strength="
            f"{self.position_strength}, prior_acceptance={self.prior_acceptance}, "
            f"observations={self.observations})"
        )


def calibration_from_rounds(rounds: Sequence[Any], **kwargs: Any) -> AcceptanceCalibration:
    """An ``AcceptanceCalibration`` fed with recorded rounds (``RoundRecord``s, e.g. a run's
    ``specpolicy.analysis.results.Run.rounds``), the drafter's own tokens only (draft-reuse tokens at the
    end excluded), as a policy that saw those rounds would hold it. ``kwargs`` go to the
    constructor."""
    cal = AcceptanceCalibration(**kwargs)
    for r in rounds:
        own = r.speculation_length - r.reused_tokens
        if 0 < own <= len(r.confidences):
            cal.observe(r.confidences[:own], min(r.accepted_length, own))
    return cal


def online_predictions(
    rounds: Sequence[Any], warmup: int = BATCH_WARMUP, batch: int = BATCH_ROUNDS, **kwargs: Any
) -> dict[str, np.ndarray]:
    """Prequential (predict, then learn) evaluation of the calibration on recorded rounds
    (``RoundRecord``s), in order: for every reached draft token (the drafter's own tokens, up to
    and including the first rejected one), the probability an ``AcceptanceCalibration`` gave it
    when it had counted the EARLIER rounds as the ``goodput`` policy counts them -- each of the
    first ``warmup`` rounds at once, later ones in batches of ``batch`` rounds, a prompt's final
    round (``finish_reason`` set: the loop ends before the policy's ``update``) never -- so these
    are the probabilities the policy decided with (for a policy that keeps its calibration across
    prompts, ``keep_across_prompts``, was built with the same ``kwargs`` and saw these rounds in
    one run, not resumed); next to each, the token's raw confidence and whether it was accepted.
    ``kwargs`` go to the constructor.

    Returns:
        ``{"predicted", "confidence", "position", "accepted"}``, each ``(n,)`` (float64, float64,
        int64, bool), n = reached tokens over all rounds.
    """
    cal = AcceptanceCalibration(**kwargs)
    parts: dict[str, list[np.ndarray]] = {"predicted": [], "confidence": [], "position": [], "accepted": []}
    pending: list[tuple[np.ndarray, int]] = []
    learned = since = 0  # rounds learned from, and since the last batch was counted
    for r in rounds:
        own = r.speculation_length - r.reused_tokens
        conf = np.asarray(r.confidences[: max(own, 0)], dtype=np.float64)
        final = bool(getattr(r, "finish_reason", ""))
        if own > 0 and conf.size == own:
            a = min(r.accepted_length, own)
            reached = min(a + 1, own)
            parts["predicted"].append(cal.probability(conf[:reached], 1))
            parts["confidence"].append(conf[:reached])
            parts["position"].append(np.arange(1, reached + 1))
            parts["accepted"].append(np.arange(reached) < a)
            if not final:
                pending.append((conf, a))
        if final:
            continue
        learned += 1
        since += 1
        if learned <= warmup or since >= batch:
            cal.observe_many(pending)
            pending, since = [], 0
    empty = {"predicted": np.float64, "confidence": np.float64, "position": np.int64, "accepted": bool}
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=empty[k]) for k, v in parts.items()}


def reliability(predicted: np.ndarray, accepted: np.ndarray, bins: int = 10) -> dict[str, np.ndarray | float]:
    """Reliability diagram data: ``predicted`` probabilities ``(n,)`` in equal-width bins over [0, 1]
    against the observed frequency of ``accepted`` ``(n,) bool``.

    Returns:
        ``{"mean_predicted", "observed", "count"}`` per non-empty bin, and ``"ece"``: the expected
        calibration error, sum over bins of count / n x |observed - mean predicted| (0 for no data).
    """
    predicted = np.asarray(predicted, dtype=np.float64)
    accepted = np.asarray(accepted, dtype=np.float64)
    idx = np.minimum((predicted * bins).astype(np.int64), bins - 1)
    count = np.bincount(idx, minlength=bins).astype(np.float64)
    keep = count > 0
    mean_pred = np.bincount(idx, weights=predicted, minlength=bins)[keep] / count[keep]
    observed = np.bincount(idx, weights=accepted, minlength=bins)[keep] / count[keep]
    n = count.sum()
    ece = float((count[keep] / n * np.abs(observed - mean_pred)).sum()) if n else 0.0
    return {"mean_predicted": mean_pred, "observed": observed, "count": count[keep], "ece": ece}
