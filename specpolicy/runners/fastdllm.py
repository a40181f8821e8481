"""How Fast-dLLM v2's block passes run (``FastDLLMRunner``), for the drafter that states its
algorithm once over ``(R, B)`` positions (``drafters/fastdllm.py``; the model, its block-causal mask
and the token/confidence read are ``specpolicy.models.fastdllm``).

A pass feeds request ``i`` its current block of ``B`` tokens at absolute positions
``start_i .. start_i + B - 1``, on top of its sequence's ``start_i`` cached positions (the complete
blocks before it), bidirectionally inside the block (Fast-dLLM v2's block-wise attention, Wu et al.,
arXiv 2509.26328): an unmasking pass leaves the sequence as it was, a boundary pass keeps the
block's keys and values (``FastDLLMPass.writes``). Completed blocks are written in one block-causal
pass (``FastDLLMRunner.write``).

Runtimes (a request's sequence is a ``specpolicy.runners.causal.CausalSequence``):

- eager (``runtime.compile=false``): the Hugging Face forward on a ``DynamicCache`` per request --
  one request alone, or (a drafting call of several, the batched loop) each step's passes as ONE
  forward over a padded copy of their caches, rebuilt only when the rows or their cached lengths
  change;
- compiled (``runtime.compile=true``, a checkpoint of SUPPORTED): ``specpolicy.runners.decoder.StaticDecoder``
  under ``torch.compile`` with a block-wise causal mask, one static sequence (the batch-1 loop) or,
  from ``batched(slots)``, ``slots`` sequences shared by the requests: every step ONE compiled
  pass for every request (``StaticDecoder.run_rows``; batch 1 is ``R`` = 1 of the same forward).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from specpolicy.core.attention import as_model_mask
from specpolicy.core.cache import BufferedLayer, append_columns, crop_cache, padded_cache
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.models.fastdllm import block_causal_mask
from specpolicy.runners.causal import CausalRunner, CausalSequence
from specpolicy.runners.decoder import SUPPORTED, StaticDecoder


def block_pass(
    model: PreTrainedModel,
    cache: DynamicCache,
    ids: torch.Tensor,
    start: int,
    mask: torch.Tensor,
    attn: str,
    logits_to_keep: int | torch.Tensor,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One forward pass over ``ids`` ((n,) int64, absolute positions ``start..start+n-1``) on top of
    ``cache`` (which must hold exactly ``start`` positions), under ``mask`` (``(1, 1, n, start + n)``
    bool, True = attend); the pass's KV is appended to the cache.

    Args:
        attn: the model's attention implementation (``sdpa`` or ``eager``: how the mask is handed over).
        logits_to_keep: the last n positions (int) or the offsets (``(m,) int64``) whose logits are kept.
        dtype: the model's parameter dtype (the eager mask's); None: read from the model.
    Returns:
        The kept logits ``(m, V)`` in the model dtype.
    """
    n = int(ids.shape[0])
    assert cache.get_seq_length() == start, (cache.get_seq_length(), start)
    positions = torch.arange(start, start + n, device=ids.device)[None]
    dtype = next(model.parameters()).dtype if dtype is None else dtype
    out = model(
        input_ids=ids[None],
        attention_mask=as_model_mask(mask, attn, dtype),
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits[0]


def runs_padded(model: PreTrainedModel) -> bool:
    """Whether :func:`padded_block_pass` can run ``model``: a plain ``Qwen2ForCausalLM``, whose
    logits are its LM head over the decoder's output with nothing after."""
    from transformers import Qwen2ForCausalLM

    return type(model) is Qwen2ForCausalLM


def padded_block_pass(
    model: PreTrainedModel,
    cache: DynamicCache,
    width: int,
    ids: torch.Tensor,
    starts: torch.Tensor,
    keeps: list[torch.Tensor],
    attn: str,
) -> list[torch.Tensor]:
    """One pass over many requests' current blocks on one padded cache.

    Row r is its block ``ids[r]`` of B tokens at absolute positions ``starts[r] + 0..B-1``, on top
    of its own ``starts[r]`` cached columns of ``cache`` (padded to the widest, W columns): a 4-D
    mask keeps each row to its own cached columns and its own block (bidirectional inside it). The
    rows' last hidden states at the offsets each keeps go through the LM head together. The
    block's keys and values are appended to ``cache`` as columns ``[W, W + B)``.

    Args:
        model: a plain ``Qwen2ForCausalLM`` (:func:`runs_padded`).
        cache: the rows' caches padded into one (``specpolicy.core.cache.padded_cache``).
        width: W, the padded cache's columns (the longest row's cached length).
        ids: ``(b, B) int64``, the rows' current blocks.
        starts: ``(b,) int64``, each row's cached length.
        keeps: per row, ``(m_r,) int64`` block offsets whose logits it needs.
        attn: ``sdpa`` or ``eager``.
    Returns:
        Per row, its logits ``(m_r, V)`` in the model dtype.
    """
    b, B = ids.shape
    device = ids.device
    positions = starts[:, None] + torch.arange(B, device=device)
    past = torch.arange(width, device=device)[None] < starts[:, None]  # (b, W): own cached columns
    mask = torch.cat(
        [past[:, None, :].expand(b, B, width), torch.ones((b, B, B), dtype=torch.bool, device=device)], dim=2
    )[:, None]
    dtype = next(model.parameters()).dtype
    hidden = model.model(
        input_ids=ids,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        attention_mask=as_model_mask(mask, attn, dtype),
    ).last_hidden_state
    counts = [int(k.shape[0]) for k in keeps]
    owners = torch.repeat_interleave(torch.arange(b, device=device), torch.tensor(counts, device=device))
    picked = hidden[owners, torch.cat(keeps)]  # (sum m_r, H): every row's kept offsets
    return list(model.lm_head(picked).split(counts))


def greedy_into(logits: torch.Tensor, held: dict) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """``models.fastdllm.greedy`` of float32 CPU ``logits`` ``(..., m, V)`` (its default: the argmax and
    ``exp(max - logsumexp)``, the same operations, the same values) written into output tensors kept in
    ``held`` by shape, whose numpy views are made once: returns ``(tok (..., m) int64, conf (..., m)
    float32, their numpy views flattened to (m,))`` -- the pass's choice read on the host with no
    tensor op, a view per shape built once."""
    shape = logits.shape
    out = held.get(shape)
    if out is None:
        top = torch.empty(shape[:-1], dtype=torch.float32)
        tok, lse, conf = torch.empty(shape[:-1], dtype=torch.long), torch.empty_like(top), torch.empty_like(top)
        out = held[shape] = (top, tok, lse, conf, tok.numpy().reshape(-1), conf.numpy().reshape(-1))
    top, tok, lse, conf = out[0], out[1], out[2], out[3]
    torch.max(logits, -1, out=(top, tok))
    torch.logsumexp(logits, -1, out=lse)
    torch.exp(torch.sub(top, lse, out=top), out=conf)
    return tok, conf, out[4], out[5]


def host_choice(tok: torch.Tensor, conf: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """One host read of a pass's choice: ``tok`` ``(m,) int64`` and ``conf`` ``(m,) float32`` ->
    numpy arrays (on the CPU, views; on a device, one transfer of both, exact: ids below 2**53)."""
    if tok.device.type == "cpu":
        return tok.numpy(), conf.numpy()
    both = torch.stack([tok.double(), conf.double()]).cpu().numpy()
    return both[0].astype(np.int64), both[1].astype(np.float32)


#: ``drafter.confidence_dtype``: ``float32`` = softmax/argmax in at least float32 (default);
#: ``model`` = softmax and argmax in the model dtype, as the official FailFast / Fast-dLLM v2 code.
CONFIDENCE_DTYPES = ("float32", "model")


def check_settings(block_size: Any, small_block_size: Any, threshold: Any, confidence_dtype: Any = "float32") -> None:
    """Check the drafter's settings without a model (``drafter.block_size``, ``drafter.small_block_size``,
    ``drafter.threshold``, ``drafter.confidence_dtype``).

    Raises:
        ValueError: naming the key, the value and the accepted range.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"drafter.block_size must be an integer >= 1, got {block_size!r}")
    if (
        isinstance(small_block_size, bool)
        or not isinstance(small_block_size, int)
        or not 1 <= small_block_size <= block_size
        or block_size % small_block_size != 0
    ):
        raise ValueError(
            f"drafter.small_block_size must be an integer in [1, block_size={block_size}] dividing "
            f"block_size, got {small_block_size!r}"
        )
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"drafter.threshold must be a number in [0, 1], got {threshold!r}")
    if confidence_dtype not in CONFIDENCE_DTYPES:
        raise ValueError(
            f"drafter.confidence_dtype must be one of {', '.join(CONFIDENCE_DTYPES)}, got {confidence_dtype!r}"
        )


def check_buckets(block_size: int, buckets: Sequence[int]) -> None:
    """On the static cache, the largest of ``runtime.buckets`` must be a multiple of the block size:
    a pass runs in chunks of at most that many positions, and a block split between two chunks would
    see its later positions unwritten.

    Raises:
        ValueError: one line naming ``runtime.buckets`` and ``drafter.block_size``.
    """
    if max(buckets) % block_size:
        raise ValueError(
            f"runtime.buckets={list(buckets)}: the largest must be a multiple of drafter.block_size={block_size} "
            "on the compiled runtime"
        )


@dataclass
class FastDLLMPass:
    """One request's part of a block pass (``FastDLLMSteps.run``).

    Attributes:
        sequence: the request's sequence (``FastDLLMRunner.open``), holding exactly ``start``
            positions (its complete blocks).
        ids: ``(B,) int64`` its current block (committed tokens, drafted tokens, mask tokens).
        start: the block's first absolute position (a multiple of B).
        keep: ``(m,) int64`` the block offsets whose logits it needs (an unmasking pass), or None:
            the block's last logit (a boundary pass, whose last logit gives the next block's first token).
        writes: keep the block's keys and values in the sequence (a boundary pass) or leave it as
            it was (an unmasking pass).
    """

    sequence: CausalSequence
    ids: torch.Tensor
    start: int
    keep: torch.Tensor | None
    writes: bool


class FastDLLMRunner:
    """How a Fast-dLLM v2 model's block passes run (see the module docstring).

    Args:
        model: the block-diffusion LM (a causal LM, e.g. ``Qwen2ForCausalLM``) on
            ``runtime.torch_device`` in ``runtime.torch_dtype``, eval mode.
        attn: its attention implementation, ``sdpa`` or ``eager`` (``models.fastdllm.check_model``).
        block_size: B, tokens per block.
        runtime: the run's runtime; ``runtime.compile`` puts the passes on the compiled static cache
            (``runtime.*`` settings, compile seconds added to ``runtime.warmup_s``) for a Qwen2/Qwen3
            model (another model type drafts eagerly).
        capacity: most positions per request (tokens), the drafter's context.
        static_cache: run on the static cache (default: ``runtime.compile`` and a Qwen2/Qwen3
            model); compiled only when ``runtime.compile`` (uncompiled: the same passes, eagerly).
    Raises:
        ValueError: on the static cache, a largest ``runtime.buckets`` that is not a multiple of B
            (a block split between two chunks would see its later positions unwritten).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        attn: str,
        block_size: int,
        runtime: Runtime,
        capacity: int,
        static_cache: bool | None = None,
    ) -> None:
        self.model, self.attn, self.block_size = model, attn, block_size
        #: several requests' eager passes run as one padded forward (a plain ``Qwen2ForCausalLM``)
        self.pads = runs_padded(model)
        if static_cache is None:
            static_cache = runtime.compile and getattr(model.config, "model_type", None) in SUPPORTED
        if static_cache:
            check_buckets(block_size, runtime.compiled.buckets)
        #: the requests' sequences: a ``DynamicCache`` each, or the static cache's (``causal.static``)
        self.causal = CausalRunner(model, runtime, capacity, static_cache=static_cache)
        self.shared = False  # a batched run's static cache of several sequences (``batched``)
        first = next(model.parameters())
        self._dtype, self._device = first.dtype, first.device
        #: block start -> (the model's mask (1, 1, B, start + B), positions (1, B)): ``alone_inputs``' views,
        #: made once per start while the full ones stand (a draft crossing a block and a commit back into
        #: it move the start back and forth every round)
        self._alone_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._alone_full: tuple | None = None  # (the model's mask (1, 1, B, W), positions (1, W)): ``alone_inputs``
        self._buffered: tuple | None = None  # (a cache, its layer count, all BufferedLayer?): ``alone``

    @property
    def static(self) -> StaticDecoder | None:
        """The static cache the passes run on (compiled runtime), else None (eager)."""
        return self.causal.static

    def batched(self, slots: int) -> FastDLLMRunner:
        """The runner of a batched run of at most ``slots`` requests: on the static cache, one of
        ``slots`` sequences (built and compiled once per batch size); eager, this runner."""
        if self.static is None:
            return self
        runner = copy.copy(self)
        runner.causal, runner.shared = self.causal.batched(slots), True
        return runner

    def batched_cache(self, slots: int) -> StaticDecoder | None:
        """The static cache ``batched(slots)`` built, if it did (``CausalRunner.batched_cache``)."""
        return self.causal.batched_cache(slots)

    def eager(self) -> FastDLLMRunner:
        """This runner without its static cache: the Hugging Face forward, a cache per request."""
        runner = copy.copy(self)
        runner.causal = CausalRunner(self.model, self.causal.runtime, self.causal.capacity, static_cache=False)
        runner.shared = False
        return runner

    def open(self) -> CausalSequence:
        """A new request's empty sequence.

        Raises:
            RuntimeError: on the static cache, every sequence held (close them).
        """
        return self.causal.open()

    def close(self, sequence: CausalSequence | None) -> None:
        """The request is done: its static sequence is free for the next (eager: nothing to do)."""
        self.causal.close(sequence)

    def alone_inputs(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A request's block pass alone at block start ``start``: the all-visible mask over its
        ``start`` cached positions and its block, in the model's form (``as_model_mask`` of
        ``(1, 1, B, start + B)`` bool), and the block's positions ``(1, B) int64``, on the model's
        device: views (``narrow``) of a mask and positions built once for the widest block end so far
        (grown by doubling up to the capacity), taken once per block start (``_alone_views``, emptied
        when the full ones grow) and read by every pass over that block."""
        held = self._alone_views.get(start)
        if held is None:
            B, device, end = self.block_size, self._device, start + self.block_size
            full = self._alone_full
            if full is None or full[1].shape[1] < end:
                width = max(end, min(2 * (0 if full is None else full[1].shape[1]), self.causal.capacity))
                mask = as_model_mask(
                    torch.ones(1, 1, B, width, dtype=torch.bool, device=device), self.attn, self._dtype
                )
                full = self._alone_full = (mask, torch.arange(width, device=device)[None])
                self._alone_views = {}  # views of the full ones they replace
            held = self._alone_views[start] = (full[0].narrow(3, 0, end), full[1].narrow(1, start, B))
        return held

    def alone(
        self, sequence: CausalSequence, row: torch.Tensor, start: int, keep: torch.Tensor | None, writes: bool
    ) -> torch.Tensor:
        """One request's block pass as the Hugging Face forward on its own (eager) cache, under the
        all-visible mask: ``row`` ``(1, B) int64`` the block at positions ``start ..``, the cache holding
        exactly ``start`` positions; ``keep`` ``(m,) int64`` the offsets whose logits come back, None the
        last one. Returns the logits ``(1, m, V)`` in the model dtype. ``writes``: the block's keys and
        values stay in the cache (a boundary pass); else (an unmasking pass) the cache is put back as it
        was: each ``BufferedLayer``'s length (no tensor op), a plain layer's keys and values (the
        tensors the pass concatenated onto), else a crop. Host work: the mask and positions are
        ``alone_inputs``' (built once per block start)."""
        cache = sequence.cache
        assert cache is not None  # an eager sequence
        held = self._alone_views.get(start)
        mask, positions = self.alone_inputs(start) if held is None else held
        layers: Any = cache.layers  # transformers' cache layers
        kept, buffered = None, False
        if not writes and layers:
            seen = self._buffered
            if seen is None or seen[0] is not cache or seen[1] != len(layers):  # once per cache and layer count
                seen = self._buffered = (cache, len(layers), all(type(layer) is BufferedLayer for layer in layers))
            buffered = seen[2]
            if not buffered and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
                kept = [(layer, layer.keys, layer.values) for layer in layers]
        logits = self.model(
            input_ids=row,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1 if keep is None else keep,
        ).logits
        if buffered:
            for layer in layers:  # an unmasking pass adds nothing to the cache: a length (``crop_cache``'s)
                layer._key_length = layer._value_length = start
        elif kept is not None and len(layers) == len(kept):
            for layer, keys, values in kept:
                layer.keys, layer.values = keys, values
        elif not writes:
            sequence.crop(start)
        return logits

    def rollback(self, sequence: CausalSequence, length: int) -> None:
        """Roll ``sequence`` back to its first ``length`` positions (a no-op if shorter): on an eager
        cache ``alone`` has seen as all ``BufferedLayer``, each layer's length; else ``CausalSequence.crop``."""
        cache, seen = sequence.cache, self._buffered
        if cache is not None and seen is not None and seen[0] is cache and seen[1] == len(cache.layers) and seen[2]:
            layers: Any = cache.layers  # BufferedLayer ones (``alone`` saw them)
            for layer in layers:
                layer._key_length = layer._value_length = min(layer._key_length, length)
        else:
            sequence.crop(length)

    @no_grad
    def write(self, sequence: CausalSequence, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Write the keys and values of complete blocks ``ids`` (``(n,) int64``, n a multiple of B, from
        block boundary ``start``, the sequence holding exactly ``start`` positions) in one
        block-causal pass. Returns the last position's logits ``(1, V)`` (the next block's first token)."""
        n = int(ids.shape[0])
        if sequence.rows is None and n == self.block_size:  # one block: ``alone``'s all-visible mask
            return self.alone(sequence, ids[None], start, None, True)[0]
        if sequence.rows is None:
            mask = block_causal_mask(start, n, start + n, self.block_size, ids.device)
            return block_pass(self.model, sequence.cache, ids, start, mask, self.attn, 1, self._dtype)
        return _static_pass(self.block_size, [FastDLLMPass(sequence, ids, start, None, writes=True)])[0]

    def steps(self, requests: int) -> FastDLLMSteps:
        """The passes of one drafting call of ``requests`` requests: on the static cache, each step
        one pass over its sequences; eager, each request's passes alone on its own cache (one
        request, or a model the padded pass does not run), else each step's in one padded forward."""
        return FastDLLMSteps(self, padded=self.static is None and requests > 1 and self.pads)


