"""``dart-tree`` policy: DART's n-gram-pruned draft tree from ONE drafter pass (Liang et al., arXiv
2601.19278, §3.4; fvliang/DART ``tree_search/tree_search.py`` -> ``cpplib/cpp_search/searcher.cpp``,
``Searcher::search``, config ``tree_search_config.py``).

The rule, as the code runs it:

* per depth l = 0 .. d - 1 of the pass, the top ``top_k`` (25) draft tokens, their probabilities the
  softmax over those 25 logits;
* a beam search from the empty path: every beam is extended by every candidate of the depth, the
  child scoring ``parent + (l + 1)^-0.7 * [0.9^l * log(p + 1e-10) + 0.5 * log(p_ngram + 1e-10)]``
  (``level_weights_func``, ``logit_weights_func``, ``ngram_weights``); the built extension defines
  ``NO_NGRAM_ON_FIRST_TOKEN``, so depth 0 is scored by the drafter alone;
* the children are sorted with those ending in EOS last, then by score, and the best ``beam_width``
  (20) are the next depth's beams (a beam ending in EOS is still extended);
* EVERY child of every depth goes into one pool; the best ``total_tokens`` (theta; paper 59, code
  60) by score form the tree -- a tree, since a child never scores above its parent (ties kept in
  creation order: a parent before its children);
* ``p_ngram`` is DART's trie probability of the token after the last ``order - 1`` tokens of
  committed + path (``NGramModel.trie_probs``; the default n-gram file is the target's own GSM8K
  continuations, ``bundle/ngram/gsm8k-target.npz``).

The beam search is compiled (numba, as the reference's is host C++): per depth, one call gives every
beam's n-gram probabilities (``_dart_ngram``), numpy takes their float32 logs, and one call scores,
pools and picks the next beams (``_dart_depth``), the same float32 operations as the numpy search
it replaced (``tests/policies/test_dart_tree_equivalence.py``). With beams at least as wide as the
tree the same tree comes from a best-first search (``_best_first``, paths ending in a stop token kept
as leaves).
The target verifies the tree in one pass (``specpolicy.core.tree``); its nodes are verified as point
masses when sampling (lossless). ``ngram_weight=0`` turns the n-gram term off (the paper's
ablation); ``use_ngram: false`` does the same.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
import torch
from numba import njit

from specpolicy.core import compiled
from specpolicy.core.checks import check_init
from specpolicy.core.errors import ConfigError
from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import NgramBlockDrafter, device_of
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "dart-tree"
#: log(p + EPS): the code's guard against log 0.
EPS = 1e-10


def dart_tree_search(
    ids: torch.Tensor,
    probs: torch.Tensor,
    context: torch.Tensor,
    ngram: Any | None,
    stop_ids: torch.Tensor,
    beam_width: int = 20,
    total_tokens: int = 60,
    level_power: float = -0.7,
    logit_decay: float = 0.9,
    ngram_weight: float = 0.5,
    ngram_on_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DART's tree search over one pass's per-depth candidates (module docstring).

    Args:
        ids: ``(D, K) int64`` each depth's candidate tokens (target ids), best first.
        probs: ``(D, K) float32`` their probabilities (the softmax over the K candidates).
        context: ``(c,) int64`` the committed tokens before the path, the pending one last.
        ngram: an ``NGramModel`` (``trie_probs``) or None (no n-gram term).
        stop_ids: ``(s,) int64`` tokens whose paths sort last among the beams.
        ngram_on_first: score depth 0 with the n-gram too (the code's build does not).
    Returns:
        ``(tokens (n,) int64, parents (n,) int64 (-1: the root), scores (n,) float32, draft log-probs
        (n,) float32)`` of the kept nodes, a parent before its children (the beams: creation
        order; best-first: pop order), n <= ``total_tokens``.

    With ``beam_width >= total_tokens`` the beam search keeps every node of the best
    ``total_tokens`` (a node's ancestors score at least as much, so fewer than ``total_tokens``
    nodes of its depth outrank it), and the same tree, up to exact ties, comes from a best-first
    search that expands only the popped nodes (``_best_first``: ``total_tokens`` x K dict lookups
    instead of a beam front of ``beam_width`` x K array entries per depth). It treats a path ending
    in a stop token as a leaf, as the beams do whenever ``beam_width`` other candidates remain (its
    children could never be accepted).
    """
    if beam_width >= total_tokens:
        return _best_first(
            ids, probs, context, ngram, stop_ids, total_tokens, level_power, logit_decay, ngram_weight, ngram_on_first
        )
    # compiled, per depth: the n-gram probabilities of every beam's candidates (``_dart_ngram``), their
    # logs (numpy's float32 log, as the numpy search took them), then the scores, the pool and the
    # next beams (``_dart_depth``); the reference runs host C++ for the same reason
    ids_np = np.ascontiguousarray(ids.cpu().numpy(), dtype=np.int64)
    D, K = ids_np.shape
    logp = np.log(probs.float().cpu().numpy() + np.float32(EPS))  # (D, K) float32
    ends_at = np.isin(ids_np, stop_ids.cpu().numpy())  # (D, K) candidates that end a path (EOS)
    ctx_np = np.ascontiguousarray(context.cpu().numpy(), dtype=np.int64)
    order = ngram.order if ngram is not None else 1
    state = _DartBeams(D, K, beam_width)
    for level in range(D):
        log_ngram = _NO_NGRAM
        if ngram is not None and ngram_weight != 0 and (level > 0 or ngram_on_first):
            tables = ngram.compiled_trie()
            p_ngram = _dart_ngram(ctx_np, state.beams, state.length, order, ngram.vocab_size, ids_np[level], *tables)
            log_ngram = np.log(p_ngram + np.float32(EPS))  # (B, K)
        state.length = _dart_depth(
            level,
            ids_np[level],
            logp[level],
            ends_at[level],
            np.float32(logit_decay**level),
            np.float32((level + 1) ** level_power),
            np.float32(ngram_weight),
            log_ngram,
            *state.arrays(),
        )
    tokens, parents, scores, drafter = state.pool()
    kept = _best_set(scores, total_tokens)
    index = np.full(tokens.shape[0] + 1, -1, dtype=np.int64)  # index[c + 1]: pool entry c's node
    index[kept + 1] = np.arange(kept.shape[0])
    return (
        torch.from_numpy(tokens[kept]),
        torch.from_numpy(index[parents[kept] + 1]),
        torch.from_numpy(scores[kept]),
        torch.from_numpy(drafter[kept]),
    )


