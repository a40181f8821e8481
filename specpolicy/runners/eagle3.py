"""The EAGLE-3 head (``specpolicy.models.eagle3.Eagle3DraftModel``) behind a static KV cache
(``StaticEagle3``): the compiled runtime's EAGLE-3 drafting, one forward over ``R`` sequences.

EAGLE-3's greedy chain runs several drafting steps per compiled graph (``StaticEagle3.chain``,
``runtime.chain_steps``), the argmax and the feedback inside the graph.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from specpolicy.core.runtime import CompileSettings
from specpolicy.core.sampling import choose
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
        capacity / compile / buckets / rows / settings: as ``specpolicy.runners.qwen.StaticQwen``.
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

    @torch.inference_mode()
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

    @torch.no_grad()
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

    @torch.inference_mode()
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


def StaticBatchEagle3(  # noqa: N802 - the batched loop's name for the cache of several sequences
    model: torch.nn.Module,
    embed_tokens: torch.nn.Module,
    capacity: int,
    rows: int,
    compile: bool = False,
    buckets: Sequence[int] | None = None,
    settings: CompileSettings | None = None,
) -> StaticEagle3:
    """``StaticEagle3`` of ``rows`` sequences (the batched loop's EAGLE-3 drafting)."""
    return StaticEagle3(model, embed_tokens, capacity, compile, buckets, rows, settings)
