"""``suffix`` drafter: model-free drafting from a suffix index of the prompt and the output so far.

Source: SuffixDecoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", arXiv 2411.04975, §3-4): the text seen so far is indexed by its
suffixes; a draft is the continuation of the longest suffix of the current sequence that
occurred before, chosen by frequency; no model, no forward pass. FailFast (arXiv 2512.20573,
§5 and App. E) compares against it as a model-free baseline and borrows its suffix matching
for draft reuse (``specpolicy.core.reuse``).

The index here is bounded-depth: for every context length ``n`` in ``[min_match, max_match]``
and every position ``p`` of the committed sequence ``x``, the context ``x[p-n:p]`` (a tuple of
``n`` token ids) maps to the tokens that followed it, ``x[p]``, with their counts and the last
position they were seen at. That is the depth-``max_match`` suffix trie of ``x`` flattened
into one hash map per depth; it grows by ``O(max_match)`` entries per committed token
(``commit`` indexes only the new tokens: no re-scan of the text), so drafting and committing
cost O(max_match^2) hash work per token and nothing on the accelerator.
"""

from __future__ import annotations

from typing import Any

import torch

from specpolicy.core.checks import check_init
from specpolicy.core.drafter import Drafter
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Draft, Verification
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "suffix"
CONFIG_KEYS = ("min_match", "max_match", "min_confidence")


