"""Randomly initialised models at published shapes, and the timing of one pass (for ``real_scale.py``).

A model is a Hugging Face causal LM built from a ``config.json`` dict (``specpolicy.models.shapes``)
directly on the device in the profile's dtype (bfloat16 on CUDA; no host copy, no checkpoint), plus
what a drafter's pass reads beside its decoder (``ProxyPass``: EAGLE-3 / DART / DFlash's ``fc``,
Falcon's LSTM). Two runtimes:

* ``eager``: the HF forward over a ``DynamicCache`` holding ``kv`` positions (random keys/values);
* ``graphs``: the compiled runtime's static cache (``specpolicy.runners.decoder.StaticDecoder``) --
  on CUDA compiled per bucket and replayed as CUDA graphs (``runtime.cuda_mode=cudagraphs``: dynamo's
  graph without inductor, seconds to build); on CPU the same static forward uncompiled (the CPU dry
  run checks the path, not the speed). ``fc`` / LSTM run eagerly before it.

A pass's time is the median of ``repeats`` timed passes after ``warmup`` untimed ones, each at the
same cache length (the cache is cut back after every pass): CUDA events on CUDA, ``perf_counter``
elsewhere, in ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specpolicy.core.cache import crop_cache
from specpolicy.core.runtime import CompileSettings
from specpolicy.models.shapes import DrafterShape


def hf_config(fields: dict[str, Any]) -> Any:
    """A transformers config object from ``config.json`` fields (``model_type`` picks the class)."""
    raw = dict(fields)
    return CONFIG_MAPPING[raw.pop("model_type")](**raw)


def build_lm(fields: dict[str, Any], dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A randomly initialised causal LM of ``fields`` in ``dtype``, eval mode, built on ``device``
    (parameters allocated there: a 32B bfloat16 model is never on the host)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            try:
                model = AutoModelForCausalLM.from_config(hf_config(fields), dtype=dtype)
            except TypeError:  # transformers before 4.56 names it torch_dtype
                model = AutoModelForCausalLM.from_config(hf_config(fields), torch_dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype).eval()


class ProxyPass(torch.nn.Module):
    """One drafter's (or the target's) pass at its published shape.

    Args:
        lm: the causal LM whose decoder layers and LM head the pass reads.
        hidden: the target's hidden size H (the features' width).
        fc_in: ``fc`` reads ``fc_in x H`` fused features (0: no ``fc``).
        lstm: Falcon's 2-layer LSTM over ``2H`` (feature and embedding) before the decoder.
    """

    def __init__(self, lm: torch.nn.Module, hidden: int = 0, fc_in: int = 0, lstm: bool = False) -> None:
        super().__init__()
        self.lm = lm
        width = int(lm.config.hidden_size)
        device, dtype = lm.get_output_embeddings().weight.device, lm.get_output_embeddings().weight.dtype
        self.fc = torch.nn.Linear(fc_in * hidden, width, bias=False, device=device, dtype=dtype) if fc_in else None
        self.lstm = torch.nn.LSTM(2 * width, width, 2, batch_first=True, device=device, dtype=dtype) if lstm else None
        self.static: Any = None
        self.cache: Any = None

    def prefix(self, width: int) -> None:
        """The eager part before the decoder: ``fc`` over ``(1, width, fc_in x H)`` features and the
        LSTM over ``(1, width, 2H)`` (random inputs; the output feeds nothing: the cost is the pass's)."""
        if self.fc is not None:
            w = self.fc.weight
            self.fc(torch.randn((1, width, w.shape[1]), dtype=w.dtype, device=w.device))
        if self.lstm is not None:
            w = self.lstm.weight_ih_l0
            self.lstm(torch.randn((1, width, w.shape[1]), dtype=w.dtype, device=w.device))

    def set_kv(self, kv: int, mode: str) -> None:
        """Make the cache of ``mode`` hold ``kv`` positions (random keys and values appended, or the
        cache cut back)."""
        if mode == "graphs":
            self.static.length = kv
            return
        cache = self.cache
        have = cache.get_seq_length() if cache is not None else 0
        if cache is None or have > kv:
            if cache is not None and kv > 0:
                crop_cache(cache, kv, have)
                return
            self.cache = cache = DynamicCache()
            have = 0
        if kv > have:
            c = self.lm.config
            heads = int(c.num_key_value_heads)
            head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
            w = self.lm.get_output_embeddings().weight
            for layer in range(int(c.num_hidden_layers)):
                k = torch.randn((1, heads, kv - have, head_dim), dtype=w.dtype, device=w.device)
                cache.update(k, torch.randn_like(k), layer)

    @torch.inference_mode()
    def run(self, width: int, kv: int, mode: str) -> None:
        """One pass of ``width`` new positions after ``kv`` cached ones (the cache is at ``kv``:
        ``set_kv``); the cache grows by ``width`` (cut it back with ``set_kv``)."""
        self.prefix(width)
        device = self.lm.get_output_embeddings().weight.device
        ids = torch.randint(0, int(self.lm.config.vocab_size), (width,), device=device)
        if mode == "graphs":
            self.static.run(ids)
            return
        positions = torch.arange(kv, kv + width, device=device)[None]
        self.lm(input_ids=ids[None], position_ids=positions, past_key_values=self.cache, use_cache=True)

    def enable_graphs(self, capacity: int, buckets: tuple[int, ...]) -> float:
        """Put the decoder behind the compiled runtime's static cache of ``capacity`` positions
        (compiled per bucket as CUDA graphs on CUDA). Returns the seconds its warm-up took."""
        from specpolicy.runners.decoder import StaticDecoder

        cuda = self.lm.get_output_embeddings().weight.device.type == "cuda"
        settings = CompileSettings(buckets=buckets, cuda_mode="cudagraphs")
        self.static = StaticDecoder(self.lm, capacity, compile=cuda, buckets=buckets, settings=settings)
        with torch.inference_mode():
            return self.static.warmup()


def build_pass(
    shape: DrafterShape | None, fields: dict[str, Any], dtype: torch.dtype, device: torch.device
) -> ProxyPass:
    """The ``ProxyPass`` of a drafter ``shape`` (None: the target of ``fields``)."""
    if shape is None:
        return ProxyPass(build_lm(fields, dtype, device))
    lm = build_lm(shape.config, dtype, device)
    return ProxyPass(lm, hidden=int(fields["hidden_size"]), fc_in=shape.fc_in, lstm=shape.lstm)


def timer(device: torch.device) -> Callable[[Callable[[], None]], float]:
    """A function timing one call in ms: CUDA events around it on CUDA (synchronised after),
    ``perf_counter`` elsewhere."""
    if device.type == "cuda":

        def timed_cuda(fn: Callable[[], None]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))

        return timed_cuda

    def timed_host(fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return timed_host


def pass_ms(model: ProxyPass, width: int, kv: int, mode: str, warmup: int, repeats: int, device: torch.device) -> float:
    """Median ms of ``repeats`` passes of ``width`` positions after ``kv`` cached (``warmup``
    untimed first), the cache cut back to ``kv`` before each."""
    timed = timer(device)
    times = []
    for i in range(warmup + repeats):
        model.set_kv(kv, mode)
        ms = timed(lambda: model.run(width, kv, mode))
        if i >= warmup:
            times.append(ms)
    model.set_kv(kv, mode)
    return float(statistics.median(times))


def free(device: torch.device, compiled: bool = True) -> None:
    """Release what a freed model left on ``device``: with ``compiled``, dynamo's compiled passes
    (which reference the model they were compiled for) and their CUDA-graph memory pools -- every
    model's: only when no compiled model stays in use -- then the allocator's cache."""
    import gc

    if compiled:
        torch._dynamo.reset()
    if compiled and device.type == "cuda":
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()
        except ImportError:  # an older torch: dynamo's reset is all there is
            pass
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
