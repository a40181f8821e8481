"""``failfast`` policy: confidence-gated dynamic expansion of the speculation length.

Source: "Fail Fast, Win Big: Rethinking the Drafting Strategy in Speculative Decoding via
Diffusion LLMs" (FailFast, arXiv 2512.20573), §4.2 and Algorithm 1. Defaults from the official
script (N = ``incr_len`` 10, τ = ``lowconf_threshold`` 0.45, N_max = ``max_spec_len`` 60) and the
sensitivity study of App. C (τ ≈ 0.45 best; N_max between 30 and 70 works reliably).
"""

from __future__ import annotations

from typing import Any

from specpolicy.hookspecs import hookimpl
from specpolicy.policy import LengthPolicy
from specpolicy.types import Draft

NAME = "failfast"


class FailFastPolicy(LengthPolicy):
    """FailFast Algorithm 1: draft ``n`` tokens; while *every* token drafted so far in the
    round has confidence >= ``tau`` and the draft is shorter than ``n_max``, draft ``n`` more
    (the last chunk capped so the draft never exceeds ``n_max``). A chunk holding a
    low-confidence token ends the round but is proposed whole: nothing is truncated at
    the low-confidence token.

    The check covers the whole draft, not only the newest chunk, so the rule is exactly
    "all confidences so far >= τ" however the policy is called; it is one on-device
    reduction and one host read (``bool``) per extension decision. Confidences are
    compared with ``tau`` in their own dtype (a float32 confidence equal to float32(τ)
    passes). Stateless: nothing carries over between rounds or prompts.

    Args:
        n: N, tokens per chunk, integer >= 1 (default 10).
        tau: τ, confidence threshold in [0, 1] (default 0.45). τ = 0 always extends to
            ``n_max``; τ = 1 extends only past chunks of confidence exactly 1.
        n_max: N_max, longest draft in tokens, integer >= ``n`` (default 60).
    Raises:
        ValueError: naming ``policy.n``, ``policy.tau`` or ``policy.n_max`` when out of range.
    """

    name = NAME

    def __init__(self, n: int = 10, tau: float = 0.45, n_max: int = 60) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"policy.n must be an integer >= 1, got {n!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0:
            raise ValueError(f"policy.tau must be in [0, 1], got {tau!r}")
        if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < n:
            raise ValueError(f"policy.n_max must be an integer >= policy.n ({n}), got {n_max!r}")
        self.n = n
        self.tau = float(tau)
        self.n_max = n_max

    def next_length(self, draft: Draft) -> int:
        k = draft.length
        if k == 0:
            return self.n
        if k >= self.n_max:
            self.stop_reason = "n_max"
            return 0
        if bool((draft.confidences < self.tau).any()):  # the one host sync of this decision
            self.stop_reason = "low_confidence"
            return 0  # fail fast: verify the draft as it stands
        return min(self.n, self.n_max - k)

    def __repr__(self) -> str:
        return f"FailFastPolicy(n={self.n}, tau={self.tau}, n_max={self.n_max})"


@hookimpl
def specpolicy_make_policy(name: str, config: dict[str, Any]):
    """Factory for ``policy=failfast``. Config keys: ``n``, ``tau``, ``n_max``."""
    if name != NAME:
        return None
    return FailFastPolicy(**config)
