"""How the EAGLE-3 head's pass runs (``Eagle3Runner``): eager, or behind a static KV cache
(``StaticEagle3``: the compiled runtime's EAGLE-3 drafting, one forward over ``R`` sequences), for
one request or many (``specpolicy.models.eagle3.Eagle3DraftModel``; the drafter, ``drafters/eagle3.py``).

A chain step (``Eagle3Runner.run``), a draft tree's root and levels (``Eagle3Runner.outputs``, tree
attention) and a greedy chain of several steps (``Eagle3Runner.chain``: on the compiled runtime
several drafting steps per graph, ``StaticEagle3.chain``, ``runtime.chain_steps``, the argmax and
the feedback inside the graph) each run whichever cache the request drafts on: its ``KVCache``
(eager), the compiled runtime's static cache of one sequence, or a batched run's shared one
(``Eagle3Runner.open``). The runner builds those caches, the drafter never does: its constructor
the compiled runtime's (``runtime.compile=true``), ``batched(slots)`` a batched run's
(``specpolicy.runners.sequences.SequencesRunner``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from specpolicy.core.runtime import CompileSettings, Runtime, inference_mode, no_grad
from specpolicy.core.sampling import choose
from specpolicy.models.kv import KVCache
from specpolicy.runners.sequences import SequencesRunner, SharedLength, SharedSequences
from specpolicy.runners.static import StaticPasses, _rotate_half, _row_attention, _row_linear


class StaticEagle3(StaticPasses):
    """The EAGLE-3 head behind a static KV cache of ``rows`` sequences: one pass over ``n``
    positions -- the target's embeddings of their tokens and their features (``fc`` of the
    target's, or the head's fed-back outputs) -- returns the head's outputs and its
    draft-vocabulary logits, exactly as ``Eagle3DraftModel.forward`` then ``logits``. One sequence
    (the batch-1 loop): ``passes`` after the cached ``length``, and ``chain``; several (the batched
    loop's compiled drafting, ``drafters/eagle3.py``): ``run_rows``, a request that drafts this step
    its new positions at its sequence's length, the rest (other requests, padding) at scratch
    columns no real position sees, 2 columns or more. Greedy and sampling requests alike (the
    drafter chooses from the logits).

    Args:
        model: the head, eval mode. embed_tokens: the target's input embeddings.
        capacity / compile / buckets / rows / settings: as ``specpolicy.runners.decoder.StaticDecoder``.
    Raises:
        ValueError: ``rows`` < 1 or a capacity < 1.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        embed_tokens: torch.nn.Module,
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
        self.head, self.embed_tokens = model, embed_tokens
        att = model.midlayer.self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        weight = model.lm_head.weight
        self.hidden_size = int(model.fc.weight.shape[0])
        # compiled on CPU, one sequence: the one-row pass as reductions and plain attention (cpu_matmul)
        self.reduction = (
            bool(compile) and weight.device.type == "cpu" and settings.cpu_matmul == "reduction" and rows == 1
        )
        self._setup(
            1, self.kv_heads, self.head_dim, capacity, weight.device, weight.dtype, compile, buckets, rows, settings
        )
        self.chain_steps = tuple(sorted(settings.chain_steps, reverse=True))
        # one graph per chunk size (a code object each: a chunk's graph never meets another size)
        chain = type(self)._chain_forward
        self._chains = {m: self._compiled_copy(chain) if compile else self._chain_forward for m in self.chain_steps}

    @inference_mode
    def chain(self, token_ids: torch.Tensor, hidden: torch.Tensor, steps: int) -> tuple[torch.Tensor, ...]:
        """Draft ``steps`` tokens greedily, each step fed the token drafted and the output of the
        step before (EAGLE-3's chain drafting, arXiv 2503.01840), in chunks of ``runtime.chain_steps``
        steps that each run as one compiled graph: the argmax, its confidence and the draft-to-target
        id map are computed in the graph, so no step goes back to Python. The same tokens as
        ``steps`` one-row ``passes`` with ``specpolicy.core.sampling.choose`` (greedy); the length
        grows by ``steps``. One sequence only.

        Args:
            token_ids: ``(1,) int64`` the last drafted token (target id), written at the next slot.
            hidden: ``(1, H)`` the head's output that predicted it.
            steps: tokens to draft, >= 1.
        Returns:
            ``(tokens (steps,) int64 target ids, confidences (steps,) float32, the last output
            (1, H), logits (steps, Vd))``: fresh tensors.
        Raises:
            ValueError: if ``steps`` < 1 or the cache cannot hold ``steps`` more positions.
        """
        start = self.length
        if steps < 1 or start + steps > self.capacity:
            raise ValueError(f"{steps} chain steps after {start} cached do not fit the static cache of {self.capacity}")
        tokens, confidences, logits = [], [], []
        token_ids, hidden = token_ids.clone(), hidden.clone()  # fresh inputs (see ``passes``)
        left = steps
        for m in self.chain_steps:
            while left >= m:
                a = self.length
                slots = torch.arange(a, a + m, device=token_ids.device)
                window = min(self.width, -(-(a + m) // self.window) * self.window)
                mask = self.columns[None, :window] <= slots[:, None]
                outputs = self._chains[m](token_ids[None], hidden[None], slots[None], mask[None])
                if self.replayed:  # CUDA graphs reuse their outputs
                    outputs = [y.clone() for y in outputs]
                chunk_tokens, chunk_confidences, hidden, chunk_logits = outputs
                tokens.append(chunk_tokens)
                confidences.append(chunk_confidences)
                logits.append(chunk_logits)
                token_ids = chunk_tokens[-1:].clone()
                self.length = a + m
                left -= m
        return torch.cat(tokens), torch.cat(confidences), hidden, torch.cat(logits)

    def _chain_forward(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``m`` greedy steps of one sequence (``token_ids`` ``(1, 1)``, ``hidden`` ``(1, 1, H)``,
        ``m`` = ``slots``' length ``(1, m)``, positions = slots, ``mask`` ``(1, m, window)``):
        ``_forward`` on one row, then ``choose``'s greedy rule on its logits. Returns tokens
        ``(m,)``, confidences ``(m,)``, the last output ``(1, H)`` and logits ``(m, Vd)``."""
        tokens, confidences, logits = [], [], []
        for j in range(slots.shape[1]):
            step = slots[:, j : j + 1]
            hidden, step_logits = self._forward(token_ids, hidden, step, step, mask[:, j : j + 1])
            draft_ids, confidence, _ = choose(step_logits[0], None, None)
            confidences.append(confidence)
            target_ids = self.head.to_target_ids(draft_ids)
            tokens.append(target_ids)
            logits.append(step_logits[0])
            token_ids = target_ids[None]
        return torch.cat(tokens), torch.cat(confidences), hidden[0], torch.cat(logits)

    @no_grad
    def warmup(self) -> float:
        """``StaticPasses.warmup``, then (one sequence) every chain chunk (``runtime.chain_steps``) compiled."""
        spent = super().warmup()
        if not self.compiled or self.rows != 1:
            return spent
        t0 = time.perf_counter()
        token_ids, hidden = self._dummy_rows(1)
        for m in self.chain_steps:
            if m <= self.capacity:
                self.length = 0
                self.chain(token_ids, hidden, m)
        self.length = 0
        more = time.perf_counter() - t0
        self.warmup_s += more
        return spent + more

    def _forward(
        self,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over every sequence (padded to a bucket on CUDA): tokens ``(R, B)``, features
        ``(R, B, H)`` at ``positions`` ``(R, B)``, written to columns ``slots`` ``(R, B)``, ``mask``
        ``(R, B, width)``. Returns outputs ``(R, B, H)`` and logits ``(R, B, Vd)``."""
        head = self.head
        r = token_ids.shape[0]
        embeds = self.embed_tokens(token_ids)  # (R, B, H)
        cos, sin = head.rotary_emb(embeds, positions)
        if self.reduction and token_ids.shape[1] == 1:  # the drafting step, as ``Eagle3DraftModel.forward``
            return self._one_row(embeds, hidden, cos, sin, slots, mask)
        q, k, v = head.midlayer.self_attn.qkv(head.midlayer.attention_input(embeds, hidden), cos, sin)
        cache_k, cache_v = self.write(0, slots, k, v)
        w = mask.shape[-1]  # the window: columns up to the last slot written, rounded up
        attended = F.scaled_dot_product_attention(
            q, cache_k[:, :, :w], cache_v[:, :, :w], attn_mask=mask[:, None], enable_gqa=self.kv_heads != self.heads
        )
        out = head.midlayer.finish(hidden, attended)
        if r == 1:  # the head over (B, H), the batch-1 step's measured product
            return out, head.logits(out[0])[None]
        return out, head.logits(out)

    def _one_row(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-row pass of one sequence with every product a reduction over weight rows
        (``_row_linear``) and plain attention (``_row_attention``): what ``qkv``, SDPA, ``finish``
        and ``logits`` compute. Returns ``(1, 1, H)`` and ``(1, 1, Vd)``."""
        mid = self.head.midlayer
        att, mlp = mid.self_attn, mid.mlp
        x = mid.attention_input(embeds, hidden)  # (1, 1, 2H)
        q = _row_linear(att.q_proj, x).view(1, 1, att.num_heads, att.head_dim).transpose(1, 2)
        k = _row_linear(att.k_proj, x).view(1, 1, att.num_kv_heads, att.head_dim).transpose(1, 2)
        v = _row_linear(att.v_proj, x).view(1, 1, att.num_kv_heads, att.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        cache_k, cache_v = self.write(0, slots, k, v)
        w = mask.shape[-1]
        attended = _row_attention(q, cache_k[:, :, :w], cache_v[:, :, :w], mask[0])
        out = hidden + _row_linear(att.o_proj, attended.transpose(1, 2).reshape(1, 1, -1))
        h = mid.post_attention_layernorm(out)
        out = out + _row_linear(mlp.down_proj, mlp.act_fn(_row_linear(mlp.gate_proj, h)) * _row_linear(mlp.up_proj, h))
        return out, _row_linear(self.head.lm_head, self.head.norm(out))

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        device, dtype = self.columns.device, self.keys[0].dtype
        return [
            torch.zeros(b, dtype=torch.long, device=device),
            torch.zeros((b, self.hidden_size), dtype=dtype, device=device),
        ]

    @inference_mode
    def run_rows(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed sequence ``r`` the tokens ``token_ids[r]`` with the features ``hidden[r]`` at its
        columns ``starts[r], ...`` (``StaticPasses._rows_passes``).

        Args:
            token_ids: ``(rows, n) int64`` target ids; hidden: ``(rows, n, H)`` (``fc`` of the
                target's features, or the head's own outputs).
            starts: ``(rows,) int64`` each sequence's length; counts: ``(rows,) int64`` its real
                new positions (0: a sequence that stays as it is; the rest of its columns go to
                scratch columns past the capacity).
        Returns:
            ``(outputs (rows, n, H), draft-vocabulary logits (rows, n, Vd))``.
        Raises:
            ValueError: if a sequence's real new positions pass the capacity.
        """
        out, logits = self._rows_passes([token_ids, hidden], starts, counts)
        return out, logits


#: An eager pass over several requests: a request with more newly committed positions than this (a
#: new prompt, a long run of plain rounds) runs its pass alone, not padding every row to its count.
BATCH_POSITIONS = 16


#: Positions the compiled runtime's static cache holds past the verifier's context: a draft tree's nodes.
TREE_NODES = 128


class StaticLength:
    """What the drafter asks of its cache (``length``, ``crop``) on a ``StaticEagle3`` of one
    sequence (the compiled runtime, batch 1): the static cache's length, emptied when opened."""

    def __init__(self, static: StaticEagle3) -> None:
        self.static = static
        static.reset()

    @property
    def length(self) -> int:
        """Cached positions (tokens)."""
        return self.static.length

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` cached positions (a no-op if shorter)."""
        self.static.length = min(self.static.length, length)


@dataclass
class HeadPass:
    """One request's part of an EAGLE-3 head pass (``Eagle3Runner.run``): its new positions' tokens
    and features, after what its cache holds.

    Attributes:
        tokens: ``(n,) int64`` target ids (the round's first pass: the newly committed pairs'
            next tokens; later: the last drafted token).
        hidden: ``(n, H)`` their features (``fc`` of the target's, or the head's own output).
        cache: the request's cache (``Eagle3Runner.open``): eager, its ``KVCache`` (one layer);
            compiled, batch 1, a ``StaticLength`` of the static cache of one sequence; in a
            batched run, a ``SharedLength`` (its sequence of the shared static cache).
    """

    tokens: torch.Tensor
    hidden: torch.Tensor
    cache: Any  # KVCache | StaticLength | SharedLength

    @property
    def static(self) -> StaticEagle3 | None:
        """The compiled runtime's ``StaticEagle3`` of one sequence (batch 1), else None."""
        return self.cache.static if isinstance(self.cache, StaticLength) else None

    @property
    def rows(self) -> SharedSequences | None:
        """A batched run's shared sequences, else None."""
        return self.cache.rows if isinstance(self.cache, SharedLength) else None

    @property
    def slot(self) -> int | None:
        """The request's sequence among ``rows``, else None."""
        return self.cache.slot if isinstance(self.cache, SharedLength) else None


class Eagle3Runner(SequencesRunner):
    """How the EAGLE-3 head's pass runs for ``R`` requests at once: eager (``Eagle3DraftModel``: one
    request alone; several in one padded forward, each row its own cache, causally), on the
    compiled runtime's ``StaticEagle3`` of one sequence (batch 1), or on a batched run's shared
    ``StaticEagle3`` of one sequence per request (``batched``) -- the same forward at ``R`` = 1 and
    ``R`` > 1. The runner owns its static caches (``SequencesRunner``): on the compiled runtime its
    constructor builds and warms up the one of one sequence (``max_context`` + ``TREE_NODES``
    positions; compile seconds added to ``runtime.warmup_s``).

    Args:
        model: the head, eval mode. embed_tokens: the target's input embeddings.
        runtime: the run's runtime (``compile`` and its ``runtime.*`` settings); None: eager.
        max_context: the verifier's context in tokens (0: the head's ``max_position_embeddings``,
            else 4096), which sizes the compiled runtime's static cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        embed_tokens: torch.nn.Module,
        runtime: Runtime | None = None,
        max_context: int = 0,
    ) -> None:
        self.model, self.embed_tokens, self.runtime = model, embed_tokens, runtime
        #: the LM head's input ``(1, H)`` (the final norm's output) of the last eager one-request pass
        #: (``one``), which its logits read; None after any other pass (an acceptance head reads it:
        #: ``Eagle3Drafter.report_hidden``, so the norm runs once)
        self.normed: torch.Tensor | None = None
        #: ``(1, H)`` the last position's output of that pass (the view ``normed`` is computed from):
        #: the next step's features (``Eagle3Drafter._steps_alone``)
        self.last_hidden: torch.Tensor | None = None
        context = max_context or int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        self._start(context + TREE_NODES)

    def _build(self, capacity: int, rows: int, compile: bool) -> StaticEagle3:
        """``StaticEagle3`` of ``rows`` sequences of ``capacity`` positions (``runtime.compiled``)."""
        settings = self.runtime.compiled
        return StaticEagle3(self.model, self.embed_tokens, capacity, compile=compile, rows=rows, settings=settings)

    def open(self) -> KVCache | StaticLength | SharedLength:
        """A new request's empty cache: a sequence of a batched run's shared cache (``batched``), the
        compiled runtime's static cache of one sequence (emptied), else a ``KVCache`` (eager).

        Raises:
            RuntimeError: a batched run's every sequence held (more requests than its batch size).
        """
        if self.sequences is not None:
            return SharedLength(self.sequences, self.sequences.take())
        return KVCache(1) if self.static is None else StaticLength(cast(StaticEagle3, self.static))

    def outputs(
        self, p: HeadPass, positions: torch.Tensor | None = None, attend: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One request's pass (a draft tree's root or level): its ``n`` new positions after its
        cached ones, their keys and values cached.

        Args:
            p: the request's tokens ``(n,)``, features ``(n, H)`` and cache (eager or static; not a
                batched run's shared one: trees run at batch 1).
            positions: ``(n,) int64`` RoPE positions (a tree's: by depth); default a chain from the
                cached length.
            attend: ``(n, cached + n) bool``, True where new position i sees column j (tree
                attention, ``specpolicy.core.tree``); default causal.
        Returns:
            the head's outputs ``(n, H)`` (before ``norm``).
        Raises:
            ValueError: for a pass on a batched run's shared cache.
        """
        if p.rows is not None:
            raise ValueError("a draft tree runs at batch 1: its passes do not run on a batched run's shared cache")
        if p.static is not None:  # compiled, batch 1: the forward at R = 1
            out, _ = p.static.passes([p.tokens, p.hidden], positions, attend)
            return out
        start = p.cache.length
        if positions is None:
            positions = torch.arange(start, start + p.tokens.shape[0], device=p.tokens.device)
        past = p.cache.layer(0) if start else None
        out, k, v = self.model(self.embed_tokens(p.tokens)[None], p.hidden[None], positions[None], past, attend)
        p.cache.keys[0], p.cache.values[0] = k, v
        return out[0]

    @staticmethod
    def chain(p: HeadPass, steps: int) -> tuple[torch.Tensor, ...] | None:
        """``steps`` greedy chain steps from ``p`` (the last drafted token ``(1,)`` and the output that
        predicted it ``(1, H)``) as one call where the runtime fuses them (the compiled runtime's
        ``StaticEagle3.chain``): ``(tokens (steps,) int64 target ids, confidences (steps,) float32,
        the last output (1, H), logits (steps, Vd))``, the same tokens as ``steps`` passes with
        ``choose``'s greedy rule. None where it does not (eager, a batched run): the caller runs
        the steps as passes."""
        if p.static is None:
            return None
        return p.static.chain(p.tokens, p.hidden, steps)

    def run(self, passes: list[HeadPass]) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass: request ``i`` is fed ``passes[i]``'s positions after its cached ones (cached).
        Returns every request's last output ``(R, 1, H)`` (what predicts its next token) and the
        draft-vocabulary logits of its last position ``(R, Vd)``."""
        if len(passes) == 1 and type(passes[0].cache) is KVCache:  # eager, one request: the common pass
            return self.one(passes[0])
        self.normed = None
        if passes[0].rows is not None:
            return self.shared(passes)
        if len(passes) > 1:
            return self.together(passes)
        p = passes[0]
        if p.static is not None:  # compiled, batch 1: the forward at R = 1
            out, logits = p.static.passes([p.tokens, p.hidden])
            return out[None, -1:], logits[-1:]
        return self.one(p)

    def one(self, p: HeadPass) -> tuple[torch.Tensor, torch.Tensor]:
        """``run`` for one request, eager: the head's forward over ``p``'s positions after its
        cached ones (cached), its last output ``(1, 1, H)`` and that position's draft-vocabulary
        logits ``(1, Vd)`` (``normed``: the LM head's input). The drafter's pass entry point
        (``Eagle3Drafter.timed_calls``)."""
        embeds = self.embed_tokens(p.tokens)[None]
        start = p.cache.length
        positions = torch.arange(start, start + embeds.shape[1], device=embeds.device)[None]
        out, k, v = self.model(embeds, p.hidden[None], positions, p.cache.layer(0) if start else None)
        p.cache.keys[0], p.cache.values[0] = k, v
        head: Any = self.model  # ``Eagle3DraftModel.logits``: lm_head(norm(out)), its input kept
        self.last_hidden = last = out[0, -1:]
        self.normed = head.norm(last)
        return out[:, -1:], head.lm_head(self.normed)

    def together(self, passes: list[HeadPass]) -> tuple[torch.Tensor, torch.Tensor]:
        """Eager, several requests: ONE forward of the head, rows padded to the most positions and
        caches to the longest, a mask keeping each row to its own cache and positions, causally."""
        head = self.model
        device = passes[0].tokens.device
        counts = [int(p.tokens.shape[0]) for p in passes]
        lengths = [p.cache.length for p in passes]
        b, n, longest = len(passes), max(counts), max(lengths)
        token_ids = torch.zeros((b, n), dtype=torch.long, device=device)
        features = passes[0].hidden.new_zeros((b, n, passes[0].hidden.shape[-1]))
        for i, p in enumerate(passes):
            token_ids[i, : counts[i]] = p.tokens
            features[i, : counts[i]] = p.hidden
        past = None
        if longest:
            keys = next(p.cache.keys[0] for p in passes if p.cache.length)  # (1, kv_heads, L, d): the shape
            past_k = keys.new_zeros((b, keys.shape[1], longest, keys.shape[3]))
            past_v = torch.zeros_like(past_k)
            for i, p in enumerate(passes):
                if lengths[i]:
                    past_k[i, :, : lengths[i]] = p.cache.keys[0][0]
                    past_v[i, :, : lengths[i]] = p.cache.values[0][0]
            past = (past_k, past_v)
        lengths_t = torch.tensor(lengths, device=device)
        steps = torch.arange(n, device=device)
        own = torch.arange(longest, device=device)[None] < lengths_t[:, None]  # (b, P)
        causal = steps[None, :] <= steps[:, None]  # (n, n)
        mask = torch.cat([own[:, None].expand(b, n, longest), causal.expand(b, n, n)], dim=2)[:, None]
        out, k, v = head(self.embed_tokens(token_ids), features, lengths_t[:, None] + steps, past, mask)
        last = torch.tensor(counts, device=device) - 1
        rows = torch.arange(b, device=device)
        for i, p in enumerate(passes):
            p.cache.append(
                0, k[i : i + 1, :, longest : longest + counts[i]], v[i : i + 1, :, longest : longest + counts[i]]
            )
        return out[rows, last][:, None], head.logits(out[rows, last])

    def shared(self, passes: list[HeadPass]) -> tuple[torch.Tensor, torch.Tensor]:
        """A batched run's shared static cache: one ``StaticEagle3.run_rows`` pass over every
        sequence, the requests' at their lengths, the other sequences idle."""
        rows, device = passes[0].rows, passes[0].tokens.device
        counts = [int(p.tokens.shape[0]) for p in passes]
        n, slots = max(counts), [p.slot for p in passes]
        token_ids = torch.zeros((len(rows.lengths), n), dtype=torch.long, device=device)
        hidden = passes[0].hidden.new_zeros((len(rows.lengths), n, passes[0].hidden.shape[-1]))
        for slot, count, p in zip(slots, counts, passes):
            token_ids[slot, :count] = p.tokens
            hidden[slot, :count] = p.hidden
        out, logits = rows.static.run_rows(token_ids, hidden, *rows.feed(slots, counts))
        index, last = torch.tensor(slots, device=device), torch.tensor(counts, device=device) - 1
        return out[index, last][:, None], logits[index, last]
