"""``goodput-batch`` policy: the round's speculation lengths that maximise the batch's goodput.

``goodput`` generalised to a batch (SmartSpec, Liu et al. 2024, arXiv 2406.14066, §4: choose the
lengths that maximise goodput, the expected emitted tokens per unit of time, of the whole batch).
A round of the batched loop with requests ``i = 1..B`` drafting ``k_i`` tokens emits in
expectation ``E = sum_i (1 + sum_{j<=k_i} s_ij)`` tokens, where ``s_ij`` is the probability that
request i's first j draft tokens are all accepted (products of per-position acceptance rates,
learned per request from its verified rounds, shrunk towards the batch's pooled rates, each
pooled position towards the one before it), and
costs ``T = verify_ms(B x (1 + max_i k_i)) + draft_ms(sum_i ceil(k_i / tokens per pass))``: the
batched verification's measured cost as a function of the tokens its pass computes (padded rows;
``specpolicy.core.batch_context.VerifyCost``) and the round's measured drafting cost (every request's
drafting and commit) as a function of the drafter passes of all requests
(``BatchContext.draft_cost``, the same kind of measured curve): a fixed part per round -- the
commits, the first pass's catching up on the committed tokens -- is not charged to each draft
token, which would make drafts too short.
The plan (``plan_round``, once per round for the whole batch):

1. the uniform length ``K`` in ``0..max_length`` with the highest ``E / T`` under the batch's
   pooled rates -- the shortest within ``flat_tolerance`` of it -- (a fixed K, chosen afresh
   every ``replan_interval`` rounds: as the batch grows the slope of
   ``verify_ms`` weighs more and K falls, to 0 -- speculation off -- when no draft token pays
   for its verification). Pooled, not per request: a request's own rates, a few rounds old, are
   noisy, and through the argmax over a flat ``E / T`` their noise pulls K below the optimum;
2. then per request, Dinkelbach's step (as ``goodput``): with ``lambda = E / T`` of that plan,
   request i keeps its first draft tokens while their expected tokens ``s_ij`` (its own rates)
   beat what the batch earns in the drafting time a token costs, ``lambda x`` the drafting
   curve's step per request at ``K`` (their verification is paid by the padded width while
   another request drafts K); the per-request plan is taken when it raises ``E / T`` under the
   requests' own rates.

While the cost fit lacks spread (the first rounds) it tries a spread of lengths
(``WARMUP_LENGTHS``); while speculation is off, every ``probe_interval`` rounds the batch probes
the best speculative length, so acceptance and costs there stay measured. The pooled
acceptance counts belong to the configured policy object and carry across its runs (as
``goodput``'s ``keep_across_prompts``): every request's copy shares them, and a run after a
warm-up, or at another batch size, starts from what the earlier ones learned. The cost curves
are the run's (``BatchContext.verify_cost`` and ``draft_cost``), seeded from the last batched run
of the same policy object that began with as many requests (``VerifyCost.seed``), so only the
first run at a batch size spends rounds on the warm-up lengths (``WARMUP_LENGTHS``; at batch
16, 30 requests of 128 tokens, unseeded warm-up rounds were 7% of all and cost ~3%). In the
batch-1 loop (no batch) the policy plans its own request the same way with its own cost curves,
measured from its rounds and kept across its runs. A uniform K stands ``replan_interval``
rounds while the batch size stays and its verification and drafting were measured (not
extrapolated), then is planned afresh.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from specpolicy.core.batch_context import BatchContext, VerifyCost
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "goodput-batch"
#: Lengths tried in the first rounds, so the verification cost is fitted over a spread of tokens.
WARMUP_LENGTHS = (1, 0, 2, 4, 3, 6)


@dataclass(frozen=True)
class _HeldK:
    """A uniform K that stands while the run (its verification curve) and the batch size stay,
    for ``replan_interval`` rounds from ``planned_round``; ``rate``: its ``E / T`` (tokens / ms)."""

    cost: VerifyCost
    batch: int
    planned_round: int
    k: int
    rate: float


class _Shared:
    """What every request's copy of one configured policy shares: pooled acceptance counts per
    position, the drafter's tokens per pass (one drafter for the whole batch), rounds planned (for
    the probes) and the batch-1 loop's cost curves."""

    def __init__(self, max_length: int) -> None:
        self.accepted = np.zeros(max_length)
        self.tried = np.zeros(max_length)
        self.tokens_per_pass = 1.0  # the most draft tokens one pass has given (a block drafter's block)
        self.rounds = 0
        self.cost = VerifyCost()  # the batch-1 loop's: verification ms against tokens verified
        self.draft_cost = VerifyCost()  # the batch-1 loop's: drafting ms (commit included) against passes
        self.held: _HeldK | None = None  # step 1's K while it stands
        self.curves: dict[int, tuple[VerifyCost, VerifyCost]] = {}  # batch size -> the last batched run's curves


