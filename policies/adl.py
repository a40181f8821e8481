"""``adl`` policy: DiffuSpec's adaptive draft length (Li et al., arXiv 2510.02358, §4.3, Eqs. 9-11).

Two signals of each verified round, both smoothed by an exponential moving average (weight
``rho`` on the newest round):

* ``L_gen``: how much the drafter was willing to produce -- the drafted tokens before its first
  stop token (EOS), at most the round's k (Eq. 9: ``min(s - 1, k)`` with ``s`` the first stop
  token's 1-based index);
* ``L_acc``: how much the target accepted (the round's accepted length).

The next round drafts ``k = clip(floor(L_gen_ema) + delta * [L_acc_ema >= L_gen_ema], k_min, k_max)``
(Eq. 11): it follows what the drafter produces and grows by ``delta`` only while acceptance keeps
pace. The first round drafts ``k_max``; the averages start at 0 (Alg. 1, and the reproduction
``pluto0x0/DiffuSpec``, ``control/adl.py``). Paper defaults (App. A): k in [20, 30], delta 10, rho 0.5.

Here ``L_gen`` is read from the verified draft (``RoundRecord``): its drafted tokens (reused ones
left out), less the stop token when the draft ended at one. With ``drafter.path_search=cps`` that
draft is the path, which ends where its lattice ends; the paper measures ``L_gen`` on the raw
one-pass draft before the search (the first EOS of the argmax tokens), which the record does
not keep -- the one departure.
"""

from __future__ import annotations

import math
from typing import Any

from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "adl"


class AdaptiveDraftLength(LengthPolicy):
    """DiffuSpec's adaptive draft length (see the module docstring).

    Args:
        k_min: shortest draft, integer >= 1 (tokens; paper 20).
        k_max: longest draft and the first round's, integer >= ``k_min`` (tokens; paper 30).
        delta: growth while acceptance keeps pace, integer >= 0 (tokens; paper 10).
        rho: weight of the newest round in both averages, in (0, 1] (paper 0.5).
        keep_across_prompts: carry the averages and k to the next prompt (default False: every
            prompt starts at ``k_max`` with averages 0, as the reproduction's ``reset``).
    Raises:
        ValueError: naming the ``policy.<key>``, its value and the accepted range.
    """

    name = NAME

    def __init__(
        self, k_min: int = 20, k_max: int = 30, delta: int = 10, rho: float = 0.5, keep_across_prompts: bool = False
    ) -> None:
        def integer(key: str, value: Any, low: int) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"policy.{key} must be an integer >= {low}, got {value!r}")
            return value

        self.k_min = integer("k_min", k_min, 1)
        self.k_max = integer("k_max", k_max, self.k_min)
        self.delta = integer("delta", delta, 0)
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0.0 < rho <= 1.0:
            raise ValueError(f"policy.rho must be a number in (0, 1], got {rho!r}")
        if not isinstance(keep_across_prompts, bool):
            raise ValueError(f"policy.keep_across_prompts must be true or false, got {keep_across_prompts!r}")
        self.rho, self.keep_across_prompts = float(rho), keep_across_prompts
        self._fresh()

    def _fresh(self) -> None:
        self.k = self.k_max
        self.gen_ema = 0.0  # L_gen's average (tokens)
        self.acc_ema = 0.0  # L_acc's average (tokens)

    def reset(self) -> None:
        if not self.keep_across_prompts:
            self._fresh()

    def next_length(self, draft: Draft) -> int:
        return max(self.k - draft.length, 0)

    def update(self, record: RoundRecord) -> None:
        if record.speculation_length == 0:
            return
        drafted = record.speculation_length - record.reused_tokens
        generated = drafted - 1 if record.draft_stop_reason == "stop_token" else drafted
        self.gen_ema += self.rho * (min(generated, self.k) - self.gen_ema)
        self.acc_ema += self.rho * (record.accepted_length - self.acc_ema)
        grow = self.delta if self.acc_ema >= self.gen_ema else 0
        self.k = min(self.k_max, max(self.k_min, math.floor(self.gen_ema + 1e-9) + grow))

    def __repr__(self) -> str:
        return (
            f"AdaptiveDraftLength(k_min={self.k_min}, k_max={self.k_max}, delta={self.delta}, rho={self.rho}, "
            f"keep_across_prompts={self.keep_across_prompts})"
        )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``AdaptiveDraftLength``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy",
            NAME,
            AdaptiveDraftLength,
            "DiffuSpec's adaptive draft length: grows while acceptance keeps pace, shrinks when it does not",
        )
    ]
