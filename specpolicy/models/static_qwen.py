"""A static-cache Qwen2 / Qwen3 forward for the compiled runtime (``runtime.compile=true``).

gpt-fast's recipe (static KV cache + ``torch.compile``; pytorch-labs/gpt-fast ``model.py``) on a
Hugging Face checkpoint: the same weights (the HF modules' parameters, shared; on CPU the target's
projections also packed once into fused copies, ``PACK_CPU``, the decoding step's products written
as reductions over weight rows, ``CPU_MATMUL``, and every pass compiled frozen, ``CPU_FREEZE``), one
preallocated key and value tensor per layer ``(1, kv_heads, capacity + pad, head_dim)``, RoPE from
the model's own rotary module, grouped-query attention with SDPA under an explicit boolean mask
built from the cache slots, so that

- rolling back is moving a length (``StaticQwen.length``), never copying or freeing;
- on CUDA every pass has one of a few shapes: ``n`` new positions are padded up to a bucket
  (``BUCKETS``: 1, 2, 4, ..., 64; more than the largest bucket runs in chunks), the padded rows
  write scratch slots no real row ever sees, so the real rows' outputs are those of the unpadded
  pass; on CPU, whose graphs take dynamic sizes, a pass runs at its exact width (``PAD_DYNAMIC``),
  in the same chunks;
- the passes are compiled once per process, when the model is built (``warmup``), with inductor's
  on-disk cache between processes: on CUDA one graph per bucket (``torch.compile(fullgraph=True,
  dynamic=False)``, replayed as CUDA graphs: ``CUDA_MODE``), attention over the whole cache; on CPU
  two graphs with dynamic sizes (the decoding step, and every other bucket), attention over a
  window of the cache (``WINDOW``) -- on CPU every graph costs tens of seconds to compile.

It returns what the Hugging Face model returns -- logits and ``output_hidden_states`` (index 0 the
embeddings, i the output of layer i - 1, the last the final norm's output) -- up to floating-point
reassociation (``tests/models/test_static_qwen.py``: float64 logits and hidden states to 1e-10, and
greedy tokens through the decoding loop).
EAGLE-3's greedy chain runs several drafting steps per compiled graph (``StaticEagle3.chain``,
``CHAIN_STEPS``), the argmax and the feedback inside the graph.
Trees: ``run`` takes a tree mask ``(n, length + n)`` (``specpolicy.core.tree``) and positions by depth.
"""

from __future__ import annotations

import copy
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specpolicy.core.sampling import choose

