"""The static KV cache every compiled model shares (``runtime.compile=true``): ``StaticPasses``.

gpt-fast's recipe (static KV cache + ``torch.compile``; pytorch-labs/gpt-fast ``model.py``) on a
Hugging Face checkpoint's own modules (weights shared): one preallocated key and value tensor per
layer ``(R, kv_heads, capacity + pad, head_dim)`` -- ``R`` sequences, one per request in flight,
``R = 1`` for the batch-1 loop -- RoPE from the model's own rotary module, attention under an
explicit boolean mask built from the cache slots, so that

- rolling back is moving a length, never copying or freeing;
- on CUDA every pass has one of a few shapes: ``n`` new positions are padded up to a bucket
  (``runtime.buckets``: 1, 2, 4, ..., 64; more than the largest bucket runs in chunks), the padded
  rows write scratch slots no real row ever sees, so the real rows' outputs are those of the
  unpadded pass; on CPU, whose graphs take dynamic sizes, a pass runs at its exact width
  (``runtime.pad_dynamic``), in the same chunks;
- the passes are compiled once per process, when the model is built (``warmup``), with inductor's
  on-disk cache between processes: on CUDA one graph per bucket (``torch.compile(fullgraph=True,
  dynamic=False)``, replayed as CUDA graphs: ``runtime.cuda_mode``), attention over the whole cache;
  on CPU two graphs with dynamic sizes (the one-row decoding step, and every other width),
  attention over a window of the cache (``runtime.window``).

Every setting is a ``runtime.*`` key (``specpolicy.core.runtime.CompileSettings``), handed to a
model when it is built. A model (``specpolicy.runners.decoder``, ``.eagle3``, ``.dflash``) writes ONE
forward over ``(R, B)`` positions; the batch-1 loop runs it at ``R = 1`` (``passes``), the batched
loop at ``R`` = the batch size (``_rows_passes``).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specpolicy.core.runtime import CompileSettings, inference_mode, no_grad

#: The default pass widths (``runtime.buckets``).
BUCKETS = CompileSettings().buckets


def bucket_of(n: int, buckets: Sequence[int] = BUCKETS) -> int:
    """The smallest bucket >= ``n`` (``n`` in ``1..max(buckets)``).

    Raises:
        ValueError: for ``n`` < 1 or above the largest bucket.
    """
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"a pass of {n} positions exceeds the largest bucket {max(buckets)}; run it in chunks")


def rows_buckets(rows: int, buckets: Sequence[int] | None = None) -> tuple[int, ...]:
    """The buckets of a static cache of ``rows`` sequences: ``buckets`` (default ``BUCKETS``) as they
    are for ``rows`` = 1 (the batch-1 loop's one-row decoding step has a graph of its own), else
    without 1 -- a one-token pass is padded to 2 (its graph,
    static in every size, multiplied with MKL at about half the speed of the 2-token graph's
    oneDNN here: 5.3 against 3.3 ms, the target, 4 rows).

    Raises:
        ValueError: ``rows`` < 1.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    buckets = tuple(sorted(BUCKETS if buckets is None else buckets))
    return buckets if rows == 1 else tuple(b for b in buckets if b > 1) or (2,)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm exactly as transformers computes it (float32 statistics, cast back, then scale)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _row_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for one row ``x`` ``(..., 1, in)`` as a sum over the rows of the ``(out, in)``
    ``weight`` (``runtime.cpu_matmul=reduction``): ``(..., 1, out)``."""
    return (x.unsqueeze(-2) * weight).sum(-1)


def _row_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for one row ``x`` ``(..., 1, in)``, by ``_row_product``: ``(..., 1, out)``."""
    y = _row_product(x, module.weight)
    return y if module.bias is None else y + module.bias


def _row_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query row's grouped-query attention in plain operations (inductor fuses them; SDPA's
    kernel is a call of its own): ``q`` ``(1, heads, 1, d)``, ``keys``/``values`` ``(1, kv_heads,
    w, d)``, ``mask`` ``(1, w) bool``; returns ``(1, heads, 1, d)``, as SDPA with ``enable_gqa``."""
    heads, d = q.shape[1], q.shape[-1]
    q = q.reshape(1, keys.shape[1], heads // keys.shape[1], d)  # query head h reads kv head h // groups
    scores = (q @ keys.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(~mask[None, None], float("-inf"))
    return (torch.softmax(scores, -1) @ values).reshape(1, heads, 1, d)


class StaticPasses(torch.nn.Module):
    """A model's passes behind a static KV cache of ``R`` sequences: what every static model
    shares -- the per-layer key/value buffers, the length (``R`` = 1) or the sequences' lengths
    (the caller's, ``SharedSequences``), the buckets, padding and chunking, the mask, and the
    compilation (one graph per bucket). A subclass sets up its model and its one ``_forward``.

    ``_forward(*row_inputs, positions, slots, mask)`` takes each per-row input ``(R, B, ...)`` at
    the pass's width ``B`` (the bucket where passes pad, ``pads``, else the real positions),
    positions ``(R, B)``, cache slots ``(R, B)`` and ``mask`` ``(R, B, width) bool``; it writes
    the keys and values of its positions at ``slots`` of their sequence and returns outputs
    ``(R, B, ...)``. At ``R`` = 1 a forward may pick other kernels than at ``R`` > 1 (the measured
    batch-1 step: SDPA, ``index_copy_``, reductions for one row), never another computation.

    Attributes:
        length: cached positions (tokens); the next pass writes from here. Set it lower to roll back.
        warmup_s: seconds spent compiling (``warmup``), 0 when not compiled.
    """

    def _setup(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        compile: bool,
        buckets: Sequence[int] | None,
        rows: int = 1,
        settings: CompileSettings | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
        settings = self.settings = settings or CompileSettings()
        self.rows = int(rows)
        self.buckets = rows_buckets(self.rows, settings.buckets if buckets is None else buckets)
        self.capacity = int(capacity)
        self.width = self.capacity + max(self.buckets)  # scratch slots for padded rows past the capacity
        shape = (rows, kv_heads, self.width, head_dim)
        # one buffer per layer (a static address each: written in place, never reallocated)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        for i in range(layers):
            self.register_buffer(f"k{i}", self.keys[i], persistent=False)
            self.register_buffer(f"v{i}", self.values[i], persistent=False)
            if compile and device.type == "cuda":  # CUDA graphs: written in place at a fixed address
                from torch._dynamo import mark_static_address

                mark_static_address(self.keys[i])
                mark_static_address(self.values[i])
        self.register_buffer("columns", torch.arange(self.width, device=device), persistent=False)
        self.window = settings.window if device.type != "cuda" else self.width
        # pad each pass to its bucket only where a graph is static (CUDA); elsewhere exact widths
        self.pads = (compile and device.type == "cuda") or settings.pad_dynamic
        self.replayed = compile and device.type == "cuda"  # CUDA graphs: outputs in reused buffers
        self.length = 0
        self.warmup_s = 0.0
        self.compiled = bool(compile)
        self._pass = self._pass_one = self._forward
        if compile:
            import torch._dynamo as dynamo

            # one graph per bucket: room for every bucket (and a few dtypes/devices) without falling back
            dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 4 * len(self.buckets))
            dynamo.config.accumulated_recompile_limit = max(dynamo.config.accumulated_recompile_limit, 1024)
            # CUDA: one static graph per bucket, CUDA graphs (cuda_mode), attention over the whole
            # cache (cheap there). CPU: dynamic sizes -- one graph for the decoding step (1 row) and
            # one for the other buckets and every attention window -- fewer graphs to compile, less to read.
            cuda = device.type == "cuda"
            dynamic = not cuda
            # Guards on the input tensors only (the bucket's shapes pick the graph): this module's
            # weights and Python attributes do not change after construction, and guarding them costs
            # ~1 ms a call. That is sound per instance only, so each instance compiles its own copy
            # of the pass's code (dynamo caches graphs per code object): no graph is shared between
            # two models, whatever their shapes.
            # mode= and options= exclude each other in torch.compile: "reduce-overhead" is spelled
            # as its inductor option (triton.cudagraphs), beside the guard filter
            options: dict = {"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe}
            backend = "inductor"
            if cuda and settings.cuda_mode == "cudagraphs":  # dynamo's graph, replayed as a CUDA graph, no inductor
                backend = "cudagraphs"
            elif cuda:
                options["triton.cudagraphs"] = settings.cuda_mode == "reduce-overhead"
            else:
                options["cpp_wrapper"] = settings.cpu_cpp_wrapper

            def compiled(function: Callable | None = None) -> Callable:
                function = function or type(self)._forward
                code = function.__code__.replace()
                fresh = types.FunctionType(code, function.__globals__, function.__name__)
                method = types.MethodType(fresh, self)
                fn = torch.compile(method, fullgraph=True, dynamic=dynamic, backend=backend, options=options)
                if cuda or not settings.cpu_freeze:
                    return fn

                def frozen(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
                    # freezing is read twice: by dynamo as it traces (this module's tensors become
                    # graph attributes, not inputs) and by inductor (unmutated ones become constants;
                    # the caches, written in the graph, stay inputs), so it is set around each call
                    with torch._inductor.config.patch(freezing=True):
                        return fn(*args)

                return frozen

            self._pass = compiled()
            self._compiled_copy = compiled  # a compiled copy of another of this instance's methods
            # CPU: the one-row pass (the decoding step) is a code object of its own, so the graph
            # traced for one row (its size 1 specialised) is the only one a one-row pass can meet and
            # never the graph of the other buckets (the guard filter keeps tensor guards only)
            self._pass_one = compiled() if not cuda else self._pass

    def _width(self, m: int) -> int:
        """The width a pass over ``m`` new positions runs at: its bucket where passes pad
        (``pads``), else ``m`` itself (at least the smallest bucket: a batched cache has no
        one-row graph, ``rows_buckets``)."""
        return bucket_of(m, self.buckets) if self.pads else max(m, self.buckets[0])

    def _run(
        self, b: int, rows: Sequence[torch.Tensor], positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The (compiled) forward of a pass of width ``b``: the one-row graph for ``b`` = 1 (a code
        object of its own on CPU, so the graph traced for one row is the only one it meets)."""
        return (self._pass_one if b == 1 else self._pass)(*rows, positions, slots, mask)

    def write(self, i: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer ``i``'s new keys and values ``k``, ``v`` ``(R, kv_heads, B, head_dim)`` at their
        sequences' columns ``slots`` ``(R, B)``, in place; returns the layer's key and value buffers.
        One sequence: ``index_copy_`` (the batch-1 step's measured kernel); several: ``index_put_``."""
        cache_k, cache_v = self.layer_cache(i)
        if slots.shape[0] == 1:
            cache_k.index_copy_(2, slots[0], k)
            cache_v.index_copy_(2, slots[0], v)
        else:
            row_index = torch.arange(slots.shape[0], device=slots.device)[:, None]  # (R, 1)
            cache_k[row_index, :, slots] = k.transpose(1, 2)  # in place (index_put_): never a copy
            cache_v[row_index, :, slots] = v.transpose(1, 2)
        return cache_k, cache_v

    def layer_cache(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s key and value buffers, by their registered names: a compiled pass then sees
        module buffers (static addresses, which CUDA graphs keep in place), not list elements."""
        return getattr(self, f"k{i}"), getattr(self, f"v{i}")

    def _forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self) -> None:
        """Empty the cache (a new prompt): the length only."""
        self.length = 0

    @inference_mode
    def passes(
        self, rows: Sequence[torch.Tensor], positions: torch.Tensor | None = None, attend: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Feed ``n`` new positions after the cached ones (cache slots ``length .. length + n - 1``)
        of a cache of one sequence (the forward at ``R`` = 1); the length grows by ``n``.

        Args:
            rows: the per-row inputs, each ``(n, ...)``.
            positions: ``(n,) int64`` RoPE positions (default: the slots: a chain); a tree's by depth.
            attend: ``(n, length + n) bool``, True where new row i sees cache column j (a tree mask,
                ``specpolicy.core.tree``); default causal over the slots.
        Returns:
            the pass's outputs, each ``(n, ...)``: fresh (inference-mode) tensors.

        Every input of the compiled pass is a fresh inference-mode tensor (as in the decoding loop,
        which runs under ``torch.inference_mode``), whoever calls: a view of a buffer or a tensor made
        outside inference mode would not match the compiled graph's guards and compile it again.
        Raises:
            ValueError: if the cache cannot hold ``n`` more positions (``capacity``) or ``n`` < 1.
            RuntimeError: on a cache of several sequences (``_rows_passes`` feeds those).
        """
        if self.rows != 1:
            raise RuntimeError(f"passes feeds a cache of one sequence; this one holds {self.rows}")
        n, start = int(rows[0].shape[0]), self.length
        if n < 1 or start + n > self.capacity:
            raise ValueError(f"{n} new positions after {start} cached do not fit the static cache of {self.capacity}")
        device = rows[0].device
        full = None
        if attend is not None:  # (n, width): the caller's pattern, nothing past the new positions
            full = torch.zeros((n, self.width), dtype=torch.bool, device=device)
            full[:, : start + n] = attend
        top = self.buckets[-1]
        chunks = []
        for a in range(0, n, top):  # chunks of at most the largest bucket
            m = min(top, n - a)
            b = self._width(m)
            slots = torch.arange(start + a, start + a + b, device=device)
            # pad: zeros at the scratch slots' own positions (no real row sees them); always a copy
            inputs = [torch.cat([x[a : a + m], x.new_zeros((b - m, *x.shape[1:]))]) for x in rows]
            if positions is None:  # a chain: positions are the slots
                pos = torch.arange(start + a, start + a + b, device=device)
            else:
                pos = torch.cat([positions[a : a + m], slots[m:]])
            window = min(self.width, -(-(start + a + b) // self.window) * self.window)  # columns attention reads
            mask = self.columns[None, :window] <= slots[:, None]  # causal over the slots
            if full is not None:
                mask = torch.cat([full[a : a + m, :window], mask[m:]])
            # the one forward at R = 1: a sequence axis of one
            outputs = self._run(b, [x[None] for x in inputs], pos[None], slots[None], mask[None])
            # a CUDA-graph pass reuses its output buffers: keep copies (a CPU graph's are fresh)
            chunks.append([y[0, :m].clone() if self.replayed else y[0, :m] for y in outputs])
        self.length = start + n
        if len(chunks) == 1:
            return tuple(chunks[0])
        return tuple(torch.cat(ys) for ys in zip(*chunks))

    def _rows_passes(
        self,
        inputs: Sequence[torch.Tensor],
        starts: torch.Tensor,
        counts: torch.Tensor | None = None,
        block_size: int | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Feed row ``r`` of a cache of several sequences its new positions at columns (and
        positions) ``starts[r], starts[r] + 1, ...``, causally over its own columns, in chunks of at
        most the largest bucket, each at its width (``_width``: padded to a bucket on CUDA): what
        ``StaticDecoder.run_rows``, ``StaticEagle3.run_rows`` and ``StaticDFlash.context_rows`` share.

        Args:
            inputs: per-row inputs ``(rows, n, ...)``.
            starts: ``(rows,) int64`` each row's cached length.
            counts: ``(rows,) int64`` each row's real new positions (0: a row whose cache must stay
                as it is, e.g. a request that does not draft this step): the rest of its ``n``
                columns, and the bucket's padding, go to scratch columns past the capacity, which
                no real position sees. None: every row's ``n`` are real, and a bucket's padding is
                written past each row's new positions, where no real token looks.
            block_size: None: causal. B: block-wise causal (Fast-dLLM v2, arXiv 2509.26328): a
                position sees every column of its block of B absolute positions and the blocks
                before it; a row's new positions must then be whole blocks from a block boundary,
                and the largest bucket a multiple of B (no block split between chunks).
        Returns:
            the pass's outputs, each ``(rows, n, ...)``.
        Raises:
            ValueError: if a row's real new positions would pass the capacity.
        """
        n = int(inputs[0].shape[1])
        ends = starts + (n if counts is None else counts)  # (rows,) past each row's real positions
        longest = int(ends.max())
        if longest > self.capacity:
            raise ValueError(f"new positions up to {longest} do not fit the static cache of {self.capacity}")
        top = self.buckets[-1]
        chunks = []
        for a in range(0, n, top):
            m = min(top, n - a)
            b = self._width(m)
            rows = [torch.cat([x[:, a : a + m], x.new_zeros((x.shape[0], b - m, *x.shape[2:]))], dim=1) for x in inputs]
            steps = torch.arange(b, device=starts.device)
            slots = starts[:, None] + a + steps  # (rows, b)
            if counts is None:  # the columns the rows read: up to this chunk's last
                window = longest - n + a + b
            else:  # real positions at their columns, the rest at the scratch columns past the capacity
                slots = torch.where(a + steps < counts[:, None], slots, self.capacity + steps)
                window = max(int(torch.minimum(ends, starts + a + b).max()), 1)  # all idle (warm-up): one window, not 0
            window = min(self.width, -(-window // self.window) * self.window)
            if block_size is None:
                mask = self.columns[None, None, :window] <= slots[:, :, None]  # (rows, b, window)
            else:  # the whole block of each position: columns before its block's end
                mask = self.columns[None, None, :window] < (slots[:, :, None] // block_size + 1) * block_size
            # positions = the slots, as their own tensor: an input aliasing another would compile a
            # graph apart from ``passes``' (dynamo guards on aliasing)
            outputs = self._run(b, rows, slots.clone(), slots, mask)
            chunks.append([y[:, :m].clone() if self.replayed else y[:, :m] for y in outputs])
        if len(chunks) == 1:
            return tuple(chunks[0])
        return tuple(torch.cat(ys, dim=1) for ys in zip(*chunks))

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After a tree pass from ``start``: keep the new rows ``rows`` (increasing, row 0 first) at
        ``start, start + 1, ...`` -- their keys and values moved (only when the path is not the tree's
        first rows), the rest dropped by the length."""
        n = len(rows)
        if rows != list(range(n)):
            index = torch.tensor(rows, dtype=torch.long, device=self.columns.device) + start
            for k, v in zip(self.keys, self.values):
                k[:, :, start : start + n] = k.index_select(2, index)
                v[:, :, start : start + n] = v.index_select(2, index)
        self.length = start + n

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    @no_grad
    def warmup(self) -> float:
        """Compile every bucket now (dummy passes; one sequence: the cache is emptied after; several:
        every sequence idle, their contents left as they are). Returns the seconds
        spent and adds them to ``warmup_s``; a no-op (0) when not compiled."""
        if not self.compiled:
            return 0.0
        if self.rows > 1:  # every sequence idle: the rows go to scratch columns, the cache stays as it is
            idle = torch.zeros(self.rows, dtype=torch.long, device=self.columns.device)

            @inference_mode  # as the loop's passes run: inference tensors, the graphs' guards
            def dummy_rows_pass(b: int) -> None:
                self._rows_passes([x.expand(self.rows, *x.shape).clone() for x in self._dummy_rows(b)], idle, idle)

            return self._warm_buckets(dummy_rows_pass)

        def dummy_pass(b: int) -> None:
            self.length = 0
            self.passes(self._dummy_rows(b))

        spent = self._warm_buckets(dummy_pass)
        self.length = 0
        return spent

    def _warm_buckets(self, dummy_pass: Callable[[int], Any]) -> float:
        """Compile every bucket: ``dummy_pass(b)`` once per bucket (three times on CUDA, whose graph
        trees run a warm-up call, record on the second and replay from the third), feeding rows
        nobody reads (a cache of several sequences: every sequence idle). Returns the seconds
        spent, added to ``warmup_s``; a no-op (0) when not compiled."""
        if not self.compiled:
            return 0.0
        t0 = time.perf_counter()
        for b in self.buckets:
            if b > self.capacity:
                break
            for _ in range(3 if self.columns.device.type == "cuda" else 1):
                dummy_pass(b)
        spent = time.perf_counter() - t0
        self.warmup_s += spent
        return spent