class SuffixDrafter(Drafter):
    """Greedy walk of a suffix index over the prompt and the committed output (SuffixDecoding).

    Drafting one token: find the longest ``n`` (``max_match`` down to ``min_match``) such that
    the last ``n`` tokens of *committed sequence + this round's draft* occurred earlier in the
    committed sequence followed by some token; propose the token that most often followed that
    context (ties: the one seen most recently) and append it, then repeat from the extended
    sequence. When no context of at least ``min_match`` tokens matches (or the best
    continuation's confidence is below ``min_confidence``), the drafter proposes nothing more
    this round: ``draft(num_tokens)`` may return fewer tokens than asked, possibly none (the
    loop then verifies the draft as it stands; an empty draft is a plain decoding round).

    Confidence of a drafted token = frequency of the chosen continuation among all
    occurrences of the matched context, ``count(context -> token) / count(context)``, in
    (0, 1]; a context seen once gives confidence 1. This is SuffixDecoding's frequency score
    of one suffix-tree edge (its path score is the product over the draft, which the
    ``specdecpp`` policy computes from these per-token values; ``failfast`` gates on each).

    Only committed tokens are indexed (the draft is never indexed); draft reuse may append
    tokens the drafter did not propose, ``commit`` indexes whatever was committed.
    ``forward_passes`` is always 0 and ``max_context`` 0 (no limit of its own). With sampling
    (``generation.temperature`` > 0) the drafted tokens are point masses (``Draft.probs`` None),
    which speculative sampling accepts with the target's probability of the token.

    Args:
        runtime: shared runtime (the device of the returned tensors).
        min_match: shortest context (tokens) that may be matched, integer >= 1 (default 2).
        max_match: longest context (tokens) indexed and matched, integer >= ``min_match``
            (default 16).
        min_confidence: stop drafting when the best continuation's frequency is below this,
            in [0, 1] (default 0: never).
    Raises:
        ValueError: naming ``drafter.<key>`` for an out-of-range value.
    """

    name = NAME
    max_context = 0

    def __init__(self, runtime: Runtime, min_match: int = 2, max_match: int = 16, min_confidence: float = 0.0):
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"drafter.min_match must be an integer >= 1, got {min_match!r}")
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < min_match:
            raise ValueError(
                f"drafter.max_match must be an integer >= drafter.min_match ({min_match}), got {max_match!r}"
            )
        if (
            isinstance(min_confidence, bool)
            or not isinstance(min_confidence, (int, float))
            or not 0.0 <= min_confidence <= 1.0
        ):
            raise ValueError(f"drafter.min_confidence must be a number in [0, 1], got {min_confidence!r}")
        self.runtime = runtime
        self.min_match = min_match
        self.max_match = max_match
        self.min_confidence = float(min_confidence)
        self._tokens: list[int] = []
        # depth n -> {context (n-tuple) -> {next token -> [count, last position]}}
        self._index: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        self._totals: dict[int, dict[tuple[int, ...], int]] = {}
        self._draft: list[int] = []
        self._conf: list[float] = []
        self._stuck = False

    # -- the index --------------------------------------------------------------------------

    def _reset_index(self) -> None:
        self._tokens = []
        self._index = {n: {} for n in range(self.min_match, self.max_match + 1)}
        self._totals = {n: {} for n in range(self.min_match, self.max_match + 1)}

    def _append(self, tokens: list[int]) -> None:
        """Append committed ``tokens`` and index the contexts that end right before each of them."""
        x = self._tokens
        for tok in tokens:
            p = len(x)  # position of tok
            for n in range(self.min_match, min(self.max_match, p) + 1):
                ctx = tuple(x[p - n : p])
                followers = self._index[n].setdefault(ctx, {})
                entry = followers.get(tok)
                if entry is None:
                    followers[tok] = [1, p]
                else:
                    entry[0] += 1
                    entry[1] = p
                totals = self._totals[n]
                totals[ctx] = totals.get(ctx, 0) + 1
            x.append(tok)

    def lookup(self, sequence: list[int]) -> tuple[int, float, int] | None:
        """The continuation of the longest indexed suffix of ``sequence`` (token ids).

        Returns:
            ``(token, confidence, matched context length)``, or None when no suffix of at
            least ``min_match`` tokens was seen followed by a token.
        """
        for n in range(min(self.max_match, len(sequence)), self.min_match - 1, -1):
            ctx = tuple(sequence[len(sequence) - n :])
            followers = self._index[n].get(ctx)
            if followers:
                token, (count, _) = max(followers.items(), key=lambda kv: (kv[1][0], kv[1][1]))
                return token, count / self._totals[n][ctx], n
        return None

    # -- Drafter interface ---------------------------------------------------------------------

    def prefill(self, prompt_ids: torch.Tensor, sampling=None) -> None:
        """Index the prompt ((P,) int64, P >= 1). ``sampling`` (a ``SamplingConfig``) is accepted
        and ignored: the drafts stay deterministic and, when sampling, are verified as point
        masses (``Draft.probs`` None: accepted with probability p(x); lossless).

        Raises:
            ValueError: naming ``prompt_ids`` when empty.
        """
        n = int(prompt_ids.shape[0])
        if n < 1:
            raise ValueError("prompt_ids has 0 tokens; the suffix drafter needs at least 1")
        self._reset_index()
        self._append([int(t) for t in prompt_ids.tolist()])
        self._new_round()

    def _new_round(self) -> None:
        self._draft, self._conf, self._stuck = [], [], False

    def draft(self, num_tokens: int) -> Draft:
        """Extend the round's draft by at most ``num_tokens`` tokens (fewer, possibly none, when
        no indexed suffix matches); ``forward_passes`` is 0.

        Raises:
            ValueError: for ``num_tokens`` < 1.
            RuntimeError: before ``prefill``.
        """
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        if not self._tokens:
            raise RuntimeError("draft() called before prefill()")
        if not self._stuck:
            tail = self._tokens[-self.max_match :] + self._draft  # the longest suffix we may match
            for _ in range(num_tokens):
                hit = self.lookup(tail)
                if hit is None or hit[1] < self.min_confidence:
                    self._stuck = True  # nothing more this round: the sequence only grows at commit
                    break
                self._draft.append(hit[0])
                self._conf.append(hit[1])
                tail.append(hit[0])
        dev = self.runtime.torch_device
        return Draft.chain(  # its length counted here: no shape read
            torch.tensor(self._draft, dtype=torch.long, device=dev),
            torch.tensor(self._conf, dtype=torch.float32, device=dev),
            0,
            len(self._draft),
        )

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Index ``verification.committed_tokens(draft)`` (accepted prefix + correction/bonus) and
        start a new round."""
        self._append([int(t) for t in verification.committed_tokens(draft).tolist()])
        self._new_round()

    def __repr__(self) -> str:
        return (
            f"SuffixDrafter(min_match={self.min_match}, max_match={self.max_match}, "
            f"min_confidence={self.min_confidence})"
        )


def validate(config: dict[str, Any]) -> None:
    """``drafter=suffix``: known keys and ranges, checked by building it (no model)."""
    check_init("drafter", SuffixDrafter, config, "runtime")


def build(config: dict[str, Any], runtime: Runtime, verifier) -> SuffixDrafter:
    """Factory for ``drafter=suffix``. Config keys: ``min_match``, ``max_match``, ``min_confidence``.

    Raises:
        ValueError: for an unknown key or an out-of-range value.
    """
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown drafter.suffix key(s) {unknown}; known: {', '.join(CONFIG_KEYS)}")
    return SuffixDrafter(runtime, **config)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=suffix`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry(
            "drafter",
            NAME,
            build,
            validate,
            "model-free drafting from a suffix index of the prompt and the output so far",
        )
    ]