#: Padded widths of a pass (new positions): each compiles once; more positions run in chunks.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: Pad a pass to its bucket also where the compiled graph takes dynamic sizes (CPU) and where
#: nothing is compiled (read when a model is built). Off (the default), such a pass runs at its
#: exact width: the padding bought no graph there, only rows of arithmetic (measured here, the
#: bundled target at position 200: 9 rows 2.7 ms, padded to 16 3.2 ms). CUDA's static graphs
#: (one per bucket, replayed as CUDA graphs) always pad.
PAD_DYNAMIC = False
#: On CPU, attention reads the cache up to the next multiple of this many columns past the last
#: slot written, not the whole capacity (at batch 1 reading 1,088 columns of every layer cost
#: about as much as the weights); the compiled graph takes the window's size as a dynamic size.
WINDOW = 128
#: How the passes compile on CUDA (read when a model is built): ``"reduce-overhead"`` (inductor's
#: kernels replayed as CUDA graphs, gpt-fast's setting; the default), ``"default"`` (inductor's
#: kernels, launched one by one) or ``"cudagraphs"`` (the eager kernels captured as CUDA graphs by
#: dynamo's ``cudagraphs`` backend: no inductor, seconds to build). CPU ignores it.
CUDA_MODE = "reduce-overhead"
CUDA_MODES = ("reduce-overhead", "default", "cudagraphs")
#: On CPU, run the target's projections from packed copies of its weights (``StaticQwen._pack``:
#: q, k, v fused and gate, up fused; one more copy of the weights in memory) -- read when a model is built.
PACK_CPU = True
#: How the compiled CPU decoding step (one row) multiplies by the target's weights (read when a
#: model is built): ``"reduction"`` (the default) writes ``x @ W.T`` as a sum over each row of the
#: ``(out, in)`` weight, ``(x * W).sum(-1)``, which inductor compiles into its own vectorised,
#: threaded loops; ``"blas"`` hands ``x @ W`` to the BLAS (MKL) like the wider passes. Measured here
#: (2-core AMD EPYC, the bundled target, position 200): the step 1.3 ms against 3.1 ms -- MKL reads
#: these small matrices at about 24 GB/s, the reduction at over 100 GB/s (they sit in the L3 cache).
CPU_MATMUL = "reduction"
CPU_MATMULS = ("reduction", "blas")
#: Compile the CPU passes with inductor's freezing (read when a model is built): the weights become
#: constants of the graph, so the wider passes multiply with oneDNN on weights packed once at
#: compile time instead of MKL's small-matrix products (8 rows: 2.6-2.8 ms against 4.2-5.4 here).
CPU_FREEZE = True
#: Compile the CPU passes with inductor's C++ wrapper (read when a model is built): the code that
#: calls a graph's kernels and allocates its buffers is C++, not Python. Measured here (the bundled
#: target at position 200): verifying 8 positions 2.3 ms against 2.6 ms; interleaved in one process
#: (10 prompts x 256 tokens) every compiled row 8-14% faster (``eagle3+static-k9`` 1001 against 874
#: tokens/s, vanilla 567 against 525) for a few seconds more of compilation per graph.
CPU_CPP_WRAPPER = True
#: Greedy drafting steps of the EAGLE-3 head fused into one compiled graph each
#: (``StaticEagle3.chain``): a chain of ``m`` steps runs as the fewest of these, largest first.
CHAIN_STEPS = (1, 2, 4, 8)
#: Model types this forward reproduces (Qwen3 adds per-head q/k RMSNorm).
SUPPORTED = ("qwen2", "qwen3")


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
    """The buckets of a static cache of ``rows`` sequences (``StaticBatchQwen``, ``StaticBatchEagle3``,
    ``StaticBatchDFlash``):
    ``buckets`` (default ``BUCKETS``) without 1 -- a one-token pass is padded to 2 (its graph,
    static in every size, multiplied with MKL at about half the speed of the 2-token graph's
    oneDNN here: 5.3 against 3.3 ms, the target, 4 rows).

    Raises:
        ValueError: ``rows`` < 1.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return tuple(b for b in (BUCKETS if buckets is None else buckets) if b > 1) or (2,)


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
    ``weight`` (``CPU_MATMUL="reduction"``): ``(..., 1, out)``."""
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
    """A model's passes behind a static KV cache, batch 1: what every static model shares -- the
    per-layer key/value buffers, the length, the buckets, padding and chunking, the mask, and the
    compilation (one graph per bucket). A subclass sets up its model and ``_forward``.

    ``_forward(*row_inputs, positions, slots, mask)`` takes each per-row input at the pass's width
    ``B`` (first dimension: the bucket where passes pad, ``pads``, else the real rows), positions
    ``(B,)``, cache slots ``(B,)`` and ``mask`` ``(B, width) bool``;
    it writes the keys and values of its rows at ``slots`` and returns row-first outputs (first
    dimension ``B``).

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
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
        self.buckets = tuple(sorted(BUCKETS if buckets is None else buckets))
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
        self.window = WINDOW if device.type != "cuda" else self.width
        # pad each pass to its bucket only where a graph is static (CUDA); elsewhere exact widths
        self.pads = (compile and device.type == "cuda") or PAD_DYNAMIC
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
            # CUDA: one static graph per bucket, CUDA graphs (CUDA_MODE), attention over the whole
            # cache (cheap there). CPU: dynamic sizes -- one graph for the decoding step (1 row) and
            # one for the other buckets and every attention window -- fewer graphs to compile, less to read.
            cuda = device.type == "cuda"
            if cuda and CUDA_MODE not in CUDA_MODES:
                raise ValueError(f"static_qwen.CUDA_MODE={CUDA_MODE!r}; it must be one of {CUDA_MODES}")
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
            if cuda and CUDA_MODE == "cudagraphs":  # dynamo's graph, replayed as a CUDA graph, no inductor
                backend = "cudagraphs"
            elif cuda:
                options["triton.cudagraphs"] = CUDA_MODE == "reduce-overhead"
            else:
                options["cpp_wrapper"] = CPU_CPP_WRAPPER

            def compiled(function: Callable | None = None) -> Callable:
                function = function or type(self)._forward
                code = function.__code__.replace()
                fresh = types.FunctionType(code, function.__globals__, function.__name__)
                method = types.MethodType(fresh, self)
                fn = torch.compile(method, fullgraph=True, dynamic=dynamic, backend=backend, options=options)
                if cuda or not CPU_FREEZE:
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

    def layer_cache(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s key and value buffers, by their registered names: a compiled pass then sees
        module buffers (static addresses, which CUDA graphs keep in place), not list elements."""
        return getattr(self, f"k{i}"), getattr(self, f"v{i}")

    def _forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self) -> None:
        """Empty the cache (a new prompt): the length only."""
        self.length = 0

    @torch.inference_mode()
    def passes(
        self, rows: Sequence[torch.Tensor], positions: torch.Tensor | None = None, attend: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Feed ``n`` new positions after the cached ones (cache slots ``length .. length + n - 1``);
        the length grows by ``n``.

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
        """
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
            outputs = (self._pass_one if b == 1 else self._pass)(*inputs, pos, slots, mask)
            # a CUDA-graph pass reuses its output buffers: keep copies (a CPU graph's are fresh)
            chunks.append([y[:m].clone() if self.replayed else y[:m] for y in outputs])
        self.length = start + n
        if len(chunks) == 1:
            return tuple(chunks[0])
        return tuple(torch.cat(ys) for ys in zip(*chunks))

    def _rows_passes(
        self, inputs: Sequence[torch.Tensor], starts: torch.Tensor, counts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Feed row ``r`` of a cache of several sequences its new positions at columns (and
        positions) ``starts[r], starts[r] + 1, ...``, causally over its own columns, in chunks of at
        most the largest bucket, each at its width (``_width``: padded to a bucket on CUDA): what
        ``StaticBatchQwen.run_rows``, ``StaticBatchEagle3.run_rows`` and
        ``StaticBatchDFlash.context_rows`` share.

        Args:
            inputs: per-row inputs ``(rows, n, ...)``.
            starts: ``(rows,) int64`` each row's cached length.
            counts: ``(rows,) int64`` each row's real new positions (0: a row whose cache must stay
                as it is, e.g. a request that does not draft this step): the rest of its ``n``
                columns, and the bucket's padding, go to scratch columns past the capacity, which
                no real position sees. None: every row's ``n`` are real, and a bucket's padding is
                written past each row's new positions, where no real token looks.
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
            mask = self.columns[None, None, :window] <= slots[:, :, None]  # (rows, b, window)
            outputs = self._pass(*rows, slots, slots, mask)
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

    @torch.no_grad()
    def warmup(self) -> float:
        """Compile every bucket now (dummy passes; the cache is emptied after). Returns the seconds
        spent and adds them to ``warmup_s``; a no-op (0) when not compiled."""
        if not self.compiled:
            return 0.0

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


class StaticQwen(StaticPasses):
    """A Hugging Face Qwen2/Qwen3 causal LM behind a static KV cache, batch 1.

    Args:
        model: the HF model (``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``), eval mode; its modules are
            used as they are (weights shared).
        capacity: most cached positions (tokens), e.g. the verifier's ``max_context``.
        compile: compile each bucket's pass with ``torch.compile`` (else the same code runs eagerly:
            the static cache alone).
        buckets: pass widths (default: the module's ``BUCKETS`` when built): on CUDA each pass is
            padded to one; elsewhere they set the chunks (the largest) and the warm-up's passes.
    Raises:
        ValueError: a model type other than ``SUPPORTED`` or a capacity < 1.
    """

    #: Whether a pass can be one row (the decoding step), which ``CPU_MATMUL`` writes as reductions.
    one_row_passes = True

    def __init__(
        self, model: PreTrainedModel, capacity: int, compile: bool = False, buckets: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        config = model.config
        if config.model_type not in SUPPORTED:
            raise ValueError(
                f"the static runtime runs {', '.join(SUPPORTED)} models, got model_type={config.model_type!r}"
            )
        self.hf = model
        self.num_layers = int(config.num_hidden_layers)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.qk_norm = config.model_type == "qwen3"
        weight = model.get_output_embeddings().weight
        device, dtype = weight.device, weight.dtype
        cap = max(int(capacity), 1)
        with torch.no_grad():  # RoPE tables for every slot, from the model's own rotary module
            positions = torch.arange(cap + max(BUCKETS if buckets is None else buckets), device=device)[None]
            cos, sin = model.model.rotary_emb(torch.zeros((), dtype=dtype, device=device), positions)
        self.register_buffer("cos", cos[0].to(dtype), persistent=False)  # (width, head_dim)
        self.register_buffer("sin", sin[0].to(dtype), persistent=False)
        self.packed = device.type == "cpu" and PACK_CPU
        if CPU_MATMUL not in CPU_MATMULS:
            raise ValueError(f"static_qwen.CPU_MATMUL={CPU_MATMUL!r}; it must be one of {CPU_MATMULS}")
        # the reduction form only pays once compiled (eagerly it would materialise W-sized products)
        self.reduction = self.packed and compile and CPU_MATMUL == "reduction" and self.one_row_passes
        if self.packed:
            self._pack(model)
        self._setup(self.num_layers, self.kv_heads, self.head_dim, capacity, device, dtype, compile, buckets)

    @torch.no_grad()
    def _pack(self, model: PreTrainedModel) -> None:
        """CPU: each layer's projections as a few matrices -- q, k and v fused, gate and up fused --
        so that a pass is 4 matrix products a layer, each stored ``(in, out)`` (transposed: ``x @ W``
        reads it row after row, where ``nn.Linear``'s ``(out, in)`` costs MKL about 1.4x as long
        here). With ``CPU_MATMUL="reduction"`` each is also kept ``(out, in)`` (suffix ``_rows``)
        for the compiled one-row pass (``_linear``): one more copy of the fused q/k/v and gate/up
        weights (o, down and the LM head share the model's own)."""

        def packed(name: str, weight: torch.Tensor | None) -> None:
            """``weight`` is ``(out, in)`` (a bias: ``(out,)``)."""
            if weight is None or weight.dim() == 1:
                self.register_buffer(name, None if weight is None else weight.detach().contiguous(), persistent=False)
                return
            self.register_buffer(name, weight.detach().t().contiguous(), persistent=False)
            if self.reduction:
                self.register_buffer(f"{name}_rows", weight.detach().contiguous(), persistent=False)

        for i, layer in enumerate(model.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            projections = (att.q_proj, att.k_proj, att.v_proj)
            packed(f"qkv_w{i}", torch.cat([m.weight for m in projections]))
            biases = [m.bias for m in projections]
            packed(f"qkv_b{i}", torch.cat(biases) if all(b is not None for b in biases) else None)
            packed(f"o_w{i}", att.o_proj.weight)
            packed(f"o_b{i}", att.o_proj.bias)
            packed(f"gu_w{i}", torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            packed(f"down_w{i}", mlp.down_proj.weight)
        packed("head_w", model.get_output_embeddings().weight)

    def _linear(self, x: torch.Tensor, weight: str, bias: str | None = None) -> torch.Tensor:
        """A projection of ``x`` ``(..., in)`` by a packed weight (``_pack``), plus its bias: in the
        compiled one-row pass with ``CPU_MATMUL="reduction"``, ``(x * W).sum(-1)`` over the rows of
        the ``(out, in)`` copy; otherwise ``x @ W`` with the ``(in, out)`` copy."""
        if self.reduction and x[..., 0].numel() == 1:
            y = _row_product(x, getattr(self, f"{weight}_rows"))
        else:
            y = x @ getattr(self, weight)
        b = getattr(self, bias) if bias else None
        return y if b is None else y + b

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass (padded to a bucket on CUDA): ``input_ids`` ``(B,) int64`` at ``positions``
        ``(B,)`` (RoPE) written to cache
        ``slots`` ``(B,)``, row i attending to the columns ``mask[i]`` (``(B, width) bool``). Returns the
        logits ``(B, V)`` and every hidden state ``(B, L + 1, H)`` (HF's ``output_hidden_states``)."""
        hf = self.hf.model
        x = hf.embed_tokens(input_ids[None])  # (1, B, H)
        b = input_ids.shape[0]
        cos, sin = self.cos[positions][None, None], self.sin[positions][None, None]  # (1, 1, B, d)
        groups = self.heads // self.kv_heads
        # grouped-query attention without repeating the cache: a kv head's query heads become rows
        attn_mask = mask.repeat(groups, 1)[None, None] if groups > 1 else mask[None, None]
        states = [x[0]]
        for i, layer in enumerate(hf.layers):
            att = layer.self_attn
            h = _rms(x, layer.input_layernorm.weight, self.eps)
            if self.packed:
                q, k, v = self._linear(h, f"qkv_w{i}", f"qkv_b{i}").split(
                    [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
                )
            else:
                q, k, v = att.q_proj(h), att.k_proj(h), att.v_proj(h)
            q = q.reshape(1, b, self.heads, self.head_dim)
            k = k.reshape(1, b, self.kv_heads, self.head_dim)
            v = v.reshape(1, b, self.kv_heads, self.head_dim)
            if self.qk_norm:
                q = _rms(q, att.q_norm.weight, self.eps)
                k = _rms(k, att.k_norm.weight, self.eps)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache_k, cache_v = self.layer_cache(i)
            cache_k.index_copy_(2, slots, k)
            cache_v.index_copy_(2, slots, v)
            w = mask.shape[1]  # the window: columns up to the last slot written, rounded up
            if self.reduction and b == 1:  # the decoding step: plain operations inductor fuses
                o = _row_attention(q, cache_k[:, :, :w], cache_v[:, :, :w], mask)
            else:
                q = q.reshape(1, self.kv_heads, groups * b, self.head_dim)
                o = F.scaled_dot_product_attention(q, cache_k[:, :, :w], cache_v[:, :, :w], attn_mask=attn_mask)
            o = o.reshape(1, self.heads, b, self.head_dim).transpose(1, 2).reshape(1, b, self.heads * self.head_dim)
            h_attn = self._linear(o, f"o_w{i}", f"o_b{i}") if self.packed else att.o_proj(o)
            x = x + h_attn
            h = _rms(x, layer.post_attention_layernorm.weight, self.eps)
            if self.packed:
                gate, up = self._linear(h, f"gu_w{i}").chunk(2, -1)
                x = x + self._linear(layer.mlp.act_fn(gate) * up, f"down_w{i}")
            else:
                x = x + layer.mlp(h)
            states.append(x[0])
        x = _rms(x, hf.norm.weight, self.eps)
        states[-1] = x[0]
        logits = self._linear(x[0], "head_w") if self.packed else self.hf.lm_head(x[0])
        return logits, torch.stack(states, dim=1)

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        return [torch.zeros(b, dtype=torch.long, device=self.columns.device)]

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, attend: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``input_ids`` ``(n,) int64`` after the cached positions (``StaticPasses.passes``: positions,
        tree mask ``attend``). Returns ``(logits (n, V), hidden states (n, L + 1, H))`` in the model's dtype.

        Raises:
            ValueError: if the cache cannot hold ``n`` more positions or ``n`` < 1.
        """
        logits, states = self.passes([input_ids], positions, attend)
        return logits, states


class StaticBatchQwen(StaticQwen):
    """The target behind a static KV cache of ``rows`` sequences (the batched loop's compiled
    verifier, ``verifiers/hf_batch.py``): per layer one key and one value tensor
    ``(rows, kv_heads, capacity + pad, head_dim)``, row ``r`` one request's sequence in its own
    columns, so a round writes each row's new positions where they stay -- accepting is moving a
    length, never copying. A pass feeds ``n`` tokens to every row at once (rows without a request
    too: their writes land in their own row, which the next request overwrites); ``n`` is at least
    2 and, on CUDA, padded to a bucket, the padded columns written past each row's tokens, where
    no real token looks.

    Args:
        model / capacity / compile / buckets: as ``StaticQwen`` (capacity per row).
        rows: sequences the cache holds (the batch size), >= 1.
    Raises:
        ValueError: as ``StaticQwen``, or ``rows`` < 1.
    """

    one_row_passes = False  # every pass spans every sequence, padded to 2 or more columns

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int,
        rows: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
    ) -> None:
        self._rows = int(rows)
        super().__init__(model, capacity, compile, rows_buckets(rows, buckets))

    def _setup(self, *args, **kwargs) -> None:
        super()._setup(*args, **kwargs, rows=self._rows)

    @torch.inference_mode()
    def run_rows(
        self, input_ids: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed row ``r`` the tokens ``input_ids[r]`` at positions (and cache columns)
        ``starts[r], starts[r] + 1, ...``, causally over the row's own columns.

        Args:
            input_ids: ``(rows, n) int64``.
            starts: ``(rows,) int64``: each row's cached length (its first new column).
            counts: ``(rows,) int64`` each row's real new positions, the rest to scratch columns
                (``StaticPasses._rows_passes``); None: all ``n``.
        Returns:
            ``(logits (rows, n, V), hidden states (rows, n, L + 1, H))``, HF's order of hidden states.
        Raises:
            ValueError: if a row's real new positions pass the capacity.
        """
        logits, states = self._rows_passes([input_ids], starts, counts)
        return logits, states

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass (padded to a bucket on CUDA): ``input_ids`` ``(R, B)`` at ``positions``
        ``(R, B)`` written to columns
        ``slots`` ``(R, B)`` of their rows, ``mask`` ``(R, B, width) bool``. Returns the logits
        ``(R, B, V)`` and every hidden state ``(R, B, L + 1, H)``: ``StaticQwen._forward`` per row.
        Its layers repeat ``StaticQwen._forward``'s with a sequence axis: one shared body with the
        cache write and attention passed in measured 0.1-0.35 ms slower per batch-1 decoding step
        here (two alternations), so the measured batch-1 pass stays as it is."""
        hf = self.hf.model
        r, b = input_ids.shape
        x = hf.embed_tokens(input_ids)  # (R, B, H)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (R, 1, B, d)
        groups = self.heads // self.kv_heads
        attn_mask = (mask.repeat(1, groups, 1) if groups > 1 else mask)[:, None]  # a kv head's query heads as rows
        row_index = torch.arange(r, device=slots.device)[:, None]  # (R, 1), with slots (R, B): each new entry's place
        states = [x]
        for i, layer in enumerate(hf.layers):
            att = layer.self_attn
            h = _rms(x, layer.input_layernorm.weight, self.eps)
            if self.packed:
                q, k, v = self._linear(h, f"qkv_w{i}", f"qkv_b{i}").split(
                    [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
                )
            else:
                q, k, v = att.q_proj(h), att.k_proj(h), att.v_proj(h)
            q = q.reshape(r, b, self.heads, self.head_dim)
            k = k.reshape(r, b, self.kv_heads, self.head_dim)
            v = v.reshape(r, b, self.kv_heads, self.head_dim)
            if self.qk_norm:
                q = _rms(q, att.q_norm.weight, self.eps)
                k = _rms(k, att.k_norm.weight, self.eps)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache_k, cache_v = self.layer_cache(i)
            cache_k[row_index, :, slots] = k.transpose(1, 2)  # in place (index_put_): the cache is never copied
            cache_v[row_index, :, slots] = v.transpose(1, 2)
            w = mask.shape[-1]
            q = q.reshape(r, self.kv_heads, groups * b, self.head_dim)
            # plain operations, which inductor fuses (SDPA's CPU kernel cost 65-125 us a call here)
            scores = (q @ cache_k[:, :, :w].transpose(-1, -2)) * self.head_dim**-0.5
            scores = scores.masked_fill(~attn_mask, float("-inf"))
            o = torch.softmax(scores, -1) @ cache_v[:, :, :w]
            o = o.reshape(r, self.heads, b, self.head_dim).transpose(1, 2).reshape(r, b, self.heads * self.head_dim)
            x = x + (self._linear(o, f"o_w{i}", f"o_b{i}") if self.packed else att.o_proj(o))
            h = _rms(x, layer.post_attention_layernorm.weight, self.eps)
            if self.packed:
                gate, up = self._linear(h, f"gu_w{i}").chunk(2, -1)
                x = x + self._linear(layer.mlp.act_fn(gate) * up, f"down_w{i}")
            else:
                x = x + layer.mlp(h)
            states.append(x)
        x = _rms(x, hf.norm.weight, self.eps)
        states[-1] = x
        logits = self._linear(x, "head_w") if self.packed else self.hf.lm_head(x)
        return logits, torch.stack(states, dim=2)

    @torch.no_grad()
    def warmup(self) -> float:
        """Compile every bucket now (dummy passes over every row; the cache's contents are left as
        they fall, no row being in use). Returns the seconds spent, added to ``warmup_s``."""
        device = self.columns.device
        zeros = torch.zeros(self._rows, dtype=torch.long, device=device)
        return self._warm_buckets(
            lambda b: self.run_rows(torch.zeros((self._rows, b), dtype=torch.long, device=device), zeros)
        )


class StaticEagle3(StaticPasses):
    """The EAGLE-3 head (``specpolicy.models.eagle3.Eagle3DraftModel``) behind a static KV cache,
    batch 1: one pass over ``n`` positions -- the target's embeddings of their tokens and their
    features (``fc`` of the target's, or the head's fed-back outputs) -- returns the head's outputs
    and its draft-vocabulary logits, exactly as ``Eagle3DraftModel.forward`` then ``logits``.

    Args:
        model: the head, eval mode. embed_tokens: the target's input embeddings.
        capacity / compile / buckets: as ``StaticQwen``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        embed_tokens: torch.nn.Module,
        capacity: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.head, self.embed_tokens = model, embed_tokens
        att = model.midlayer.self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        weight = model.lm_head.weight
        self.hidden_size = int(model.fc.weight.shape[0])
        # compiled on CPU: the one-row pass as reductions and plain attention (CPU_MATMUL)
        self.reduction = bool(compile) and weight.device.type == "cpu" and CPU_MATMUL == "reduction"
        self._setup(1, self.kv_heads, self.head_dim, capacity, weight.device, weight.dtype, compile, buckets)
        self.chain_steps = tuple(sorted(CHAIN_STEPS, reverse=True))
        # one graph per chunk size (a code object each: a chunk's graph never meets another size)
        chain = type(self)._chain_forward
        self._chains = {m: self._compiled_copy(chain) if compile else self._chain_forward for m in self.chain_steps}

    @torch.inference_mode()
    def chain(self, token_ids: torch.Tensor, hidden: torch.Tensor, steps: int) -> tuple[torch.Tensor, ...]:
        """Draft ``steps`` tokens greedily, each step fed the token drafted and the output of the
        step before (EAGLE-3's chain drafting, arXiv 2503.01840), in chunks of ``CHAIN_STEPS`` steps
        that each run as one compiled graph: the argmax, its confidence and the draft-to-target id
        map are computed in the graph, so no step goes back to Python. The same tokens as ``steps``
        one-row ``passes`` with ``specpolicy.core.sampling.choose`` (greedy); the length grows by ``steps``.

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
                outputs = self._chains[m](token_ids, hidden, slots, mask)
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
        """``m`` greedy steps (``m`` = ``slots``' length, positions = slots, ``mask`` ``(m, window)``):
        ``_forward`` on one row, then ``choose``'s greedy rule on its logits."""
        tokens, confidences, logits = [], [], []
        for j in range(slots.shape[0]):
            hidden, step_logits = self._forward(token_ids, hidden, slots[j : j + 1], slots[j : j + 1], mask[j : j + 1])
            draft_ids, confidence, _ = choose(step_logits, None, None)
            confidences.append(confidence)
            token_ids = self.head.to_target_ids(draft_ids)
            tokens.append(token_ids)
            logits.append(step_logits)
        return torch.cat(tokens), torch.cat(confidences), hidden, torch.cat(logits)

    @torch.no_grad()
    def warmup(self) -> float:
        """``StaticPasses.warmup``, then every chain chunk (``CHAIN_STEPS``) compiled."""
        spent = super().warmup()
        if not self.compiled:
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
        """One pass (padded to a bucket on CUDA): tokens ``(B,)``, features ``(B, H)``; returns
        outputs ``(B, H)`` and logits ``(B, Vd)``."""
        head = self.head
        embeds, hidden = self.embed_tokens(token_ids)[None], hidden[None]
        cos, sin = head.rotary_emb(embeds, positions[None])
        if self.reduction and token_ids.shape[0] == 1:  # the drafting step, as ``Eagle3DraftModel.forward``
            return self._one_row(embeds, hidden, cos, sin, slots, mask)
        q, k, v = head.midlayer.self_attn.qkv(head.midlayer.attention_input(embeds, hidden), cos, sin)
        cache_k, cache_v = self.layer_cache(0)
        cache_k.index_copy_(2, slots, k)
        cache_v.index_copy_(2, slots, v)
        w = mask.shape[1]  # the window: columns up to the last slot written, rounded up
        attended = F.scaled_dot_product_attention(
            q,
            cache_k[:, :, :w],
            cache_v[:, :, :w],
            attn_mask=mask[None, None],
            enable_gqa=self.kv_heads != self.heads,
        )
        out = head.midlayer.finish(hidden, attended)[0]
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
        """The one-row pass with every product a reduction over weight rows (``_row_linear``) and
        plain attention (``_row_attention``): what ``qkv``, SDPA, ``finish`` and ``logits`` compute."""
        mid = self.head.midlayer
        att, mlp = mid.self_attn, mid.mlp
        x = mid.attention_input(embeds, hidden)  # (1, 1, 2H)
        q = _row_linear(att.q_proj, x).view(1, 1, att.num_heads, att.head_dim).transpose(1, 2)
        k = _row_linear(att.k_proj, x).view(1, 1, att.num_kv_heads, att.head_dim).transpose(1, 2)
        v = _row_linear(att.v_proj, x).view(1, 1, att.num_kv_heads, att.head_dim).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
        cache_k, cache_v = self.layer_cache(0)
        cache_k.index_copy_(2, slots, k)
        cache_v.index_copy_(2, slots, v)
        w = mask.shape[1]
        attended = _row_attention(q, cache_k[:, :, :w], cache_v[:, :, :w], mask)
        out = hidden + _row_linear(att.o_proj, attended.transpose(1, 2).reshape(1, 1, -1))
        h = mid.post_attention_layernorm(out)
        out = out + _row_linear(mlp.down_proj, mlp.act_fn(_row_linear(mlp.gate_proj, h)) * _row_linear(mlp.up_proj, h))
        return out[0], _row_linear(self.head.lm_head, self.head.norm(out))[0]

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        device, dtype = self.columns.device, self.keys[0].dtype
        return [
            torch.zeros(b, dtype=torch.long, device=device),
            torch.zeros((b, self.hidden_size), dtype=dtype, device=device),
        ]


class SharedSequences:
    """A static cache of several sequences (``StaticBatchQwen``, ``StaticBatchEagle3``,
    ``StaticBatchDFlash``) shared by
    the requests of a batched run (``Drafter.batched``): each request holds one sequence from its
    prefill to its release; the sequences' lengths live here.

    Args:
        static: the static model of ``rows`` sequences.
    """

    def __init__(self, static: StaticPasses) -> None:
        self.static = static
        self.lengths = [0] * int(static.keys[0].shape[0])
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


class SharedSequencesDrafter:
    """The batched loop's side of a drafter with a static cache (``Drafter.batched`` / ``release``),
    one place for the AR, EAGLE-3 and DFlash drafters: ``batched(slots)`` builds the drafter's static cache
    of ``slots`` sequences once per batch size (``_batched_static``, compiled as the batch-1 one,
    its compile seconds added to ``runtime.warmup_s``) and returns a copy whose own copies -- one per
    request, greedy or sampling -- each take a sequence in ``prefill`` (``_take_sequence``) and
    give it back in ``release``. A drafter sets ``static``, ``runtime`` and calls
    ``_no_shared_sequences`` in its ``__init__``.
    """

    static: StaticPasses | None
    runtime: Any

    def _no_shared_sequences(self) -> None:
        self._static_batched: dict[int, StaticPasses] = {}  # by batch size, built once each
        self._shared: SharedSequences | None = None  # a batched run's sequences (``batched``), else None
        self._slot: int | None = None  # this request's sequence among them, while it holds one

    def _batched_static(self, slots: int) -> StaticPasses:  # pragma: no cover - abstract
        raise NotImplementedError

    def batched(self, slots: int):
        """On the compiled runtime, the drafter whose copies draft on a static cache of ``slots``
        sequences, one each from ``prefill`` to ``release``; else this drafter."""
        if self.static is None:
            return self
        batch = self._static_batched.get(slots)
        if batch is None:
            batch = self._batched_static(slots)
            self.runtime.warmup_s += batch.warmup()
            self._static_batched[slots] = batch
        lead = copy.copy(self)  # without the batch-1 static cache (Drafter.__copy__)
        lead._shared, lead._slot = SharedSequences(batch), None
        return lead

    def release(self) -> None:
        """The batched loop is done with this request: its sequence of the shared cache is free."""
        if self._slot is not None and self._shared is not None:
            self._shared.give_back(self._slot)
        self._slot = None

    def _take_sequence(self) -> bool:
        """``prefill``'s: give back a sequence still held, then take one for a request of a batched
        run. Returns whether this request drafts on the shared sequences."""
        self.release()
        if self._shared is None:
            return False
        self._slot = self._shared.take()
        return True


class StaticBatchEagle3(StaticPasses):
    """The EAGLE-3 head behind a static KV cache of ``rows`` sequences, one per request in flight
    (the batched loop's compiled drafting, ``drafters/eagle3.py``): per request a sequence of its
    own columns, written where they stay, so a round's roll-back moves its length. A pass feeds
    every sequence at once (``run_rows``): a request that drafts this step its new positions at
    its length, the rest (other requests, padding) at scratch columns no real position sees. Passes
    are 2 columns or more (on CUDA padded to a bucket), as ``StaticBatchQwen``'s. Greedy and
    sampling requests alike (the drafter chooses from the logits).

    Args:
        model / embed_tokens / capacity / compile / buckets: as ``StaticEagle3`` (capacity per sequence).
        rows: sequences the cache holds (the batch size), >= 1.
    Raises:
        ValueError: ``rows`` < 1 or a capacity < 1.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        embed_tokens: torch.nn.Module,
        capacity: int,
        rows: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
    ) -> None:
        buckets = rows_buckets(rows, buckets)
        super().__init__()
        self.head, self.embed_tokens = model, embed_tokens
        att = model.midlayer.self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        self.hidden_size = int(model.fc.weight.shape[0])
        weight = model.lm_head.weight
        self._setup(1, self.kv_heads, self.head_dim, capacity, weight.device, weight.dtype, compile, buckets, rows=rows)

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

    def _forward(
        self,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over every sequence (padded to a bucket on CUDA): tokens ``(R, B)``, features ``(R, B, H)`` at
        ``positions`` ``(R, B)``, written to columns ``slots`` ``(R, B)``, ``mask`` ``(R, B, width)``:
        ``StaticEagle3._forward``'s pass with a sequence axis. Returns outputs ``(R, B, H)`` and
        logits ``(R, B, Vd)``."""
        head = self.head
        embeds = self.embed_tokens(token_ids)  # (R, B, H)
        cos, sin = head.rotary_emb(embeds, positions)
        q, k, v = head.midlayer.self_attn.qkv(head.midlayer.attention_input(embeds, hidden), cos, sin)
        cache_k, cache_v = self.layer_cache(0)
        row_index = torch.arange(token_ids.shape[0], device=slots.device)[:, None]  # (R, 1)
        cache_k[row_index, :, slots] = k.transpose(1, 2)  # in place (index_put_)
        cache_v[row_index, :, slots] = v.transpose(1, 2)
        w = mask.shape[-1]
        attended = F.scaled_dot_product_attention(
            q, cache_k[:, :, :w], cache_v[:, :, :w], attn_mask=mask[:, None], enable_gqa=self.kv_heads != self.heads
        )
        out = head.midlayer.finish(hidden, attended)
        return out, head.logits(out)

    @torch.no_grad()
    def warmup(self) -> float:
        """Compile every bucket now (dummy passes, every sequence idle: the cache's contents stay
        as they are). Returns the seconds spent, added to ``warmup_s``."""
        device, dtype, rows = self.columns.device, self.keys[0].dtype, self.keys[0].shape[0]
        zeros = torch.zeros(rows, dtype=torch.long, device=device)
        return self._warm_buckets(
            lambda b: self.run_rows(
                torch.zeros((rows, b), dtype=torch.long, device=device),
                torch.zeros((rows, b, self.hidden_size), dtype=dtype, device=device),
                zeros,
                zeros,
            )
        )


class StaticDFlash(StaticPasses):
    """The DFlash drafter (``specpolicy.models.dflash.DFlashDraftModel``) behind a static KV cache of
    its context, batch 1. A pass (``block``) feeds the newly committed positions' target features
    (their keys and values only: ``fc``, ``hidden_norm``, each layer's k/v projections, as
    ``context_keys_values``) followed by the block, the block attending to the whole context and to
    itself (bidirectional), as ``DFlashDraftModel.forward`` over the cached context. Only the context
    stays cached: the block's keys and values sit in slots past the length, overwritten by the next
    pass. Buckets: ``BUCKETS`` and 128 (a block with up to 112 drafted tokens given).

    Args:
        model: the DFlash model, eval mode. capacity / compile / buckets: as ``StaticQwen``.
    """

    def __init__(
        self, model: torch.nn.Module, capacity: int, compile: bool = False, buckets: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        self.dflash = model
        att = model.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        weight = model.fc.weight
        self.features, self.hidden_size = int(weight.shape[1]), int(weight.shape[0])
        buckets = tuple(sorted(set(BUCKETS if buckets is None else buckets) | {128}))
        self._setup(
            len(model.layers), self.kv_heads, self.head_dim, capacity, weight.device, weight.dtype, compile, buckets
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
        """One pass (padded to a bucket on CUDA): block embeddings ``(B, H)`` (zeros on context rows), context features
        ``(B, F)`` (zeros on block rows), ``is_context`` ``(B,) bool``; returns ``(B, H)`` after the
        final norm (meaningful on the block rows)."""
        m = self.dflash
        ctx = m.hidden_norm(m.fc(context))[None]  # (1, B, H)
        x = block[None]
        cos, sin = m.rope(x, positions[None])
        w = mask.shape[1]
        attn_mask = mask[None, None]
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            k, v = a.keys_values(torch.where(is_context[None, :, None], ctx, h), cos, sin)
            cache_k, cache_v = self.layer_cache(i)
            cache_k.index_copy_(2, slots, k)
            cache_v.index_copy_(2, slots, v)
            b = h.shape[1]
            q = a.q_norm(a.q_proj(h).view(1, b, a.num_heads, a.head_dim)).transpose(1, 2)
            q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
            out = F.scaled_dot_product_attention(
                q,
                cache_k[:, :, :w],
                cache_v[:, :, :w],
                attn_mask=attn_mask,
                enable_gqa=a.num_kv_heads != a.num_heads,
            )
            x = x + a.o_proj(out.transpose(1, 2).reshape(1, b, a.num_heads * a.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return (m.norm(x)[0],)

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        device, dtype = self.columns.device, self.keys[0].dtype
        return [
            torch.zeros((b, self.hidden_size), dtype=dtype, device=device),
            torch.zeros((b, self.features), dtype=dtype, device=device),
            torch.zeros(b, dtype=torch.bool, device=device),
        ]

    @torch.inference_mode()
    def block(self, block_embeds: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        """One drafting pass: the newly committed positions' ``features`` ``(u, F)`` (or None) join the
        cached context, then the block ``block_embeds`` ``(q, H)`` attends to the whole context and
        to itself. Returns the block's outputs ``(q, H)`` after the final norm; the length grows by u.

        Raises:
            ValueError: a block longer than the largest bucket, or a context past the capacity.
        """
        q, u = int(block_embeds.shape[0]), 0 if features is None else int(features.shape[0])
        if q > self.buckets[-1]:
            raise ValueError(f"a DFlash block of {q} positions exceeds the largest bucket {self.buckets[-1]}")
        dtype, device = self.keys[0].dtype, block_embeds.device
        if u and u + q > self.buckets[-1]:  # the context alone first (its keys and values need no block)
            self.passes(
                [features.new_zeros((u, self.hidden_size)), features, torch.ones(u, dtype=torch.bool, device=device)]
            )
            u, features = 0, None
        start = self.length
        n = u + q
        attend = torch.ones((n, start + n), dtype=torch.bool, device=device)  # context rows: causal
        attend[:u, start:] = torch.ones((u, n), dtype=torch.bool, device=device).tril()
        rows_block = torch.cat([block_embeds.new_zeros((u, self.hidden_size)), block_embeds.to(dtype)])
        rows_ctx = block_embeds.new_zeros((n, self.features))
        if u:
            rows_ctx[:u] = features
        is_context = torch.arange(n, device=device) < u
        (out,) = self.passes([rows_block, rows_ctx, is_context], attend=attend)
        self.length = start + u  # the block's keys and values are not kept
        return out[u:]


class StaticBatchDFlash(StaticPasses):
    """The DFlash drafter behind a static KV cache of its context for ``rows`` sequences, one per
    request in flight (the batched loop's compiled drafting, ``drafters/dflash.py``): per request a
    sequence of its own columns holding its committed positions' keys and values, so a pass writes
    them where they stay. A pass (``run_rows``) feeds every sequence at once: a request that drafts
    this step its newly committed positions' features (context rows, causal) and then its block
    (attending to its whole context and to the block itself, bidirectional), at its length; the
    other sequences, and the padding, at scratch columns past the capacity, which no real position
    sees. As ``StaticDFlash``, only the context stays: the block's keys and values sit past the
    length, overwritten by the next pass. Passes are 2 columns or more (on CUDA padded to a bucket:
    ``BUCKETS`` and 128). Greedy and sampling requests alike (the drafter chooses from the logits).

    Args:
        model: the DFlash model, eval mode. capacity / compile / buckets: as ``StaticDFlash``
            (capacity per sequence).
        rows: sequences the cache holds (the batch size), >= 1.
    Raises:
        ValueError: ``rows`` < 1 or a capacity < 1.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        capacity: int,
        rows: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
    ) -> None:
        buckets = rows_buckets(rows, tuple(sorted(set(BUCKETS if buckets is None else buckets) | {128})))
        super().__init__()
        self.dflash = model
        att = model.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = att.num_heads, att.num_kv_heads, att.head_dim
        weight = model.fc.weight
        self.features, self.hidden_size = int(weight.shape[1]), int(weight.shape[0])
        self._setup(
            len(model.layers),
            self.kv_heads,
            self.head_dim,
            capacity,
            weight.device,
            weight.dtype,
            compile,
            buckets,
            rows,
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
        ``positions`` ``(R, B)``, written to columns ``slots`` ``(R, B)``, ``mask`` ``(R, B, width)``:
        ``StaticDFlash._forward``'s pass with a sequence axis. Returns ``(R, B, H)`` after the final
        norm (meaningful on the block rows)."""
        m = self.dflash
        ctx = m.hidden_norm(m.fc(context))  # (R, B, H)
        x = block
        cos, sin = m.rope(x, positions)  # (R, B, d)
        w = mask.shape[-1]
        attn_mask = mask[:, None]  # (R, 1, B, w)
        row_index = torch.arange(block.shape[0], device=slots.device)[:, None]  # (R, 1)
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            k, v = a.keys_values(torch.where(is_context[:, :, None], ctx, h), cos, sin)  # (R, kv, B, d)
            cache_k, cache_v = self.layer_cache(i)
            cache_k[row_index, :, slots] = k.transpose(1, 2)  # in place (index_put_)
            cache_v[row_index, :, slots] = v.transpose(1, 2)
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

    @torch.inference_mode()
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
        (out,) = self._pass(block, context, is_context, slots, slots, mask)
        return out[:, :n].clone() if self.replayed else out[:, :n]

    @torch.inference_mode()
    def context_rows(self, context: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor) -> None:
        """Write sequence ``r``'s ``counts[r]`` newly committed positions (``context`` ``(rows, n, F)``)
        at its columns from ``starts[r]``, with no block (a new request's prompt, longer than a
        pass: ``StaticPasses._rows_passes``, in chunks); the lengths are the caller's."""
        zeros = context.new_zeros((*context.shape[:2], self.hidden_size))
        ones = torch.ones(context.shape[:2], dtype=torch.bool, device=context.device)
        self._rows_passes([zeros, context, ones], starts, counts)

    @torch.no_grad()
    def warmup(self) -> float:
        """Compile every bucket now (dummy passes, every sequence idle: the cache's contents stay as
        they are). Returns the seconds spent, added to ``warmup_s``."""
        device, dtype, rows = self.columns.device, self.keys[0].dtype, self.keys[0].shape[0]
        zeros = torch.zeros(rows, dtype=torch.long, device=device)
        return self._warm_buckets(
            lambda b: self.run_rows(
                torch.zeros((rows, b, self.hidden_size), dtype=dtype, device=device),
                torch.zeros((rows, b, self.features), dtype=dtype, device=device),
                zeros,
                zeros,
                zeros,
            )
        )
