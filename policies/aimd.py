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

from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "aimd"
MODES = ("aimd", "heuristic")
#: Weight of the newest round in the speed averages of ``off_when_slower`` (once an average holds
#: ``1 / RATE_EMA`` rounds; before that every round weighs the same: a plain running mean).
RATE_EMA = 0.1


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

    **Speculation off when it does not pay** (``off_when_slower=True``), a measured decision:
    the policy measures the speed of speculative rounds and of plain-decoding rounds as emitted
    tokens per millisecond of ``draft_ms + verify_ms`` (``RoundRecord`` timings; time outside
    the two timers is left out of both), each as a ratio of averages -- mean tokens over mean
    ms of the recent rounds (running means, then exponential moving averages with weight
    ``RATE_EMA`` for the newest round) -- so that one unlucky round (nothing accepted) does not
    stand for the drafter. The first ``probe_rounds`` rounds are plain decoding (length 0: the
    plain-speed estimate). Once speculation has run ``probe_rounds`` rounds, whenever its
    average falls below the plain one it is switched off for ``backoff`` rounds (plain
    decoding: ``next_length`` answers 0 at once, recorded as ``draft_stop_reason="length_0"``),
    refreshing the plain estimate; then speculation is probed again for ``probe_rounds``
    rounds with a fresh average: if it is still slower, the next back-off is twice as long (up
    to ``backoff_max``), otherwise the back-off returns to ``backoff_rounds``. The speed
    estimates and the back-off carry across prompts (they measure the machine and the
    drafter, not one prompt); the window follows
    ``keep_across_prompts``. The window is not changed by plain rounds. With
    ``off_when_slower=False`` (the default of the class) the policy is exactly the window rule
    above. Rounds depend on measured time, so two runs may differ in their rounds (never in
    their output, which is lossless).

    Args:
        mode: ``"aimd"`` or ``"heuristic"`` (default ``"aimd"``).
        w_init: initial window, integer in ``[w_min, n_max]`` (default 5).
        a: additive increase after a fully accepted round, integer >= 1 (default 2, both modes).
        beta: multiplicative decrease factor, in (0, 1) (default 0.5; mode ``aimd`` only).
        w_min: smallest window, integer >= 1 (default 1).
        n_max: largest window, integer >= ``w_min`` (default 60).
        keep_across_prompts: carry ``w`` from one prompt to the next (default False).
        off_when_slower: switch speculation off while it is measured slower than plain decoding
            (default False; ``conf/policy/aimd.yaml`` turns it on).
        backoff_rounds: plain rounds after speculation was found slower, integer >= 1 (default 16).
        backoff_max: longest back-off after repeated failed probes, integer >= ``backoff_rounds``
            (default 256).
        probe_rounds: plain rounds measured at the start, and speculative rounds measured before
            speculation may be judged slower (at the start and after every back-off), integer
            >= 1 (default 8).
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
        off_when_slower: bool = False,
        backoff_rounds: int = 16,
        backoff_max: int = 256,
        probe_rounds: int = 8,
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
        if not isinstance(off_when_slower, bool):
            raise ValueError(f"policy.off_when_slower must be true or false, got {off_when_slower!r}")
        if isinstance(backoff_rounds, bool) or not isinstance(backoff_rounds, int) or backoff_rounds < 1:
            raise ValueError(f"policy.backoff_rounds must be an integer >= 1, got {backoff_rounds!r}")
        if isinstance(backoff_max, bool) or not isinstance(backoff_max, int) or backoff_max < backoff_rounds:
            raise ValueError(
                f"policy.backoff_max must be an integer >= policy.backoff_rounds ({backoff_rounds}), got {backoff_max!r}"
            )
        if isinstance(probe_rounds, bool) or not isinstance(probe_rounds, int) or probe_rounds < 1:
            raise ValueError(f"policy.probe_rounds must be an integer >= 1, got {probe_rounds!r}")
        self.mode = mode
        self.w_init = w_init
        self.a = a
        self.beta = float(beta)
        self.w_min = w_min
        self.n_max = n_max
        self.keep_across_prompts = keep_across_prompts
        self.off_when_slower = off_when_slower
        self.backoff_rounds = backoff_rounds
        self.backoff_max = backoff_max
        self.probe_rounds = probe_rounds
        self.w = w_init
        # off_when_slower state (kept across prompts): speed averages (tokens, ms), plain rounds left in
        # the current back-off, the next back-off length, probing flag.
        self.plain = _SpeedAverage()
        self.spec = _SpeedAverage()
        self.off_left = 0
        self.backoff = backoff_rounds
        self._probing = False
        self._plain_probe_rounds = 0  # plain rounds of the initial probe done (the plain estimate)
        self._plain_round = False  # this round's first answer was 0 by this switch

    def reset(self) -> None:
        if not self.keep_across_prompts:
            self.w = self.w_init

    @property
    def speculating(self) -> bool:
        """False while ``off_when_slower`` keeps speculation off (plain decoding rounds)."""
        return not (self.off_when_slower and (self._plain_probe_rounds < self.probe_rounds or self.off_left > 0))

    def next_length(self, draft: Draft) -> int:
        if draft.length == 0:
            self._plain_round = not self.speculating
            if self._plain_round:
                return 0
        return max(self.w - draft.length, 0)

    def update(self, record: RoundRecord) -> None:
        if self.off_when_slower:
            self._update_switch(record)
        if record.speculation_length == 0:
            return
        if record.fully_accepted:
            self.w = min(self.n_max, self.w + self.a)
        elif self.mode == "aimd":
            # The epsilon keeps e.g. 0.29 * 100 = 28.999999999999996 at 29.
            self.w = max(self.w_min, math.floor(self.beta * self.w + 1e-9))
        else:
            self.w = max(self.w_min, self.w - 1)

    def _update_switch(self, record: RoundRecord) -> None:
        """The measured on/off decision (``off_when_slower``), see the class docstring."""
        plain_round, self._plain_round = self._plain_round, False
        ms = record.draft_ms + record.verify_ms
        if record.speculation_length == 0:
            if plain_round:  # plain decoding by decision: a clean plain-speed sample
                self._plain_probe_rounds += 1
                if ms > 0.0:
                    self.plain.add(record.emitted_tokens, ms)
                if self.off_left > 0:
                    self.off_left -= 1
                    if self.off_left == 0:  # back-off over: speculation is probed afresh
                        self._probing, self.spec = True, _SpeedAverage()
            return
        if ms <= 0.0:  # not timed (hand-built records): nothing measured, nothing decided
            return
        self.spec.add(record.emitted_tokens, ms)
        if self.plain.rounds == 0 or self.spec.rounds < self.probe_rounds:
            return
        if self.spec.rate < self.plain.rate:
            if self._probing:  # still slower after a back-off: back off longer
                self.backoff = min(2 * self.backoff, self.backoff_max)
            self.off_left = self.backoff
        elif self._probing:
            self.backoff = self.backoff_rounds
        self._probing = False

    def __repr__(self) -> str:
        return (
            f"AIMDPolicy(mode={self.mode!r}, w_init={self.w_init}, a={self.a}, beta={self.beta}, "
            f"w_min={self.w_min}, n_max={self.n_max}, keep_across_prompts={self.keep_across_prompts}, "
            f"off_when_slower={self.off_when_slower}, backoff_rounds={self.backoff_rounds}, "
            f"backoff_max={self.backoff_max}, probe_rounds={self.probe_rounds})"
        )


class _SpeedAverage:
    """Recent speed as a ratio of averages: mean emitted tokens / mean ms per round (running
    means over the first ``1 / RATE_EMA`` rounds, exponential moving averages after)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.tokens = 0.0
        self.ms = 0.0

    def add(self, tokens: int, ms: float) -> None:
        self.rounds += 1
        weight = max(RATE_EMA, 1.0 / self.rounds)
        self.tokens += weight * (tokens - self.tokens)
        self.ms += weight * (ms - self.ms)

    @property
    def rate(self) -> float:
        """Tokens per ms (0 before any round)."""
        return self.tokens / self.ms if self.ms > 0.0 else 0.0


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``AIMDPolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy",
            NAME,
            AIMDPolicy,
            "speculation length from the acceptance history, as TCP congestion control (and Hugging Face's heuristic)",
        )
    ]
