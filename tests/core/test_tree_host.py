"""The tree round's host steps on the CPU, each one compiled call (``specpolicy.core.compiled_tree``:
``tree_inputs``, ``keep_rows``, ``gather_rows``, ``host_tree_level``, ``greedy_nodes``, ``keep_nodes``)
against the code they replace (``tree.verification_layout``, ``keep_path`` per layer, ``select_features``,
``GrowingTree`` + ``NodeRows``, ``tree.greedy_path``), on random trees, chains and bushes, over several
rounds. Outputs must be IDENTICAL."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specpolicy.core import tree
from specpolicy.core.cache import buffered_cache, keep_path
from specpolicy.core.features import select_features
from specpolicy.verifiers.hf import HFVerifier


def _random_parents(rng: np.random.Generator, k: int, kind: str) -> np.ndarray:
    if kind == "chain":
        return np.arange(-1, k - 1, dtype=np.int64)
    if kind == "bush":  # every node under the root
        return np.full(k, -1, dtype=np.int64)
    return np.array([int(rng.integers(-1, i)) for i in range(k)], dtype=np.int64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["any", "chain", "bush"])
def test_host_inputs_are_the_layout_and_the_input(seed, kind):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        k, start = int(rng.integers(1, 70)), int(rng.integers(0, 40))
        parents = _random_parents(rng, k, kind)
        tokens = rng.integers(0, 1000, k).astype(np.int64)
        pending = rng.integers(0, 1000, 1).astype(np.int64)
        inputs, positions, mask = tree.host_inputs(parents, tokens, pending, start)
        ref_positions, ref_mask = tree.verification_layout(parents.tolist(), start, "cpu", heads=True)
        assert inputs.shape == (1, k + 1) and inputs[0, 0] == pending[0] and (inputs[0, 1:] == tokens).all()
        assert torch.equal(torch.from_numpy(positions), ref_positions)
        assert torch.equal(torch.from_numpy(mask), ref_mask)


def test_host_inputs_refuse_a_parent_that_is_not_earlier():
    for parents in ([-1, 0, 2], [-1, -2], [1]):
        with pytest.raises(ValueError, match=f"node {len(parents) - 1} has parent {parents[-1]}"):
            tree.host_inputs(
                np.array(parents, dtype=np.int64), np.zeros(len(parents), dtype=np.int64), np.zeros(1, np.int64), 3
            )


def _filled(cache: DynamicCache, widths: list[int], seed: int, dtype=torch.float32) -> None:
    g = torch.Generator().manual_seed(seed)
    for n in widths:
        for layer in range(3):
            k = torch.randn(1, 2, n, 4, generator=g).to(dtype)
            cache.update(k, torch.randn(1, 2, n, 4, generator=g).to(dtype), layer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keep_path_in_one_call_keeps_what_a_dynamic_cache_keeps_over_rounds(dtype):
    """``keep_path`` on a buffered cache (one ``keep_rows`` call over every buffer, the entries kept
    on the cache across rounds and buffers that grow) against ``DynamicCache``'s tensor path."""
    rng = np.random.default_rng(5)
    buffered, dynamic = buffered_cache(4), DynamicCache()
    _filled(buffered, [5], 1, dtype)
    _filled(dynamic, [5], 1, dtype)
    for round_ in range(12):
        start, width = buffered.get_seq_length(), int(rng.integers(1, 9))
        _filled(buffered, [width], 10 + round_, dtype)  # a pass: grows the buffers now and then
        _filled(dynamic, [width], 10 + round_, dtype)
        rows = np.sort(rng.choice(np.arange(1, width), size=int(rng.integers(0, width)), replace=False))
        path = np.concatenate(([0], rows)).astype(np.int64)
        keep_path(buffered, start, path if round_ % 2 else path.tolist())
        keep_path(dynamic, start, path.tolist())
        assert buffered.get_seq_length() == dynamic.get_seq_length() == start + len(path)
        for a, b in zip(buffered.layers, dynamic.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), (round_, path)
    for bad in ([1, 2], [0, 2, 2], []):
        with pytest.raises(ValueError, match="path_rows must start at 0 and increase"):
            keep_path(buffered, 2, bad)


