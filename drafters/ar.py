"""``ar`` drafter: an autoregressive Hugging Face causal LM with its own KV cache."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core import tree
from specpolicy.core.cache import append_columns, crop_cache, padded_cache
from specpolicy.core.checks import check_keys
from specpolicy.core.drafter import Drafter
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig, choose_rows, sample, warp
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
from specpolicy.runners.sequences import SharedSequencesDrafter

NAME = "ar"
CONFIG_KEYS = ("model", "attn_implementation")
#: Most positions a request may feed in the round's first pass of ``draft_many`` (its committed
#: tokens not yet cached, e.g. after many rounds without a draft) and still join the padded batch;
#: one with more drafts alone, not padding every row to its length.
BATCH_POSITIONS = 16
#: Attention implementations that take the custom 4-D mask of ``draft_many``'s padded passes.
BATCHED_ATTENTION = ("sdpa", "eager")


class ARDrafter(SharedSequencesDrafter, Drafter):
    """Autoregressive drafting, one forward pass per drafted token (Leviathan et al. 2023): greedy
    (argmax) by default; with non-greedy ``sampling`` given to ``prefill``, each token is sampled
    from ``warp`` of the logits (draws from ``runtime.generator``) and the draft reports those
    rows as ``Draft.probs`` (q of speculative sampling).

    The KV cache holds the committed sequence except the tokens not yet fed (``_unfed``,
    at least the last committed token). Drafted tokens extend the cache as they are fed;
    ``commit`` keeps the KV of drafted tokens the target accepted and crops the rest, so
    no prefix is ever recomputed. Confidence of a token = max probability of the
    distribution it was taken from (sampling: of the warped q, not the sampled token's probability).

    On the compiled runtime (``runtime.compile``) the passes run through a static KV cache compiled
    per shape bucket (``specpolicy.runners.qwen.StaticQwen``; its compile seconds are added to
    ``runtime.warmup_s``): ``commit`` moves the cache's length. In the batched loop (``batched``)
    the requests, greedy or sampling, draft on a static cache of one sequence per request, compiled
    (``StaticQwen`` of several sequences): one pass for every request at each step.

    Args:
        model: the drafter LM, on the runtime device.
        runtime: shared runtime.
    """

    name = NAME

    def __init__(self, model: PreTrainedModel, runtime: Runtime):
        self.model = model
        self.runtime = runtime
        self.max_context = context_length(model)
        self.cache: DynamicCache | None = None
        self.static = None  # the compiled runtime's StaticQwen, else None
        self._no_shared_sequences()  # the batched loop's StaticQwen of several sequences (``batched``)
        if runtime.compile:
            from specpolicy.runners.qwen import StaticQwen

            self.static = StaticQwen(model, self.max_context, compile=True, settings=runtime.compiled)
            runtime.warmup_s += self.static.warmup()
        self._unfed: torch.Tensor | None = None  # (u,) committed tokens not in the cache yet
        self._tokens: list[torch.Tensor] = []  # this round's drafted tokens, (1,) each
        self._confs: list[torch.Tensor] = []
        self._probs: list[torch.Tensor] = []  # sampling: (1, V) float32 q row per drafted token
        self._passes = 0
        self._sampling: SamplingConfig | None = None  # None: greedy

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass (``specpolicy.core.passes``): the model's forward and, on the
        compiled runtime, the static runner's ``run``."""
        return (self.model,) + (((self.static, "run"),) if self.static is not None else ())

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        n = int(prompt_ids.shape[0])
        if n < 1 or n >= self.max_context:
            raise ValueError(f"prompt_ids has {n} tokens; the ar drafter accepts 1..{self.max_context - 1}")
        if self._take_sequence():  # a batched run's request
            self.cache = _SharedLength(self._shared, self._slot)
        else:
            self.cache = _StaticLength(self.static) if self.static is not None else DynamicCache()
        self._unfed = prompt_ids.to(self.runtime.torch_device)
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _batched_static(self, slots: int):
        """The batched loop's static cache of ``slots`` sequences (``SharedSequencesDrafter.batched``)."""
        from specpolicy.runners.qwen import StaticQwen

        return StaticQwen(
            self.model, self.max_context, self.static.compiled, rows=slots, settings=self.runtime.compiled
        )

    def _new_round(self) -> None:
        self._tokens, self._confs, self._probs, self._passes = [], [], [], 0
        self._hidden: list[torch.Tensor] = []  # report_hidden: (1, H) last hidden state per drafted token

    @torch.no_grad()
    def draft(self, num_tokens: int) -> Draft:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if self._slot is not None:  # a request of a batched run on the shared static cache
            return type(self)._draft_shared([self], [num_tokens])[0]
        for _ in range(num_tokens):  # autoregressive: one pass per token, no host sync
            logits = self._next_logits()
            if self._sampling is None:
                probs = torch.softmax(logits.float(), dim=-1)
                conf, token = probs.max(dim=-1)
            else:
                probs = warp(logits[None], self._sampling)  # (1, V) float32
                conf, token = probs[0].max(), sample(probs, self.runtime.generator)[0]
                self._probs.append(probs)
            self._tokens.append(token[None])
            self._confs.append(conf[None])
            self._passes += 1
        return self._round_draft()

    def _next_logits(self) -> torch.Tensor:
        """One drafting pass: the round's first feeds the committed tokens not yet cached, each later
        one the last drafted token; returns the next token's ``(V,)`` logits."""
        inputs = self._tokens[-1] if self._tokens else self._unfed
        if self.static is not None:
            return self.static.run(inputs)[0][-1]
        if self.report_hidden:  # the LM head's input (the final norm's output) at the last position
            out = self.model(
                input_ids=inputs[None, :], cache=self.cache, use_cache=True, logits_to_keep=1, output_hidden_states=True
            )
            self._hidden.append(out.hidden_states[-1][0, -1:])
            return out.logits[0, -1]
        return self.model(input_ids=inputs[None, :], cache=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    @classmethod
    @torch.no_grad()
    def draft_many(cls, drafters: list[ARDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` for many requests with their passes batched: the requests' caches are copied
        once into one padded ``(b, kv_heads, W, head_dim)`` cache per layer (``W`` = the longest),
        then each of ``max(num_tokens)`` steps runs ONE pass of the model over all of them (a row
        that has its tokens is fed on, its output unused: the batched loop's policies mostly ask
        every request the same length) -- at the first
        step each row's tokens not yet cached (or, when the round's draft is being extended, its
        last drafted token), padded to the most, at later steps each row's last drafted token --
        with a 4-D mask keeping every row to its own cached columns and its own new ones, causally,
        at its own positions. The new keys and values then join each request's own cache (what its
        ``draft`` calls would have fed: never its last drafted token), the padded copy is dropped.

        Args:
            drafters: one ``ARDrafter`` per request (copies sharing the model).
            num_tokens: tokens each adds (>= 1).
        Returns:
            what the calls one by one return (the same tokens and confidences, up to the
            floating-point effects of batched matrix products; exact in float64; sampling: each
            step's tokens drawn for all its requests in row order, the same distributions, other
            draws than alone). A single request, an attention implementation other than ``BATCHED_ATTENTION`` (e.g.
            flash attention, which takes no 4-D mask), and requests with more than
            ``BATCH_POSITIONS`` uncached tokens or an empty cache (a new prompt) draft one by one.
        Raises:
            ValueError: a count < 1 (before any pass).
        """
        for n in num_tokens:
            if n < 1:
                raise ValueError(f"num_tokens must be >= 1, got {n}")
        if all(d._slot is not None for d in drafters):  # the shared static cache (``batched``)
            return cls._draft_shared(drafters, num_tokens)
        together = [
            i
            for i, d in enumerate(drafters)
            if d.static is None
            and d._slot is None
            and d.cache.get_seq_length()
            and (d._tokens or d._unfed.shape[0] <= BATCH_POSITIONS)
        ]
        if len(together) < 2 or drafters[0].model.config._attn_implementation not in BATCHED_ATTENTION:
            return super().draft_many(drafters, num_tokens)
        out: list[Draft | None] = [None] * len(drafters)
        for i, d in enumerate(drafters):
            if i not in together:
                out[i] = d.draft(num_tokens[i])
        drafted = cls._draft_together([drafters[i] for i in together], [num_tokens[i] for i in together])
        for i, draft in zip(together, drafted):
            out[i] = draft
        return out

    @staticmethod
    def _draft_shared(drafters: list[ARDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft_many`` on the shared static cache: each of ``max(num_tokens)`` steps is ONE
        pass over every sequence (``StaticQwen.run_rows``) -- a request that still wants a
        token fed its tokens not yet cached at the round's first pass, else its last drafted token,
        at its own length; the others idle, their sequences untouched."""
        shared, device = drafters[0]._shared, drafters[0].runtime.torch_device
        for step in range(max(num_tokens)):
            wanting = [d for d, k in zip(drafters, num_tokens) if k > step]
            feeds = [d._tokens[-1] if d._tokens else d._unfed for d in wanting]
            counts, slots = [int(x.shape[0]) for x in feeds], [d._slot for d in wanting]
            inputs = torch.zeros((len(shared.lengths), max(counts)), dtype=torch.long, device=device)
            for slot, count, x in zip(slots, counts, feeds):
                inputs[slot, :count] = x
            logits, _ = shared.static.run_rows(inputs, *shared.feed(slots, counts))
            logits = logits[torch.tensor(slots, device=device), torch.tensor(counts, device=device) - 1]  # (b, V)
            token, conf, q = ARDrafter._choose_rows(wanting, logits)
            for i, d in enumerate(wanting):
                d._tokens.append(token[i : i + 1])
                d._confs.append(conf[i : i + 1])
                if q[i] is not None:
                    d._probs.append(q[i])
                d._passes += 1
        return [d._round_draft() for d in drafters]

    @staticmethod
    def _choose_rows(drafters: list[ARDrafter], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Each request's next token from its row of a batched pass's logits ``(b, V)``, as its
        ``draft`` picks it: greedy the softmax's most likely token, sampling a draw from ``warp``
        (``choose_rows``, row order). Returns ``(tokens (b,), confidences (b,), q rows (1, V) or None)``."""
        if all(d._sampling is None for d in drafters):
            conf, token = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            return token, conf, [None] * len(drafters)
        return choose_rows(logits, [d._sampling for d in drafters], drafters[0].runtime.generator)

    def _round_draft(self) -> Draft:
        """The round's draft so far (q rows when sampling; ``extras[LAST_HIDDEN]`` when ``report_hidden``
        and every drafted token's pass ran alone, eagerly)."""
        probs = torch.cat(self._probs) if self._probs else None
        extras = (
            {LAST_HIDDEN: torch.cat(self._hidden)} if self._hidden and len(self._hidden) == len(self._tokens) else {}
        )
        return Draft(
            torch.cat(self._tokens), torch.cat(self._confs), forward_passes=self._passes, probs=probs, extras=extras
        )

    @staticmethod
    def _draft_together(drafters: list[ARDrafter], num_tokens: list[int]) -> list[Draft]:
        """The padded passes of ``draft_many`` (every drafter's cache non-empty)."""
        from specpolicy.core.attention import as_model_mask

        lead = drafters[0]
        model, device = lead.model, lead.runtime.torch_device
        b, steps = len(drafters), max(num_tokens)
        first = [d._tokens[-1] if d._tokens else d._unfed for d in drafters]  # each row's first-step input
        counts = [int(x.shape[0]) for x in first]
        cache, lengths = padded_cache([d.cache for d in drafters])  # row i's columns [0, L_i), the rest masked
        n, width = max(counts), max(lengths)
        inputs = torch.zeros((b, n), dtype=torch.long, device=device)
        for i, x in enumerate(first):
            inputs[i, : counts[i]] = x
        lengths_t, counts_t = torch.tensor(lengths, device=device), torch.tensor(counts, device=device)
        seen = torch.arange(width + n, device=device)[None] < (lengths_t[:, None])  # (b, W + n) visible columns
        seen[:, width:] = torch.arange(n, device=device)[None] < counts_t[:, None]
        rows = torch.arange(b, device=device)
        tokens, confs, qs = [], [], []  # per step: (b,), (b,), b q rows or None
        attn, dtype = model.config._attn_implementation, lead.runtime.torch_dtype
        for step in range(steps):
            if step == 0:
                causal = torch.ones((b, n, width + n), dtype=torch.bool, device=device)
                causal[:, :, width:] = torch.tril(causal[:, :, width:])
                mask = seen[:, None, :] & causal
                positions = lengths_t[:, None] + torch.arange(n, device=device)
                last = counts_t - 1
            else:
                seen = torch.cat([seen, torch.ones((b, 1), dtype=torch.bool, device=device)], dim=1)
                mask = seen[:, None, :]
                positions = (lengths_t + counts_t + step - 1)[:, None]
                last = torch.zeros_like(counts_t)
            logits = model(
                input_ids=inputs,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                attention_mask=as_model_mask(mask[:, None], attn, dtype),
            ).logits[rows, last]  # (b, V)
            token, conf, q = ARDrafter._choose_rows(drafters, logits)
            tokens.append(token)
            confs.append(conf)
            qs.append(q)
            inputs = token[:, None]
        passes_tokens, passes_confs = torch.stack(tokens, 1), torch.stack(confs, 1)  # (b, steps)
        results = []
        for i, d in enumerate(drafters):
            k = num_tokens[i]
            # fed this call: the first-step tokens, then the drafted tokens but the last (never fed)
            columns = torch.cat(
                [
                    torch.arange(width, width + counts[i], device=device),
                    torch.arange(width + n, width + n + k - 1, device=device),
                ]
            )
            append_columns(d.cache, cache, i, columns)
            d._tokens.extend(passes_tokens[i, :k, None].unbind(0))
            d._confs.extend(passes_confs[i, :k, None].unbind(0))
            d._probs.extend(q[i] for q in qs[:k] if q[i] is not None)
            d._passes += k
            results.append(d._round_draft())
        return results

    # -- draft trees (EAGLE-2 dynamic trees, ``policies/eagle2_tree.py``) -----------------------

    @torch.no_grad()
    def tree_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start the round's draft tree: one pass feeds the committed tokens not yet cached; the
        root (node 0, the last committed token) predicts its children.

        Returns:
            the root's ``top_k`` children: ids ``(top_k,) int64`` and log-probabilities ``(top_k,)
            float32``, best first.
        """
        if self.static is not None:
            logits = self.static.run(self._unfed)[0][-1]
        else:
            logits = self.model(
                input_ids=self._unfed[None, :], cache=self.cache, use_cache=True, logits_to_keep=1
            ).logits[0, -1]
        self._unfed = self._unfed[:0]
        self._tree_committed = self.cache.get_seq_length()  # the root is the last of these
        self._tree = tree.GrowingTree(self._tree_committed, logits.device)
        self._passes = 1
        values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k)
        return ids, values

    @torch.no_grad()
    def tree_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` nodes to the round's tree in one pass (a tree attention mask: each sees the
        committed tokens, its ancestors and itself; positions by depth) and return their children.

        Args:
            tokens: ``(m,) int64``. parents: ``(m,) int64`` (or a list) their parents' node numbers
                (0 = the root, else a number ``tree_expand`` returned). top_k: children reported per node.
        Returns:
            ``(node numbers (m,) int64, child ids (m, top_k) int64, child log-probabilities (m, top_k) float32)``.
        """
        from specpolicy.core.attention import as_model_mask

        parents = torch.as_tensor(parents, dtype=torch.long, device=tokens.device)
        nodes, positions, mask = self._tree.add(parents)
        if self.static is not None:
            logits = self.static.run(tokens, positions, mask)[0]
            self._passes += 1
            values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
            return nodes, ids, values
        logits = self.model(
            input_ids=tokens[None],
            position_ids=positions[None],
            attention_mask=as_model_mask(
                mask[None, None], self.model.config._attn_implementation, self.runtime.torch_dtype
            ),
            cache=self.cache,
            use_cache=True,
        ).logits[0]  # (m, V)
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
            crop_cache(self.cache, self._tree_committed)
            self._unfed = committed
            self._new_round()
            return
        drafted = len(self._tokens)
        if drafted == 0:  # nothing fed this round: everything committed joins the unfed tokens
            self._unfed = torch.cat([self._unfed, committed])
        else:
            # The cache holds the pre-round sequence, the unfed tokens and d_1..d_{m-1} (d_m never fed).
            keep = min(verification.accepted_length, drafted - 1)
            crop_cache(self.cache, self.cache.get_seq_length() - (drafted - 1) + keep)
            self._unfed = committed[keep:]
        self._new_round()


class _StaticLength:
    """The two cache calls ``ARDrafter`` makes (``get_seq_length``, and ``crop`` through
    ``specpolicy.core.cache.crop_cache``) on a ``StaticQwen``'s cache: its length."""

    def __init__(self, static) -> None:
        self.static = static
        static.reset()

    def get_seq_length(self) -> int:
        return self.static.length

    def crop(self, count: int) -> None:  # crop_cache passes minus the positions to drop
        self.static.length = self.static.length + count if count < 0 else count


class _SharedLength:
    """``_StaticLength``'s two cache calls on one sequence of a ``SharedSequences``."""

    def __init__(self, shared, slot: int) -> None:
        self.shared, self.slot = shared, slot

    def get_seq_length(self) -> int:
        return self.shared.lengths[self.slot]

    def crop(self, count: int) -> None:  # crop_cache passes minus the positions to drop
        length = self.shared.lengths[self.slot]
        self.shared.lengths[self.slot] = length + count if count < 0 else count


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