class GoodputBatchPolicy(LengthPolicy):
    """Batch goodput maximisation (see the module docstring).

    Args:
        max_length: longest draft (tokens), >= 1.
        prior_acceptance: acceptance rate of a position before any round, in [0, 1].
        prior_strength: pseudo-rounds of the pooled rate in a request's own estimate (> 0).
        probe_interval: rounds between probes (a round at the best K >= 1) while speculation is off, >= 1.
        flat_tolerance: the uniform K is the SHORTEST whose ``E / T`` is within this share of the
            best, in [0, 1). Near its best ``E / T`` is flat in K (at batch 1 here, K = 5..13
            within 2%), so estimation noise would otherwise move K far; a draft token's cost is
            certain, its gain an estimate.
        replan_interval: rounds a uniform K stands while the batch size stays, >= 1 (1: every
            round). Its estimates move slowly and ``E / T`` is flat near its best, so replanning
            every round buys nothing but the plan's cost (~0.1-0.2 ms, 1-2% of a round at batch 1).
        per_request: take step 2 (each request's own length, from its own rates); False keeps
            the uniform K for every request.
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(
        self,
        max_length: int = 16,
        prior_acceptance: float = 0.6,
        prior_strength: float = 4.0,
        probe_interval: int = 32,
        flat_tolerance: float = 0.01,
        replan_interval: int = 8,
        per_request: bool = False,
    ) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"policy.max_length must be an integer >= 1, got {max_length!r}")
        if not isinstance(prior_acceptance, (int, float)) or not 0.0 <= prior_acceptance <= 1.0:
            raise ValueError(f"policy.prior_acceptance must be a number in [0, 1], got {prior_acceptance!r}")
        if not isinstance(prior_strength, (int, float)) or not prior_strength > 0:
            raise ValueError(f"policy.prior_strength must be a number > 0, got {prior_strength!r}")
        if isinstance(probe_interval, bool) or not isinstance(probe_interval, int) or probe_interval < 1:
            raise ValueError(f"policy.probe_interval must be an integer >= 1, got {probe_interval!r}")
        if (
            isinstance(flat_tolerance, bool)
            or not isinstance(flat_tolerance, (int, float))
            or not 0.0 <= flat_tolerance < 1.0
        ):
            raise ValueError(f"policy.flat_tolerance must be a number in [0, 1), got {flat_tolerance!r}")
        if isinstance(replan_interval, bool) or not isinstance(replan_interval, int) or replan_interval < 1:
            raise ValueError(f"policy.replan_interval must be an integer >= 1, got {replan_interval!r}")
        if not isinstance(per_request, bool):
            raise ValueError(f"policy.per_request must be true or false, got {per_request!r}")
        self.max_length, self.prior_acceptance = max_length, float(prior_acceptance)
        self.per_request, self.replan_interval = per_request, replan_interval
        self.flat_tolerance = float(flat_tolerance)
        self.prior_strength, self.probe_interval = float(prior_strength), probe_interval
        self._shared = _Shared(max_length)
        self.reset()

    def __deepcopy__(self, memo: dict) -> GoodputBatchPolicy:
        """A request's copy: its own state, the configured policy's shared statistics."""
        clone = copy.copy(self)
        for key, value in vars(self).items():
            if key != "_shared":
                setattr(clone, key, copy.deepcopy(value, memo))
        return clone

    def reset(self) -> None:
        """A new request: its own acceptance counts start empty (the pooled ones carry over)."""
        self.accepted = np.zeros(self.max_length)
        self.tried = np.zeros(self.max_length)
        self._planned = 0
        self._drafted_last_round = False

    # -- estimates -----------------------------------------------------------------------------

    def pooled_rates(self) -> np.ndarray:
        """``(max_length,)`` float: the batch's pooled acceptance rate at each position (given the
        earlier ones accepted), each shrunk towards the position before it (the first towards
        ``prior_acceptance``): a position seldom drafted takes its neighbour's rate, not a fixed
        prior that would keep drafts short for want of trying them."""
        s, rates, prior = self._shared, np.empty(self.max_length), self.prior_acceptance
        for j in range(self.max_length):
            prior = rates[j] = (s.accepted[j] + self.prior_strength * prior) / (s.tried[j] + self.prior_strength)
        return rates

    def survival(self, pooled: np.ndarray | None = None) -> np.ndarray:
        """``(max_length,)`` float: the probability that the first j + 1 draft tokens are all
        accepted: this request's rates shrunk towards the pooled ones (``pooled_rates``, computed
        when not given)."""
        pooled = self.pooled_rates() if pooled is None else pooled
        rate = (self.accepted + self.prior_strength * pooled) / (self.tried + self.prior_strength)
        return np.cumprod(rate)

    def passes(self, lengths: np.ndarray) -> np.ndarray:
        """Drafter passes of drafts of ``lengths`` tokens (any shape): ``ceil(length / tokens per pass)``."""
        return np.ceil(np.asarray(lengths, dtype=float) / self._shared.tokens_per_pass)

    # -- the plan --------------------------------------------------------------------------------

    @classmethod
    def plan_round(cls, policies: list[GoodputBatchPolicy], contexts: list[BatchContext]) -> list[int]:
        """The lengths (tokens) of every request this round (see the module docstring)."""
        lead = policies[0]
        shared, cost = lead._shared, contexts[0].verify_cost
        draft_cost = contexts[0].draft_cost or shared.draft_cost
        shared.rounds += 1
        b, horizon = len(policies), lead.max_length
        if contexts[0].draft_cost is not None and cost.samples == 0:  # a batched run's first round:
            if b in shared.curves:  # its curves start from the last run's that began with this many requests
                for curve, earlier in zip((cost, draft_cost), shared.curves[b]):
                    curve.seed(earlier)
            shared.curves[b] = (cost, draft_cost)
        if cost.samples < len(WARMUP_LENGTHS):  # spread the cost fit's samples first
            return [WARMUP_LENGTHS[cost.samples]] * b
        lengths = np.arange(horizon + 1)
        pooled, goodput, held = None, None, shared.held
        if (
            held is not None
            and held.cost is cost
            and held.batch == b
            and shared.rounds - held.planned_round < lead.replan_interval
        ):
            best, rate = held.k, held.rate
        else:
            # the uniform K from the batch's pooled rates: a request's own estimate, a few rounds old,
            # is noisy, and through the argmax over a flat E / T its noise pulls K below the optimum
            # (measured at batch 1: mean K 5.8, 3.40 accepted a round vs K = 6's 3.52)
            pooled = lead.pooled_rates()
            pooled_gain = np.concatenate(([0.0], np.cumsum(np.cumprod(pooled))))  # (horizon + 1,)
            drafting = np.asarray(draft_cost.ms(b * lead.passes(lengths)))  # (horizon + 1,) the round's, every K
            emitted = b * (1 + pooled_gain)
            ms = cost.ms(b * (lengths + 1)) + drafting
            goodput = emitted / ms
            best = int(np.argmax(goodput >= (1.0 - lead.flat_tolerance) * goodput.max()))  # the shortest near the best
            rate = float(goodput[best])
            # a K stands only where the curves were measured: one read off an extrapolation (e.g.
            # beyond the longest drafts of the warm-up) or speculation switched off is checked again
            # next round, by the round it runs or the probe
            measured = best > 0 and b * (best + 1) <= cost.largest and b * lead.passes(best) <= draft_cost.largest
            shared.held = _HeldK(cost, b, shared.rounds, best, rate) if measured else None
        plan = np.full(b, best)
        if best and lead.per_request:
            # Dinkelbach's step per request, on its own rates: below K*, request i keeps draft
            # token j while s_ij beats what the batch earns in the drafting time a token costs (the
            # curve's last step, per request; its verification is paid for by the padded width as
            # long as another request drafts K*)
            pooled = lead.pooled_rates() if pooled is None else pooled
            gain = np.zeros((b, best + 1))  # gain[i, K]: expected accepted tokens of request i drafting K
            gain[:, 1:] = np.cumsum([p.survival(pooled)[:best] for p in policies], axis=1)
            step_ms = draft_cost.ms(b * lead.passes(np.array([best - 1, best])))
            per_token_ms = (step_ms[1] - step_ms[0]) / b
            survive = gain[:, 1:] - gain[:, :-1]  # (b, K*): s_ij
            mine = (survive >= rate * per_token_ms).cumprod(axis=1).sum(axis=1).astype(int)
            mine_ms = cost.ms(b * (int(mine.max(initial=0)) + 1)) + draft_cost.ms(lead.passes(mine).sum())
            uniform_ms = cost.ms(b * (best + 1)) + step_ms[1]
            if (b + gain[np.arange(b), mine].sum()) / mine_ms > (b + gain[:, best].sum()) / uniform_ms:
                plan = mine
        if not best and shared.rounds % lead.probe_interval == 0:
            # speculation is off (a plan of 0 is never held, so ``goodput`` is this round's): the batch
            # probes the best speculative length, so acceptance and the costs there stay measured
            # and an estimate a slow pass inflated gets a fresh sample
            plan[:] = 1 + int(np.argmax(goodput[1:])) if goodput is not None else 1
        return [int(k) for k in plan]

    def next_length(self, draft: Draft) -> int:
        if draft.length == 0:
            if self.batch is not None and self.batch.planned_length is not None:
                self._planned = self.batch.planned_length
            else:  # the batch-1 loop: plan this request alone
                self._planned = self.plan_round([self], [BatchContext(1, 0, self._shared.cost)])[0]
        return max(self._planned - draft.length, 0)

    def update(self, record: RoundRecord) -> None:
        k, a = record.speculation_length, record.accepted_length
        if k:
            seen = min(a + 1, k, self.max_length)
            for counts in (self, self._shared):
                counts.tried[:seen] += 1
                counts.accepted[: min(a, self.max_length)] += 1
            if record.drafter_forward_passes:
                s = self._shared
                s.tokens_per_pass = max(s.tokens_per_pass, k / record.drafter_forward_passes)
                # the batch-1 loop: this request's drafting is the drafting curve's sample, from rounds
                # that follow a drafted one (the first drafted round after the prefill or after plain
                # rounds also catches the drafter up on every position committed meanwhile, e.g.
                # EAGLE-3's pass over the prompt); the batched loop measures whole rounds itself
                if self.batch is None and self._drafted_last_round:
                    s.draft_cost.observe(record.drafter_forward_passes, record.draft_ms)
        self._drafted_last_round = k > 0
        if self.batch is None:  # the batch-1 loop: this request's verifications are the cost samples
            self._shared.cost.observe(k + 1, record.verify_ms)

    def __repr__(self) -> str:
        return (
            f"GoodputBatchPolicy(max_length={self.max_length}, prior_acceptance={self.prior_acceptance}, "
            f"prior_strength={self.prior_strength}, probe_interval={self.probe_interval}, "
            f"flat_tolerance={self.flat_tolerance}, replan_interval={self.replan_interval}, "
            f"per_request={self.per_request})"
        )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``GoodputBatchPolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy", NAME, GoodputBatchPolicy, "the round's speculation lengths that maximise the batch's goodput"
        )
    ]
