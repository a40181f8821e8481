"""The limit: an oracle (hindsight-optimal) length policy for a given drafter.

Definition. Fix a prompt, the target's greedy output ``y`` (``n`` tokens: every lossless
method produces it) and a drafter. For every committed prefix ``y[:i]`` (``0 <= i < n``) let
the *match length* ``M(i)`` be how many leading tokens of the drafter's proposal from ``y[:i]``
equal ``y[i:]`` (capped at ``max_length`` and at ``n - i - 1``). A round that starts at ``i``
with speculation length ``l <= M(i)`` is fully accepted and emits ``l + 1`` tokens (draft +
bonus); proposing more than ``M(i)`` emits ``M(i) + 1`` tokens at a higher cost, so the oracle
never does. With the measured cost of a round ``c(l) = draft_ms(l) + verify_ms(l)``
(``CostModel``), the oracle's time from position ``i`` is

    T(i) = min over 0 <= l <= M(i) of [ c(l) + T(i + l + 1) ],      T(i) = 0 for i >= n,

solved right to left by dynamic programming, O(n * max_length). ``l = 0`` is a plain
decoding round, so the oracle also knows when not to draft. ``T(0)`` is the least time any
length policy could spend with that drafter (and those costs) on that prompt: a policy only
chooses lengths, and in hindsight the best length of a round is one that ends exactly at the
drafter's first wrong token (or earlier, to start a fresh proposal sooner).

Two sources of ``M``:

* ``match_lengths_from_rounds`` -- from a run's recorded rounds alone (``results.jsonl``): a
  round at position ``s`` that accepted ``a`` of ``k`` tokens gives ``M(s + j) = a - j`` for
  ``j = 0..a``, assuming the drafter is *self-consistent* (its proposal from a prefix extended
  by its own accepted tokens is the rest of its earlier proposal: exact for greedy AR drafters,
  approximate for Fast-dLLM and the suffix drafter). A fully accepted round (``a == k``) only
  tells ``M(s) >= k`` and is counted as ``k`` (*censored*), so this oracle is at best as fast as
  the true one and a policy's fraction of it is an UPPER bound on its fraction of the true
  oracle's speedup. It can even be slower than the policy itself (a ratio above 1: lengths the
  run never drafted are costed by extrapolation), and then it bounds nothing. With draft reuse
  the recorded proposals include the reused tokens.
* ``replay_match_lengths`` -- exact: re-runs the drafter through the ``Drafter`` interface at
  every committed prefix (drafting one token at a time until the first mismatch), recording
  the drafter passes each length needs. Costs about ``sum(M(i) + 1)`` drafter passes per prompt.

Costs (``CostModel.fit``): drafter ms per pass = measured drafting ms / drafter passes;
verification ms = an affine least-squares fit over the speculation length of the measured
``verify_ms`` of speculative and vanilla rounds; drafter passes for ``l`` tokens = exact
(replay) or an affine fit over the recorded rounds. A model-free drafter (no passes) costs its
measured drafting ms per proposed token. A policy's speedup as a fraction of the oracle's is
``T_oracle / T_policy`` with the policy's rounds costed by the same model (apples to apples:
it equals modeled speedup of the policy / modeled speedup of the oracle).

The longest speculation the oracle may choose defaults to ``oracle_max_length``: the longest of
``DEFAULT_MAX_LENGTH`` (60, FailFast's N_max default) and the policy's own longest draft.

CLI: ``python -m specpolicy.analysis.oracle RUN_DIR [--max-length N]`` (rounds source) prints the
comparison per run and per prompt and writes ``RUN_DIR/oracle.json``; it is the computation of
``summary.json``'s ``oracle`` block (``analyse``). From a run's own rounds the oracle is censored,
so the printed figure is labelled an upper bound ("at most 0.71 of the oracle's speedup"), and a
ratio above 1 is never printed as a fraction of an optimum (``describe_fraction``);
``benchmarks/peers.py`` replays the drafter for the exact oracle.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, untrusted_reasons
from specpolicy.analysis.results import SUMMARY_FILE, PromptResult, find_runs, read_run, read_summary
from specpolicy.core.latency import NotEstimable, fit_affine, step_problem
from specpolicy.core.types import Draft, GenerationResult, RoundRecord, Verification

#: The oracle may always speculate at least this far (FailFast's N_max default, tokens).
DEFAULT_MAX_LENGTH = 60

DEFINITION = (
    "oracle: for every committed prefix the drafter's match length M(i); T(i) = min over l <= M(i) of "
    "draft_ms(l) + verify_ms(l) + T(i+l+1) (measured costs); fraction = T_oracle / T_policy, same cost model"
)


@dataclass(frozen=True)
class CostModel:
    """Measured cost of a round as a function of its speculation length, in ms.

    Attributes:
        draft_ms_per_pass: drafting ms per drafter forward pass.
        draft_ms_per_token: drafting ms per proposed token, for drafters without passes (model-free).
        passes_base / passes_per_token: drafter passes for ``l >= 1`` drafted tokens ~ base + per_token * l.
        verify_ms_base / verify_ms_per_token: verification ms ~ base + per_token * l (``l = 0``: vanilla step).
    """

    draft_ms_per_pass: float
    draft_ms_per_token: float
    passes_base: float
    passes_per_token: float
    verify_ms_base: float
    verify_ms_per_token: float

    def passes(self, length: int) -> float:
        """Modeled drafter passes for ``length`` drafted tokens (0 for 0)."""
        return 0.0 if length <= 0 else max(self.passes_base + self.passes_per_token * length, 0.0)

    def draft_ms(self, length: int, passes: float | None = None) -> float:
        """Drafting ms for ``length`` tokens; ``passes`` when known exactly (replay or a recorded round)."""
        if length <= 0 and not passes:
            return 0.0
        p = self.passes(length) if passes is None else passes
        return p * self.draft_ms_per_pass + length * self.draft_ms_per_token

    def verify_ms(self, length: int) -> float:
        """Verification ms of a draft of ``length`` tokens (``length + 1`` target positions)."""
        return self.verify_ms_base + self.verify_ms_per_token * length

    def round_ms(self, length: int, passes: float | None = None) -> float:
        """``draft_ms + verify_ms`` of one round."""
        return self.draft_ms(length, passes) + self.verify_ms(length)

    @staticmethod
    def fit(rounds: Iterable[RoundRecord], vanilla_verify_ms: Iterable[float] = ()) -> CostModel:
        """Fit from measured rounds (several runs of the same drafter may be pooled) and the
        measured ``verify_ms`` of vanilla decoding steps.

        Slopes are clamped at >= 0 so costs never decrease with the length.

        Raises:
            NotEstimable: when the verification time of a plain target step (length 0) cannot be
                estimated: no vanilla step and no round of length 0, and the drafted rounds cannot be
                extrapolated to length 0 (``specpolicy.core.latency.step_problem``).
        """
        rounds = list(rounds)
        van = list(vanilla_verify_ms)
        problem = step_problem([(r.speculation_length, r.verify_ms) for r in rounds] + [(0, ms) for ms in van])
        if problem:
            raise NotEstimable(problem)
        drafted = [r for r in rounds if r.speculation_length > r.reused_tokens]
        passes = sum(r.drafter_forward_passes for r in drafted)
        draft_ms = sum(r.draft_ms for r in drafted)
        tokens = sum(r.speculation_length - r.reused_tokens for r in drafted)
        per_pass = draft_ms / passes if passes else 0.0
        per_token = 0.0 if passes else (draft_ms / tokens if tokens else 0.0)
        pb, pt = fit_affine(
            [r.speculation_length - r.reused_tokens for r in drafted], [r.drafter_forward_passes for r in drafted]
        )
        xs = [r.speculation_length for r in rounds] + [0] * len(van)
        ys = [r.verify_ms for r in rounds] + van
        vb, vt = fit_affine(xs, ys)
        return CostModel(per_pass, per_token, pb, max(pt, 0.0), max(vb, 0.0), max(vt, 0.0))

    @staticmethod
    def from_profile(rounds: Iterable[RoundRecord], profile: Any) -> CostModel:
        """A clock-free cost model: a latency profile's costs (``specpolicy.core.latency.LatencyProfile``,
        complete: ``drafter_pass_ms``, ``target_ms_per_token``, ``verify_ms_per_draft_token`` set,
        ms) in place of this machine's measured ones, the drafter passes per length fitted on the
        recorded ``rounds`` as in ``fit``. Rounds costed by it cost what ``latency.modeled_round_ms``
        gives them, so the same rounds give the same figure on any machine under any load."""
        drafted = [r for r in rounds if r.speculation_length > r.reused_tokens]
        pb, pt = fit_affine(
            [r.speculation_length - r.reused_tokens for r in drafted], [r.drafter_forward_passes for r in drafted]
        )
        return CostModel(
            float(profile.drafter_pass_ms),
            0.0,
            pb,
            max(pt, 0.0),
            float(profile.target_ms_per_token),
            float(profile.verify_ms_per_draft_token),
        )


def oracle_max_length(rounds: Iterable[RoundRecord]) -> int:
    """The longest speculation the oracle may choose for a policy's ``rounds``: the longest of
    ``DEFAULT_MAX_LENGTH`` and the policy's longest draft (so the oracle is never shorter-sighted
    than the policy it bounds)."""
    return max([DEFAULT_MAX_LENGTH] + [r.speculation_length for r in rounds])


def match_lengths_from_rounds(rounds: Sequence[RoundRecord], num_tokens: int) -> tuple[list[int], list[bool]]:
    """``M(i)`` for ``i`` in ``0..num_tokens-1`` from recorded rounds (self-consistency; see module doc).

    Returns:
        ``(M, censored)``: match lengths, and whether each comes from a fully accepted round
        (a lower bound).
    Raises:
        ValueError: when the rounds do not cover ``num_tokens`` output tokens.
    """
    M, censored = [0] * num_tokens, [False] * num_tokens
    pos = 0
    for r in rounds:
        k, a, e = r.speculation_length, r.accepted_length, r.emitted_tokens
        full = k > 0 and a == k
        for j in range(min(a + 1, e)):
            if pos + j < num_tokens:
                M[pos + j] = min(a - j, num_tokens - (pos + j) - 1)
                censored[pos + j] = full
        pos += e
    if pos != num_tokens:
        raise ValueError(f"the rounds emit {pos} tokens but the output has {num_tokens}")
    return M, censored


@torch.no_grad()
def prefill_for_replay(
    drafter, verifier, prompt_ids: torch.Tensor, output_ids: torch.Tensor, doing: str
) -> torch.Tensor | None:
    """Prefill ``drafter`` with ``prompt_ids`` (``(P,) int64``) for a replay over ``output_ids``
    (``(n,) int64``): a drafter that reads the target (``target_feature_layers``) gets the target's
    features of the prompt from one pass of ``verifier`` over ``prompt + output`` (its
    ``request_features`` / ``prompt_features``).

    Returns:
        the target's features of every position of ``prompt + output`` but the last (``(P + n - 1,
        F)``, the verifier's dtype) for a drafter that reads them (the replay's commits take their
        rows), else None.

    Raises:
        ValueError: a drafter that reads the target, without a ``verifier`` (``doing`` names the caller's work).
    """
    layers = tuple(getattr(drafter, "target_feature_layers", ()) or ())
    if not layers:
        drafter.prefill(prompt_ids)
        return None
    if verifier is None:
        raise ValueError(f"{doing} drafter {getattr(drafter, 'name', '')!r} needs the verifier (its features)")
    verifier.request_features(layers)
    verifier.prefill(torch.cat([prompt_ids, output_ids.to(prompt_ids.device)]))  # every position but the last
    features = verifier.prompt_features
    verifier.request_features(())
    drafter.prefill(prompt_ids, features=features[: prompt_ids.shape[0] - 1])
    return features


def replay_match_lengths(
    drafter, prompt_ids: torch.Tensor, output_ids: torch.Tensor, max_length: int, verifier=None
) -> tuple[list[int], list[list[int]]]:
    """Exact ``M(i)`` by re-running ``drafter`` at every committed prefix of ``output_ids``.

    The drafter is prefilled with ``prompt_ids`` ((P,) int64); at each position it drafts one
    token at a time (``draft(1)``) until a token differs from ``output_ids`` ((n,) int64) or
    ``min(max_length, n - i - 1)`` tokens matched; then exactly ``output_ids[i]`` is committed
    (a verification that accepts nothing and corrects to ``output_ids[i]``). A drafter that reads
    the target (``target_feature_layers``) gets the target's features of every position from one
    pass of ``verifier`` over ``prompt + output`` (its ``request_features`` / ``prompt_features``).

    Returns:
        ``(M, passes)``: ``passes[i][l]`` = drafter passes spent to draft ``l`` tokens at
        position ``i`` (``l = 0..M(i)``; ``passes[i][0]`` holds passes ``commit`` charged to the round).
    Raises:
        ValueError: a drafter that reads the target, without a ``verifier``.
    """
    y = [int(t) for t in output_ids.tolist()]
    n = len(y)
    device = prompt_ids.device
    features = prefill_for_replay(drafter, verifier, prompt_ids, output_ids, "replaying")
    P = int(prompt_ids.shape[0])
    M, passes = [], []
    for i in range(n):
        limit = min(max_length, n - i - 1)
        draft, m, spent = Draft.empty(device), 0, [0]
        while m < limit:
            nxt = drafter.draft(1)
            if nxt.length <= m:  # nothing more to propose
                break
            draft = nxt
            if int(draft.token_ids[m]) != y[i + m]:
                break
            m += 1
            spent.append(draft.forward_passes)
        M.append(m)
        passes.append(spent)
        target = torch.tensor([y[i]], dtype=torch.long, device=device)
        rows = None if features is None else features[P - 1 + i : P + i]  # the previously pending token's
        drafter.commit(draft, Verification(accepted_length=0, next_token=y[i], target_token_ids=target, features=rows))
    return M, passes


@dataclass(frozen=True)
class OracleResult:
    """The oracle on one prompt.

    Attributes:
        ms: ``T(0)``, the oracle's modeled time (ms).
        schedule: ``(position, length)`` of each of the oracle's rounds.
    """

    ms: float
    schedule: tuple[tuple[int, int], ...]

    @property
    def rounds(self) -> int:
        return len(self.schedule)

    @property
    def mean_length(self) -> float:
        return sum(length for _, length in self.schedule) / len(self.schedule) if self.schedule else 0.0


def solve(
    M: Sequence[int],
    cost: CostModel,
    max_length: int = DEFAULT_MAX_LENGTH,
    passes: Sequence[Sequence[float]] | None = None,
) -> OracleResult:
    """The DP of the module docstring over match lengths ``M`` (``passes[i][l]``: exact passes, optional)."""
    n = len(M)
    T = [0.0] * (n + 1)
    choice = [0] * n
    for i in range(n - 1, -1, -1):
        best, arg = math.inf, 0
        top = min(M[i], max_length, n - i - 1)
        if passes is not None:
            top = min(top, len(passes[i]) - 1)
        for length in range(top + 1):
            p = passes[i][length] if passes is not None else None
            c = cost.round_ms(length, p) + T[min(n, i + length + 1)]
            if c < best:
                best, arg = c, length
        T[i], choice[i] = best, arg
    schedule, i = [], 0
    while i < n:
        schedule.append((i, choice[i]))
        i += choice[i] + 1
    return OracleResult(T[0], tuple(schedule))


def policy_ms(rounds: Sequence[RoundRecord], cost: CostModel) -> float:
    """A policy's rounds costed by ``cost`` (its recorded drafter passes, the fitted verification)."""
    return sum(
        cost.round_ms(
            r.speculation_length - r.reused_tokens, r.drafter_forward_passes if cost.draft_ms_per_pass else None
        )
        + (cost.verify_ms_per_token * r.reused_tokens)
        for r in rounds
    )


def compare(
    prompts: Mapping[str, GenerationResult],
    cost: CostModel,
    max_length: int = DEFAULT_MAX_LENGTH,
    match: Sequence[tuple[list[int], list[list[int]] | None]] | None = None,
) -> dict[str, Any]:
    """A policy against the oracle, per prompt and overall.

    Args:
        prompts: prompt id -> the policy's ``GenerationResult`` on it (output and rounds).
        cost: the cost model (usually ``CostModel.fit`` on the same drafter's runs).
        max_length: longest speculation the oracle may choose.
        match: per prompt ``(M, passes)`` from ``replay_match_lengths``; default: from the rounds.
    Returns:
        ``{"definition", "source", "cost_model", "fraction_of_oracle", "policy_ms", "oracle_ms",
        "vanilla_ms", "policy_speedup_modeled", "oracle_speedup_modeled", "censored_positions",
        "per_prompt": [...]}``; fractions are ``oracle_ms / policy_ms``.
    """
    per, tot_p, tot_o, tot_v, cens = [], 0.0, 0.0, 0.0, 0
    for idx, (prompt_id, result) in enumerate(prompts.items()):
        n = result.generated_tokens
        rounds = list(result.rounds)
        if match is None:
            M, censored = match_lengths_from_rounds(rounds, n)
            passes = None
            cens += sum(censored)
        else:
            M, passes = match[idx]
        result = solve(M, cost, max_length, passes)
        p_ms = policy_ms(rounds, cost)
        v_ms = n * cost.verify_ms(0)
        tot_p, tot_o, tot_v = tot_p + p_ms, tot_o + result.ms, tot_v + v_ms
        per.append(
            {
                "prompt_id": prompt_id,
                "tokens": n,
                "policy_ms": p_ms,
                "oracle_ms": result.ms,
                "vanilla_ms": v_ms,
                "fraction_of_oracle": result.ms / p_ms if p_ms else 0.0,
                "policy_rounds": len(rounds),
                "oracle_rounds": result.rounds,
                "oracle_mean_length": result.mean_length,
            }
        )
    return {
        "definition": DEFINITION,
        "source": "rounds (self-consistency, censored at fully accepted rounds)" if match is None else "replay (exact)",
        "cost_model": asdict(cost),
        "fraction_of_oracle": tot_o / tot_p if tot_p else 0.0,
        "policy_ms": tot_p,
        "oracle_ms": tot_o,
        "vanilla_ms": tot_v,
        "policy_speedup_modeled": tot_v / tot_p if tot_p else 0.0,
        "oracle_speedup_modeled": tot_v / tot_o if tot_o else 0.0,
        "censored_positions": cens,
        "per_prompt": per,
    }


def is_censored(result: Mapping[str, Any]) -> bool:
    """Whether an oracle result (``compare`` / a summary's ``oracle`` block) was estimated from a
    run's own rounds (censored match lengths) rather than by replaying the drafter."""
    return not str(result.get("source", "")).startswith("replay")


#: Why an oracle estimated from a run's own rounds gives a bound (printed once by the CLI).
CENSORED_NOTE = (
    "From a run's own rounds the oracle sees the drafter's match length only up to each round's "
    "speculation length (censored), so it is at best as fast as the true oracle: a figure <= 1 is an "
    "upper bound on the policy's fraction; above 1 it bounds nothing (lengths the run never drafted are "
    "costed by extrapolation). benchmarks/peers.py replays the drafter for the exact oracle."
)


def describe_fraction(result: Mapping[str, Any], brief: bool = False) -> str:
    """The oracle comparison of ``result`` (``compare`` / a summary's ``oracle`` block) in words,
    labelled by what it is -- the one wording every printout uses.

    * Exact (replay source), ratio <= 1: "0.712 of the oracle's speedup".
    * From the run's own rounds (censored), ratio <= 1: "at most 0.712 of the oracle's speedup",
      an UPPER bound: the rounds show the drafter's match length only up to each round's
      speculation length, so the estimated oracle is slower than the true one (for a
      self-consistent drafter, see the module docstring) and the policy's fraction is smaller.
    * Ratio > 1 (the policy's modeled time is below the estimated oracle's): never called a
      fraction of an optimum -- the estimate bounds nothing there; the line says why.

    * Not estimable (``unavailable``): "n/a (<why>)", never a number.

    ``brief``: the label without the reason for a bound (``CENSORED_NOTE`` gives it once).
    """
    if result.get("unavailable") or result.get("fraction_of_oracle") is None:
        return f"n/a ({result.get('unavailable') or 'no figure'})"
    ratio = float(result.get("fraction_of_oracle", 0.0))
    if brief and is_censored(result):
        speeds = (
            f"modeled: policy {result.get('policy_speedup_modeled', 0.0):.2f}x, "
            f"oracle {result.get('oracle_speedup_modeled', 0.0):.2f}x"
        )
        if ratio <= 1.0 + 1e-9:
            return f"at most {ratio:.3f} of the oracle's speedup (upper bound from censored rounds; {speeds})"
        return (
            f"no fraction of the oracle: the policy's modeled time is {ratio:.3f}x shorter than the oracle "
            f"estimated from its censored rounds, which bounds nothing here ({speeds})"
        )
    speeds = (
        f"modeled with measured costs: policy {result.get('policy_speedup_modeled', 0.0):.2f}x, "
        f"oracle {result.get('oracle_speedup_modeled', 0.0):.2f}x"
    )
    if not is_censored(result):
        if ratio <= 1.0 + 1e-9:
            return f"{ratio:.3f} of the oracle's speedup (exact: the drafter replayed at every prefix; {speeds})"
        return (
            f"no fraction of the oracle: the policy's modeled time is {ratio:.3f}x shorter than the "
            f"replayed oracle's, i.e. the fitted cost model favours the policy's recorded rounds ({speeds})"
        )
    censored = int(result.get("censored_positions", 0))
    why = (
        f"the oracle is estimated from this run's own rounds, which show the drafter's match length only "
        f"up to each round's speculation length ({censored} censored positions)"
    )
    if ratio <= 1.0 + 1e-9:
        return (
            f"at most {ratio:.3f} of the oracle's speedup (an upper bound: {why}, so the true oracle is "
            f"faster; {speeds}; benchmarks/peers.py replays the drafter for the exact figure)"
        )
    return (
        f"no fraction of the oracle: the policy's modeled time is {ratio:.3f}x shorter than the estimated "
        f"oracle's, so that estimate bounds nothing here ({why}, and lengths the run never drafted are "
        f"costed by extrapolation; {speeds}; benchmarks/peers.py replays the drafter for the exact oracle)"
    )


def unavailable(reason: str, max_length: int) -> dict[str, Any]:
    """An oracle result whose figures cannot be estimated (``compare``'s keys, figures None, no
    prompt), with ``unavailable``: the reason."""
    return {
        "definition": DEFINITION,
        "source": "rounds (self-consistency, censored at fully accepted rounds)",
        "cost_model": None,
        "fraction_of_oracle": None,
        "policy_ms": None,
        "oracle_ms": None,
        "vanilla_ms": None,
        "policy_speedup_modeled": None,
        "oracle_speedup_modeled": None,
        "censored_positions": 0,
        "per_prompt": [],
        "max_length": max_length,
        "unavailable": reason,
    }


def analyse(
    results: Sequence[PromptResult], max_length: int | None = None, profile: Any = None
) -> dict[str, Any] | None:
    """``compare`` on a run's results, rounds source: a cost model fitted on the speculative rounds
    and the vanilla baseline's steps, ``max_length`` None = ``oracle_max_length`` of the rounds.
    ``summary.json``'s ``oracle`` block and ``python -m specpolicy.analysis.oracle`` are this computation.
    Returns ``compare``'s dict plus ``max_length``; None when there are no rounds. When the run's
    timings cannot give a cost model (``CostModel.fit`` raises ``NotEstimable``: e.g. no vanilla
    baseline and too few rounds), the figures are None and ``unavailable`` says why
    (``describe_fraction`` prints ``n/a`` with it).

    ``profile``: a complete latency profile (``LatencyProfile.complete``, a property): the same comparison with
    the profile's costs (``CostModel.from_profile``) is added as ``profile_costs`` (``profile``,
    ``fraction_of_oracle``, ``policy_speedup_modeled``, ``oracle_speedup_modeled``): clock-free,
    where the measured-cost fraction follows this machine's load."""
    spec_rounds = [r for res in results for r in res.speculative.rounds]
    if not spec_rounds:
        return None
    van_verify = [r.verify_ms for res in results if res.vanilla is not None for r in res.vanilla.rounds]
    max_length = oracle_max_length(spec_rounds) if max_length is None else max_length
    try:
        cost = CostModel.fit(spec_rounds, van_verify)
    except NotEstimable as why:
        return unavailable(str(why), max_length)
    prompts = {res.prompt_id: res.speculative for res in results}
    out = compare(prompts, cost, max_length)
    out["max_length"] = max_length
    if profile is not None and profile.complete:
        clock_free = compare(prompts, CostModel.from_profile(spec_rounds, profile), max_length)
        out["profile_costs"] = {
            "profile": profile.name,
            **{k: clock_free[k] for k in ("fraction_of_oracle", "policy_speedup_modeled", "oracle_speedup_modeled")},
        }
    return out


def analyse_run(run_dir: str | Path, max_length: int | None = None) -> dict[str, Any]:
    """``analyse`` on a run directory (``results.jsonl``, read with ``specpolicy.analysis.results``), plus
    the run's ``method``.

    Raises:
        FileNotFoundError: when the directory holds no valid row of ``results.jsonl``.
    """
    run = read_run(run_dir)
    out = analyse(run.results, max_length)
    if out is None:
        raise FileNotFoundError(f"no results with rounds in {Path(run_dir) / 'results.jsonl'}")
    out["method"] = run.summary.get("method") or run.name
    return out


#: Up to this many prompts, the per-prompt fractions are listed one by one (a min / median / max of
#: two or three values says less than the values).
LIST_PROMPTS_UP_TO = 5


def per_prompt_text(fractions: Sequence[float]) -> str:
    """The per-prompt fractions in words: every value for up to ``LIST_PROMPTS_UP_TO`` prompts,
    else min / median / max; always with n, and how many are above 1 (no fraction of an optimum).
    Empty without prompts."""
    if not fractions:
        return ""
    values = sorted(float(f) for f in fractions)
    if len(values) <= LIST_PROMPTS_UP_TO:
        text = f"policy / oracle per prompt (n = {len(values)}): " + ", ".join(f"{v:.3f}" for v in values)
    else:
        text = (
            f"policy / oracle per prompt (n = {len(values)}): min {values[0]:.3f} median "
            f"{statistics.median(values):.3f} max {values[-1]:.3f}"
        )
    above = sum(v > 1.0 + 1e-9 for v in values)
    if above:
        text += f" ({above} above 1: no fraction of an optimum there)"
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.analysis.oracle DIR [--max-length N]``: the oracle fraction of every run under
    DIR (directories holding ``results.jsonl``); writes ``oracle.json`` next to each."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.analysis.oracle", description=main.__doc__)
    parser.add_argument("directory")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help=f"longest speculation the oracle may use (default: max({DEFAULT_MAX_LENGTH}, the run's longest))",
    )
    args = parser.parse_args(argv)
    runs = find_runs(args.directory)
    if not runs:
        print(f"error: no results.jsonl under {args.directory}", file=sys.stderr)
        return 1
    untrusted: list[str] = []
    for run in runs:
        try:
            res = analyse_run(run, args.max_length)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            continue
        res["reading"] = describe_fraction(res)
        (run / "oracle.json").write_text(json.dumps(res, indent=2))
        line = f"{run}: {res['method'] or run.name}: {describe_fraction(res, brief=True)}"
        per_prompt = per_prompt_text([p["fraction_of_oracle"] for p in res["per_prompt"]])
        if per_prompt:
            line += f"; {per_prompt}"
        reasons = untrusted_reasons(read_summary(Path(run) / SUMMARY_FILE))
        if reasons and not res.get("unavailable"):
            line += f" {UNTRUSTED_MARK}"
            untrusted.append(f"{UNTRUSTED_MARK} {run}: costs measured while {'; '.join(reasons)}")
        print(line)
    if untrusted:
        print(f"{UNTRUSTED_MARK} {UNTRUSTED_NOTE}; the oracle's costs are that run's measured times:")
        print("\n".join(untrusted))
    print(CENSORED_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
