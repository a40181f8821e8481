"""Acceptance estimates for length policies: what each drafted token's probability of acceptance is taken to be.

``policy.acceptance`` chooses one (``ACCEPTANCE_SOURCES``):

* ``confidence`` (default): the drafter's confidence (``Draft.confidences``), the rule every policy
  had before the head;
* ``head``: SpecDec++'s trained acceptance prediction head (Huang, Guo & Wang, arXiv 2405.19715,
  §4; ``specpolicy.models.acceptance_head``) on the drafter's last hidden states
  (``Draft.extras[LAST_HIDDEN]``). The head runs incrementally: within a round, only on the rows new
  since the previous call. A token without a hidden-state row (draft reuse, a drafter that did not
  report them) takes its confidence.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from specpolicy.core.types import LAST_HIDDEN, Draft

#: Values of ``policy.acceptance``.
ACCEPTANCE_SOURCES = ("confidence", "head")


class AcceptanceHead(Protocol):
    """What ``HeadAcceptance`` needs of a head (``specpolicy.models.acceptance_head.AcceptancePredictionHead``;
    one with a ``fused()`` method is run through what that returns, ``FusedAcceptanceHead``)."""

    hidden_size: int

    def acceptance_probs(self, hidden: torch.Tensor, confidences: torch.Tensor | None = None) -> Any:
        """``(n, H)`` float (and the tokens' ``(n,)`` confidences) -> ``(n,)`` acceptance probabilities
        (a tensor or a NumPy array: read with ``tolist()``)."""


class ConfidenceAcceptance:
    """Acceptance estimate = the drafter's confidence (``policy.acceptance=confidence``)."""

    source = "confidence"
    #: No network: nothing the loop times as a pass (``specpolicy.core.passes``).
    timed_calls: tuple = ()

    def new_round(self) -> None:
        """Nothing kept between calls."""

    def probs(self, draft: Draft) -> torch.Tensor:
        """``(k,) float32``: ``draft.confidences``."""
        return draft.confidences

    def all_accepted(self, draft: Draft) -> float:
        """The estimated probability that every drafted token is accepted: the product of the
        confidences, taken in float64 on the host (one device-to-host copy; on the CPU the same
        product without the copy's two no-op calls)."""
        conf = draft.confidences
        if conf.is_cpu and not conf.requires_grad:
            return float(conf.double().prod())
        return float(conf.detach().cpu().double().prod())

    def lookahead_probs(self, draft: Draft) -> torch.Tensor | None:
        """``(lookahead,) float32`` or None: ``draft.lookahead_confidences``."""
        return draft.lookahead_confidences


class HeadAcceptance:
    """Acceptance estimate = SpecDec++'s head on the drafter's last hidden states (module docstring).

    Within a round each hidden-state row goes through the head once: the estimates are kept on the
    host as Python floats with their running products, so a decision that adds one token costs one
    head call on that one row (``FusedAcceptanceHead``: no module dispatch, no torch op per layer)
    and one multiplication, whatever the draft's length. ``new_round`` (called by the policy at each
    round's empty draft) forgets them.

    Args:
        head: the trained head, on the drafter's device (``AcceptanceHead``; an
            ``AcceptancePredictionHead`` is run through ``head.fused()``).
    """

    source = "head"

    def __init__(self, head: AcceptanceHead) -> None:
        self.head = head
        fused = getattr(head, "fused", None)
        self.step: AcceptanceHead = fused() if callable(fused) else head  # what a decision calls
        self.new_round()

    @property
    def timed_calls(self) -> tuple:
        """The head's pass (``specpolicy.core.passes``): the ``acceptance_probs`` a decision calls,
        timed as a model pass of the drafter's side, not host work."""
        return ((self.step, "acceptance_probs"),)

    def new_round(self) -> None:
        """Forget the round's rows."""
        self._estimates: list[float] = []  # the head's estimates of rows 0..m-1
        self._products: list[float] = [1.0]  # _products[i]: product of the first i estimates

    def _rows(self, draft: Draft, n: int) -> int:
        """Run the head on the hidden rows up to ``n`` not estimated yet; returns how many of the
        first ``n`` rows have an estimate (fewer when fewer hidden rows were reported)."""
        hidden = draft.extras.get(LAST_HIDDEN)
        if hidden is None:
            return 0
        n = min(n, int(hidden.shape[0]))
        have = len(self._estimates)
        if n > have:
            conf = draft.confidences
            if draft.lookahead_confidences is not None and n > conf.shape[0]:
                conf = torch.cat([conf[: draft.length - draft.reused_tokens], draft.lookahead_confidences])
            new = self.step.acceptance_probs(hidden[have:n], conf[have:n]).tolist()
            self._estimates.extend(new)
            product = self._products[-1]
            for p in new:
                product *= p
                self._products.append(product)
        return min(n, len(self._estimates))

    def probs(self, draft: Draft) -> torch.Tensor:
        """``(k,) float32``: the head's estimate for each drafted token with a hidden state, the
        confidence for the rest (reused tokens)."""
        k = draft.length
        rows = self._rows(draft, k - draft.reused_tokens)
        if rows == 0:
            return draft.confidences
        head = torch.tensor(self._estimates[:rows], dtype=torch.float32, device=draft.confidences.device)
        return head if rows == k else torch.cat([head, draft.confidences[rows:]])

    def all_accepted(self, draft: Draft) -> float:
        """The estimated probability that every drafted token is accepted: the running product of the
        head's estimates, times the confidences of the tokens without a hidden row (float64, host)."""
        k = draft.length
        rows = self._rows(draft, k - draft.reused_tokens)
        if rows == k:
            return self._products[rows]
        return self._products[rows] * float(draft.confidences[rows:].detach().cpu().double().prod())

    def lookahead_probs(self, draft: Draft) -> torch.Tensor | None:
        """``(lookahead,) float32`` or None: the head's estimates of the decoded-ahead tokens (their
        confidences where no row was reported)."""
        ahead = draft.lookahead_confidences
        if ahead is None or draft.reused_tokens:
            return ahead
        k = draft.length
        rows = self._rows(draft, k + int(ahead.shape[0]))
        if rows <= k:
            return ahead
        got = torch.tensor(self._estimates[k:rows], dtype=torch.float32, device=ahead.device)
        return got if got.shape[0] == ahead.shape[0] else torch.cat([got, ahead[got.shape[0] :]])


def acceptance_source(value: object) -> str:
    """``policy.acceptance`` checked: one of ``ACCEPTANCE_SOURCES``; ValueError (one line) otherwise."""
    if value not in ACCEPTANCE_SOURCES:
        raise ValueError(f"policy.acceptance must be one of {', '.join(ACCEPTANCE_SOURCES)}, got {value!r}")
    return str(value)


class AcceptanceChoice:
    """A policy's ``policy.acceptance`` and ``policy.acceptance_head`` settings and the estimate they
    give (``policy.acceptance_choice`` of ``specdecpp``, ``failfast`` and ``goodput``).

    With ``acceptance="head"`` the run loads the head (``specpolicy.models.acceptance_head.wire_acceptance``:
    ``acceptance_head`` when set, else the head bundled beside the drafter's weights) and calls
    ``use_head``; a policy asked for a length before that raises ValueError naming ``policy.acceptance``.

    Args:
        acceptance: ``"confidence"`` or ``"head"`` (``ACCEPTANCE_SOURCES``).
        acceptance_head: a head's directory, or None (the drafter's bundled head).
    Raises:
        ValueError: one line naming ``policy.acceptance`` or ``policy.acceptance_head``.
    """

    def __init__(self, acceptance: str = "confidence", acceptance_head: str | None = None) -> None:
        self.source = acceptance_source(acceptance)
        if acceptance_head is not None and (not isinstance(acceptance_head, str) or not acceptance_head):
            raise ValueError(f"policy.acceptance_head must be a head's directory or null, got {acceptance_head!r}")
        if acceptance_head is not None and self.source != "head":
            raise ValueError(
                f"policy.acceptance_head={acceptance_head!r} is read only with policy.acceptance=head, "
                f"got policy.acceptance={acceptance!r}"
            )
        self.head_path = acceptance_head
        self._estimate: ConfidenceAcceptance | HeadAcceptance | None = (
            ConfidenceAcceptance() if self.source == "confidence" else None
        )

    @property
    def timed_calls(self) -> tuple:
        """The estimate's passes (``specpolicy.core.passes``): the head's (``HeadAcceptance.timed_calls``),
        none for confidences or before the head is loaded."""
        return () if self._estimate is None else self._estimate.timed_calls

    @property
    def wants_head(self) -> bool:
        """True for ``acceptance="head"``."""
        return self.source == "head"

    def use_head(self, head: AcceptanceHead) -> None:
        """Estimate with ``head`` from now on."""
        self._estimate = HeadAcceptance(head)

    @property
    def estimate(self) -> ConfidenceAcceptance | HeadAcceptance:
        """The estimate in use. Raises ValueError (one line) for a head that was never loaded."""
        if self._estimate is None:
            raise ValueError(
                "policy.acceptance=head but no acceptance head was loaded for the drafter (the run loads it: "
                "specpolicy.models.acceptance_head.wire_acceptance)"
            )
        return self._estimate

    def new_round(self) -> None:
        """A round starts (the policy's empty draft)."""
        if self._estimate is not None:
            self._estimate.new_round()

    def probs(self, draft: Draft) -> torch.Tensor:
        """``(k,) float32`` acceptance estimates of the draft's tokens."""
        return self.estimate.probs(draft)

    def all_accepted(self, draft: Draft) -> float:
        """The estimated probability that every token of the draft is accepted (float64 on the host;
        SpecDec++'s ``prod(p_accept)``)."""
        return self.estimate.all_accepted(draft)

    def lookahead_probs(self, draft: Draft) -> torch.Tensor | None:
        """``(lookahead,) float32`` estimates of the decoded-ahead tokens, or None (not reported)."""
        return self.estimate.lookahead_probs(draft)

    def __deepcopy__(self, memo: dict) -> AcceptanceChoice:
        """A copy sharing the head's weights (the batched loop copies each request's policy)."""
        clone = AcceptanceChoice.__new__(AcceptanceChoice)
        clone.source, clone.head_path = self.source, self.head_path
        if isinstance(self._estimate, HeadAcceptance):
            clone._estimate = HeadAcceptance(self._estimate.head)
        else:
            clone._estimate = None if self._estimate is None else ConfidenceAcceptance()
        return clone
