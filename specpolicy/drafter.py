"""The ``Drafter`` interface: proposes tokens that continue the committed sequence."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specpolicy.types import Draft, Verification


class Drafter(ABC):
    """Base class of every drafter (one subclass per strategy, one module each under ``drafters/``).

    Life cycle for one prompt (batch size 1)::

        drafter.prefill(prompt_ids)           # once
        loop:
            draft = drafter.draft(n)           # start a round's draft ...
            draft = drafter.draft(m)           # ... and extend it, any number of times
            drafter.commit(draft, verification)  # after the target's verdict

    ``draft`` extends the current round's draft without redoing forward passes already
    spent on it; ``commit`` rolls the drafter's state (KV cache) back to the committed
    sequence. A drafter never decides the speculation length: the ``LengthPolicy`` does.
    """

    #: Name under which the drafter registers (the Hydra ``drafter=`` choice).
    name: str = ""

    @abstractmethod
    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Start a new prompt.

        Args:
            prompt_ids: ``(P,) int64`` the prompt, P >= 1. Its last token is the first
                token the drafter continues from.
        Raises:
            ValueError: if the prompt is empty or longer than the drafter's context.
        """

    @abstractmethod
    def draft(self, num_tokens: int) -> Draft:
        """Extend the current round's draft by ``num_tokens`` tokens.

        Args:
            num_tokens: tokens to add, >= 1.
        Returns:
            The whole draft of the round so far (earlier tokens unchanged), with
            ``forward_passes`` counting every pass spent on it.
        """

    @abstractmethod
    def commit(self, draft: Draft, verification: Verification) -> None:
        """Take the target's verdict: the committed sequence grows by
        ``verification.committed_tokens(draft)``; discard the rest and start a new round.

        ``draft`` may hold trailing tokens the drafter did not produce (draft reuse).
        """
