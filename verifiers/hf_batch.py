"""Batched greedy verification: many requests' chain drafts in ONE target forward pass.

The batched loop (``specpolicy.core.batching``) keeps one row per request in flight. The rows share one
Hugging Face ``DynamicCache`` of shape ``(B, kv_heads, C, head_dim)`` per layer, row i holding its
request's committed sequence in columns ``[0, L_i)`` (``C = max L_i``; columns past ``L_i`` are
stale and masked out). A round's input is ``(B, q)``: each row ``[pending, draft, pad...]``
(``q = 1 + max k_i``), at positions ``L_i, L_i + 1, ...``; a 4-D attention mask lets row i see
its own ``L_i`` committed columns and its own new tokens causally. The new keys and values land
in columns ``C .. C + q - 1`` of every row; afterwards each row's kept ones (the pending token and
its accepted draft tokens) move to ``L_i ..`` in one indexed copy per layer -- the accepted
entries only, never the prefix, nothing recomputed -- and the cache is cropped to the new
``max L_i``. A request joins with its own prefill (batch 1) appended as a new row and leaves by
dropping its row (one copy of the cache per join or leave; rounds copy none).

On the compiled runtime (``runtime.compile=true``) the batched loop gets ``StaticBatchedHFVerifier``
instead: a static cache of one sequence per request slot, compiled, where nothing moves.

Greedy (argmax per row, as ``verifiers/hf.py``): the output of every request is the target's
greedy output, whatever shares its batch, up to the floating-point effects of batched matrix
products (exact in float64; ``tests/core/test_batching.py``). Sampling (``sampling`` set): speculative
sampling row by row on ``warp`` of each row's logits, as ``verifiers/hf.py`` does for one
request; every request's output is distributed as sampling from the target
(``tests/core/test_batching.py``, a chi-square test per request).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core.attention import as_model_mask
from specpolicy.core.cache import cache_layers, crop_cache
from specpolicy.core.features import select_features_batch
from specpolicy.core.runtime import Runtime, inference_mode
from specpolicy.core.sampling import SamplingConfig, speculative_verify, warp
from specpolicy.core.types import Draft, Verification
from specpolicy.verifiers.hf import prefill_prompt


class BatchedHFVerifier:
    """The target of the batched loop: one row per request in flight (see the module docstring).

    Args:
        model: the target (a Hugging Face causal LM, eval mode, on the runtime's device; sdpa or
            eager attention: both take a boolean 4-D mask here).
        runtime: the shared runtime.
        eos_ids: token ids that end generation.
        max_context: the longest sequence in tokens (prompt + generated).
        pad_token_id: the id fed in a row's padding positions (never attended, never kept).
    """

    def __init__(
        self, model: PreTrainedModel, runtime: Runtime, eos_ids: frozenset[int], max_context: int, pad_token_id: int = 0
    ) -> None:
        self.model, self.runtime = model, runtime
        self.eos_token_ids, self.max_context, self.pad_token_id = frozenset(eos_ids), max_context, pad_token_id
        self.feature_layers: tuple[int, ...] = ()
        self.sampling: SamplingConfig | None = None  # None: greedy; else speculative sampling per row
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []  # per row: committed tokens in the cache (the pending one not yet)
        self.pending: list[torch.Tensor] = []  # per row: (1,) int64, the last committed token

    @classmethod
    def like(cls, verifier, pad_token_id: int = 0) -> BatchedHFVerifier:
        """The batched verifier of a batch-1 ``hf`` verifier's target (same model, runtime, stop
        tokens, context and requested features)."""
        batched = cls(verifier.model, verifier.runtime, verifier.eos_token_ids, verifier.max_context, pad_token_id)
        batched.feature_layers = tuple(getattr(verifier, "_feature_layers", ()))
        return batched

    #: methods timed as part of the target's pass on either runtime (called from eager Python only)
    eager_pass_methods = ("_accept",)

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a target pass (``specpolicy.core.passes``): the model's forward and,
        the verification's logits -> tokens tensor work (``_accept``) and, on the compiled runtime, the
        static runner's ``run_rows``."""
        static = getattr(self, "static", None)
        return (self.model, (self, "_accept")) + (((static, "run_rows"),) if static is not None else ())

    @property
    def rows(self) -> int:
        """Requests in flight."""
        return len(self.lengths)

    def _layers(self):
        return cache_layers(self.cache)

    @inference_mode
    def add(self, prompt_ids: torch.Tensor) -> torch.Tensor | None:
        """Prefill a request (batch 1) and append it as the last row.

        Args:
            prompt_ids: ``(P,) int64``, 1 <= P < ``max_context``.
        Returns:
            the prompt's target features ``(P - 1, F)`` when features were requested, else None.
        Raises:
            ValueError: a prompt that is empty or does not fit the context (nothing is added).
        """
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        own, features = prefill_prompt(
            self.model, prompt_ids, self.max_context, self.feature_layers, self.runtime.torch_dtype
        )
        n = int(prompt_ids.shape[0])
        if n > 1 or self.cache is not None:
            self._append_row(own, n - 1)
        self.lengths.append(n - 1)
        self.pending.append(prompt_ids[-1:])
        return features

    def _append_row(self, own: DynamicCache, length: int) -> None:
        if self.cache is None:  # no row has a cached position yet (the rows so far: one-token prompts)
            if not length:
                return
            for layer in own.layers:  # zero rows for the earlier requests, in front (their columns masked)
                if getattr(layer, "keys", None) is not None and self.rows:
                    layer.keys = torch.cat([layer.keys.new_zeros((self.rows, *layer.keys.shape[1:])), layer.keys])
                    layer.values = torch.cat(
                        [layer.values.new_zeros((self.rows, *layer.values.shape[1:])), layer.values]
                    )
            self.cache = own
            return
        mine = [(layer.keys, layer.values) for layer in own.layers] if length else None
        for i, layer in enumerate(self._layers()):
            width = layer.keys.shape[2]
            if mine is None:
                k = layer.keys.new_zeros((1, *layer.keys.shape[1:]))
                v = layer.values.new_zeros((1, *layer.values.shape[1:]))
            else:
                k, v = mine[i]
            if k.shape[2] < width:  # pad the new row's columns (stale, masked)
                pad = (0, 0, 0, width - k.shape[2])
                k, v = torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad)
            elif k.shape[2] > width:  # pad the other rows' columns
                pad = (0, 0, 0, k.shape[2] - width)
                layer.keys = torch.nn.functional.pad(layer.keys, pad)
                layer.values = torch.nn.functional.pad(layer.values, pad)
            layer.keys, layer.values = torch.cat([layer.keys, k]), torch.cat([layer.values, v])

    @inference_mode
    def remove(self, row: int) -> None:
        """Drop a request's row (it finished); the other rows keep their order."""
        self.lengths.pop(row)
        self.pending.pop(row)
        if self.cache is None:
            return
        if not self.lengths:
            self.cache = None
            return
        keep = torch.tensor([r for r in range(self.rows + 1) if r != row], device=self.runtime.torch_device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys.index_select(0, keep), layer.values.index_select(0, keep)
        crop_cache(self.cache, max(self.lengths))

    @inference_mode
    def verify(self, drafts: list[Draft]) -> list[Verification]:
        """Verify every row's chain draft in one forward pass (greedy).

        Args:
            drafts: one ``Draft`` per row, in row order (``(k_i,) int64`` tokens; empty = a
                vanilla step for that row). Trees are not batched.
        Returns:
            one ``Verification`` per row (``target_token_ids`` ``(k_i + 1,)``; ``features`` of the
            committed positions when requested).
        Raises:
            ValueError: a tree draft, a count that is not one per row, or a draft past the context.
        Greedy: one host sync for every row's accepted length; sampling: one per row (its draws).
        """
        if len(drafts) != self.rows:
            raise ValueError(f"got {len(drafts)} drafts for {self.rows} requests in flight")
        if any(d.is_tree for d in drafts):
            raise ValueError("the batched verifier verifies chains; tree drafts run in the batch-1 loop")
        device = self.runtime.torch_device
        ks = [d.length for d in drafts]
        for length, k in zip(self.lengths, ks):
            if length + k + 1 > self.max_context:
                raise ValueError(f"draft of {k} tokens would exceed the target context of {self.max_context} tokens")
        b, q = self.rows, 1 + max(ks)
        if b == 1:
            inputs = torch.cat([self.pending[0], drafts[0].token_ids])[None]
        else:
            inputs = torch.full((b, q), self.pad_token_id, dtype=torch.long, device=device)
            for i, (pending, draft) in enumerate(zip(self.pending, drafts)):
                inputs[i, : 1 + ks[i]] = torch.cat([pending, draft.token_ids])
        logits, hidden_states = self._forward(inputs)
        target, accepted, nexts = self._accept(logits, inputs, drafts, ks)
        self._keep_accepted(accepted)
        features = select_features_batch(hidden_states, self.feature_layers) if self.feature_layers else None
        results = []
        for i, (a, nxt) in enumerate(zip(accepted, nexts)):
            self.pending[i] = target[i, a : a + 1]
            results.append(
                Verification(
                    accepted_length=a,
                    next_token=nxt,
                    target_token_ids=target[i, : ks[i] + 1],
                    features=None if features is None else features[i, : a + 1],
                )
            )
        return results

    def _accept(
        self, logits: torch.Tensor, inputs: torch.Tensor, drafts: list[Draft], ks: list[int]
    ) -> tuple[torch.Tensor, list[int], list[int]]:
        """Every row's verification from the pass's logits ``(b, q, V)`` and inputs ``(b, q) int64``:
        ``(target (b, q) int64, accepted lengths, next tokens)``; greedy: the argmax and the longest
        agreeing prefix (one sync for all rows), sampling: ``speculative_verify`` row by row. Timed
        as part of the target's pass (``timed_calls``, ``specpolicy.core.passes``)."""
        target = logits.argmax(dim=-1)  # (b, q) int64
        if self.sampling is not None:  # speculative sampling row by row (Leviathan et al. 2023, Alg. 1)
            accepted, nexts = [], []
            for i, draft in enumerate(drafts):
                p = warp(logits[i, : ks[i] + 1], self.sampling)  # (k_i + 1, V)
                a, nxt = speculative_verify(p, draft.probs, draft.token_ids, self.runtime.generator)
                target[i, :a] = draft.token_ids[:a]
                target[i, a] = nxt
                accepted.append(a)
                nexts.append(nxt)
            return target, accepted, nexts
        b, q = inputs.shape
        matches = target[:, :-1] == inputs[:, 1:]
        if b > 1:  # padding never matches
            steps = torch.arange(q - 1, device=inputs.device)
            matches &= steps[None, :] < torch.tensor(ks, device=inputs.device)[:, None]
        accepted_t = matches.int().cumprod(dim=1).sum(dim=1)  # (b,)
        # the one sync of the round: every row's accepted length and correction / bonus token
        accepted, nexts = torch.stack([accepted_t, target.gather(1, accepted_t[:, None]).squeeze(1)]).tolist()
        return target, accepted, nexts

    def _forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The target's pass over every row's ``[pending, draft, pad...]`` ``(b, q)`` at the rows'
        positions: logits ``(b, q, V)`` and, when features are requested, the hidden states (L + 1
        tensors ``(b, q, H)``); the new keys and values land in columns ``width ..`` of every row."""
        device = self.runtime.torch_device
        b, q = inputs.shape
        width = self._width = 0 if self.cache is None else self.cache.get_seq_length()
        steps = torch.arange(q, device=device)
        if all(length == width for length in self.lengths):  # every row flush: plain causal attention
            positions = mask = None
        else:
            lengths = torch.tensor(self.lengths, device=device)
            positions = lengths[:, None] + steps  # (b, q)
            past = torch.arange(width, device=device)[None, :] < lengths[:, None]  # (b, width): own committed columns
            causal = steps[None, :] <= steps[:, None]  # (q, q)
            mask = torch.cat([past[:, None, :].expand(b, q, width), causal.expand(b, q, q)], dim=2)[:, None]
            mask = as_model_mask(mask, self.model.config._attn_implementation, self.runtime.torch_dtype)
        out = self.model(
            input_ids=inputs,
            position_ids=positions,
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=bool(self.feature_layers),
        )
        if self.cache is None:
            self.cache = out.past_key_values
        return out.logits, out.hidden_states

    def _keep_accepted(self, accepted: list[int]) -> None:
        """Move each row's kept new entries (columns ``width .. width + a_i``) to ``L_i ..``, crop."""
        width = self._width
        if any(length != width for length in self.lengths):  # rows already flush need no move
            device = self.runtime.torch_device
            kept = torch.tensor([a + 1 for a in accepted], device=device)
            rows = torch.repeat_interleave(torch.arange(self.rows, device=device), kept)
            offset = torch.arange(int(kept.sum()), device=device) - torch.repeat_interleave(kept.cumsum(0) - kept, kept)
            source = width + offset
            destination = torch.repeat_interleave(torch.tensor(self.lengths, device=device), kept) + offset
            for layer in self._layers():
                layer.keys[rows, :, destination] = layer.keys[rows, :, source]
                layer.values[rows, :, destination] = layer.values[rows, :, source]
        self.lengths = [length + a + 1 for length, a in zip(self.lengths, accepted)]
        crop_cache(self.cache, max(self.lengths))


class StaticBatchedHFVerifier(BatchedHFVerifier):
    """The batched verifier on the compiled runtime (``runtime.compile=true``): the target behind a
    static cache of ``slots`` sequences (``specpolicy.runners.decoder.StaticDecoder``), one
    per request in flight, compiled per shape bucket. A round's new keys and values are written
    where they stay, each request's at its own length, so accepting a draft moves a length -- no
    entry is copied (``BatchedHFVerifier`` moves the accepted ones). A request joins by its prefill
    (Hugging Face's batch-1 forward, as ``BatchedHFVerifier``), its keys and values copied into a
    free sequence once; leaving frees it. Verification is ``BatchedHFVerifier.verify``'s: the same
    acceptance, greedy or speculative sampling, one pass for every request; a pass computes every
    sequence of the cache, requests or not (padded to the batch size).

    Args:
        model / runtime / eos_ids / max_context / pad_token_id: as ``BatchedHFVerifier``.
        slots: requests the cache holds at once (the batch size), >= 1.
        compile: compile the passes (else the static cache runs eagerly).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        runtime: Runtime,
        eos_ids: frozenset[int],
        max_context: int,
        pad_token_id: int = 0,
        slots: int = 1,
        compile: bool = True,
    ) -> None:
        from specpolicy.runners.decoder import StaticDecoder

        super().__init__(model, runtime, eos_ids, max_context, pad_token_id)
        self.static = StaticDecoder(model, max_context, compile, rows=slots, settings=runtime.compiled)
        runtime.warmup_s += self.static.warmup()
        self.slot_of: list[int] = []  # per request in flight (row order): its sequence in the cache
        self.reset(pad_token_id)

    @classmethod
    def like(cls, verifier, pad_token_id: int = 0, slots: int = 1, compile: bool = True) -> StaticBatchedHFVerifier:
        """The static batched verifier of a batch-1 ``hf`` verifier's target, for ``slots`` requests."""
        batched = cls(
            verifier.model, verifier.runtime, verifier.eos_token_ids, verifier.max_context, pad_token_id, slots, compile
        )
        batched.feature_layers = tuple(getattr(verifier, "_feature_layers", ()))
        return batched

    def reset(self, pad_token_id: int = 0, feature_layers: tuple[int, ...] = ()) -> None:
        """No request in flight (a new batched run on the same compiled cache), greedy; every
        sequence of the cache free."""
        self.pad_token_id, self.feature_layers, self.sampling = pad_token_id, feature_layers, None
        self.lengths, self.pending, self.slot_of = [], [], []
        self._free = list(range(self.static.keys[0].shape[0]))

    @inference_mode
    def add(self, prompt_ids: torch.Tensor) -> torch.Tensor | None:
        """Prefill a request (batch 1) into a free sequence of the cache and append it as the last
        row. Returns its target features as ``BatchedHFVerifier.add``.

        Raises:
            ValueError: a prompt that is empty or does not fit the context, or no free sequence
                (more requests than ``slots``); nothing is added.
        """
        if not self._free:
            raise ValueError(f"the static batched verifier holds {len(self.slot_of)} requests, its slots")
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        own, features = prefill_prompt(
            self.model, prompt_ids, self.max_context, self.feature_layers, self.runtime.torch_dtype
        )
        slot = self._free.pop(0)
        n = int(prompt_ids.shape[0])
        if n > 1:
            for (k, v), layer in zip(zip(self.static.keys, self.static.values), own.layers):
                k[slot, :, : n - 1] = layer.keys[0]
                v[slot, :, : n - 1] = layer.values[0]
        self.slot_of.append(slot)
        self.lengths.append(n - 1)
        self.pending.append(prompt_ids[-1:])
        return features

    def remove(self, row: int) -> None:
        """Drop a request's row (it finished): its sequence is free; the other rows keep their order."""
        self.lengths.pop(row)
        self.pending.pop(row)
        self._free.append(self.slot_of.pop(row))

    def _forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Every sequence of the cache fed at once (``StaticDecoder.run_rows``): a request's row of
        ``inputs`` ``(b, q)`` at its own length, the free sequences fed padding at 0."""
        device = self.runtime.torch_device
        index = torch.tensor(self.slot_of, device=device)
        rows = self.static.keys[0].shape[0]
        ids = torch.full((rows, inputs.shape[1]), self.pad_token_id, dtype=torch.long, device=device)
        ids[index] = inputs
        starts = torch.zeros(rows, dtype=torch.long, device=device)
        starts[index] = torch.tensor(self.lengths, device=device)
        logits, states = self.static.run_rows(ids, starts)
        hidden_states = states[index].unbind(2) if self.feature_layers else None
        return logits[index], hidden_states

    def _keep_accepted(self, accepted: list[int]) -> None:
        """The accepted entries are already at each request's length: move the lengths."""
        self.lengths = [length + a + 1 for length, a in zip(self.lengths, accepted)]
