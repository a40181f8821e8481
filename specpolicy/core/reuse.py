"""Draft reuse by suffix matching (FailFast paper, Appendix E), usable with any policy.

After a round, the *rejected tail* is the draft from its first rejected token on. In the
next round, if a suffix of the new draft occurs in that tail, the tokens that followed it
in the tail are appended to the draft: rejected tail ``x e f g h i j`` and new draft
``a b c d e f g`` give ``a b c d e f g h i j``.

Sampling (``Draft.probs`` set): a reused token is a POINT MASS, its q row one-hot
(``specpolicy.core.sampling.point_mass``), so it is accepted with probability p(x). Its q row from the
previous round must not be carried along: that row was the distribution of the token in
another context (after a token the target rejected), and given this round's history the
reused token is not a draw from it; a token fixed by the past is verified losslessly only as
a point mass (Leviathan et al. 2023, Alg. 1 with q = δ_x).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specpolicy.core.sampling import point_mass
from specpolicy.core.types import Draft, Verification


class DraftReuse:
    """Appends tokens from the previous round's rejected tail to a new draft.

    Args:
        min_match: shortest draft suffix (tokens) that must occur in the tail, >= 1.
    Raises:
        ValueError: if ``min_match`` < 1.
    """

    def __init__(self, min_match: int = 2) -> None:
        if min_match < 1:
            raise ValueError(f"reuse.min_match must be >= 1, got {min_match}")
        self.min_match = min_match
        self.reset()

    def reset(self) -> None:
        """Forget the previous round (called before each prompt)."""
        self._tail_ids: torch.Tensor | None = None  # (t,) int64
        self._tail_conf: torch.Tensor | None = None  # (t,) float32

    def observe(self, draft: Draft, verification: Verification) -> None:
        """Remember the rejected tail ``draft[accepted_length:]`` of the verified round."""
        a = verification.accepted_length
        self._tail_ids = draft.token_ids[a:]
        self._tail_conf = draft.confidences[a:]

    def extend(self, draft: Draft, room: int) -> Draft:
        """``draft`` with the continuation of its longest suffix found in the rejected tail
        appended (at most ``room - draft.length`` tokens); unchanged when nothing matches."""
        tail, tail_conf = self._tail_ids, self._tail_conf
        if (
            tail is None
            or tail_conf is None
            or draft.length < self.min_match
            or tail.shape[0] < 2
            or room <= draft.length
        ):
            return draft
        end, match_len = _longest_suffix_match(draft.token_ids, tail)
        if match_len < self.min_match or end + 1 >= tail.shape[0]:
            return draft
        extra = min(int(tail.shape[0]) - end - 1, room - draft.length)
        reused = tail[end + 1 : end + 1 + extra]
        probs = draft.probs
        if probs is not None:  # sampling: reused tokens are point masses (module docstring)
            probs = torch.cat([probs, point_mass(reused, probs.shape[1]).to(probs.dtype)])
        return replace(  # other fields (e.g. extras) stay the drafter's
            draft,
            token_ids=torch.cat([draft.token_ids, reused]),
            confidences=torch.cat([draft.confidences, tail_conf[end + 1 : end + 1 + extra]]),
            reused_tokens=draft.reused_tokens + extra,
            probs=probs,
            lookahead=0,  # the drafter's look-ahead continued its own draft, not this one
            lookahead_confidences=None,
        )


def _longest_suffix_match(draft_ids: torch.Tensor, tail: torch.Tensor) -> tuple[int, int]:
    """Find where the longest suffix of ``draft_ids`` ((k,) int64) ends inside ``tail`` ((t,) int64),
    considering only end positions with at least one tail token after them.

    Returns ``(end index in tail, suffix length)``; length 0 when no token matches.
    Vectorised: match-run lengths along the diagonals of the (k, t) equality matrix.
    """
    k, t = int(draft_ids.shape[0]), int(tail.shape[0])
    equal = draft_ids[:, None] == tail[None, :]  # (k, t) bool
    depth = min(k, t)
    d = torch.arange(depth, device=tail.device)  # (D,)
    ends = torch.arange(t - 1, device=tail.device)  # (t-1,) candidate end positions in the tail
    rows = (k - 1 - d).expand(t - 1, depth)  # (t-1, D)
    cols = ends[:, None] - d[None, :]  # (t-1, D)
    valid = cols >= 0
    hits = equal[rows, cols.clamp(min=0)] & valid  # (t-1, D): draft[k-1-d] == tail[end-d]
    run = hits.int().cumprod(dim=1).sum(dim=1)  # (t-1,) suffix match length ending at each end
    best = int(run.argmax())
    return best, int(run[best])
