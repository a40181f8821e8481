"""The ``LengthPolicy`` interface: how many tokens to speculate in a round."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from specpolicy.types import Draft, RoundRecord


class LengthPolicy(ABC):
    """Base class of speculation-length policies (``policies/``, one module each).

    Within a round the loop asks ``next_length(draft)`` first with the empty draft, then
    after each extension, drafting that many more tokens until it returns 0; the draft
    is then verified. After verification the policy is fed the round's ``RoundRecord``.
    A first answer of 0 means no speculation this round (plain decoding).

    When ``next_length`` returns 0 for a non-empty draft, the loop records why in the round's
    ``RoundRecord.draft_stop_reason`` from the policy's ``draft_stop_reason`` attribute: a policy
    may set it just before returning 0 (``"low_confidence"``, ``"n_max"``, ``"policy_bound"``;
    see ``specpolicy.types.DRAFT_STOP_REASONS``); the default is ``"policy_bound"``. A first
    answer of 0 is recorded as ``"length_0"``. (Why *generation* ended is another matter:
    ``GenerationResult.finish_reason``.)
    """

    #: Name under which the policy registers (the Hydra ``policy=`` choice).
    name: str = ""
    #: Why the last ``next_length`` answer of 0 stopped drafting (see the class docstring).
    draft_stop_reason: str = "policy_bound"

    @property
    def stop_reason(self) -> str:
        """Deprecated spelling of ``draft_stop_reason`` (reads and writes it), kept so that policies
        written before the rename keep reporting why drafting stopped."""
        return self.draft_stop_reason

    @stop_reason.setter
    def stop_reason(self, value: str) -> None:
        self.draft_stop_reason = value

    def reset(self) -> None:
        """Forget per-prompt state; called before each prompt. Default: nothing."""

    @abstractmethod
    def next_length(self, draft: Draft) -> int:
        """Tokens to add to ``draft`` (0 = stop drafting and verify). Must be >= 0."""

    def update(self, record: RoundRecord) -> None:
        """Learn from the verified round. Default: nothing (stateless policies)."""


class TreePolicy(LengthPolicy):
    """Base class of policies that shape a draft TREE (``specpolicy.tree``) instead of a chain's
    length: the loop hands the whole round's drafting to ``draft_tree`` and verifies the tree in
    one target pass. A tree policy works with the drafters that offer what it needs (e.g. EAGLE-2's
    dynamic tree needs ``tree_root`` / ``tree_expand``: ``eagle3``, ``ar``); ``check_drafter``
    says so, in one line, before the first prompt.
    """

    def next_length(self, draft: Draft) -> int:  # the loop calls draft_tree instead
        raise TypeError(f"{type(self).__name__} shapes draft trees: the loop calls draft_tree, not next_length")

    def check_drafter(self, drafter: Any) -> None:
        """Raise ``ValueError`` naming the policy and the drafter when the drafter cannot draft
        this policy's trees. Default: accept every drafter."""

    @abstractmethod
    def draft_tree(self, drafter: Any, room: int) -> tuple[Draft, str]:
        """Draft the round's tree with ``drafter``: at most ``room`` nodes deep (tokens that can
        still be emitted after the correction/bonus one).

        Returns:
            ``(draft, why drafting stopped)``: a tree (``Draft.parents`` set; a chain is fine too)
            and its ``RoundRecord.draft_stop_reason`` (``"policy_bound"``, ``"room"``, ``"length_0"``, ...).
        """


class PolicyAnswerError(ValueError):
    """A policy's ``next_length`` answered something other than an integer >= 0 (e.g. ``2.5`` or
    ``-1``); raised by the decoding loop before the answer reaches the drafter, so the error is
    the policy's (``policy``: the policy object, ``answer``: what it returned)."""

    def __init__(self, policy: Any, answer: Any) -> None:
        self.policy = policy
        self.answer = answer
        kind = "a negative speculation length" if isinstance(answer, int) else f"a {type(answer).__name__}"
        super().__init__(f"policy {getattr(policy, 'name', '') or type(policy).__name__!r} returned {answer!r} from "
                         f"next_length ({kind}); a speculation length must be an integer >= 0")
