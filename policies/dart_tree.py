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

The search is compiled (numba, as the reference's is host C++), ONE call per round
(``specpolicy.core.compiled_dart``): every depth's n-gram lookups, scores, pool and next beams, each
n-gram log read beside the trie's keys (``NGramModel.trie_logs``), the same float32 operations as the
numpy search it replaced, skipping exactly the children that cannot change the tree
(``tests/policies/test_dart_tree_equivalence.py``). With beams at least as wide as the tree the same
tree comes from a best-first search (``compiled_dart.best_first_search``; paths ending in a stop
token kept as leaves).
The target verifies the tree in one pass (``specpolicy.core.tree``); its nodes are verified as point
masses when sampling (lossless). ``ngram_weight=0`` turns the n-gram term off (the paper's
ablation); ``use_ngram: false`` does the same.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import torch

from specpolicy.core import compiled_dart
from specpolicy.core.checks import check_init
from specpolicy.core.errors import ConfigError
from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import NgramBlockDrafter
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
        ngram: an ``NGramModel`` (``trie_logs``) or None (no n-gram term).
        stop_ids: ``(s,) int64`` tokens whose paths sort last among the beams.
        ngram_on_first: score depth 0 with the n-gram too (the code's build does not).
    Returns:
        ``(tokens (n,) int64, parents (n,) int64 (-1: the root), scores (n,) float32, draft log-probs
        (n,) float32)`` of the kept nodes, a parent before its children (the beams: creation
        order; best-first: pop order), n <= ``total_tokens``.

    The whole search is ONE compiled call (``compiled_dart.beam_search``; the reference runs host
    C++ for the same reason), its float32 operations those of the numpy search it replaced
    (``tests/policies/test_dart_tree_equivalence.py``); each n-gram log is read off the trie's
    keys (``compiled_dart.log_entries``) rather than taken per depth.

    With ``beam_width >= total_tokens`` the beam search keeps every node of the best
    ``total_tokens`` (a node's ancestors score at least as much, so fewer than ``total_tokens``
    nodes of its depth outrank it), and the same tree, up to exact ties, comes from a best-first
    search that expands only the popped nodes (``compiled_dart.best_first_search``: ``total_tokens``
    x K scores in float64 instead of a beam front of ``beam_width`` x K entries per depth). It
    treats a path ending in a stop token as a leaf, as the beams do whenever ``beam_width`` other
    candidates remain (its children could never be accepted).
    """
    stops = np.ascontiguousarray(stop_ids.cpu().numpy(), dtype=np.int64)
    ctx = np.ascontiguousarray(context.cpu().numpy(), dtype=np.int64)
    best_first = beam_width >= total_tokens
    ids_np, logp = _host_inputs(ids, probs, best_first)
    use = ngram is not None and ngram_weight != 0
    settings = _settings(ngram if use else None, best_first, ids_np.shape[0], level_power, logit_decay, ngram_weight)
    state = _state(settings, 0 if ngram_on_first else 1, beam_width)
    found = _run(ids_np, logp, stops, ctx, state, max(total_tokens, 0))
    return tuple(torch.from_numpy(x) for x in found)  # type: ignore[return-value]


#: the first depth scored by the n-gram when it is off (never reached)
_NEVER = 1 << 62


def _host_inputs(ids: torch.Tensor, probs: torch.Tensor, best_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """The pass's candidates ``(D, K) int64`` and their float32 log-probabilities ``log(p + EPS)``
    ``(D, K)`` on the host, as the searches read them: torch's log for the best-first search,
    numpy's for the beams (the searches they replaced took them so)."""
    ids_np = np.ascontiguousarray(ids.cpu().numpy(), dtype=np.int64)
    if best_first:
        return ids_np, np.ascontiguousarray(torch.log(probs.float() + EPS).cpu().numpy())
    return ids_np, np.log(np.ascontiguousarray(probs.float().cpu().numpy()) + _EPS32)


def _run(
    ids: np.ndarray, logp: np.ndarray, stops: np.ndarray, context: np.ndarray, state: np.ndarray, total: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One search from a packed ``state`` (``_state``) into new arrays: ``(tokens (n,) int64, parents
    (n,) int64, scores (n,) float32, drafter log-probs (n,) float32)``."""
    ints, floats = np.empty((2, max(total, 1)), np.int64), np.empty((2, max(total, 1)), np.float32)
    n = compiled_dart.search(state, ids, logp, stops, context, total, ints, floats)
    return ints[0, :n], ints[1, :n], floats[0, :n], floats[1, :n]


def _state(settings: tuple, first_scored: int, width: int) -> np.ndarray:
    """``settings`` (``_settings``) with the first depth the n-gram scores (when it is on) and the
    beam width, packed for ``compiled_dart.search`` (``compiled_dart.pack_state``)."""
    best_first, order, base, entries, contexts, offsets, log_eps, scored_from, decay, weight, ngram_weight, prune = (
        settings
    )
    first = first_scored if scored_from == 0 else scored_from
    return compiled_dart.pack_state(
        order, base, first, width, prune, best_first, float(log_eps), float(ngram_weight),
        decay, weight, entries, contexts, offsets,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _step_weights(depth: int, level_power: float, logit_decay: float, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """The step score's per-depth factors ``(depth,)`` of ``dtype``: ``(l + 1) ** level_power`` and
    ``logit_decay ** l`` (each computed as a Python float, then cast), built once per setting (a
    round's search reads them, never writes)."""
    weight = np.array([dtype((level + 1) ** level_power) for level in range(depth)], dtype=dtype)
    decay = np.array([dtype(logit_decay**level) for level in range(depth)], dtype=dtype)
    return weight, decay


#: ``log(0 + EPS)``, a candidate the n-gram never saw: numpy's float32 log (the beams'), Python's float64 log
_LOG_EPS = (np.log(np.zeros(1, np.float32) + np.float32(EPS))[0], math.log(0.0 + EPS))
#: float32 EPS, added to the beams' float32 probabilities
_EPS32 = np.float32(EPS)
#: no n-gram: no entries, an empty context table and its order offsets (never read: no depth is scored)
_NO_TABLES = (np.zeros((0, 2), np.int64), np.full((1, 2), -1, np.int64), np.zeros(2, np.int64))


def _settings(
    ngram: Any | None, best_first: bool, depth: int, level_power: float, logit_decay: float, ngram_weight: float
) -> tuple:
    """What a search of ``depth`` depths reads besides its pass (``_run``): ``(best_first, order,
    base, log entries, context table, its order offsets, log_eps, first scored depth (0: the
    caller's), decay, weight, ngram_weight, prune)`` in the kernel's types (the beams' float32,
    best-first's float64); the per-depth factors hold for any depth up to ``depth``. ``prune``:
    every n-gram log and ``log_eps`` <= 0 (``compiled_dart``'s bounds hold)."""
    kind = 1 if best_first else 0
    dtype = np.float64 if best_first else np.float32
    weight, decay = _step_weights(depth, level_power, logit_decay, dtype)
    if ngram is None:
        return (best_first, 1, 1, *_NO_TABLES, _LOG_EPS[kind], _NEVER, decay, weight, dtype(0.0), True)
    (entries, at_most_zero), (contexts, offsets) = _log_tables(ngram)[kind], _context_tables(ngram)
    settings = (
        ngram.order,
        ngram.base,
        entries,
        contexts,
        offsets,
        _LOG_EPS[kind],
        0,
        decay,
        weight,
        dtype(ngram_weight),
    )
    return (best_first, *settings, at_most_zero and _LOG_EPS[kind] <= 0)


def _log_tables(ngram: Any) -> tuple[tuple[np.ndarray, bool], ...]:
    """The n-gram's trie entries with their float32 (0) and float64 (1) logs beside the keys
    (``compiled_dart.log_entries``; ``NGramModel.compiled_trie``, ``trie_logs``), each with whether
    every log is <= 0. Built once per model, kept on it."""
    held = ngram.__dict__.get("_dart_log_entries")
    if held is None:
        keys, counts = ngram.compiled_trie()[:2]
        held = []
        for logs in ngram.trie_logs(EPS):
            entries = compiled_dart.log_entries(keys, counts, logs)
            values = entries.view(np.float64)[:, 1]
            held.append((entries, bool(np.all(np.isnan(values) | (values <= 0)))))
        held = ngram.__dict__["_dart_log_entries"] = tuple(held)
    return held


def _context_tables(ngram: Any) -> tuple[np.ndarray, np.ndarray]:
    """Where each context's continuations are among the n-gram's sorted trie keys
    (``compiled_dart.context_ranges``). Built once per model, kept on it."""
    held = ngram.__dict__.get("_dart_context_ranges")
    if held is None:
        keys, _, starts = ngram.compiled_trie()[:3]
        held = ngram.__dict__["_dart_context_ranges"] = compiled_dart.context_ranges(keys, starts, ngram.base)
    return held


def _tree_draft(tokens: torch.Tensor, confidences: torch.Tensor, passes: int, parents: torch.Tensor) -> Draft:
    """``Draft(token_ids=tokens, confidences=confidences, forward_passes=passes, parents=parents)``
    without the frozen dataclass's ``object.__setattr__`` per field (a round builds one): the
    fields not given take their defaults (``extras`` a new empty dict), as ``RoundRecord.built``
    builds records."""
    draft = object.__new__(Draft)
    draft.__dict__.update(_DRAFT_DEFAULTS)
    for name, factory in _DRAFT_FACTORIES:
        draft.__dict__[name] = factory()
    draft.__dict__.update(token_ids=tokens, confidences=confidences, forward_passes=passes, parents=parents)
    return draft


#: ``Draft``'s fields with a plain default, and with a default factory (``_tree_draft``)
_DRAFT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Draft) if f.default is not dataclasses.MISSING}
_DRAFT_FACTORIES = tuple(
    (f.name, f.default_factory) for f in dataclasses.fields(Draft) if f.default_factory is not dataclasses.MISSING
)


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
        # timed round; a two-depth pass of the real dtypes, beams narrower than the tree, then as wide
        warm = torch.zeros((2, 1), dtype=torch.long)
        for width in (1, 2):
            dart_tree_search(
                warm, torch.ones(2, 1), warm[0], self.ngram, warm[0], width, 2, ngram_weight=self.ngram_weight
            )
        self._stops: dict[tuple, torch.Tensor] = {}
        self._search_ngram = self.ngram if self.ngram_weight > 0 else None
        self._first_scored = 0 if self.ngram_on_first else 1
        #: the search's packed state (``_state``) and the depths it covers, for beams narrower than the
        #: tree (False) and as wide (True)
        self._searches = {best_first: self._search_state(best_first, 1) for best_first in (False, True)}
        self._drafter: Any = None  # the drafter ``_adopt`` read last
        self._device: Any = "cpu"
        self._on_host = True
        self._device_from_drafts = False
        self._stops_t = torch.empty(0, dtype=torch.long)
        self._stops_np = self._stops_t.numpy()
        self._context_np: Any = None
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, NgramBlockDrafter):
            raise ValueError(
                f"policy=dart-tree needs a drafter that drafts a block in one pass and reports its "
                f"alternatives and n-gram context (dart, dflash); drafter "
                f"{getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def draft_tree(self, drafter: NgramBlockDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        """The round's tree: the drafter's pass (``draft``), its top-k per position (``alternatives``)
        and the search (``dart_tree_search``) over them, within ``room`` depths and ``node_room``
        nodes. On the CPU the search reads numpy views of the pass's tensors and the drafter's host
        n-gram context (``ngram_context_np`` where it has one), and writes the tree into new arrays
        the draft's tensors view: the same calls on the same values as ``dart_tree_search``."""
        want = self.depth or drafter.tokens_per_pass
        depth = min(want, room)
        if drafter is not self._drafter:  # what a round reads of the drafter, read once per drafter
            self._adopt(drafter)
        if depth < 1:
            return Draft.empty(self._device), "room"
        chain = drafter.draft(depth)
        n = chain.length
        if n == 0:
            return chain, "no_proposal"
        if self._device_from_drafts:  # a drafter without a runtime: the device its drafts are on
            self._device = chain.token_ids.device
            self._on_host = self._device.type == "cpu"
        ids, probs = drafter.alternatives(self.top_k)  # (n, K) best first
        total = min(self.total_tokens, node_room)
        if not self._on_host:
            return self._draft_on_device(drafter, ids[:n], probs[:n], total, chain.forward_passes), (
                "room" if depth < want else "policy_bound"
            )
        ids_np = ids.numpy()
        if ids_np.shape[0] != n:  # (the drafters' alternatives are the chain's n rows: no slicing op)
            ids_np, probs = ids_np[:n], probs[:n]
        probs = probs / probs.sum(-1, keepdim=True)  # the softmax over the top K logits
        best_first = self.beam_width >= total
        if best_first:
            logp = torch.log(probs + EPS).numpy()  # torch's float32 log (as dart_tree_search takes it)
        else:
            logp = probs.numpy() + _EPS32
            np.log(logp, out=logp)  # numpy's float32 log
        depths, state = self._searches[best_first]
        if depths < n:  # the per-depth factors of a deeper pass than any before
            depths, state = self._searches[best_first] = self._search_state(best_first, n)
        context = self._context_np() if self._context_np is not None else drafter.ngram_context.numpy()
        tokens, parents, _, logp_path = _run(ids_np, logp, self._stops_np, context, state, total)
        draft = _tree_draft(
            torch.from_numpy(tokens), torch.from_numpy(logp_path).exp(), chain.forward_passes, torch.from_numpy(parents)
        )
        return draft.counted(tokens.shape[0]), "room" if depth < want else "policy_bound"

    def _search_state(self, best_first: bool, depths: int) -> tuple[int, np.ndarray]:
        """``(depths, the packed search state)`` of this policy's settings for passes up to ``depths`` deep."""
        settings = _settings(
            self._search_ngram, best_first, depths, self.level_power, self.logit_decay, self.ngram_weight
        )
        return depths, _state(settings, self._first_scored, self.beam_width)

    def _adopt(self, drafter: Any) -> None:
        """Read what every round needs of ``drafter`` (its device, stop tokens and host n-gram
        context reader) once, not per round, and pack the searches' states for its deepest pass."""
        runtime = getattr(drafter, "runtime", None)  # ``device_of`` without its Protocol check
        self._drafter = drafter
        # without a runtime, the device of the drafter's drafts, read each round (the CPU until one)
        self._device_from_drafts = runtime is None
        self._device = "cpu" if runtime is None else runtime.torch_device
        self._on_host = torch.device(self._device).type == "cpu"
        stop_ids = tuple(getattr(drafter, "stop_token_ids", ()))
        if stop_ids not in self._stops:  # built once per set of stop tokens
            self._stops[stop_ids] = torch.tensor(stop_ids, dtype=torch.long)
        self._stops_t = self._stops[stop_ids]
        self._stops_np = np.ascontiguousarray(self._stops_t.numpy(), dtype=np.int64)
        self._context_np = getattr(drafter, "ngram_context_np", None)
        # the searches' packed states cover the deepest pass this drafter gives (its block, or the
        # policy's depth), packed here once rather than in the first round that reaches a new depth
        deepest = self.depth or drafter.tokens_per_pass
        for best_first, (depths, _) in tuple(self._searches.items()):
            if depths < deepest:
                self._searches[best_first] = self._search_state(best_first, deepest)

    def _draft_on_device(self, drafter: Any, ids: torch.Tensor, probs: torch.Tensor, total: int, passes: int) -> Draft:
        """``draft_tree``'s search off the CPU: the pass's tensors read to the host
        (``dart_tree_search``), the tree moved back to the drafter's device."""
        probs = probs / probs.sum(-1, keepdim=True)  # the softmax over the top K logits
        best_first = self.beam_width >= total
        ids_np, logp = _host_inputs(ids, probs, best_first)
        depths, state = self._searches[best_first]
        if depths < ids_np.shape[0]:
            depths, state = self._searches[best_first] = self._search_state(best_first, ids_np.shape[0])
        context = np.ascontiguousarray(drafter.ngram_context.cpu().numpy(), dtype=np.int64)
        tokens, parents, _, logp_path = _run(ids_np, logp, self._stops_np, context, state, total)
        device = self._device
        return Draft(
            token_ids=torch.from_numpy(tokens).to(device),
            confidences=torch.from_numpy(logp_path).exp().to(device),
            forward_passes=passes,
            parents=torch.from_numpy(parents).to(device),
        )

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