def _static_pass(block_size: int, passes: list[FastDLLMPass]) -> list[torch.Tensor]:
    """Every request's positions in ONE pass over the static cache's sequences
    (``StaticDecoder.run_rows``, block-wise causal), the other sequences idle; a request that does not
    write goes back to its length. Returns each request's kept logits (``keep`` None: ``(1, V)``)."""
    rows = passes[0].sequence.rows
    n = max(int(p.ids.shape[0]) for p in passes)
    ids = torch.zeros((rows.static.rows, n), dtype=torch.long, device=passes[0].ids.device)
    for p in passes:
        if p.sequence.length != p.start:
            raise RuntimeError(f"a block pass from {p.start} on a sequence of {p.sequence.length} positions")
        ids[p.sequence.slot, : p.ids.shape[0]] = p.ids
    counts = [int(p.ids.shape[0]) for p in passes]
    starts, fed = rows.feed([p.sequence.slot for p in passes], counts)
    logits, _ = rows.static.run_rows(ids, starts, fed, block_size)  # (rows, n, V)
    kept = []
    for p, count in zip(passes, counts):
        row = logits[p.sequence.slot]
        kept.append(row[count - 1 : count] if p.keep is None else row[p.keep])
        if not p.writes:
            p.sequence.crop(p.start)  # an unmasking pass leaves the sequence as it was
    return kept


