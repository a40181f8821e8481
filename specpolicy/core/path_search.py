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
core imports no model. A pass's search is two compiled calls (numba) around one torch op: the
lattice (on the CPU with each row's top-k taken in ``torch.topk``'s order), torch's log of its
probabilities, then the beams, the path's probabilities and its end in one call when the scorer
offers its Kneser-Ney tables (``compiled_tables``), else one compiled step per position after the
scorer's ``log_probs``. Lossless whatever the path: greedy verification accepts any chain's
matching prefix, and under sampling the path's tokens are verified as point masses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch
from numba import njit

from specpolicy.core.compiled import kneser_ney_unigram, topk_largest
from specpolicy.core.path_search_kernels import kneser_ney_higher_indexed, lattice_rows, lattice_topk, search_tables
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
        self._stops_np = np.ascontiguousarray(self.stop_ids.cpu().numpy(), dtype=np.int64)  # (s,) on the host
        self._no_map = np.zeros(0, dtype=np.int64)
        self._mapped: tuple | None = None  # (token_ids, its stop columns, its host copy): ``_columns``
        self._stop_cols_device: tuple | None = None  # (host columns, device, them there): ``_stop_cols_on``
        self._lattice_buffers: tuple | None = None  # ``_buffers``
        self._log_views: list[torch.Tensor] = []
        self._mass32 = np.float32(self.mass)
        tables = getattr(self.scorer, "compiled_tables", None)
        self._tables = None if tables is None else search_tables(tables())  # a compiled search's Kneser-Ney tables
        # the compiled search's first call compiles it (or loads numba's cache): done here, when the
        # drafter is built, so no timed round pays it; a two-position pass of the real dtypes
        vocab = self.scorer.vocab_size
        self.search_np(torch.full((2, vocab), 1.0 / vocab), np.zeros(0, dtype=np.int64))
        if self.stop_ids.device.type != "cpu":
            self._buffers(1, 1 + self._stops_np.shape[0])
            buffers = cast(tuple, self._lattice_buffers)  # set by ``_buffers``
            one = np.zeros((1, 1), dtype=np.float32)
            lattice_topk(
                one, np.zeros((1, 1), dtype=np.int64), np.zeros((1, self._stops_np.shape[0]), dtype=np.float32),
                self._stops_np, self._no_map, self._mass32, *buffers,
            )  # fmt: skip
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

        On an accelerator only the top-k over the vocabulary and the stop columns' probabilities;
        the rest on the host (``search_np``): the lattice of ``candidate_lattice``
        (``path_search_kernels``, compiled, the same IEEE operations as its CPU torch form, its
        top-k in ``torch.topk``'s order on the CPU: the cumulative mass summed in
        float64 and rounded to float32 as ``torch.cumsum`` does on the CPU), the log as torch
        computes it on the same shape, the beam search and each path token's slot and probability
        (``_finish``: the exp as torch's wherever the two can round apart), so the path and ``q``
        are bit-identical to ``candidate_lattice`` followed by the all-torch lookups
        (``tests/core/test_path_search_equivalence.py``).
        """
        path, q, ended = self.search_np(probs, context.reshape(-1).cpu().numpy(), token_ids)
        return torch.from_numpy(path).to(probs.device), torch.from_numpy(q).to(probs.device), ended

    def search_np(
        self, probs: torch.Tensor | np.ndarray, context: np.ndarray, token_ids: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``search`` with the context and the results on the host: ``context`` ``(c,)`` int64 (its
        last ``order - 1`` tokens are read) -> ``path`` ``(m,)`` int64, ``q`` ``(m,)`` float32 (numpy)
        and whether the lattice ended early; for a drafter that keeps its block on the host.
        ``probs`` may be a host array, ``(n, V)`` float32 C-contiguous (a drafter's kept buffer: no
        torch attribute read, no view made), else a tensor.

        Three calls: the lattice (``lattice_rows``, compiled: on the CPU it takes each row's top-k
        itself, in ``torch.topk``'s order, from a view of ``probs``; on an accelerator the top-k and
        the stop columns' probabilities come from the device, read once), torch's log of its kept
        probabilities (one in-place op on a cached ``(m, M)`` view of the lattice's buffer, as
        ``candidate_lattice`` takes it), and the rest compiled (``_finish_kneser_ney``: the drafter
        term, the beams, each path token's slot, its probability and the end check), or, for a scorer
        without Kneser-Ney tables, the per-position beam loop then ``_finish``."""
        if not isinstance(probs, np.ndarray):
            return self._search_tensor(probs, context, token_ids)
        stop_cols_np, token_map = (self._stops_np, self._no_map) if token_ids is None else self._columns(token_ids)
        if context.dtype != np.int64 or not context.flags.c_contiguous:
            context = np.ascontiguousarray(context, dtype=np.int64)
        if probs.dtype != np.float32 or not probs.flags.c_contiguous:
            probs = np.ascontiguousarray(probs, dtype=np.float32)
        n, vocab = probs.shape
        top = min(self.max_candidates, vocab)
        tokens, values, valid = self._buffers(n, top + stop_cols_np.shape[0])
        m = lattice_rows(probs, top, stop_cols_np, token_map, self._mass32, tokens, values, valid)
        return self._beams(tokens, values, valid, m, n, context)

    @no_grad
    def _search_tensor(
        self, probs: torch.Tensor, context: np.ndarray, token_ids: torch.Tensor | None
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``search_np`` of a tensor ``probs`` ``(n, V)`` (any device)."""
        stop_cols_np, token_map = self._columns(token_ids)
        if context.dtype != np.int64 or not context.flags.c_contiguous:
            context = np.ascontiguousarray(context, dtype=np.int64)
        n, vocab = probs.shape
        top = min(self.max_candidates, vocab)
        tokens, values, valid = self._buffers(n, top + stop_cols_np.shape[0])
        if probs.device.type == "cpu":
            rows = probs.numpy() if probs.dtype == torch.float32 else probs.float().numpy()
            m = lattice_rows(
                rows if rows.flags.c_contiguous else np.ascontiguousarray(rows),
                top, stop_cols_np, token_map, self._mass32, tokens, values, valid,
            )  # fmt: skip
        else:  # the top-k and the stop columns' probabilities on the device, one read
            device_values, cols = probs.topk(top, dim=-1)  # (n, top), best first
            stop_values = probs[:, self._stop_cols_on(probs.device, stop_cols_np)]  # (n, s)
            m = lattice_topk(
                _host(device_values), _host(cols), _host(stop_values), stop_cols_np, token_map,
                self._mass32, tokens, values, valid,
            )  # fmt: skip
        return self._beams(tokens, values, valid, m, n, context)

    def _beams(
        self, tokens: np.ndarray, values: np.ndarray, valid: np.ndarray, m: int, n: int, context: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """After the lattice (``_buffers``' arrays, its ``m`` of ``n`` positions): torch's log of its
        kept probabilities in place, the beams, the path's probabilities and the end (``search_np``)."""
        self._log_views[m].log_()  # log q as torch computes it on the (m, M) lattice
        if self._tables is not None:
            path, q, code = _finish_kneser_ney(
                tokens, values, valid, m, n, self.lam, self.width, context, self._stops_np, EXP_ULPS, *self._tables
            )
        else:
            path = self._beams_generic(tokens[:m], values[: m * tokens.shape[1]], valid[:m], context)
            q, code = _finish(tokens, values, valid, n, self._stops_np, path, EXP_ULPS)
        if code & 2:  # an exp the host's libm might round to another float32 than torch's: torch's
            slots = _path_slots(tokens, valid, path)
            p = path.shape[0]
            log_q = torch.from_numpy(values[: p * tokens.shape[1]].reshape(p, -1)).double()
            q = log_q.exp().numpy()[np.arange(p), slots].astype(np.float32)
        return path, q, bool(code & 1)

    def _columns(self, token_ids: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
        """The stop tokens' columns of ``probs`` (``(s,)`` int64, on the host) and the host copy of
        ``token_ids`` (``(V,)`` int64; ``(0,)`` for None: column i is token i), kept per ``token_ids``
        (a drafter's fixed ``d2t``)."""
        if token_ids is None:
            return self._stops_np, self._no_map
        if self._mapped is None or self._mapped[0] is not token_ids:
            stop_cols = torch.isin(token_ids, self.stop_ids).nonzero().flatten()
            host = np.ascontiguousarray(token_ids.cpu().numpy(), dtype=np.int64)
            self._mapped = (token_ids, _host(stop_cols).astype(np.int64), host)
        return self._mapped[1], self._mapped[2]

    def _stop_cols_on(self, device: torch.device, stop_cols: np.ndarray) -> torch.Tensor:
        """``stop_cols`` (``(s,)`` int64 host columns, from ``_columns``) on ``device``, kept."""
        held = self._stop_cols_device
        if held is None or held[0] is not stop_cols or held[1] != device:
            held = (stop_cols, device, torch.from_numpy(stop_cols).to(device))
            self._stop_cols_device = held
        return held[2]

    def _buffers(self, n: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The lattice's host buffers for ``n`` positions of ``size`` slots, kept between calls (grown
        when a pass has more positions): ``tokens`` ``(N, size)`` int64, the kept probabilities
        ``(N size,)`` float32 (their logs in place after ``_log_views[m]``) and ``valid`` ``(N, size)``
        bool; ``_log_views[m]`` is the torch view of the first ``m`` rows, ``(m, size)``."""
        held = self._lattice_buffers
        if held is None or held[0].shape[0] < n or held[0].shape[1] != size:
            rows = max(n, 32)
            flat = torch.empty(rows * size, dtype=torch.float32)
            self._log_views = [flat[: m * size].view(m, size) for m in range(rows + 1)]
            held = (np.empty((rows, size), dtype=np.int64), flat.numpy(), np.empty((rows, size), dtype=np.bool_))
            self._lattice_buffers = held
        return held

    def _beams_generic(
        self, tokens: np.ndarray, log_q: np.ndarray, valid: np.ndarray, context: np.ndarray
    ) -> np.ndarray:
        """The beam search of Eq. 8 with a scorer that offers no Kneser-Ney tables: ``tokens``
        ``(m, M)`` int64, ``log_q`` ``(m M,)`` float32, ``valid`` ``(m, M)`` bool; the scorer is asked
        once per position (``log_probs``) and each step is the compiled ``_beam_step`` (the path the
        all-torch loop chose: ``topk_largest`` picks in ``torch.topk``'s order)."""
        m, width = tokens.shape[0], self.width
        weight = 1.0 - self.lam
        drafter_term = np.where(valid, self.lam * log_q.reshape(m, -1).astype(np.float64), -np.inf)  # (m, M)
        # W beam slots from the start; the empty ones score -inf and are never preferred
        scores = np.full(width, -np.inf)
        scores[0] = 0.0
        done = np.zeros(width, dtype=np.bool_)
        paths = np.full((width, m), -1, dtype=np.int64)
        history = np.ascontiguousarray(
            np.repeat(_history(context, self.scorer.order - 1, self.scorer.vocab_size)[None], width, axis=0)
        )
        for i in range(m):
            cand = np.ascontiguousarray(tokens[i])  # (M,)
            scored = self.scorer.log_probs(torch.from_numpy(history), torch.from_numpy(np.tile(cand, (width, 1))))
            lp = np.ascontiguousarray(scored.double().numpy())  # (W, M)
            if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, self._stops_np):
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
    unigram_probs: np.ndarray,
    starts: np.ndarray,
    finite: bool,
) -> np.ndarray:
    """The beams of Eq. 8 with an ``NGramModel`` scorer, compiled whole: ``tokens`` ``(m, M)`` int64 the
    lattice's candidates, ``drafter_term`` ``(m, M)`` float64 (``lam * log q``, -inf where a slot is
    invalid), ``context`` ``(order - 1,)`` int64, ``stops`` ``(s,)`` int64 -> the best path ``(<= m,)``
    int64. Each position's scores are the Kneser-Ney rows (``kneser_ney_row``) logged as
    ``log_probs`` returns them (float32, then float64), the same path, bit for bit, as scoring
    every beam (the per-beam kernel kept in ``tests/core/test_path_search_equivalence.py``), with
    each position's scoring shared: the
    unigram stage once per position (``kneser_ney_unigram``; it reads no context), a beam whose
    history another beam already scored copies that row, and no row for a beam whose extensions
    score -inf whatever it holds -- a finished beam (carried as it stands) or an empty slot (score
    -inf; with ``weight`` > 0, ``-inf + drafter term + weight * lp`` is -inf or NaN exactly as with
    its row, the row being a log-probability <= 0; at ``weight`` 0 every row is scored, since
    ``0 * -inf`` is NaN). ``unigram_probs``, ``starts`` and ``finite``: ``search_tables``' (the
    unigram stage read from its row, the higher orders' lookups inside the ranges of their oldest
    context token: ``kneser_ney_higher_indexed``). With ``weight`` > 0 and ``finite`` tables (every
    row a finite probability: its log a number or -inf), an invalid slot (drafter term -inf) is not
    scored: its extension is ``score - inf + weight * lp``, the same (-inf, or NaN from a NaN or +inf
    score) whatever finite or -inf ``lp`` it has, so 0 stands for it."""
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
    slots = np.empty(size, dtype=np.int64)
    skip_invalid = weight != 0.0 and finite
    for i in range(m):
        cand = tokens[i].copy()
        kept = 0  # the slots scored: every one, or the valid ones (see above)
        for c in range(size):
            if not (skip_invalid and drafter_term[i, c] == -np.inf):
                slots[kept] = c
                kept += 1
        scoring = np.empty(kept, dtype=np.int64)
        inside = True
        for k in range(kept):
            scoring[k] = cand[slots[k]]
            if 0 <= scoring[k] < unigram_probs.shape[0]:
                unigram[k] = unigram_probs[scoring[k]]
            else:
                inside = False
        if not inside:  # a token outside the table's rows: the unigram stage as it stands
            kneser_ney_unigram(
                keys, values, discounts, unigram_total, unigram_types, vocab_size, base, scoring, unigram[:kept]
            )
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
                row[:kept] = unigram[:kept]
                kneser_ney_higher_indexed(keys, values, discounts, base, order, starts, history[w], scoring, row[:kept])
                lp[w, :] = 0.0
                for k in range(kept):
                    lp[w, slots[k]] = np.float64(np.float32(np.log(row[k])))
            scored[w] = True
        if _beam_step(i, cand, drafter_term[i], lp, weight, scores, done, paths, history, stops):
            break
    return _best(paths, scores)


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A C-contiguous host array of ``tensor`` (a view on the CPU)."""
    return np.ascontiguousarray(tensor.cpu().numpy())


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


#: How close (in float64 ulps) an exp computed here may come to a float32 rounding boundary before
#: torch recomputes it: libm's and torch's float64 exp are each within 1 ulp of the true value, so
#: farther away both round to the same float32 (``_finish``).
EXP_ULPS = 8.0


@njit(cache=True)
def _history(context: np.ndarray, keep: int, start: int) -> np.ndarray:
    """The scorer's context ``(keep,)`` int64 from the last tokens of ``context`` ``(c,)`` int64,
    ``start`` (the start symbol) in front of a short one (``NGramModel.pad_context``)."""
    history = np.full(keep, start, dtype=np.int64)
    c = context.shape[0]
    take = min(c, keep)
    for j in range(take):
        history[keep - take + j] = context[c - take + j]
    return history


@njit(cache=True)
def _finish(
    tokens: np.ndarray, log_q: np.ndarray, valid: np.ndarray, n: int, stops: np.ndarray, path: np.ndarray, ulps: float
) -> tuple[np.ndarray, int]:
    """The path's drafter probabilities and end: ``path`` ``(p,)`` int64 through the lattice
    (``tokens`` / ``valid`` ``(N, M)``, ``log_q`` ``(N M,)`` float32 torch's logs) -> ``q`` ``(p,)``
    float32, each path token's slot's ``exp(float64(log q))`` rounded to float32 as torch's
    ``log_q.double().exp().float()``, and a code: bit 0 the lattice ended early (``p < n`` or the
    path's last token a stop token), bit 1 some exp came within ``ulps`` float64 ulps of a float32
    rounding boundary (libm's exp and torch's may round apart there: the caller asks torch)."""
    p, size = path.shape[0], tokens.shape[1]
    slots = _path_slots(tokens, valid, path)
    q = np.empty(p, dtype=np.float32)
    code = 0
    for i in range(p):
        e = math.exp(np.float64(log_q[i * size + slots[i]]))
        f = np.float32(e)
        up = (np.float64(f) + np.float64(np.nextafter(f, np.float32(np.inf)))) * 0.5
        down = (np.float64(f) + np.float64(np.nextafter(f, np.float32(-np.inf)))) * 0.5
        tolerance = ulps * 2.220446049250313e-16 * abs(e)
        if not (abs(e - up) > tolerance and abs(e - down) > tolerance):
            code |= 2
        q[i] = f
    if p < n:
        code |= 1
    elif p > 0:
        for s in stops:
            if path[p - 1] == s:
                code |= 1
    return q, code


@njit(cache=True)
def _finish_kneser_ney(
    tokens: np.ndarray,
    log_q: np.ndarray,
    valid: np.ndarray,
    m: int,
    n: int,
    lam: float,
    width: int,
    context: np.ndarray,
    stops: np.ndarray,
    ulps: float,
    keys: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray,
    unigram_total: float,
    unigram_types: float,
    vocab_size: int,
    base: int,
    order: int,
    unigram_probs: np.ndarray,
    starts: np.ndarray,
    finite: bool,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Everything after the lattice's log, compiled whole, with an ``NGramModel`` scorer: the drafter
    term ``lam * float64(log q)`` (-inf where a slot is invalid), the beams of Eq. 8
    (``_beams_kneser_ney_shared`` from ``context`` ``(c,)`` int64's last ``order - 1`` tokens, start
    symbols in front of a short one) over the lattice's ``m`` positions (``tokens`` / ``valid``
    ``(N, M)``, ``log_q`` ``(N M,)`` float32), then ``_finish``: ``(path (p,) int64, q (p,) float32,
    code)``."""
    size = tokens.shape[1]
    drafter_term = np.empty((m, size))
    for i in range(m):
        for j in range(size):
            drafter_term[i, j] = lam * np.float64(log_q[i * size + j]) if valid[i, j] else -np.inf
    history = _history(context, order - 1, vocab_size)
    path = _beams_kneser_ney_shared(
        tokens[:m], drafter_term, history, stops, width, 1.0 - lam,
        keys, values, discounts, unigram_total, unigram_types, vocab_size, base, order, unigram_probs, starts, finite,
    )  # fmt: skip
    q, code = _finish(tokens, log_q, valid, n, stops, path, ulps)
    return path, q, code