_NO_NGRAM = np.zeros((0, 0), dtype=np.float32)


class _DartBeams:
    """The beam search's state, in arrays the compiled steps fill: the beams (at most ``width``;
    ``count[0]`` of them, each a path of ``length`` tokens) with their scores, drafter log-probs and
    pool numbers (-1: the root), and the pool of every child so far (``count[1]`` entries)."""

    def __init__(self, depth: int, k: int, width: int) -> None:
        self.length = 0
        self.beams = np.zeros((width, depth), dtype=np.int64)
        self.scores = np.zeros(width, dtype=np.float32)
        self.drafter = np.zeros(width, dtype=np.float32)
        self.nodes = np.full(width, -1, dtype=np.int64)
        self.count = np.array([1, 0], dtype=np.int64)  # beams, pooled
        size = k + (depth - 1) * width * k
        self.pool_tokens = np.zeros(size, dtype=np.int64)
        self.pool_parents = np.zeros(size, dtype=np.int64)
        self.pool_scores = np.zeros(size, dtype=np.float32)
        self.pool_drafter = np.zeros(size, dtype=np.float32)

    def arrays(self) -> tuple:
        return (
            self.length,
            self.beams,
            self.scores,
            self.drafter,
            self.nodes,
            self.count,
            self.pool_tokens,
            self.pool_parents,
            self.pool_scores,
            self.pool_drafter,
        )

    def pool(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = int(self.count[1])
        return self.pool_tokens[:n], self.pool_parents[:n], self.pool_scores[:n], self.pool_drafter[:n]


@njit(cache=True)
def _dart_ngram(
    context,
    beams,
    length,
    order,
    start,
    candidates,
    keys,
    counts,
    starts,
    follower_keys,
    follower_counts,
    follower_starts,
):
    """The trie probability (``NGramModel.trie_probs_np``) of each of ``count`` beams' candidates
    ``(K,)``: each beam's context is the last ``order - 1`` tokens of ``context`` + its path, start
    symbols in front of a short one. ``beams`` ``(W, D)``: the first rows hold the beams; all W
    rows are scored (-> ``(W, K) float32``; the caller reads the live ones)."""
    width = beams.shape[0]
    ctx = np.full((width, order - 1), start, dtype=np.int64)
    c = context.shape[0]
    for b in range(width):
        for j in range(order - 1):  # position j of the window: token (c + length) - (order - 1) + j of ctx + path
            at = c + length - (order - 1) + j
            if at >= c:
                ctx[b, j] = beams[b, at - c]
            elif at >= 0:
                ctx[b, j] = context[at]
    tokens = np.empty((width, candidates.shape[0]), dtype=np.int64)
    for b in range(width):
        tokens[b] = candidates
    return compiled.trie_probs(
        keys, counts, starts, follower_keys, follower_counts, follower_starts, start + 1, ctx, tokens
    )


@njit(cache=True)
def _first_in_order(scores, ends, K, m):
    """The first ``m`` of the children ``0 .. n - 1`` (``scores`` ``(n,) float32``; child i ends a
    path when ``ends[i % K]``) in the stable order of (ends, -score): the non-ending children by
    score, then the ending ones, ties in creation order, NaN scores last in their group -- what a
    stable sort of each group by ``-score`` gives (``np.argsort(kind="mergesort")``), found by
    insertion into the ``m`` kept (m is the beam width, n = beams x K)."""
    keep = np.empty(m, dtype=np.int64)
    filled = 0
    for i in range(scores.shape[0]):
        pos = filled
        while pos > 0 and _ranks_before(scores, ends, K, i, keep[pos - 1]):
            pos -= 1
        if pos >= m:
            continue
        for j in range(min(filled, m - 1), pos, -1):
            keep[j] = keep[j - 1]
        keep[pos] = i
        filled = min(filled + 1, m)
    return keep


@njit(cache=True, inline="always")
def _ranks_before(scores, ends, K, i, j):
    """Child i strictly ahead of child j in (ends, -score) order (an equal one stays behind)."""
    end_i, end_j = ends[i % K], ends[j % K]
    if end_i != end_j:
        return not end_i
    x, y = scores[i], scores[j]
    return (np.isnan(y) and not np.isnan(x)) or x > y


@njit(cache=True)
def _dart_depth(
    level,
    ids,
    logp,
    ends,
    decay,
    weight,
    ngram_weight,
    log_ngram,
    length,
    beams,
    beam_scores,
    beam_drafter,
    beam_nodes,
    count,
    pool_tokens,
    pool_parents,
    pool_scores,
    pool_drafter,
):
    """One depth of the beam search, in place: every beam extended by every candidate (the step
    score in float32, as the numpy search computed it: ``beam + weight * (decay * logp + ngram_weight
    * log p_ngram)``), the children pooled in creation order, and the next beams the best
    ``width``: EOS-ending last, then by score, ties in creation order (``np.lexsort``'s). Returns the
    beams' new length."""
    B, K, width = count[0], ids.shape[0], beams.shape[0]
    n = B * K
    scores = np.empty(n, dtype=np.float32)
    drafter = np.empty(n, dtype=np.float32)
    first = count[1]
    for b in range(B):
        for c in range(K):
            term = decay * logp[c]
            if log_ngram.shape[0]:
                term = term + ngram_weight * log_ngram[b, c]
            i = b * K + c
            scores[i] = beam_scores[b] + weight * term
            drafter[i] = beam_drafter[b] + logp[c]
            pool_tokens[first + i] = ids[c]
            pool_parents[first + i] = beam_nodes[b]
            pool_scores[first + i] = scores[i]
            pool_drafter[first + i] = drafter[i]
    count[1] = first + n
    keep = _first_in_order(scores, ends, K, min(width, n))
    old = beams[:B, :length].copy()
    for j in range(keep.shape[0]):
        i = keep[j]
        beams[j, :length] = old[i // K]
        beams[j, length] = ids[i % K]
        beam_scores[j], beam_drafter[j], beam_nodes[j] = scores[i], drafter[i], first + i
    count[0] = keep.shape[0]
    return length + 1


def _best_set(scores: np.ndarray, n: int) -> np.ndarray:
    """The ascending indices of the ``n`` best ``scores`` (``(P,) float32``), ties to the earlier
    index: the set ``np.sort(np.argsort(-scores, kind="stable")[:n])`` holds, found with one
    partition (linear) instead of a sort of the whole pool (thousands of nodes at DART's settings)."""
    if n >= scores.shape[0]:
        return np.arange(scores.shape[0])
    threshold = np.partition(scores, scores.shape[0] - n)[scores.shape[0] - n]  # the n-th best score
    above = scores > threshold
    at = np.flatnonzero(scores == threshold)[: n - int(above.sum())]  # ties: the earliest
    return np.sort(np.concatenate([np.flatnonzero(above), at]))


def _best_first(
    ids: torch.Tensor,
    probs: torch.Tensor,
    context: torch.Tensor,
    ngram: Any | None,
    stop_ids: torch.Tensor,
    total_tokens: int,
    level_power: float,
    logit_decay: float,
    ngram_weight: float,
    ngram_on_first: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dart_tree_search`` for ``beam_width >= total_tokens``: the ``total_tokens`` best nodes by
    the same step score, popped best first from a heap (ties in push order); the nodes come out
    in pop order, parents first. Arguments and returns as ``dart_tree_search``."""
    ids_l = ids.tolist()
    logp = torch.log(probs.float() + EPS).tolist()
    D = len(ids_l)
    weight = [(level + 1) ** level_power for level in range(D)]
    decay = [logit_decay**level for level in range(D)]
    stops = set(stop_ids.tolist())
    use_ngram = ngram is not None and ngram_weight != 0
    if use_ngram:
        counts, parent_counts = ngram.trie_tables()
        order, base = ngram.order, ngram.base
        root_tail = tuple(ngram.pad_context(context.cpu()).tolist())  # the order - 1 tokens before depth 0
    else:
        order, root_tail = 1, ()

    def ngram_logs(tail: tuple[int, ...], level: int) -> list[float]:
        """``log(p_ngram + EPS)`` of depth ``level``'s candidates after ``tail`` (the trie rule:
        the longest suffix of ``tail`` the candidate was seen after; ``NGramModel.trie_probs``)."""
        suffixes = []  # (code of the j-token suffix, its trie count), j = order - 1 .. 1
        for j in range(order - 1, 0, -1):
            code = 0
            for t in tail[-j:]:
                code = code * base + t
            suffixes.append((code * base, counts[j], max(parent_counts[j - 1].get(code, 0), 1)))
        out = []
        for tok in ids_l[level]:
            p = 0.0
            for code, table, parent in suffixes:
                child = table.get(code + tok)
                if child:
                    p = child / parent
                    break
            out.append(math.log(p + EPS) if p < 1 else 0.0)  # log(1 + EPS) is 0 in the beams' float32
        return out

    heap: list[tuple[float, int, int, int, int, float, tuple[int, ...]]] = []
    pushed = 0

    def expand(level: int, node: int, score: float, drafter: float, tail: tuple[int, ...]) -> None:
        nonlocal pushed
        scored = use_ngram and (level > 0 or ngram_on_first)
        ngram_terms = ngram_logs(tail, level) if scored else None
        for c in range(len(ids_l[level])):
            term = decay[level] * logp[level][c]
            if ngram_terms is not None:
                term += ngram_weight * ngram_terms[c]
            heapq.heappush(
                heap, (-(score + weight[level] * term), pushed, level, c, node, drafter + logp[level][c], tail)
            )
            pushed += 1

    expand(0, -1, 0.0, 0.0, root_tail)
    tokens, parents, scores, drafter_logp = [], [], [], []
    while heap and len(tokens) < total_tokens:
        neg, _, level, c, parent, drafter, tail = heapq.heappop(heap)
        node, tok = len(tokens), ids_l[level][c]
        tokens.append(tok)
        parents.append(parent)
        scores.append(-neg)
        drafter_logp.append(drafter)
        if level + 1 < D and tok not in stops:
            expand(level + 1, node, -neg, drafter, (tail + (tok,))[1:] if order > 1 else ())
    return (
        torch.tensor(tokens, dtype=torch.long),
        torch.tensor(parents, dtype=torch.long),
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(drafter_logp, dtype=torch.float32),
    )


class DartTreePolicy(TreePolicy):
    """DART's tree over one pass of a ``dart`` drafter.

    Args:
        top_k: candidates per depth (the code's ``topk_func``: 25), >= 1.
        beam_width: beams kept per depth (20), >= 1.
        total_tokens: theta, nodes kept (paper 59, code 60; ``conf/policy/dart-tree.yaml`` states the
            value sized for this CPU), >= 1.
        depth: depths searched, >= 1 (default: one pass's tokens, d = 8 for DART, B - 1 = 15 for
            DFlash; more costs later passes).
        level_power, logit_decay, ngram_weight: the step score's (l + 1)^level_power,
            logit_decay^l and n-gram weight (-0.7, 0.9, 0.5).
        ngram: a bundled n-gram name (``gsm8k-target``, ``gsm8k-train``) or an ``.npz`` file.
        use_ngram: False drops the n-gram term (the ablation; same as ``ngram_weight=0``).
        ngram_on_first: score depth 0 with the n-gram too (the released build does not).
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(
        self,
        top_k: int = 25,
        beam_width: int = 20,
        total_tokens: int = 60,
        depth: int | None = None,
        level_power: float = -0.7,
        logit_decay: float = 0.9,
        ngram_weight: float = 0.5,
        ngram: str = "gsm8k-target",
        use_ngram: bool = True,
        ngram_on_first: bool = False,
        ngram_model: Any | None = None,
    ) -> None:
        for key, value in (("top_k", top_k), ("beam_width", beam_width), ("total_tokens", total_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"policy.{key} must be an integer >= 1, got {value!r}")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise ValueError(f"policy.depth must be an integer >= 1 or null (the drafter's block), got {depth!r}")
        for key, value in (("level_power", level_power), ("logit_decay", logit_decay), ("ngram_weight", ngram_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"policy.{key} must be a number, got {value!r}")
        if not 0 < logit_decay <= 1 or ngram_weight < 0:
            raise ValueError(
                f"policy.logit_decay must be in (0, 1] and policy.ngram_weight >= 0, got {logit_decay!r}, {ngram_weight!r}"
            )
        self.top_k, self.beam_width, self.total_tokens, self.depth = top_k, beam_width, total_tokens, depth
        self.level_power, self.logit_decay = float(level_power), float(logit_decay)
        self.ngram_weight = float(ngram_weight) if use_ngram else 0.0
        self.ngram_on_first = bool(ngram_on_first)
        self.ngram_name = ngram
        self.ngram = ngram_model
        if self.ngram is None and self.ngram_weight > 0:
            from specpolicy.models.ngram import load_ngram, resolve_ngram_path

            if not isinstance(ngram, str) or not ngram:
                raise ConfigError(f"policy.ngram must be a bundled n-gram name or an .npz file, got {ngram!r}")
            self.ngram = load_ngram(resolve_ngram_path(ngram), "policy.ngram")
        # the compiled search's first call compiles it (or loads numba's cache): done here, before any
        # timed round; a two-depth pass of the real dtypes, beams narrower than the tree
        warm = torch.zeros((2, 1), dtype=torch.long)
        dart_tree_search(warm, torch.ones(2, 1), warm[0], self.ngram, warm[0], 1, 2, ngram_weight=self.ngram_weight)
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, NgramBlockDrafter):
            raise ValueError(
                f"policy=dart-tree needs a drafter that drafts a block in one pass and reports its "
                f"alternatives and n-gram context (dart, dflash); drafter "
                f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def draft_tree(self, drafter: NgramBlockDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        device = device_of(drafter)
        want = self.depth or drafter.tokens_per_pass
        depth = min(want, room)
        if depth < 1:
            return Draft.empty(device), "room"
        chain = drafter.draft(depth)
        n = chain.length
        if n == 0:
            return chain, "no_proposal"
        ids, probs = drafter.alternatives(self.top_k)  # (n, K) best first
        probs = probs[:n] / probs[:n].sum(-1, keepdim=True)  # the softmax over the top K logits
        stops = torch.tensor(getattr(drafter, "stop_token_ids", ()), dtype=torch.long)
        tokens, parents, _, logp = dart_tree_search(
            ids[:n].cpu(),
            probs.cpu(),
            drafter.ngram_context.cpu(),
            self.ngram if self.ngram_weight > 0 else None,
            stops,
            self.beam_width,
            min(self.total_tokens, node_room),
            self.level_power,
            self.logit_decay,
            self.ngram_weight,
            self.ngram_on_first,
        )
        draft = Draft(
            token_ids=tokens.to(device),
            confidences=logp.exp().to(device),
            forward_passes=chain.forward_passes,
            parents=parents.to(device),
        )
        return draft, "room" if depth < want else "policy_bound"

    def __repr__(self) -> str:
        return (
            f"DartTreePolicy(top_k={self.top_k}, beam_width={self.beam_width}, total_tokens={self.total_tokens}, "
            f"ngram_weight={self.ngram_weight}, ngram={self.ngram_name!r})"
        )


#: The config keys (the n-gram model object is for tests and callers, not configs).
CONFIG_KEYS = (
    "top_k",
    "beam_width",
    "total_tokens",
    "depth",
    "level_power",
    "logit_decay",
    "ngram_weight",
    "ngram",
    "use_ngram",
    "ngram_on_first",
)


def validate(config: dict[str, Any]) -> None:
    """``policy=dart-tree``: its keys (``CONFIG_KEYS``: not ``ngram_model``) and ranges and the
    n-gram file, checked by building it (no model).

    Raises:
        ConfigError: naming the key, the value and the accepted range.
    """
    from specpolicy.core.checks import check_keys

    check_keys("policy", config, CONFIG_KEYS)
    check_init("policy", DartTreePolicy, config)


def build(config: dict[str, Any]) -> DartTreePolicy:
    """``policy=dart-tree`` from its config node (keys: ``CONFIG_KEYS``)."""
    return DartTreePolicy(**config)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the ``dart-tree`` policy."""
    return [PluginEntry("policy", NAME, build, validate, "DART's n-gram-pruned draft tree from one drafter pass")]
