"""``eagle3`` drafter: EAGLE-3 chain drafting, one token per drafter pass, from the target's fused
low/mid/high features (Li et al., arXiv 2503.01840; the network is ``specpolicy.models.eagle3``).

Drafter position i pairs the target's feature of position i with the token at i + 1 and predicts
the token at i + 2. The target's features exist for every committed position but the pending
(last) token, so the last such pair -- (feature of the position before the pending token, the
pending token) -- predicts the first draft token. Each further draft token feeds the drafter's own
output back as the feature with the token just drafted (EAGLE's "feature" recurrence; training-time
test trains it for exactly this, ``specpolicy.family.train_eagle3``). A draft of k tokens costs k
passes; the first also writes the newly committed pairs into the cache.

Cache: the layer's KV cache holds the committed pairs (real features) and, during a round, the
drafted positions; ``commit`` crops it back to the committed pairs and stores the features the
verification brought (the previously pending token's and the accepted tokens', paired with the
tokens after them), which the next round's first pass writes. Nothing committed is recomputed.

Draft vocabulary: the head may predict over a smaller vocabulary; draft id d is target id
``d + d2t[d]``. Sampling draws from ``warp`` of the draft-vocabulary logits and reports q over the
target vocabulary (zero outside the draft vocabulary), so speculative sampling stays lossless.
Draft trees: ``tree_root`` / ``tree_expand`` grow EAGLE-2's dynamic tree (``policy=eagle2-tree``;
on the CPU ``tree_root_host`` / ``tree_pass_host``, the levels laid out by the policy's compiled call
in kept buffers), ``alternatives`` gives each chain position's next most likely tokens
(``policy=failfast-tree``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from specpolicy.core import tree
from specpolicy.core.checks import check_keys, choice
from specpolicy.core.compiled_eagle import TreeLevels, warm_kernels
from specpolicy.core.drafter import Drafter
from specpolicy.core.features import check_prompt_features, probe_verifier, target_parts
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, choose_rows
from specpolicy.core.types import LAST_HIDDEN, Draft, Verification
from specpolicy.models.checkpoint import check_checkpoint
from specpolicy.models.eagle3 import (
    LAYER_ID_CONVENTIONS,
    Eagle3DraftModel,
    Eagle3Spec,
    check_head_fits_target,
    load_eagle3,
)
from specpolicy.models.kv import KVCache
from specpolicy.models.loading import resolve_model_path
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.runners.eagle3 import BATCH_POSITIONS as BATCH_POSITIONS, Eagle3Runner, HeadPass, StaticLength
from specpolicy.runners.sequences import SharedSequencesDrafter

NAME = "eagle3"
CONFIG_KEYS = ("model", "layer_id_convention")


#: runtime dtypes a CPU tensor shares with numpy: a draft tree laid out on the host (``tree_root_host``)
_HOST_FLOATS = (torch.float32, torch.float64)


class Eagle3Drafter(SharedSequencesDrafter, Drafter):
    """EAGLE-3 chain drafting.

    Args:
        model: the EAGLE-3 head, on the runtime device in the runtime dtype, eval mode.
        embed_tokens: the target's input embedding module.
        feature_layers: the target ``hidden_states`` indices it reads (three, low -> high).
        vocab_size: the target's vocabulary size (rows of ``Draft.probs`` when sampling).
        runtime: the shared runtime.
        stop_token_ids: token ids that end generation; a draft ends at the first one it drafts.
        max_context: the verifier's context in tokens (0: the head's ``max_position_embeddings``),
            which sizes the compiled runtime's static cache.

    How a pass runs is the runner's (``specpolicy.runners.eagle3.Eagle3Runner``), which builds the
    static caches: on the compiled runtime (``runtime.compile``) the head's passes -- chain steps, a
    tree's root and levels -- run through a static KV cache compiled per shape bucket
    (``StaticEagle3``, its compile seconds added to ``runtime.warmup_s``; capacity: ``max_context``
    + 128 tree nodes); ``commit`` moves its length. In the batched loop (``batched``) the requests,
    greedy or sampling, draft on a static cache of one sequence per request, compiled
    (``StaticEagle3`` of several sequences, ``Eagle3Runner.batched``): one pass for every request
    at each step.
    """

    name = NAME

    def __init__(
        self,
        model: Eagle3DraftModel,
        embed_tokens: torch.nn.Module,
        feature_layers: tuple[int, ...],
        vocab_size: int,
        runtime: Runtime,
        stop_token_ids: frozenset[int] | tuple[int, ...] = (),
        max_context: int = 0,
    ):
        self.model, self.embed_tokens, self.runtime = model, embed_tokens, runtime
        self.target_feature_layers = tuple(feature_layers)
        self.vocab_size = vocab_size
        # (Vd,) int64: the target id of every draft id, for spreading q over the target vocabulary
        self._target_of_draft = model.to_target_ids(torch.arange(model.spec.draft_vocab_size, device=model.d2t.device))
        self._stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=runtime.torch_device)
        self._stop_set = frozenset(int(t) for t in stop_token_ids)  # the same ids, for the host check of a call
        # the round's empty draft, shared by every round (never written: drafted tokens replace it)
        self._no_tokens = torch.empty(0, dtype=torch.long, device=runtime.torch_device)
        self._no_confs = torch.empty(0, dtype=torch.float32, device=runtime.torch_device)
        self.cache: Any = None  # the request's cache on the runner (``Eagle3Runner.open``)
        self._committed_pairs = 0  # pairs with real features in the cache
        self._features: torch.Tensor | None = None  # (u, 3H) features of committed pairs not yet cached
        self._pair_tokens: torch.Tensor | None = None  # (u,) the token after each of them
        self._waiting: list[tuple[torch.Tensor, torch.Tensor]] = []  # later rounds' pairs, not joined yet
        self._sampling: SamplingConfig | None = None
        self._cast_features = False  # the target's features are not in the runtime dtype (read at prefill)
        self._on_host = runtime.torch_device.type == "cpu"  # ``commit`` reads a tree's path on the host
        #: a draft tree's levels laid out on the host (``tree_root_host`` / ``tree_pass_host``): the CPU
        #: at a dtype numpy shares (float32, float64)
        self.grows_trees_on_host = self._on_host and runtime.torch_dtype in _HOST_FLOATS
        self._host_dtype = np.dtype(np.float64 if runtime.torch_dtype == torch.float64 else np.float32)
        #: the head's output width H and draft vocabulary (a tree's buffers: ``TreeLevels``)
        self._head_width, self._draft_vocab = int(model.fc.weight.shape[0]), int(model.spec.draft_vocab_size)
        self._levels: TreeLevels | None = None  # their buffers, kept from round to round
        self._tree_round = False  # this round drafted through ``tree_root_host``
        if self.grows_trees_on_host:
            warm_kernels()  # compiled (or loaded) now, not in a round
        #: the one-request eager step's ``HeadPass``, its tokens and features set per step (``_steps_alone``)
        self._step_pass = HeadPass(self._no_tokens, self._no_tokens, None)
        #: how a pass runs: eager, on the compiled runtime's static cache, on a batched run's shared one
        self.runner = Eagle3Runner(model, embed_tokens, runtime, max_context)

    #: Pass entry points watched on the compiled runtime too (called from eager Python only).
    eager_pass_methods = ("_choose",)

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass: a tree's root and level passes (``_root_pass``,
        ``_tree_pass``), the head's forward, its fc (called directly on the target's features), its
        ``logits`` (norm and LM head) and its norm (the hidden state reported to an acceptance head),
        the runner's eager pass of one request (``Eagle3Runner.one``: embeddings, positions, forward,
        cache, logits), the choice of a chain step's tokens from its logits (``_choose``), the top-k of its
        distributions (``top_tokens``; ``alternatives``, which tree policies ask for), the target's
        embeddings and, compiled, the static head's ``chain`` and ``passes``. Benchmarks time
        a drafter's forward passes as their outermost calls (``specpolicy.analysis.profiling.ForwardTimer``)."""
        return (
            (self, "_root_pass"),
            (self, "_tree_pass"),
            self.model,
            self.model.fc,
            (self.model, "logits"),
            self.model.norm,
            (self.runner, "one"),
            (self, "_choose"),
            (self.model, "top_tokens"),
            (self, "alternatives"),
            self.embed_tokens,
        ) + (((self.static, "chain"), (self.static, "passes")) if self.static is not None else ())

    @no_grad
    def prefill(
        self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None, features: torch.Tensor | None = None
    ) -> None:
        """Start a prompt. ``features``: ``(P - 1, 3 H_target)`` the target's features of the prompt
        but its last token (``Verifier.prompt_features``).

        Raises:
            ValueError: for an empty prompt or missing / mis-shaped features.
        """
        check_prompt_features(prompt_ids, features, "the eagle3 drafter")
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        self._open()  # the request's cache on the runner (a batched run's: a sequence of the shared cache)
        self._committed_pairs = 0
        self._features, self._pair_tokens = features, prompt_ids[1:]
        self._cast_features = features is not None and features.dtype != self.runtime.torch_dtype
        self._step_pass = HeadPass(self._no_tokens, self._no_tokens, self.cache)  # this request's (copies: their own)
        self._waiting = []
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        self._tree_round = False  # set by ``tree_root_host``: its rounds change ``_passes`` alone
        self._tokens, self._confs = self._no_tokens, self._no_confs
        self._count = 0  # tokens in ``_tokens`` (a Python int: no shape read)
        #: ``(1, H)`` the last eager one-request pass's output that predicts the next token (the view
        #: ``Eagle3Runner.one`` kept, ``last_hidden``), or None: ``_last_out[0]``
        self._last_hidden: torch.Tensor | None = None
        # the passes' tokens and confidences (1,) each not yet joined to ``_tokens`` / ``_confs`` (one
        # cat per ``draft`` call, ``_gather``, not two per pass); the last drafted token (1,)
        self._new_tokens: list[torch.Tensor] = []
        self._new_confs: list[torch.Tensor] = []
        self._last_token: torch.Tensor = self._no_tokens  # read once a pass has drafted (``_last_out`` set)
        self._probs: list[torch.Tensor] = []
        self._last_out: torch.Tensor | None = None  # (1, 1, H): the output that predicts the next token
        self._passes = 0
        self._logits: list[torch.Tensor] = []  # (1, Vd) per drafted token
        self._ended = False  # a stop token was drafted
        self._hidden: list[torch.Tensor] = []  # report_hidden: (1, H) the LM head's input per drafted token

    def _head_pass(self, tokens: torch.Tensor, hidden: torch.Tensor) -> HeadPass:
        """This request's part of the next pass: ``tokens`` ``(n,)`` with their features ``hidden``
        ``(n, H)``, and its cache (``Eagle3Runner.open``: a batched run's shared sequence, the
        compiled runtime's static cache of one sequence, or its ``KVCache``)."""
        return HeadPass(tokens, hidden, self.cache)

    @staticmethod
    def _pass(drafters: list[Eagle3Drafter]) -> None:
        """EAGLE-3's drafting step, stated once for ``R`` = ``len(drafters)`` requests: each feeds its
        new positions -- at the round's first pass its newly committed pairs (``fc`` of the
        target's features), later its last drafted token with the head's own output -- and drafts
        the token its last position predicts (``choose_rows``: their draws in row order; one
        request, ``choose``'s). How the pass runs is the runner's (``Eagle3Runner``)."""
        lead = drafters[0]
        head, dtype = lead.model, lead.runtime.torch_dtype
        passes = []
        for d in drafters:
            if d._last_out is None:  # the round's first pass: the newly committed pairs
                features = d._features.to(dtype) if d._cast_features else d._features
                passes.append(d._head_pass(d._pair_tokens, head.fc(features)))
            else:  # the last drafted token, with the head's own output
                last = d._last_out[0] if d._last_hidden is None else d._last_hidden
                passes.append(d._head_pass(d._last_token, last))
        outs, logits = lead.runner.run(passes)  # (R, 1, H), (R, Vd)
        tokens, confs, qs = lead._choose(drafters, logits)
        for i, d in enumerate(drafters):
            if d._last_out is None:
                d._committed_pairs = d.cache.length
                d._features = d._pair_tokens = None
            if len(drafters) == 1:  # the pass's rows are this request's: no slicing (host work per token)
                d._took(outs, logits, tokens, confs, qs[0], lead.runner.normed)
            else:
                d._took(outs[i : i + 1], logits[i : i + 1], tokens[i : i + 1], confs[i : i + 1], qs[i])

    def _choose(
        self, drafters: list[Eagle3Drafter], logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """Each request's token from its row of a pass's draft-vocabulary logits ``(R, Vd)``
        (``choose_rows``: greedy the argmax, sampling draws in row order), as target ids ``(R,)
        int64``, with confidences ``(R,)`` and q rows over the draft vocabulary. Tensor work on the
        pass's output: part of the pass (``timed_calls``), as the verifier's argmax is."""
        draft_ids, confs, qs = choose_rows(logits, [d._sampling for d in drafters], self.runtime.generator)
        return self.model.to_target_ids(draft_ids), confs, qs

    def _took(
        self,
        last_out: torch.Tensor,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        confs: torch.Tensor,
        q: torch.Tensor | None = None,
        normed: torch.Tensor | None = None,
    ) -> None:
        """Record a pass's drafted token: the output that predicts the next one ``(1, 1, H)``, the
        logits ``(1, Vd)`` (tree policies read their top-k: ``alternatives``), the token (target id)
        and its confidence ``(1,)``, q over the draft vocabulary when sampling, and ``normed``, the
        LM head's input ``(1, H)`` the pass computed for those logits (``Eagle3Runner.normed``) or None."""
        self._last_out = last_out
        # ``one``'s pass (``normed`` set): its kept (1, H) view of ``last_out[0]``, no select op
        self._last_hidden = None if normed is None else self.runner.last_hidden
        self._logits.append(logits)
        if self.report_hidden:  # what ``logits`` read: lm_head(norm(out)), normed once where the pass kept it
            self._hidden.append(self.model.norm(last_out[0]) if normed is None else normed)
        if q is not None:  # q over the target vocabulary
            q = torch.zeros((1, self.vocab_size), dtype=q.dtype, device=q.device).index_add_(
                1, self._target_of_draft, q
            )
            self._probs.append(q)
        self._new_tokens.append(tokens)
        self._new_confs.append(confs)
        self._last_token = tokens
        self._passes += 1

    def _gather(self) -> None:
        """Join the passes' tokens and confidences not yet joined to ``_tokens`` / ``_confs`` (one cat each)."""
        if self._new_tokens:
            new_tokens, new_confs = self._new_tokens, self._new_confs
            if (
                len(new_tokens) == 1
                and self._count == 0
                and new_tokens[0].dtype == torch.long
                and new_confs[0].dtype == torch.float32
            ):  # the round's first token alone (a policy asking one at a time): it is the draft, no cat
                self._tokens, self._confs = new_tokens[0], new_confs[0]
            else:
                self._tokens = torch.cat([self._tokens, *new_tokens])
                self._confs = torch.cat([self._confs, *new_confs])
            self._count += len(new_tokens)
            self._new_tokens, self._new_confs = [], []

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        """Extend the round's draft by ``num_tokens`` tokens, one pass each (``_draft_in_steps`` at
        ``R`` = 1); the draft ends at a drafted stop token.

        Returns:
            ``Draft``: ``(k,) int64`` target ids, ``(k,) float32`` confidences, the passes of the
            round, ``(k, V) float32`` q rows when sampling.
        Raises:
            ValueError: for ``num_tokens`` < 1.
        """
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        return self._draft_alone(num_tokens)

    def _draft_alone(self, num_tokens: int) -> Draft:
        """``_draft_in_steps`` at ``R`` = 1 without its per-step lists (host work per token): the
        same calls in the same order -- a pass per token while there is something to draft from,
        or the runtime's fused chain for the remaining steps."""
        self._gather()
        before = self._count
        left = 0 if self._ended else num_tokens
        if left and self._last_out is None:  # the round's first pass (never fused): the committed pairs
            if not self._can_draft():
                return self._end_call(before)
            if type(self.cache) is KVCache:
                self._first_alone()
            else:
                Eagle3Drafter._pass([self])
            left -= 1
        # past it there is always something to draft from; only the compiled runtime's static cache
        # of one sequence fuses greedy steps (``_chain``), asked once: it drafts every step or none
        if left and self._sampling is None and isinstance(self.cache, StaticLength) and self._chain(left):
            left = 0
        if left and type(self.cache) is KVCache and not self.report_hidden and self._sampling is None:
            self._steps_alone(left)  # eager greedy: the runner's one-request pass, step after step
        else:
            for _ in range(left):
                Eagle3Drafter._pass([self])
        return self._end_call(before)

    def _first_alone(self) -> None:
        """``_pass([self])`` at the round's first pass on an eager ``KVCache``: the newly committed
        pairs (``fc`` of the target's features) through ``Eagle3Runner.one`` (this request's kept
        ``HeadPass``), without the step's lists."""
        features: Any = self._features
        if self._cast_features:
            features = features.to(self.runtime.torch_dtype)
        step, runner = self._step_pass, self.runner
        pairs: Any = self._pair_tokens
        step.tokens, step.hidden, step.cache = pairs, self.model.fc(features), self.cache
        outs, logits = runner.one(step)  # (1, 1, H), (1, Vd)
        tokens, confs, qs = self._choose([self], logits)
        self._committed_pairs = self.cache.length
        self._features = self._pair_tokens = None
        self._took(outs, logits, tokens, confs, qs[0], runner.normed)

    def _steps_alone(self, steps: int) -> None:
        """``steps`` greedy passes past the round's first on an eager ``KVCache``, nothing reported
        (``report_hidden`` off): each ``_pass([self])``'s calls without its lists -- the last drafted
        token with the output that predicted it through ``Eagle3Runner.one`` (this request's kept
        ``HeadPass``), ``_choose`` -- and ``_took``'s records kept in locals, set once after the steps."""
        runner, step, last_out = self.runner, self._step_pass, cast(torch.Tensor, self._last_out)
        step.cache = self.cache
        one, choose, requests = runner.one, self._choose, [self]  # the (timed) entry points, looked up once
        passes_logits, new_tokens, new_confs = self._logits, self._new_tokens, self._new_confs
        tokens, hidden = self._last_token, last_out[0] if self._last_hidden is None else self._last_hidden
        for _ in range(steps):
            step.tokens, step.hidden = tokens, hidden
            outs, logits = one(step)  # (1, 1, H), (1, Vd)
            tokens, confs, _ = choose(requests, logits)
            hidden = runner.last_hidden
            passes_logits.append(logits)
            new_tokens.append(tokens)
            new_confs.append(confs)
        self._last_out, self._last_hidden, self._last_token = outs, hidden, tokens
        self._passes += steps

    def _chain(self, steps: int) -> bool:
        """Greedy steps past the round's first pass as ONE runner call where the runtime fuses them
        (``Eagle3Runner.chain``: the compiled runtime's graphs), with the records ``steps`` passes
        make. Returns False, drafting nothing, where it does not (sampling, the round's first pass,
        an eager or batched runtime): each step is then a pass."""
        # only the compiled runtime's static cache of one sequence fuses steps (``Eagle3Runner.chain``)
        if self._sampling is not None or self._last_out is None or not isinstance(self.cache, StaticLength):
            return False
        chained = self.runner.chain(self._head_pass(self._last_token, self._last_out[0]), steps)
        if chained is None:
            return False
        self._gather()
        tokens, confs, out, logits = chained
        self._last_out = out[None]
        self._logits.extend(logits.split(1))
        self._tokens = torch.cat([self._tokens, tokens])
        self._confs = torch.cat([self._confs, confs])
        self._count += steps
        self._last_token = tokens[-1:]
        self._last_hidden = None
        self._passes += steps
        return True

    def _advance(self) -> bool:
        """One pass, one more drafted token; False when there is nothing to draft from (a
        one-token prompt: no feature yet)."""
        if not self._can_draft():
            return False
        Eagle3Drafter._pass([self])
        return True

    def _can_draft(self) -> bool:
        """Whether there is something to draft from; at the round's first pass the pairs committed
        by rounds that drafted nothing are joined first. False for a one-token prompt (no feature yet)."""
        if self._last_out is not None:
            return True
        self._join_pairs()
        return self._features is not None and self._features.shape[0] > 0

    def _end_call(self, before: int) -> Draft:
        """The round's draft after a ``draft`` call that began at ``before`` tokens: cut at the
        first stop token drafted in the call (one sync per call)."""
        self._gather()
        if self._stop_set and self._count > before:
            # one sync per call: the call's tokens on the host, cut at the first drafted stop token
            called = self._tokens.tolist()[before:]  # one read, no slice op
            hit = next((i for i, t in enumerate(called) if t in self._stop_set), -1)
            if hit >= 0:
                end = before + hit + 1
                self._tokens, self._confs = self._tokens[:end], self._confs[:end]
                self._count = end
                self._probs, self._hidden = self._probs[:end], self._hidden[:end]
                self._ended = True
        probs = torch.cat(self._probs) if self._probs else None
        whole = self._hidden and len(self._hidden) == self._count  # not on compiled chains
        extras = {LAST_HIDDEN: torch.cat(self._hidden)} if whole else None
        return Draft.chain(self._tokens, self._confs, self._passes, self._count, probs, self._ended, extras)

    @classmethod
    @no_grad
    def draft_many(cls, drafters: list[Eagle3Drafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` for many requests with their passes batched (``_draft_in_steps``): at each step
        every request still drafting advances by one token in ONE pass of the head over all of them
        (``Eagle3Runner.run``) -- a request at the round's first pass with its newly committed
        pairs, the others with their last drafted token. Returns what the calls one by one return:
        greedy, the same tokens; sampling, each step's tokens drawn for all its requests in row
        order (``choose_rows``: the same distributions, other draws than alone). Eager, a request
        with more than ``BATCH_POSITIONS`` newly committed pairs (a new prompt) runs that pass
        alone; compiled drafters without a shared cache draft one by one."""
        if all(d.runner.sequences is not None for d in drafters):  # the shared static cache (``batched``)
            return cls._draft_in_steps(drafters, num_tokens)
        if len(drafters) == 1:  # one request (the batch-1 loop): ``draft`` without the base class's list
            return [drafters[0].draft(num_tokens[0])]
        if any(d.runner.static is not None or d.runner.sequences is not None for d in drafters):
            return super().draft_many(drafters, num_tokens)

        def alone(d: Eagle3Drafter) -> bool:  # e.g. a new prompt: alone, not padding every row to its length
            return d._last_out is None and d._features.shape[0] > BATCH_POSITIONS

        return cls._draft_in_steps(drafters, num_tokens, alone)

    @staticmethod
    def _draft_in_steps(
        drafters: list[Eagle3Drafter], num_tokens: list[int], alone: Callable[[Eagle3Drafter], bool] | None = None
    ) -> list[Draft]:
        """The drafting algorithm, stated once for ``R`` = ``len(drafters)`` requests: at each step,
        every request still wanting tokens (and with something to draft from) advances by one token
        in one ``_pass`` over all of them -- but those ``alone`` picks, which advance by their own
        pass, and a greedy request whose runtime fuses its remaining steps (``_chain``)."""
        for d in drafters:
            d._gather()
        before = [d._count for d in drafters]
        left = list(num_tokens)
        while True:
            step = []
            for i, d in enumerate(drafters):
                if left[i] > 0 and not d._ended:
                    if not d._can_draft():
                        left[i] = 0
                    elif d._chain(left[i]):
                        left[i] = 0
                    elif alone is not None and alone(d):
                        d._advance()
                        left[i] -= 1
                    else:
                        step.append(d)
                        left[i] -= 1
            if step:
                Eagle3Drafter._pass(step)
            elif all(left[i] <= 0 or d._ended for i, d in enumerate(drafters)):
                return [d._end_call(b) for d, b in zip(drafters, before)]

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely tokens at each position of the round's chain so far (target ids),
        from the passes that drafted it: ids ``(n, k) int64`` and probabilities ``(n, k) float32``,
        best first. For tree policies (``failfast-tree``), computed when asked."""
        self._gather()
        n = self._count
        if not n:
            return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
        top = torch.softmax(torch.cat(self._logits[:n]).float(), dim=-1).topk(k, dim=-1)
        return self.model.to_target_ids(top.indices), top.values

    # -- draft trees (EAGLE-2 dynamic trees, ``policies/eagle2_tree.py``) -----------------------

    @no_grad
    def tree_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start the round's draft tree: one pass writes the newly committed pairs; the root (node 0,
        the pending token) predicts its children.

        Returns:
            the root's ``top_k`` children: target ids ``(top_k,) int64`` and log-probabilities
            ``(top_k,) float32`` (best first). Empty for a one-token prompt (no feature yet).
        """
        empty = (torch.empty(0, dtype=torch.long), torch.empty(0))
        self._join_pairs()
        if self._features is None or self._features.shape[0] == 0:
            return empty
        out, ids, logp = self._root_pass(top_k)
        self._committed_pairs = self.cache.length
        self._features = self._pair_tokens = None
        self._tree_out = tree.NodeRows(out)  # row r: node r's output (0: the root's)
        self._tree = tree.GrowingTree(self._committed_pairs, out.device)
        self._passes = 1
        return ids[0], logp[0]

    def _root_pass(self, top_k: int, into: tuple | None = None) -> Any:
        """One drafter pass over the newly committed pairs (their features through fc, their tokens'
        embeddings; causal, keys and values cached; ``Eagle3Runner.outputs``): the last one's output
        ``(1, H)`` and its ``top_k`` next tokens (``(1, top_k)`` target ids and log-probabilities);
        with ``into`` (``_top_into``'s tensors) the output alone, the tokens written there."""
        hidden = self.model.fc(self._features.to(self.runtime.torch_dtype))[None]  # (1, u, H)
        out = self.runner.outputs(self._head_pass(self._pair_tokens, hidden[0]))[-1:]
        if into is not None:
            self._top_into(out, top_k, into)
            return out
        ids, logp = self.model.top_tokens(out, top_k)
        return out, ids, logp

    def _top_into(self, out: torch.Tensor, top_k: int, into: tuple) -> None:
        """``Eagle3DraftModel.top_tokens`` of outputs ``out`` ``(m, H)`` written into ``into`` -- target
        ids, log-probabilities and draft ids ``(m, min(top_k, Vd))``, kept tensors (``TreeLevels.views``)
        -- by the same operations (``topk``'s ``out=``, the id map's add): part of the pass."""
        ids, logp, index = into
        head: Any = self.model
        logp_all = torch.log_softmax(head.logits(out).float(), dim=-1)
        torch.topk(logp_all, min(top_k, self._draft_vocab), dim=-1, out=(logp, index))
        torch.add(index, head.d2t[index], out=ids)  # ``to_target_ids``

    @no_grad
    def tree_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` nodes to the round's tree in one pass (tree attention: each sees the committed
        pairs, its ancestors and itself) and return their children.

        Args:
            tokens: ``(m,) int64`` the new nodes' tokens. parents: ``(m,) int64`` (or a list) their
                parents' node numbers (0 = the root, else a number ``tree_expand`` returned).
            top_k: children reported per node.
        Returns:
            ``(node numbers (m,) int64, child ids (m, top_k) int64, child log-probabilities (m, top_k) float32)``.
        """
        if not isinstance(parents, torch.Tensor):
            parents = torch.tensor(parents, dtype=torch.long, device=tokens.device)
        nodes_t, positions_t, mask_t = self._tree.add(parents)
        out, ids_t, logp_t = self._tree_pass(tokens, self._tree_out.take(parents), positions_t, mask_t, top_k)
        self._tree_out.append(out)
        self._passes += 1
        return nodes_t, ids_t, logp_t

    def _tree_pass(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        top_k: int,
        into: tuple | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One drafter pass over ``m`` new tree nodes: their embeddings and their parents' outputs
        ``hidden`` ``(m, H)`` through the head at ``positions`` ``(m,)`` under ``mask``
        (``(m, cached + m) bool``), keys and values cached (``Eagle3Runner.outputs``), then each
        node's ``top_k`` children (``Eagle3DraftModel.top_tokens``; with ``into`` written there,
        ``_top_into``). Returns ``(outputs (m, H), ids, log-probs)`` (``into``: its first two)."""
        out = self.runner.outputs(self._head_pass(tokens, hidden), positions, mask)
        if into is not None:
            self._top_into(out, top_k, into)
            return out, into[0], into[1]
        ids, logp = self.model.top_tokens(out, top_k)
        return out, ids, logp

    @no_grad
    def tree_root_host(self, top_k: int, nodes: int) -> tuple | None:
        """``tree_root`` for a tree whose levels the caller lays out on the host in one compiled call
        each (``grows_trees_on_host``; ``policies/eagle2_tree.py`` with
        ``compiled_eagle.eagle2_host_level``): the same pass, its results as numpy arrays sharing its
        tensors, and the round's ``TreeLevels`` (room for ``nodes`` nodes past the root), which
        ``tree_pass_host`` passes read. Nothing is laid out here (the level call resets the root's row).

        Returns:
            None for a one-token prompt (no feature yet), else ``(root output (1, H), child ids (1,
            top_k) int64, log-probabilities (1, top_k) float32, ``TreeLevels.arrays``, cached positions)``.
        """
        self._join_pairs()
        features = self._features
        pairs = 0 if features is None else features.shape[0]
        if not pairs:
            return None
        levels, top, width = self._levels, min(top_k, self._draft_vocab), self._head_width
        # the cache holds the committed pairs (``commit``'s crop) and, after the pass, the new ones
        self._committed_pairs = committed = self._committed_pairs + pairs
        if levels is None or not levels.fits(width, self._host_dtype, top, nodes, committed + nodes):
            columns = tree.host_buffer_width(committed + nodes, 0 if levels is None else levels.columns)
            most = nodes if levels is None else max(nodes, levels.nodes)
            levels = self._levels = TreeLevels(width, self._host_dtype, top, max(most, 1), columns)
        views = levels.views(1)
        out = self._root_pass(top_k, views[3])
        self._features = self._pair_tokens = None
        self._passes, self._tree_round = 1, True
        return out.numpy(), views[4], views[5], levels.arrays, committed

    def tree_pass_host(
        self, base: int, m: int, top_k: int, outputs: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """One tree pass over nodes ``base + 1 .. base + m`` as ``compiled_eagle.eagle2_host_level`` laid
        them out in the round's ``TreeLevels`` (after ``tree_root_host``, under its caller's no-grad):
        their tokens, positions and parents' outputs as tensors sharing the buffers, their attention
        rows ``(m, cached + base + m) bool`` a view (tree attention, as ``tree_expand``).

        Returns:
            ``(outputs (m, H), child ids (m, top_k) int64, log-probabilities (m, top_k) float32)`` as
            numpy arrays sharing the pass's tensors (the outputs None unless ``outputs``: the round's last pass).
        """
        levels = cast(TreeLevels, self._levels)
        views = levels.views(m)
        size = base + m
        mask = torch.from_numpy(levels.mask[base + 1 : size + 1, : self._committed_pairs + size])
        out, _, _ = self._tree_pass(views[0], views[2], views[1], mask, top_k, views[3])
        self._passes += 1
        return (out.numpy() if outputs else None), views[4], views[5]

    @property
    def tree_passes(self) -> int:
        """Drafter passes spent on the round's tree so far."""
        return self._passes

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Crop the drafted positions and store the committed ones' features with the tokens after
        them (``(a + 1, 3 H)`` and ``verification.committed_tokens``). Raises ``RuntimeError`` when
        the verification brought no features."""
        features = verification.features
        if features is None:
            raise RuntimeError(
                "the eagle3 drafter got no target features from the verification; the verifier must "
                "honour request_features"
            )
        self.cache.crop(self._committed_pairs)
        path = verification.path
        if path is not None and self._on_host:
            # a tree on the CPU: ``committed_tokens`` on numpy (the path's tokens, then the next token,
            # ``target_token_ids[path[-1] + 1]``, which ``next_token`` holds as an int)
            committed = np.empty(len(path) + 1, dtype=np.int64)
            draft.token_ids.numpy().take(path, out=committed[:-1])
            committed[-1] = verification.next_token
            tokens = torch.from_numpy(committed)
        else:
            tokens = verification.committed_tokens(draft)  # (a + 1,): the token after each committed position
        if self._features is not None:  # a round that drafted nothing: the earlier pairs wait too
            self._waiting.append((features, tokens))  # joined when drafting resumes (no copy per round)
        else:
            self._features, self._pair_tokens = features, tokens
        if self._tree_round:  # ``tree_root_host`` / ``tree_pass_host`` changed the pass count alone
            self._passes, self._tree_round = 0, False
        else:
            self._new_round()

    def _join_pairs(self) -> None:
        """Fold the pairs committed by rounds that drafted nothing into ``_features`` / ``_pair_tokens``."""
        if self._waiting:
            self._features = torch.cat([self._features, *(f for f, _ in self._waiting)])
            self._pair_tokens = torch.cat([self._pair_tokens, *(t for _, t in self._waiting)])
            self._waiting.clear()


def check_fits_target(
    draft_config: dict[str, Any], target_config: dict[str, Any], key: str, convention: str = "input"
) -> tuple[int, ...]:
    """Check an EAGLE-3 checkpoint's config.json against the target's (both as dicts); return the
    feature layers as ``hidden_states`` indices (explicit ids read by ``convention``,
    ``Eagle3Spec.feature_layers``).

    Raises:
        ConfigError: naming ``key`` and what does not fit: the feature width, the hidden size (the
            head embeds tokens with the target's embeddings), the vocabulary, or a feature layer
            beyond the target's layers.
    """
    return check_head_fits_target(
        Eagle3Spec.from_config(draft_config, key), draft_config, target_config, key, "EAGLE-3", convention
    )


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=eagle3``: known keys, the checkpoint's directory, config and weights files (not
    loaded), and -- when the target is bundled or local -- the checkpoint against the target's
    config.json (feature width, hidden size, vocabulary, layer ids)."""
    check_keys("drafter", config, CONFIG_KEYS)
    convention = choice("drafter.layer_id_convention", config.get("layer_id_convention", "input"), LAYER_ID_CONVENTIONS)
    check_checkpoint(
        config.get("model", "eagle3-drafter"),
        run_config,
        lambda d, t, k: check_fits_target(d, t, k, convention),
        Eagle3Spec.from_config,
    )


def build(config: dict[str, Any], runtime: Runtime, verifier) -> Eagle3Drafter:
    """Factory for ``drafter=eagle3``. Config keys: ``model`` (bundled ``eagle3-drafter`` or a local
    EAGLE-3 / SpecForge checkpoint directory), ``layer_id_convention`` (``input``: explicit feature
    layer ids are inputs of layers, as vLLM reads them; ``output``: outputs, as SGLang / SpecForge
    do). The embeddings are the target's (``verifier.model``).

    Raises:
        ConfigError: a checkpoint that does not fit the target, or a verifier without a Hugging
            Face model or without hidden states.
    """
    model_name = config.get("model", "eagle3-drafter")
    key = f"drafter.model={model_name!r}"
    embed, _, target_config = target_parts(verifier, NAME)
    from specpolicy.models.checkpoint import read_config

    directory = resolve_model_path(model_name)
    layers = check_fits_target(
        read_config(directory, key), target_config.to_dict(), key, config.get("layer_id_convention", "input")
    )
    model = load_eagle3(directory, key).to(device=runtime.torch_device, dtype=runtime.torch_dtype)
    probe_verifier(verifier, layers, int(target_config.num_hidden_layers) + 1, NAME)
    stop_ids = getattr(verifier, "eos_token_ids", ())
    max_context = int(getattr(verifier, "max_context", 0) or 0)
    return Eagle3Drafter(model, embed, layers, int(target_config.vocab_size), runtime, stop_ids, max_context)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=eagle3`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry(
            "drafter",
            NAME,
            build,
            validate,
            "EAGLE-3: one token per pass from the target's fused low/mid/high features",
        )
    ]
