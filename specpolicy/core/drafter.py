"""The ``Drafter`` interface: proposes tokens that continue the committed sequence."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification


class Drafter(ABC):
    """Base class of every drafter (one subclass per strategy, one module each under ``drafters/``).

    Life cycle for one prompt (batch size 1)::

        drafter.prefill(prompt_ids)           # once
        loop:
            draft = drafter.draft(n)           # start a round's draft ...
            draft = drafter.draft(m)           # ... and extend it, any number of times
            drafter.commit(draft, verification)  # after the target's verdict

    ``draft`` extends the current round's draft without redoing forward passes already
    spent on it; ``commit`` rolls the drafter's state (KV cache) back to the committed
    sequence. A drafter never decides the speculation length: the ``LengthPolicy`` does.
    """

    #: Name under which the drafter registers (the Hydra ``drafter=`` choice).
    name: str = ""
    #: Longest sequence (prompt + generated + draft) the drafter can hold, in tokens; 0 = no
    #: limit of its own (model-free drafters). The loop ends generation with ``"max_context"``
    #: before a round would pass ``min(verifier.max_context, drafter.max_context)``.
    max_context: int = 0
    #: Target hidden states this drafter reads (drafters conditioned on the target: DFlash,
    #: EAGLE-3), as indices into Hugging Face's ``output_hidden_states`` (0 = the embedding
    #: output, i = the output of decoder layer i - 1); empty = none (every other drafter). When
    #: set, the loop asks the verifier for them (``Verifier.request_features``) and passes the
    #: prompt's to ``prefill(..., features=)``; each round's come with ``commit``'s
    #: ``verification.features``.
    target_feature_layers: tuple[int, ...] = ()
    #: Set to True (by a run whose policy reads SpecDec++'s acceptance head, or by the head's trainer)
    #: to have every draft report the drafter's last hidden states as ``Draft.extras[LAST_HIDDEN]``
    #: (``specpolicy.core.types.LAST_HIDDEN``). Off by default: the default path computes nothing more.
    #: A drafter that cannot report them leaves the key out (the policy then falls back to confidences).
    report_hidden: bool = False

    def __copy__(self) -> Drafter:
        """A shallow copy for one request of the batched loop (``specpolicy.core.batching``): the same
        weights, its own state once ``prefill`` replaces it. A compiled drafter's static cache
        (``static``: one per drafter, ``specpolicy.runners``) is not shared -- requests
        would overwrite each other's drafting state -- so the copy drafts eagerly, unless the
        drafter it copies came from ``batched`` with a cache the requests share. Here: a drafter that
        holds its ``static`` itself; the built-in ones keep theirs in their runners
        (``specpolicy.runners``) and give their copies an eager runner."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        if clone.__dict__.get("static") is not None:  # an attribute of the compiled drafters only
            clone.__dict__["static"] = None
        return clone

    def batched(self, slots: int) -> Drafter:
        """The drafter the batched loop copies per request (``specpolicy.core.batching``), for at
        most ``slots`` requests in flight -- as ``Verifier.batched(slots=)`` sizes the target's
        cache. Default: this drafter. A drafter whose requests can share a cache sized by the batch
        (on the compiled runtime ``eagle3``, ``ar`` and ``dflash``: one static sequence per request)
        returns one whose copies take their share in ``prefill`` and give it back in ``release``."""
        return self

    def release(self) -> None:
        """The batched loop is done with this request's copy (it finished, or its prefill failed):
        free what it holds of a cache shared by the batch. Default: nothing."""

    @abstractmethod
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        """Start a new prompt.

        A drafter with ``target_feature_layers`` is also given the keyword ``features``: ``(P - 1, F)``
        float, the target's requested hidden states at prompt positions ``0 .. P-2``
        (``Verifier.prompt_features``); the last prompt token is pending and has none yet.

        Args:
            prompt_ids: ``(P,) int64`` the prompt, P >= 1. Its last token is the first
                token the drafter continues from.
            sampling: the prompt's sampling settings; None (or greedy) = greedy drafting.
                Non-greedy: a drafter with a model samples each token from
                ``specpolicy.core.sampling.warp`` of its logits (draws from ``runtime.generator``) and
                reports those rows in ``Draft.probs``; a token depending on a later drafted token
                must not be reported that way (speculative sampling's q_i must be the distribution
                of token i given the tokens before it). A model-free drafter may ignore it (its
                tokens are then verified as point masses). The loop passes the keyword only when
                sampling, so drafters written before it keep working (as point masses).
        Raises:
            ValueError: if the prompt is empty or longer than the drafter's context.
        """

    @abstractmethod
    def draft(self, num_tokens: int) -> Draft:
        """Extend the current round's draft by ``num_tokens`` tokens.

        Args:
            num_tokens: tokens to add, >= 1.
        Returns:
            The whole draft of the round so far (earlier tokens unchanged), with
            ``forward_passes`` counting every pass spent on it and ``lookahead`` the tokens
            already decoded past it (free to add: a drafter decoding whole chunks, such as
            Fast-dLLM's small blocks, reports the rest of the chunk; default 0). A drafter that has nothing
            (more) to propose -- a model-free drafter without a match -- may add fewer tokens,
            possibly none; the loop then stops drafting and verifies the draft as it stands.
            A drafter that drafted a stop token (EOS) may end the draft there and set
            ``Draft.ends_at_stop_token``: the loop then stops drafting (reason ``stop_token``).
        """

    @classmethod
    def draft_many(cls, drafters: list[Drafter], num_tokens: list[int]) -> list[Draft]:
        """Extend several requests' drafts at once (the batched loop, ``specpolicy.core.batching``): each
        drafter (an instance of ``cls``) holds one request and adds ``num_tokens[i]`` tokens, as its
        ``draft`` would. Default: ``draft`` one request after another. A drafter class that can run
        its passes for many requests in one forward pass overrides it (``ar``, ``fastdllm``, ``eagle3``,
        ``dflash``) and returns what the calls one by one would (greedy: the same tokens; sampling: the
        same distributions, the draws of a batched pass made for its requests in row order).

        Returns:
            every request's whole draft of the round so far, in order.
        """
        return [d.draft(n) for d, n in zip(drafters, num_tokens)]

    @abstractmethod
    def commit(self, draft: Draft, verification: Verification) -> None:
        """Take the target's verdict: the committed sequence grows by
        ``verification.committed_tokens(draft)``; discard the rest and start a new round.

        ``draft`` may hold trailing tokens the drafter did not produce (draft reuse). A drafter
        with ``target_feature_layers`` reads the committed positions' target features from
        ``verification.features`` (``(accepted_length + 1, F)``).
        """
