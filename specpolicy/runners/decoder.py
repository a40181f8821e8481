"""A static-cache decoder-only causal LM (``StaticDecoder``): the compiled runtime's target and AR drafter.

The Llama (3.x), Mistral, Qwen2/Qwen2.5 and Qwen3 families share one forward -- pre-norm RMSNorm
layers, grouped-query attention with rotary positions, a gated SiLU MLP -- and differ in what this
forward reads from the model: q/k/v biases (Qwen2; Llama's ``attention_bias``), per-head q/k
RMSNorm (Qwen3), ``head_dim`` apart from ``hidden_size / heads``, tied embeddings, and the RoPE
variant (``rope_scaling`` / ``rope_parameters``). RoPE comes from the model's own rotary module,
whose inverse frequencies and attention scaling transformers computes with
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``: the static table of cos/sin for every
cache slot equals what the module gives at each position for the types whose frequencies do not
depend on the sequence's length (``STATIC_ROPE_TYPES``); ``dynamic`` and ``longrope`` recompute
them as a sequence grows and are refused, and so is a sliding window narrower than the cache
(Mistral-7B-v0.1's 4,096 tokens: the static forward attends over every cached position).

It returns what the Hugging Face model returns -- logits and ``output_hidden_states`` (index 0 the
embeddings, i the output of layer i - 1, the last the final norm's output) -- up to floating-point
reassociation (``tests/models/test_static_qwen.py``, ``tests/models/test_families.py``: float64
logits and hidden states to 1e-10, and greedy tokens through the decoding loop). One forward over
``R`` sequences: the batch-1 loop's cache is the batched loop's at ``R`` = 1. Trees: ``run`` takes
a tree mask ``(n, length + n)`` (``specpolicy.core.tree``) and positions by depth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specpolicy.core.runtime import CompileSettings, inference_mode, no_grad
from specpolicy.runners.static import StaticPasses, _rms, _rotate_half, _row_attention, _row_product

#: Model types this forward reproduces (Qwen3 adds per-head q/k RMSNorm, Qwen2 q/k/v biases).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
#: RoPE types (``rope_type`` of ``rope_scaling`` / ``rope_parameters``) whose inverse frequencies
#: and attention scaling are fixed by the config (``ROPE_INIT_FUNCTIONS`` once): a static table
#: reproduces them. ``dynamic`` (NTK) and ``longrope`` change with the sequence's length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope_types(config: Mapping[str, Any]) -> list[str]:
    """The RoPE types a ``config.json`` dict names (transformers 5's ``rope_parameters``, or the
    ``rope_scaling`` of older files: ``rope_type`` or its old spelling ``type``; none: default)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        return ["default"]
    nested = [v for v in params.values() if isinstance(v, Mapping)]  # per layer type
    return [str(p.get("rope_type", p.get("type", "default"))) for p in (nested or [params])]


def sliding_window_of(config: Mapping[str, Any]) -> int | None:
    """The sliding attention window (tokens) a ``config.json`` dict gives some layer, or None when
    every layer attends over the whole sequence: Mistral's ``sliding_window`` (null in v0.3), and
    Qwen2/Qwen3's only with ``use_sliding_window``; transformers 5's ``layer_types`` decide when given."""
    window = config.get("sliding_window")
    if not window:
        return None
    layer_types = config.get("layer_types")
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    if str(config.get("model_type")) in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        return None
    return int(window)