@pytest.mark.parametrize("strided", [False, True])
def test_tree_features_gathered_with_the_path_are_select_features(strided):
    """The verifier's features of the kept rows, gathered in ``keep_path``'s call (``_host_features``
    then ``compiled_tree.keep_rows``, or ``gather_rows`` after the move on another cache), against
    ``select_features``, on contiguous hidden states and on the compiled runtime's transposed view."""
    g = torch.Generator().manual_seed(3)
    if strided:  # (n, L + 1, H) static states seen as (L + 1, 1, n, H)
        states = torch.randn(9, 5, 6, generator=g)
        hidden = states.transpose(0, 1)[:, None]
    else:
        hidden = tuple(torch.randn(1, 9, 6, generator=g) for _ in range(5))
    for layers in ((0, 2, 4), (3,), (4, 1)):
        verifier = SimpleNamespace(_feature_layers=layers)
        for rows in ([0], [0, 1, 2], [0, 3, 7, 8]):
            for cache in (buffered_cache(4), DynamicCache()):
                _filled(cache, [3, 9], 4)
                gather = HFVerifier._host_features(verifier, hidden, len(rows), torch.device("cpu"))
                keep_path(cache, 3, np.array(rows, dtype=np.int64), gather)
                assert torch.equal(torch.from_numpy(gather[1]), select_features(hidden, layers, torch.tensor(rows)))
    assert (
        HFVerifier._host_features(verifier, tuple(h.to(torch.bfloat16) for h in hidden), 2, torch.device("cpu")) is None
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_tree_is_growing_tree_and_node_rows_over_rounds(seed, dtype):
    """``HostTree`` (one compiled call a level, buffers kept across rounds) against ``GrowingTree``
    and ``NodeRows``: the same node numbers, positions, mask rows and gathered outputs, rounds
    whose committed length crosses the buffers' columns and trees past the first capacity."""
    rng = np.random.default_rng(seed)
    host, committed = tree.HostTree(6, dtype, capacity=3), 1
    for _ in range(8):
        committed += int(rng.integers(1, 200))
        root = rng.standard_normal((1, 6)).astype(dtype)
        host.reset(committed, root)
        grown, rows = tree.GrowingTree(committed, "cpu", capacity=2), tree.NodeRows(torch.from_numpy(root.copy()))
        size = 0
        for _level in range(int(rng.integers(1, 6))):
            m = int(rng.integers(1, 6))
            parents = rng.integers(0, size + 1, m).astype(np.int64)
            nodes, positions, mask, hidden = host.add(parents)
            ref_nodes, ref_positions, ref_mask = grown.add(torch.from_numpy(parents))
            assert np.array_equal(nodes, ref_nodes.numpy()) and np.array_equal(positions, ref_positions.numpy())
            assert np.array_equal(mask, ref_mask.numpy())
            assert np.array_equal(hidden, rows.take(torch.from_numpy(parents)).numpy())
            out = rng.standard_normal((m, 6)).astype(dtype)
            host.outputs(out)
            rows.append(torch.from_numpy(out.copy()))
            size += m
        with pytest.raises(ValueError, match="is not a node of the tree"):
            host.add(np.array([size + 1], dtype=np.int64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["any", "chain", "bush"])
def test_greedy_nodes_is_greedy_path(seed, kind):
    """``tree.greedy_nodes`` (one compiled call, the verifier's host path) against ``tree.greedy_path``'s
    tensor ops, on trees whose tokens mostly agree with the target (long paths, many equally deep ties)."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        k = int(rng.integers(1, 24))
        parents = _random_parents(rng, k, kind)
        target = rng.integers(0, 3, k + 1)  # a small vocabulary: agreement everywhere, ties between siblings
        tokens = np.where(rng.random(k) < 0.8, target[parents + 1], rng.integers(0, 3, k)).astype(np.int64)
        nodes = np.full(k + 2, -7, dtype=np.int64)
        path = tree.greedy_nodes(parents, tokens, target, nodes)
        expected = tree.greedy_path(torch.from_numpy(parents), torch.from_numpy(tokens), torch.from_numpy(target))
        assert path == expected
        assert nodes[: len(path)].tolist() == list(path) and (nodes[len(path) :] == -7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keep_nodes_keeps_what_keep_path_keeps_with_the_features(dtype):
    """``keep_nodes`` (the buffers moved by address, the features gathered, in one call) against
    ``keep_path`` and ``select_features``, over rounds of random paths on a cache of three layers whose
    buffers grow on the way; then a path that does not increase is refused, nothing moved."""
    from specpolicy.core.cache import keep_nodes, kept_entries

    rng = np.random.default_rng(5)
    g = torch.Generator().manual_seed(5)
    fast, slow = buffered_cache(8), buffered_cache(8)
    _filled(fast, [3], 40, dtype)
    _filled(slow, [3], 40, dtype)
    start = 3
    for _ in range(12):
        k = int(rng.integers(1, 9))
        nodes = np.sort(rng.choice(k, int(rng.integers(0, k + 1)), replace=False)).astype(np.int64)
        m = len(nodes)
        hidden = tuple(torch.randn(1, k + 1, w, generator=g).to(dtype) for w in (5, 3))
        for layer in range(3):  # the pass: k + 1 new positions after start, the same in both caches
            keys, values = torch.randn(2, 1, 2, k + 1, 4, generator=g).to(dtype)
            fast.update(keys, values, layer)
            slow.update(keys.clone(), values.clone(), layer)
        buffer = np.concatenate((nodes, [99, 99])).astype(np.int64)  # longer than the path
        out = np.empty((m + 1, 8), dtype=hidden[0].numpy().dtype)
        keep_nodes(kept_entries(fast), start, buffer, m, tuple(h.numpy() for h in hidden), out)
        rows = np.concatenate(([0], nodes + 1)).astype(np.int64)
        keep_path(slow, start, rows)
        for a, b in zip(fast.layers, slow.layers):
            assert a.length == b.length == start + m + 1
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert torch.equal(torch.from_numpy(out), select_features(hidden, (0, 1), torch.from_numpy(rows)))
        start += m + 1
    held = [layer.keys.clone() for layer in fast.layers]
    no_features = (np.empty((1, 0, 0), dtype=np.float32),)
    with pytest.raises(ValueError, match="must be >= 0, increase"):
        keep_nodes(kept_entries(fast), start - 3, np.array([2, 1], dtype=np.int64), 2, no_features, np.empty((0, 0)))
    # a node past the cache's room, a node past the pass's rows of features, features with no room: refused
    kept = kept_entries(fast)
    room = int(kept[4][:, 2].min()) - start - 1
    with pytest.raises(ValueError, match=r"within the pass's rows and the cache's room \(capacity"):
        keep_nodes(kept, start, np.array([1, room], dtype=np.int64), 2, no_features, np.empty((0, 0)))
    hidden = (np.zeros((1, 4, 5), dtype=np.float32),)  # a pass of k = 3 nodes
    with pytest.raises(ValueError, match=r"within the pass's rows \(3 tree nodes\)"):
        keep_nodes(kept, start, np.array([1, 3], dtype=np.int64), 2, hidden, np.empty((3, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="cannot hold the 3 kept rows"):
        keep_nodes(kept, start, np.array([1, 2], dtype=np.int64), 2, hidden, np.empty((2, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="cannot hold the 3 kept rows"):
        keep_nodes(kept, start, np.array([1, 2], dtype=np.int64), 2, hidden, np.empty((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="cannot hold the 3 kept rows"):  # another item size than the features'
        keep_nodes(kept, start, np.array([1, 2], dtype=np.int64), 2, hidden, np.empty((3, 5), dtype=np.float64))
    with pytest.raises(ValueError, match="m=3 kept nodes, but nodes holds 2"):
        keep_nodes(kept, start, np.array([1, 2], dtype=np.int64), 3, no_features, np.empty((0, 0)))
    with pytest.raises(
        ValueError, match=rf"start={start + room + 1}, but the cache holds"
    ):  # no room for the pending token
        keep_nodes(kept, start + room + 1, np.empty(0, dtype=np.int64), 0, no_features, np.empty((0, 0)))
    assert all(torch.equal(layer.keys, h) for layer, h in zip(fast.layers, held))
