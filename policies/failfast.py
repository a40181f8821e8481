"""``failfast`` policy: confidence-gated dynamic expansion of the speculation length.

Source: "Fail Fast, Win Big: Rethinking the Drafting Strategy in Speculative Decoding via
Diffusion LLMs" (FailFast, arXiv 2512.20573), §4.2 and Algorithm 1. Defaults from the official
script (N = ``incr_len`` 10, τ = ``lowconf_threshold`` 0.45, N_max = ``max_spec_len`` 60) and the
sensitivity study of App. C (τ ≈ 0.45 best; N_max between 30 and 70 works reliably).

Two confidence scopes (``policy.confidence_scope``):

* ``draft`` (default, the paper's rule, §4.2 and Alg. 1): the confidences of the drafted tokens
  are checked against τ; N_max bounds the draft length.
* ``small_block`` (the official code, ``generate_draft_tokens_arbitrary_length``): the list it
  checks (``conf_of_unmasked_tokens``, marked FIXME by its authors: "might include non-drafted
  tokens") holds the confidence of every position that was masked at each unmasking pass of every
  small block decoded in the round -- look-ahead positions past the draft included, a position
  still masked after a pass counted again -- and N_max bounds the LENGTH OF THAT LIST, not the
  draft. The first token of a block (from the pass that completed the previous block) is not in
  it. Checks, in the official order: any listed confidence < τ -> stop; list length >= N_max ->
  stop; else extend by N (uncapped: the draft may pass N_max by up to N - 1 tokens). Needs a
  drafter that reports ``Draft.extras[SMALL_BLOCK_CONFIDENCES]`` (``fastdllm``).
"""

from __future__ import annotations

import torch

from specpolicy.core.acceptance import AcceptanceChoice
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import SMALL_BLOCK_CONFIDENCES, Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "failfast"
#: Values of ``policy.confidence_scope`` (see the module docstring).
CONFIDENCE_SCOPES = ("draft", "small_block")


