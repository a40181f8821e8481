"""``easyspec`` drafter: EasySpec's layer-parallel drafting on the AR drafter (Wu et al., arXiv
2502.02493, §3: "fuzzy speculation" and "bonus calibration").

A drafted token normally costs one pass through the drafter's L layers one after another. EasySpec
groups the drafter's MIDDLE layers (not the first, not the last) ``layer_parallel`` (N) at a time:
the attention sublayers of a group all take the group's first input -- a stale hidden state --
and run at once (in the paper, on different GPUs); the MLPs stay sequential (parallel MLPs cost
too much accuracy)::

    h_in = h
    a_j  = Attn_j(RMSNorm_j(h_in))            for every layer j of the group, together
    h    = h + a_j ;  h = h + MLP_j(RMSNorm'_j(h))   for j in order

On one device "at once" means fused: the group's q/k/v projections are ONE matrix multiply (each
layer's RMSNorm weight folded into its projection columns), and the o projections one batched
multiply. The drafted tokens' keys and values are therefore approximate; *bonus calibration*
drops them after each verification, and the next round's first pass feeds the accepted tokens and
the bonus token through the exact, sequential model -- one pass that also drafts the round's
first token. Only the later tokens of a round are drafted layer-parallel.

``layer_parallel`` 1 runs the same lean per-token pass with every layer on its own (the control:
what the lean pass alone saves against Hugging Face's forward, without the approximation). The
bundled AR drafter has 4 layers: 2 middle ones, so N <= 2 here (the paper's N = 4 needs a
drafter of 6 layers or more). Lossless like every drafter: greedy and sampled tokens are verified
as usual (sampling: q is the warped distribution each token was drawn from, approximate or not).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specpolicy.core.cache import crop_cache
from specpolicy.core.checks import check_keys, integer
from specpolicy.core.drafter import Drafter
from specpolicy.core.errors import ConfigError
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.ar import ARDrafter
from specpolicy.models.loading import (
    check_attention,
    check_model_source,
    check_same_vocabulary,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "easyspec"
CONFIG_KEYS = ("model", "attn_implementation", "layer_parallel")


def layer_groups(num_layers: int, layer_parallel: int) -> list[list[int]]:
    """The drafter's layers in the order a pass runs them: the first alone, the middle ones
    ``layer_parallel`` at a time (a shorter last group), the last alone.

    Raises:
        ValueError: ``layer_parallel`` outside ``1 .. num_layers - 2``.
    """
    middle = num_layers - 2
    if (
        isinstance(layer_parallel, bool)
        or not isinstance(layer_parallel, int)
        or not 1 <= layer_parallel <= max(middle, 1)
    ):
        raise ValueError(
            f"drafter.layer_parallel must be an integer in [1, {max(middle, 1)}] (the drafter's {middle} middle "
            f"layers of {num_layers}), got {layer_parallel!r}"
        )
    groups = [[0]] if num_layers > 1 else []
    groups += [
        list(range(i, min(i + layer_parallel, num_layers - 1))) for i in range(1, num_layers - 1, layer_parallel)
    ]
    return groups + [[num_layers - 1]]


class _Group(torch.nn.Module):
    """One group's fused attention inputs: the layers' q/k/v projections stacked into one
    ``(n * (q + 2 kv), H)`` matrix with each layer's input-RMSNorm weight folded into its columns,
    their biases, and the o projections stacked ``(n, heads * head_dim, H)``."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        weights, biases = [], []
        for layer in layers:
            attn, norm = layer.self_attn, layer.input_layernorm.weight
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                weights.append(proj.weight * norm[None, :])
                biases.append(proj.bias if proj.bias is not None else proj.weight.new_zeros(proj.weight.shape[0]))
        self.register_buffer("qkv_t", torch.cat(weights).t().contiguous().detach())  # (H, n * (q + 2 kv))
        self.register_buffer("qkv_bias", torch.cat(biases).detach())
        self.register_buffer("o_t", torch.stack([lay.self_attn.o_proj.weight.t() for lay in layers]).detach())
        first = layers[0].self_attn
        self.q, self.kv = first.q_proj.weight.shape[0], first.k_proj.weight.shape[0]
        self.eps = layers[0].input_layernorm.variance_epsilon


