"""``CausalRunner``: a causal LM's passes over ``(R, n)`` positions, however the run executes them.

A drafter with a causal LM (a small Llama, Mistral, Qwen2 or Qwen3 checkpoint) states its algorithm as passes over its
requests' sequences -- "feed request i its tokens ``tokens[i]`` after what it has cached; give me
their logits" -- and this runner executes each pass:

- eager (``runtime.compile=false``): the Hugging Face forward, a ``DynamicCache`` per request;
- compiled (``runtime.compile=true``): ``specpolicy.runners.decoder.StaticDecoder`` -- the static KV
  cache compiled with ``torch.compile`` (CUDA graphs on CUDA) -- with one sequence (the batch-1
  loop) or, from ``batched(slots)`` (the batched loop, ``generation.batch_size``), ``slots``
  sequences shared by the requests: one compiled pass for every request at once.

With ``single`` (the AR drafter's), batch 1 runs on the static cache's one-sequence pass
(``StaticDecoder.run``). Beside ``forward``: ``last`` (each request's last position only, with the
LM head's input when asked), ``tree`` (a draft tree's nodes under a tree mask, positions by depth)
and ``together`` (eager, several requests: autoregressive steps as ONE padded pass each).

Rolling back is ``CausalSequence.crop``: a length on the static cache, a crop of the dynamic one.
``docs/how-to/write-a-drafter-or-verifier.md`` ("A drafter on the runner") builds a drafter on it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core.cache import append_columns, buffered_cache, crop_cache, padded_cache
from specpolicy.core.runtime import Runtime, inference_mode, no_grad
from specpolicy.runners.decoder import StaticDecoder
from specpolicy.runners.sequences import SharedSequences

#: Most positions a request may feed in the first pass of ``together`` (its committed tokens not yet
#: cached, e.g. after many rounds without a draft) and still join the padded batch; one with more
#: runs alone, not padding every row to its length.
BATCH_POSITIONS = 16
#: Attention implementations that take the custom 4-D mask of ``together``'s padded passes.
BATCHED_ATTENTION = ("sdpa", "eager")


@dataclass
class CausalSequence:
    """One request's sequence on a ``CausalRunner`` (``open``): a ``DynamicCache`` (eager) or a
    sequence ``slot`` of a static cache's ``rows`` (compiled)."""

    cache: DynamicCache | None = None
    rows: SharedSequences | None = None
    slot: int = -1
    static: StaticDecoder | None = None  # a runner of one sequence (``single``): its static cache

    @property
    def length(self) -> int:
        """Cached positions (tokens)."""
        if self.static is not None:
            return self.static.length
        return self.cache.get_seq_length() if self.rows is None else self.rows.lengths[self.slot]

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` cached positions (a no-op if shorter).

        Raises:
            ValueError: a negative ``length``.
        """
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if self.static is not None:
            self.static.length = min(self.static.length, length)
        elif self.rows is None:
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
        single: batch 1 runs on the static cache's one-sequence pass (``StaticDecoder.run``, the
            batch-1 kernels; one request open at a time), not on its rows (``run_rows``).
    Raises:
        ValueError: compiled, a model type the static cache does not run, or no capacity.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        runtime: Runtime,
        capacity: int | None = None,
        static_cache: bool | None = None,
        single: bool = False,
    ) -> None:
        self.model, self.runtime, self.single = model, runtime, single
        self.capacity = int(capacity or getattr(model.config, "max_position_embeddings", 0) or 0)
        self.static: StaticDecoder | None = None
        self._rows: SharedSequences | None = None  # the static cache's sequences (compiled)
        self._batched: dict[int, CausalRunner] = {}  # by batch size, built once each
        if runtime.compile if static_cache is None else static_cache:
            if self.capacity < 1:
                raise ValueError("the static cache needs a capacity: the model has no max_position_embeddings")
            self._use(StaticDecoder(model, self.capacity, compile=runtime.compile, settings=runtime.compiled))

    def _use(self, static: StaticDecoder, warm: bool = True) -> None:
        self.static, self._rows = static, SharedSequences(static)
        if warm:
            self.runtime.warmup_s += static.warmup()

    def use(self, static: StaticDecoder | None) -> None:
        """Run on ``static`` (a ``StaticDecoder`` of one sequence, warmed by the caller), or eagerly
        (None): how a test gives a drafter the compiled runtime's static cache, uncompiled."""
        if static is None:
            self.static, self._rows = None, None
        else:
            self._use(static, warm=False)

    def eager(self) -> CausalRunner:
        """This runner without its static cache (its passes eager): a copy of a batch-1 drafter for
        one request of a batched run, which must not write the batch-1 cache."""
        runner = copy.copy(self)
        runner.static, runner._rows, runner._batched = None, None, {}
        return runner

    @property
    def sequences(self) -> SharedSequences | None:
        """The static cache's sequences (their lengths, the free ones); None eager."""
        return self._rows

    @property
    def shared(self) -> bool:
        """Whether the requests share the static cache's rows (``batched``)."""
        return self._rows is not None and not self.single

    def batched(self, slots: int) -> CausalRunner:
        """The runner of a batched run of at most ``slots`` requests in flight: compiled, one static
        cache of ``slots`` sequences (built and compiled once per batch size), a sequence per
        request from ``open`` to ``close``; eager, this runner (a cache per request)."""
        if self.static is None:
            return self
        runner = self._batched.get(slots)
        if runner is None:
            runner = copy.copy(self)
            runner._batched, runner.single = {}, False
            compiled, settings = self.static.compiled, self.runtime.compiled
            runner._use(StaticDecoder(self.model, self.capacity, compiled, rows=slots, settings=settings))
            self._batched[slots] = runner
        return runner

    def batched_cache(self, slots: int) -> StaticDecoder | None:
        """The static cache ``batched(slots)`` built, if it did (benchmarks read its compile seconds)."""
        runner = self._batched.get(slots)
        return None if runner is None else runner.static

    def open(self) -> CausalSequence:
        """A new request's empty sequence.

        Raises:
            RuntimeError: compiled, every sequence of the static cache held (close them).
        """
        if self._rows is None:
            return CausalSequence(cache=buffered_cache())  # a rollback is a length (BufferedLayer)
        if self.single and self.static is not None:
            self.static.reset()
            return CausalSequence(static=self.static)
        return CausalSequence(rows=self._rows, slot=self._rows.take())

    def close(self, sequence: CausalSequence | None) -> None:
        """The request is done: its static sequence is free for the next (eager: nothing to do)."""
        if sequence is not None and sequence.rows is not None:
            sequence.rows.give_back(sequence.slot)

    @inference_mode
    def forward(self, sequences: list[CausalSequence], tokens: list[torch.Tensor]) -> list[torch.Tensor]:
        """One pass over ``(R, n)`` positions: request ``i`` is fed ``tokens[i]`` (``(n_i,) int64``,
        ``n_i`` >= 1) after its cached positions, causally; each sequence grows by ``n_i``.

        Returns:
            each request's logits ``(n_i, V)`` in the model's dtype (row j predicts the token after
            ``tokens[i][j]``).
        Raises:
            ValueError: compiled, a sequence that would pass ``capacity``.
        """
        if sequences[0].static is not None:  # ``single``: the static cache's one-sequence pass
            return [s.static.run(t)[0] for s, t in zip(sequences, tokens) if s.static is not None]
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

    @no_grad
    def last(
        self, sequences: list[CausalSequence], tokens: list[torch.Tensor], hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward``, keeping each request's last position only: ONE pass on a batched run's shared
        static cache (``run_rows``; the other sequences idle, untouched), else request after request
        (batch 1: the static cache's one-sequence pass, or the Hugging Face forward's last logits).

        Args:
            sequences / tokens: as ``forward``'s (``tokens[i]`` ``(n_i,) int64``, n_i >= 1).
            hidden: eager, also the LM head's input (the final norm's output) at each last position.
        Returns:
            ``(logits (R, V) in the model's dtype, hidden (R, H) or None)`` -- None on a static cache.
        """
        if sequences[0].rows is not None:  # a batched run's shared static cache
            rows, device = sequences[0].rows, tokens[0].device
            counts, slots = [int(t.shape[0]) for t in tokens], [s.slot for s in sequences]
            ids = torch.zeros((len(rows.lengths), max(counts)), dtype=torch.long, device=device)
            for slot, count, t in zip(slots, counts, tokens):
                ids[slot, :count] = t
            logits, _ = rows.static.run_rows(ids, *rows.feed(slots, counts))
            index, last = torch.tensor(slots, device=device), torch.tensor(counts, device=device) - 1
            return logits[index, last], None
        logits, states = [], []
        for s, t in zip(sequences, tokens):
            if s.static is not None:  # compiled, batch 1: the forward at R = 1
                logits.append(s.static.run(t)[0][-1:])
                continue
            out = self.model(
                input_ids=t[None], cache=s.cache, use_cache=True, logits_to_keep=1, output_hidden_states=hidden
            )
            logits.append(out.logits[0, -1:])
            if hidden:
                states.append(out.hidden_states[-1][0, -1:])
        return torch.cat(logits), torch.cat(states) if states else None

    @no_grad
    def tree(
        self, sequence: CausalSequence, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor
    ) -> torch.Tensor:
        """One request's pass over draft-tree nodes (batch 1): ``tokens`` ``(m,) int64`` after its cached
        positions, at RoPE ``positions`` ``(m,) int64`` (by depth), new node i seeing cache column j
        where ``attend`` ``(m, cached + m) bool`` (``specpolicy.core.tree``); cached like a chain.

        Returns:
            the nodes' logits ``(m, V)`` in the model's dtype.
        Raises:
            ValueError: on a batched run's shared cache (trees run at batch 1).
        """
        from specpolicy.core.attention import as_model_mask

        if sequence.rows is not None:
            raise ValueError("a draft tree runs at batch 1: its passes do not run on a batched run's shared cache")
        if sequence.static is not None:
            return sequence.static.run(tokens, positions, attend)[0]
        mask = as_model_mask(attend[None, None], self.model.config._attn_implementation, self.runtime.torch_dtype)
        return self.model(
            input_ids=tokens[None],
            position_ids=positions[None],
            attention_mask=mask,
            cache=sequence.cache,
            use_cache=True,
        ).logits[0]

    def joins(self, sequence: CausalSequence, tokens: torch.Tensor) -> bool:
        """Whether a request feeding ``tokens`` ``(n,)`` next joins ``together``'s padded passes: eager,
        its cache non-empty, ``n`` <= ``BATCH_POSITIONS``, an attention in ``BATCHED_ATTENTION``."""
        return (
            sequence.cache is not None
            and self.model.config._attn_implementation in BATCHED_ATTENTION
            and bool(sequence.cache.get_seq_length())
            and int(tokens.shape[0]) <= BATCH_POSITIONS
        )

    @no_grad
    def together(
        self,
        sequences: list[CausalSequence],
        first: list[torch.Tensor],
        num_tokens: list[int],
        choose: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, list]],
    ) -> tuple[torch.Tensor, torch.Tensor, list[list]]:
        """Eager, several requests (each ``joins``): ``max(num_tokens)`` autoregressive steps, each ONE
        pass of the model over all of them. The caches are copied once into one padded ``(b,
        kv_heads, W, head_dim)`` cache per layer (``W`` = the longest); step 0 feeds row i ``first[i]``
        (padded to the most), each later step every row's last chosen token (a row that has its
        tokens is fed on, its output unused), with a 4-D mask keeping every row to its own cached
        columns and new ones, causally, at its own positions. Then the new keys and values join each
        request's own cache -- ``first[i]`` and its first ``num_tokens[i] - 1`` chosen tokens (never
        its last) -- and the padded copy is dropped.

        Args:
            sequences: the requests' eager sequences. first: ``(n_i,) int64`` each.
            num_tokens: tokens each request chooses (>= 1).
            choose: a step's ``(b, V)`` last-position logits to ``(tokens (b,) int64, confidences
                (b,), per-row extras)``.
        Returns:
            ``(tokens (b, steps) int64, confidences (b, steps), each step's per-row extras)``.
        """
        from specpolicy.core.attention import as_model_mask

        model, device = self.model, first[0].device
        b, steps = len(sequences), max(num_tokens)
        counts = [int(x.shape[0]) for x in first]
        # row i's columns [0, L_i), the rest masked
        cache, lengths = padded_cache([s.cache for s in sequences if s.cache is not None])
        n, width = max(counts), max(lengths)
        inputs = torch.zeros((b, n), dtype=torch.long, device=device)
        for i, x in enumerate(first):
            inputs[i, : counts[i]] = x
        lengths_t, counts_t = torch.tensor(lengths, device=device), torch.tensor(counts, device=device)
        seen = torch.arange(width + n, device=device)[None] < (lengths_t[:, None])  # (b, W + n) visible columns
        seen[:, width:] = torch.arange(n, device=device)[None] < counts_t[:, None]
        rows = torch.arange(b, device=device)
        tokens, confs, extras = [], [], []  # per step: (b,), (b,), b extras
        attn, dtype = model.config._attn_implementation, self.runtime.torch_dtype
        for step in range(steps):
            if step == 0:
                causal = torch.ones((b, n, width + n), dtype=torch.bool, device=device)
                causal[:, :, width:] = torch.tril(causal[:, :, width:])
                mask = seen[:, None, :] & causal
                positions = lengths_t[:, None] + torch.arange(n, device=device)
                last = counts_t - 1
            else:
                seen = torch.cat([seen, torch.ones((b, 1), dtype=torch.bool, device=device)], dim=1)
                mask = seen[:, None, :]
                positions = (lengths_t + counts_t + step - 1)[:, None]
                last = torch.zeros_like(counts_t)
            logits = model(
                input_ids=inputs,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                attention_mask=as_model_mask(mask[:, None], attn, dtype),
            ).logits[rows, last]  # (b, V)
            token, conf, extra = choose(logits)
            tokens.append(token)
            confs.append(conf)
            extras.append(extra)
            inputs = token[:, None]
        for i, s in enumerate(sequences):
            # fed: the first-step tokens, then the chosen tokens but the last (never fed)
            columns = torch.cat(
                [
                    torch.arange(width, width + counts[i], device=device),
                    torch.arange(width + n, width + n + num_tokens[i] - 1, device=device),
                ]
            )
            if s.cache is not None:  # eager sequences only (``joins``)
                append_columns(s.cache, cache, i, columns)
        return torch.stack(tokens, 1), torch.stack(confs, 1), extras
