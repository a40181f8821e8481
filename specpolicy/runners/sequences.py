"""The sequences of a static cache shared by the requests of a batched run (``SharedSequences``, one
request's: ``SharedLength``) and the static-cache side of the EAGLE-3 and DFlash runners
(``SequencesRunner``): each request holds one sequence from its prefill to its release; batch 1 is
one sequence."""

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


class SharedLength:
    """One request's sequence ``slot`` of ``SharedSequences`` (``SequencesRunner.open``): what a
    drafter asks of its cache, ``length`` and ``crop``."""

    def __init__(self, rows: SharedSequences, slot: int) -> None:
        self.rows, self.slot = rows, slot

    @property
    def length(self) -> int:
        """Cached positions (tokens)."""
        return self.rows.lengths[self.slot]

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` cached positions (a no-op if shorter)."""
        self.rows.lengths[self.slot] = min(self.rows.lengths[self.slot], length)


class SequencesRunner:
    """The static-cache side of a runner whose model runs behind a ``StaticPasses``
    (``Eagle3Runner``: ``StaticEagle3``; ``DFlashRunner``: ``StaticDFlash``), one place for both
    (the AR drafter's is ``CausalRunner``):

    - the compiled runtime's static cache of one sequence (``static``, the batch-1 loop's), built
      and warmed up by the runner's constructor when ``runtime.compile`` (``_start``: capacity in
      tokens; compile seconds added to ``runtime.warmup_s``), or given by ``use``;
    - ``batched(slots)``: the runner of a batched run, whose requests hold one sequence each of a
      static cache of ``slots`` sequences (``sequences``), built once per batch size (``_build``,
      compiled as the batch-1 one, its compile seconds added to ``runtime.warmup_s``);
    - ``eager()``: the runner without a static cache (a copy of a batch-1 drafter for one request
      of a batched run, which must not write the batch-1 cache).

    A subclass sets ``runtime`` and calls ``_start`` in its constructor, and defines ``_build``.
    """

    runtime: Any

    def _start(self, capacity: int) -> None:
        """No static cache yet; on the compiled runtime (``runtime.compile``), one of ``capacity``
        tokens per sequence, compiled and warmed up."""
        self.static: StaticPasses | None = None  # the compiled runtime's cache of one sequence, else None
        self.sequences: SharedSequences | None = None  # a batched run's sequences (``batched``), else None
        self._batched: dict[int, StaticPasses] = {}  # by batch size, built once each
        if self.runtime is not None and self.runtime.compile:
            static = self._build(capacity, 1, compile=True)
            self.use(static)
            self.runtime.warmup_s += static.warmup()

    def open(self) -> Any:  # pragma: no cover - abstract
        """A new request's empty cache (eager, its own; else a sequence of the static cache)."""
        raise NotImplementedError

    def _build(self, capacity: int, rows: int, compile: bool) -> StaticPasses:  # pragma: no cover - abstract
        """The model's static cache of ``rows`` sequences of ``capacity`` tokens (``runtime.compiled``'s
        settings), compiled with ``compile``."""
        raise NotImplementedError

    def use(self, static: StaticPasses | None) -> None:
        """Run batch 1 on ``static`` (a static cache of one sequence, warmed by the caller), or
        eagerly (None): how a test gives a drafter the compiled runtime's static cache, uncompiled."""
        self.static, self.sequences, self._batched = static, None, {}

    def eager(self):
        """This runner without its static cache (its passes eager)."""
        runner = copy.copy(self)
        runner.static, runner.sequences, runner._batched = None, None, {}
        return runner

    def batched(self, slots: int):
        """On a static cache, the runner whose requests each hold a sequence of a static cache of
        ``slots`` sequences (built and warmed up once per batch size; fresh sequences each call)
        from ``open`` to ``close``; eager, this runner."""
        if self.static is None:
            return self
        batch = self._batched.get(slots)
        if batch is None:
            batch = self._build(self.static.capacity, slots, self.static.compiled)
            self.runtime.warmup_s += batch.warmup()
            self._batched[slots] = batch
        runner = self.eager()
        runner.sequences = SharedSequences(batch)
        return runner

    def batched_cache(self, slots: int) -> StaticPasses | None:
        """The static cache ``batched(slots)`` built, if it did (benchmarks read its compile seconds)."""
        return self._batched.get(slots)

    def close(self, sequence: Any) -> None:
        """The request is done: its sequence of a batched run's shared cache is free for the next
        (another cache: nothing to do)."""
        if isinstance(sequence, SharedLength):
            sequence.rows.give_back(sequence.slot)


class SharedSequencesDrafter:
    """The drafter's side of a ``SequencesRunner`` (the EAGLE-3 and DFlash drafters; the AR
    drafter's is its own, on ``CausalRunner``): ``static`` is the runner's; ``batched(slots)``
    returns a copy on the runner's ``batched(slots)``, whose own copies -- one per request, greedy
    or sampling -- each take a sequence in ``prefill`` (``_open``) and give it back in
    ``release``; a copy of a batch-1 compiled drafter drafts eagerly (its static cache is not
    shared). A drafter sets ``runner`` in its ``__init__`` and keeps its request's cache in
    ``cache``.
    """

    runner: Any  # a SequencesRunner (``Eagle3Runner``, ``DFlashRunner``)
    cache: Any

    @property
    def static(self) -> StaticPasses | None:
        """The compiled runtime's static cache of one sequence (batch 1, the runner's), else None."""
        return self.runner.static

    @static.setter
    def static(self, static: StaticPasses | None) -> None:
        self.runner.use(static)

    def __copy__(self):
        """``Drafter.__copy__``: a copy of a batch-1 compiled drafter drafts eagerly; a copy of
        ``batched``'s shares its static cache of one sequence per request."""
        clone = super().__copy__()  # type: ignore[misc]
        if self.runner.static is not None:
            clone.runner = self.runner.eager()
        return clone

    def batched(self, slots: int):
        """On a static cache, the drafter whose copies draft on a static cache of ``slots``
        sequences (the runner's ``batched``), one each from ``prefill`` to ``release``; else this drafter."""
        if self.runner.static is None:
            return self
        lead = copy.copy(self)
        lead.runner, lead.cache = self.runner.batched(slots), None
        return lead

    def release(self) -> None:
        """The batched loop is done with this request: its sequence of the shared cache is free."""
        self.runner.close(self.cache)
        self.cache = None

    def _open(self) -> None:
        """``prefill``'s: give back a sequence still held, then open the request's cache on the runner."""
        self.release()
        self.cache = self.runner.open()
