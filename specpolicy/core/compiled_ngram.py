"""Compiled host kernels of the n-gram trie's lookups by hash (``NGramModel.trie_hash``, DART's tree
searches in ``policies/dart_tree.py``; issue 48 item 5): open-addressing tables of the trie's entries
built once per model, and a lookup that finds what a leftmost binary search of an order's sorted keys
finds (``tests/policies/test_dart_tree_equivalence.py`` checks it on random tries). ``numba`` ``njit``
functions cached on disk (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _trie_slot(key: int, mask: int) -> int:
    """A key's first slot in a table of ``mask + 1`` slots (Fibonacci hashing's multiplier, the
    product's middle bits; int64 wraps)."""
    return ((key * 2654435761) >> 16) & mask


@njit(cache=True)
def trie_hash(keys: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Open-addressing tables of the trie's entries (``NGramModel.compiled_trie``'s ``keys`` ``(E,)
    int64``, sorted within each order, order j's from ``starts[j]``): per order a power-of-two region
    of at least twice its entries, each slot ``(key, index into keys)`` (``-1, -1`` empty; a key held
    twice keeps its first index, as a leftmost search finds it). Returns the table ``(S, 2) int64``
    and each order's first slot ``(orders + 1,) int64`` (``trie_find`` reads them)."""
    orders = starts.shape[0] - 1
    offsets = np.zeros(orders + 1, dtype=np.int64)
    for j in range(orders):
        size = 1
        while size < 2 * (starts[j + 1] - starts[j]):
            size *= 2
        offsets[j + 1] = offsets[j] + size
    table = np.full((offsets[orders], 2), -1, dtype=np.int64)
    for j in range(orders):
        first, mask = offsets[j], offsets[j + 1] - offsets[j] - 1
        for i in range(starts[j], starts[j + 1]):
            slot = _trie_slot(keys[i], mask)
            while table[first + slot, 0] != -1 and table[first + slot, 0] != keys[i]:
                slot = (slot + 1) & mask
            if table[first + slot, 0] == -1:
                table[first + slot, 0], table[first + slot, 1] = keys[i], i
    return table, offsets


@njit(cache=True, inline="always")
def trie_find(table: np.ndarray, offsets: np.ndarray, order: int, key: int) -> int:
    """The index into the trie's keys of ``key`` among order ``order``'s entries (``trie_hash``'s
    tables; ``order`` 0: 1-grams), or -1: what a search of that order's sorted keys finds."""
    first, mask = offsets[order], offsets[order + 1] - offsets[order] - 1
    slot = _trie_slot(key, mask)
    while True:
        held = table[first + slot, 0]
        if held == key:
            return table[first + slot, 1]
        if held == -1:
            return -1
        slot = (slot + 1) & mask
