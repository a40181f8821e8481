"""KV-cache helpers shared by the verifier and the model-based drafters."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond ``length`` (tokens), in place; a no-op if shorter.

    (``DynamicCache.crop`` with a negative count, which transformers 4.x and 5.x both accept.)
    Raises:
        ValueError: if ``length`` is negative.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def keep_positions(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep only the cached positions ``index`` (``(n,) int64``, increasing), in place: after a
    draft tree's verification, the committed prefix and the accepted path's nodes (their keys and
    values were computed at the positions they are committed at, so nothing is recomputed)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
