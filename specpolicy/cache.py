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


def keep_path(cache: DynamicCache, start: int, path_rows: list[int]) -> None:
    """After a draft tree's verification, keep the committed prefix (positions ``< start``) and the
    accepted path, in place: the entries of input rows ``path_rows`` (row 0 = the pending token at
    ``start``, row i = tree node i - 1; increasing) move to positions ``start, start + 1, ...`` and
    the rest is dropped. Their keys and values were computed at the positions they are committed
    at (positions by depth), so nothing is recomputed. Cost: a copy of the path's entries only --
    none when the path is the tree's first nodes (a chain-like path), never the prefix.

    Raises:
        ValueError: if ``path_rows`` does not start at row 0 or is not increasing.
    """
    if not path_rows or path_rows[0] != 0 or any(b <= a for a, b in zip(path_rows, path_rows[1:])):
        raise ValueError(f"path_rows must start at 0 and increase, got {path_rows}")
    n = len(path_rows)
    if path_rows != list(range(n)):  # move the path's entries down to start, start + 1, ...
        index = None
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None or not layer.keys.numel():
                continue
            if index is None or index.device != layer.keys.device:
                index = torch.tensor(path_rows, dtype=torch.long, device=layer.keys.device) + start
            layer.keys[..., start : start + n, :] = layer.keys.index_select(-2, index)
            layer.values[..., start : start + n, :] = layer.values.index_select(-2, index)
    crop_cache(cache, start + n)
