"""Target features computed once: the target's hidden states over the training sequences, on disk.

The drafters conditioned on the target (DFlash, EAGLE-3) train on the target's hidden states at
every position of every training sequence. Computing them takes one forward pass of the target
per sequence; storing them lets every epoch of every drafter reuse that pass (the FailFast and
DFlash recipes do the same offline: SpecForge's "offline" mode).

Layout of a store directory:

* ``store.json``: ``{"target", "layers", "hidden_size", "offsets", "lengths", "dtype"}`` --
  ``layers`` are Hugging Face ``hidden_states`` indices (0 = embeddings, i = output of decoder
  layer i - 1), ``offsets[e]`` / ``lengths[e]`` the rows of example ``e``;
* ``hs{i}.bin``: for each index ``i``, a ``(sum(lengths), hidden_size)`` bfloat16 array (raw
  bits, read through ``numpy.memmap`` as int16 and viewed as ``torch.bfloat16``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from specpolicy.family.data import Example


def extract_features(
    target_dir: str | Path,
    examples: Sequence[Example],
    layers: Sequence[int],
    out_dir: str | Path,
    batch_tokens: int = 8192,
    log_every: int = 20,
    device: str = "cpu",
) -> dict:
    """Run the target (float32, as inference runs it) over ``prompt + response`` of every example
    and store ``hidden_states[i]`` for each ``i`` in ``layers``.

    Args:
        target_dir: the target model directory (a family ``save_pretrained`` dir).
        examples: the training sequences, in the order of their example indices.
        layers: ``hidden_states`` indices to keep.
        out_dir: the store directory (created; existing files are overwritten).
        batch_tokens: padded tokens per forward pass.
        device: where the target runs (``"cpu"``, ``"cuda"``).
    Returns:
        stats: ``n``, ``tokens``, ``layers``, ``wall_s``, ``tokens_per_s``, ``gb``.
    Raises:
        ValueError: an empty example list or an index outside the target's hidden states.
    """
    from specpolicy.family.models import load_model

    if not examples:
        raise ValueError("no examples to extract features from")
    model = load_model(target_dir).to(device)
    n_states = model.config.num_hidden_layers + 1
    layers = sorted(set(int(i) for i in layers))
    if any(not 0 <= i < n_states for i in layers):
        raise ValueError(f"hidden_states indices {layers} outside 0..{n_states - 1}")
    hidden = int(model.config.hidden_size)
    lengths = [len(e) for e in examples]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(sum(lengths))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    maps = {i: np.memmap(out / f"hs{i}.bin", dtype=np.int16, mode="w+", shape=(total, hidden)) for i in layers}
    order = sorted(range(len(examples)), key=lambda e: lengths[e])  # ascending: a batch's last is its longest
    batches: list[list[int]] = [[]]
    for e in order:
        if batches[-1] and (len(batches[-1]) + 1) * lengths[e] > batch_tokens:
            batches.append([])
        batches[-1].append(e)
    t0, done = time.time(), 0
    for batch_no, take in enumerate(batches, 1):
        longest = lengths[take[-1]]
        ids = torch.zeros((len(take), longest), dtype=torch.long)
        mask = torch.zeros((len(take), longest), dtype=torch.long)
        for r, e in enumerate(take):
            seq = examples[e].prompt_ids + examples[e].response_ids
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, : len(seq)] = 1
        with torch.no_grad():
            states = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, logits_to_keep=1
            ).hidden_states
        for i in layers:
            bits = states[i].to(torch.bfloat16).cpu().view(torch.int16).numpy()
            for r, e in enumerate(take):
                maps[i][offsets[e] : offsets[e] + lengths[e]] = bits[r, : lengths[e]]
        done += sum(lengths[e] for e in take)
        if log_every and batch_no % log_every == 0:
            el = time.time() - t0
            print(
                f"[features] {done}/{total} tokens, {done / el:.0f} tok/s, eta {el / done * (total - done):.0f}s",
                flush=True,
            )
    for m in maps.values():
        m.flush()
    meta = {
        "target": str(target_dir),
        "layers": layers,
        "hidden_size": hidden,
        "dtype": "bfloat16",
        "offsets": offsets.tolist(),
        "lengths": lengths,
    }
    (out / "store.json").write_text(json.dumps(meta), encoding="utf-8")
    wall = time.time() - t0
    return {
        "n": len(examples),
        "tokens": total,
        "layers": layers,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(total / max(wall, 1e-9), 1),
        "gb": round(total * hidden * 2 * len(layers) / 1e9, 2),
    }


class FeatureStore:
    """Read access to a store written by :func:`extract_features`.

    Args:
        directory: the store directory.
    Raises:
        FileNotFoundError: no ``store.json`` there.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        meta = json.loads((self.directory / "store.json").read_text(encoding="utf-8"))
        self.layers: list[int] = meta["layers"]
        self.hidden_size: int = meta["hidden_size"]
        self.offsets = np.asarray(meta["offsets"], dtype=np.int64)
        self.lengths = np.asarray(meta["lengths"], dtype=np.int64)
        total = int(self.lengths.sum())
        self._maps = {
            i: np.memmap(self.directory / f"hs{i}.bin", dtype=np.int16, mode="r", shape=(total, self.hidden_size))
            for i in self.layers
        }

    def __len__(self) -> int:
        return len(self.lengths)

    def select(self, indices: Sequence[int]) -> FeatureStore:
        """A view of examples ``indices`` (its example i is this store's ``indices[i]``), sharing the files."""
        view = object.__new__(FeatureStore)
        view.directory, view.layers, view.hidden_size, view._maps = (
            self.directory,
            self.layers,
            self.hidden_size,
            self._maps,
        )
        view.offsets, view.lengths = self.offsets[list(indices)], self.lengths[list(indices)]
        return view

    def batch(
        self, indices: Sequence[int], layers: Sequence[int], length: int, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Features of examples ``indices``, right-padded with zeros to ``length`` positions.

        Args:
            indices: example indices (rows of the batch).
            layers: stored ``hidden_states`` indices, concatenated in this order.
            length: padded length L (>= every example's length).
            dtype: of the result: float32 (default), or bfloat16 as stored (no conversion: half the
                bytes to move to a device, widened there).
        Returns:
            ``(len(indices), L, len(layers) * hidden_size)`` ``dtype``, on the CPU.
        Raises:
            KeyError: a layer that is not stored.
        """
        H = self.hidden_size
        out = np.zeros((len(indices), length, len(layers) * H), dtype=np.int16)
        for r, e in enumerate(indices):
            o, n = int(self.offsets[e]), int(self.lengths[e])
            for j, i in enumerate(layers):
                out[r, :n, j * H : (j + 1) * H] = self._maps[i][o : o + n]
        return torch.from_numpy(out).view(torch.bfloat16).to(dtype)
