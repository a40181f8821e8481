"""KV-cache helpers shared by the verifier and the model-based drafters."""

from __future__ import annotations

import functools
import operator
from typing import Any, cast

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specpolicy.core import compiled, compiled_tree

#: cache dtypes a CPU tensor shares with numpy (``Tensor.numpy``): moved by a compiled kernel
_NUMPY_DTYPES = (torch.float32, torch.float64)


class BufferedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in preallocated buffers ``(B, kv_heads, C, d)``:
    ``update`` writes a pass's new positions into them and returns views of the filled part -- the
    same values and shapes as ``DynamicLayer``'s ``torch.cat``, without copying the whole cache every
    pass -- and a crop (a rollback after verification) sets ``length``: no tensor op at all. The
    capacity C (tokens) starts at ``capacity`` (or the first pass's width) and doubles when a pass
    does not fit (one copy). As the compiled runtime's static cache: a rollback is a length.

    ``keys`` / ``values`` read the filled part (a view); assigning a tensor to them (transformers'
    own batch and reset methods, ``append_columns``) makes it the buffer, or, for a view of the
    current buffer starting where it starts (``crop_cache``'s and ``keep_path``'s cuts), just sets
    the length.
    """

    def __init__(self, capacity: int = 0) -> None:
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._key_length = self._value_length = 0  # tokens held (apart while a pair is assigned one by one)
        self._host: tuple | None = None  # (key buffer, value buffer, their numpy views): host_buffers
        self.capacity_hint = max(int(capacity), 0)
        super().__init__()

    @staticmethod
    def _adopt(buffer: torch.Tensor | None, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """What to keep as the buffer when ``tensor`` is assigned: the buffer itself when ``tensor``
        is a view of its first positions, else ``tensor``."""
        if (
            buffer is not None
            and tensor is not None
            and tensor.dim() == 4
            and tensor.data_ptr() == buffer.data_ptr()
            and tensor.stride() == buffer.stride()
            and tensor.shape[:2] == buffer.shape[:2]
            and tensor.shape[-1] == buffer.shape[-1]
            and tensor.shape[-2] <= buffer.shape[-2]
        ):
            return buffer
        return tensor

    @property
    def keys(self) -> torch.Tensor | None:
        """``(B, kv_heads, length, d)``: the cached keys (a view of the buffer), or None."""
        b = self._key_buffer
        return b if b is None or b.dim() != 4 else b[:, :, : self._key_length]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._key_buffer = self._adopt(self._key_buffer, tensor)
        self._key_length = 0 if tensor is None or tensor.dim() != 4 else int(tensor.shape[-2])

    @property
    def values(self) -> torch.Tensor | None:
        """``(B, kv_heads, length, d_v)``: the cached values (a view of the buffer), or None."""
        b = self._value_buffer
        return b if b is None or b.dim() != 4 else b[:, :, : self._value_length]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._value_buffer = self._adopt(self._value_buffer, tensor)
        self._value_length = 0 if tensor is None or tensor.dim() != 4 else int(tensor.shape[-2])

    @property
    def length(self) -> int:
        """Tokens held."""
        return self._key_length

    @length.setter
    def length(self, tokens: int) -> None:
        self._key_length = self._value_length = tokens

    def host_buffers(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The key and value buffers as numpy views (no copy; cached per buffer) when both are 4-D CPU
        tensors of a dtype numpy holds, without grad; else None."""
        k, v = self._key_buffer, self._value_buffer
        if k is None or v is None:
            return None
        held = self._host
        if held is not None and held[0] is k and held[1] is v and held[2].ctypes.data == k.data_ptr():
            return held[2], held[3]  # (a deep copy of the layer copies the views apart from its tensors)
        ok = all(
            t.dim() == 4 and t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES and not t.requires_grad for t in (k, v)
        )
        if not ok:
            return None
        self._host = (k, v, k.numpy(), v.numpy())
        return self._host[2], self._host[3]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states`` / ``value_states`` ``(B, kv_heads, n, d)`` at positions ``length ..
        length + n - 1`` and return the keys and values of every position held (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length
        end = start + int(key_states.shape[-2])
        keys, values = self._key_buffer, self._value_buffer
        if (
            keys is None
            or values is None
            or keys.dim() != 4
            or end > keys.shape[-2]
            or keys.shape[0] != key_states.shape[0]
        ):
            keys, values = self._grow(key_states, value_states, end)
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def _grow(
        self, key_states: torch.Tensor, value_states: torch.Tensor, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New buffers holding at least ``end`` positions (the hint, twice the old capacity), the
        positions held copied over."""
        old_k, old_v, held = self._key_buffer, self._value_buffer, self.length
        old_capacity = int(old_k.shape[-2]) if old_k is not None and old_k.dim() == 4 else 0
        capacity = max(end, 2 * old_capacity, self.capacity_hint)
        b, h, _, d = key_states.shape
        keys = key_states.new_empty((b, h, capacity, d))
        values = value_states.new_empty((b, value_states.shape[1], capacity, value_states.shape[-1]))
        if held and old_k is not None and old_v is not None:
            keys[:, :, :held] = old_k[:, :, :held]
            values[:, :, :held] = old_v[:, :, :held]
        self._key_buffer, self._value_buffer = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (transformers' negative count): a length."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to drop, got {tokens_to_remove}")
        self.length = max(self.length + int(tokens_to_remove), 0)


def held_length(cache: DynamicCache) -> int:
    """``cache.get_seq_length()`` (tokens held), read straight from its first layer when that is a
    ``BufferedLayer`` (every round reads it: transformers' method checks the layer's class first)."""
    layers = cache.layers
    if layers and type(layers[0]) is BufferedLayer:
        first: Any = layers[0]
        return first._key_length if first.is_initialized else 0
    return cache.get_seq_length()


def emptied_cache(cache: DynamicCache | None, capacity: int, dtype: torch.dtype, device: torch.device) -> DynamicCache:
    """A batch-1 cache for a new prompt: ``cache`` (the previous prompt's) emptied in place when every
    layer is a ``BufferedLayer`` whose batch-1 buffers hold ``capacity`` tokens in ``dtype`` on
    ``device`` and may be written here (not inference tensors outside inference mode: a decode runs
    in it, a replay's prefill may not) -- its buffers, and the host form ``kept_entries`` made of
    them, serve the next request as a server's preallocated KV pool does -- else
    ``buffered_cache(capacity)``. Emptying is a length (0 tokens held); nothing computed for the
    previous prompt is read again."""
    layers: Any = None if cache is None else cache.layers
    writable = torch.is_inference_mode_enabled()
    if layers and all(
        type(layer) is BufferedLayer
        and layer._key_buffer is not None
        and layer._value_buffer is not None
        and layer._key_buffer.dim() == 4
        and layer._key_buffer.shape[0] == 1
        and layer._key_buffer.shape[-2] >= capacity
        and layer._value_buffer.shape[-2] >= capacity
        and layer._key_buffer.dtype == layer._value_buffer.dtype == dtype
        and layer._key_buffer.device == torch.device(device)
        and (writable or not (layer._key_buffer.is_inference() or layer._value_buffer.is_inference()))
        for layer in layers
    ):
        for layer in layers:
            layer._key_length = layer._value_length = 0
        return cast(DynamicCache, cache)
    return buffered_cache(capacity)


def buffered_cache(capacity: int = 0) -> DynamicCache:
    """A ``DynamicCache`` of ``BufferedLayer`` layers (one per decoder layer, made as the first pass
    reaches them), each with room for ``capacity`` tokens before it grows."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(BufferedLayer, capacity)  # type: ignore[assignment]
    return cache


def crop_cache(cache: DynamicCache, length: int, current: int | None = None) -> None:
    """Drop cached positions beyond ``length`` (tokens), in place; a no-op if shorter.

    ``DynamicCache.crop`` with a negative count (transformers 4.x and 5.x both accept it), done
    directly on its plain ``DynamicLayer`` layers: each layer's keys and values become the view
    ``crop`` makes (``[..., :-excess, :]``: the same storage, offset and strides), built with
    ``as_strided`` -- about a third of a slice's host cost, two per layer, every round. Layers of
    other kinds (sliding windows, linear attention) crop themselves.

    Args:
        cache: the cache to crop.
        length: tokens to keep (>= 0).
        current: the cache's length in tokens when the caller knows it (the verifier: what it
            held plus the pass's positions), saving ``get_seq_length``; None: read it.
    Raises:
        ValueError: if ``length`` is negative.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    excess = (cache.get_seq_length() if current is None else current) - length
    if excess <= 0:
        return
    layer: Any  # transformers' cache layers
    for layer in cache.layers:
        if type(layer) is BufferedLayer:  # a rollback is a length (``BufferedLayer.crop``, inlined)
            kept = layer._key_length - excess
            layer._key_length = layer._value_length = kept if kept > 0 else 0
            continue
        keys = layer.keys if type(layer) is DynamicLayer and layer.is_initialized else None
        if keys is None or keys.dim() != 4:
            layer.crop(-excess)
            continue
        values = layer.values
        b, h, n, d = keys.shape
        layer.keys = keys.as_strided((b, h, max(n - excess, 0), d), keys.stride())
        b, h, n, d = values.shape
        layer.values = values.as_strided((b, h, max(n - excess, 0), d), values.stride())


def keep_path(cache: DynamicCache, start: int, path_rows: list[int] | np.ndarray, gather: tuple | None = None) -> None:
    """After a draft tree's verification, keep the committed prefix (positions ``< start``) and the
    accepted path, in place: the entries of input rows ``path_rows`` (a list or an ``int64`` array;
    row 0 = the pending token at ``start``, row i = tree node i - 1; increasing) move to positions
    ``start, start + 1, ...`` and the rest is dropped. Their keys and values were computed at the
    positions they are committed at (positions by depth), so nothing is recomputed. Cost: a copy of
    the path's entries only -- none when the path is the tree's first nodes (a chain-like path),
    never the prefix. On the verifier's buffered cache on the CPU (every layer a ``BufferedLayer``
    with contiguous buffers of one numpy dtype) the rows are checked and every buffer's entries move
    in ONE compiled call (``compiled_tree.keep_rows``, over the buffers' numpy views, kept on the cache
    while the buffers stay) and the crop is a length; other caches move per tensor (on the CPU in a
    dtype numpy holds ``compiled.move_rows``, else ``index_select``) and are cut by ``crop_cache``.

    ``gather``: ``(arrays, out)``, or None: also ``out[i]`` = the rows ``path_rows[i]`` of the
    ``(k + 1, H_j)`` arrays side by side (``compiled_tree.gather_rows``: the verifier's features of
    the kept rows), in the same compiled call on the buffered cache.

    Raises:
        ValueError: if ``path_rows`` does not start at row 0 or is not increasing.
    """
    rows = path_rows if isinstance(path_rows, np.ndarray) else np.asarray(path_rows, dtype=np.int64)
    if rows.dtype != np.int64:
        rows = rows.astype(np.int64)
    n = int(rows.shape[0])
    layer: Any  # transformers' cache layers: attention layers hold keys/values, others are skipped
    kept = kept_entries(cache)
    if kept is not None:  # BufferedLayer on the CPU: check and move in one call, the crop a length
        layers, out = _NOTHING_GATHERED if gather is None else gather
        if compiled_tree.keep_rows(kept[3], rows, start, layers, out) >= 0:
            raise ValueError(f"path_rows must start at 0 and increase, got {rows.tolist()}")
        length = start + n
        for layer in kept[0]:
            layer._key_length = layer._value_length = length
        return
    path_rows = rows.tolist()
    if not path_rows or path_rows[0] != 0 or any(b <= a for a, b in zip(path_rows, path_rows[1:])):
        raise ValueError(f"path_rows must start at 0 and increase, got {path_rows}")
    if gather is not None:
        compiled_tree.gather_rows(gather[0], rows, gather[1])
    # increasing from 0: rows 0..n-1 stay in place (nothing moves), else some move down
    moved = rows if path_rows[-1] != n - 1 else None
    if moved is not None:  # move the path's entries down to start, start + 1, ...
        index = None
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None or not layer.keys.numel():
                continue
            keys = layer.keys
            if keys.device.type == "cpu" and keys.dtype in _NUMPY_DTYPES and keys.dim() == 4 and not keys.requires_grad:
                compiled.move_rows(layer.keys.numpy(), moved, start)  # in place
                compiled.move_rows(layer.values.numpy(), moved, start)
                continue
            if index is None or index.device != layer.keys.device:
                index = torch.tensor(path_rows, dtype=torch.long, device=layer.keys.device) + start
            layer.keys[..., start : start + n, :] = layer.keys.index_select(-2, index)
            layer.values[..., start : start + n, :] = layer.values.index_select(-2, index)
    crop_cache(cache, start + n)


def keep_nodes(kept: tuple, start: int, nodes: np.ndarray, m: int, layers: tuple, out: np.ndarray) -> None:
    """``keep_path`` on the verifier's buffered cache in its host form ``kept`` (``kept_entries``, current:
    the caller checked it after the pass), with the kept rows as the accepted path: the pending token's
    row and the rows of tree nodes ``nodes[:m]`` (``(>= m,) int64``, increasing) move to positions
    ``start .. start + m`` in ONE compiled call over the buffers' addresses (``compiled_tree.keep_nodes``),
    which also gathers those rows of ``layers`` (``(1, k + 1, H_j)`` arrays) into ``out`` ``(m + 1, sum
    H_j)`` (no rows: nothing gathered); the crop is a length.

    Raises:
        ValueError: if ``nodes[:m]`` is not increasing from 0 or above, a node lies past a buffer's
            room or past the rows of ``layers``, or ``out`` is too small (nothing moved).
    """
    if not 0 <= m <= nodes.shape[0]:
        raise ValueError(f"keep_nodes: m={m} kept nodes, but nodes holds {nodes.shape[0]}")
    broken = compiled_tree.keep_nodes(kept[4], nodes, m, start, layers, out)
    if broken >= 0:
        raise _refused(broken, kept, start, nodes, m, layers, out)
    length = start + 1 + m
    for layer in kept[0]:
        layer._key_length = layer._value_length = length


def _refused(
    broken: int, kept: tuple, start: int, nodes: np.ndarray, m: int, layers: tuple, out: np.ndarray
) -> ValueError:
    """``keep_nodes``' error for ``compiled_tree.keep_nodes``' answer ``broken`` (>= 0)."""
    capacity = int(kept[4][:, 2].min()) if kept[4].shape[0] else 0
    if broken == m + 1:
        return ValueError(f"keep_nodes: start={start}, but the cache holds {capacity} positions")
    if broken == m:  # (a node that breaks the rule is one of the first m)
        arrays = ", ".join(f"{a.shape} {a.dtype}" for a in layers)
        return ValueError(
            f"keep_nodes: out {out.shape} {out.dtype} cannot hold the {m + 1} kept rows of the features "
            f"({arrays}) side by side"
        )
    rows = f" ({min(a.shape[1] for a in layers) - 1} tree nodes)" if out.shape[0] and layers else ""
    return ValueError(
        f"the kept nodes must be >= 0, increase and lie within the pass's rows{rows} and the cache's room "
        f"(capacity {capacity} positions, start {start}), got {nodes[:m].tolist()}"
    )


#: ``keep_path``'s gather when there is none (``compiled_tree.keep_rows`` then gathers no row)
_NOTHING_GATHERED = ((np.empty((0, 0), dtype=np.float32),), np.empty((0, 0), dtype=np.float32))
_KEY_BUFFER, _VALUE_BUFFER = operator.attrgetter("_key_buffer"), operator.attrgetter("_value_buffer")


def kept_entries(cache: DynamicCache) -> tuple | None:
    """The host form of the verifier's buffered cache, when every layer of ``cache`` is a ``BufferedLayer``
    holding C-contiguous 4-D CPU buffers of one numpy dtype (``host_buffers``); else None. A tuple:
    ``(layers, key buffers, value buffers, numpy views, layouts, capacity)`` -- one entry per layer in
    the first three, the views keys then values per layer, ``layouts`` ``(2L, 4) int64`` their (address
    of the data, ``b * heads``, ``C``, ``d * itemsize``) (``compiled_tree.keep_nodes``), and
    ``capacity`` the positions every buffer holds (tokens; 0 unless every buffer has batch 1): a batch-1
    pass ending at or below it writes into these same buffers (``BufferedLayer.update`` grows none).
    Kept on the cache and reused while its layers and their buffers are the same objects (a buffer
    that grows is a new one) and the first buffer's data is where the layouts say (a deep copy of the
    cache copies this tuple with its original's addresses), which this checks at every call."""
    layers = cache.layers
    held = cache.__dict__.get("_specpolicy_kept_entries")
    if (
        held is not None
        and len(layers) == len(held[0])
        and all(map(operator.is_, layers, held[0]))
        and all(map(operator.is_, map(_KEY_BUFFER, layers), held[1]))
        and all(map(operator.is_, map(_VALUE_BUFFER, layers), held[2]))
        and held[4][0, 0] == held[1][0].data_ptr()  # a deep copy of the cache holds its original's addresses
    ):
        return held
    buffered = []
    for layer in layers:
        views = layer.host_buffers() if type(layer) is BufferedLayer else None
        if views is None:
            return None
        buffered.append((layer, *views))
    if not buffered:
        return None
    arrays = tuple(a for _, keys, values in buffered for a in (keys, values))
    first = arrays[0]
    if any(a.dtype != first.dtype or not a.flags.c_contiguous for a in arrays):
        return None
    layer_tuple = tuple(layer for layer, _, _ in buffered)
    addresses = np.array([a.ctypes.data for a in arrays], dtype=np.int64)
    shapes = np.array([a.shape for a in arrays], dtype=np.int64)
    capacity = int(shapes[:, 2].min()) if (shapes[:, 0] == 1).all() else 0
    layouts = np.stack((addresses, shapes[:, 0] * shapes[:, 1], shapes[:, 2], shapes[:, 3] * first.itemsize), axis=1)
    held = (
        layer_tuple,
        tuple(map(_KEY_BUFFER, layer_tuple)),
        tuple(map(_VALUE_BUFFER, layer_tuple)),
        arrays,
        layouts,
        capacity,
    )
    cache.__dict__["_specpolicy_kept_entries"] = held
    return held


def cache_layers(cache: DynamicCache) -> list:
    """The cache's layers that hold keys and values (transformers 5 may list empty ones)."""
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]


def padded_cache(caches: list[DynamicCache]) -> tuple[DynamicCache, list[int]]:
    """Several requests' batch-1 caches as one batch (the drafters' ``draft_many``): per layer one
    ``(b, kv_heads, W, head_dim)`` tensor, ``W`` the longest cache, row i's columns ``[0, L_i)``
    its own cache and the rest zeros (to be masked out). A copy: the requests' caches are left as
    they are.

    Returns:
        ``(the padded cache, [L_i] in tokens)``; an empty cache when every ``L_i`` is 0.
    """
    lengths = [c.get_seq_length() for c in caches]
    width, out = max(lengths), DynamicCache()
    if not width:
        return out, lengths
    template = cache_layers(caches[lengths.index(width)])
    per_request = [cache_layers(c) if n else None for c, n in zip(caches, lengths)]
    for j, t in enumerate(template):
        keys, values = [], []
        for layers, n in zip(per_request, lengths):
            if layers is None:  # an empty cache: a row of zeros
                keys.append(t.keys.new_zeros((1, *t.keys.shape[1:])))
                values.append(t.values.new_zeros((1, *t.values.shape[1:])))
            else:
                pad = (0, 0, 0, width - n)
                keys.append(torch.nn.functional.pad(layers[j].keys, pad))
                values.append(torch.nn.functional.pad(layers[j].values, pad))
        out.update(torch.cat(keys), torch.cat(values), j)
    return out, lengths


def append_columns(cache: DynamicCache, batch: DynamicCache, row: int, columns: torch.Tensor | slice) -> None:
    """Append row ``row``'s entries at ``columns`` of a padded ``batch`` cache (``padded_cache``
    after a pass over it) to a request's own batch-1 ``cache``, in place, every layer."""
    mine = cache_layers(cache)
    for j, layer in enumerate(cache_layers(batch)):
        k, v = layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns]
        if mine:
            mine[j].keys = torch.cat([mine[j].keys, k], dim=2)
            mine[j].values = torch.cat([mine[j].values, v], dim=2)
        else:  # an empty cache gets its layers
            cache.update(k, v, j)
