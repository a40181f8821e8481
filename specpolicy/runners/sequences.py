"""The sequences of a static cache shared by the requests of a batched run (``SharedSequences``) and
a drafter's side of it (``SharedSequencesDrafter``): each request holds one sequence from its
prefill to its release; batch 1 is one sequence."""

from __future__ import annotations

import copy
from typing import Any

import torch

from specpolicy.runners.static import StaticPasses


class SharedSequences:
    """A static cache of one or more sequences (``StaticDecoder``, ``StaticEagle3``, ``StaticDFlash``)
    shared by the requests of a run (``Drafter.batched``; one sequence: the batch-1 loop's): each request holds one sequence from its
    prefill to its release; the sequences' lengths live here.

    Args:
        static: the static model of ``rows`` sequences (its ``rows``).
    """

    def __init__(self, static: StaticPasses) -> None:
        self.static = static
        self.lengths = [0] * static.rows
        self.free = list(range(len(self.lengths)))

    def take(self) -> int:
        """A free sequence, emptied.

        Raises:
            RuntimeError: when every sequence is held (more requests than the batch size: a bug,
                not a prompt to skip).
        """
        if not self.free:
            raise RuntimeError(f"the drafter's batched cache holds {len(self.lengths)} requests, its sequences")
        slot = self.free.pop(0)
        self.lengths[slot] = 0
        return slot

    def give_back(self, slot: int) -> None:
        """Free sequence ``slot`` (its request left)."""
        self.free.append(slot)

    def feed(self, slots: list[int], counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's ``starts`` ``(rows,) int64`` (every sequence's length) and ``counts`` ``(rows,)
        int64`` (``counts[i]`` new positions for sequence ``slots[i]``, 0 for the others), for
        ``run_rows``; the lengths grow by the counts."""
        device = self.static.columns.device
        starts = torch.tensor(self.lengths, device=device)
        fed = [0] * len(self.lengths)
        for slot, count in zip(slots, counts):
            fed[slot] = count
            self.lengths[slot] += count
        return starts, torch.tensor(fed, device=device)


class SharedSequencesDrafter:
    """The batched loop's side of a drafter with a static cache (``Drafter.batched`` / ``release``),
    one place for the EAGLE-3 and DFlash drafters (the AR drafter's is ``CausalRunner.batched``):
    ``batched(slots)`` builds the drafter's static cache of ``slots`` sequences once per batch size (``_batched_static``, compiled as the batch-1 one,
    its compile seconds added to ``runtime.warmup_s``) and returns a copy whose own copies -- one per
    request, greedy or sampling -- each take a sequence in ``prefill`` (``_take_sequence``) and
    give it back in ``release``. A drafter sets ``static``, ``runtime`` and calls
    ``_no_shared_sequences`` in its ``__init__``.
    """

    static: StaticPasses | None
    runtime: Any

    def _no_shared_sequences(self) -> None:
        self._static_batched: dict[int, StaticPasses] = {}  # by batch size, built once each
        self._shared: SharedSequences | None = None  # a batched run's sequences (``batched``), else None
        self._slot: int | None = None  # this request's sequence among them, while it holds one

    def _batched_static(self, slots: int) -> StaticPasses:  # pragma: no cover - abstract
        raise NotImplementedError

    def batched(self, slots: int):
        """On the compiled runtime, the drafter whose copies draft on a static cache of ``slots``
        sequences, one each from ``prefill`` to ``release``; else this drafter."""
        if self.static is None:
            return self
        batch = self._static_batched.get(slots)
        if batch is None:
            batch = self._batched_static(slots)
            self.runtime.warmup_s += batch.warmup()
            self._static_batched[slots] = batch
        lead = copy.copy(self)  # without the batch-1 static cache (Drafter.__copy__)
        lead._shared, lead._slot = SharedSequences(batch), None
        return lead

    def release(self) -> None:
        """The batched loop is done with this request: its sequence of the shared cache is free."""
        if self._slot is not None and self._shared is not None:
            self._shared.give_back(self._slot)
        self._slot = None

    def _take_sequence(self) -> bool:
        """``prefill``'s: give back a sequence still held, then take one for a request of a batched
        run. Returns whether this request drafts on the shared sequences."""
        self.release()
        if self._shared is None:
            return False
        self._slot = self._shared.take()
        return True
