"""DiffuSpec's causal-consistency path search (CPS; Li et al., arXiv 2510.02358, §4.2, Eqs. 7-8).

A block drafter's ONE pass gives a distribution per drafted position; the tokens that maximise
each position alone need not read as a sentence (the positions were decoded in parallel). CPS
turns the pass into a *lattice* and searches it left to right for a path that is likely under the
drafter AND fluent under a causal scorer (an n-gram language model):

1. Lattice (Eq. 7): per position, the smallest set of top tokens whose probability mass reaches
   ``mass`` (0.8), at most ``max_candidates`` (15); a stop token (EOS) is always a candidate. The
   lattice ends at the first position whose pruned top set holds a stop token on its own merit
   (a stop token only added by the always-keep rule does not end it; the reading of the
   third-party reproduction ``pluto0x0/DiffuSpec``, ``diffuspec/search/cps.py``).
2. Beam search (Eq. 8): ``width`` (3) paths, each step adding
   ``lam * log q_drafter(token) + (1 - lam) * log p_ngram(token | the path's last order - 1 tokens)``
   (``lam`` 0.5; natural logs for both); a path that placed a stop token is finished and competes
   with its score as it stands. The best path is the draft, verified as one chain.

The drafters (``drafters/dflash.py``, ``drafter.path_search=cps``) call ``PathSearch.search`` on
each pass's probabilities; the scorer is duck-typed (``specpolicy.models.ngram.NGramModel``), so the
core imports no model. The beam search is compiled (numba, ``specpolicy.core.compiled``): one call
per pass when the scorer offers its Kneser-Ney tables (``compiled_tables``), else one compiled step
per position after the scorer's ``log_probs``. Lossless whatever the path: greedy verification accepts any chain's
matching prefix, and under sampling the path's tokens are verified as point masses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from numba import njit

from specpolicy.core.compiled import kneser_ney_higher, kneser_ney_row, kneser_ney_unigram, topk_largest
from specpolicy.core.runtime import no_grad


class CausalScorer(Protocol):
    """What CPS reads from its causal scorer (``specpolicy.models.ngram.NGramModel``)."""

    order: int
    vocab_size: int  # the start symbol's id (contexts shorter than order - 1 are padded with it)

    def log_probs(self, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``context`` ``(B, order - 1)`` int64, ``tokens`` ``(B, C)`` int64 -> ``(B, C)`` float32 log p."""
        ...


