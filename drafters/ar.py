"""``ar`` drafter: an autoregressive Hugging Face causal LM with its own KV cache."""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core import tree
from specpolicy.core.checks import check_keys
from specpolicy.core.drafter import Drafter
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, choose_rows
from specpolicy.core.types import LAST_HIDDEN, Draft, Verification
from specpolicy.models.loading import (
    check_attention,
    check_model_source,
    check_same_vocabulary,
    context_length,
    load_causal_lm,
    load_tokenizer,
)
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.runners.causal import BATCH_POSITIONS as BATCH_POSITIONS, CausalRunner, CausalSequence
from specpolicy.runners.decoder import StaticDecoder

NAME = "ar"
CONFIG_KEYS = ("model", "attn_implementation")


class ARDrafter(Drafter):
    """Autoregressive drafting, one forward pass per drafted token (Leviathan et al. 2023): greedy
    (argmax) by default; with non-greedy ``sampling`` given to ``prefill``, each token is sampled
    from ``warp`` of the logits (draws from ``runtime.generator``) and the draft reports those
    rows as ``Draft.probs`` (q of speculative sampling).

    The KV cache holds the committed sequence except the tokens not yet fed (``_unfed``,
    at least the last committed token). Drafted tokens extend the cache as they are fed;
    ``commit`` keeps the KV of drafted tokens the target accepted and crops the rest, so
    no prefix is ever recomputed. Confidence of a token = max probability of the
    distribution it was taken from (sampling: of the warped q, not the sampled token's probability).

    Drafting is stated once, as steps over ``R`` requests (``draft`` is ``R`` = 1); how a pass runs
    is the runner's (``specpolicy.runners.causal.CausalRunner``): eager (a ``DynamicCache`` per
    request; several requests in one padded pass, ``CausalRunner.together``), on the compiled
    runtime's static KV cache (``runtime.compile``; ``StaticDecoder``, its compile seconds added
    to ``runtime.warmup_s``), and in the batched loop (``batched``) on a static cache of one
    sequence per request, compiled: one pass for every request at each step.

    Args:
        model: the drafter LM, on the runtime device.
        runtime: shared runtime.
    """

    name = NAME

    def __init__(self, model: PreTrainedModel, runtime: Runtime):
        self.model = model
        self.runtime = runtime
        self.max_context = context_length(model)
        self.runner = CausalRunner(model, runtime, capacity=self.max_context, single=True)
        self.sequence: CausalSequence | None = None  # this request's sequence on the runner
        self._unfed: torch.Tensor | None = None  # (u,) committed tokens not in the cache yet
        self._tokens: list[torch.Tensor] = []  # this round's drafted tokens, (1,) each
        self._confs: list[torch.Tensor] = []
        self._probs: list[torch.Tensor] = []  # sampling: (1, V) float32 q row per drafted token
        self._passes = 0
        self._sampling: SamplingConfig | None = None  # None: greedy

    @property
    def static(self) -> StaticDecoder | None:
        """The compiled runtime's static cache of one sequence (batch 1), else None."""
        return self.runner.static if self.runner.single else None

    @static.setter
    def static(self, static: StaticDecoder | None) -> None:
        self.runner.use(static)

    @property
    def cache(self) -> DynamicCache | None:
        """Eager: this request's ``DynamicCache``; else None."""
        return None if self.sequence is None else self.sequence.cache

    def __copy__(self) -> ARDrafter:
        """``Drafter.__copy__``: a copy of a batch-1 compiled drafter drafts eagerly (its static cache
        is not shared); a copy of ``batched``'s shares its static cache of one sequence per request."""
        clone = super().__copy__()
        assert isinstance(clone, ARDrafter)
        if self.static is not None:
            clone.runner = self.runner.eager()
        return clone

    def batched(self, slots: int) -> ARDrafter:
        """On the compiled runtime, the drafter whose copies draft on a static cache of ``slots``
        sequences (``CausalRunner.batched``), one each from ``prefill`` to ``release``; else this drafter."""
        if self.static is None:
            return self
        lead = copy.copy(self)
        lead.runner, lead.sequence = self.runner.batched(slots), None
        return lead

    def release(self) -> None:
        """The batched loop is done with this request: its sequence of the shared cache is free."""
        self.runner.close(self.sequence)
        self.sequence = None

    #: Pass entry points watched on the compiled runtime too (called from eager Python only).
    eager_pass_methods = ("_choose",)

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass (``specpolicy.core.passes``): the model's forward, the runner's
        pass keeping the last positions (``CausalRunner.last``: the forward and the slicing of its
        logits), the choice of the tokens from its logits (``_choose``: the softmax's most likely
        token or a draw, tensor work on the pass's output) and, on the compiled runtime, the static
        runner's ``run``."""
        own = (self.model, (self.runner, "last"), (self, "_choose"))
        return own + (((self.static, "run"),) if self.static is not None else ())

    @no_grad
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        n = int(prompt_ids.shape[0])
        if n < 1 or n >= self.max_context:
            raise ValueError(f"prompt_ids has {n} tokens; the ar drafter accepts 1..{self.max_context - 1}")
        self.release()  # a batched run's request: its sequence of the shared cache given back first
        self.sequence = self.runner.open()
        self._unfed = prompt_ids.to(self.runtime.torch_device)
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        self._tokens, self._confs, self._probs, self._passes = [], [], [], 0
        self._hidden: list[torch.Tensor] = []  # report_hidden: (1, H) last hidden state per drafted token

    def _feed(self) -> torch.Tensor:
        """What the next pass feeds: the round's first the committed tokens not yet cached, each
        later one the last drafted token."""
        return self._tokens[-1] if self._tokens else self._unfed

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        return self.draft_many([self], [num_tokens])[0]

    @classmethod
    @no_grad
    def draft_many(cls, drafters: list[ARDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` for many requests: each of ``max(num_tokens)`` steps is ONE pass over the
        requests still drafting (``_steps``). Eager, the requests whose caches and first feeds allow
        it (``CausalRunner.joins``: at least two) run in one padded pass per step
        (``CausalRunner.together``: a row that has its tokens is fed on, its output unused), the
        others one by one before them.

        Returns:
            what the calls one by one return (the same tokens and confidences, up to the
            floating-point effects of batched matrix products; exact in float64; sampling: each
            step's tokens drawn for all its requests in row order, the same distributions, other
            draws than alone).
        Raises:
            ValueError: a count < 1 (before any pass).
        """
        for n in num_tokens:
            if n < 1:
                raise ValueError(f"num_tokens must be >= 1, got {n}")
        runner = drafters[0].runner
        if runner.shared or len(drafters) < 2:
            return cls._steps(drafters, num_tokens)
        together = [i for i, d in enumerate(drafters) if runner.joins(d.sequence, d._feed())]
        if len(together) < 2:
            return [cls._steps([d], [k])[0] for d, k in zip(drafters, num_tokens)]
        out: list[Draft | None] = [None] * len(drafters)
        for i, d in enumerate(drafters):
            if i not in together:
                out[i] = cls._steps([d], [num_tokens[i]])[0]
        group, counts = [drafters[i] for i in together], [num_tokens[i] for i in together]
        tokens, confs, qs = runner.together(
            [d.sequence for d in group], [d._feed() for d in group], counts, lambda x: group[0]._choose(group, x)
        )
        for i, d, k in zip(together, group, counts):
            row = together.index(i)
            d._tokens.extend(tokens[row, :k, None].unbind(0))
            d._confs.extend(confs[row, :k, None].unbind(0))
            d._probs.extend(q[row] for q in qs[:k] if q[row] is not None)
            d._passes += k
            out[i] = d._round_draft()
        return out

    @staticmethod
    def _steps(drafters: list[ARDrafter], num_tokens: list[int]) -> list[Draft]:
        """The drafting step, stated once for ``R`` requests: each of ``max(num_tokens)`` steps is ONE
        runner pass (``CausalRunner.last``) over the requests that still want a token -- each fed
        its tokens not yet cached at the round's first pass, else its last drafted token -- and
        each takes its next token from its last position (``_choose_rows``)."""
        runner = drafters[0].runner
        if len(drafters) == 1:  # one request (the batch-1 loop): the same steps without the per-row lists
            d = drafters[0]
            for _ in range(num_tokens[0]):
                logits, states = runner.last([cast(CausalSequence, d.sequence)], [d._feed()], d.report_hidden)
                token, conf, q = d._choose(drafters, logits)  # (1,) each: the rows themselves
                d._tokens.append(token)
                d._confs.append(conf)
                if q[0] is not None:
                    d._probs.append(q[0])
                if states is not None:
                    d._hidden.append(states)
                d._passes += 1
            return [d._round_draft()]
        for step in range(max(num_tokens)):
            wanting = [d for d, k in zip(drafters, num_tokens) if k > step]
            hidden = any(d.report_hidden for d in wanting)
            logits, states = runner.last([d.sequence for d in wanting], [d._feed() for d in wanting], hidden)
            token, conf, q = wanting[0]._choose(wanting, logits)
            for i, d in enumerate(wanting):
                d._tokens.append(token[i : i + 1])
                d._confs.append(conf[i : i + 1])
                if q[i] is not None:
                    d._probs.append(q[i])
                if states is not None:
                    d._hidden.append(states[i : i + 1])
                d._passes += 1
        return [d._round_draft() for d in drafters]

    def _choose(self, drafters: list[ARDrafter], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        """``_choose_rows`` called on the first of ``drafters``: the pass entry point of the choice
        (``timed_calls``), part of the drafter's pass as the verifier's argmax is of the target's."""
        return ARDrafter._choose_rows(drafters, logits)

    @staticmethod
    def _choose_rows(drafters: list[ARDrafter], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Each request's next token from its row of a pass's logits ``(b, V)``: greedy the
        softmax's most likely token, sampling a draw from ``warp`` (``choose_rows``, row order).
        Returns ``(tokens (b,), confidences (b,), q rows (1, V) or None)``."""
        if all(d._sampling is None for d in drafters):
            conf, token = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            return token, conf, [None] * len(drafters)
        return choose_rows(logits, [d._sampling for d in drafters], drafters[0].runtime.generator)

    def _round_draft(self) -> Draft:
        """The round's draft so far (q rows when sampling; ``extras[LAST_HIDDEN]`` when ``report_hidden``
        and every drafted token's pass ran alone, eagerly), built by ``Draft.chain``; the round's first
        token alone is handed out as its pass chose it (``(1,)`` tensors: no cat), later calls the cat of
        the round's tokens (host work per call: a policy that asks one token at a time makes one call per token)."""
        tokens, confs = self._tokens, self._confs
        count = len(tokens)  # one token per entry: no tensor shape read after the pass
        if count == 1:
            token_ids, confidences = tokens[0], confs[0]  # the round's first token alone: it is the draft, no cat
        else:
            token_ids, confidences = torch.cat(tokens), torch.cat(confs)
        probs = torch.cat(self._probs) if self._probs else None
        extras = {LAST_HIDDEN: torch.cat(self._hidden)} if self._hidden and len(self._hidden) == count else None
        return Draft.chain(token_ids, confidences, self._passes, count, probs=probs, extras=extras)

    # -- draft trees (EAGLE-2 dynamic trees, ``policies/eagle2_tree.py``) -----------------------

    @no_grad
    def tree_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start the round's draft tree: one pass feeds the committed tokens not yet cached; the
        root (node 0, the last committed token) predicts its children.

        Returns:
            the root's ``top_k`` children: ids ``(top_k,) int64`` and log-probabilities ``(top_k,)
            float32``, best first.
        """
        logits = self.runner.last([self.sequence], [self._unfed])[0][0]  # (V,)
        self._unfed = self._unfed[:0]
        self._tree_committed = self.sequence.length  # the root is the last of these
        self._tree = tree.GrowingTree(self._tree_committed, logits.device)
        self._passes = 1
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k)
        return ids, values

    @no_grad
    def tree_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` nodes to the round's tree in one pass (a tree attention mask: each sees the
        committed tokens, its ancestors and itself; positions by depth; ``CausalRunner.tree``) and
        return their children.

        Args:
            tokens: ``(m,) int64``. parents: ``(m,) int64`` (or a list) their parents' node numbers
                (0 = the root, else a number ``tree_expand`` returned). top_k: children reported per node.
        Returns:
            ``(node numbers (m,) int64, child ids (m, top_k) int64, child log-probabilities (m, top_k) float32)``.
        """
        parents = torch.as_tensor(parents, dtype=torch.long, device=tokens.device)
        nodes, positions, mask = self._tree.add(parents)
        logits = self.runner.tree(self.sequence, tokens, positions, mask)  # (m, V)
        self._passes += 1
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
        return nodes, ids, values

    @property
    def tree_passes(self) -> int:
        """Drafter passes spent on the round's tree so far."""
        return self._passes

    def commit(self, draft: Draft, verification: Verification) -> None:
        committed = verification.committed_tokens(draft)  # (a + 1,)
        if draft.is_tree:  # drop the tree's nodes; the committed path is fed with the next round's first pass
            self.sequence.crop(self._tree_committed)
            self._unfed = committed
            self._new_round()
            return
        drafted = len(self._tokens)
        if drafted == 0:  # nothing fed this round: everything committed joins the unfed tokens
            self._unfed = torch.cat([self._unfed, committed])
        else:
            # The cache holds the pre-round sequence, the unfed tokens and d_1..d_{m-1} (d_m never fed).
            keep = min(verification.accepted_length, drafted - 1)
            self.sequence.crop(self.sequence.length - (drafted - 1) + keep)
            self._unfed = committed[keep:]
        self._new_round()


def validate(config: dict[str, Any]) -> None:
    """``drafter=ar``: known keys, the model's directory and weights (not loaded), the attention."""
    check_keys("drafter", config, CONFIG_KEYS)
    check_model_source("drafter.model", config.get("model"))
    check_attention("drafter.attn_implementation", config.get("attn_implementation", "sdpa"))


def build(config: dict[str, Any], runtime: Runtime, verifier) -> ARDrafter:
    """Factory for ``drafter=ar``. Config key: ``model`` (bundled name, local path or hub id)."""
    model = load_causal_lm(config["model"], runtime, config.get("attn_implementation", "sdpa"))
    check_same_vocabulary(verifier.tokenizer, load_tokenizer(config["model"]), NAME)
    return ARDrafter(model, runtime)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=ar`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry("drafter", NAME, build, validate, "an autoregressive Hugging Face causal LM with its own KV cache")
    ]
