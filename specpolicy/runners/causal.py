"""``CausalRunner``: a causal LM's passes over ``(R, n)`` positions, however the run executes them.

A drafter with a causal LM (a small Llama, Mistral, Qwen2 or Qwen3 checkpoint) states its algorithm as passes over its
requests' sequences -- "feed request i its tokens ``tokens[i]`` after what it has cached; give me
their logits" -- and this runner executes each pass:

- eager (``runtime.compile=false``): the Hugging Face forward, a ``DynamicCache`` per request;
- compiled (``runtime.compile=true``): ``specpolicy.runners.decoder.StaticDecoder`` -- the static KV
  cache compiled with ``torch.compile`` (CUDA graphs on CUDA) -- with one sequence (the batch-1
  loop) or, from ``batched(slots)`` (the batched loop, ``generation.batch_size``), ``slots``
  sequences shared by the requests: one compiled pass for every request at once.

Rolling back is ``CausalSequence.crop``: a length on the static cache, a crop of the dynamic one.
``docs/how-to/write-a-drafter-or-verifier.md`` ("A drafter on the runner") builds a drafter on it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core.cache import crop_cache
from specpolicy.core.runtime import Runtime
from specpolicy.runners.decoder import StaticDecoder
from specpolicy.runners.sequences import SharedSequences


@dataclass
class CausalSequence:
    """One request's sequence on a ``CausalRunner`` (``open``): a ``DynamicCache`` (eager) or a
    sequence ``slot`` of a static cache's ``rows`` (compiled)."""

    cache: DynamicCache | None = None
    rows: SharedSequences | None = None
    slot: int = -1

    @property
    def length(self) -> int:
        """Cached positions (tokens)."""
        return self.cache.get_seq_length() if self.rows is None else self.rows.lengths[self.slot]

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` cached positions (a no-op if shorter).

        Raises:
            ValueError: a negative ``length``.
        """
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if self.rows is None:
            crop_cache(self.cache, length)
        else:
            self.rows.lengths[self.slot] = min(self.rows.lengths[self.slot], length)


class CausalRunner:
    """A causal LM's passes for ``R`` requests at once (``forward``), eager or compiled as the
    runtime says.

    Args:
        model: a Hugging Face causal LM on ``runtime.torch_device`` in ``runtime.torch_dtype``, eval
            mode; compiled: a model ``specpolicy.runners.decoder`` runs (``SUPPORTED``, ``unsupported``).
        runtime: the run's runtime: ``compile`` and its ``runtime.*`` settings (``compiled``); the
            compile seconds are added to ``runtime.warmup_s``.
        capacity: most cached positions per request (tokens); default the model's
            ``max_position_embeddings``.
        static_cache: run on the static cache (default: ``runtime.compile``); compiled only when
            ``runtime.compile`` (uncompiled, the same passes run eagerly: a cheap check of them).
    Raises:
        ValueError: compiled, a model type the static cache does not run, or no capacity.
    """

    def __init__(
        self, model: PreTrainedModel, runtime: Runtime, capacity: int | None = None, static_cache: bool | None = None
    ) -> None:
        self.model, self.runtime = model, runtime
        self.capacity = int(capacity or getattr(model.config, "max_position_embeddings", 0) or 0)
        self.static: StaticDecoder | None = None
        self._rows: SharedSequences | None = None  # the static cache's sequences (compiled)
        self._batched: dict[int, CausalRunner] = {}  # by batch size, built once each
        if runtime.compile if static_cache is None else static_cache:
            if self.capacity < 1:
                raise ValueError("the static cache needs a capacity: the model has no max_position_embeddings")
            self._use(StaticDecoder(model, self.capacity, compile=runtime.compile, settings=runtime.compiled))

    def _use(self, static: StaticDecoder) -> None:
        self.static, self._rows = static, SharedSequences(static)
        self.runtime.warmup_s += static.warmup()

    def batched(self, slots: int) -> CausalRunner:
        """The runner of a batched run of at most ``slots`` requests in flight: compiled, one static
        cache of ``slots`` sequences (built and compiled once per batch size), a sequence per
        request from ``open`` to ``close``; eager, this runner (a cache per request)."""
        if self.static is None:
            return self
        runner = self._batched.get(slots)
        if runner is None:
            runner = copy.copy(self)
            runner._batched = {}
            compiled, settings = self.static.compiled, self.runtime.compiled
            runner._use(StaticDecoder(self.model, self.capacity, compiled, rows=slots, settings=settings))
            self._batched[slots] = runner
        return runner

    def open(self) -> CausalSequence:
        """A new request's empty sequence.

        Raises:
            RuntimeError: compiled, every sequence of the static cache held (close them).
        """
        if self._rows is None:
            return CausalSequence(cache=DynamicCache())
        return CausalSequence(rows=self._rows, slot=self._rows.take())

    def close(self, sequence: CausalSequence | None) -> None:
        """The request is done: its static sequence is free for the next (eager: nothing to do)."""
        if sequence is not None and sequence.rows is not None:
            sequence.rows.give_back(sequence.slot)

    @torch.inference_mode()
    def forward(self, sequences: list[CausalSequence], tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        """One pass over ``(R, n)`` positions: request ``i`` is fed ``tokens[i]`` (``(n_i,) int64``,
        ``n_i`` >= 1) after its cached positions, causally; each sequence grows by ``n_i``.

        Returns:
            each request's logits ``(n_i, V)`` in the model's dtype (row j predicts the token after
            ``tokens[i][j]``).
        Raises:
            ValueError: compiled, a sequence that would pass ``capacity``.
        """
        if sequences[0].rows is None:  # eager: the Hugging Face forward, request after request
            return [
                self.model(input_ids=t[None], cache=s.cache, use_cache=True).logits[0]
                for s, t in zip(sequences, tokens)
            ]
        rows = sequences[0].rows
        counts = [int(t.shape[0]) for t in tokens]
        ids = torch.zeros((rows.static.rows, max(counts)), dtype=torch.long, device=tokens[0].device)
        for s, t in zip(sequences, tokens):
            ids[s.slot, : t.shape[0]] = t
        for s, n in zip(sequences, counts):  # before any length moves
            if s.length + n > self.capacity:
                raise ValueError(f"{n} new positions after {s.length} cached do not fit the capacity {self.capacity}")
        starts, counts_t = rows.feed([s.slot for s in sequences], counts)
        logits, _ = rows.static.run_rows(ids, starts, counts_t)  # one pass, every sequence (idle ones to scratch)
        return [logits[s.slot, :n] for s, n in zip(sequences, counts)]