class FastDLLMSteps:
    """The passes of one drafting call (``FastDLLMRunner.steps``): ``run`` a step's passes, one per
    request that takes one. Padded (eager, several requests): the requests' caches copied into one
    padded cache, kept from step to step while the same rows stand at the same cached lengths."""

    def __init__(self, runner: FastDLLMRunner, padded: bool) -> None:
        self.runner, self.padded = runner, padded
        self._copy: tuple | None = None  # (the rows' caches by identity, cached lengths, the padded cache)

    @no_grad
    def run(self, passes: list[FastDLLMPass]) -> list[torch.Tensor]:
        """One step: request ``i``'s block ``passes[i].ids`` after its cached blocks. Returns each
        request's kept logits ``(m_i, V)`` in the model dtype (a boundary pass: ``(1, V)``); a
        writing pass's keys and values join its sequence, the others' leave it as it was."""
        if self.runner.static is not None:
            return _static_pass(self.runner.block_size, passes)
        if not self.padded:
            return [self._alone(p) for p in passes]
        return self._together(passes)

    def _alone(self, p: FastDLLMPass) -> torch.Tensor:
        """One request's pass as the Hugging Face forward on its own cache (``FastDLLMRunner.alone``)."""
        return self.runner.alone(p.sequence, p.ids[None], p.start, p.keep, p.writes)[0]

    def _together(self, passes: list[FastDLLMPass]) -> list[torch.Tensor]:
        """Every request's pass in ONE padded forward (``padded_block_pass``); a writing row's new
        columns join its own cache, and the padded copy drops the step's columns."""
        runner = self.runner
        device = passes[0].ids.device
        caches = [p.sequence.cache for p in passes]
        owners, lengths = [id(c) for c in caches], [p.start for p in passes]
        for c, p in zip(caches, passes):
            assert c.get_seq_length() == p.start, (c.get_seq_length(), p.start)
        if self._copy is None or self._copy[0] != owners or self._copy[1] != lengths:
            self._copy = (owners, lengths, padded_cache(caches)[0])
        cache, width = self._copy[2], max(lengths)
        last = torch.tensor([runner.block_size - 1], device=device)
        keeps = [last if p.keep is None else p.keep for p in passes]
        ids = torch.stack([p.ids for p in passes])  # (b, B)
        starts = torch.tensor(lengths, device=device)
        logits = padded_block_pass(runner.model, cache, width, ids, starts, keeps, runner.attn)
        for r, (c, p) in enumerate(zip(caches, passes)):
            if p.writes:  # the block's keys and values join the row's own cache
                append_columns(c, cache, r, slice(width, None))
        crop_cache(cache, width)  # the padded copy drops this step's columns
        if any(p.writes for p in passes):
            self._copy = None  # a row's cached length moved: copy again
        return logits
