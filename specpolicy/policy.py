"""The ``LengthPolicy`` interface: how many tokens to speculate in a round."""

from __future__ import annotations

from abc import ABC, abstractmethod

from specpolicy.types import Draft, RoundRecord


class LengthPolicy(ABC):
    """Base class of speculation-length policies (``policies/``, one module each).

    Within a round the loop asks ``next_length(draft)`` first with the empty draft, then
    after each extension, drafting that many more tokens until it returns 0; the draft
    is then verified. After verification the policy is fed the round's ``RoundRecord``.
    A first answer of 0 means no speculation this round (plain decoding).
    """

    name: str = ""

    def reset(self) -> None:
        """Forget per-prompt state; called before each prompt. Default: nothing."""

    @abstractmethod
    def next_length(self, draft: Draft) -> int:
        """Tokens to add to ``draft`` (0 = stop drafting and verify). Must be >= 0."""

    def update(self, record: RoundRecord) -> None:
        """Learn from the verified round. Default: nothing (stateless policies)."""
