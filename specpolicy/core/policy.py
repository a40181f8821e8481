"""The ``LengthPolicy`` interface: how many tokens to speculate in a round."""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Any

from specpolicy.core.types import Draft, RoundRecord


class LengthPolicy(ABC):
    """Base class of speculation-length policies (``policies/``, one module each).

    Within a round the loop asks ``next_length(draft)`` first with the empty draft, then
    after each extension, drafting that many more tokens until it returns 0; the draft
    is then verified. After verification the policy is fed the round's ``RoundRecord``.
    A first answer of 0 means no speculation this round (plain decoding). The answer is how
    many tokens to ADD to ``draft`` (not the draft's total length): a policy that wants k tokens
    answers ``max(k - draft.length, 0)``; one that answers k every time drafts until the round's
    room runs out (``max_new_tokens`` or the context), which the loop reports once per run
    (``RunawayDrafts``).

    When ``next_length`` returns 0 for a non-empty draft, the loop records why in the round's
    ``RoundRecord.draft_stop_reason`` from the policy's ``draft_stop_reason`` attribute: a policy
    may set it just before returning 0 (``"low_confidence"``, ``"n_max"``, ``"policy_bound"``;
    see ``specpolicy.core.types.DRAFT_STOP_REASONS``); the default is ``"policy_bound"``. A first
    answer of 0 is recorded as ``"length_0"``. (Why *generation* ended is another matter:
    ``GenerationResult.finish_reason``.)
    """

    #: Name under which the policy registers (the Hydra ``policy=`` choice).
    name: str = ""
    #: Why the last ``next_length`` answer of 0 stopped drafting (see the class docstring).
    draft_stop_reason: str = "policy_bound"
    #: The batch this request's round runs in (``specpolicy.core.batch_context.BatchContext``), set by
    #: the batched loop before each round's drafting; None in the batch-1 loop. Policies that do
    #: not read it behave as at batch 1.
    batch: Any = None

    @classmethod
    def plan_round(cls, policies: list[LengthPolicy], contexts: list[Any]) -> list[int] | None:
        """Plan the round's speculation lengths of every request in a batch at once (batch-aware
        policies). Called by the batched loop before drafting, with the requests' policies (each
        an instance of ``cls``, in row order) and their ``BatchContext``s (``planned_length``
        None); the answer (tokens, one per request, each >= 0) reaches each policy as
        ``batch.planned_length``. Default: None (no joint plan; each request decides alone)."""
        return None

    @property
    def timed_calls(self) -> tuple:
        """The policy's own model passes (``specpolicy.core.passes.pass_entry_points``: modules and
        ``(object, "method")`` pairs), which the loop times as passes, not as host work: an acceptance
        head's (``acceptance_choice``, ``specpolicy.core.acceptance``) when the policy reads one, else
        none. A policy with a network of its own names its entry points here."""
        choice = getattr(self, "acceptance_choice", None)
        return () if choice is None else tuple(choice.timed_calls)

    @property
    def stop_reason(self) -> str:
        """Deprecated spelling of ``draft_stop_reason`` (reads and writes it), kept so that policies
        written before the rename keep reporting why drafting stopped."""
        return self.draft_stop_reason

    @stop_reason.setter
    def stop_reason(self, value: str) -> None:
        self.draft_stop_reason = value

    def reset(self) -> None:
        """Forget per-prompt state; called before each prompt. Default: nothing."""

    @abstractmethod
    def next_length(self, draft: Draft) -> int:
        """Tokens to add to ``draft`` (0 = stop drafting and verify). Must be >= 0."""

    def update(self, record: RoundRecord) -> None:
        """Learn from the verified round. Default: nothing (stateless policies)."""


