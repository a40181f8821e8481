"""A token n-gram language model: the causal scorer of DiffuSpec's path search and of DART's tree
pruning, built once from a corpus file and loaded from a local file.

Two rules read the same counts:

* ``trie_probs`` -- DART's lookup (arXiv 2601.19278; official code ``fvliang/DART``,
  ``cpplib/.../trie_ngram.cpp::get_probability``): from the longest suffix of the context (order - 1
  tokens, then fewer) that has the token as a child, ``p = count(context suffix + token) /
  count(context suffix)``; no smoothing, no unigram fall-back: a token never seen after any suffix
  gets 0 (the search then takes ``log(p + 1e-10)``). A node's count in DART's trie is the number of
  order-token windows passing through it, which is the raw n-gram count used here.
* ``log_probs`` -- an interpolated Kneser-Ney model (Chen & Goodman 1998, §3.5; one discount per
  order, ``D = n1 / (n1 + 2 n2)``), the smoothed back-off model DiffuSpec (arXiv 2510.02358, §3.2)
  scores paths with (the paper uses KenLM's modified Kneser-Ney). Every context gives a proper
  distribution over the vocabulary (it sums to 1), unseen tokens included.

Why not a library: KenLM needs a C++ build and answers one string at a time; ``nltk.lm`` is pure
Python per query. Both searches score a whole lattice or beam front at once, so the counts live
here as sorted int64 codes and every lookup is one ``searchsorted`` over an array of n-grams: a
``(B, C)`` candidate block costs a few array calls, not ``B x C`` Python calls (DART's best-first
path, which scores a few candidates at a time, reads the same counts as dicts: ``trie_tables``).

Documents are padded on the left with ``order - 1`` start symbols (id ``vocab_size``), so the first
tokens of a document have a full context; a query's positions before the start are the same
symbol (``pad_context``). The file (``.npz``, numpy's zip of arrays, compressed: about 0.7 MB for
GSM8K's training answers) holds the sorted n-gram codes delta-encoded, their counts, and a JSON
header naming the tokenizer's vocabulary (size and SHA-256) so a file built for another tokenizer
is refused. Build one with::

    python -m specpolicy.models.ngram --corpus train.jsonl --field answer --tokenizer DIR --out lm.npz
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specpolicy.core import compiled, compiled_ngram
from specpolicy.core.errors import ConfigError
from specpolicy.core.path_search import PathSearch

FORMAT = "specpolicy-ngram/1"


def vocabulary_sha256(vocab: dict[str, int]) -> str:
    """SHA-256 of a tokenizer's vocabulary (``tokenizer.get_vocab()``: token -> id), as hex."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode("utf-8")).hexdigest()


def _codes(windows: Any, base: int) -> Any:
    """``(..., n)`` int64 token windows, ``n >= 1`` (a tensor or a numpy array) -> ``(...)`` int64 codes
    (base-``base`` digits, first token first)."""
    code = windows[..., 0]
    for i in range(1, windows.shape[-1]):
        code = code * base + windows[..., i]
    return code


def _lookup(keys: Any, values: Any, codes: Any) -> Any:
    """``values`` at ``codes`` in the sorted ``keys``; 0 where a code is absent (same shape as ``codes``).
    numpy arrays, or CPU tensors (answered with a tensor): one ``searchsorted``."""
    if isinstance(codes, torch.Tensor):
        return torch.from_numpy(_lookup(keys.numpy(), values.numpy(), codes.numpy()))
    if keys.size == 0:
        return np.zeros(codes.shape, dtype=values.dtype)
    at = np.minimum(np.searchsorted(keys, codes), keys.size - 1)
    return np.where(keys[at] == codes, values[at], values.dtype.type(0))


