"""``aimd`` policy: speculation length from the acceptance history, as TCP congestion control.

Sources: additive increase / multiplicative decrease of a window (Jacobson 1988, "Congestion
Avoidance and Control"; Chiu & Jain 1989), the backward-looking scheme FailFast tried first and
dropped (FailFast, arXiv 2512.20573, App. E "Dynamic speculation length schemes"); and, as
``mode="heuristic"``, Hugging Face assisted generation's ``num_assistant_tokens_schedule=
"heuristic"`` (transformers ``AssistedCandidateGenerator.update_candidate_strategy``: +2 when
every candidate was accepted, otherwise -1, never below 1).
"""

from __future__ import annotations

import math
from typing import Any

from specpolicy.hookspecs import hookimpl
from specpolicy.policy import LengthPolicy
from specpolicy.types import Draft, RoundRecord

NAME = "aimd"
MODES = ("aimd", "heuristic")


class AIMDPolicy(LengthPolicy):
    """A window ``w`` of draft tokens per round, adapted after every verified round:

    * every proposed token accepted (``RoundRecord.fully_accepted``): ``w += a``;
    * a rejection: ``w = max(w_min, floor(beta * w))`` (``mode="aimd"``) or
      ``w = max(w_min, w - 1)`` (``mode="heuristic"``, Hugging Face's schedule; ``beta`` is
      then unused);
    * ``w`` always stays in ``[w_min, n_max]`` (Hugging Face has no upper bound; we keep one);
    * a round that proposed nothing (``speculation_length == 0``, e.g. at the end of the
      context) leaves ``w`` unchanged.

    "Proposed" means the whole verified draft, draft-reuse tokens included. Across prompts:
    by default ``reset()`` restores ``w_init`` before each prompt, so a prompt's schedule
    does not depend on the prompts before it (Hugging Face's ``"heuristic_transient"``);
    ``keep_across_prompts=True`` carries ``w`` over, as Hugging Face's ``"heuristic"`` does.

    Args:
        mode: ``"aimd"`` or ``"heuristic"`` (default ``"aimd"``).
        w_init: initial window, integer in ``[w_min, n_max]`` (default 5).
        a: additive increase after a fully accepted round, integer >= 1 (default 2, both modes).
        beta: multiplicative decrease factor, in (0, 1) (default 0.5; mode ``aimd`` only).
        w_min: smallest window, integer >= 1 (default 1).
        n_max: largest window, integer >= ``w_min`` (default 60).
        keep_across_prompts: carry ``w`` from one prompt to the next (default False).
    Raises:
        ValueError: naming the offending ``policy.<key>`` and its accepted range.
    """

    name = NAME

    def __init__(
        self,
        mode: str = "aimd",
        w_init: int = 5,
        a: int = 2,
        beta: float = 0.5,
        w_min: int = 1,
        n_max: int = 60,
        keep_across_prompts: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"policy.mode must be one of {', '.join(MODES)}, got {mode!r}")
        if isinstance(w_min, bool) or not isinstance(w_min, int) or w_min < 1:
            raise ValueError(f"policy.w_min must be an integer >= 1, got {w_min!r}")
        if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < w_min:
            raise ValueError(f"policy.n_max must be an integer >= policy.w_min ({w_min}), got {n_max!r}")
        if isinstance(w_init, bool) or not isinstance(w_init, int) or not w_min <= w_init <= n_max:
            raise ValueError(f"policy.w_init must be an integer in [{w_min}, {n_max}] (w_min..n_max), got {w_init!r}")
        if isinstance(a, bool) or not isinstance(a, int) or a < 1:
            raise ValueError(f"policy.a must be an integer >= 1, got {a!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
            raise ValueError(f"policy.beta must be in (0, 1), got {beta!r}")
        if not isinstance(keep_across_prompts, bool):
            raise ValueError(f"policy.keep_across_prompts must be true or false, got {keep_across_prompts!r}")
        self.mode = mode
        self.w_init = w_init
        self.a = a
        self.beta = float(beta)
        self.w_min = w_min
        self.n_max = n_max
        self.keep_across_prompts = keep_across_prompts
        self.w = w_init

    def reset(self) -> None:
        if not self.keep_across_prompts:
            self.w = self.w_init

    def next_length(self, draft: Draft) -> int:
        return max(self.w - draft.length, 0)

    def update(self, record: RoundRecord) -> None:
        if record.speculation_length == 0:
            return
        if record.fully_accepted:
            self.w = min(self.n_max, self.w + self.a)
        elif self.mode == "aimd":
            # The epsilon keeps e.g. 0.29 * 100 = 28.999999999999996 at 29.
            self.w = max(self.w_min, math.floor(self.beta * self.w + 1e-9))
        else:
            self.w = max(self.w_min, self.w - 1)

    def __repr__(self) -> str:
        return (
            f"AIMDPolicy(mode={self.mode!r}, w_init={self.w_init}, a={self.a}, beta={self.beta}, "
            f"w_min={self.w_min}, n_max={self.n_max}, keep_across_prompts={self.keep_across_prompts})"
        )


@hookimpl
def specpolicy_make_policy(name: str, config: dict[str, Any]):
    """Factory for ``policy=aimd`` (and ``policy=heuristic``, which is ``aimd`` with
    ``mode: heuristic``). Config keys: ``mode``, ``w_init``, ``a``, ``beta``, ``w_min``,
    ``n_max``, ``keep_across_prompts``."""
    if name != NAME:
        return None
    return AIMDPolicy(**config)
