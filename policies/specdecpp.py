"""``specdecpp`` policy: SpecDec++-style stop rule on the probability of a rejection.

Source: Huang, Guo & Wang 2024, "SpecDec++: Boosting Speculative Decoding via Adaptive
Candidate Lengths" (arXiv 2405.19715), §3: drafting one token at a time is a Markov decision
process whose optimal policy is a threshold rule, stop as soon as the probability that at
least one drafted token will be rejected exceeds a threshold h. Reference code
(Kaffaljidhmah2/SpecDec_pp, ``specdec_pp/hf_generation.py``, schedule ``ada``) estimates each
token's acceptance probability with a trained acceptance head, stops when
``1 - prod(p_accept) > stop_threshold`` and clamps the length to ``bound = (min, max)``.

``policy.acceptance`` chooses the acceptance probabilities (``specpolicy.core.acceptance``):
``confidence`` (default; the drafter's confidences stand in for them) or ``head`` (the paper's: the
trained head, ``specpolicy.models.acceptance_head``, on the drafter's last hidden states; a head per
bundled drafter ships beside its weights, ``python -m specpolicy.family.train_drafter acceptance-head``
trains one for any drafter). The paper's settings (README, ``evaluate.py``): threshold 0.3, bound (2, 20).
"""

from __future__ import annotations

from specpolicy.core.acceptance import AcceptanceChoice
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "specdecpp"


class SpecDecPPPolicy(LengthPolicy):
    """Draft ``min_length`` tokens, then one token at a time; stop when the estimated
    probability of at least one rejection, ``1 - prod(p_accept)`` over the draft so far,
    is ``>= h``, never before ``min_length`` tokens and never beyond ``max_length``.

    ``p_accept`` (``acceptance``): the drafter's confidences (``"confidence"``, default: a token's
    max probability is the drafter's own belief that it is the right token) or SpecDec++'s trained
    acceptance head on the drafter's last hidden states (``"head"``, the paper's rule; the head runs
    on the tokens new since the last decision). Differences from the reference code, deliberate: the
    comparison is ``>=`` (so ``h = 1`` is meaningful: it stops only on a zero confidence),
    and the first token's estimate is included in the product (the reference treats it
    as 1). The product is taken in float64 on the host (``AcceptanceChoice.all_accepted``): one small
    device-to-host copy per decision, whatever the device -- of the confidences, or of the new
    token's hidden row, the head's estimates and their running product being kept on the host
    through the round. Stateless but for the head's estimates of the round.

    Args:
        h: stop threshold on ``1 - prod(p_accept)``, in (0, 1] (default 0.7); in (0, 1) with the head
            (the reference's ``stop_threshold``: 0.3 in the paper's runs).
        min_length: fewest tokens per draft, integer >= 1 (default 1; the paper's bound: 2).
        max_length: most tokens per draft, integer >= ``min_length`` (default 60; the paper's bound: 20).
        acceptance: ``"confidence"`` (default) or ``"head"`` (``specpolicy.core.acceptance``).
        acceptance_head: with ``acceptance="head"``, the head's directory (None: the drafter's bundled head).
    Raises:
        ValueError: naming ``policy.h``, ``policy.min_length``, ``policy.max_length``,
            ``policy.acceptance`` or ``policy.acceptance_head`` when out of range.
    """

    name = NAME

    def __init__(
        self,
        h: float = 0.7,
        min_length: int = 1,
        max_length: int = 60,
        acceptance: str = "confidence",
        acceptance_head: str | None = None,
    ) -> None:
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 < h <= 1.0:
            raise ValueError(f"policy.h must be in (0, 1], got {h!r}")
        if acceptance == "head" and not 0.0 < h < 1.0:
            raise ValueError(f"policy.h must be in (0, 1) with policy.acceptance=head, got {h!r}")
        if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 1:
            raise ValueError(f"policy.min_length must be an integer >= 1, got {min_length!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < min_length:
            raise ValueError(
                f"policy.max_length must be an integer >= policy.min_length ({min_length}), got {max_length!r}"
            )
        self.h = float(h)
        self.min_length = min_length
        self.max_length = max_length
        self.acceptance_choice = AcceptanceChoice(acceptance, acceptance_head)

    def next_length(self, draft: Draft) -> int:
        k = draft.length
        if k == 0:
            self.acceptance_choice.new_round()
        if k < self.min_length:
            return self.min_length - k
        if k >= self.max_length:
            self.draft_stop_reason = "policy_bound"
            return 0
        p_reject = 1.0 - self.acceptance_choice.all_accepted(draft)  # the one host read (float64 after)
        self.draft_stop_reason = "low_confidence"
        return 0 if p_reject >= self.h else 1

    def __repr__(self) -> str:
        head = ", acceptance='head'" if self.acceptance_choice.wants_head else ""
        return f"SpecDecPPPolicy(h={self.h}, min_length={self.min_length}, max_length={self.max_length}{head})"


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``SpecDecPPPolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy", NAME, SpecDecPPPolicy, "SpecDec++-style stop rule on the probability of a rejection"
        )
    ]
