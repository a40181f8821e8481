"""Memory: the process's peak (``summary.json`` ``peak_memory``) and the estimate that refuses a
model too large for the machine before it loads (``check_fits``).

The estimate reads ``config.json`` only (no weights): parameters of a decoder-only transformer
(embeddings, per layer the attention's q/k/v/o projections and the gated MLP's three matrices,
the LM head unless tied) x bytes per element of the run's dtype, plus the KV cache of the context
(2 x layers x KV heads x head dim x context tokens x bytes). It is compared with the memory the
runtime has: on CPU the machine's available memory (``/proc/meminfo`` MemAvailable, else
``os.sysconf`` SC_AVPHYS_PAGES x page size), on CUDA the device's free memory
(``torch.cuda.mem_get_info``).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Mapping
from typing import Any

import torch

#: Bytes per element of each dtype a run may use.
DTYPE_BYTES = {torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.float16: 2}


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """The process's peak memory so far: ``cpu_rss_bytes`` (``getrusage(RUSAGE_SELF).ru_maxrss``:
    KiB on Linux, bytes on macOS) and ``cuda_max_allocated_bytes`` (``torch.cuda.max_memory_allocated``
    of ``device``; None off CUDA)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = int(rss if sys.platform == "darwin" else rss * 1024)
    cuda = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {"cpu_rss_bytes": rss_bytes, "cuda_max_allocated_bytes": cuda}


def parameter_count(config: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its ``config.json`` (module doc); norms and
    biases are left out (under 0.1% of a real model).

    Raises:
        KeyError: naming a missing shape key (``hidden_size``, ``num_hidden_layers``, ``vocab_size``).
    """
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    vocab = int(config["vocab_size"])
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v
    mlp = 3 * hidden * intermediate  # gate, up, down
    head = 0 if config.get("tie_word_embeddings", False) else vocab * hidden
    return vocab * hidden + layers * (attention + mlp) + head


def kv_cache_bytes(config: Mapping[str, Any], context: int, element_bytes: int) -> int:
    """Bytes of a KV cache of ``context`` tokens (keys and values of every layer)."""
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * int(context) * element_bytes


def estimate_bytes(config: Mapping[str, Any], dtype: torch.dtype, context: int) -> int:
    """Weights in ``dtype`` plus the KV cache of ``context`` tokens, in bytes (module doc)."""
    element = DTYPE_BYTES.get(dtype, 4)
    return parameter_count(config) * element + kv_cache_bytes(config, context, element)


def available_bytes(device: torch.device) -> int | None:
    """Memory the runtime can still use: CUDA ``mem_get_info`` free bytes, or the CPU's available
    memory (``/proc/meminfo`` MemAvailable, else ``os.sysconf``); None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def size_text(n_bytes: float) -> str:
    """``n_bytes`` in GiB (from 1 GiB on), else MiB, else KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / 2**10:.1f} KiB"


def fits_line(
    key: str, value: str, config: Mapping[str, Any], dtype: torch.dtype, context: int, available: int | None
) -> str | None:
    """One line refusing the model of ``key=value`` when its estimate exceeds ``available`` bytes,
    else None (also when nothing is known of the memory)."""
    if available is None:
        return None
    need = estimate_bytes(config, dtype, context)
    if need <= available:
        return None
    params = parameter_count(config)
    count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params:,}"
    name = str(dtype).removeprefix("torch.")
    return (
        f"{key}={value!r} does not fit: {count} parameters x {DTYPE_BYTES.get(dtype, 4)} bytes "
        f"({name}) + the KV cache of {context:,} tokens = {size_text(need)}, but the runtime has "
        f"{size_text(available)} available (use a smaller model or dtype, or another device)"
    )