def unsupported(config: Mapping[str, Any], capacity: int | None = None) -> str | None:
    """What keeps the static forward from reproducing a model of ``config`` (its ``config.json``
    dict) at ``capacity`` cached tokens, as the end of a sentence ("... is model_type 'gpt2', ..."),
    or None when it runs it: a model type outside ``SUPPORTED``, a RoPE type outside
    ``STATIC_ROPE_TYPES``, or a sliding window narrower than ``capacity``."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        return f"is model_type {model_type!r} (the compiled runtime runs {', '.join(SUPPORTED)})"
    for rope in _rope_types(config):
        if rope not in STATIC_ROPE_TYPES:
            return (
                f"has rope_scaling type {rope!r}, whose frequencies change with the sequence's length "
                f"(the compiled runtime reproduces {', '.join(STATIC_ROPE_TYPES)})"
            )
    window = sliding_window_of(config)
    if window is not None and capacity is not None and capacity > window:
        return (
            f"attends over a sliding window of {window} tokens, which the static forward does not implement, "
            f"and the context is {capacity} tokens (set verifier.max_context <= {window})"
        )
    return None


class StaticDecoder(StaticPasses):
    """A Hugging Face Llama / Mistral / Qwen2 / Qwen3 causal LM behind a static KV cache of ``rows`` sequences: per layer
    one key and one value tensor ``(rows, kv_heads, capacity + pad, head_dim)``, row ``r`` one
    request's sequence in its own columns, so a round writes each row's new positions where they
    stay -- accepting is moving a length, never copying. One sequence (the batch-1 loop): ``run``
    after the cached ``length``; several (the batched loop, ``verifiers/hf_batch.py``):
    ``run_rows``, every sequence at once (a row without a request too: its writes land in its own
    row, which the next request overwrites), 2 columns or more (``rows_buckets``).

    Args:
        model: the HF model (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
            ``Qwen3ForCausalLM``), eval mode; its modules are used as they are (weights shared).
        capacity: most cached positions (tokens) per sequence, e.g. the verifier's ``max_context``.
        compile: compile each bucket's pass with ``torch.compile`` (else the same code runs eagerly:
            the static cache alone).
        buckets: pass widths (default: ``settings.buckets``): on CUDA each pass is padded to one;
            elsewhere they set the chunks (the largest) and the warm-up's passes.
        rows: sequences the cache holds (the batch size), >= 1.
        settings: the ``runtime.*`` compile settings (default: ``CompileSettings()``).
    Raises:
        ValueError: a model the static forward does not reproduce (``unsupported``: a model type
            other than ``SUPPORTED``, a RoPE type other than ``STATIC_ROPE_TYPES``, a sliding window
            narrower than ``capacity``), ``rows`` < 1 or a capacity < 1.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int,
        compile: bool = False,
        buckets: Sequence[int] | None = None,
        rows: int = 1,
        settings: CompileSettings | None = None,
    ) -> None:
        super().__init__()
        config = model.config
        why = unsupported(config.to_dict(), int(capacity))
        if why is not None:
            raise ValueError(f"the static runtime cannot run this model: it {why}")
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        settings = settings or CompileSettings()
        self.hf = model
        self.num_layers = int(config.num_hidden_layers)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.qk_norm = hasattr(model.model.layers[0].self_attn, "q_norm")  # Qwen3
        weight = model.get_output_embeddings().weight
        device, dtype = weight.device, weight.dtype
        cap = max(int(capacity), 1)
        widest = max(settings.buckets if buckets is None else buckets)
        with torch.no_grad():  # RoPE tables for every slot, from the model's own rotary module
            positions = torch.arange(cap + widest, device=device)[None]
            cos, sin = model.model.rotary_emb(torch.zeros((), dtype=dtype, device=device), positions)
        self.register_buffer("cos", cos[0].to(dtype), persistent=False)  # (width, head_dim)
        self.register_buffer("sin", sin[0].to(dtype), persistent=False)
        self.packed = device.type == "cpu" and settings.cpu_pack
        # the reduction form only pays once compiled (eagerly it would materialise W-sized products),
        # and only a cache of one sequence runs one-row passes (several pad to 2 columns)
        self.reduction = self.packed and compile and settings.cpu_matmul == "reduction" and rows == 1
        if self.packed:
            self._pack(model)
        self._setup(
            self.num_layers, self.kv_heads, self.head_dim, capacity, device, dtype, compile, buckets, rows, settings
        )

    @no_grad
    def _pack(self, model: PreTrainedModel) -> None:
        """CPU: each layer's projections as a few matrices -- q, k and v fused, gate and up fused --
        so that a pass is 4 matrix products a layer, each stored ``(in, out)`` (transposed: ``x @ W``
        reads it row after row, where ``nn.Linear``'s ``(out, in)`` costs MKL about 1.4x as long
        here). With ``runtime.cpu_matmul=reduction`` each is also kept ``(out, in)`` (suffix
        ``_rows``) for the compiled one-row pass (``_linear``): one more copy of the fused q/k/v and
        gate/up weights (o, down and the LM head share the model's own)."""

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
            mlp_biases = [mlp.gate_proj.bias, mlp.up_proj.bias]  # Llama's mlp_bias
            packed(f"gu_b{i}", torch.cat(mlp_biases) if all(b is not None for b in mlp_biases) else None)
            packed(f"down_w{i}", mlp.down_proj.weight)
            packed(f"down_b{i}", mlp.down_proj.bias)
        packed("head_w", model.get_output_embeddings().weight)

    def _linear(self, x: torch.Tensor, weight: str, bias: str | None = None) -> torch.Tensor:
        """A projection of ``x`` ``(..., in)`` by a packed weight (``_pack``), plus its bias: in the
        compiled one-row pass with ``runtime.cpu_matmul=reduction``, ``(x * W).sum(-1)`` over the
        rows of the ``(out, in)`` copy; otherwise ``x @ W`` with the ``(in, out)`` copy."""
        if self.reduction and x[..., 0].numel() == 1:
            y = _row_product(x, getattr(self, f"{weight}_rows"))
        else:
            y = x @ getattr(self, weight)
        b = getattr(self, bias) if bias else None
        return y if b is None else y + b

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention of ``q`` ``(R, heads, B, d)`` over the window's ``keys`` / ``values``
        ``(R, kv_heads, w, d)`` under ``mask`` ``(R, B, w) bool``: ``(R, heads, B, d)``. A kv head's
        query heads become rows (no repeated cache). One sequence: the measured batch-1 kernels
        (one row: plain operations inductor fuses, ``_row_attention``; more: SDPA); several:
        plain operations (SDPA's CPU kernel cost 65-125 us a call here)."""
        r, b, groups = q.shape[0], q.shape[2], self.heads // self.kv_heads
        if r == 1 and self.reduction and b == 1:  # the decoding step
            return _row_attention(q, keys, values, mask[0])
        attn_mask = (mask.repeat(1, groups, 1) if groups > 1 else mask)[:, None]  # (R, 1, groups * B, w)
        q = q.reshape(r, self.kv_heads, groups * b, self.head_dim)
        if r == 1:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)
        scores = (q @ keys.transpose(-1, -2)) * self.head_dim**-0.5
        scores = scores.masked_fill(~attn_mask, float("-inf"))
        return torch.softmax(scores, -1) @ values

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over every sequence (padded to a bucket on CUDA): ``input_ids`` ``(R, B) int64`` at
        ``positions`` ``(R, B)`` (RoPE), written to columns ``slots`` ``(R, B)`` of their sequences,
        position i of sequence r attending to the columns ``mask[r, i]`` (``(R, B, width) bool``).
        Returns the logits ``(R, B, V)`` and every hidden state ``(R, B, L + 1, H)`` (HF's
        ``output_hidden_states``)."""
        hf = self.hf.model
        r, b = input_ids.shape
        x = hf.embed_tokens(input_ids)  # (R, B, H)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (R, 1, B, d)
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
            cache_k, cache_v = self.write(i, slots, k, v)
            w = mask.shape[-1]  # the window: columns up to the last slot written, rounded up
            o = self._attention(q, cache_k[:, :, :w], cache_v[:, :, :w], mask)
            o = o.reshape(r, self.heads, b, self.head_dim).transpose(1, 2).reshape(r, b, self.heads * self.head_dim)
            x = x + (self._linear(o, f"o_w{i}", f"o_b{i}") if self.packed else att.o_proj(o))
            h = _rms(x, layer.post_attention_layernorm.weight, self.eps)
            if self.packed:
                gate, up = self._linear(h, f"gu_w{i}", f"gu_b{i}").chunk(2, -1)
                x = x + self._linear(layer.mlp.act_fn(gate) * up, f"down_w{i}", f"down_b{i}")
            else:
                x = x + layer.mlp(h)
            states.append(x)
        x = _rms(x, hf.norm.weight, self.eps)
        states[-1] = x
        # one sequence: the head over (B, H), the batch-1 step's measured product (the one-row reduction)
        top = x[0] if r == 1 else x
        logits = self._linear(top, "head_w") if self.packed else self.hf.lm_head(top)
        return (logits[None] if r == 1 else logits), torch.stack(states, dim=2)

    def _dummy_rows(self, b: int) -> list[torch.Tensor]:
        return [torch.zeros(b, dtype=torch.long, device=self.columns.device)]

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, attend: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence: feed ``input_ids`` ``(n,) int64`` after the cached positions
        (``StaticPasses.passes``: positions, tree mask ``attend``). Returns ``(logits (n, V), hidden
        states (n, L + 1, H))`` in the model's dtype.

        Raises:
            ValueError: if the cache cannot hold ``n`` more positions or ``n`` < 1.
        """
        logits, states = self.passes([input_ids], positions, attend)
        return logits, states

    @inference_mode
    def run_rows(
        self,
        input_ids: torch.Tensor,
        starts: torch.Tensor,
        counts: torch.Tensor | None = None,
        block_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed row ``r`` the tokens ``input_ids[r]`` at positions (and cache columns)
        ``starts[r], starts[r] + 1, ...``, causally over the row's own columns.

        Args:
            input_ids: ``(rows, n) int64``.
            starts: ``(rows,) int64``: each row's cached length (its first new column).
            counts: ``(rows,) int64`` each row's real new positions, the rest to scratch columns
                (``StaticPasses._rows_passes``); None: all ``n``.
            block_size: None: causal; B: block-wise causal, each position seeing its whole block of B
                (Fast-dLLM v2's attention, ``specpolicy.runners.fastdllm``).
        Returns:
            ``(logits (rows, n, V), hidden states (rows, n, L + 1, H))``, HF's order of hidden states.
        Raises:
            ValueError: if a row's real new positions pass the capacity.
        """
        logits, states = self._rows_passes([input_ids], starts, counts, block_size)
        return logits, states