class EasySpecDrafter(ARDrafter):
    """AR drafting with the middle layers run ``layer_parallel`` at a time (see the module docstring).

    Args:
        model: the AR drafter (a Hugging Face Qwen2 / Llama-style causal LM), on the runtime device.
        runtime: the shared runtime.
        layer_parallel: middle layers per group, ``1 .. num_hidden_layers - 2``.
    Raises:
        ValueError: ``layer_parallel`` out of range, or a model without that layer structure.
    """

    name = NAME
    #: Pass entry points watched on the compiled runtime too (called from eager Python only).
    eager_pass_methods = ("_choose", "_parallel_pass")

    @property
    def timed_calls(self) -> tuple:
        """The AR drafter's pass entry points (``ARDrafter.timed_calls``) and the layer-parallel pass
        (``_parallel_pass``), which runs the model's layers one by one without its forward."""
        return super().timed_calls + ((self, "_parallel_pass"),)

    def __init__(self, model: PreTrainedModel, runtime: Runtime, layer_parallel: int = 2) -> None:
        super().__init__(model, runtime)
        inner = model.model
        if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise ValueError(
                "the easyspec drafter needs a Llama/Qwen2-style model (embed_tokens, layers, norm, rotary_emb)"
            )
        self.layer_parallel = layer_parallel
        self.groups = layer_groups(len(inner.layers), layer_parallel)
        self._fused = {tuple(g): _Group([inner.layers[i] for i in g]) for g in self.groups if len(g) > 1}
        attn = inner.layers[0].self_attn
        self._head_dim = attn.head_dim
        self._exact_length = 0  # cache length after the round's exact first pass

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        """Extend the round's draft by ``num_tokens`` tokens, one pass each (``_next_logits``): the
        AR drafter's choice of each token (``ARDrafter._choose``: greedy, or a draw from
        ``warp`` when sampling) on this drafter's passes.

        Raises:
            ValueError: ``num_tokens`` < 1.
        """
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        for _ in range(num_tokens):
            token, conf, q = self._choose([self], self._next_logits())
            self._tokens.append(token)
            self._confs.append(conf)
            if q[0] is not None:
                self._probs.append(q[0])
            self._passes += 1
        return self._round_draft()

    def _next_logits(self) -> torch.Tensor:
        """The round's first pass exact (over the committed tokens not yet fed: bonus calibration,
        ``CausalRunner.last``), every later one layer-parallel; returns the next token's ``(1, V)`` logits."""
        if self._tokens:  # the cache: the exact first pass's length, then one position per layer-parallel pass
            return self._parallel_pass(self._tokens[-1], self._exact_length + len(self._tokens) - 1)
        logits = self.runner.last([self.sequence], [self._unfed])[0]  # (1, V): the pass's one row
        self._unfed = self._unfed[:0]
        self._exact_length = self.cache.get_seq_length()
        return logits

    def _parallel_pass(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """One drafted token's pass with the middle layers grouped: ``token`` ``(1,) int64`` at
        ``position``; its keys and values appended to the cache (approximate); returns ``(1, V)`` logits."""
        inner = self.model.model
        h = inner.embed_tokens(token)[None]  # (1, 1, H)
        positions = torch.tensor([[position]], device=h.device)
        cos, sin = inner.rotary_emb(h, positions)
        for group in self.groups:
            if len(group) == 1:
                h = inner.layers[group[0]](h, position_ids=positions, cache=self.cache, position_embeddings=(cos, sin))
                continue
            fused = self._fused[tuple(group)]
            x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + fused.eps)  # RMSNorm, weights folded
            qkv = torch.addmm(fused.qkv_bias, x[0], fused.qkv_t).view(len(group), -1)  # (n, q + 2 kv): one multiply
            outs = []
            for j, index in enumerate(group):
                q, k, v = (  # (1, heads, 1, d) each
                    t.view(1, 1, -1, self._head_dim).transpose(1, 2)
                    for t in qkv[j].split([fused.q, fused.kv, fused.kv])
                )
                q, k = _rotate(q, k, cos, sin)
                keys, values = self.cache.update(k, v, index)
                outs.append(F.scaled_dot_product_attention(q, keys, values, enable_gqa=True).reshape(1, -1))
            attended = torch.bmm(torch.stack(outs), fused.o_t)  # (n, 1, H): the o projections, one multiply
            for j, index in enumerate(group):
                layer = inner.layers[index]
                h = h + attended[j][None]
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h))[0, -1:]

    @classmethod
    def draft_many(cls, drafters: list[Drafter], num_tokens: list[int]) -> list[Draft]:
        """One request after another (the layer-parallel pass is written for one request)."""
        return [d.draft(n) for d, n in zip(drafters, num_tokens)]

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Bonus calibration: drop every key and value the round's layer-parallel passes wrote; the
        accepted tokens and the bonus token are fed by the next round's exact first pass."""
        if draft.is_tree or not self._tokens:
            super().commit(draft, verification)
            return
        crop_cache(self.cache, self._exact_length)
        self._unfed = verification.committed_tokens(draft)
        self._new_round()


def _rotate(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding (the ``rotate_half`` convention of Llama / Qwen2)."""
    cos, sin = cos[:, None], sin[:, None]

    def half(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    return q * cos + half(q) * sin, k * cos + half(k) * sin


def _num_layers(model: str) -> int | None:
    """``num_hidden_layers`` from a bundled or local model's config.json, without loading it."""
    import json
    from pathlib import Path

    try:
        path = Path(resolve_model_path(model)) / "config.json"
        return int(json.loads(path.read_text(encoding="utf-8"))["num_hidden_layers"]) if path.is_file() else None
    except (OSError, ValueError, KeyError):
        return None


def validate(config: dict[str, Any]) -> None:
    """``drafter=easyspec``: known keys, the model's directory and weights (not loaded), the
    attention, and ``layer_parallel`` against the model's middle layers (from its config.json)."""
    check_keys("drafter", config, CONFIG_KEYS)
    model = config.get("model", "ar-drafter")
    check_model_source("drafter.model", model)
    check_attention("drafter.attn_implementation", config.get("attn_implementation", "sdpa"))
    parallel = integer("drafter.layer_parallel", config.get("layer_parallel", 2), 1)
    layers = _num_layers(model)
    if layers is not None:
        try:
            layer_groups(layers, parallel)
        except ValueError as exc:
            raise ConfigError(f"{exc} (drafter.model={model!r})") from None


def build(config: dict[str, Any], runtime: Runtime, verifier) -> EasySpecDrafter:
    """Factory for ``drafter=easyspec``. Config keys: ``model`` (the AR drafter: bundled name or
    local path), ``attn_implementation``, ``layer_parallel`` (middle layers per group)."""
    model_name = config.get("model", "ar-drafter")
    model = load_causal_lm(model_name, runtime, config.get("attn_implementation", "sdpa"))
    check_same_vocabulary(verifier.tokenizer, load_tokenizer(model_name), NAME)
    return EasySpecDrafter(model, runtime, config.get("layer_parallel", 2))


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=easyspec`` (``build``, checked by ``validate``)."""
    return [PluginEntry("drafter", NAME, build, validate, "EasySpec: layer-parallel drafting on the AR drafter")]
