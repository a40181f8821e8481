"""A draft model's own KV cache: per layer, keys and values ``(1, kv_heads, n, head_dim)``.

Simpler than transformers' ``DynamicCache`` because the draft models here decide themselves what
enters it: DFlash caches only its context (the committed positions' target features), EAGLE-3 its
committed positions and, during a round, the drafted ones (cropped at ``commit``).
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer keys and values, appended to and cropped, never recomputed.

    Args:
        num_layers: layers of the draft model.
    """

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Positions held, in tokens."""
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])

    def layer(self, i: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Layer ``i``'s keys and values (None, None when empty)."""
        return self.keys[i], self.values[i]

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``k``, ``v`` ``(1, kv_heads, m, head_dim)`` to layer ``i``; returns that layer's whole cache."""
        if self.keys[i] is not None:
            k, v = torch.cat([self.keys[i], k], dim=2), torch.cat([self.values[i], v], dim=2)
        self.keys[i], self.values[i] = k, v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer (a no-op when shorter).

        Raises:
            ValueError: for a negative ``length``.
        """
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :length], v[:, :, :length]
