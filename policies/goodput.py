"""``goodput`` policy: cost-aware speculation length from calibrated acceptance probabilities.

Derivation. Let ``p_i`` be the probability that draft token ``i`` is accepted given that tokens
``1..i-1`` were (SpecDec++, Huang et al. 2024, arXiv 2405.19715, §3: the acceptance events of a
draft form a Markov chain and these conditionals drive the optimal stop rule). A round that
verifies a draft of length ``L`` emits

    E[emitted | L] = 1 + sum_{j<=L} prod_{i<=j} p_i          (accepted tokens + correction/bonus)

tokens and costs ``C(L) = drafter passes(L) x ms per pass + verify_ms(L)``. Decoding is a
sequence of rounds, so the quantity to maximise is the run's throughput, tokens per ms =
``sum emitted / sum ms``. By the renewal-reward theorem a length rule maximises it iff it
maximises ``E[emitted] - lambda* E[ms]`` in every round, where ``lambda*`` is the best throughput
(Dinkelbach 1967's parametric form of a ratio objective). Hence the decision, taken before the
first chunk and after every chunk: with the draft at ``k`` tokens (their ``p_i`` known from
their confidences) and the drafter's decoded frontier at ``F >= k`` tokens, extend to the
``L > k`` maximising

    gain(L) - lambda * cost(L),    gain(L) = prod_{i<=k} p_i * sum_{j=k+1..L} prod_{i=k+1..j} p_i,
                                   cost(L) = verify_ms(L) - verify_ms(k) + drafting ms of tokens F+1..L,

and stop when no ``L`` has a positive value. The maximum runs over every length up to
``max_length``, not just the next chunk: where a chunk's cost is front-loaded (Fast-dLLM spends
one pass for a whole small block) the first token of a chunk may not pay for its pass while
the chunk does. Positions not drafted yet take the calibration's estimate for an undrafted
token at that position; sunk costs (passes already spent) play no part. ``lambda`` is the
policy's own throughput, an average of emitted tokens over modeled round ms (running mean,
then an exponential moving average with weight ``rate_ema``; shrunk towards plain decoding by
``RATE_PRIOR_ROUNDS`` pseudo-rounds), never below plain decoding's ``1 / verify_ms(0)``:
Dinkelbach's iteration, which climbs from plain decoding's rate to ``lambda*``. (Extending
"while it raises the round's tokens per ms", sunk costs included, is not the same rule: the
threshold would then move with the round's own luck.) Plain decoding (length 0) is one of the
choices: at the empty draft, when no length has a positive value. The returns of extending are diminishing because acceptance
probabilities multiply -- the concavity the FailFast paper (Pan et al., arXiv 2512.20573, §3.1
and §3.2) builds on -- so the best length is where the marginal expected tokens per marginal ms
falls to ``lambda``. FailFast's fixed rule (extend while every confidence >= tau) is the special
case of a cost-free drafter and a step acceptance curve; this policy uses the costs instead.

Chunks follow the drafter, through the ``Draft`` alone: the policy asks for one token past the
drafter's decoded frontier (one AR pass, one Fast-dLLM small block, one suffix-index step); the
tokens the drafter decoded ahead (``Draft.lookahead``: Fast-dLLM's rest of the small block) are
free but for verification, so it takes them as the plan wants. When the drafter reports their
confidences (``Draft.lookahead_confidences``, as Fast-dLLM does) the plan uses their calibrated
``p`` and the answer is, in one step, the decoded-ahead tokens up to the best length -- or all of
them and one token past them (a new chunk) when the best length lies beyond; otherwise it takes
them one at a time while a draft token costs verification time (measured, or the profile's
``verify_ms_per_draft_token``), to see each confidence before adding the next, and all at once
when it costs nothing. Every pass is decided with every confidence seen so far. Tokens per chunk
and passes per chunk are learned from the frontier's advance and ``Draft.forward_passes`` within rounds (the round's first chunk
apart: Fast-dLLM's first small block is partial and carries the block rewrites of the last
commit); later chunks are assumed like the first until one is seen. A fresh policy drafts its
first round (a probe) to learn from; while it keeps speculation off it probes every
``probe_interval`` plain rounds -- two drafted rounds of at least two passes each for a drafter
with passes whose cost is measured, since a round that resumes drafting teaches nothing of a
pass's cost (``GoodputPolicy.update``) and a one-pass round nothing of a pass after the round's
first; one round with a profile's pinned costs or a drafter without passes -- each probe planned
without the measured verification cost so that it measures verifying a draft of the length
acceptance and drafting costs alone would pick (1 to ``PROBE_MAX_LENGTH`` tokens).

Acceptance probabilities: ``specpolicy.core.calibration.AcceptanceCalibration`` (histogram binning
by confidence x position with Beta pseudo-counts; before any data a token's probability is its
confidence), fed with every verified round: each of the first ``REFRESH_WARMUP`` rounds before
the next decision, later ones in batches of ``REFRESH_EVERY`` (so ``policy.calibration`` lags
the rounds by up to that many; ``online_predictions`` replays the schedule). Costs: measured online from ``RoundRecord``
timings by default -- ms of a round's first drafter pass and of each later one (a line fitted
through drafting ms against passes: the first pass also feeds the last round's committed tokens,
a wider pass on the compiled runtime; ms per drafted token for a drafter without passes; not from
a round that resumes drafting, whose first pass also feeds the tokens committed without the
drafter) and verification ms: a plain decoding step (the mean of the rounds
without a draft) and, for a draft of k tokens, that step + a step for any draft + a per-token
slope (an exponentially weighted least-squares fit over the rounds with a draft; ``OnlineCosts``
says why the plain step stands apart), timings winsorised against the current estimates -- or taken from a hardware profile
(``cost_profile=a6000-qwen32b``: the costs ``specpolicy.core.latency`` models with, so the MODELED
figure of a policy tuned to that profile can be computed; null profile fields are measured).
Calibration, costs and throughput carry across prompts (``keep_across_prompts``).

Host work per decision: one read of the new and decoded-ahead confidences (one device sync on an accelerator)
and a few numpy operations on arrays of at most ``max_length`` floats; no per-token Python loop. A decision
after ONE drafted token with nothing decoded ahead (an AR or EAGLE-3 pass) reads its p in Python floats (one
``tolist`` of the confidences, a bisection of the bins' edges, one table lookup) and compares the survival with
``_go_on[k]``, the least survival at which the plan extends a draft of ``k`` tokens (to the last bit: the plan's
answer). The calibration's counting and estimates, the gain curves, the cost tables and ``_go_on`` are built
once per refresh (``_refresh``) in one compiled call (``specpolicy.core.compiled_policy.goodput_refresh``), the
plan's argmax is one compiled call (``goodput_best``): the numpy expressions they replaced, element for element
(bit-identical tables and decisions). The costs' estimates are worked out once per observed round.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from specpolicy.core.acceptance import AcceptanceChoice
from specpolicy.core.calibration import BATCH_ROUNDS, BATCH_WARMUP, AcceptanceCalibration
from specpolicy.core.compiled_policy import goodput_best, goodput_refresh, goodput_table_size, goodput_table_views
from specpolicy.core.latency import BUILTIN_PROFILES, LatencyProfile, load_profile
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "goodput"
#: Forgetting factor of the verification costs (an effective memory of ~50 rounds), applied per
#: round of its own kind: the plain step ages with plain rounds, the drafted rounds' fit with
#: drafted rounds (a long stretch of plain decoding keeps what drafts cost).
VERIFY_DECAY = 0.98
#: Before a drafter pass is measured, a pass is assumed to cost this fraction of a verification
#: (FailFast's A6000 profile: 6.1 ms per drafter pass / 13.5 ms per target step).
PRIOR_PASS_RATIO = 0.45
#: Pseudo-rounds of plain decoding in the throughput average (``GoodputPolicy.rate``).
RATE_PRIOR_ROUNDS = 4
#: Measured timings are clipped to within this factor of the current estimate (winsorised) ...
OUTLIER_FACTOR = 2.0
#: ... once the estimate rests on this many samples.
OUTLIER_WARMUP = 5
#: A probe (a round drafted while the policy keeps speculation off) drafts at most this many
#: tokens: enough lengths to measure the verification's slope, a bounded cost on any hardware.
PROBE_MAX_LENGTH = 8
#: Weight of the newest sample in the drafting-cost averages and in the chunk-size averages.
COST_EMA = 0.1
#: Forgetting factor of the drafting-cost fit (``OnlineCosts.first_pass_ms``), per round with passes:
#: the same memory as ``COST_EMA``'s averages.
DRAFT_DECAY = 1.0 - COST_EMA
#: ... and the spread of pass counts it needs (their weighted variance) before it separates a
#: round's first pass from the later ones.
DRAFT_SPREAD = 0.05
CHUNK_EMA = 0.2
#: The decision tables (calibration, costs, throughput) are rebuilt after each of the first
#: ``REFRESH_WARMUP`` rounds, then every ``REFRESH_EVERY`` rounds: the calibration's batch schedule.
REFRESH_WARMUP = BATCH_WARMUP
REFRESH_EVERY = BATCH_ROUNDS
_NO_CONF = np.zeros(0)  # ``_refresh`` with no round to count: no confidences ...
_NO_COUNTS = np.zeros((2, 0), dtype=np.int64)  # ... and no rounds


class GoodputPolicy(LengthPolicy):
    """Extend the draft while it raises the expected tokens per ms (see the module docstring).

    Each decision reads the confidences drafted since the previous one, multiplies their
    calibrated probabilities into the draft's survival ``prod p_i``, and plans over lengths
    ``k+1..max_length``; it answers 0 (stop; ``draft_stop_reason`` ``"low_confidence"``, or
    ``"policy_bound"`` at ``max_length``) when no length has a positive value, otherwise the
    tokens decoded ahead that the plan wants (``Draft.lookahead``; with their confidences reported,
    all of those up to the best length, plus one token past them for a new chunk when the best
    length lies beyond) or 1 (the next chunk: one token past the drafter's frontier, or the next
    token decoded ahead while draft tokens cost verification time and their confidences are not
    reported). A first answer of 0 is plain decoding.

    Args:
        max_length: longest draft in tokens and the planning horizon, integer >= 1 (default 60).
        cost_profile: None (default: costs measured online from the rounds), the name of a shipped
            latency profile (``a6000-qwen7b``, ``a6000-qwen14b``, ``a6000-qwen32b``, ``measured``)
            or a mapping with the ``profile`` keys; its null latencies are measured online.
        cost_drafter: the drafter whose own pass cost a profile's ``drafter_pass_ms_by_drafter``
            supplies (``LatencyProfile.for_drafter``: DFlash and EAGLE-3 passes cost far less than
            the 1.5B drafter's ``drafter_pass_ms``); the config sets the run's ``drafter.name``. None:
            the profile's ``drafter_pass_ms``.
        keep_across_prompts: keep calibration, costs and throughput from one prompt to the next
            (default True); False forgets them in ``reset()``.
        prior_strength / position_strength / prior_acceptance: the calibration's pseudo-counts and
            prior (``specpolicy.core.calibration.AcceptanceCalibration``; defaults 4, 8, 0.5).
        rate_ema: weight of the newest round in the throughput average, in (0, 1] (default 0.05).
        acceptance: the acceptance estimates the calibration maps to probabilities
            (``specpolicy.core.acceptance``): ``"confidence"`` (default) or ``"head"`` (SpecDec++'s
            trained head on the drafter's last hidden states, in the confidences' place: calibrated
            by head estimate x position, learned online as for confidences).
        acceptance_head: with ``acceptance="head"``, the head's directory (None: the drafter's bundled head).
        probe_interval: while the policy keeps speculation off, draft again after this many plain
            rounds of its choosing to refresh the estimates, integer >= 0 (default 16; 0 = never):
            two rounds of two passes at least when the drafter makes passes whose cost is measured
            (the first resumes drafting and teaches only the verification's cost, the second the
            drafter's: its first pass and a later one), one
            with a profile's costs or a drafter without passes (its ms per drafted token is learned
            from every round).
            A probe round plans without the measured verification cost (what it measures): it
            drafts as long as acceptance and drafting costs alone make worth it, at least one
            token and at most ``PROBE_MAX_LENGTH`` (8); with a profile's pinned verification
            cost it plans as any round.
    Raises:
        ValueError: naming ``policy.<key>`` and its accepted range.
    """

    name = NAME
    #: ``next_length`` answers a round's empty draft in a short branch (False: the general path; tests)
    _short_start = True

    def __init__(
        self,
        max_length: int = 60,
        cost_profile: str | Mapping[str, Any] | None = None,
        keep_across_prompts: bool = True,
        prior_strength: float = 4.0,
        position_strength: float = 8.0,
        prior_acceptance: float = 0.5,
        rate_ema: float = 0.05,
        probe_interval: int = 16,
        cost_drafter: str | None = None,
        acceptance: str = "confidence",
        acceptance_head: str | None = None,
    ) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"policy.max_length must be an integer >= 1, got {max_length!r}")
        if not isinstance(keep_across_prompts, bool):
            raise ValueError(f"policy.keep_across_prompts must be true or false, got {keep_across_prompts!r}")
        if isinstance(rate_ema, bool) or not isinstance(rate_ema, (int, float)) or not 0.0 < rate_ema <= 1.0:
            raise ValueError(f"policy.rate_ema must be in (0, 1], got {rate_ema!r}")
        if isinstance(probe_interval, bool) or not isinstance(probe_interval, int) or probe_interval < 0:
            raise ValueError(f"policy.probe_interval must be an integer >= 0, got {probe_interval!r}")
        try:
            self.calibration = AcceptanceCalibration(prior_strength, position_strength, prior_acceptance)
        except ValueError as exc:
            raise ValueError(f"policy.{exc}") from None
        self.max_length = max_length
        if cost_drafter is not None and not isinstance(cost_drafter, str):
            raise ValueError(f"policy.cost_drafter must be a drafter name or null, got {cost_drafter!r}")
        self.profile = _profile(cost_profile)
        if self.profile is not None:
            self.profile = self.profile.for_drafter(cost_drafter)
        self.cost_drafter = cost_drafter
        self.keep_across_prompts = keep_across_prompts
        self.rate_ema = float(rate_ema)
        self.probe_interval = probe_interval
        self.acceptance_choice = AcceptanceChoice(acceptance, acceptance_head)
        self._head = self.acceptance_choice.wants_head  # fixed at construction: read once, not per decision
        self._positions = np.arange(1, max_length + 1)  # (H,) draft positions 1..H
        self._tables = np.empty(goodput_table_size(max_length))  # the decision tables' buffer (``_refresh``)
        self._p_table = np.empty((max_length, self.calibration.confidence_edges.size))  # (H, bins) p by position
        self._unseen = np.empty(max_length)  # (H,) the estimate for an undrafted token at positions 1..H
        # the bins' edges past the first (``confidence_bin``)
        self._edges = self.calibration.confidence_edges[1:].tolist()
        self._position_bins = self.calibration.position_bin(self._positions)  # (H,) their position bins
        self._fresh()
        self._new_round()

    # -- state -----------------------------------------------------------------------------------

    def _fresh(self) -> None:
        """Estimates back to their priors (calibration, costs, throughput, chunk sizes)."""
        self.calibration.reset()
        self.costs = OnlineCosts(self.profile)
        self.throughput = _RatioOfMeans(self.rate_ema)  # emitted tokens / modeled round ms
        # Chunks (requests past the drafter's decoded frontier): tokens decoded / passes spent, the
        # round's first chunk apart from later ones. Prior: one token for one pass (an AR drafter).
        self.first_chunk = _RatioOfMeans(CHUNK_EMA, numerator=1.0, denominator=1.0)
        self.next_chunk = _RatioOfMeans(CHUNK_EMA, numerator=1.0, denominator=1.0)
        # Consecutive rounds this policy chose plain decoding for; a fresh policy starts with a
        # probe (with no observation at all, one chunk is drafted to learn from).
        self._plain_rounds = self.probe_interval
        # The next drafted round resumes drafting (a prompt's first round, or the first after plain
        # rounds): the drafter's first pass then also feeds the tokens committed without it, so
        # its drafting ms are not what a pass costs (``update``).
        self._resuming = True
        self._probe_again = False  # the last round was a probe that resumed drafting: probe once more
        # passes a probe makes at least: two while a pass's cost is measured, so that it measures a
        # later pass too, not just the round's first (``first_pass_ms``)
        self._probe_passes = 1 if self.costs.drafting_pinned else 2
        # rounds not counted in the calibration yet: their reached tokens' confidences, in order, and
        # per round its reached tokens and accepted length (``_refresh`` counts them in one batch)
        self._pending_conf: list[float] = []
        self._pending_reached: list[int] = []
        self._pending_accepted: list[int] = []
        self._pending_longest = 0  # the most reached tokens of a pending round
        self._rounds = 0  # rounds learned from
        self._updates = 0  # rounds learned from since the tables were rebuilt
        self._stale = True  # the decision tables need rebuilding (``_refresh``)
        self._go_on: list[float] | None = None  # ``_refresh``'s least survivals to extend at (None: plan)

    def _new_round(self) -> None:
        self._seen = 0  # draft tokens whose p is known
        self._survival = 1.0  # prod of their p: P(all of them accepted)
        self._frontier = 0  # tokens the drafter has decoded this round (draft + lookahead)
        self._passes = 0  # drafter passes of the round so far
        self._in_chunk = False  # the last answer asked past the frontier (a new chunk)
        self._chose_plain = False
        self._probing = False  # this round is a probe: its plan leaves out the verification's cost
        self._stop_at = -1  # draft length at which the plan already decided to stop (-1: none)
        # this round's one-token decisions may read ``_go_on`` (set at its empty draft: not a probe,
        # exact thresholds, confidences; cleared once a plan stops at decoded-ahead tokens)
        self._quick = False
        self._estimates: list[float] = []  # acceptance=head: the head's estimate of each drafted token read

    def reset(self) -> None:
        if not self.keep_across_prompts:
            self._fresh()
        self._resuming = True  # a new prompt: the drafter's first pass feeds the prompt
        self._new_round()

    @property
    def rate(self) -> float:
        """``lambda``: tokens per ms, the policy's modeled throughput, at least plain decoding's. The
        average is shrunk towards plain decoding by ``RATE_PRIOR_ROUNDS`` pseudo-rounds (1 token in
        ``verify_ms(0)``), so that the first few rounds do not set it alone."""
        plain_ms = self.costs.verify_ms(0)
        t = self.throughput
        n = min(t.samples, 1.0 / t.weight)  # the average's effective number of rounds
        ms = n * t.denominator + RATE_PRIOR_ROUNDS * plain_ms
        rate = (n * t.numerator + RATE_PRIOR_ROUNDS) / ms if ms > 0.0 else 0.0
        return max(rate, 1.0 / plain_ms)

    def _refresh(self) -> None:
        """Tables for the decisions until the next refresh (estimates change only in ``update``):
        calibrated p by position and confidence bin, the estimate for undrafted positions, and
        ``lambda x`` the ms of adding ``m`` tokens when ``r`` are decoded ahead (verification of the
        ``m`` tokens plus the passes for the ``max(m - r, 0)`` past the frontier; a round's first
        chunk also pays ``verify_step``). A probe round's tables leave the measured verification
        cost out (what the probe measures); a pinned one stays in."""
        cal, conf, counts = self.calibration, _NO_CONF, _NO_COUNTS
        if self._pending_reached:  # the rounds verified since the last refresh, counted in one batch
            if "observe_many" in vars(cal) or type(cal).observe_many is not AcceptanceCalibration.observe_many:
                # a calibration that counts its own way (a subclass, or one frozen by replacing its
                # ``observe_many``, as benchmarks/ceiling.py does): the batch goes through it
                drafts, at = [], 0
                for reached, accepted in zip(self._pending_reached, self._pending_accepted):
                    drafts.append((tuple(self._pending_conf[at : at + reached]), accepted))
                    at += reached
                cal.observe_many(drafts)
            else:
                conf = np.array(self._pending_conf, dtype=np.float64)  # (n,) their reached tokens' confidences
                counts = np.array((self._pending_reached, self._pending_accepted), dtype=np.int64)  # (2, rounds)
        calibration = cal.kernel_args(self._pending_longest)
        self._pending_conf, self._pending_reached, self._pending_accepted = [], [], []
        self._pending_longest = 0
        first = self.first_chunk
        later = self.next_chunk if self.next_chunk.samples else first  # no later chunk seen yet: like the first
        costs = self.costs
        self._token_ms = costs.verify_slope + costs.draft_ms_per_token  # ms per added token
        # one compiled call (``specpolicy.core.compiled_policy.goodput_refresh``; numpy's expressions
        # element for element): the pending rounds counted into the calibration, its estimates by
        # draft position -- ``_p_table`` (H, confidence bins) and ``_unseen`` (H,), the estimate for an
        # undrafted token at positions 1..H -- and the tables: row k of the gain table is
        # cumsum(cumprod(_unseen[k:])) in its first H - k columns; [r, m - 1] of the cost tables is
        # lambda x the ms of adding m = 1..H tokens with r = 0..H decoded ahead (verification of the
        # m tokens plus the passes for the max(m - r, 0) past the frontier); a round's first chunk
        # also pays ``verify_step`` and what its first pass costs beyond a later one (it also feeds
        # the last round's tokens)
        exact = goodput_refresh(  # type: ignore[call-arg]  # (numba's Dispatcher stub: a fixed arity)
            *calibration,
            conf,
            counts,
            self._position_bins,
            self._p_table,
            self._unseen,
            float(first.numerator),
            float(first.denominator),
            float(later.numerator),
            float(later.denominator),
            float(self._token_ms),
            float(costs.draft_ms_per_token),
            float(costs.pass_ms),
            float(costs.verify_step),
            float(costs.first_pass_ms - costs.pass_ms),
            float(self.rate),
            self._tables,
        )
        # views made afresh (a deep copy of the policy copies the buffer, not views of its copy)
        tables = goodput_table_views(self._tables, self.max_length)
        self._unseen_gain, self._cost_later, self._cost_first = tables[:3]
        # a probe round's: without the verification's cost when it is measured (what the probe
        # measures); a profile's pinned cost is known, so a probe plans with it like any round
        if costs.verify_pinned:
            self._probe_cost_later, self._probe_cost_first = self._cost_later, self._cost_first
        else:
            self._probe_cost_later, self._probe_cost_first = tables[3:5]
        # ``_go_on[k]``: the least survival at which a draft of k tokens, nothing decoded ahead and not
        # a probe, extends (``_plan(k, k)`` > k, bit for bit: ``goodput_tables``); None when a row is
        # not exact or the head's estimates take the confidences' place (then every decision plans)
        self._go_on = tables[5].tolist() if exact and not self._head else None
        self._updates = 0
        self._first_plan: int | None = None  # the plan at the empty draft (same until the next refresh)
        self._stale = False

    # -- deciding ----------------------------------------------------------------------------------

    def next_length(self, draft: Draft) -> int:
        k = draft.length
        if k == self._seen + 1 and self._quick and k < self.max_length and not draft.lookahead:
            # one token drafted since the last decision and nothing decoded ahead (an AR or EAGLE-3
            # pass), not a probe: its p from one host read and one lookup in Python floats, and the
            # plan's answer from its table (``_go_on``: ``_plan(k, k)`` > k iff the survival is at
            # least ``_go_on[k]``, to the last bit) -- the path below's decision, without the plan
            c = draft.confidences.tolist()[k - 1]  # one read (a list of <= max_length floats: cheaper than an index)
            self._survival = survival = self._survival * self._p_table.item(k - 1, bisect_right(self._edges, c))
            self._seen = k
            passes = draft.forward_passes
            if self._in_chunk:  # what the chunk just drafted cost (as below)
                (self.next_chunk if self._frontier else self.first_chunk).add(k - self._frontier, passes - self._passes)
            self._frontier, self._passes = k, passes
            if survival >= self._go_on[k]:  # type: ignore[index]
                self._in_chunk = True
                return 1  # one token past the frontier
            self._in_chunk = self._chose_plain = False
            self.draft_stop_reason = "low_confidence"
            return 0
        if k == 0 and self._short_start and not draft.lookahead:  # a round's empty draft: the path below's, in short
            self._new_round()
            if self._head:  # the confidences' estimate keeps nothing between rounds
                self.acceptance_choice.new_round()
            if self._stale:
                self._refresh()
            self._passes = draft.forward_passes
            if self._first_plan is None:  # the empty draft's plan depends on the tables alone
                self._first_plan = self._plan(0, 0)
            if self._first_plan <= 0:
                if not self.probe_interval or (self._plain_rounds < self.probe_interval and not self._probe_again):
                    self.draft_stop_reason = "low_confidence"
                    self._chose_plain = True
                    return 0
                self._probing = True  # a probe (below): its first answer is one chunk all the same
            self._quick = self._go_on is not None and not self._probing
            self._in_chunk = True
            return 1  # one token past the frontier: the drafter decodes a whole chunk
        if k == 0:
            self._new_round()
            if self._head:  # the confidences' estimate keeps nothing between rounds
                self.acceptance_choice.new_round()
            if self._stale:
                self._refresh()
        elif k == self._stop_at:  # the last answer took the decoded-ahead tokens up to the best length
            self.draft_stop_reason = "policy_bound" if k >= self.max_length else "low_confidence"
            return 0
        choice = self.acceptance_choice
        ahead = choice.lookahead_probs(draft) if draft.lookahead else None  # (lookahead,) or None
        if ahead is None and k == self._seen + 1 and k <= self.max_length:
            # one token drafted since the last decision (an AR or EAGLE-3 pass): its p from one host
            # read and one lookup, in Python floats (the same values as the numpy path below: a bin
            # is the count of edges <= c, as ``confidence_bin``'s searchsorted; no numpy call)
            c = choice.probs(draft).tolist()[k - 1]  # one read (a list of <= max_length floats: cheaper than an index)
            if self._head:
                self._estimates[self._seen :] = [c]
            self._survival *= self._p_table.item(self._seen, bisect_right(self._edges, c))
            self._seen = k
        elif k > self._seen or ahead is not None:  # calibrated p of the tokens drafted since the last
            # decision and of the tokens decoded ahead, from one host read
            new = choice.probs(draft)[self._seen : k]
            conf = np.asarray((new if ahead is None else torch.cat((new, ahead))).tolist())
            if self._head:  # the head's estimates take the confidences' place in the calibration
                self._estimates[self._seen :] = conf[: k - self._seen].tolist()
            conf = conf[: self.max_length - self._seen]  # positions past max_length play no part
            rows = self._p_table[self._seen : self._seen + conf.size]  # (n, bins) positions seen+1.., a view
            p = rows[self._positions[: conf.size] - 1, self.calibration.confidence_bin(conf)]
            self._survival *= float(np.prod(p[: k - self._seen]))
            ahead = None if ahead is None else p[k - self._seen :]  # (lookahead,) p of the decoded-ahead tokens
            self._seen = k
        frontier = k + draft.lookahead
        if self._in_chunk:  # what the chunk just drafted cost: learn chunk sizes within rounds
            chunk = self.next_chunk if self._frontier else self.first_chunk
            chunk.add(frontier - self._frontier, draft.forward_passes - self._passes)
        self._frontier, self._passes, self._in_chunk = frontier, draft.forward_passes, False
        if k >= self.max_length:
            self.draft_stop_reason = "policy_bound"
            return 0
        if k == 0:  # the empty draft's plan depends on the tables alone
            if self._first_plan is None:
                self._first_plan = self._plan(0, 0)
            target = self._first_plan
        else:
            target = self._plan(k, frontier, ahead)
            if (
                self._probing
                and not self._resuming  # a round that resumes drafting teaches no pass's cost anyway
                and 0 < draft.forward_passes < self._probe_passes
                and frontier < PROBE_MAX_LENGTH
            ):
                target = max(target, frontier + 1)  # a probe's next pass: one token past the frontier
        if target <= k:
            if k == 0 and self.probe_interval and (self._plain_rounds >= self.probe_interval or self._probe_again):
                # a probe: refresh the estimates after a long stretch of plain decoding, with a draft
                # as long as acceptance and drafting costs alone make worth it (at least one token),
                # so that it also measures what verifying longer drafts costs
                self._probing = True
                target = min(max(self._plan(0, 0), 1), PROBE_MAX_LENGTH)
            else:
                self.draft_stop_reason = "low_confidence"
                self._chose_plain = k == 0
                return 0
        if k == 0:  # the round's one-token decisions may take ``_go_on`` (not in a probe)
            self._quick = self._go_on is not None and not self._probing
        if frontier > k:  # decoded ahead: free but for verification
            if ahead is not None:  # their confidences are known: the ones the plan wants, in one answer,
                if target <= frontier:
                    self._stop_at = target  # the plan stops there: no new decision needed
                    self._quick = False
                    return target - k
                self._in_chunk = True
                return frontier - k + 1  # or all of them and one token past them (a new chunk)
            # unknown confidences: one by one when a token costs verification time, to see each
            # confidence before paying for the next token
            return 1 if self._token_ms > 0.0 else min(target, frontier) - k
        self._in_chunk = True
        return 1  # one token past the frontier: the drafter decodes a whole chunk

    def _plan(self, k: int, frontier: int, ahead: np.ndarray | None = None) -> int:
        """The length ``L`` in ``k..max_length`` maximising ``gain(L) - lambda * cost(L)`` (module
        docstring); ``k`` means stop. Undrafted positions take the calibration's estimate ``u``,
        decoded-ahead ones their calibrated ``p`` when known (``ahead``, ``(m,) float64``, positions
        ``k+1..k+m``): ``gain(L) = survival * sum_{j=k+1..L} prod_{i=k+1..j} p_i``."""
        n = self.max_length - k
        if ahead is not None and ahead.size:
            gain = np.cumsum(np.cumprod(np.concatenate((ahead, self._unseen[k + ahead.size :]))))
        else:  # undrafted positions only: the same curve until the next refresh (``_refresh``)
            gain = self._unseen_gain[k]  # (H,): its first n entries
        first, later = (
            (self._probe_cost_first, self._probe_cost_later) if self._probing else (self._cost_first, self._cost_later)
        )
        cost = first if frontier == 0 else later[min(frontier - k, n)]
        m = min(n, PROBE_MAX_LENGTH - k) if self._probing else n  # a probe drafts at most PROBE_MAX_LENGTH tokens
        if m <= 0:
            return k
        # value = gain * survival - cost over L = k+1..k+m, its first argmax and its sign: one compiled call
        best, positive = goodput_best(gain, cost, self._survival, m)
        return k + best + 1 if positive else k

    # -- learning ----------------------------------------------------------------------------------

    def update(self, record: RoundRecord) -> None:
        """Learn from a verified round: its drafted tokens' confidences and acceptance (queued for
        the calibration), its timings (costs) and its emitted tokens (throughput). The decision
        tables are rebuilt after every round for the first ``REFRESH_WARMUP`` rounds, then every
        ``REFRESH_EVERY`` rounds (each rebuild is a fixed cost of numpy calls).

        A round that resumes drafting with drafter passes -- a prompt's first, or the first after
        plain rounds -- teaches the verification's cost but not a pass's: its first pass also feeds every token
        committed since the drafter last ran (the prompt, or the plain rounds' tokens: EAGLE-3's
        and DFlash's target features, the AR drafter's KV cache), so its ms grow with them. Booked
        as a pass, one such round after a stretch of plain decoding made passes look 10x dearer
        than they are on the compiled runtime (EAGLE-3: 2.2-2.4 ms against about 0.2 ms), and
        the policy never resumed drafting."""
        own = record.speculation_length - record.reused_tokens  # the drafter's own tokens
        self._plain_rounds = self._plain_rounds + 1 if self._chose_plain else 0
        passes = record.drafter_forward_passes
        # a round that resumed drafting with passes: its first pass also fed the catch-up
        caught_up = self._resuming and passes > 0
        # still resuming after a plain round, or after a round in which the drafter did not run
        self._resuming = self._chose_plain or (self._resuming and own == 0 and passes == 0)
        # a probe that caught up measured no pass: the next round probes too (two rounds a probe)
        self._probe_again = self._probing and caught_up and not self.costs.drafting_pinned
        self._chose_plain = False
        if 0 < own <= len(record.confidences):  # queued for the calibration (``observe_many``'s counting)
            seen = record.confidences
            if self._head:  # the head's estimates, the confidence where none was read
                seen = tuple(self._estimates[:own]) + seen[len(self._estimates[:own]) : own]
            accepted = min(record.accepted_length, own)
            reached = min(accepted + 1, own)  # tokens reached: every earlier one accepted
            self._pending_conf.extend(seen[:reached])
            self._pending_reached.append(reached)
            self._pending_accepted.append(accepted)
            if reached > self._pending_longest:
                self._pending_longest = reached
        self.costs.observe(record, drafting=not caught_up)
        self.throughput.add(record.emitted_tokens, self.costs.round_ms(record))
        self._updates += 1
        self._rounds += 1
        if self._rounds <= REFRESH_WARMUP or self._updates >= REFRESH_EVERY:
            self._stale = True

    def __repr__(self) -> str:
        profile = self.profile.name if self.profile else None
        return (
            f"GoodputPolicy(max_length={self.max_length}, cost_profile={profile!r}, "
            f"keep_across_prompts={self.keep_across_prompts}, prior_strength={self.calibration.prior_strength}, "
            f"position_strength={self.calibration.position_strength}, "
            f"prior_acceptance={self.calibration.prior_acceptance}, rate_ema={self.rate_ema}, "
            f"probe_interval={self.probe_interval}, cost_drafter={self.cost_drafter!r})"
        )


class OnlineCosts:
    """Round costs in ms, measured from ``RoundRecord`` timings or pinned by a latency profile.

    * ``pass_ms`` and ``first_pass_ms``: drafting ms of a drafter pass after the round's first,
      and of the round's first pass, which also feeds the tokens the last round committed (the
      AR drafter's accepted tokens and bonus token, EAGLE-3's and DFlash's target features): on
      the compiled runtime a wider pass than the next ones (the AR drafter here: about 1 ms
      against 0.35 ms). Least squares of ``draft_ms`` on ``drafter_forward_passes`` over the
      rounds with passes (but those ``observe`` is told not to learn drafting from:
      ``GoodputPolicy.update``'s rounds that resume drafting), each weighted ``DRAFT_DECAY **
      age``: ``pass_ms`` the slope, ``first_pass_ms`` the line at one pass. Until the recent rounds'
      pass counts spread (a weighted variance of at least ``DRAFT_SPREAD``), or when the slope is
      under a tenth of the ratio below, both are the ratio of averages of the two (profile: both
      ``drafter_pass_ms``). Before any is measured: ``PRIOR_PASS_RATIO x
      verify_ms(0)``.
    * ``draft_ms_per_token``: drafting ms per drafted token of rounds without passes (model-free
      drafters); 0 with a profile's ``drafter_pass_ms`` (the profile models passes only).
    * ``verify_ms(0) = verify_base``: a plain decoding step, the mean ms of the rounds without a
      draft, each weighted ``VERIFY_DECAY ** age`` (profile: ``target_ms_per_token``); before any
      such round, the drafted rounds' fit at 0.
    * ``verify_ms(k > 0) = verify_base + verify_step + verify_slope * k``: least squares over the
      rounds WITH a draft, each weighted ``VERIFY_DECAY ** age`` (profile:
      ``verify_ms_per_draft_token``, no step); the slope is clamped at >= 0 and is 0 until two
      draft lengths were seen; ``verify_step`` >= 0 is what the fit's intercept lies above the
      plain step (0 with a profile, or until both kinds of round were seen). The plain step
      stands apart because on a CPU a forward over 2 positions costs far more than over 1 (the
      bundled target: about 4 ms against 5.5-6 ms, then about 0.25 ms per further position): one
      line through both kinds of round reads that jump as a steep per-token slope, and with a
      few short drafts among many plain rounds it kept a cheap AR drafter's speculation off for
      whole runs. Before any round: 1 ms, no step, no slope.

    Timings have heavy tails (a scheduler stall, a garbage collection): after ``OUTLIER_WARMUP``
    samples each new one is clipped to within ``OUTLIER_FACTOR`` times the current estimate
    (winsorised) before it enters an average or the fit, so one stall does not set the costs of
    the next rounds. The estimates are plain attributes, worked out after each observation
    (``_derive``): read them, never set them.

    Args:
        profile: the pinned latencies (None: measure everything).
    """

    def __init__(self, profile: LatencyProfile | None = None) -> None:
        self._pinned_pass = profile.drafter_pass_ms if profile else None
        self._pinned_base = profile.target_ms_per_token if profile else None
        self._pinned_slope = profile.verify_ms_per_draft_token if profile else None
        self._pass = _RatioOfMeans(COST_EMA)  # draft ms / passes
        self._draft_sums = (0.0, 0.0, 0.0, 0.0, 0.0)  # decayed sums of 1, x, y, x^2, x*y (x = passes, y = draft ms)
        self._draft_line: tuple[float, float] | None = None  # (ms at one pass, ms per further pass), when fitted
        self._token = _RatioOfMeans(COST_EMA)  # draft ms / drafted tokens (rounds without passes)
        self._plain = (0.0, 0.0)  # decayed sums of 1, y over the rounds without a draft (y = verify ms)
        self._sums = (0.0, 0.0, 0.0, 0.0, 0.0)  # decayed sums of 1, x, y, x^2, x*y over drafted rounds (x = length)
        self._fitted = (1.0, 0.0)  # (intercept, slope) of the drafted rounds' verification fit
        self._derive()

    def _derive(self) -> None:
        """The estimates (``pass_ms``, ``first_pass_ms``, ``draft_ms_per_token``, ``verify_base``,
        ``verify_step``, ``verify_slope``: the class docstring's), worked out once per observation into
        plain attributes (a round reads them several times, a refresh once more)."""
        w, sy = self._plain
        plain = sy / w if w > 0.0 else None  # the measured plain step's ms, None before any plain round
        if self._pinned_base is not None:
            self.verify_base = self._pinned_base
        else:
            self.verify_base = plain if plain is not None else self._fitted[0]
        if self._pinned_slope is not None or plain is None or self._sums[0] == 0.0:
            self.verify_step = 0.0  # what the drafted rounds' fit lies above the MEASURED plain step, >= 0
        else:
            self.verify_step = max(self._fitted[0] - plain, 0.0)
        self.verify_slope = self._pinned_slope if self._pinned_slope is not None else self._fitted[1]
        if self._pinned_pass is not None:
            self.pass_ms = self.first_pass_ms = self._pinned_pass
            self.draft_ms_per_token = 0.0
            return
        if self._draft_line is not None:
            self.first_pass_ms, self.pass_ms = self._draft_line
        else:
            self.pass_ms = self._pass.ratio if self._pass.samples else PRIOR_PASS_RATIO * self.verify_base
            self.first_pass_ms = self.pass_ms
        self.draft_ms_per_token = self._token.ratio if self._token.samples else 0.0

    @property
    def drafting_pinned(self) -> bool:
        """Whether a profile pins the drafter's cost (then no round teaches it)."""
        return self._pinned_pass is not None

    @property
    def verify_pinned(self) -> bool:
        """Whether a profile pins the verification's per-token cost (then no step is measured)."""
        return self._pinned_slope is not None

    def verify_ms(self, length: int) -> float:
        """Verification ms of a draft of ``length`` tokens (0: a plain decoding step)."""
        if length == 0:
            return self.verify_base
        return self.verify_base + self.verify_step + self.verify_slope * length

    def round_ms(self, record: RoundRecord) -> float:
        """The modeled ms of a recorded round (its passes, drafted tokens and length)."""
        own = record.speculation_length - record.reused_tokens
        passes = record.drafter_forward_passes
        first = self.first_pass_ms - self.pass_ms if passes > 0 else 0.0
        k = record.speculation_length
        verify = self.verify_base if k == 0 else self.verify_base + self.verify_step + self.verify_slope * k
        return passes * self.pass_ms + first + own * self.draft_ms_per_token + verify

    def observe(self, record: RoundRecord, drafting: bool = True) -> None:
        """Learn from one round's timings (rounds without timings, e.g. hand-built ones, teach nothing);
        ``drafting=False``: its verification only (its drafting ms are not those of its passes)."""
        own = record.speculation_length - record.reused_tokens
        if drafting and record.draft_ms > 0.0:
            passes = record.drafter_forward_passes
            average, units = (self._pass, passes) if passes > 0 else (self._token, own)
            if units > 0:
                expected = units * average.ratio
                if passes > 0 and self._draft_line is not None:  # against the fitted line
                    expected = self._draft_line[0] + (passes - 1) * self._draft_line[1]
                y = _winsorised(record.draft_ms, expected, average.samples)
                average.add(y, units)
                if passes > 0:
                    self._fit_drafting(float(passes), y)
        if record.verify_ms > 0.0:
            k = record.speculation_length
            d = VERIFY_DECAY  # a few scalars: Python floats are cheaper here than a numpy call
            if k == 0:  # winsorised against the measured plain step (not a pinned one)
                w, sy = self._plain
                y = _winsorised(float(record.verify_ms), sy / w if w > 0.0 else 0.0, w)
                self._plain = (d * w + 1.0, d * sy + y)
            else:
                x = float(k)  # winsorised against the drafted rounds' own line
                intercept, slope = self._fitted
                y = _winsorised(float(record.verify_ms), intercept + slope * x, self._sums[0])
                self._sums = w, sx, sy, sxx, sxy = _decayed_sums(self._sums, x, y, d)
                var = w * sxx - sx * sx
                slope = max((w * sxy - sx * sy) / var, 0.0) if var > 1e-9 * w * w else 0.0
                self._fitted = (max((sy - slope * sx) / w, 1e-6), slope)
        self._derive()

    def _fit_drafting(self, x: float, y: float) -> None:
        """Add a round of ``x`` passes and ``y`` drafting ms to the drafting fit (``first_pass_ms``)."""
        self._draft_sums = w, sx, sy, sxx, sxy = _decayed_sums(self._draft_sums, x, y, DRAFT_DECAY)
        var = w * sxx - sx * sx
        self._draft_line = None
        # two pass counts, each in a real share of the recent rounds (a weighted variance of the pass
        # counts of 0.05: 5% of the rounds one pass away from the rest), not one old round; a slope
        # under a tenth of the mean ms per pass is read as noise (later passes nearly free), not cost
        if var >= DRAFT_SPREAD * w * w:
            slope = (w * sxy - sx * sy) / var
            if slope >= 0.1 * self._pass.ratio:
                self._draft_line = (max((sy - slope * sx) / w + slope, slope), slope)

    def __repr__(self) -> str:
        return (
            f"OnlineCosts(pass_ms={self.pass_ms:.3g}, first_pass_ms={self.first_pass_ms:.3g}, "
            f"draft_ms_per_token={self.draft_ms_per_token:.3g}, "
            f"verify_base={self.verify_base:.3g}, verify_step={self.verify_step:.3g}, "
            f"verify_slope={self.verify_slope:.3g})"
        )


def _decayed_sums(
    sums: tuple[float, float, float, float, float], x: float, y: float, decay: float
) -> tuple[float, float, float, float, float]:
    """The sums ``(1, x, y, x^2, x*y)`` of an exponentially weighted least-squares line, the older
    samples weighted ``decay`` once more, with the sample ``(x, y)`` added (Python floats: cheaper
    here than a numpy call)."""
    w, sx, sy, sxx, sxy = sums
    return decay * w + 1.0, decay * sx + x, decay * sy + y, decay * sxx + x * x, decay * sxy + x * y


def _winsorised(sample: float, estimate: float, samples: float) -> float:
    """``sample`` clipped to ``[estimate / OUTLIER_FACTOR, estimate * OUTLIER_FACTOR]`` once the
    estimate rests on ``OUTLIER_WARMUP`` samples (``samples``: their count or total weight)."""
    if samples < OUTLIER_WARMUP or estimate <= 0.0:
        return sample
    low, high = estimate / OUTLIER_FACTOR, estimate * OUTLIER_FACTOR  # min(max(sample, low), high), no builtin calls
    if low > sample:
        sample = low
    return high if high < sample else sample


class _RatioOfMeans:
    """``numerator / denominator`` as a ratio of averages over recent samples: running means over
    the first ``1 / weight`` samples, exponential moving averages with ``weight`` after (so one
    unlucky sample does not stand for the rest). Optional prior values stand until the first sample."""

    def __init__(self, weight: float, numerator: float = 0.0, denominator: float = 0.0) -> None:
        self.weight, self.samples, self.numerator, self.denominator = weight, 0, numerator, denominator

    def add(self, numerator: float, denominator: float) -> None:
        self.samples += 1
        w = 1.0 / self.samples  # max(weight, 1 / samples), without the builtin's call
        if not w > self.weight:
            w = self.weight
        self.numerator += w * (numerator - self.numerator)
        self.denominator += w * (denominator - self.denominator)

    @property
    def ratio(self) -> float:
        return self.numerator / self.denominator if self.denominator > 0.0 else 0.0


def _profile(cost_profile: str | Mapping[str, Any] | None) -> LatencyProfile | None:
    if cost_profile is None:
        return None
    try:
        if isinstance(cost_profile, str):
            return load_profile(cost_profile)
        if isinstance(cost_profile, Mapping):
            return LatencyProfile.from_config(dict(cost_profile))
    except (FileNotFoundError, ValueError) as exc:
        raise ValueError(f"policy.cost_profile: {exc}") from None
    raise ValueError(
        f"policy.cost_profile must be null, a profile name ({', '.join(BUILTIN_PROFILES)}) "
        f"or a mapping of profile keys, got {cost_profile!r}"
    )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``GoodputPolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy", NAME, GoodputPolicy, "cost-aware speculation length from calibrated acceptance probabilities"
        )
    ]