class FailFastPolicy(LengthPolicy):
    """FailFast Algorithm 1: draft ``n`` tokens; while *every* token drafted so far in the
    round has confidence >= ``tau`` and the draft is shorter than ``n_max``, draft ``n`` more
    (the last chunk capped so the draft never exceeds ``n_max``). A chunk holding a
    low-confidence token ends the round but is proposed whole: nothing is truncated at
    the low-confidence token.

    The check covers the whole draft, not only the newest chunk, so the rule is exactly
    "all confidences so far >= τ" however the policy is called; it is one on-device
    reduction and one host read per extension decision. Confidences are compared with
    ``tau`` in their own dtype (a float32 confidence equal to float32(τ) passes). Stateless:
    nothing carries over between rounds or prompts. With ``confidence_scope="small_block"`` the
    rule reads ``Draft.extras[SMALL_BLOCK_CONFIDENCES]`` as the official code does (module docstring).

    Args:
        n: N, tokens per chunk, integer >= 1 (default 10).
        tau: τ, confidence threshold in [0, 1] (default 0.45). τ = 0 always extends to
            ``n_max``; τ = 1 extends only past chunks of confidence exactly 1.
        n_max: N_max, longest draft in tokens, integer >= ``n`` (default 60); with
            ``small_block`` scope, the most small-block confidences before drafting stops.
        confidence_scope: ``"draft"`` (default, the paper) or ``"small_block"`` (the official code).
        acceptance: what τ is compared with (``specpolicy.core.acceptance``): ``"confidence"``
            (default, the paper) or ``"head"`` (SpecDec++'s trained acceptance head on the drafter's
            last hidden states; ``draft`` scope only).
        acceptance_head: with ``acceptance="head"``, the head's directory (None: the drafter's bundled head).
    Raises:
        ValueError: naming ``policy.n``, ``policy.tau``, ``policy.n_max`` or
            ``policy.confidence_scope`` when out of range; at a round, naming
            ``policy.confidence_scope`` when ``small_block`` meets a drafter that does not report
            small-block confidences.
    """

    name = NAME

    def __init__(
        self,
        n: int = 10,
        tau: float = 0.45,
        n_max: int = 60,
        confidence_scope: str = "draft",
        acceptance: str = "confidence",
        acceptance_head: str | None = None,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"policy.n must be an integer >= 1, got {n!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0:
            raise ValueError(f"policy.tau must be in [0, 1], got {tau!r}")
        if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < n:
            raise ValueError(f"policy.n_max must be an integer >= policy.n ({n}), got {n_max!r}")
        if confidence_scope not in CONFIDENCE_SCOPES:
            raise ValueError(
                f"policy.confidence_scope must be one of {', '.join(CONFIDENCE_SCOPES)}, got {confidence_scope!r}"
            )
        self.n = n
        self.tau = float(tau)
        self._rounded_tau: dict[tuple[torch.dtype, float], float] = {}  # ``_tau_in``
        self.n_max = n_max
        self.confidence_scope = confidence_scope
        self.acceptance_choice = AcceptanceChoice(acceptance, acceptance_head)
        if self.acceptance_choice.wants_head and confidence_scope != "draft":
            raise ValueError(
                f"policy.acceptance=head reads draft tokens: policy.confidence_scope must be draft, got {confidence_scope!r}"
            )

    def next_length(self, draft: Draft) -> int:
        k = draft.length
        if k == 0:
            self.acceptance_choice.new_round()
            return self.n
        if self.confidence_scope == "small_block":
            return self._official_rule(draft)
        if k >= self.n_max:
            self.draft_stop_reason = "n_max"
            return 0
        probs = self.acceptance_choice.probs(draft)
        tau = self._tau_in(probs.dtype)  # ``probs < tau`` compares in the tensor's dtype: tau rounded to it
        if any(p < tau for p in probs.tolist()):  # the one host read of this decision (NaN < tau is False)
            self.draft_stop_reason = "low_confidence"
            return 0  # fail fast: verify the draft as it stands
        return min(self.n, self.n_max - k)

    def _tau_in(self, dtype: torch.dtype) -> float:
        """``tau`` rounded to ``dtype`` (as a tensor comparison with the Python float rounds it), read
        back as a Python float: comparing a confidence read to the host with it decides as ``conf < tau``
        on the tensor does, one read instead of three torch calls (cached per dtype and tau)."""
        key = (dtype, self.tau)
        cached = self._rounded_tau.get(key)
        if cached is None:
            cached = self._rounded_tau[key] = float(torch.tensor(self.tau, dtype=dtype))
        return cached

    def _official_rule(self, draft: Draft) -> int:
        """The official code's check on the draft's small-block confidences (``Draft.extras``
        ``SMALL_BLOCK_CONFIDENCES``, module docstring)."""
        conf = draft.extras.get(SMALL_BLOCK_CONFIDENCES)  # (m,) float32, NaN = not masked at that pass
        if conf is None:
            raise ValueError(
                "policy.confidence_scope=small_block needs a drafter that reports "
                "small-block confidences (drafter=fastdllm); use confidence_scope=draft"
            )
        low, listed = torch.stack(
            [
                (conf < self.tau).any().long(),  # NaN < tau is False
                (~torch.isnan(conf)).sum(),
            ]
        ).tolist()  # one host sync
        if low:
            self.draft_stop_reason = "low_confidence"
            return 0
        if listed >= self.n_max:
            self.draft_stop_reason = "n_max"
            return 0
        return self.n

    def __repr__(self) -> str:
        scope = "" if self.confidence_scope == "draft" else f", confidence_scope={self.confidence_scope!r}"
        head = ", acceptance='head'" if self.acceptance_choice.wants_head else ""
        return f"FailFastPolicy(n={self.n}, tau={self.tau}, n_max={self.n_max}{scope}{head})"


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``FailFastPolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy", NAME, FailFastPolicy, "FailFast: extend the draft while the drafter is confident"
        )
    ]
