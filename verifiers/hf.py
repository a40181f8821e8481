"""``hf`` verifier: any Hugging Face causal LM as the target, greedy or speculative-sampling verification."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core import compiled_tree, tree
from specpolicy.core.attention import as_model_mask
from specpolicy.core.cache import crop_cache, emptied_cache, held_length, keep_nodes, keep_path, kept_entries
from specpolicy.core.checks import check_keys, integer
from specpolicy.core.features import check_feature_layers, select_features
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, speculative_verify, warp
from specpolicy.core.types import Draft, Verification
from specpolicy.core.verifier import Verifier
from specpolicy.models.loading import (
    check_attention,
    check_model_source,
    context_length,
    eos_token_ids,
    load_causal_lm,
    load_tokenizer,
)
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "hf"
CONFIG_KEYS = ("model", "attn_implementation", "max_context")
#: tokens of room the target's KV buffers get past the prompt at prefill (``buffered_cache``; they
#: double when a round does not fit)
BUFFER_STEP = 256
#: hidden-state dtypes a CPU tensor shares with numpy (the tree's features gathered by a compiled call)
_HOST_FLOATS = (torch.float32, torch.float64)
#: ``keep_nodes``' features when none are requested: one empty layer, no rows gathered
_NO_FEATURES = ((np.empty((1, 0, 0), dtype=np.float32),), np.empty((0, 0), dtype=np.float32))
_NOTHING_HELD = (None, None, None, None)  # ``HFVerifier._tree_held`` before a round of the host path


class HFVerifier(Verifier):
    """Verification with a KV-cached Hugging Face causal LM: one forward pass per round over
    ``[pending] + draft``. Greedy (the default) keeps the draft prefix equal to the target's argmax
    (Leviathan et al. 2023, §2.3, greedy case); with non-greedy ``sampling`` given to ``prefill``,
    speculative sampling (Leviathan et al. 2023, Alg. 1) on ``warp`` of the logits, the draws
    from ``runtime.generator`` (``specpolicy.core.sampling.speculative_verify``).

    Args:
        model: the target, in eval mode on the runtime device.
        runtime: shared runtime.
        eos_ids: token ids that end generation.
        max_context: maximum sequence length in tokens (default: the model's
            ``max_position_embeddings``).
        tokenizer: the target's tokenizer (drafter factories check theirs against it).

    On the compiled runtime (``runtime.compile``) the same passes run through a static KV cache
    compiled per shape bucket (``specpolicy.runners.decoder.StaticDecoder``, built and warmed up
    here, its compile seconds added to ``runtime.warmup_s``): cropping moves a length, a tree's
    accepted path is moved inside the cache; greedy output token-identical to the eager runtime.
    Raises ``ValueError`` there for a target it does not run (``specpolicy.runners.decoder.unsupported``).
    """

    name = NAME

    def __init__(
        self, model: PreTrainedModel, runtime: Runtime, eos_ids: frozenset[int], max_context: int = 0, tokenizer=None
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.runtime = runtime
        self.eos_token_ids = frozenset(eos_ids)
        self.max_context = max_context or context_length(model)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.cache: DynamicCache | None = None
        self._pending: torch.Tensor | None = None  # (1,) int64: last committed token, not yet in the cache
        self._sampling: SamplingConfig | None = None  # None: greedy
        self._feature_layers: tuple[int, ...] = ()  # hidden_states indices a drafter reads; () = none
        self.prompt_features: torch.Tensor | None = None
        self.static = None  # the compiled runtime's StaticDecoder, else None
        self._static_batched: dict = {}  # the compiled runtime's batched verifiers, by batch size
        if runtime.compile:
            from specpolicy.runners.decoder import StaticDecoder

            self.static = StaticDecoder(model, self.max_context, compile=True, settings=runtime.compiled)
            runtime.warmup_s += self.static.warmup()
        # trees verified by the host path (``_verify_tree``): the eager runtime on the CPU (a plain bool)
        self._host_trees = self.static is None and runtime.torch_device.type == "cpu"
        # the host path's last round: (the pending tensor it set, its numpy view, the cache, its host form)
        self._tree_held: tuple = _NOTHING_HELD

    def request_features(self, layers: tuple[int, ...]) -> None:
        """Return ``layers`` of ``output_hidden_states`` from the prefill and every verification
        (see ``Verifier.request_features``); checked against the target's layer count.

        Raises:
            specpolicy.core.features.FeaturesUnsupported: for an index outside ``0..num_hidden_layers``.
        """
        self._feature_layers = check_feature_layers(layers, int(self.model.config.num_hidden_layers) + 1)

    def batched(self, pad_token_id: int = 0, slots: int | None = None):
        """The batched loop's verifier of this target (``verifiers/hf_batch.py``: same model,
        runtime, stop tokens, context and requested features; one row per request in flight).
        Called by ``specpolicy.core.batching.generate_batch`` with ``slots`` = the batch size: on the
        compiled runtime a static cache of that many sequences, compiled (``StaticBatchedHFVerifier``;
        its compile seconds added to ``runtime.warmup_s``), else a dynamic cache."""
        from specpolicy.verifiers.hf_batch import BatchedHFVerifier, StaticBatchedHFVerifier

        if self.static is not None and slots:
            # one per batch size, reused by later runs (compiled once per process)
            batched = self._static_batched.get(slots)
            if batched is None:
                batched = StaticBatchedHFVerifier.like(self, pad_token_id, slots, compile=self.static.compiled)
                self._static_batched[slots] = batched
            batched.reset(pad_token_id, tuple(self._feature_layers))
            return batched
        return BatchedHFVerifier.like(self, pad_token_id)

    #: methods timed as part of the target's pass on either runtime (called from eager Python only):
    #: the logits -> tokens tensor work right after the forward (``specpolicy.core.passes``)
    eager_pass_methods = ("_accept", "_accept_tree")

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a target pass (``specpolicy.core.passes``): the model's forward, the
        verification's logits -> tokens tensor work (``_accept``, ``_accept_tree``: argmax, the
        acceptance comparison, the greedy path) and, on the compiled runtime, the static runner's ``run``."""
        own = ((self, "_accept"), (self, "_accept_tree"))
        return (self.model,) + own + (((self.static, "run"),) if self.static is not None else ())

    @property
    def cached_length(self) -> int:
        """Tokens held in the KV cache (the committed sequence minus the pending token)."""
        if self.static is not None:
            return self.static.length
        return 0 if self.cache is None else held_length(self.cache)

    @no_grad
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._tree_held = _NOTHING_HELD  # the last prompt's cache is not held past its prefill
        if self.static is not None:
            self._prefill_static(prompt_ids)
            return
        # the cache's buffers hold the prompt and a first stretch of generation, then double as needed;
        # the last prompt's cache is emptied for it only once it fits (``prefill_prompt`` refuses it else)
        n = int(prompt_ids.shape[0])
        room = min(self.max_context, n + BUFFER_STEP)
        fits = 1 <= n < self.max_context
        self.cache, self.prompt_features = prefill_prompt(
            self.model,
            prompt_ids,
            self.max_context,
            self._feature_layers,
            self.runtime.torch_dtype,
            emptied_cache(self.cache, room, self.runtime.torch_dtype, prompt_ids.device) if fits else None,
        )
        self._pending = prompt_ids[-1:]

    def _prefill_static(self, prompt_ids: torch.Tensor) -> None:
        """``prefill`` on the compiled runtime: the prompt but its last token into the static cache
        (in chunks of the largest bucket), the features from the same passes."""
        n = int(prompt_ids.shape[0])
        if n < 1 or n >= self.max_context:
            raise ValueError(
                f"prompt_ids has {n} tokens; the target accepts 1..{self.max_context - 1} "
                f"(max_context={self.max_context}, one position is kept for generation)"
            )
        self.static.reset()
        self.prompt_features = None
        if n > 1:
            _, states = self.static.run(prompt_ids[:-1])
            if self._feature_layers:
                self.prompt_features = _static_features(states, self._feature_layers)
        elif self._feature_layers:
            width = len(self._feature_layers) * int(self.model.config.hidden_size)
            self.prompt_features = torch.empty((0, width), dtype=self.runtime.torch_dtype, device=prompt_ids.device)
        self._pending = prompt_ids[-1:]

    @no_grad
    def verify(self, draft: Draft) -> Verification:
        if self._pending is None:
            raise RuntimeError("verify() called before prefill()")
        if draft.parents is not None:  # a tree (``Draft.is_tree``)
            return self._verify_tree(draft)
        k = draft.length
        start = self.cached_length
        self._check_room(start, k)
        inputs = torch.cat([self._pending, draft.token_ids])[None, :]  # (1, k + 1)
        hidden_states = None
        if self.runtime.batch_invariant:  # the decoding step's one-token passes (runtime.batch_invariant)
            logits, states, hidden_states = self._one_token_passes(inputs[0])
        elif self.static is not None:  # compiled: one bucketed pass, same logits
            logits, states = self.static.run(inputs[0])
        else:
            out = self.model(
                input_ids=inputs, cache=self.cache, use_cache=True, output_hidden_states=bool(self._feature_layers)
            )
            logits, hidden_states = out.logits[0], out.hidden_states  # (k + 1, V)
        accepted, target = self._accept(logits, draft)
        # Keep KV for the pending token and the accepted draft tokens; the correction/bonus is pending.
        if self.static is not None:
            self.static.length = start + 1 + accepted  # a rollback is a length
        else:
            crop_cache(self.cache, start + 1 + accepted, current=start + k + 1)  # the pass cached k + 1
        self._pending = target[accepted : accepted + 1]
        features = None
        if self._feature_layers and self.static is not None:
            features = _static_features(states, self._feature_layers, slice(0, accepted + 1))
        elif self._feature_layers:  # the committed positions' hidden states, from this same pass
            features = select_features(hidden_states, self._feature_layers, slice(0, accepted + 1))
        return Verification(
            accepted_length=accepted, next_token=int(self._pending), target_token_ids=target, features=features
        )

    def _accept(self, logits: torch.Tensor, draft: Draft) -> tuple[int, torch.Tensor]:
        """A chain's verification from the pass's logits ``(k + 1, V)``: greedy, the target's argmax
        ``(k + 1,) int64`` and the accepted length (the draft's longest prefix equal to it; one sync);
        sampling, ``_verify_sampled``. Timed as part of the target's pass (``timed_calls``)."""
        if self._sampling is not None:
            return self._verify_sampled(draft, logits)
        target = logits.argmax(dim=-1)  # (k + 1,) int64
        matches = (target[: draft.length] == draft.token_ids).int()  # (k,)
        return int(matches.cumprod(dim=0).sum()), target  # one sync: the accepted length

    def _one_token_passes(self, tokens: torch.Tensor) -> tuple[torch.Tensor, Any, Any]:
        """``runtime.batch_invariant``: ``tokens`` ``(n,)`` as n one-token passes, each on the cache the
        previous one extended -- every logit and cache entry computed as vanilla decoding computes
        it. Returns ``(logits (n, V), static states (n, L + 1, H) or None, HF hidden states or None)``."""
        if self.static is not None:
            runs = [self.static.run(tokens[i : i + 1]) for i in range(tokens.shape[0])]
            return torch.cat([r[0] for r in runs]), torch.cat([r[1] for r in runs]), None
        outs = [
            self.model(
                input_ids=tokens[None, i : i + 1],
                cache=self.cache,
                use_cache=True,
                output_hidden_states=bool(self._feature_layers),
            )
            for i in range(tokens.shape[0])
        ]
        hidden = None
        if self._feature_layers:  # per layer, the positions side by side: HF's (1, n, H) layout
            hidden = tuple(
                torch.cat([o.hidden_states[j] for o in outs], dim=1) for j in range(len(outs[0].hidden_states))
            )
        return torch.cat([o.logits[0] for o in outs]), None, hidden

    def _check_room(self, start: int, k: int) -> None:
        """Raises ValueError when a draft of ``k`` tokens after ``start`` cached tokens (tokens) would pass
        ``max_context`` (the pending token's position included)."""
        if start + k + 1 > self.max_context:
            raise ValueError(f"draft of {k} tokens would exceed the target context of {self.max_context} tokens")

    def _verify_tree(self, draft: Draft) -> Verification:
        """A draft tree in one pass (``specpolicy.core.tree``): positions by depth, each node attending to
        the cache, the root and its ancestors; greedy: the longest agreeing root-to-node path,
        sampling: recursive rejection sampling over siblings; the cache then keeps the committed
        prefix and the accepted path (moved, never recomputed).

        On the eager runtime on the CPU, with the cache's buffers in their host form (``kept_entries``)
        and the draft on the CPU, the host work is: numpy views of the draft, the pass's input in one
        compiled call (``tree.host_inputs``), and after the pass ONE compiled call (``keep_nodes``: the
        path's move in every buffer, by address, and the kept rows' features) -- the greedy path itself
        is the pass's (``_accept_tree``, one compiled call on the argmax's numpy view). No torch
        attribute is read. Elsewhere ``_verify_tree_general``."""
        k = draft.length
        cache: Any = self.cache
        draft_parents: Any = draft.parents  # not None: a tree
        held = self._tree_held
        if held[0] is self._pending and held[2] is cache and held[3][4][0, 0] == held[3][1][0].data_ptr():
            # nothing prefilled or verified since this path's last round: the buffers it left (only a
            # pass grows them, and only the verifier passes over its cache; checked after each pass),
            # at the addresses it holds (a deep copy of the verifier holds its original's: not reused)
            kept, pending = held[3], held[1]
        else:  # (a static runner attached after construction has no eager cache: the general path)
            kept = kept_entries(cache) if self._host_trees and self.static is None else None
            pending = None
        if kept is not None:
            try:  # numpy views of CPU tensors (a draft elsewhere, or needing grad: the general path)
                parents, tokens = draft_parents.numpy(), draft.token_ids.numpy()
            except (TypeError, RuntimeError):
                kept = None
        if kept is None:
            return self._verify_tree_general(draft, k)
        if parents.shape != (k,):
            tree.validate(draft_parents, k)  # names the shape
        first = kept[0][0]  # ``cached_length``: the first layer's length (``DynamicCache.get_seq_length``)
        start = first.length if first.is_initialized else 0
        self._check_room(start, k)
        if pending is None:
            pending = self._pending.numpy()  # type: ignore[union-attr]  # set: verify checked it
        inputs, positions, mask = tree.host_inputs(parents, tokens, pending, start)
        layers = self._feature_layers
        # what the round hands out after the pass, made before it (numpy and torch warm here): the
        # path's buffer and the next pending token's (its tensor shares it)
        nodes, pending_next = np.empty(k, dtype=np.int64), np.empty(1, dtype=np.int64)
        pending_t = torch.from_numpy(pending_next)
        out = self._eager_tree_pass(inputs, positions, mask, cache)
        path, target, p, host_target = self._accept_tree(out.logits, draft, parents, tokens, nodes)
        target_np: Any = host_target  # the argmax's numpy view on the host path
        if p is not None:  # sampling: the walk's decisions are host work
            path, nxt = tree.sample_path(p, draft_parents, draft.token_ids, draft.probs, self.runtime.generator)
            target_np[path[-1] + 1 if path else 0] = nxt
            nodes[: len(path)] = path
        m = len(path)
        if start + k + 1 > kept[5]:  # the pass grew the buffers: their new host form
            kept = kept_entries(cache)
        arrays: tuple | None = _NO_FEATURES[0]
        gathered = _NO_FEATURES[1]
        if layers:
            hidden = out.hidden_states
            try:  # the requested layers' (1, k + 1, H) hidden states as numpy views
                arrays = tuple([hidden[i].numpy() for i in layers])
            except (TypeError, RuntimeError):  # a dtype numpy does not hold: ``select_features``
                arrays = None
            if arrays is not None:
                width = 0
                for array in arrays:
                    width += array.shape[2]
                gathered = np.empty((m + 1, width), dtype=arrays[0].dtype)
        features = None
        if kept is not None and arrays is not None:  # one compiled call: the move and the features
            keep_nodes(kept, start, nodes, m, arrays, gathered)
            if layers:
                features = torch.from_numpy(gathered)
        else:
            rows = np.array((0, *[node + 1 for node in path]), dtype=np.int64)
            keep_path(cache, start, rows)
            if layers:
                features = select_features(hidden, layers, torch.from_numpy(rows))
        last = path[-1] + 1 if path else 0
        next_token = pending_next[0] = target_np.item(last)
        self._pending = pending_t
        self._tree_held = (pending_t, pending_next, cache, kept) if kept is not None else _NOTHING_HELD
        return Verification(
            accepted_length=m, next_token=next_token, target_token_ids=target, features=features, path=path
        )

    def _verify_tree_general(self, draft: Draft, k: int) -> Verification:
        """``_verify_tree`` off its host path: the compiled runtime, a target off the CPU, a cache whose
        buffers numpy does not hold. Host syncs: the tree's shape (parents) and the greedy path
        (sampling: one per decision of the walk). On the CPU the pass's input is one compiled call
        (``_tree_pass_host``) and the features are gathered with the path's move (``keep_path``,
        ``_host_features``)."""
        start = self.cached_length
        self._check_room(start, k)
        device = self._pending.device
        on_host = device.type == "cpu" and draft.parents.device.type == "cpu" and draft.token_ids.device.type == "cpu"
        if on_host:
            parents = draft.parents.numpy()
            if parents.shape != (k,):
                tree.validate(draft.parents, k)  # names the shape
            logits, hidden_states = self._tree_pass_host(parents, draft.token_ids.numpy(), start)
        else:
            # the tree's shape on the host once (one sync off the CPU)
            parents = np.asarray(draft.parents.tolist(), dtype=np.int64)
            if parents.shape != (k,):
                tree.validate(draft.parents, k)  # names the shape
            logits, hidden_states = self._tree_pass_device(parents, draft.token_ids.to(device), start)
        path, target, p, _ = self._accept_tree(logits, draft, parents)
        if p is not None:  # sampling: the walk's decisions are host work
            path, nxt = tree.sample_path(p, draft.parents, draft.token_ids, draft.probs, self.runtime.generator)
            target[path[-1] + 1 if path else 0] = nxt
        rows = np.array((-1, *path), dtype=np.int64)  # the pending token (root, row 0) and the accepted path
        rows += 1
        # the kept rows' features: on the CPU gathered with the path's move (one compiled call)
        gather = self._host_features(hidden_states, rows.shape[0], device) if self._feature_layers else None
        if self.static is not None:
            self.static.keep_rows(start, rows.tolist())
            if gather is not None:
                compiled_tree.gather_rows(gather[0], rows, gather[1])
        else:
            keep_path(self.cache, start, rows, gather)
        last = path[-1] + 1 if path else 0
        features = None
        if gather is not None:
            features = torch.from_numpy(gather[1])
        elif self._feature_layers:
            index = torch.from_numpy(rows)
            features = select_features(hidden_states, self._feature_layers, index.to(device))
        if target.device.type == "cpu":
            target_np = target.numpy()
            next_token = int(target_np[last])
            self._pending = torch.from_numpy(target_np[last : last + 1])
        else:
            self._pending = target[last : last + 1]
            next_token = int(self._pending)
        return Verification(
            accepted_length=len(path),
            next_token=next_token,
            target_token_ids=target,
            features=features,
            path=path,
        )

    def _tree_pass_host(self, parents: np.ndarray, tokens: np.ndarray, start: int) -> tuple[torch.Tensor, Any]:
        """The tree's pass when the draft and the target are on the CPU: its input ids, positions and
        mask from one compiled call (``tree.host_inputs``) shared with torch, then the model (or the
        compiled runtime's static runner). Returns ``(logits (k + 1, V), hidden states)`` (HF's
        layout: per layer ``(1, k + 1, H)``)."""
        inputs, positions, mask = tree.host_inputs(parents, tokens, self._pending.numpy(), start)
        if self.static is not None:  # compiled: the tree mask over the static cache
            logits, states = self.static.run(
                torch.from_numpy(inputs[0]), torch.from_numpy(positions[0]), torch.from_numpy(mask[0, 0])
            )
            return logits, states.transpose(0, 1)[:, None]  # (L + 1, 1, k + 1, H): HF's layout
        out = self._eager_tree_pass(inputs, positions, mask, self.cache)
        return out.logits[0], out.hidden_states  # (k + 1, V): at the root and after each node

    def _eager_tree_pass(self, inputs: np.ndarray, positions: np.ndarray, mask: np.ndarray, cache: Any) -> Any:
        """The eager model's pass over a tree's host layout (``tree.host_inputs``: ids and positions
        ``(1, k + 1) int64``, mask ``(1, 1, k + 1, S) bool``) on ``cache``, the hidden states when
        features are requested. Returns the model's output (logits ``(1, k + 1, V)``)."""
        attention = self.__dict__.get("_attention")
        if attention is None:  # the model's attention implementation, read once
            attention = self._attention = self.model.config._attn_implementation
        mask_t = torch.from_numpy(mask)
        return self.model(
            input_ids=torch.from_numpy(inputs),
            position_ids=torch.from_numpy(positions),
            attention_mask=mask_t
            if attention == "sdpa"
            else as_model_mask(mask_t, attention, self.runtime.torch_dtype),
            cache=cache,
            use_cache=True,
            output_hidden_states=bool(self._feature_layers),
        )

    def _tree_pass_device(self, parents: np.ndarray, tokens: torch.Tensor, start: int) -> tuple[torch.Tensor, Any]:
        """``_tree_pass_host`` for a target off the CPU: the layout built once per tree shape and kept
        on the device (``tree.verification_layout``), the input one ``cat``."""
        device = self._pending.device
        positions, mask = tree.verification_layout(parents, start, device, heads=self.static is None)
        inputs = torch.cat([self._pending, tokens])[None, :]  # [pending] + nodes, (1, k + 1)
        if self.static is not None:  # compiled: the tree mask over the static cache
            logits, states = self.static.run(inputs[0], positions, mask)
            return logits, states.transpose(0, 1)[:, None]  # (L + 1, 1, k + 1, H): HF's layout
        out = self.model(
            input_ids=inputs,
            position_ids=positions,
            attention_mask=as_model_mask(mask, self.model.config._attn_implementation, self.runtime.torch_dtype),
            cache=self.cache,
            use_cache=True,
            output_hidden_states=bool(self._feature_layers),
        )
        return out.logits[0], out.hidden_states

    def _host_features(self, hidden_states: Any, n: int, device: torch.device) -> tuple | None:
        """The features of the kept rows on the CPU (``select_features`` for dtypes numpy holds): the
        requested layers' hidden states as ``(k + 1, H)`` numpy views and an ``(n, len(layers) * H)``
        array to gather ``n`` rows into (``keep_path``'s ``gather``); None elsewhere."""
        layers = self._feature_layers
        first = hidden_states[layers[0]]
        if device.type != "cpu" or first.dtype not in _HOST_FLOATS or first.dim() != 3:
            return None
        arrays = tuple([np.ascontiguousarray(hidden_states[i].numpy()[0]) for i in layers])
        return arrays, np.empty((n, len(layers) * arrays[0].shape[1]), dtype=arrays[0].dtype)

    def _accept_tree(
        self,
        logits: torch.Tensor,
        draft: Draft,
        parents: np.ndarray,
        tokens: np.ndarray | None = None,
        nodes: np.ndarray | None = None,
    ) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor | None, np.ndarray | None]:
        """A tree's verification tensor work from the pass's logits ``(k + 1, V)``, timed as part of
        the target's pass (``timed_calls``). Greedy: ``(accepted path, argmax (k + 1,) int64, None, _)``
        (``tree.greedy_path``); sampling: ``((), argmax of the warped p, p (k + 1, V) float32, _)``, the
        walk (``tree.sample_path``) left to the caller as host work. The host path (``nodes`` given:
        ``_verify_tree``) hands HF's ``(1, k + 1, V)`` logits and the nodes' ``tokens`` ``(k,) int64``;
        its greedy path is one compiled call on the argmax's numpy view (``tree.greedy_nodes``, the path
        also written to ``nodes``), and the last item is that view (else None)."""
        if nodes is not None:
            logits = logits[0]
        if self._sampling is None:
            target = logits.argmax(dim=-1)
            if nodes is None:
                return tree.greedy_path(draft.parents, draft.token_ids, target, parents), target, None, None
            target_np = target.numpy()
            return tree.greedy_nodes(parents, tokens, target_np, nodes), target, None, target_np  # type: ignore[arg-type]
        p = warp(logits, self._sampling)
        target = p.argmax(dim=-1)
        return (), target, p, None if nodes is None else target.numpy()

    def _verify_sampled(self, draft: Draft, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Speculative sampling on the round's logits ((k + 1, V)); one host sync. Returns the
        accepted length and ``target_token_ids``: the accepted draft tokens, the sampled token,
        then (informational) the most likely tokens after it."""
        p = warp(logits, self._sampling)  # (k + 1, V) float32
        accepted, nxt = speculative_verify(p, draft.probs, draft.token_ids, self.runtime.generator)
        target = torch.cat([draft.token_ids[:accepted], p[accepted:].argmax(dim=-1)])
        target[accepted] = nxt
        return accepted, target


def _static_features(states: torch.Tensor, layers: tuple[int, ...], rows: slice = slice(None)) -> torch.Tensor:
    """``select_features`` of a static pass's hidden states ``(n, L + 1, H)``: ``(m, len(layers) * H)``."""
    return torch.cat([states[rows, i] for i in layers], dim=-1)


def prefill_prompt(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    max_context: int,
    feature_layers: tuple[int, ...],
    dtype: torch.dtype,
    cache: DynamicCache | None = None,
) -> tuple[DynamicCache, torch.Tensor | None]:
    """Prefill a prompt but its last token (which stays pending): one forward pass over
    ``prompt_ids[:-1]`` (``(P,) int64``) into ``cache`` (default: a new ``DynamicCache``), batch 1.
    Shared by the batch-1 verifier (a ``buffered_cache``: its rollbacks are lengths) and the batched
    one (``verifiers/hf_batch.py``).

    Returns:
        ``(cache, features)``: the cache of the first P - 1 positions, and their target features
        ``(P - 1, F)`` when ``feature_layers`` are given (else None).
    Raises:
        ValueError: a prompt that is empty or does not fit ``max_context``.
    """
    n = int(prompt_ids.shape[0])
    if n < 1 or n >= max_context:
        raise ValueError(
            f"prompt_ids has {n} tokens; the target accepts 1..{max_context - 1} "
            f"(max_context={max_context}, one position is kept for generation)"
        )
    cache, features = DynamicCache() if cache is None else cache, None
    if n > 1:
        out = model(
            input_ids=prompt_ids[None, :-1],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=bool(feature_layers),
        )
        if feature_layers:
            features = select_features(out.hidden_states, feature_layers)
    elif feature_layers:
        width = len(feature_layers) * int(model.config.hidden_size)
        features = torch.empty((0, width), dtype=dtype, device=prompt_ids.device)
    return cache, features


def validate(config: dict[str, Any]) -> None:
    """``verifier=hf``: known keys, the model's directory and weights (not loaded), the attention,
    ``max_context`` (an integer >= 0; 0 = the model's)."""
    check_keys("verifier", config, CONFIG_KEYS)
    check_model_source("verifier.model", config.get("model"))
    check_attention("verifier.attn_implementation", config.get("attn_implementation", "sdpa"))
    integer("verifier.max_context", config.get("max_context", 0), 0, note="tokens; 0 = the model's")


def build(config: dict[str, Any], runtime: Runtime) -> HFVerifier:
    """Factory for ``verifier=hf``. Config keys: ``model`` (bundled name, local path or hub id),
    ``attn_implementation`` (default sdpa), ``max_context`` (0 = the model's)."""
    model = load_causal_lm(config["model"], runtime, config.get("attn_implementation", "sdpa"))
    tokenizer = load_tokenizer(config["model"])
    return HFVerifier(
        model, runtime, eos_token_ids(model, tokenizer), int(config.get("max_context", 0) or 0), tokenizer=tokenizer
    )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``verifier=hf`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry(
            "verifier",
            NAME,
            build,
            validate,
            "any Hugging Face causal LM as the target, greedy or speculative sampling",
        )
    ]
