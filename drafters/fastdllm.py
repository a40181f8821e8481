"""``fastdllm`` drafter: Fast-dLLM v2 block-diffusion drafting on a plain ``Qwen2ForCausalLM``.

Fast-dLLM v2 (Wu et al., arXiv 2509.26328) turns an AR model into a block-diffusion LM with
block-causal attention over blocks of ``block_size`` (B = 32) absolute positions
(``specpolicy.models.fastdllm``: the model, its mask and its passes). A block is decoded by
filling it with mask tokens and unmasking them in parallel, small block (S = 8 tokens) by small
block, left to right (confidence-aware parallel decoding: every masked position of the current
small block whose confidence exceeds a threshold is unmasked in one pass, always at least the
most confident one, as in the released generation code, ``batch_sample``). Completed blocks are
served from a KV cache. The AR "token shift" is kept: the logits at position p - 1 predict the token at position
p, so the first token of a block comes from the last logit of the previous block's full pass.

FailFast (Pan et al., arXiv 2512.20573, §4.1-4.2 and Alg. 1) uses this model as the drafter of
speculative decoding: a draft of n tokens costs one pass per small block it touches (threshold
0.05 makes that usually one pass), plus one full-block pass each time the draft crosses a block
boundary "to populate the KV cache of prior drafted tokens" (App. F: 7-12 passes for 30-60-token
rounds).

Path search (``drafter.path_search=cps``; DiffuSpec, arXiv 2510.02358, §4.2, whose drafter is a
standalone dLLM run for ONE refinement step over the whole masked block: ``small_block_size`` =
``block_size`` and one pass per block): an unmasking pass unmasks its small block's masked
positions as the best path of a beam search over their lattice, scored by the drafter and an
n-gram model (``specpolicy.core.path_search``), instead of by the confidence threshold; the draft
ends where the lattice ends. A block's first token (from the previous block's full pass) is the
argmax as before. Sampled rounds verify the path's tokens as point masses. Batched drafting runs
such passes one request after another.

KV-cache invariant (between rounds): the cache holds exactly the KV of the complete committed
blocks, ``floor(L / B) * B`` positions for a committed length L -- what a fresh ``prefill`` of
the committed sequence would compute. During a round, a draft crossing a block boundary writes
the block's KV *tentatively* (it holds unverified draft tokens); ``commit`` keeps such a block
only if it is now committed exactly as written, and otherwise crops it and, when the committed
sequence completes blocks that are not validly cached, rewrites them in one pass (counted in the
next round's ``forward_passes``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from specpolicy.core.checks import check_keys
from specpolicy.core.compiled import block_open, block_scan, unmask_step
from specpolicy.core.drafter import Drafter
from specpolicy.core.path_search import PathSearch
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, sample, warp
from specpolicy.core.types import Draft, Verification
from specpolicy.models.fastdllm import (
    BLOCK_SIZE_CONFIG_KEYS,
    SUPPORTED_ATTENTION as _SUPPORTED_ATTENTION,
    check_model,
    greedy,
    mask_token_id_of,
    model_block_size,
)
from specpolicy.models.loading import (
    check_attention,
    check_model_source,
    check_same_vocabulary,
    context_length,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)
from specpolicy.models.ngram import PATH_SEARCH_DEFAULTS, check_path_search, path_search_of, target_vocabulary
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.runners.causal import CausalSequence
from specpolicy.runners.fastdllm import (
    CONFIDENCE_DTYPES,
    FastDLLMPass,
    FastDLLMRunner,
    check_buckets,
    check_settings,
    greedy_into,
    host_choice,
)
from specpolicy.runners.fastdllm_host import commit_in_place, current_draft, draft_alone, recent_tokens, search_apply

NAME = "fastdllm"

CONFIG_KEYS = (
    "model",
    "block_size",
    "small_block_size",
    "threshold",
    "attn_implementation",
    "confidence_dtype",
    *PATH_SEARCH_DEFAULTS,
)


# -- the drafter ------------------------------------------------------------------------------


class FastDLLMDrafter(Drafter):
    """Fast-dLLM v2 block-diffusion drafter (arXiv 2509.26328; FailFast arXiv 2512.20573 §4, Alg. 1).

    State between rounds (committed length L, current block start ``s = floor(L/B)*B``):
    the KV cache of positions ``[0, s)`` (complete committed blocks), the committed tokens
    ``[s, L)`` of the partial block (``_tail``), and -- when ``L == s`` -- the first token
    of the next block and its confidence, taken from the last logit of the pass that wrote
    block ``[s - B, s)`` (``_first``).

    Drafting a round: the current block is ``_tail`` + drafted tokens + mask tokens up to
    ``s + B``, always fed whole (as in training). Small blocks of S tokens at block offsets
    0, S, 2S, ... are decoded left to right; one pass over the whole block (with the cache of
    earlier blocks, which is cropped back afterwards) unmasks every masked position of the
    small block whose confidence (max softmax probability) exceeds ``threshold``, and at least
    the most confident one; passes repeat until the requested tokens are all unmasked (the
    leading unmasked run of the block reaches the draft's end) or the small block has no masks,
    as the official ``generate_draft_tokens`` stops (at threshold 0.05 one pass almost always
    unmasks the whole small block; at Fast-dLLM's default 0.9 a draft ending inside a small block
    no longer pays for the rest of it). Positions unmasked past the requested count (a whole
    small block at low thresholds, any-order picks at high ones) are kept as look-ahead, and the
    mask state as it stands: a later ``draft`` call of the same round continues from it, with no
    pass repeated. When the block is full and more tokens are wanted, one pass over the complete
    block writes its KV (tentatively) and gives the next block's first token.

    Stop tokens (``stop_token_ids``, the verifier's EOS): once the leading unmasked run holds a
    drafted stop token, drafting stops -- no pass past it in this round -- and the draft ends at
    it (``Draft.ends_at_stop_token``; the loop then verifies, reason ``stop_token``), as the
    official code breaks out and truncates its draft at the stop token.

    Per drafted token the draft reports its id (``int64``) and confidence (``float32``, the max
    probability at the pass that unmasked it; for a block's first token, at the pass whose last
    logit predicted it). ``forward_passes`` counts every drafter pass since the previous round's
    verification: unmasking passes, block-boundary passes, and passes ``commit`` spent rewriting
    newly completed blocks (those are charged to the next round). ``lookahead`` counts the tokens
    of the leading unmasked run decoded past the draft (asking for them costs no pass; 0 after a
    drafted stop token) and ``lookahead_confidences`` their confidences.

    ``Draft.extras[SMALL_BLOCK_CONFIDENCES]`` records, per unmasking pass, the confidences of the small
    block's positions that were masked at that pass (NaN elsewhere): what the official FailFast
    code checks against τ and counts toward N_max (``policy.confidence_scope=small_block``).

    Runtimes: the algorithm is stated once (``_draft_steps``, one step of passes over the ``R``
    requests that still draft; ``draft`` is ``R`` = 1) and ``FastDLLMRunner`` runs each step: the
    Hugging Face forward on a cache per request (several requests: one padded pass), or on the
    compiled runtime (``runtime.compile``, a Qwen2/Qwen3 model) a static KV cache under a block-wise
    causal mask -- one sequence at batch 1, one per request in the batched loop (``batched``), one
    pass for every request at each step.

    Host work: the block's ids, confidences and mask state live in this request's host arrays (B
    positions, filled by ``compiled.block_open``); a pass's tokens and confidences are read once (on
    the CPU through kept views of ``greedy_into``'s outputs, on a device one transfer); the unmasking
    rule, the writes and the block scan are one compiled call a pass (``compiled.unmask_step``); one
    request's host-greedy ``draft`` on an eager cache is ``runners.fastdllm_host.draft_alone`` and a commit
    ending in the current block is lengths (``commit_in_place``: the tail stays in the block's ids).

    Sampling (non-greedy ``sampling`` given to ``prefill``; lossless speculative sampling): at
    every pass each candidate position's token is sampled from ``warp`` of its logits (draws from
    ``runtime.generator``) and the draft reports, per token, the warped distribution of the pass
    that unmasked it (``Draft.probs``, q). Confidence stays the max probability of that
    distribution (not the sampled token's probability, which would make the unmasking choice
    depend on the sample). Unmasking is then LEFT TO RIGHT: a pass unmasks the leading run of
    masked positions whose confidence exceeds ``threshold``, and at least the leftmost masked
    one. Speculative sampling needs q_i to be the distribution of token i given the tokens
    before it; with Fast-dLLM's any-order unmasking a token unmasked after a later one has a q
    that depends on that later token, so the acceptance of the earlier token would bias the
    later one's distribution (``tests/core/test_sampling.py`` shows the bias exactly on a toy and checks
    the order).
    Greedy drafting keeps the any-order rule above (argmax tokens are verified by equality).

    Args:
        model: a causal LM with Fast-dLLM v2 weights (e.g. ``Qwen2ForCausalLM``), eval mode, on
            ``runtime.torch_device``, attention implementation ``sdpa`` or ``eager``.
        runtime: shared runtime.
        tokenizer: gives the mask token (``mask_token_id`` or the token ``|<MASK>|``).
        block_size: B, tokens per block, an int >= 1 (32 in Fast-dLLM v2).
        small_block_size: S, tokens per small block, an int >= 1 dividing ``block_size`` (8).
        threshold: unmasking confidence threshold, a number in [0, 1] (0.05 in FailFast; 0.9 is
            Fast-dLLM v2's default).
        stop_token_ids: token ids (ints) that end a draft (the factory passes the verifier's EOS
            ids); empty: no stop check.
        confidence_dtype: ``"float32"`` (softmax/argmax in at least float32) or ``"model"``
            (in the model dtype, as the official code; see ``specpolicy.models.fastdllm.greedy``).
            Greedy drafting only: sampling warps in float32 either way.
        path_search: DiffuSpec's path search over each unmasking pass's lattice (None: the
            threshold rule above).
        static_cache: run the passes on the static KV cache (``FastDLLMRunner``; default:
            ``runtime.compile`` with a Qwen2/Qwen3 model); compiled only when ``runtime.compile``
            (uncompiled it is a cheap check of the compiled runtime's passes).
    Raises:
        ValueError: naming the parameter for a bad ``block_size``, ``small_block_size``,
            ``threshold`` or ``confidence_dtype``; naming the mask token when the tokenizer has none (or its id is
            outside the model's vocabulary); for an unsupported attention implementation or a
            model with sliding-window layers.
    """

    name = NAME
    #: Pass entry points watched on the compiled runtime too (called from eager Python only).
    eager_pass_methods = ("_choose",)

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass (``specpolicy.core.passes``): the model's forward (every block
        pass, eager or through the runner's static cache) and the choice of the tokens from a
        pass's logits (``_choose``: the argmax and its probability, or a draw from ``warp``),
        tensor work on the pass's output as the AR drafter's ``_choose`` is; the unmasking rule
        that reads the confidences (``compiled.unmask_step``) stays host work."""
        static = self.runner.static
        return (self.model, (self, "_choose")) + (((static, "run"),) if static is not None else ())

    def __init__(
        self,
        model: PreTrainedModel,
        runtime: Runtime,
        tokenizer: Any,
        block_size: int = 32,
        small_block_size: int = 8,
        threshold: float = 0.05,
        stop_token_ids: Iterable[int] = (),
        confidence_dtype: str = "float32",
        path_search: PathSearch | None = None,
        static_cache: bool | None = None,
    ):
        check_settings(block_size, small_block_size, threshold, confidence_dtype)
        mask_id = mask_token_id_of(tokenizer)
        vocab, attn = check_model(model, mask_id)

        self.model = model
        self.runtime = runtime
        self.block_size = block_size
        self.small_block_size = small_block_size
        self.threshold = float(threshold)
        self.confidence_dtype = confidence_dtype
        self.stop_token_ids = tuple(sorted({int(t) for t in stop_token_ids}))
        self.mask_token_id = mask_id
        self.vocab_size = vocab
        self.path_search = path_search
        #: (<= order - 1,) int64 on the host: the last committed tokens, the path search's n-gram context
        self._recent = np.zeros(0, dtype=np.int64)
        self.max_context = context_length(model)
        #: how a pass runs: eager (a cache per request; several requests padded into one pass), or
        #: on the compiled runtime's static cache (one sequence per request)
        self.runner = FastDLLMRunner(model, attn, block_size, runtime, self.max_context, static_cache)
        dev = runtime.torch_device
        self._device = dev
        self._mask_row = torch.full((block_size,), mask_id, dtype=torch.long, device=dev)  # (B,)
        self._mask_index = self._mask_row[:1]  # (1,) the mask token's column (the path search drops it)
        self._stops = np.array(self.stop_token_ids, dtype=np.int64)  # (s,) on the host; empty: no stop check
        self._threshold32 = np.float32(self.threshold)  # compared in float32, as the confidences
        ids, masked, conf = np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.bool_), np.zeros(2, dtype=np.float32)
        unmask_step(ids, conf, 0, ids, conf, masked, self._threshold32, False, self._stops, 0, masked, conf)  # compiled
        block_scan(ids, masked, self._stops, 0)
        block_open(ids, conf, masked, ids[:1], 0, np.float32(0), mask_id, self._stops)
        self._on_cpu, self._no_conf = torch.device(dev).type == "cpu", np.zeros(0, dtype=np.float32)  # (0,)
        #: greedy choices written into tensors whose numpy views are kept (``greedy_into``): the CPU, the
        #: default confidence dtype, float32 logits
        self._host_greedy = self._on_cpu and confidence_dtype == "float32" and model.dtype == torch.float32
        self._chosen: Any = (ids, conf)  # the last ``greedy_into``'s views
        self._logits3d = False  # ``alone``'s (1, m, V) logits go to ``_choose`` as they are (set by prefill)
        self._no_first, self._no_ids = np.float32(0), np.zeros(0, dtype=np.int64)
        self._empty_conf = torch.zeros(0, dtype=torch.float32, device=dev)  # (0,) no look-ahead, never written
        # Per small block j (offsets [a, b)): the block offsets whose logits predict its maskable
        # positions [max(a, 1), b) (token shift: offset p is predicted at offset p - 1). Offset 0
        # of a block is never masked: it is committed or comes from the previous block's pass.
        self._keep = [
            torch.arange(max(a, 1) - 1, a + small_block_size - 1, device=dev)
            for a in range(0, block_size, small_block_size)
        ]
        self.sequence: CausalSequence | None = None  # this request's sequence on the runner (its KV cache)
        self._L = 0  # committed length
        self._base = 0  # cached positions between rounds = floor(L / B) * B
        # (L - base,) int64 committed tokens of the partial block, on the host (``_tail``); None: they
        # lie in the block's ids (``_tail_len`` of them, the last one ``_pending``: ``commit_in_place``)
        self._tail_held: np.ndarray | None = np.zeros(0, dtype=np.int64)
        self._tail_len, self._pending, self._fast = 0, 0, False
        # When L == base: the block's first token, its confidence and (sampling) its q row
        # (int, float32 on the host; (V,) float32 on the device or None).
        self._first: tuple[int, np.float32, torch.Tensor | None] | None = None
        self._carry = 0  # passes spent by commit, charged to the next round
        self._sampling: SamplingConfig | None = None  # None: greedy

    # -- passes ----------------------------------------------------------------------------

    def _check_fits(self, end: int, what: str, *values: int) -> None:
        """Raise (naming ``what.format(*values)``: formatted only then) when position ``end - 1`` is
        past the drafter's context."""
        if self.max_context and end > self.max_context:
            raise ValueError(
                f"{what.format(*values)} needs positions up to {end - 1}, beyond the drafter's max_position_embeddings "
                f"({self.max_context})"
            )

    def _choose(
        self, logits: torch.Tensor, block_first: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Tokens for logits ``(m, V)``: greedy, ``(argmax, its probability, None)`` (see
        ``specpolicy.models.fastdllm.greedy``; ``block_first``: the token comes from the last logit of
        a block pass, which the official code takes as the argmax of the logits); sampling, ``(a sample of warp(logits), max of
        warp(logits), warp(logits))`` -- (m,) int64, (m,) float32, (m, V) float32."""
        if self._sampling is None:
            if self._host_greedy:  # the same values, read on the host through kept views (``_host``)
                tok, conf, *self._chosen = greedy_into(logits, self._outs)
                return tok, conf, None
            tok, conf = greedy(logits, self.confidence_dtype == "model", probs_argmax=not block_first)
            return tok, conf, None
        probs = warp(logits, self._sampling)
        return sample(probs, self.runtime.generator), probs.max(dim=-1).values, probs

    def _host(self, tok: torch.Tensor, conf: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The host read of ``_choose``'s ``(m,)`` tokens and confidences: the kept views, or ``host_choice``."""
        return self._chosen if self._host_greedy and self._sampling is None else host_choice(tok, conf)

    def _write_blocks(self, ids: torch.Tensor, start: int) -> tuple[int, np.float32, torch.Tensor | None]:
        """Write the KV of complete blocks ``ids`` ((n,) int64, n a multiple of B, starting at block
        boundary ``start``) into the cache in one block-causal pass; return the next block's first
        token, confidence and (sampling) q row from the last logit (``_first``)."""
        n = int(ids.shape[0])
        self._check_fits(start + n, "the committed sequence of {} tokens", start + n)
        logits = self.runner.write(self.sequence, ids.to(self._device), start)  # (1, V)
        return self._first_of(logits)

    def _first_of(self, logits: torch.Tensor) -> tuple[int, np.float32, torch.Tensor | None]:
        """The next block's first token from a block pass's last logit ``(1, V)``: its id and
        confidence read to the host (one read) and (sampling) its q row ``(V,)`` float32."""
        tok, conf, probs = self._choose(logits, block_first=True)
        ids, confs = self._host(tok, conf)
        return int(ids[0]), confs[0], None if probs is None else probs[0]

    # -- Drafter interface -------------------------------------------------------------------

    def batched(self, slots: int) -> FastDLLMDrafter:
        """The drafter the batched loop copies per request: on the static cache, one whose copies
        each take a sequence of one static cache of ``slots`` sequences (``FastDLLMRunner.batched``)
        in ``prefill`` and give it back in ``release``; eager, this drafter."""
        if self.runner.static is None:
            return self
        lead = copy.copy(self)
        lead.runner, lead.sequence = self.runner.batched(slots), None
        return lead

    def __copy__(self) -> FastDLLMDrafter:
        """``Drafter.__copy__``; a copy of a drafter on a static cache of one sequence (not from
        ``batched``) drafts eagerly: requests would overwrite each other's sequence."""
        clone = super().__copy__()
        if clone.runner.static is not None and not clone.runner.shared:
            clone.runner, clone.sequence = clone.runner.eager(), None
        return clone

    def release(self) -> None:
        """This request's sequence is free for the next (a static cache's; eager: nothing held)."""
        self.runner.close(self.sequence)
        self.sequence, self._fast = None, False

    @no_grad
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        """Cache the prompt's complete blocks (one block-causal pass); its partial last block is
        drafted over later. When the prompt ends on a block boundary, the first token to draft is
        the prefill pass's last logit.

        Args:
            prompt_ids: ``(P,) int64``, 1 <= P < ``max_position_embeddings``.
            sampling: None or greedy: greedy drafting; otherwise sampled, left-to-right drafting
                (see the class docstring).
        Raises:
            ValueError: naming ``prompt_ids`` when empty or too long for the drafter's context.
        """
        n = int(prompt_ids.shape[0])
        if n < 1 or (self.max_context and n >= self.max_context):
            raise ValueError(
                f"prompt_ids has {n} tokens; the fastdllm drafter accepts 1..{self.max_context - 1} "
                f"(max_position_embeddings={self.max_context})"
            )
        prompt_ids = prompt_ids.to(self._device)
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        B = self.block_size
        self._outs: dict = {}  # ``greedy_into``'s outputs by shape, this request's own
        self._logits3d = self._host_greedy and self._sampling is None and self.path_search is None
        # The current block's ids, confidences and mask state on the host (``_open_block``), this request's own
        self._blk_ids = np.zeros(B, dtype=np.int64)  # (B,) int64
        self._blk_conf, self._blk_masked = np.zeros(B, dtype=np.float32), np.zeros(B, dtype=np.bool_)  # (B,)
        self._blk_row = torch.from_numpy(self._blk_ids[None])  # (1, B) a view (a pass's input on the CPU)
        self._pick = np.zeros(self.small_block_size, dtype=np.bool_)  # (S,) a pass's picks (``unmask_step``)
        self.release()
        self.sequence = self.runner.open()
        # ``fastdllm_host``'s path: eager, host greedy (with a path search: its softmax into a kept buffer)
        self._fast = self._host_greedy and self._sampling is None and self.sequence.cache is not None
        if self._fast and self.path_search is not None:  # (1, S, V) float32, its (1, n, V) views, its host view
            out = torch.empty(1, self.small_block_size, self.vocab_size, dtype=torch.float32)
            self._probs_out, self._probs_np = [out[:, :n] for n in range(self.small_block_size + 1)], out[0].numpy()
        base = (n // B) * B
        self._first = self._write_blocks(prompt_ids[:base], 0) if base else None
        if base != n:
            self._first = None  # not needed: the partial block starts with committed tokens
        host = prompt_ids.cpu().numpy()
        self._L, self._base, self._tail = n, base, host[base:]
        self._recent = self._no_ids
        self._remember(host)
        self._carry = 0
        self._new_round()

    def _new_round(self) -> None:
        self._k = 0  # tokens requested this round (capped at a drafted stop token)
        self._drafted = self._no_ids  # (k,) int64 host copy of the round's draft (``current_draft``)
        self._passes = self._carry
        # Drafted part of each finished block: ids, confidences (host), q rows (sampling) or None.
        self._segments: list[tuple[np.ndarray, np.ndarray, torch.Tensor | None]] = []
        self._tentative: list[tuple[int, tuple]] = []  # (block end, next block's ``_first``)
        self._blk_start: int | None = None  # current block (lazily opened by draft)
        self._stop_len: int | None = None  # draft length ending at the first drafted stop token
        self._sb_conf: list[np.ndarray] = []  # per unmasking pass, (m,) float32, NaN = not masked
        self._path_len: int | None = None  # draft length where the path search ended the draft (no stop token)

    def _remember(self, committed: np.ndarray) -> None:
        """Keep the last committed tokens (``(c,)`` int64, host) the path search's n-gram reads."""
        if self.path_search is not None:
            self._recent = np.concatenate([recent_tokens(self), committed])[-(self.path_search.scorer.order - 1) :]

    def _open_block(self, start: int, prefix: np.ndarray, first: tuple | None) -> None:
        """Make ``[start, start + B)`` the current block: ``prefix`` ((t,) int64 on the host,
        committed tokens, t < B), then -- when t == 0 -- the block's first token ``first`` (as
        ``_first``), then masks. The block's ids, confidences and mask state are kept on the host, in
        this request's arrays (``compiled.block_open``: the fill and the first token's stop check)."""
        B = self.block_size
        self._check_fits(start + B, "a draft from committed length {} (block [{}, {}))", self._L, start, start + B)
        sampled = self._sampling is not None  # q row of every offset (committed or masked ones never read)
        self._blk_probs = torch.empty(B, self.vocab_size, dtype=torch.float32, device=self._device) if sampled else None
        if prefix.shape[0] == 0 and first is None:  # invariant broken: the previous block's pass stored it
            raise RuntimeError("fastdllm drafter: missing the first-token logits of a new block")
        first_id, first_conf, q = first if first is not None and not prefix.shape[0] else (0, self._no_first, None)
        if q is not None and self._blk_probs is not None:
            self._blk_probs[0] = q
        self._blk_start, self._sb_index = start, -1  # the small block being decoded (-1: none yet)
        ids, conf, masked = self._blk_ids, self._blk_conf, self._blk_masked  # ``_scan`` sets ``_filled``
        self._scan(block_open(ids, conf, masked, prefix, first_id, first_conf, self.mask_token_id, self._stops))

    @property
    def _tail(self) -> np.ndarray:
        """``(L - base,) int64`` the committed tokens of the partial block, on the host; read from the
        block's ids (then kept) after ``commit_in_place`` left them there."""
        tail = self._tail_held
        if tail is None:
            self._blk_ids[self._tail_len - 1] = self._pending
            tail = self._tail_held = self._blk_ids[: self._tail_len].copy()
        return tail

    @_tail.setter
    def _tail(self, tail: np.ndarray) -> None:
        self._tail_held = tail

    def _draft_start(self, start: int) -> int:
        """Block offset of the first drafted token in the block starting at ``start``."""
        return max(self._L - start, 0)

    def _scan(self, scanned: tuple[int, int] | None = None) -> None:
        """After a pass: ``_filled`` (the first masked offset) and the first drafted stop token of the
        block (``block_scan``, on the host copy the pass's one read filled); a stop token inside the
        leading unmasked run ends the round's draft there (``_stop_len``). ``scanned``: the pair
        ``block_scan`` returns when the caller has it (``unmask_step``'s)."""
        if scanned is None:
            scanned = block_scan(self._blk_ids, self._blk_masked, self._stops, self._draft_start(self._blk_start))
        filled, stop = scanned
        self._filled = filled
        if stop < filled:  # the leading run holds a stop token: the draft ends at it
            self._stop_len = self._blk_start + stop + 1 - self._L

    def _unmask_keep(self) -> torch.Tensor:
        """Before an unmasking pass: the small block holding offset ``_filled`` becomes current;
        returns the block offsets whose logits the pass keeps, ``(m,) int64``."""
        j = self._filled // self.small_block_size
        self._sb_index = j
        return self._keep[j]

    def _unmask_apply(self, logits: torch.Tensor) -> None:
        """After an unmasking pass: unmask the small block's positions its logits ``(b - lo, V)`` pick
        (one host read of the pass's tokens and confidences: the algorithm's "how far is the draft
        unmasked, and does it hold a stop token?")."""
        S, j = self.small_block_size, self._sb_index
        a, b = j * S, (j + 1) * S
        lo = max(a, 1)
        self._passes += 1
        if self.path_search is not None:
            search_apply(self, logits, lo, b, False)
            return
        tok, conf, probs = self._choose(logits)  # (b - lo,) int64 / float32, (b - lo, V) or None
        tokens, confs = self._host(tok, conf)
        # The unmasking rule of the class docstring (greedy: any order; sampling: left to right,
        # ``compiled.unmask_pick``), the writes and the block scan, in one compiled call.
        row = np.empty(b - lo, dtype=np.float32)  # the pass's confidences at the positions masked before it
        filled_stop = unmask_step(
            tokens, confs, lo, self._blk_ids, self._blk_conf, self._blk_masked, self._threshold32,
            self._sampling is not None, self._stops, self._draft_start(self._blk_start), self._pick, row,
        )  # fmt: skip
        self._sb_conf.append(row)
        if probs is not None:
            chosen = torch.from_numpy(self._pick[: b - lo].copy()).to(self._device)
            self._blk_probs[lo:b] = torch.where(chosen[:, None], probs, self._blk_probs[lo:b])
        self._scan(filled_stop)

    def _cross_keep(self) -> None:
        """Before a boundary pass: the full block's drafted part joins the round's segments (and a tail
        kept in the block's ids is copied out: the block's arrays are about to hold the next block)."""
        if self._tail_held is None:  # and the path search's context, while the block holds it
            self._tail_held = self._tail
            if self.path_search is not None:
                recent_tokens(self)
        d0 = self._draft_start(self._blk_start)
        probs = None if self._blk_probs is None else self._blk_probs[d0:]
        self._segments.append((self._blk_ids[d0:].copy(), self._blk_conf[d0:].copy(), probs))  # the arrays are reused

    def _cross_apply(self, logits: torch.Tensor) -> None:
        """After a boundary pass (its KV in the cache): the block's last logit ``(1, V)`` gives the
        next block's first token; the next block becomes current."""
        self._passes += 1
        first = self._first_of(logits)
        self._tentative.append((self._blk_start + self.block_size, first))
        self._open_block(self._blk_start + self.block_size, self._no_ids, first)

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        """Extend the round's draft by ``num_tokens`` tokens (tokens already decoded in this round,
        look-ahead included, are reused without new passes). Unmasking stops as soon as the
        requested tokens are unmasked (as the official ``generate_draft_tokens`` does), and the
        draft ends at the first drafted stop token (``stop_token_ids``): no pass is spent past it,
        the draft is then shorter than asked and ``ends_at_stop_token`` is True. The algorithm at
        ``R`` = 1 (``_draft_steps``).

        Returns:
            ``Draft`` with ``(k,) int64`` token ids, ``(k,) float32`` confidences, the passes
            spent since the previous verification, ``extras[SMALL_BLOCK_CONFIDENCES]`` and, when sampling,
            ``(k, V) float32`` q rows.
        Raises:
            ValueError: for ``num_tokens`` < 1, or a draft whose block would pass the drafter's
                ``max_position_embeddings`` (the message names the draft and committed lengths).
        """
        if self._fast and type(num_tokens) is int and num_tokens > 0:  # one request, eager, host greedy
            return draft_alone(self, num_tokens)
        if self.sequence is None or self.sequence.cache is None:  # the static cache's passes (or the error)
            return type(self)._draft_steps([self], [num_tokens])[0]
        end = self._begin(num_tokens)  # ``_draft_steps`` at R = 1 on an eager cache: ``FastDLLMRunner.alone``
        run, seq = self.runner.alone, self.sequence
        while (kind := self._next_pass(end)) is not None:
            row = self._blk_row if self._on_cpu else torch.from_numpy(self._blk_ids[None]).to(self._device)
            if crossing := kind == "cross":
                self._cross_keep()
            logits = run(seq, row, self._blk_start, None if crossing else self._unmask_keep(), crossing)
            (self._cross_apply if crossing else self._unmask_apply)(logits if self._logits3d else logits[0])
        return self._finish(num_tokens)

    def _begin(self, num_tokens: int) -> int:
        """Check ``num_tokens`` and the context, open the round's block; returns the absolute
        position the draft must reach (exclusive). Raises as ``draft``."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        if self.sequence is None:
            raise RuntimeError("draft() called before prefill()")
        B = self.block_size
        if self._blk_start is None:
            self._open_block(self._base, self._tail, self._first)
        end = self._L + self._k + num_tokens  # the draft covers positions [L, end)
        if self._stop_len is None:
            self._check_fits(
                ((end - 1) // B + 1) * B, "a draft of {} tokens from committed length {}", self._k + num_tokens, self._L
            )
        return end

    def _next_pass(self, end: int) -> str | None:
        """The pass the draft reaching ``end`` takes next: ``"cross"`` (the block is full: write its
        KV, open the next), ``"unmask"`` (an unmasking pass over the current small block), or None
        (the draft is there, or ended at a stop token)."""
        if self._stop_len is not None or self._path_len is not None or self._blk_start + self._filled >= end:
            return None
        return "cross" if self._filled == self.block_size else "unmask"

    def _finish(self, num_tokens: int) -> Draft:
        k = self._k + num_tokens
        self._k = min((k, *(cap for cap in (self._stop_len, self._path_len) if cap is not None)))
        return current_draft(self)

    @classmethod
    @no_grad
    def draft_many(cls, drafters: list[FastDLLMDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` for many requests with their passes batched (``_draft_steps``): at each step
        every request whose draft still takes a pass runs it, and the runner runs them as ONE pass
        of the model over all of them (``FastDLLMRunner.steps``: each row its current block at its
        own absolute positions on top of its own cached blocks). Returns what the calls one by one
        return (up to the floating-point effects of batched matrix products; exact in float64).
        Sampling (whose draws follow the requests one after another) and the path search draft
        one by one.

        Raises:
            ValueError: a count < 1 or a draft past the context (before any pass).
        """
        if len(drafters) == 1:  # ``draft`` (``draft_alone`` straight away: one no_grad check)
            d, n = drafters[0], num_tokens[0]
            return [draft_alone(d, n) if d._fast and type(n) is int and n > 0 else d.draft(n)]
        if len(drafters) < 2 or any(d._sampling is not None or d.path_search is not None for d in drafters):
            return super().draft_many(drafters, num_tokens)
        return cls._draft_steps(drafters, num_tokens)

    @staticmethod
    def _draft_steps(drafters: list[FastDLLMDrafter], num_tokens: list[int]) -> list[Draft]:
        """The drafting algorithm, stated once for ``R`` = ``len(drafters)`` requests: until every
        draft reaches its end (or a stop token, or the path search's end), each step's requests that
        still take a pass -- an unmasking pass over their current small block (``_unmask_keep``,
        ``_unmask_apply``) or a boundary pass writing their full block's KV (``_cross_keep``,
        ``_cross_apply``) -- run it in one runner step (``FastDLLMRunner.steps``).

        Raises:
            ValueError: a count < 1 or a draft past the context (before any pass).
        """
        ends = [d._begin(n) for d, n in zip(drafters, num_tokens)]
        steps = drafters[0].runner.steps(len(drafters))
        while True:
            kinds = [d._next_pass(end) for d, end in zip(drafters, ends)]
            step = [(d, kind) for d, kind in zip(drafters, kinds) if kind is not None]
            if not step:
                return [d._finish(n) for d, n in zip(drafters, num_tokens)]
            logits = steps.run([d._pass_of(kind) for d, kind in step])
            for (d, kind), row in zip(step, logits):
                if kind == "cross":
                    d._cross_apply(row)
                else:
                    d._unmask_apply(row)

    def _pass_of(self, kind: str) -> FastDLLMPass:
        """This request's part of the next step: an unmasking pass over its current block (logits
        of the current small block's offsets, nothing cached) or, ``kind`` ``"cross"``, a boundary
        pass (the block's last logit, its keys and values kept)."""
        ids = self._blk_row[0] if self._on_cpu else torch.from_numpy(self._blk_ids).to(self._device)  # (B,)
        if kind == "cross":
            self._cross_keep()
            return FastDLLMPass(self.sequence, ids, self._blk_start, None, writes=True)
        return FastDLLMPass(self.sequence, ids, self._blk_start, self._unmask_keep(), writes=False)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """A host array the drafter no longer writes as a tensor on its device (on the CPU, a view)."""
        return torch.from_numpy(array) if self._on_cpu else torch.from_numpy(array).to(self._device)

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Grow the committed sequence by ``verification.committed_tokens(draft)`` and roll the cache
        back to the KV of the complete committed blocks.

        A block whose KV was written tentatively this round is kept iff all of it is committed as
        written (the accepted prefix covers it; the correction token differs from the draft token
        by definition of ``accepted_length``). Complete committed blocks not validly cached are
        written in one block-causal pass, which also gives the next block's first token.

        Raises:
            ValueError: if ``draft`` does not start with this round's drafted tokens (its length
                minus ``reused_tokens`` differs from the tokens drafted this round).
        """
        if self.sequence is None:
            raise RuntimeError("commit() called before prefill()")
        own = draft.length - draft.reused_tokens
        if own != self._k:
            raise ValueError(
                f"draft has {own} drafter tokens (length {draft.length} - reused {draft.reused_tokens}) "
                f"but this round drafted {self._k}"
            )
        if not (self._fast and commit_in_place(self, draft, verification)):  # no torch op: no no_grad check
            self._commit(draft, verification, own)

    @no_grad
    def _commit(self, draft: Draft, verification: Verification, own: int) -> None:
        """``commit``'s general path (its checks done): the tokens joined, the cache rolled back, the
        complete committed blocks not validly cached written."""
        B, tail = self.block_size, self._tail
        a = int(verification.accepted_length)
        if verification.path is None and draft.reused_tokens == 0:  # a chain of this round's tokens: known here
            t = tail.shape[0]
            seq = np.empty(t + a + 1, dtype=np.int64)
            seq[:t], seq[t : t + a], seq[t + a] = tail, self._drafted[:a], verification.next_token
        else:
            seq = np.concatenate((tail, verification.committed_tokens(draft).cpu().numpy()))
        # seq: the committed tokens of positions [base, L_new), the round's a + 1 last
        if self.path_search is not None:
            self._remember(seq[tail.shape[0] :])
        L, base = self._L, self._base
        L_new = L + a + 1
        matched_end = L + min(a, own)  # drafted positions [L, matched_end) are committed as drafted

        valid_end, first = base, self._first
        if self._tentative:  # else the cache holds exactly ``base`` positions: nothing to roll back
            for block_end, block_first in self._tentative:
                if block_end > matched_end:
                    break
                valid_end, first = block_end, block_first
            self.runner.rollback(self.sequence, valid_end)

        new_base = (L_new // B) * B
        passes = 0
        if new_base > valid_end:
            first = self._write_blocks(torch.from_numpy(seq[valid_end - base : new_base - base]), valid_end)
            passes = 1
        self._first = first if L_new == new_base else None
        self._tail = seq[new_base - base :]
        self._L, self._base = L_new, new_base
        self._carry = passes + (self._passes if self._k == 0 else 0)  # an undrafted round carries on
        self._new_round()


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=fastdllm``: known keys, ``block_size`` (null = the model's), ``small_block_size``,
    ``threshold``, the attention (sdpa or eager), the compiled runtime's buckets against the block
    size (``check_buckets``), the model's directory and weights (not loaded),
    and with ``path_search=cps`` its settings and n-gram file (against the target's tokenizer)."""
    check_keys("drafter", config, CONFIG_KEYS)
    model_name = config.get("model", "dllm-drafter")
    check_model_source("drafter.model", model_name)
    local = Path(resolve_model_path(model_name)) / "config.json"
    trained = (
        model_block_size(SimpleNamespace(**json.loads(local.read_text(encoding="utf-8")))) if local.is_file() else None
    )  # a hub id: checked when the model is built
    block_size = config.get("block_size")
    block_size = (trained or 32) if block_size is None else block_size
    check_settings(
        block_size,
        config.get("small_block_size", 8),
        config.get("threshold", 0.05),
        config.get("confidence_dtype", "float32"),
    )
    if trained is not None and block_size != trained:
        raise ValueError(
            f"drafter.block_size={block_size!r} but the model {model_name!r} was trained with block "
            f"size {trained} (config {'/'.join(BLOCK_SIZE_CONFIG_KEYS)}); use {trained} or null"
        )
    check_attention("drafter.attn_implementation", config.get("attn_implementation", "sdpa"), _SUPPORTED_ATTENTION)
    if (run_config.get("runtime") or {}).get("compile"):
        check_buckets(block_size, run_config["runtime"].get("buckets") or (block_size,))
    if config.get("path_search", "none") != "none":
        check_path_search(config, target_vocabulary(run_config))


def build(config: dict[str, Any], runtime: Runtime, verifier) -> FastDLLMDrafter:
    """Factory for ``drafter=fastdllm``.

    Config keys: ``model`` (bundled ``dllm-drafter``, a local dir such as a Fast_dLLM_v2_1.5B
    download, or a hub id), ``block_size`` (default: the model's ``bd_block_size``/``bd_size``,
    else 32), ``small_block_size`` (8), ``threshold`` (0.05), ``attn_implementation`` (sdpa),
    ``confidence_dtype`` (``float32`` | ``model``, see ``models.fastdllm.greedy``). Drafting stops at the
    verifier's EOS tokens (``verifier.eos_token_ids``).

    Raises:
        ValueError: on a vocabulary mismatch with ``verifier``, a ``block_size`` different from
            the one the model was trained with, or any constructor error.
    """
    confidence_dtype = config.get("confidence_dtype", "float32")
    if confidence_dtype not in CONFIDENCE_DTYPES:  # before the model loads
        raise ValueError(
            f"drafter.confidence_dtype must be one of {', '.join(CONFIDENCE_DTYPES)}, got {confidence_dtype!r}"
        )
    model_name = config.get("model", "dllm-drafter")
    model = load_causal_lm(model_name, runtime, config.get("attn_implementation", "sdpa"))
    tokenizer = load_tokenizer(model_name)
    check_same_vocabulary(verifier.tokenizer, tokenizer, NAME)
    trained = model_block_size(model.config)
    block_size = config.get("block_size")
    block_size = (trained or 32) if block_size is None else block_size
    if trained is not None and block_size != trained:
        raise ValueError(
            f"drafter.block_size={block_size!r} but the model {model_name!r} was trained with block size "
            f"{trained} (config {'/'.join(BLOCK_SIZE_CONFIG_KEYS)})"
        )
    stop_ids = getattr(verifier, "eos_token_ids", ())
    return FastDLLMDrafter(
        model,
        runtime,
        tokenizer,
        block_size=block_size,
        small_block_size=config.get("small_block_size", 8),
        threshold=config.get("threshold", 0.05),
        stop_token_ids=stop_ids,
        confidence_dtype=confidence_dtype,
        path_search=path_search_of(config, tokenizer.get_vocab(), stop_ids, runtime.torch_device),
    )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=fastdllm`` (``build``, checked by ``validate``)."""
    return [PluginEntry("drafter", NAME, build, validate, "Fast-dLLM v2 block-diffusion drafting")]