def _group(codes: torch.Tensor, counts: torch.Tensor, base: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group n-gram codes by their (n-1)-token prefix: (prefix codes, count sums, distinct continuations)."""
    prefixes, inverse = torch.unique_consecutive(torch.div(codes, base, rounding_mode="floor"), return_inverse=True)
    totals = torch.zeros(prefixes.numel(), dtype=torch.long).index_add_(0, inverse, counts)
    types = torch.bincount(inverse, minlength=prefixes.numel())
    return prefixes, totals, types


def _discount(counts: torch.Tensor) -> float:
    """Ney's absolute discount ``n1 / (n1 + 2 n2)`` from the count-of-counts (0.5 when undefined)."""
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 + n2 > 0 and n1 > 0 else 0.5


@dataclass
class NGramModel:
    """Counts of every n-gram of orders 1..``order`` in a corpus (see the module docstring).

    Attributes:
        order: the longest n-gram (3 for both DiffuSpec and DART).
        vocab_size: the tokenizer's vocabulary size; token ids are ``0..vocab_size - 1``, and
            ``vocab_size`` itself is the start symbol.
        keys: ``keys[n - 1]``: the sorted int64 codes of the n-grams seen, n = 1..order.
        counts: ``counts[n - 1]``: int64 occurrences of each (aligned with ``keys``).
        header: what was built from what (format, order, vocab_size, tokenizer_sha256, corpus,
            documents, tokens).
    """

    order: int
    vocab_size: int
    keys: list[torch.Tensor]
    counts: list[torch.Tensor]
    header: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base = self.vocab_size + 1
        self._kn = self._kneser_ney_tables()
        self._fused = self._fused_tables()
        self._fused_np = (self._fused[0].numpy(), self._fused[1].numpy())  # views, for ``kneser_ney_probs``
        #: per order n: (discount, and for n = 1 the unigram totals and types), as Python floats
        self._kn_floats = [
            (float(t["discount"]), float(torch.as_tensor(t["totals"]).sum()), float(torch.as_tensor(t["types"]).sum()))
            for t in self._kn
        ]
        #: per context length j < order: the j-token prefixes of the (j + 1)-grams and how often each was followed
        self._followers = [_group(self.keys[j], self.counts[j], self.base)[:2] for j in range(1, self.order)]
        #: the same counts and follower sums as numpy arrays (views, no copy), for ``trie_probs_np``
        self._trie_arrays = (
            [(k.numpy(), c.numpy()) for k, c in zip(self.keys, self.counts)],
            [(k.numpy(), c.numpy()) for k, c in self._followers],
        )

    # -- building -------------------------------------------------------------------------------

    @classmethod
    def build(
        cls, documents: Iterable[Sequence[int]], vocab_size: int, order: int = 3, header: dict | None = None
    ) -> NGramModel:
        """Count the n-grams of ``documents`` (token id sequences, each ``0 <= id < vocab_size``).

        Raises:
            ValueError: ``order`` < 1, an order whose codes overflow int64 for this vocabulary, an
                id outside the vocabulary, or no tokens at all.
        """
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if 3 * order * (vocab_size + 1) ** order >= 2**63:  # the fused tables' keys (``_fused_tables``)
            largest = max(n for n in range(1, order) if 3 * n * (vocab_size + 1) ** n < 2**63) if order > 1 else 0
            raise ValueError(
                f"order {order} is too large for a vocabulary of {vocab_size} tokens (n-gram codes overflow "
                f"int64; at most {largest})"
            )
        base, start = vocab_size + 1, vocab_size
        per_order: list[list[torch.Tensor]] = [[] for _ in range(order)]
        documents_seen = tokens = 0
        for doc in documents:
            ids = torch.as_tensor(list(doc), dtype=torch.long)
            if ids.numel() == 0:
                continue
            if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
                raise ValueError(f"a token id outside 0..{vocab_size - 1} in document {documents_seen}")
            documents_seen, tokens = documents_seen + 1, tokens + ids.numel()
            padded = torch.cat([torch.full((order - 1,), start, dtype=torch.long), ids])
            for n in range(1, order + 1):
                # every window of n tokens ending at a real token (the start symbols only as context)
                windows = padded[order - n :].unfold(0, n, 1) if n > 1 else ids[:, None]
                per_order[n - 1].append(_codes(windows, base))
        if tokens == 0:
            raise ValueError("the corpus holds no tokens")
        keys, counts = [], []
        for chunks in per_order:
            unique, count = torch.unique(torch.cat(chunks), return_counts=True)
            keys.append(unique)
            counts.append(count.long())
        header = {
            "format": FORMAT,
            "order": order,
            "vocab_size": vocab_size,
            "documents": documents_seen,
            "tokens": tokens,
            **(header or {}),
        }
        return cls(order, vocab_size, keys, counts, header)

    # -- DART's trie rule -----------------------------------------------------------------------

    def pad_context(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The last ``order - 1`` tokens of ``tokens`` (prompt + path), start symbols in front when
        shorter: ``(order - 1,)`` int64."""
        t = (
            torch.as_tensor(tokens, dtype=torch.long).reshape(-1)[-(self.order - 1) :]
            if self.order > 1
            else torch.zeros(0, dtype=torch.long)
        )
        pad = torch.full((self.order - 1 - t.numel(),), self.vocab_size, dtype=torch.long)
        return torch.cat([pad, t])

    def count(self, ngrams: torch.Tensor) -> torch.Tensor:
        """Occurrences of each n-gram: ``ngrams`` ``(..., n)`` int64 with ``1 <= n <= order`` -> ``(...)`` int64."""
        n = ngrams.shape[-1]
        return _lookup(self.keys[n - 1], self.counts[n - 1], _codes(ngrams, self.base))

    def trie_probs(self, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """DART's n-gram probability of each candidate (``trie_ngram.cpp::get_probability``).

        Args:
            context: ``(B, order - 1)`` int64, the tokens before the candidates (``pad_context``).
            tokens: ``(B, C)`` int64 candidates.
        Returns:
            ``(B, C)`` float32: ``count(s + token) / count(s)`` for the longest context suffix ``s``
            (``order - 1`` tokens down to 1) after which the token was seen; 0 if after none.
        """
        return torch.from_numpy(self.trie_probs_np(context.cpu().numpy(), tokens.cpu().numpy()))

    def trie_probs_np(self, context: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``trie_probs`` on numpy arrays (the same values): ``context`` ``(B, order - 1)`` int64,
        ``tokens`` ``(B, C)`` int64 -> ``(B, C)`` float32. Compiled (``specpolicy.core.compiled.
        trie_probs``, one call): a tree search calls it once per depth on a few hundred
        candidates, where array calls' per-call cost was most of the time (DART's own search is
        host C++ for the same reason)."""
        return compiled.trie_probs(
            *self.compiled_trie(),
            self.base,
            np.ascontiguousarray(context, dtype=np.int64),
            np.ascontiguousarray(tokens, dtype=np.int64),
        )

    def compiled_trie(self) -> tuple[np.ndarray, ...]:
        """The trie rule's tables as ``specpolicy.core.compiled.trie_probs`` reads them: every order's
        sorted codes and counts concatenated, with each order's start ``(order + 1,) int64``, then
        the same for the followers of each j-token context (j = 1 .. order - 1). Built once, kept."""
        if not hasattr(self, "_trie_concat"):
            (counts, followers), concat = self._trie_arrays, []
            for tables in (counts, followers):
                sizes = [k.shape[0] for k, _ in tables]
                concat += [
                    np.concatenate([np.zeros(0, np.int64), *(k for k, _ in tables)]).astype(np.int64),
                    np.concatenate([np.zeros(0, np.int64), *(c for _, c in tables)]).astype(np.int64),
                    np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                ]
            self._trie_concat = tuple(concat)
        return self._trie_concat

    def trie_hash(self) -> tuple[np.ndarray, np.ndarray]:
        """``compiled_trie``'s entries by hash (``specpolicy.core.compiled_ngram.trie_hash``): the table ``(S,
        2) int64`` of ``(key, index)`` slots and each order's first slot ``(order + 1,) int64``, so a
        compiled search finds an entry in a probe or two instead of a binary search of its order's
        keys (``compiled_ngram.trie_find``; DART's tree searches). Built once, kept."""
        if not hasattr(self, "_trie_hash"):
            keys, _, starts = self.compiled_trie()[:3]
            self._trie_hash = compiled_ngram.trie_hash(keys, starts)
        return self._trie_hash

    def trie_logs(self, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """Each trie entry's ``log(p + eps)``, aligned with ``compiled_trie``'s concatenated keys, where
        ``p = count(s + token) / max(count(s), 1)`` is the probability the trie rule gives the entry
        (``trie_probs``; ``s`` its context, its own count else how often it was followed): ``(float32
        logs (E,), float64 logs (E,))``. The float32 ones are numpy's float32 log of the float32
        ``p + eps`` (as ``np.log(trie_probs_np(..) + np.float32(eps))`` takes them), the float64 ones
        Python's ``math.log`` of the float64 ``p + eps``, 0 where ``p >= 1`` (the best-first search's);
        1-gram entries (never a continuation) hold 0. A compiled search reads the log it needs
        instead of taking logs per depth (numba's ``log`` and numpy's float32 ``log`` differ in the
        last bit). Built once per ``eps``, kept.

        Raises:
            ValueError: for ``eps <= 0``.
        """
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        cache = self.__dict__.setdefault("_trie_logs", {})
        if eps not in cache:
            keys, counts, starts, follower_keys, follower_counts, follower_starts = self.compiled_trie()
            logs32, logs64 = np.zeros(keys.shape[0], np.float32), np.zeros(keys.shape[0], np.float64)
            for j in range(1, self.order):  # the (j + 1)-grams continue j-token contexts
                lo, hi = int(starts[j]), int(starts[j + 1])
                code = keys[lo:hi] // self.base  # each entry's context s
                parent = _lookup(keys[starts[j - 1] : starts[j]], counts[starts[j - 1] : starts[j]], code)
                f_lo, f_hi = follower_starts[j - 1], follower_starts[j]
                followed = _lookup(follower_keys[f_lo:f_hi], follower_counts[f_lo:f_hi], code)
                parent = np.where(parent > 0, parent, followed)
                child = counts[lo:hi]
                # float32, as compiled.trie_probs divides (counts through float64, as its lookups return them)
                p32 = child.astype(np.float64).astype(np.float32) / np.maximum(
                    parent.astype(np.float64).astype(np.float32), np.float32(1)
                )
                logs32[lo:hi] = np.log(p32 + np.float32(eps))
                p64 = child.astype(np.float64) / np.maximum(parent, 1).astype(np.float64)
                logs64[lo:hi] = [math.log(p + eps) if p < 1 else 0.0 for p in p64.tolist()]
            cache[eps] = (logs32, logs64)
        return cache[eps]

    def trie_tables(self) -> tuple[list[dict[int, int]], list[dict[int, int]]]:
        """The trie rule as Python dicts, for a search that scores a handful of candidates at a
        time (``dart-tree``'s best-first path), where a dict lookup (~0.1 us) beats any array call:
        ``(counts, parents)`` with ``counts[n - 1]`` the n-gram code -> count and ``parents[j - 1]``
        a j-token context code -> its trie count (its own count, else how often it was followed).
        Built once (about 0.1 s for GSM8K's) and kept."""
        if not hasattr(self, "_trie_dicts"):
            counts = [dict(zip(k.tolist(), c.tolist())) for k, c in zip(self.keys, self.counts)]
            parents = []
            for j in range(1, self.order):
                followed = dict(zip(self._followers[j - 1][0].tolist(), self._followers[j - 1][1].tolist()))
                followed.update(counts[j - 1])  # a counted context's own count wins (counts are > 0)
                parents.append(followed)
            self._trie_dicts = (counts, parents)
        return self._trie_dicts

    # -- interpolated Kneser-Ney ----------------------------------------------------------------

    def _kneser_ney_tables(self) -> list[dict[str, torch.Tensor | float]]:
        """Per order n (index n - 1): the counts the interpolated Kneser-Ney estimate reads. The
        highest order uses raw counts; lower orders continuation counts N1+(. w) (distinct left
        neighbours of the n-gram among the (n+1)-grams)."""
        tables: list[dict] = [{} for _ in range(self.order)]
        for n in range(self.order, 0, -1):
            if n == self.order:
                keys, counts = self.keys[n - 1], self.counts[n - 1]
            else:  # continuation counts: distinct tokens seen before the n-gram
                higher = self.keys[n]
                keys, counts = torch.unique(higher % self.base**n, return_counts=True)
                counts = counts.long()
            prefixes, totals, types = _group(keys, counts, self.base)
            tables[n - 1] = {
                "keys": keys,
                "counts": counts,
                "prefixes": prefixes,
                "totals": totals,
                "types": types,
                "discount": _discount(counts),
            }
        return tables

    def _fused_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every table ``log_probs`` reads as ONE sorted key array with its values (float64): table
        ``3 (n - 1)`` the order-n counts, ``+1`` / ``+2`` the order-n prefixes' totals / types; a key is
        ``table * base**order + code``. One ``searchsorted`` then answers a whole call's lookups."""
        offset = self.base**self.order
        keys, values = [], []
        for n, t in enumerate(self._kn, 1):
            for j, (k, v) in enumerate(
                ((t["keys"], t["counts"]), (t["prefixes"], t["totals"]), (t["prefixes"], t["types"]))
            ):
                keys.append(k + (3 * (n - 1) + j) * offset)
                values.append(v.to(torch.float64))
        return torch.cat(keys), torch.cat(values)

    def log_probs(self, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Interpolated Kneser-Ney log-probability of each candidate after its context.

        Every count the estimate reads (the candidates' n-grams and their prefixes' totals and
        types, all orders) is looked up in one ``searchsorted`` over ``_fused_tables``; the
        estimate is ``kneser_ney_probs`` (numpy: about a microsecond a call where torch takes
        several, and a path search makes one call per drafted position), its log taken by torch.

        Args:
            context: ``(B, order - 1)`` int64 (``pad_context``), on the CPU.
            tokens: ``(B, C)`` int64 candidates, each in ``0..vocab_size - 1``, on the CPU.
        Returns:
            ``(B, C)`` float32 natural-log probabilities; for any context they sum (in probability)
            to 1 over the vocabulary.
        """
        probs = self.kneser_ney_probs(context.cpu().numpy(), tokens.cpu().numpy())
        return torch.from_numpy(probs).log().to(torch.float32)

    def compiled_tables(self) -> tuple:
        """What the compiled Kneser-Ney scorer (``specpolicy.core.compiled.kneser_ney_row``) reads, in
        its argument order: the fused keys ``(T,) int64`` and values ``(T,) float64``
        (``_fused_tables``), each order's discount ``(order,) float64``, the unigram totals and
        types (floats), ``vocab_size``, ``base`` and ``order``. Built once and kept (views, no copy)."""
        if not hasattr(self, "_compiled_tables"):
            discounts = np.array([f[0] for f in self._kn_floats], dtype=np.float64)
            _, total, types = self._kn_floats[0]
            self._compiled_tables = (
                *self._fused_np,
                discounts,
                total,
                types,
                self.vocab_size,
                self.base,
                self.order,
            )
        return self._compiled_tables

    def kneser_ney_probs(self, context: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The interpolated Kneser-Ney probabilities ``log_probs`` takes the log of: ``context``
        ``(B, order - 1)`` int64, ``tokens`` ``(B, C)`` int64 -> ``(B, C)`` float64, C-contiguous.
        The same IEEE float64 operations, in the same order, as the torch form it replaced (kept
        in ``tests/models/test_ngram_equivalence.py``), so the values are bit-identical."""
        batch, width = tokens.shape
        offset, base = self.base**self.order, self.base
        queries, prefix = [tokens.reshape(-1)], np.zeros(batch, dtype=np.int64)
        for n in range(2, self.order + 1):
            prefix = context[:, -(n - 1)] * base ** (n - 2) + prefix  # the code of the last n - 1 context tokens
            table = 3 * (n - 1) * offset
            queries += [
                ((prefix[:, None] * base + tokens) + table).reshape(-1),
                prefix + table + offset,
                prefix + table + 2 * offset,
            ]
        sizes = [q.shape[0] for q in queries]
        values = np.split(_lookup(*self._fused_np, np.concatenate(queries)), np.cumsum(sizes)[:-1])
        d, total, types = self._kn_floats[0]
        probs = (np.maximum(values[0].reshape(batch, width) - d, 0.0) + d * types / self.vocab_size) / total
        for n in range(2, self.order + 1):  # each order's counts, its prefixes' totals and types
            count, total_n, types_n = (
                values[3 * n - 5].reshape(batch, width),
                values[3 * n - 4][:, None],
                values[3 * n - 3][:, None],
            )
            d = self._kn_floats[n - 1][0]
            mixed = (np.maximum(count - d, 0.0) + d * types_n * probs) / np.maximum(total_n, 1.0)
            probs = np.where(total_n > 0, mixed, probs)
        return np.ascontiguousarray(probs)

    # -- the file -------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the model as a compressed ``.npz`` (see the module docstring); returns the path."""
        arrays: dict[str, np.ndarray] = {"header": np.frombuffer(json.dumps(self.header).encode(), dtype=np.uint8)}
        for n in range(1, self.order + 1):
            keys = self.keys[n - 1]
            arrays[f"delta{n}"] = torch.diff(keys, prepend=keys.new_zeros(1)).numpy().astype(np.uint64)
            arrays[f"count{n}"] = self.counts[n - 1].numpy().astype(np.uint32)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
        return path


def load_ngram(path: str | Path, key: str = "ngram", vocab: dict[str, int] | None = None) -> NGramModel:
    """Read an n-gram model file written by ``NGramModel.save`` (or this module's command).

    Args:
        path: the ``.npz`` file.
        key: how the user named it, for messages (e.g. ``policy.ngram``).
        vocab: the run's tokenizer vocabulary (``tokenizer.get_vocab()``); when given, the file
            must have been built for the same one.
    Raises:
        ConfigError: one line naming ``key`` -- the file is missing, empty, not an n-gram file or
            corrupt, or built for another tokenizer.
    """
    path = Path(path).expanduser()
    build = "build one with: python -m specpolicy.models.ngram --corpus FILE --tokenizer DIR --out FILE"
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file ({build})")
    if path.stat().st_size == 0:
        raise ConfigError(f"{key}={str(path)!r}: the file is empty ({build})")
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            if header.get("format") != FORMAT:
                raise ValueError(f"format {header.get('format')!r}, expected {FORMAT!r}")
            order, vocab_size = int(header["order"]), int(header["vocab_size"])
            keys, counts = [], []
            for n in range(1, order + 1):
                k = torch.from_numpy(np.cumsum(data[f"delta{n}"].astype(np.uint64)).astype(np.int64))
                c = torch.from_numpy(data[f"count{n}"].astype(np.int64))
                if k.numel() != c.numel() or (k.numel() > 1 and not bool((k[1:] > k[:-1]).all())):
                    raise ValueError(f"the {n}-gram table is inconsistent")
                keys.append(k)
                counts.append(c)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}={str(path)!r}: not a readable n-gram model file ({exc}); {build}") from None
    if vocab is not None:
        want, got = vocabulary_sha256(vocab), header.get("tokenizer_sha256")
        if len(vocab) != vocab_size or (got is not None and got != want):
            raise ConfigError(
                f"{key}={str(path)!r}: built for another tokenizer (vocabulary of {vocab_size} tokens, "
                f"sha256 {str(got)[:12]}); the run's has {len(vocab)} tokens, sha256 {want[:12]}"
            )
    return NGramModel(order, vocab_size, keys, counts, header)


# -- the drafters' path-search settings ------------------------------------------------------------

#: ``drafter.path_search``: ``none`` (the drafter's own tokens) or ``cps`` (DiffuSpec's path search).
PATH_SEARCHES = ("none", "cps")
#: The path-search keys a block drafter accepts, with DiffuSpec's defaults (arXiv 2510.02358, App. A:
#: mass 0.8, 15 candidates, beam width 3, lambda 0.5, a 3-gram model of the task's training split).
PATH_SEARCH_DEFAULTS = {
    "path_search": "none",
    "ngram": "gsm8k-target",
    "cps_mass": 0.8,
    "cps_candidates": 15,
    "cps_width": 3,
    "cps_lambda": 0.5,
}
#: n-gram models bundled with the family (``specpolicy/family/bundle/ngram/<name>.npz``), both 3-gram models in
#: the family's tokenizer: ``gsm8k-target`` (the default), the target's own greedy continuations of GSM8K's
#: training questions (7,313 of them, the family pipeline's distilled data: ``python -m specpolicy.family
#: --stages distill --work W``, then ``python -m specpolicy.models.ngram --corpus W/distill/target_greedy.jsonl
#: --field response_ids``); ``gsm8k-train``, GSM8K's 7,473 human-written training answers, EOS-terminated
#: (DiffuSpec's choice: the task's training split).
BUNDLED_NGRAMS = ("gsm8k-target", "gsm8k-train")


def resolve_ngram_path(value: str) -> Path:
    """A bundled n-gram name's file, or ``value`` as a path."""
    if value in BUNDLED_NGRAMS:
        from specpolicy.models.loading import bundled_dir

        return bundled_dir() / "ngram" / f"{value}.npz"
    return Path(value).expanduser()


def check_path_search(config: dict, vocab: dict[str, int] | None = None) -> NGramModel | None:
    """Check a drafter's path-search keys (``PATH_SEARCH_DEFAULTS``) and, with ``path_search=cps``,
    read its n-gram file (checked against ``vocab``, the target tokenizer's, when given).

    Returns:
        the n-gram model with ``cps``, else None.
    Raises:
        ConfigError: one line naming the key, the value and the accepted range.
    """
    from specpolicy.core.checks import choice, integer, number

    get = {key: config.get(key, default) for key, default in PATH_SEARCH_DEFAULTS.items()}
    if choice("drafter.path_search", get["path_search"], PATH_SEARCHES) == "none":
        return None
    number("drafter.cps_mass", get["cps_mass"], 0.0, 1.0, low_open=True)
    integer("drafter.cps_candidates", get["cps_candidates"], 1)
    integer("drafter.cps_width", get["cps_width"], 1)
    number("drafter.cps_lambda", get["cps_lambda"], 0.0, 1.0)
    if not isinstance(get["ngram"], str) or not get["ngram"]:
        raise ConfigError(
            f"drafter.ngram must be a bundled n-gram ({', '.join(BUNDLED_NGRAMS)}) or an .npz file "
            f"(python -m specpolicy.models.ngram builds one), got {get['ngram']!r}"
        )
    model = load_ngram(resolve_ngram_path(get["ngram"]), "drafter.ngram", vocab)
    if model.order < 2:
        raise ConfigError(f"drafter.ngram={get['ngram']!r}: order {model.order}; the path search needs order >= 2")
    return model


def path_search_of(config: dict, vocab: dict[str, int] | None, stop_ids, device) -> PathSearch | None:
    """The ``PathSearch`` a block drafter's config asks for (``path_search=cps``), else None: its
    n-gram model read and checked (``check_path_search``), the stop tokens on ``device``.

    Raises:
        ConfigError: as ``check_path_search``.
    """
    ngram = check_path_search(config, vocab)
    if ngram is None:
        return None
    get = {key: config.get(key, default) for key, default in PATH_SEARCH_DEFAULTS.items()}
    stops = torch.tensor(sorted(int(t) for t in stop_ids), dtype=torch.long, device=device)
    return PathSearch(
        ngram,
        stops,
        float(get["cps_mass"]),
        int(get["cps_candidates"]),
        int(get["cps_width"]),
        float(get["cps_lambda"]),
    )


def target_vocabulary(run_config: dict | None) -> dict[str, int] | None:
    """The run's target tokenizer's vocabulary, read without loading the model, when ``verifier.model``
    is bundled or a local directory with a tokenizer; None otherwise."""
    from specpolicy.models.loading import resolve_model_path

    model = ((run_config or {}).get("verifier") or {}).get("model")
    if not isinstance(model, str) or not model:
        return None
    try:
        directory = Path(resolve_model_path(model))
        if not (directory / "tokenizer.json").is_file():
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(directory)).get_vocab()
    except (OSError, ValueError):
        return None


# -- the command ------------------------------------------------------------------------------------


def read_corpus(path: Path, field: str) -> list[str | list[int]]:
    """Documents of a corpus file: ``.jsonl`` (at ``field`` of each row, a text or a list of token ids
    -- e.g. the family's distilled ``response_ids``) or plain text (one document per non-empty line).

    Raises:
        ConfigError: naming ``--corpus`` / ``--field`` when the file is missing or a row lacks the field.
    """
    if not path.is_file():
        raise ConfigError(f"--corpus={str(path)!r}: no such file")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return list(lines)
    documents: list[str | list[int]] = []
    for i, line in enumerate(lines, 1):
        value = json.loads(line).get(field)
        ids = isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        if not isinstance(value, str) and not ids:
            raise ConfigError(
                f"--field={field!r}: {path}:{i} has no text or token-id list {field!r} (keys: {', '.join(json.loads(line))})"
            )
        documents.append(value)
    return documents


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.models.ngram``: build an n-gram model file from a corpus."""
    from specpolicy.models.loading import load_tokenizer, resolve_model_path

    ap = argparse.ArgumentParser(prog="python -m specpolicy.models.ngram", description=main.__doc__)
    ap.add_argument(
        "--corpus", type=Path, required=True, help="a .jsonl (see --field) or a text file, one document a line"
    )
    ap.add_argument(
        "--field", default="text", help="the .jsonl field holding each document: a text (GSM8K: answer) or token ids"
    )
    ap.add_argument(
        "--tokenizer",
        default="target",
        help="a bundled model name (target) or a local Hugging Face model/tokenizer directory",
    )
    ap.add_argument("--order", type=int, default=3, help="the longest n-gram (>= 1; DiffuSpec and DART: 3)")
    ap.add_argument("--no-eos", action="store_true", help="do not end each document with the tokenizer's EOS token")
    ap.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    args = ap.parse_args(argv)
    if args.order < 1:
        ap.error(f"--order must be >= 1, got {args.order}")
    try:
        texts = read_corpus(args.corpus, args.field)
        if not Path(resolve_model_path(args.tokenizer)).is_dir():
            raise ConfigError(f"--tokenizer={args.tokenizer!r}: neither a bundled model nor a local directory")
        tokenizer = load_tokenizer(resolve_model_path(args.tokenizer))
    except ConfigError as exc:
        ap.error(str(exc))
    eos = [] if args.no_eos or tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]

    def tokens(document: str | list[int]) -> list[int]:  # token ids are taken as they are (their EOS included)
        return (
            list(document) if isinstance(document, list) else tokenizer.encode(document, add_special_tokens=False) + eos
        )

    documents = (tokens(d) for d in texts)
    vocab = tokenizer.get_vocab()
    try:
        model = NGramModel.build(
            documents,
            len(vocab),
            args.order,
            {
                "tokenizer_sha256": vocabulary_sha256(vocab),
                "corpus": args.corpus.name,
                "field": args.field,
                "eos": bool(eos),
            },
        )
    except ValueError as exc:  # an order too large for the vocabulary, an id outside it
        ap.error(str(exc))
    out = model.save(args.out)
    sizes = ", ".join(f"{n}-grams {k.numel()}" for n, k in enumerate(model.keys, 1))
    print(
        f"{out}: {model.header['documents']} documents, {model.header['tokens']} tokens; {sizes}; "
        f"{out.stat().st_size / 1e6:.2f} MB"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
