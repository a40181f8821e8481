"""Custom attention masks handed to Hugging Face models (block-causal drafting, tree verification).

transformers 5 passes a 4D mask to the attention kernel as it is (``masking_utils``: "If the mask
is already 4D, simply return as-is"): ``sdpa`` takes a boolean mask (True = attend), ``eager`` an
additive one (0 = attend, the dtype's minimum = blocked).
"""

from __future__ import annotations

import torch

#: Attention implementations a custom 4D mask works with.
MASKABLE_ATTENTION = ("sdpa", "eager")


def as_model_mask(mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (bool, True = attend, ``(1, 1, q, k)``) as the attention implementation wants it: as
    it is for sdpa, additive (0 = attend, ``dtype``'s minimum = blocked) for eager."""
    if attn_implementation == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask
