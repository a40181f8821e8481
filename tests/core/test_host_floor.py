"""Host work every round pays (issue 48): the cache crop and the record's host ms stay what they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from specpolicy.core.cache import crop_cache
from specpolicy.core.types import RoundRecord


def _cache(layers: int, length: int, offset: int = 0) -> DynamicCache:
    cache = DynamicCache()
    g = torch.Generator().manual_seed(layers + length)
    for j in range(layers):
        k, v = torch.randn(1, 2, length + offset, 8, generator=g), torch.randn(1, 2, length + offset, 4, generator=g)
        cache.update(k[:, :, offset:], v[:, :, offset:], j)  # offset > 0: a strided view of a longer tensor
    return cache


@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize(("length", "keep"), [(9, 4), (9, 0), (9, 9), (9, 12), (1, 0)])
def test_crop_cache_makes_the_views_dynamic_cache_crop_makes(length, keep, offset):
    ours, theirs = _cache(3, length, offset), _cache(3, length, offset)
    held = [(layer.keys, layer.values) for layer in ours.layers]
    crop_cache(ours, keep)
    if theirs.get_seq_length() > keep:
        theirs.crop(keep - theirs.get_seq_length())
    assert ours.get_seq_length() == theirs.get_seq_length() == min(length, keep)
    for a, b, before in zip(ours.layers, theirs.layers, held):
        for x, y, z in ((a.keys, b.keys, before[0]), (a.values, b.values, before[1])):
            assert x.shape == y.shape and x.stride() == y.stride() and x.storage_offset() == y.storage_offset()
            assert torch.equal(x, y)
            assert x.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()  # a view: nothing copied


def test_crop_cache_with_the_length_the_caller_knows():
    cache = _cache(2, 7)
    crop_cache(cache, 5, current=7)
    assert cache.get_seq_length() == 5
    crop_cache(cache, 6, current=5)  # longer than held: nothing to drop
    assert cache.get_seq_length() == 5
    with pytest.raises(ValueError, match="length must be >= 0"):
        crop_cache(cache, -1)


def test_with_host_ms_is_replace():
    record = RoundRecord(0, 3, 2, 3, 3, 0, 1.5, 2.5, (0.5, 0.25, 0.125), (4, 5, 6), (4, 5, 7, 8), "n_max")
    timed = record.with_host_ms(0.3)
    assert timed == dataclasses.replace(record, host_ms=0.3) and timed is not record
    assert record.host_ms is None and timed.host_ms == 0.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        timed.host_ms = 1.0  # type: ignore[misc]
