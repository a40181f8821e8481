"""``static`` policy: the same speculation length every round.

The classic speculative-decoding schedule (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", §3: a fixed number γ of draft tokens per round);
the FailFast paper's static baselines sweep k = 3..20 (FailFast, arXiv 2512.20573, App. D.1).
"""

from __future__ import annotations

from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "static"


class StaticPolicy(LengthPolicy):
    """Draft exactly ``k`` tokens, then verify: ``next_length`` tops the draft up to ``k``
    (``k`` for the empty draft, then 0). Stateless.

    Args:
        k: tokens per draft, an integer >= 1 (default 5).
    Raises:
        ValueError: naming ``policy.k`` when it is not an integer >= 1.
    """

    name = NAME

    def __init__(self, k: int = 5) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"policy.k must be an integer >= 1, got {k!r}")
        self.k = k

    def next_length(self, draft: Draft) -> int:
        return max(self.k - draft.length, 0)

    def __repr__(self) -> str:
        return f"StaticPolicy(k={self.k})"


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``StaticPolicy``, built from its config node and checked by building it."""
    return [PluginEntry.from_class("policy", NAME, StaticPolicy, "the same speculation length k every round")]
