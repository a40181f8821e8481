"""Frozen records exchanged by drafters, verifiers, length policies and the decoding loop.

Conventions (batch size 1 throughout):

* token ids are ``torch.int64`` 1-D tensors on the runtime device;
* confidences are ``torch.float32`` 1-D tensors: the drafter's max probability at the
  forward pass that produced each token (FailFast paper, §3 "confidence");
* lengths are counts of tokens, times are milliseconds.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import torch

#: ``Draft.extras`` key of block-diffusion drafters (``fastdllm``): ``(m,) float32``, for every
#: unmasking pass of the round, in pass order, the confidence of each position of the small block
#: being decoded, NaN where the position was not masked at that pass. The non-NaN entries are the
#: official FailFast code's ``conf_of_unmasked_tokens`` (``generate_draft_tokens_arbitrary_length``):
#: every masked position decoded in each small block, look-ahead positions past the draft included,
#: a position still masked after a pass counted again at the next. Read by
#: ``policy.confidence_scope=small_block``.
SMALL_BLOCK_CONFIDENCES = "small_block_confidences"

#: ``Draft.extras`` key, reported only when asked (``Drafter.report_hidden`` set, e.g. by a run with
#: ``policy.acceptance=head``): ``(n, H) float``, the drafter's last hidden state -- the vector its LM
#: head reads -- at each drafted position, rows aligned with ``token_ids`` then the look-ahead tokens
#: (``n = k + lookahead`` for drafters that report look-ahead, else ``k``). Tokens the drafter did not
#: draft (draft reuse) have no row. Read by ``specpolicy.core.acceptance.HeadAcceptance`` (SpecDec++'s
#: acceptance head, arXiv 2405.19715 §4). Reported by the ``ar``, ``eagle3``, ``dflash``, ``dart`` and
#: ``falcon`` drafters on the eager runtime, chains only.
LAST_HIDDEN = "last_hidden"


@dataclass(frozen=True)
class Draft:
    """The draft of one round, as it stands (it may be extended within the round).

    Attributes:
        token_ids: ``(k,) int64`` proposed tokens, continuing the committed sequence.
        confidences: ``(k,) float32`` max probability of each proposed token, in [0, 1].
            Tokens not produced by a model (draft reuse, model-free drafters) carry the
            drafter's own notion of confidence (see each drafter).
        forward_passes: drafter forward passes spent on this draft so far (extensions included).
        reused_tokens: how many trailing tokens were appended by draft reuse (FailFast App. E),
            not by the drafter.
        probs: ``(k, V) float32`` when sampling (``generation.temperature`` > 0): row i is the
            distribution q_i that token i was sampled from (after ``specpolicy.core.sampling.warp``);
            a one-hot row is a point mass (reused tokens). None: greedy decoding, or every token
            a point mass (model-free drafters); see ``specpolicy.core.sampling.speculative_verify``.
        ends_at_stop_token: True when the draft's last token is a stop token (EOS) the drafter
            drafted: it proposes nothing past it this round (the loop stops drafting, reason
            ``stop_token``). Drafters that do not check stop tokens leave it False.
        lookahead: tokens the drafter has already decoded PAST this draft in the current round:
            asking ``draft`` for up to this many more tokens costs no forward pass (Fast-dLLM: the
            unmasked run past the draft, at its usual threshold the rest of the small block; 0 for
            drafters that decode only what is asked, such as AR and model-free drafters, and after
            a stop token). A policy may use it to see where the drafter's passes begin and end
            (``goodput``).
        lookahead_confidences: ``(lookahead,) float32`` or None: the confidences of those
            decoded-ahead tokens, in order, so that a policy can plan over them before it asks for
            them (``goodput`` takes the ones it wants in one answer instead of one at a time). None:
            the drafter does not report them (then only ``lookahead`` is known).
        parents: ``(k,) int64`` or None. A draft TREE (``specpolicy.core.tree``): node i hangs under
            ``parents[i]`` (-1: under the pending token; else an earlier node, topological order),
            and ``token_ids`` / ``confidences`` / ``probs`` are per node. None: a chain (node i
            under node i - 1), which is what every drafter produces unless a tree policy asks.
        extras: what one drafter reports for the policies that read it, by key (read only; empty:
            nothing). A drafter documents its keys and a policy the keys it reads, failing in one
            line when one is missing. ``fastdllm`` reports ``"small_block_confidences"``
            (``SMALL_BLOCK_CONFIDENCES``), which ``policy=failfast`` reads with
            ``confidence_scope=small_block``. Draft reuse keeps the drafter's extras.
    """

    token_ids: torch.Tensor  # (k,) int64
    confidences: torch.Tensor  # (k,) float32
    forward_passes: int = 0
    reused_tokens: int = 0
    probs: torch.Tensor | None = None  # (k, V) float32, q of each drafted token; None = greedy or point mass
    ends_at_stop_token: bool = False
    lookahead: int = 0  # tokens decoded past the draft, free to add this round
    lookahead_confidences: torch.Tensor | None = None  # (lookahead,) float32; None = not reported
    parents: torch.Tensor | None = None  # (k,) int64 tree; None = chain
    extras: Mapping[str, Any] = field(default_factory=dict)  # drafter-specific, by key (SMALL_BLOCK_CONFIDENCES)

    @functools.cached_property
    def length(self) -> int:
        """Speculation length k in tokens (a tree: its nodes, all verified in one pass). Read once
        per draft (``token_ids`` never changes): the loop and the policies ask for it every step."""
        return int(self.token_ids.shape[0])

    def counted(self, length: int) -> Draft:
        """This draft with its ``length`` as the drafter counted it (tokens; must equal
        ``token_ids.shape[0]``): no shape read on the host path. Returns ``self``."""
        self.__dict__["length"] = length  # the cached property's slot
        return self

    @property
    def is_tree(self) -> bool:
        """True for a draft tree (``parents`` set)."""
        return self.parents is not None

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> Draft:
        """A zero-length draft (plain decoding for the round)."""
        return Draft(
            token_ids=torch.empty(0, dtype=torch.long, device=device),
            confidences=torch.empty(0, dtype=torch.float32, device=device),
        )

    @staticmethod
    def chain(
        token_ids: torch.Tensor,
        confidences: torch.Tensor,
        forward_passes: int,
        count: int,
        probs: torch.Tensor | None = None,
        ends_at_stop_token: bool = False,
        extras: Mapping[str, Any] | None = None,
    ) -> Draft:
        """``Draft(token_ids, confidences, forward_passes=forward_passes, probs=probs,
        ends_at_stop_token=ends_at_stop_token, extras=extras or {}).counted(count)``: a drafter's chain
        draft, equal field for field, built by one update of the instance's dict instead of the frozen
        dataclass's ``__init__`` (an ``object.__setattr__`` call per field; host work of every
        drafter call: a policy that asks one token at a time gets a ``Draft`` per token).

        Args:
            token_ids: ``(count,) int64``.
            confidences: ``(count,) float32``.
            forward_passes: the round's drafter passes so far.
            count: the tokens, as the caller counted them.
            probs: ``(count, V) float32`` q rows when sampling, else None.
            ends_at_stop_token: as the field.
            extras: as the field (None: ``{}``).
        """
        draft = object.__new__(Draft)
        draft.__dict__.update(
            token_ids=token_ids,
            confidences=confidences,
            forward_passes=forward_passes,
            reused_tokens=0,
            probs=probs,
            ends_at_stop_token=ends_at_stop_token,
            lookahead=0,
            lookahead_confidences=None,
            parents=None,
            extras={} if extras is None else extras,
            length=count,  # ``counted``'s slot of the cached property
        )
        return draft

    @staticmethod
    def with_lookahead(
        token_ids: torch.Tensor,
        confidences: torch.Tensor,
        probs: torch.Tensor | None,
        want: int,
        stop_at: int | None,
        forward_passes: int,
        hidden: torch.Tensor | None = None,
        count: int | None = None,
        no_lookahead: torch.Tensor | None = None,
    ) -> Draft:
        """The first ``want`` tokens a round has decoded as its draft, the rest as look-ahead (the
        ``dart`` and ``dflash`` drafters' hand-out). What it hands out whole is not sliced, and the
        draft's ``length`` is counted here (``counted``): no shape read when ``count`` is given.

        Args:
            token_ids: ``(n,) int64``, everything decoded this round.
            confidences: ``(n,) float32``, their confidences.
            probs: ``(n, V) float32`` their distributions when sampling, else None.
            want: the draft length asked for (>= 1).
            stop_at: index of the first drafted stop token, or None: the draft ends there at the
                latest (``ends_at_stop_token`` when it does) and nothing past it is look-ahead.
            forward_passes: the round's drafter passes so far.
            hidden: ``(n, H) float`` the drafter's last hidden states of those tokens, or None: when
                given, the draft reports its first ``end`` rows as ``extras[LAST_HIDDEN]``.
            count: n when the caller counted it, or None (read from ``token_ids``).
            no_lookahead: an empty ``(0,) float32`` tensor to hand out as the look-ahead's
                confidences when there is none (the caller's, kept), or None (a slice).
        Returns:
            a draft of ``min(want, end)`` tokens, ``end`` = n or ``stop_at + 1``.
        """
        n = int(token_ids.shape[0]) if count is None else count
        end = n if stop_at is None else stop_at + 1
        k = min(want, end)
        whole = k == n
        return Draft(
            token_ids if whole else token_ids[:k],
            confidences if whole else confidences[:k],
            forward_passes=forward_passes,
            probs=None if probs is None else (probs if whole else probs[:k]),
            ends_at_stop_token=stop_at is not None and k == end,
            lookahead=end - k,
            lookahead_confidences=no_lookahead if no_lookahead is not None and k == end else confidences[k:end],
            extras={} if hidden is None else {LAST_HIDDEN: hidden if end == n else hidden[:end]},
        ).counted(k)


@dataclass(frozen=True)
class Verification:
    """The target's verdict on one draft (one forward pass).

    Attributes:
        accepted_length: number of leading draft tokens accepted: greedy, those equal to the
            target's greedy tokens; sampling, those accepted by speculative sampling's rule.
        next_token: the correction token (at the first mismatch / rejection) or the bonus token
            (when every draft token was accepted), as a Python int.
        target_token_ids: ``(k + 1,) int64`` greedy: the target's greedy token at every draft
            position and one past the draft (kept for analyses such as the oracle policy).
            Sampling: the accepted draft tokens, then ``next_token`` at ``accepted_length``,
            then the target's most likely token at the later positions (informational only).
            Either way ``target_token_ids[accepted_length] == next_token``.
        features: ``(accepted_length + 1, F)`` float, or None. Only when the drafter asked for
            target features (``Drafter.target_feature_layers``; ``Verifier.request_features``):
            the target's hidden states, from this same verification pass, at the positions the
            round committed to the target's KV cache -- the previously pending token and the
            accepted draft tokens, in order -- each row the requested ``hidden_states`` entries
            concatenated (F = their total width). The correction/bonus token has no row: it
            becomes the pending token and its features come from the next verification.
            A tree: the pending token and the accepted path's nodes.
        path: for a draft tree, the accepted nodes, root's child first (``len(path) ==
            accepted_length``); None for a chain (the accepted nodes are its first
            ``accepted_length``). A tree's ``target_token_ids`` hold the target's token at the root
            (0) and after each node (i + 1), and ``target_token_ids[path[-1] + 1] == next_token``.
    """

    accepted_length: int
    next_token: int
    target_token_ids: torch.Tensor  # (k + 1,) int64
    features: torch.Tensor | None = None  # (accepted_length + 1, F) float; None = not requested
    path: tuple[int, ...] | None = None  # tree drafts: the accepted nodes

    def committed_tokens(self, draft: Draft) -> torch.Tensor:
        """``(accepted_length + 1,) int64``: the accepted draft tokens (a chain's prefix, a tree's
        path) plus the correction/bonus token. A chain's is a view of ``target_token_ids`` (read
        only), whose first ``accepted_length`` tokens are the accepted draft tokens (greedy: equal
        to the target's; sampling: copied from the draft)."""
        if self.path is None:  # the accepted tokens are ``target_token_ids``' first ones (the attribute's contract)
            return self.target_token_ids[: self.accepted_length + 1]
        last = self.path[-1] + 1 if self.path else 0
        nodes = torch.tensor(self.path, dtype=torch.long, device=draft.token_ids.device)
        return torch.cat([draft.token_ids[nodes], self.target_token_ids[last : last + 1]])


#: Values of ``RoundRecord.draft_stop_reason`` (why drafting stopped in a round).
DRAFT_STOP_REASONS = (
    "low_confidence",
    "n_max",
    "policy_bound",
    "length_0",
    "room",
    "no_proposal",
    "stop_token",
    "vanilla",
)
#: Values of ``RoundRecord.finish_reason`` / ``GenerationResult.finish_reason`` (why generation ended).
FINISH_REASONS = ("eos", "stop_string", "max_new_tokens", "max_context")


@dataclass(frozen=True)
class RoundRecord:
    """Everything measured in one round (draft + verify), fed to ``LengthPolicy.update``.

    Attributes:
        index: 0-based round number within the prompt.
        speculation_length: tokens proposed for verification (drafter + reused), k.
        accepted_length: draft tokens accepted (bonus/correction excluded).
        emitted_tokens: tokens added to the output this round after stop conditions
            (normally ``accepted_length + 1``; fewer when EOS or ``max_new_tokens`` cut the round).
        drafter_forward_passes: drafter forward passes spent this round.
        reused_tokens: tokens appended by draft reuse.
        draft_ms / verify_ms: wall-clock milliseconds spent drafting (the drafter's roll-back after
            verification included) / verifying.
        confidences: per drafted token, as floats.
        draft_token_ids / target_token_ids: the proposal and the target's greedy tokens (k + 1).
            They record the verification: in the round that ends generation they may run past
            the stop (``emitted_tokens`` says how many tokens reached the output).
        draft_stop_reason: why drafting stopped this round (see ``DRAFT_STOP_REASONS``):
            ``"low_confidence"``, ``"n_max"``, ``"policy_bound"`` (the policy's own length bound:
            static k, max_length, window), ``"length_0"`` (the policy answered 0 at once: plain
            decoding this round), ``"room"`` (max_new_tokens / context room), ``"no_proposal"``
            (the drafter had nothing more), ``"stop_token"`` (the draft ends at a drafted stop token),
            ``"vanilla"`` (no drafter); ``""`` when unknown.
        finish_reason: ``""`` unless this round ended generation, then ``"eos"``,
            ``"stop_string"``, ``"max_new_tokens"`` or ``"max_context"`` (as ``GenerationResult.finish_reason``).
        draft_parents: a draft tree's parents (``Draft.parents``; empty for a chain): then
            ``speculation_length`` counts the tree's nodes (tokens verified), ``accepted_length``
            the accepted path, and ``draft_token_ids`` / ``confidences`` are per node.
        accepted_path: a tree's accepted nodes (``Verification.path``; empty for a chain).
        host_ms: the round's HOST ms: its wall-clock ms (device-timeline span on CUDA) minus the ms
            of the model passes within it -- the drafter's, the target's and a policy's acceptance
            head's (``specpolicy.core.passes`` says what a pass is on each device): policy decisions
            and planning, tree and path searches, n-gram lookups, tree masks, commit and the loop's
            bookkeeping (the verifier's argmax and acceptance comparison on its logits, and a
            drafter's choice of its tokens on its own, count as their passes). A batched
            round's host ms is shared equally by its requests. None: not measured (rows written
            before it was, rounds rebuilt from elsewhere). The record a policy's ``update`` reads
            carries the host ms up to that call; the stored record (``GenerationResult.rounds``,
            ``on_round``) the whole round's.
    """

    index: int
    speculation_length: int
    accepted_length: int
    emitted_tokens: int
    drafter_forward_passes: int
    reused_tokens: int
    draft_ms: float
    verify_ms: float
    confidences: tuple[float, ...] = field(default_factory=tuple)
    draft_token_ids: tuple[int, ...] = field(default_factory=tuple)
    target_token_ids: tuple[int, ...] = field(default_factory=tuple)
    draft_stop_reason: str = ""
    finish_reason: str = ""
    draft_parents: tuple[int, ...] = field(default_factory=tuple)
    accepted_path: tuple[int, ...] = field(default_factory=tuple)
    host_ms: float | None = None

    @classmethod
    def built(cls, **values: Any) -> RoundRecord:
        """``RoundRecord(**values)`` without the frozen dataclass's ``object.__setattr__`` per field
        (4 us against 0.6; the loop builds one per round): the fields not given take their defaults.
        No check: ``values`` must name fields only (the loop's ``round_record`` does)."""
        record = object.__new__(cls)
        record.__dict__.update(_record_defaults(cls.__name__))
        record.__dict__.update(values)
        return record

    def with_host_ms(self, host_ms: float) -> RoundRecord:
        """This record with ``host_ms`` set (ms): ``dataclasses.replace(self, host_ms=...)`` without
        its walk over the fields and its ``__init__`` (the loop sets it on every round's record)."""
        record = object.__new__(type(self))
        record.__dict__.update(self.__dict__)
        record.__dict__["host_ms"] = host_ms
        return record

    @property
    def is_tree(self) -> bool:
        """True for a round that verified a draft tree."""
        return bool(self.draft_parents)

    @property
    def tree_depth(self) -> int:
        """Depth of the round's draft: a tree's deepest node, a chain's length."""
        if not self.draft_parents:
            return self.speculation_length
        depth: list[int] = []
        for parent in self.draft_parents:
            depth.append(1 + (depth[parent] if parent >= 0 else 0))
        return max(depth)

    @property
    def fully_accepted(self) -> bool:
        """True when the round ended with a bonus token: every proposed token of a chain accepted,
        a path to one of a tree's deepest nodes accepted."""
        return self.accepted_length == self.tree_depth


@dataclass(frozen=True)
class GenerationResult:
    """Output of one prompt through the decoding loop.

    Attributes:
        output_ids: ``(n,) int64`` generated tokens (prompt excluded), stop token included if hit.
        rounds: the per-round records, in order.
        finish_reason: why generation ended (``FINISH_REASONS``): ``"eos"``, ``"stop_string"``
            (a ``generation.stop`` string completed), ``"max_new_tokens"`` or ``"max_context"``
            (the context is full). Not to be confused with a round's ``draft_stop_reason``.
        wall_s: wall-clock seconds for the prompt, prefill included.
        prefill_ms: wall-clock milliseconds of the prefill of both models.
    """

    output_ids: torch.Tensor  # (n,) int64
    rounds: tuple[RoundRecord, ...]
    finish_reason: str
    wall_s: float
    prefill_ms: float

    @property
    def generated_tokens(self) -> int:
        """Tokens generated (``len(output_ids)``)."""
        return int(self.output_ids.shape[0])


@functools.cache
def _record_defaults(name: str) -> dict[str, Any]:
    """The default of each field of record class ``name`` (``RoundRecord``) that has one
    (``RoundRecord.built``)."""
    out: dict[str, Any] = {}
    for f in fields(globals()[name]):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()  # immutable (tuples): one shared value serves
    return out
