"""KV-cache helpers shared by the verifier and the model-based drafters."""

from __future__ import annotations

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