class TreePolicy(LengthPolicy):
    """Base class of policies that shape a draft TREE (``specpolicy.core.tree``) instead of a chain's
    length: the loop hands the whole round's drafting to ``draft_tree`` and verifies the tree in
    one target pass. A tree policy works with the drafters that offer what it needs (e.g. EAGLE-2's
    dynamic tree needs ``tree_root`` / ``tree_expand``: ``eagle3``, ``ar``); ``check_drafter``
    says so, in one line, before the first prompt.
    """

    def next_length(self, draft: Draft) -> int:  # the loop calls draft_tree instead
        raise TypeError(f"{type(self).__name__} shapes draft trees: the loop calls draft_tree, not next_length")

    def check_drafter(self, drafter: Any) -> None:
        """Raise ``ValueError`` naming the policy and the drafter when the drafter cannot draft
        this policy's trees (the loop asks before each prompt's first round). Default: accept every drafter."""

    @abstractmethod
    def draft_tree(self, drafter: Any, room: int, node_room: int) -> tuple[Draft, str]:
        """Draft the round's tree with ``drafter``: at most ``room`` nodes deep (tokens that can
        still be emitted after the correction/bonus one) and ``node_room`` nodes in all (what the
        target's context can still hold in one verification; >= ``room``).

        Returns:
            ``(draft, why drafting stopped)``: a tree (``Draft.parents`` set; a chain is fine too)
            and its ``RoundRecord.draft_stop_reason`` (``"policy_bound"``, ``"room"``, ``"length_0"``, ...).
        """


class PolicyAnswerError(ValueError):
    """A policy's ``next_length`` answered something other than an integer >= 0 (e.g. ``2.5`` or
    ``-1``); raised by the decoding loop before the answer reaches the drafter, so the error is
    the policy's (``policy``: the policy object, ``answer``: what it returned)."""

    def __init__(self, policy: Any, answer: Any) -> None:
        self.policy = policy
        self.answer = answer
        kind = "a negative speculation length" if isinstance(answer, int) else f"a {type(answer).__name__}"
        super().__init__(
            f"policy {getattr(policy, 'name', '') or type(policy).__name__!r} returned {answer!r} from "
            f"next_length ({kind}); a speculation length must be an integer >= 0"
        )


class RunawayDrafts:
    """Notices a policy that never ends its drafts itself: one that answers the same non-zero
    length after every extension (e.g. always 3, meant as "3 tokens per round") drafts until the
    round's room runs out (``max_new_tokens`` or the context), every round. Evidence: rounds whose
    draft ended because the room ran out after at least ``min_answers`` identical non-zero
    answers; ``min_rounds`` of them while the policy has never ended a non-empty draft itself
    (answered 0) produce one warning line, once per policy object (i.e. once per run).

    The built-in policies (``specpolicy.policies``) are not watched: their answers are tested,
    and a rule such as FailFast with ``tau=0`` and ``n_max`` above ``max_new_tokens`` fills the
    room by design. A third-party rule that does so on purpose gets the warning once; it says
    what to answer *if* a fixed length was meant.
    """

    def __init__(self, min_answers: int = 3, min_rounds: int = 2) -> None:
        self.min_answers, self.min_rounds = min_answers, min_rounds
        #: policy -> [rounds that ran until the room ran out, drafts it ended itself, warned]
        self._seen: weakref.WeakKeyDictionary[Any, list] = weakref.WeakKeyDictionary()

    def observe(self, policy: LengthPolicy, answers: list[int], draft_length: int, draft_stop: str) -> str | None:
        """Record one round's drafting.

        Args:
            policy: the round's policy.
            answers: every answer of ``policy.next_length`` in the round, in order.
            draft_length: tokens drafted (k).
            draft_stop: the round's ``RoundRecord.draft_stop_reason``.
        Returns:
            The warning line (without ``warning:``) the first time the policy qualifies, else None.
        """
        if draft_length == 0 or type(policy).__module__.startswith("specpolicy.policies."):
            return None
        try:
            state = self._seen.setdefault(policy, [0, 0, False])
        except TypeError:  # not weak-referenceable: not watched
            return None
        if draft_stop == "room":
            if len(answers) >= self.min_answers and len(set(answers)) == 1 and answers[0] > 0:
                state[0] += 1
        elif draft_stop not in ("stop_token", "no_proposal"):  # the policy answered 0 itself
            state[1] += 1
        if state[2] or state[1] or state[0] < self.min_rounds:
            return None
        state[2] = True
        name = getattr(policy, "name", "") or type(policy).__name__
        return (
            f"policy {name!r} answered next_length with {answers[0]} after every extension and never with 0, so "
            f"its drafts grew until the room ran out ({draft_length} tokens after {len(answers)} answers; "
            f"{state[0]} rounds so far): next_length is asked again after each extension and a draft ends only "
            f"when it answers 0 -- for k tokens per round, answer max(k - draft.length, 0) (docs: How-to, "
            f"Write a policy plugin)"
        )