def candidate_lattice(
    probs: torch.Tensor, mass: float, max_candidates: int, stop_cols: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pruned lattice of one pass (Eq. 7), in the columns of ``probs``.

    Args:
        probs: ``(n, V)`` float32, the drafter's distribution at each drafted position.
        mass: cumulative probability a position's top set must reach, in (0, 1].
        max_candidates: most candidates a position keeps before the stop tokens (>= 1).
        stop_cols: ``(s,)`` int64 columns of ``probs`` that are stop tokens (always candidates).
    Returns:
        ``columns`` ``(m, M)`` int64, ``log_q`` ``(m, M)`` float32 and ``valid`` ``(m, M)`` bool
        (``M = min(max_candidates, V) + s``; a slot not in the set is invalid), for the lattice's
        ``m <= n`` positions.
    """
    n, vocab = probs.shape
    values, cols = probs.topk(min(max_candidates, vocab), dim=-1)  # (n, top), best first
    keep = values.cumsum(-1) - values < mass  # the smallest set reaching `mass`
    m = n
    if stop_cols.numel():
        is_stop = cols[:, :, None] == stop_cols  # (n, top, s)
        natural = (is_stop.any(-1) & keep).any(-1)  # (n,) a stop token on its own merit
        ends = natural.nonzero()
        m = int(ends[0, 0]) + 1 if ends.numel() else n  # one sync: where the lattice ends
        kept = (is_stop & keep[:, :, None]).any(1)  # (n, s) already in the set
        extra = stop_cols.expand(n, -1)
        cols = torch.cat([cols, extra], dim=1)
        keep = torch.cat([keep, ~kept], dim=1)  # the others added, once
        values = torch.cat([values, probs.gather(1, extra)], dim=1)
    return cols[:m], values[:m].clamp(min=1e-30).log(), keep[:m]


@dataclass
class PathSearch:
    """CPS with its settings (paper defaults: mass 0.8, 15 candidates, width 3, lambda 0.5).

    Args:
        scorer: the causal scorer (an n-gram model of ``order`` >= 2).
        stop_ids: ``(s,)`` int64 stop token ids (EOS), on the drafter's device.
        mass: lattice mass per position, in (0, 1].
        max_candidates: lattice candidates per position (>= 1; the stop tokens come on top).
        width: beam width (>= 1).
        lam: weight of the drafter's log-probability (the n-gram's is ``1 - lam``), in [0, 1].
    """

    scorer: CausalScorer
    stop_ids: torch.Tensor
    mass: float = 0.8
    max_candidates: int = 15
    width: int = 3
    lam: float = 0.5

    def __post_init__(self) -> None:
        if self.scorer.order < 2:
            raise ValueError(
                f"the path search needs a scorer of order >= 2 (a context to score), got {self.scorer.order}"
            )
        # the compiled search's first call compiles it (or loads numba's cache): done here, when the
        # drafter is built, so no timed round pays it; a one-position lattice of the real dtypes
        context = np.full((1, self.scorer.order - 1), self.scorer.vocab_size, dtype=np.int64)
        self._stops_np = np.ascontiguousarray(self.stop_ids.cpu().numpy(), dtype=np.int64)  # (s,) on the host
        self._no_map = np.zeros(0, dtype=np.int64)
        self._mapped: tuple | None = None  # (token_ids, its stop columns, its host copy): ``_columns``
        self._beams(np.zeros((1, 1), dtype=np.int64), np.zeros((1, 1)), context, self._stops_np)
        one = np.zeros((1, 1), dtype=np.float32)
        _lattice(one, np.zeros((1, 1), dtype=np.int64), one[:, :0], self._stops_np, self._no_map, np.float32(1.0))
        _path_slots(np.zeros((1, 1), dtype=np.int64), np.ones((1, 1), dtype=np.bool_), np.zeros(1, dtype=np.int64))

    def tail(self, *parts: torch.Tensor) -> torch.Tensor:
        """The last ``order - 1`` tokens of ``parts`` (1-D int64, concatenated): what the scorer reads
        as a context, and what a drafter keeps of its committed tokens for the next one."""
        return torch.cat(parts)[-(self.scorer.order - 1) :]

    @no_grad
    def search(
        self, probs: torch.Tensor, context: torch.Tensor, token_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The best path through one pass's lattice.

        Args:
            probs: ``(n, V)`` float32, the drafter's distribution at each drafted position.
            context: ``(order - 1,)`` int64, the tokens before the first drafted position
                (committed tokens, then any drafted earlier this round; ``NGramModel.pad_context``).
            token_ids: ``(V,)`` int64, the token id of each column of ``probs`` (a draft vocabulary's
                ``d2t``); None: column i is token i.
        Returns:
            ``path`` ``(m,)`` int64 (``m <= n``; shorter when the lattice or the path ended at a stop
            token), ``q`` ``(m,)`` float32 the drafter's probability of each path token (its
            confidence), and whether the lattice ended early (a stop token, or the path's end).

        On the device only the top-k over the vocabulary and the stop columns' probabilities; the
        rest on the host, one read of them: the lattice of ``candidate_lattice`` (``_lattice``,
        compiled, the same IEEE operations as its CPU torch form: the cumulative mass summed in
        float64 and rounded to float32 as ``torch.cumsum`` does on the CPU), the log and exp as
        torch computes them on the same shapes, the beam search (``_beams``) and each path token's
        slot (``_path_slots``), so the path and ``q`` are bit-identical to ``candidate_lattice``
        followed by the all-torch lookups (``tests/core/test_path_search_equivalence.py``).
        """
        path, q, ended = self.search_np(probs, context.reshape(-1).cpu().numpy(), token_ids)
        return torch.from_numpy(path).to(probs.device), torch.from_numpy(q).to(probs.device), ended

    @no_grad
    def search_np(
        self, probs: torch.Tensor, context: np.ndarray, token_ids: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``search`` with the context and the results on the host: ``context`` ``(c,)`` int64 (its
        last ``order - 1`` tokens are read) -> ``path`` ``(m,)`` int64, ``q`` ``(m,)`` float32 (numpy)
        and whether the lattice ended early; for a drafter that keeps its block on the host."""
        stop_cols, stop_cols_np, token_map = self._columns(token_ids)
        n = probs.shape[0]
        values, cols = probs.topk(min(self.max_candidates, probs.shape[1]), dim=-1)  # (n, top), best first
        stop_values = probs[:, stop_cols] if stop_cols.numel() else values[:, :0]  # (n, s)
        tokens, kept_values, valid = _lattice(
            _host(values), _host(cols), _host(stop_values), stop_cols_np, token_map, np.float32(self.mass)
        )
        # the lattice's log q as torch computes it on the (m, M) lattice (its kernels' results depend on the shape)
        log_q = torch.from_numpy(kept_values).clamp(min=1e-30).log().double()  # (m, M) float64
        drafter_term = np.where(valid, self.lam * log_q.numpy(), -np.inf)  # (m, M): invalid slots never chosen
        path = self._beams(tokens, drafter_term, self._history(context), self._stops_np)
        p = path.shape[0]
        slots = _path_slots(tokens, valid, path)  # each path token's lattice slot
        q = log_q[:p].exp().numpy()[np.arange(p), slots].astype(np.float32)  # its drafter probability
        ended = p < n or (p > 0 and bool((self._stops_np == path[p - 1]).any()))
        return path, q, ended

    def _columns(self, token_ids: torch.Tensor | None) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """The stop tokens' columns of ``probs`` (``(s,)`` int64, on the device and on the host) and the
        host copy of ``token_ids`` (``(V,)`` int64; ``(0,)`` for None: column i is token i), kept per
        ``token_ids`` (a drafter's fixed ``d2t``)."""
        if token_ids is None:
            return self.stop_ids, self._stops_np, self._no_map
        if self._mapped is None or self._mapped[0] is not token_ids:
            stop_cols = torch.isin(token_ids, self.stop_ids).nonzero().flatten()
            host = np.ascontiguousarray(token_ids.cpu().numpy(), dtype=np.int64)
            self._mapped = (token_ids, stop_cols, _host(stop_cols).astype(np.int64), host)
        return self._mapped[1], self._mapped[2], self._mapped[3]

    def _history(self, context: np.ndarray) -> np.ndarray:
        """The scorer's context ``(1, order - 1)`` int64 from the last tokens of ``context`` ``(c,)``
        int64, start symbols in front of a short one (``NGramModel.pad_context``)."""
        keep = self.scorer.order - 1
        tail = context[max(context.shape[0] - keep, 0) :]
        history = np.full((1, keep), self.scorer.vocab_size, dtype=np.int64)
        history[0, keep - tail.shape[0] :] = tail
        return history

    def _beams(
        self, tokens: np.ndarray, drafter_term: np.ndarray, history: np.ndarray, stops: np.ndarray
    ) -> np.ndarray:
        """The beam search of Eq. 8 over the lattice, on the host: ``tokens`` ``(m, M)`` int64 (the
        lattice's candidates), ``drafter_term`` ``(m, M)`` float64 (``lam * log q``, -inf where a slot
        is invalid), ``history`` ``(1, order - 1)`` int64 (the context) and ``stops`` ``(s,)`` int64 ->
        the best path, ``(<= m,)`` int64. Compiled (``_beams_kneser_ney``, one call) when the scorer
        offers its Kneser-Ney tables (``NGramModel.compiled_tables``); any other scorer is asked
        once per position (``log_probs``) and each step is the same compiled ``_beam_step``. Both
        pick with ``topk_largest`` (``torch.topk``'s order, ties included), so the path is the one
        the all-torch loop chose."""
        m, width = tokens.shape[0], self.width
        weight = 1.0 - self.lam
        tables = getattr(self.scorer, "compiled_tables", None)
        if tables is not None:
            return _beams_kneser_ney_shared(tokens, drafter_term, history[0], stops, width, weight, *tables())
        # W beam slots from the start; the empty ones score -inf and are never preferred
        scores = np.full(width, -np.inf)
        scores[0] = 0.0
        done = np.zeros(width, dtype=np.bool_)
        paths = np.full((width, m), -1, dtype=np.int64)
        history = np.ascontiguousarray(np.repeat(history, width, axis=0))
        for i in range(m):
            cand = np.ascontiguousarray(tokens[i])  # (M,)
            scored = self.scorer.log_probs(torch.from_numpy(history), torch.from_numpy(np.tile(cand, (width, 1))))
            lp = np.ascontiguousarray(scored.double().numpy())  # (W, M)
            if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, stops):
                break
        return _best(paths, scores)


@njit(cache=True)
def _beam_step(
    i: int,
    cand: np.ndarray,
    drafter_row: np.ndarray,
    lp: np.ndarray,
    weight: float,
    scores: np.ndarray,
    done: np.ndarray,
    paths: np.ndarray,
    history: np.ndarray,
    stops: np.ndarray,
) -> bool:
    """One position of Eq. 8's beam search, in place: every unfinished beam (``scores`` ``(W,)``
    float64, ``done`` ``(W,)`` bool, ``paths`` ``(W, m)`` int64, ``history`` ``(W, order - 1)``
    int64) extended by every candidate ``cand`` ``(M,)`` (score ``+ drafter_row + weight * lp``,
    ``lp`` ``(W, M)`` float64 the scorer's), finished beams carried as they stand, the best W kept
    (``topk_largest`` over the W M extensions then the W carried). Returns whether every kept beam
    is finished."""
    width, size = scores.shape[0], cand.shape[0]
    flat = np.empty(width * size + width)
    for w in range(width):
        for c in range(size):
            # (scores + drafter term) + weight * lp: 0 * -inf is NaN (lam 1), as numpy computed it
            flat[w * size + c] = -np.inf if done[w] else scores[w] + drafter_row[c] + weight * lp[w, c]
        flat[width * size + w] = scores[w] if done[w] else -np.inf
    index, values = topk_largest(flat, width)
    old_paths, old_history = paths.copy(), history.copy()
    keep = history.shape[1]
    for w in range(width):
        extended = index[w] < width * size
        row = index[w] // size if extended else index[w] - width * size
        new = cand[index[w] % size] if extended else -1
        paths[w] = old_paths[row]
        paths[w, i] = new
        history[w, : keep - 1] = old_history[row, 1:]
        history[w, keep - 1] = new if extended else old_history[row, keep - 1]
        scores[w] = values[w]
        finished = True
        if extended:
            finished = False
            for s in stops:
                if new == s:
                    finished = True
        done[w] = finished
    return bool(done.all())


@njit(cache=True)
def _best(paths: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The best beam's path (``np.argmax``: the first NaN, else the first maximum), its -1 slots dropped."""
    best = 0
    for w in range(scores.shape[0]):
        if np.isnan(scores[w]):
            best = w
            break
        if scores[w] > scores[best]:
            best = w
    row = paths[best]
    return row[row >= 0].copy()


@njit(cache=True)
def _beams_kneser_ney(
    tokens: np.ndarray,
    drafter_term: np.ndarray,
    context: np.ndarray,
    stops: np.ndarray,
    width: int,
    weight: float,
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    order: int,
) -> np.ndarray:
    """``PathSearch._beams`` with an ``NGramModel`` scorer, compiled whole: each position's scores
    are ``kneser_ney_row`` per beam, logged as ``log_probs`` returns them (float32, then float64)."""
    m, size = tokens.shape
    scores = np.full(width, -np.inf)
    scores[0] = 0.0
    done = np.zeros(width, dtype=np.bool_)
    paths = np.full((width, m), -1, dtype=np.int64)
    history = np.empty((width, context.shape[0]), dtype=np.int64)
    for w in range(width):
        history[w] = context
    lp = np.empty((width, size))
    row = np.empty(size)
    for i in range(m):
        cand = tokens[i].copy()
        for w in range(width):
            kneser_ney_row(
                keys, values, discounts, unigram_total, unigram_types, vocab_size, base, order, history[w], cand, row
            )
            for c in range(size):
                lp[w, c] = np.float64(np.float32(np.log(row[c])))
        if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, stops):
            break
    return _best(paths, scores)


@njit(cache=True)
def _beams_kneser_ney_shared(
    tokens: np.ndarray,
    drafter_term: np.ndarray,
    context: np.ndarray,
    stops: np.ndarray,
    width: int,
    weight: float,
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    order: int,
) -> np.ndarray:
    """``_beams_kneser_ney`` (the same path, bit for bit) with each position's scoring shared: the
    unigram stage once per position (``kneser_ney_unigram``; it reads no context), a beam whose
    history another beam already scored copies that row, and no row for a beam whose extensions
    score -inf whatever it holds -- a finished beam (carried as it stands) or an empty slot (score
    -inf; with ``weight`` > 0, ``-inf + drafter term + weight * lp`` is -inf or NaN exactly as with
    its row, the row being a log-probability <= 0; at ``weight`` 0 every row is scored, since
    ``0 * -inf`` is NaN)."""
    m, size = tokens.shape
    scores = np.full(width, -np.inf)
    scores[0] = 0.0
    done = np.zeros(width, dtype=np.bool_)
    paths = np.full((width, m), -1, dtype=np.int64)
    keep = context.shape[0]
    history = np.empty((width, keep), dtype=np.int64)
    for w in range(width):
        history[w] = context
    lp = np.empty((width, size))
    row = np.empty(size)
    unigram = np.empty(size)
    scored = np.zeros(width, dtype=np.bool_)
    for i in range(m):
        cand = tokens[i].copy()
        kneser_ney_unigram(keys, values, discounts, unigram_total, unigram_types, vocab_size, base, cand, unigram)
        for w in range(width):
            scored[w] = False
            if done[w] or (weight != 0.0 and scores[w] == -np.inf):
                lp[w, :] = 0.0  # never read into a finite score (see above)
                continue
            same = -1
            for v in range(w):
                if scored[v]:
                    equal = True
                    for j in range(keep):
                        if history[v, j] != history[w, j]:
                            equal = False
                            break
                    if equal:
                        same = v
                        break
            if same >= 0:
                lp[w, :] = lp[same, :]
            else:
                row[:] = unigram
                kneser_ney_higher(keys, values, discounts, base, order, history[w], cand, row)
                for c in range(size):
                    lp[w, c] = np.float64(np.float32(np.log(row[c])))
            scored[w] = True
        if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, stops):
            break
    return _best(paths, scores)


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A C-contiguous host array of ``tensor`` (a view on the CPU)."""
    return np.ascontiguousarray(tensor.cpu().numpy())


@njit(cache=True)
def _lattice(
    values: np.ndarray,
    cols: np.ndarray,
    stop_values: np.ndarray,
    stop_cols: np.ndarray,
    token_map: np.ndarray,
    mass: np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``candidate_lattice`` after its top-k, compiled: ``values`` ``(n, top)`` float32 and ``cols``
    ``(n, top)`` int64 (the top-k), ``stop_values`` ``(n, s)`` float32 (the stop columns'
    probabilities), ``stop_cols`` ``(s,)`` int64 (the stop tokens' columns), ``token_map`` ``(V,)`` int64 the
    token of each column (``(0,)``: column i is token i) -> the lattice's ``tokens`` ``(m, M)``
    int64, its probabilities ``(m, M)`` float32 (before the log) and ``valid`` ``(m, M)`` bool,
    ``M = top + s``. The set reaching ``mass`` is ``cumsum - value < mass`` in float32 with the
    cumulative sum accumulated in float64 (``torch.cumsum`` on the CPU); a stop token is matched by
    its column, as ``candidate_lattice`` matches it."""
    n, top = values.shape
    s = stop_values.shape[1]
    keep = np.empty((n, top), dtype=np.bool_)
    m = n
    for i in range(n):
        total = 0.0
        for j in range(top):
            total += np.float64(values[i, j])
            keep[i, j] = np.float32(np.float32(total) - values[i, j]) < mass
    size = top + s
    tokens = np.empty((n, size), dtype=np.int64)
    kept_values = np.empty((n, size), dtype=np.float32)
    valid = np.empty((n, size), dtype=np.bool_)
    mapped = token_map.shape[0] > 0
    for i in range(n):
        natural = False
        for j in range(top):
            tokens[i, j] = token_map[cols[i, j]] if mapped else cols[i, j]
            kept_values[i, j] = values[i, j]
            valid[i, j] = keep[i, j]
        for k in range(s):
            in_set = False
            for j in range(top):
                if keep[i, j] and cols[i, j] == stop_cols[k]:
                    in_set = True
            natural = natural or in_set
            tokens[i, top + k] = token_map[stop_cols[k]] if mapped else stop_cols[k]
            kept_values[i, top + k] = stop_values[i, k]
            valid[i, top + k] = not in_set  # the others added, once
        if natural:  # a stop token on its own merit: the lattice ends here
            m = i + 1
            break
    return tokens[:m].copy(), kept_values[:m].copy(), valid[:m].copy()


@njit(cache=True)
def _path_slots(tokens: np.ndarray, valid: np.ndarray, path: np.ndarray) -> np.ndarray:
    """The lattice slot each path token was taken from: ``tokens`` ``(m, M)`` int64, ``valid``
    ``(m, M)`` bool, ``path`` ``(p,)`` int64, ``p <= m`` -> ``(p,)`` int64 (the first valid slot
    holding the token; a token is valid in one slot only)."""
    slots = np.zeros(path.shape[0], dtype=np.int64)
    for i in range(path.shape[0]):
        for c in range(tokens.shape[1]):
            if valid[i, c] and tokens[i, c] == path[i]:
                slots[i] = c
                break
    return slots
