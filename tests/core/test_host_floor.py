"""Host work every round pays (issue 48): the cache crop and the record's host ms stay what they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from specpolicy.core.cache import buffered_cache, crop_cache, keep_path
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


def test_built_is_the_constructor():
    """``RoundRecord.built`` (the loop's record of each round) equals the dataclass's constructor, the
    fields not given defaulted, and is as frozen."""
    values = dict(index=0, speculation_length=3, accepted_length=2, emitted_tokens=3, drafter_forward_passes=3,
                  reused_tokens=0, draft_ms=1.5, verify_ms=2.5, confidences=(0.5, 0.25, 0.125),
                  draft_token_ids=(4, 5, 6), target_token_ids=(4, 5, 7, 8), draft_stop_reason="n_max")  # fmt: skip
    built, made = RoundRecord.built(**values), RoundRecord(**values)
    assert built == made and vars(built) == vars(made) and built.host_ms is None and built.draft_parents == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.index = 1  # type: ignore[misc]


def _filled(cache: DynamicCache, widths: list[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Passes of ``widths`` new positions over two layers (keys and values of other head sizes),
    each returning what the cache's ``update`` returned."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n in widths:
        for layer in range(2):
            k = torch.randn((1, 2, n, 4), generator=generator)
            v = torch.randn((1, 2, n, 3), generator=generator)
            out.append(cache.update(k, v, layer))
    return out


def test_a_buffered_cache_returns_what_a_dynamic_cache_returns_through_crops_and_growth():
    """The verifier's ``buffered_cache``: every pass's keys and values equal ``DynamicCache``'s (its
    ``torch.cat``), through crops (a length) and past its capacity (it doubles, keeping what it held)."""
    buffered, dynamic = buffered_cache(5), DynamicCache()
    widths = [4, 1, 3, 6, 2, 9]
    for step, n in enumerate(widths):
        got, want = _filled(buffered, [n], step), _filled(dynamic, [n], step)
        for (k, v), (k2, v2) in zip(got, want):
            assert torch.equal(k, k2) and torch.equal(v, v2)
        keep = dynamic.get_seq_length() - step % 3  # drop 0, 1 or 2 positions
        crop_cache(buffered, keep, current=buffered.get_seq_length())
        crop_cache(dynamic, keep)
        assert buffered.get_seq_length() == dynamic.get_seq_length() == keep
        for a, b in zip(buffered.layers, dynamic.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert buffered.layers[0]._key_buffer.shape[-2] >= buffered.get_seq_length()
    assert buffered.layers[0]._key_buffer.shape[-2] < 2 * sum(widths)  # doubled, not grown per pass


def test_a_buffered_layer_adopts_views_of_its_buffer_and_replaces_it_with_other_tensors():
    """``layer.keys = ...``: a view of the buffer's first positions (``keep_path``'s and
    ``crop_cache``'s cuts) is a length; any other tensor (transformers' batch methods,
    ``append_columns``) becomes the buffer; None resets it."""
    cache = buffered_cache(8)
    _filled(cache, [6])
    layer = cache.layers[0]
    buffer = layer._key_buffer
    layer.keys, layer.values = layer.keys[:, :, :4], layer.values[:, :, :4]
    assert layer._key_buffer is buffer and layer.get_seq_length() == 4
    other = torch.randn((1, 2, 3, 4))
    layer.keys, layer.values = other, torch.randn((1, 2, 3, 3))
    assert layer._key_buffer is other and torch.equal(layer.keys, other) and layer.get_seq_length() == 3
    k, v = layer.update(torch.ones((1, 2, 2, 4)), torch.ones((1, 2, 2, 3)))  # grows past the adopted tensor
    assert k.shape[-2] == 5 and torch.equal(k[:, :, :3], other) and bool((k[:, :, 3:] == 1).all())
    layer.reset()
    assert layer.keys is None and layer.get_seq_length() == 0
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)


def test_a_buffered_layer_takes_a_pair_assigned_one_by_one():
    """``append_columns``' ``layer.keys = cat([layer.keys, k]); layer.values = cat([layer.values, v])``:
    the values read between the two assignments are the ones held, not the keys' new length."""
    cache = buffered_cache(16)
    _filled(cache, [5])
    layer = cache.layers[0]
    keys, values = layer.keys.clone(), layer.values.clone()
    k, v = torch.randn((1, 2, 3, 4)), torch.randn((1, 2, 3, 3))
    layer.keys = torch.cat([layer.keys, k], dim=2)
    layer.values = torch.cat([layer.values, v], dim=2)
    assert layer.get_seq_length() == 8
    assert torch.equal(layer.keys, torch.cat([keys, k], dim=2)) and torch.equal(
        layer.values, torch.cat([values, v], dim=2)
    )


def test_keep_path_on_a_buffered_cache_keeps_what_it_keeps_on_a_dynamic_cache():
    """A tree's accepted path kept in place (``keep_path``): on the verifier's buffered cache the
    entries move inside the buffers and the crop is a length, with the same keys and values as on
    a ``DynamicCache``."""
    for path in ([0, 2, 5], [0, 1, 2], [0, 3]):
        buffered, dynamic = buffered_cache(4), DynamicCache()
        _filled(buffered, [5, 7], seed=3)
        _filled(dynamic, [5, 7], seed=3)
        keep_path(buffered, 5, path)
        keep_path(dynamic, 5, path)
        assert buffered.get_seq_length() == dynamic.get_seq_length() == 5 + len(path)
        for a, b in zip(buffered.layers, dynamic.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), path
