"""How DFlash's pass runs (``DFlashRunner``): eager, or behind a static KV cache of its context
(``StaticDFlash``: the compiled runtime's DFlash pass, one forward over ``R`` sequences), for one
request or many (``specpolicy.models.dflash.DFlashDraftModel``; the drafter, ``drafters/dflash.py``).
The runner builds the static caches, the drafter never does: its constructor the compiled
runtime's (``runtime.compile=true``), ``batched(slots)`` a batched run's
(``specpolicy.runners.sequences.SequencesRunner``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from specpolicy.core.runtime import CompileSettings, Runtime, inference_mode
from specpolicy.models.dflash import DFlashDraftModel
from specpolicy.models.kv import KVCache
from specpolicy.runners.sequences import SequencesRunner, SharedLength, SharedSequences
from specpolicy.runners.static import StaticPasses, _rotate_half


class StaticDFlash(StaticPasses):
    """The DFlash drafter behind a static KV cache of its context for ``rows`` sequences, one per
    request (``rows`` = 1: the batch-1 loop): per request a sequence of its own columns holding its
    committed positions' keys and values, so a pass writes them where they stay. A pass
    (``run_rows``) feeds every sequence at once: a request that drafts this step its newly
    committed positions' features (context rows, causal: ``fc``, ``hidden_norm``, each layer's k/v
    projections, as ``context_keys_values``) and then its block (attending to its whole context
    and to the block itself, bidirectional), at its length, as ``DFlashDraftModel.forward`` over
    the cached context; the other sequences, and the padding, at scratch columns past the
    capacity, which no real position sees. Only the context stays: the block's keys and values sit
    past the length, overwritten by the next pass. Buckets: ``runtime.buckets`` and 128 (a block
    with up to 112 drafted tokens given); several sequences' passes are 2 columns or more. Greedy
    and sampling requests alike (the drafter chooses from the logits).

    Args:
        model: the DFlash model, eval mode. capacity / compile / buckets / rows / settings: as
            ``specpolicy.runners.decoder.StaticDecoder`` (capacity per sequence).
    Raises:
        ValueError: ``rows`` < 1 or a capacity < 1.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        capacity: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
        rows: int = 1,
        settings: CompileSettings | None = None,
    ) -> None:
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        super().__init__()
        settings = settings or CompileSettings()
        self.dflash = model
        att = model.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        weight = model.fc.weight
        self.features, self.hidden_size = int(weight.shape[1]), int(weight.shape[0])
        buckets = tuple(sorted(set(settings.buckets if buckets is None else buckets) | {128}))
        layers = len(model.layers)
        self._setup(
            layers,
            self.kv_heads,
            self.head_dim,
            capacity,
            weight.device,
            weight.dtype,
            compile,
            buckets,
            rows,
            settings,
        )

    def _forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        is_context: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor]:
        """One pass over every sequence: block embeddings ``(R, B, H)`` (zeros on context rows),
        context features ``(R, B, F)`` (zeros on block rows), ``is_context`` ``(R, B) bool`` at
        ``positions`` ``(R, B)``, written to columns ``slots`` ``(R, B)``, ``mask`` ``(R, B, width)``.
        Returns ``(R, B, H)`` after the final norm (meaningful on the block rows)."""
        m = self.dflash
        ctx = m.hidden_norm(m.fc(context))  # (R, B, H)
        x = block
        cos, sin = m.rope(x, positions)  # (R, B, d)
        w = mask.shape[-1]
        attn_mask = mask[:, None]  # (R, 1, B, w)
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            k, v = a.keys_values(torch.where(is_context[:, :, None], ctx, h), cos, sin)  # (R, kv, B, d)
            cache_k, cache_v = self.write(i, slots, k, v)
            r, b = h.shape[0], h.shape[1]
            q = a.q_norm(a.q_proj(h).view(r, b, a.num_heads, a.head_dim)).transpose(1, 2)
            q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
            out = F.scaled_dot_product_attention(
                q,
                cache_k[:, :, :w],
                cache_v[:, :, :w],
                attn_mask=attn_mask,
                enable_gqa=a.num_kv_heads != a.num_heads,
            )
            x = x + a.o_proj(out.transpose(1, 2).reshape(r, b, a.num_heads * a.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return (m.norm(x),)

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        device, dtype = self.columns.device, self.keys[0].dtype
        return [
            torch.zeros((b, self.hidden_size), dtype=dtype, device=device),
            torch.zeros((b, self.features), dtype=dtype, device=device),
            torch.zeros(b, dtype=torch.bool, device=device),
        ]

    @inference_mode
    def run_rows(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        context_counts: torch.Tensor,
        counts: torch.Tensor,
        starts: torch.Tensor,
    ) -> torch.Tensor:
        """One drafting pass for the sequences with ``counts`` > 0: sequence ``r``'s first
        ``context_counts[r]`` rows are its newly committed positions (their ``context`` features;
        keys and values kept), the rest of its ``counts[r]`` rows its block (``block`` embeddings),
        all at columns and positions ``starts[r], starts[r] + 1, ...``; its other rows, and every row
        of a sequence with ``counts`` 0, at scratch columns past the capacity. The lengths are the
        caller's (``SharedSequences.feed`` with the context counts).

        Args:
            block: ``(rows, n, H)`` block embeddings (zeros elsewhere); context: ``(rows, n, F)``
                the target's features of the context rows (zeros elsewhere).
            context_counts / counts / starts: ``(rows,) int64`` each.
        Returns:
            ``(rows, n, H)`` outputs after the final norm (meaningful on the block rows).
        Raises:
            ValueError: ``n`` past the largest bucket, or a sequence's rows past the capacity.
        """
        n = int(block.shape[1])
        if n > self.buckets[-1]:
            raise ValueError(f"a DFlash pass of {n} positions exceeds the largest bucket {self.buckets[-1]}")
        ends = starts + counts  # (rows,): past each sequence's block
        longest = int(ends.max())
        if longest > self.capacity:
            raise ValueError(f"new positions up to {longest} do not fit the static cache of {self.capacity}")
        b = self._width(n)
        # padded to the width; always a copy: fresh inference-mode inputs, whoever calls (``passes``)
        block, context = (torch.cat([x, x.new_zeros((x.shape[0], b - n, x.shape[2]))], dim=1) for x in (block, context))
        steps = torch.arange(b, device=starts.device)
        real = steps < counts[:, None]  # (rows, b)
        slots = torch.where(real, starts[:, None] + steps, self.capacity + steps)
        is_context = steps < context_counts[:, None]
        window = min(self.width, -(-max(longest, 1) // self.window) * self.window)
        columns = self.columns[None, None, :window]
        causal = columns <= slots[:, :, None]  # context rows (and scratch rows): causal over the slots
        sees_block = columns < ends[:, None, None]  # block rows: the whole context and the block
        mask = torch.where((is_context | ~real)[:, :, None], causal, sees_block)  # (rows, b, window)
        (out,) = self._run(b, [block, context, is_context], slots.clone(), slots, mask)  # positions: not an alias
        return out[:, :n].clone() if self.replayed else out[:, :n]

    @inference_mode
    def context_rows(self, context: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor) -> None:
        """Write sequence ``r``'s ``counts[r]`` newly committed positions (``context`` ``(rows, n, F)``)
        at its columns from ``starts[r]``, with no block (a new request's prompt, longer than a
        pass: ``StaticPasses._rows_passes``, in chunks); the lengths are the caller's."""
        zeros = context.new_zeros((*context.shape[:2], self.hidden_size))
        ones = torch.ones(context.shape[:2], dtype=torch.bool, device=context.device)
        self._rows_passes([zeros, context, ones], starts, counts)


#: An eager pass over several requests: a request with more newly committed positions than this (a
#: new request's prompt) writes their keys and values alone, not padding every request's to its count.
BATCH_POSITIONS = 16


@dataclass
class BlockPass:
    """One request's part of a DFlash pass (``DFlashRunner.run``): its newly committed positions'
    features join its context, then its block attends to the whole context and to itself.

    Attributes:
        ids: ``(q,) int64`` the block ``[pending, drafted so far, MASK x (B - 1)]``.
        context: ``(u, F)`` the newly committed positions' target features, or None (none).
        sequence: where the request's context is cached (``DFlashRunner.open``): eager, its
            ``KVCache`` (appended to); on a static cache, a ``SharedLength``, its sequence of a
            ``StaticDFlash`` (one sequence: the batch-1 loop's).
    """

    ids: torch.Tensor
    context: torch.Tensor | None
    sequence: KVCache | SharedLength | None

    @property
    def cache(self) -> KVCache | None:
        """Eager: the request's ``KVCache``; else None."""
        return self.sequence if isinstance(self.sequence, KVCache) else None

    @property
    def rows(self) -> SharedSequences | None:
        """On a static cache: its ``SharedSequences``; else None."""
        return self.sequence.rows if isinstance(self.sequence, SharedLength) else None

    @property
    def slot(self) -> int | None:
        """On a static cache: the request's sequence among ``rows``; else None."""
        return self.sequence.slot if isinstance(self.sequence, SharedLength) else None

    @property
    def new(self) -> int:
        """Newly committed positions (``u``)."""
        return 0 if self.context is None else int(self.context.shape[0])


class DFlashRunner(SequencesRunner):
    """How DFlash's pass runs, for ``R`` requests at once: eager (``DFlashDraftModel``: one request
    by its fused ``draft_pass``; several in one padded forward, each row its own context and block)
    or on a ``StaticDFlash`` (compiled; one sequence per request, batch 1 the cache of one), as the
    requests' ``BlockPass`` say. Every path computes what ``DFlashDraftModel.forward`` computes over
    each request's own context; the drafter (``drafters/dflash.py``) states the algorithm once.

    The runner prepares the network (``DFlashDraftModel.fuse``, for ``draft_pass``) and owns its
    static caches (``SequencesRunner``): on the compiled runtime (``runtime.compile``) its
    constructor builds and warms up the one of one sequence (``max_context`` + one block of
    positions; compile seconds added to ``runtime.warmup_s``), ``batched(slots)`` a batched run's.

    Args:
        model: the DFlash network, eval mode (its ``spec``: block size, mask token).
        embed_tokens: the target's input embeddings.
        runtime: the run's runtime: its dtype (features are cast to it), ``compile`` and its
            ``runtime.*`` settings.
        max_context: the verifier's context in tokens (0: the network's ``max_position_embeddings``,
            else 4096); the static cache holds it plus one block (a block's positions may pass its end).
    """

    def __init__(
        self, model: DFlashDraftModel, embed_tokens: torch.nn.Module, runtime: Runtime, max_context: int = 0
    ) -> None:
        self.model, self.embed_tokens, self.runtime = model, embed_tokens, runtime
        self.dtype, self.mask_token_id = runtime.torch_dtype, model.spec.mask_token_id
        model.fuse()  # the stacked projections and RoPE table of its one-request pass (``draft_pass``)
        context = max_context or int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        self._start(context + model.spec.block_size)

    def _build(self, capacity: int, rows: int, compile: bool) -> StaticDFlash:
        """``StaticDFlash`` of ``rows`` context sequences of ``capacity`` positions (``runtime.compiled``)."""
        return StaticDFlash(self.model, capacity, compile=compile, rows=rows, settings=self.runtime.compiled)

    def open(self) -> KVCache | SharedLength:
        """A new request's empty context cache: a sequence of a batched run's shared cache
        (``batched``), the compiled runtime's static cache's one sequence, else a ``KVCache`` (eager).

        Raises:
            RuntimeError: a batched run's every sequence held (more requests than its batch size).
        """
        rows = self.sequences
        if rows is None and self.static is not None:  # batch 1: the cache's one sequence
            rows = SharedSequences(self.static)
        if rows is not None:
            return SharedLength(rows, rows.take())
        return KVCache(len(self.model.layers))

    def run(self, passes: list[BlockPass]) -> list[torch.Tensor]:
        """One pass for every request in ``passes`` (all eager, or all on the same shared static
        cache). Returns each block's outputs after the final norm, ``(q_i, H)``; every context is
        consumed (cached). Raises ValueError (static: before any state moves) when a sequence's new
        positions do not fit its cache."""
        if passes[0].rows is not None:
            return self.shared(passes)
        if len(passes) == 1:
            p = passes[0]
            new = self._features(p.context)[None] if p.new else None  # (1, u, F)
            return [self.model.draft_pass(self.embed_tokens(p.ids)[None], p.cache, new)[0]]  # (q, H)
        return self.together(passes)

    def alone(self, ids: torch.Tensor, context: torch.Tensor | None, cache: Any) -> torch.Tensor:
        """``run`` for one request on its eager ``KVCache`` (``cache``), its inputs already shaped: the block
        ``ids`` ``(1, q) int64`` and the newly committed positions' features ``(1, u, F)`` in the
        model's dtype, or None. Returns the block's outputs ``(1, q, H)`` after the final norm."""
        return self.model.draft_pass(self.embed_tokens(ids), cache, context)

    def _features(self, context: torch.Tensor) -> torch.Tensor:
        """``context`` in the model's dtype (itself when it is: no call)."""
        return context if context.dtype == self.dtype else context.to(self.dtype)

    def _cache_context(self, p: BlockPass) -> None:
        """Write the keys and values of ``p``'s newly committed positions into its cache, alone."""
        start, device = p.cache.length, p.ids.device
        positions = torch.arange(start, start + p.new, device=device)[None]
        for i, (k, v) in enumerate(self.model.context_keys_values(self._features(p.context)[None], positions)):
            p.cache.append(i, k, v)

    def _cache_contexts(self, passes: list[BlockPass]) -> None:
        """Every request's newly committed positions into its cache: those with at most
        ``BATCH_POSITIONS`` of them padded into one ``(b, u, F)`` batch and projected in one call
        (every op is per position: a padded row changes nothing), the others alone."""
        waiting = [p for p in passes if p.new]
        short = [p for p in waiting if p.new <= BATCH_POSITIONS]
        batch = short if len(short) > 1 else []
        for p in waiting:
            if not any(p is q for q in batch):  # many new positions (a new prompt's), or the only one
                self._cache_context(p)
        if not batch:
            return
        device = batch[0].ids.device
        counts = [p.new for p in batch]
        features = pad_sequence([p.context for p in batch], batch_first=True).to(self.dtype)
        starts = torch.tensor([p.cache.length for p in batch], device=device)
        positions = starts[:, None] + torch.arange(max(counts), device=device)  # (b, u)
        for i, (k, v) in enumerate(self.model.context_keys_values(features, positions)):
            for j, p in enumerate(batch):
                p.cache.append(i, k[j : j + 1, :, : counts[j]], v[j : j + 1, :, : counts[j]])

    def together(self, passes: list[BlockPass]) -> list[torch.Tensor]:
        """Eager, several requests: ONE forward of the network over their blocks, the blocks and the
        cached contexts padded to the longest, a mask keeping each row to its own context and its
        own block (bidirectional inside it)."""
        device = passes[0].ids.device
        self._cache_contexts(passes)
        sizes = [int(p.ids.shape[0]) for p in passes]
        lengths = [p.cache.length for p in passes]  # cached context positions per request
        b, q, c = len(passes), max(sizes), max(lengths)
        ids = pad_sequence([p.ids for p in passes], batch_first=True, padding_value=self.mask_token_id)  # (b, q)
        lengths_t, sizes_t = torch.tensor([lengths, sizes], device=device)  # (b,) each
        positions = lengths_t[:, None] + torch.arange(q, device=device)  # (b, q): each row continues its context
        sees = torch.cat(
            [
                torch.arange(c, device=device) < lengths_t[:, None],  # its own context ...
                torch.arange(q, device=device) < sizes_t[:, None],
            ],
            dim=1,
        )  # ... and its own block
        mask = sees[:, None, None].expand(b, 1, q, c + q)
        context = self._padded_context(passes, c) if c else None
        out = self.model(self.embed_tokens(ids), positions, context, mask)  # (b, q, H)
        return [out[j, :size] for j, size in enumerate(sizes)]

    def _padded_context(self, passes: list[BlockPass], longest: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every request's cached context as one batch: per layer, keys and values
        ``(b, kv_heads, longest, head_dim)``, request j's in row j's first ``cache.length`` positions,
        zeros after (masked). Per layer and tensor one concatenation and one indexed copy."""
        lengths = torch.tensor([p.cache.length for p in passes])
        b = len(passes)
        rows = torch.arange(b * longest).view(b, longest)[torch.arange(longest) < lengths[:, None]]  # host: no sync
        rows = rows.to(passes[0].ids.device)  # (sum of lengths,): each cached position's padded row
        context = []
        for i in range(len(self.model.layers)):
            pair = []
            for cached in ([p.cache.keys[i] for p in passes], [p.cache.values[i] for p in passes]):
                flat = torch.cat([t[0] for t in cached if t is not None], dim=1)  # (kv_heads, sum of lengths, d)
                padded = flat.new_zeros((flat.shape[0], b * longest, flat.shape[2])).index_copy_(1, rows, flat)
                pair.append(padded.view(flat.shape[0], b, longest, flat.shape[2]).transpose(0, 1))
            context.append(tuple(pair))
        return context

    def shared(self, passes: list[BlockPass]) -> list[torch.Tensor]:
        """Compiled: one pass of the static cache (``StaticDFlash.run_rows``) for the requests'
        sequences: each one's newly committed positions join its context sequence, then its block
        attends to it; the other sequences idle. A request whose new positions and block would
        pass the largest bucket (a new prompt) writes its context first, alone (``context_rows``)."""
        rows = passes[0].rows
        static, dtype = rows.static, self.dtype
        blocks = [self.embed_tokens(p.ids) for p in passes]
        sequences, top = len(rows.lengths), static.buckets[-1]
        for p, block in zip(passes, blocks):  # before any state moves: a refused pass leaves it as it was
            new = p.new + int(block.shape[0])
            if rows.lengths[p.slot] + new > static.capacity:
                raise ValueError(
                    f"{new} new positions after {rows.lengths[p.slot]} cached do not fit the static cache "
                    f"of {static.capacity}"
                )
        uses = []
        for p, block in zip(passes, blocks):  # a long catch-up: the context alone first
            u = p.new
            if u and u + block.shape[0] > top:
                context = p.context.new_zeros((sequences, u, p.context.shape[1])).to(dtype)
                context[p.slot] = p.context
                starts, counts = rows.feed([p.slot], [u])
                static.context_rows(context, counts, starts)
                u = 0
            uses.append(u)
        counts = [u + int(block.shape[0]) for u, block in zip(uses, blocks)]
        n, slots = max(counts), [p.slot for p in passes]
        block_rows = blocks[0].new_zeros((sequences, n, blocks[0].shape[-1])).to(dtype)
        context_rows = block_rows.new_zeros((sequences, n, static.features))
        all_counts, context_counts = [0] * sequences, [0] * sequences
        for p, u, count, block in zip(passes, uses, counts, blocks):
            block_rows[p.slot, u:count] = block
            if u:
                context_rows[p.slot, :u] = p.context
            all_counts[p.slot], context_counts[p.slot] = count, u
        starts, _ = rows.feed(slots, uses)  # the lengths grow by the context rows only
        counts_t, context_t = torch.tensor([all_counts, context_counts], device=block_rows.device)
        out = static.run_rows(block_rows, context_rows, context_t, counts_t, starts)
        return [out[slot, u:count] for slot, u, count in zip(slots, uses, counts)]
