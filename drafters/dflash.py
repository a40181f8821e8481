"""``dflash`` drafter: DFlash block-diffusion drafting conditioned on the target's hidden states
(Chen, Liang, Liu, arXiv 2602.06036; the network is ``specpolicy.models.dflash``).

One forward pass drafts a whole block: ``[last committed token, MASK x (B - 1)]``, with the
target's features of every committed position injected as keys and values in each drafter layer,
proposes B - 1 tokens with their confidences (the softmax maximum of each position). Everything
the pass decoded is then *look-ahead*: a length policy takes as many tokens as it wants at no
further cost; a block drafter is trained on whole blocks at fixed positions, so the block drafted
is always the whole block, and a policy shortens only what is verified (SGLang #24596/#32053).

Past one block (a policy asking for more than B - 1 tokens: FailFast's extension up to N_max), the
drafter runs an *extension pass*: the block ``[last committed token, d_1 .. d_m, MASK x (B - 1)]``,
the tokens drafted so far given, proposes B - 1 more. The bundled drafter is trained for it
(``specpolicy.family.train_dflash``: blocks with 0-3 extensions' given tokens); an official
checkpoint runs it as it is. Each pass costs one drafter forward (``Draft.forward_passes``).

Cache: the drafter's KV cache holds only the context -- the keys and values of the committed
positions' features, written by the first pass after they arrive (alone: in that pass's own
projections, ``DFlashDraftModel.draft_pass``; batched: ``context_keys_values`` before the padded
pass; ``commit`` only stores the features ``Verification.features`` brought) and never
recomputed; the block's own keys and values are never cached, so nothing needs cropping on
rejection. With ``policy=static policy.k=B-1``
the drafts are exactly the official ``dflash_generate``'s given the same committed sequence
(``tests/models/test_dflash.py`` checks it on an official-layout checkpoint).

Draft vocabulary (opt-in, a checkpoint with ``draft_vocab_size`` and ``d2t``): a pass runs only
the LM-head rows of those target ids (a copy of them made at load, ``(Vd, H)``) and maps each
drafted id back to the target's; the bundled drafter's 1024 ids cover every token of the target's
training responses. Official checkpoints run the target's whole LM head.

Sampling: each drafted token is drawn from ``warp`` of its position's logits and reported in
``Draft.probs`` (over the target vocabulary, zero outside a draft vocabulary); its distribution
depends on the context and (in an extension pass) on the given earlier drafted tokens only, so
speculative sampling stays lossless.

Path search (``drafter.path_search=cps``; DiffuSpec, arXiv 2510.02358, §4.2): each pass's
distributions become a lattice and the drafted tokens are the best path of a beam search scored by
the drafter and an n-gram model (``specpolicy.core.path_search``; ``drafter.ngram``, the bundled
model of GSM8K's training answers by default); the confidences are the drafter's probabilities
of the path's tokens, so any length policy (FailFast's too) reads them as usual. A draft ends
where the lattice ends (a stop token among a position's likely candidates). Under sampling the
path's tokens are verified as point masses (lossless). Batched drafting runs such passes one
request after another.

Batched (``draft_many``, the batched loop): the requests that take a pass at the same step run it
together, ONE pass of the network over their blocks, the blocks and the cached contexts padded to
the longest and masked per row; each request records what its own pass would. On the compiled
runtime the requests hold a context sequence each of one static cache sized by the batch
(``batched``, ``specpolicy.runners.dflash.StaticDFlash``), and the same step is one pass
over it: each request's newly committed positions and its block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specpolicy.core.checks import check_keys, choice
from specpolicy.core.drafter import Drafter
from specpolicy.core.errors import ConfigError
from specpolicy.core.features import check_prompt_features, probe_verifier, target_parts
from specpolicy.core.path_search import PathSearch
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, choose, point_mass
from specpolicy.core.types import Draft, Verification
from specpolicy.models.checkpoint import check_checkpoint
from specpolicy.models.dflash import DFlashDraftModel, DFlashSpec, draft_vocabulary_error, load_dflash
from specpolicy.models.kv import KVCache
from specpolicy.models.loading import resolve_model_path
from specpolicy.models.ngram import PATH_SEARCH_DEFAULTS, check_path_search, path_search_of, target_vocabulary
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.runners.dflash import BATCH_POSITIONS as BATCH_POSITIONS, BlockPass, DFlashRunner
from specpolicy.runners.sequences import SharedLength, SharedSequencesDrafter

NAME = "dflash"
CONFIG_KEYS = ("model", "extension", *PATH_SEARCH_DEFAULTS)
#: ``drafter.extension``: how a draft goes past one block -- ``given`` (an extension pass with the
#: tokens drafted so far given before B - 1 new masks) or ``none`` (no extension: B - 1 tokens at most).
EXTENSIONS = ("given", "none")
#: pieces of committed tokens ``_remember`` keeps before it folds them into the history (one cat)
HISTORY_FOLD = 16
#: committed tokens kept for ``ngram_context`` (an order-3 n-gram reads 2; DART keeps 8)
NGRAM_HISTORY = 8


class DFlashDrafter(SharedSequencesDrafter, Drafter):
    """DFlash drafting: B - 1 tokens per forward pass, from the target's features.

    Args:
        model: the DFlash network, on the runtime device in the runtime dtype, eval mode.
        embed_tokens: the target's input embedding module (``(V, H)``).
        lm_head: the target's LM head module (``H -> V``).
        runtime: the shared runtime (device, dtype, random stream).
        stop_token_ids: token ids that end generation; a draft ends at the first one it drafts.
        extension: ``"given"`` (default: past B - 1 tokens, extension passes with the drafted tokens
            given) or ``"none"`` (one block per round: a policy asking for more gets no more).
        path_search: DiffuSpec's causal-consistency path search over each pass's lattice (None: the
            drafter's own tokens, the argmax or a sample).
        max_context: the verifier's context in tokens (0: the network's ``max_position_embeddings``),
            which sizes the compiled runtime's static cache (plus one block).
    Raises:
        ValueError: for an ``extension`` not in ``EXTENSIONS``.

    How a pass runs is the runner's (``specpolicy.runners.dflash.DFlashRunner``), which builds the
    static caches: on the compiled runtime (``runtime.compile``) each pass runs through a static
    cache of the context compiled per shape bucket (``StaticDFlash``: the newly committed
    positions' keys and values and the block in one pass; compile seconds added to
    ``runtime.warmup_s``). In the batched loop (``batched``) the requests, greedy or sampling, draft
    on a static cache of one context sequence per request, compiled (``StaticDFlash`` of several
    sequences, ``DFlashRunner.batched``): one pass for every request that drafts at each step.
    """

    name = NAME

    def __init__(
        self,
        model: DFlashDraftModel,
        embed_tokens: torch.nn.Module,
        lm_head: torch.nn.Module,
        runtime: Runtime,
        stop_token_ids: frozenset[int] | tuple[int, ...] = (),
        extension: str = "given",
        path_search: PathSearch | None = None,
        max_context: int = 0,
    ):
        if extension not in EXTENSIONS:
            raise ValueError(f"drafter.extension must be one of {', '.join(EXTENSIONS)}, got {extension!r}")
        self.extension = extension
        self.model, self.embed_tokens, self.lm_head, self.runtime = model, embed_tokens, lm_head, runtime
        self.vocab_size = int(lm_head.weight.shape[0])
        #: (Vd,) int64 target id of every draft id, or None (the whole vocabulary)
        self._target_of_draft = model.draft_to_target()
        #: what a pass runs: the target's LM head, or its rows of the draft vocabulary
        self.head = lm_head if self._target_of_draft is None else HeadRows(lm_head, self._target_of_draft)
        self.block_size = model.spec.block_size
        self.target_feature_layers = model.spec.feature_layers
        device = runtime.torch_device
        self._stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=device)
        self._stop_set = frozenset(int(t) for t in stop_token_ids)  # the same ids, for host reads
        self._masks = torch.full((self.block_size - 1,), model.spec.mask_token_id, dtype=torch.long, device=device)
        self.path_search = path_search
        #: the path search's n-gram context on the host, (<= order - 1,) int64: the last committed tokens,
        #: the pending one last (a request's own array: a full one is rewritten in place through
        #: ``_ctx_cells``, a memoryview, at commit)
        self._ctx = np.zeros(0, dtype=np.int64)
        self._ctx_cells: Any = None
        self._ctx_keep = 0 if path_search is None else path_search.scorer.order - 1  # its length when full
        #: the path search's softmax on the host (float32 logits on the CPU): a kept ``(1, B - 1, V or Vd)``
        #: buffer and its ``(B - 1, V or Vd)`` host view (``_search``); None elsewhere
        self._probs_out: torch.Tensor | None = None
        on_cpu_f32 = device.type == "cpu" and runtime.torch_dtype == lm_head.weight.dtype == torch.float32
        if path_search is not None and on_cpu_f32:  # the head's logits are float32 on the CPU
            width = self.vocab_size if self._target_of_draft is None else int(self._target_of_draft.shape[0])
            self._probs_out = torch.empty(1, self.block_size - 1, width, dtype=torch.float32)
            self._probs_np = self._probs_out[0].numpy()
        self._paths: list[np.ndarray] = []  # the path search's paths of the round so far (host)
        #: (<= NGRAM_HISTORY,) int64: the last committed tokens before the pending one (``ngram_context``)
        self._history = torch.empty(0, dtype=torch.long, device=device)
        self._unfolded: list[torch.Tensor] = []  # committed pieces not yet folded into ``_history`` (``_fold``)
        # the round's empty draft, shared by every round (never written: drafted tokens replace it)
        self._no_tokens = torch.empty(0, dtype=torch.long, device=device)
        self._no_confs = torch.empty(0, dtype=torch.float32, device=device)
        #: the request's context cache (``DFlashRunner.open``: a ``KVCache``, or its sequence of a static cache)
        self.cache: KVCache | SharedLength | None = None
        self._context: torch.Tensor | None = None  # (u, F) committed positions' features not yet cached
        self._pending: torch.Tensor | None = None  # (1,) int64: the last committed token
        #: CPU: ``(1, B) int64`` the round's first block ``[pending, MASK x (B - 1)]`` on the host (the
        #: pending id written at commit, ``Verification.next_token``), and its tensor view; made per
        #: request (``prefill``: a batched run's copies hold their own). None on other devices, where
        #: ``_pending`` is a tensor of its own and the history is ``_history``'s (on the CPU ``_pending``
        #: is a view of the block's first cell and the history ``_host_history``: no tensor op a commit).
        self._host_block: np.ndarray | None = None
        self._block_ids: torch.Tensor | None = None
        self._block_cells: Any = None  # the host block's cells, a flat memoryview (``prefill``)
        #: CPU: (<= NGRAM_HISTORY) the last committed tokens before the pending one (Python ints), up
        #: to the commits ``_host_commits`` holds: ``(pending id, draft tokens (tensor) or the path's
        #: (array), accepted)`` each, folded in when read or every ``HISTORY_FOLD`` (``_fold_host``: a
        #: commit makes no array, cold numpy costs as much as a tensor op after the target's pass)
        self._host_history: list[int] = []
        self._host_commits: list[tuple[int, Any, int]] = []
        self._pending_id = 0  # CPU: the pending token, as the host block holds it
        self._on_host = runtime.torch_device.type == "cpu"
        self._cast_context = False  # the target's features are not in the runtime dtype (read at prefill)
        self._sampling: SamplingConfig | None = None
        #: how the pass runs: eager, or on a static cache (one sequence; a batched run's shared ones)
        self.runner = DFlashRunner(model, embed_tokens, runtime, max_context)

    #: Pass entry points watched on the compiled runtime too (called from eager Python only).
    eager_pass_methods = ("_choose_blocks",)

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass: the network's one-request pass (``draft_pass``) and its
        forward and context caching (``context_keys_values``; the batched passes), the target's
        embeddings, the LM head (or its draft-vocabulary rows), the choice of the block's tokens
        from its logits with the search for a drafted stop token (``_choose_blocks``), and the top-k of
        the drafted positions' distributions (``alternatives``, which tree policies ask for). Benchmarks time a
        drafter's forward passes as their outermost calls (``specpolicy.analysis.profiling.ForwardTimer``)."""
        return (
            (self.model, "draft_pass"),
            self.model,
            (self.model, "context_keys_values"),
            self.embed_tokens,
            self.head,
            (self, "_choose_blocks"),
            (self, "alternatives"),
        )

    @property
    def ngram_context(self) -> torch.Tensor:
        """The last committed tokens, the pending one last: ``(<= NGRAM_HISTORY + 1,) int64``, the
        n-gram context of a tree search's depth-0 candidates (``policy=dart-tree``)."""
        if self._host_block is not None:
            return torch.from_numpy(self.ngram_context_np())
        self._fold()
        return torch.cat([self._history, self._pending])

    def ngram_context_np(self) -> np.ndarray:
        """``ngram_context`` as a new host array ``(<= NGRAM_HISTORY + 1,) int64``: on the CPU from the
        host history and the pending id (no tensor op; ``policy=dart-tree``'s search reads it each
        round), elsewhere read from the device."""
        if self._host_block is None:
            return self.ngram_context.cpu().numpy()
        self._fold_host()
        return np.array(self._host_history + [self._pending_id], dtype=np.int64)

    @property
    def tokens_per_pass(self) -> int:
        """Draft tokens one pass gives: B - 1 (the block's first position is the pending token)."""
        return self.block_size - 1

    @no_grad
    def prefill(
        self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None, features: torch.Tensor | None = None
    ) -> None:
        """Start a prompt. ``features``: ``(P - 1, F)`` the target's features of the prompt but its
        last token (``Verifier.prompt_features``).

        Raises:
            ValueError: for an empty prompt, missing features, or features of the wrong shape.
        """
        check_prompt_features(prompt_ids, features, "the dflash drafter")
        self._open()  # the request's context cache on the runner (a batched run's: a sequence of the shared cache)
        self._context = features
        self._cast_context = features is not None and features.dtype != self.runtime.torch_dtype
        self._history, self._unfolded = self._history[:0], []
        if self._on_host:  # this request's first-block buffer (a copy of the drafter never shares it)
            host = prompt_ids.numpy()
            self._host_block = np.full((1, self.block_size), self.model.spec.mask_token_id, dtype=np.int64)
            self._host_block[0, 0] = host[-1]
            self._block_ids = torch.from_numpy(self._host_block)
            # the block's cells through Python's buffer protocol: ``commit`` writes the pending id
            # without numpy's code (cold after the target's pass, a numpy write cost more)
            self._block_cells = self._host_block.reshape(-1).data  # a memoryview
            self._pending = self._block_ids[0, :1]  # a view: ``commit`` writes the next pending token
            self._host_history = host[:-1][-NGRAM_HISTORY:].tolist()
            self._host_commits, self._pending_id = [], int(host[-1])
        else:
            self._pending = prompt_ids[-1:].to(self.runtime.torch_device)
            self._remember(prompt_ids[:-1].to(self.runtime.torch_device))
        if self.path_search is not None:
            host = prompt_ids.cpu().numpy()
            self._set_ctx(self._host_tail(host))
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        self._tokens = self._no_tokens  # (d,) drafted this round, look-ahead included
        self._confs = self._no_confs
        self._drafted = 0  # d, in tokens (no shape read of ``_tokens``)
        self._probs: list[torch.Tensor] = []  # sampling: (B - 1, V) q per pass
        self._returned = 0  # tokens handed out in the draft so far
        self._stop_at: int | None = None  # index of the first drafted stop token, if any
        self._passes = 0
        self._logits: list[torch.Tensor] = []  # (B - 1, V or Vd) per pass
        self._path_ended = False  # the path search ended the round's draft (its lattice or path stopped)
        self._paths = []
        self._hidden: list[torch.Tensor] = []  # report_hidden: (m, H) the head's input at each pass's tokens
        self._pass_hidden: torch.Tensor | None = None  # report_hidden: (B - 1, H) of the pass being recorded

    def _remember(self, *committed: torch.Tensor) -> None:
        """Keep the last committed tokens before the pending one that an n-gram reads (the path
        search's, ``ngram_context``): ``committed``, 1-D int64 pieces in order, join ``_history``
        when it is read or every ``HISTORY_FOLD`` pieces (``_fold``: one cat then, not one a round)."""
        self._unfolded.extend(committed)
        if len(self._unfolded) >= HISTORY_FOLD:
            self._fold()

    def _host_tail(self, *parts: np.ndarray) -> np.ndarray:
        """The last ``order - 1`` tokens of ``parts`` (1-D int64 host arrays, concatenated): the path
        search's n-gram context."""
        return np.concatenate(parts)[-(self.path_search.scorer.order - 1) :].astype(np.int64, copy=False)

    def _set_ctx(self, ctx: np.ndarray) -> None:
        """``_ctx`` = ``ctx`` (``(<= order - 1,)`` int64, this request's own), written in place from
        then on (``_ctx_cells``) once it is full."""
        self._ctx = ctx
        self._ctx_cells = ctx.data if ctx.shape[0] == self._ctx_keep else None

    def _commit_ctx(self, ids: np.ndarray, accepted: int, next_token: int) -> None:
        """The path search's context after a commit of ``ids[:accepted]`` (``(>= accepted,)`` int64 on the
        host) and ``next_token``: its last ``order - 1`` tokens, written in place when ``_ctx`` is full
        and the commit brings them all (no numpy code: a cold numpy call costs as much as a tensor op)."""
        cells, keep = self._ctx_cells, self._ctx_keep
        if cells is not None and accepted >= keep - 1:
            for j in range(keep - 1):
                cells[j] = ids.item(accepted - keep + 1 + j)
            cells[keep - 1] = next_token
        else:
            self._set_ctx(self._host_tail(self._ctx, ids[:accepted], np.array((next_token,), dtype=np.int64)))

    def _fold_host(self) -> None:
        """CPU: ``_host_history`` with the commits ``commit`` kept since (``_host_commits``): only the
        last commits that hold its ``NGRAM_HISTORY`` tokens are read (Python ints: a commit's tokens
        read with one ``tolist``)."""
        if self._host_commits:
            history: list[int] = []
            for pending, tokens, accepted in reversed(self._host_commits):
                ids = (tokens if isinstance(tokens, np.ndarray) else tokens.numpy())[:accepted].tolist()
                history = [pending, *ids, *history]
                if len(history) >= NGRAM_HISTORY:
                    break
            else:
                history = self._host_history + history
            self._host_history = history[-NGRAM_HISTORY:]
            self._host_commits = []

    def _fold(self) -> None:
        """``_history`` with the pieces ``_remember`` kept since: its last ``NGRAM_HISTORY`` tokens."""
        if self._unfolded:
            self._history = torch.cat([self._history, *self._unfolded])[-NGRAM_HISTORY:]
            self._unfolded = []

    def _block_pass(self) -> BlockPass:
        """This request's part of the next pass: its block ``[pending, drafted so far, MASK x (B - 1)]``,
        its newly committed positions' features, and where its context is cached (``DFlashRunner.open``:
        its ``KVCache`` eagerly; compiled, its sequence of the static cache, a batched run's shared one or its own)."""
        ids = torch.cat([self._pending, self._tokens, self._masks])
        return BlockPass(ids, self._context, self.cache)

    @staticmethod
    def _step(drafters: list[DFlashDrafter]) -> None:
        """DFlash's pass, stated once for ``R`` = ``len(drafters)`` requests (``draft``: one;
        ``draft_many``: every request that still takes a pass): each one's newly committed positions
        join its context, its block ``[pending, drafted so far, MASK x (B - 1)]`` attends to the
        context and to itself, and the block's last B - 1 outputs give B - 1 more tokens, recorded
        as the request's pass (``_record_passes``; with a path search, its best path). How the pass
        runs -- eager, compiled, one request or many -- is the runner's (``DFlashRunner``)."""
        lead, new = drafters[0], drafters[0].block_size - 1
        outs = lead.runner.run([d._block_pass() for d in drafters])
        for j, d in enumerate(drafters):
            d._context = None  # cached by the pass
            if d.report_hidden:  # what the head reads at the block's last B - 1 positions
                d._pass_hidden = outs[j][-new:]
        if len(drafters) == 1:  # (B - 1, H) through the head, the one-request pass's product
            logits = lead.head(outs[0][-new:])[None]
        else:
            logits = lead.head(torch.stack([out[-new:] for out in outs]))  # (b, B - 1, V or Vd)
        if lead.path_search is not None:  # alone (``draft_many``): the best path of the pass's lattice
            for j, d in enumerate(drafters):
                d._took(logits[j], *d._search(logits[j]))
            return
        DFlashDrafter._record_passes(drafters, logits)

    def _pass_alone(self) -> None:
        """``_step`` for one request on an eager cache with no path search, with fewer operations
        between the pass's calls: the round's first block is the host buffer's view (``(1, B)``, no
        cat), the block's outputs stay ``(1, q, H)`` through the head and the choice, and the pass is
        recorded with Python counts (``_took``'s ``count``). The same calls on the same values."""
        new = self.block_size - 1
        ids = self._block_ids
        if self._drafted or ids is None:  # an extension pass (or off the CPU): the block in one cat
            pending: Any = self._pending
            ids = torch.cat([pending, self._tokens, self._masks])[None]
        context = self._context
        if context is not None:
            context = (context.to(self.runtime.torch_dtype) if self._cast_context else context)[None]
        self._context = None  # cached by the pass
        hidden = self.runner.alone(ids, context, self.cache)[:, -new:]  # (1, B - 1, H)
        if self.report_hidden:  # what the head reads at the block's last B - 1 positions
            self._pass_hidden = hidden[0]
        logits = self.head(hidden)  # (1, B - 1, V or Vd)
        if self.path_search is not None:  # the best path of the pass's lattice
            self._took(logits, *self._search(logits, True))
            return
        chosen, stops = self._choose_blocks([self], logits)
        tokens, confs, q = chosen[0]
        self._took(logits, tokens, confs, q, stops[0], new)

    def _search(
        self, logits: torch.Tensor, alone: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int | None, int]:
        """CPS on a pass's logits ``(B - 1, V or Vd)`` (``alone``: ``_pass_alone``'s ``(1, B - 1, V or Vd)``): the
        path's tokens ``(m,) int64`` (target ids), their drafter probabilities ``(m,) float32``, point-mass
        q rows when sampling, the index of a stop token ending the path (None: none) and m. Marks the
        round's draft ended when the path is shorter than the block (its lattice ended) or ends at a
        stop token."""
        probs: Any
        if alone and self._probs_out is not None:  # float32 on the CPU
            torch._softmax(logits, -1, False, out=self._probs_out)  # torch.softmax's values, no allocation
            probs = self._probs_np
        else:
            probs = torch.softmax((logits[0] if alone else logits).float(), dim=-1)
        paths = self._paths
        context = np.concatenate([self._ctx, *paths]) if paths else self._ctx  # the search reads its tail
        path, path_confs, ended = self.path_search.search_np(probs, context, self._target_of_draft)
        paths.append(path)
        self._path_ended = ended
        m = path.shape[0]
        stop_at = None  # the path's last token a stop token (read on the host)
        if m and path.item(m - 1) in self._stop_set:
            stop_at = m - 1
        tokens, confs = torch.from_numpy(path), torch.from_numpy(path_confs)
        if not self._on_host:
            device = self.runtime.torch_device
            tokens, confs = tokens.to(device), confs.to(device)
        q = point_mass(tokens, self.vocab_size) if self._sampling is not None else None
        return tokens, confs, q, stop_at, m

    def _choose(
        self, logits: torch.Tensor, sampling: SamplingConfig | None, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``sampling.choose`` on a pass's logits ``(n, V or Vd)``, the tokens as target ids ``(n,)
        int64`` and q ``(n, V) float32`` over the target vocabulary (zero outside a draft vocabulary)."""
        tokens, confs, q = choose(logits, sampling, generator)
        if self._target_of_draft is None:
            return tokens, confs, q
        if q is not None:
            q = q.new_zeros((q.shape[0], self.vocab_size)).index_copy_(1, self._target_of_draft, q)
        return self._target_of_draft[tokens], confs, q

    def _took(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        confs: torch.Tensor,
        q: torch.Tensor | None,
        stop_at: int | None,
        count: int | None = None,
    ) -> None:
        """Record a pass: its logits ``(B - 1, V or Vd)`` (or ``(1, B - 1, V or Vd)``; tree policies read
        their top-k: ``alternatives``), tokens ``(B - 1,) int64``, confidences ``(B - 1,) float32``, q
        ``(B - 1, V) float32`` when sampling, and the index in the block of the first drafted stop token
        (None: none). ``count``: the tokens' number when the caller knows it (``_pass_alone``: B - 1,
        ``choose``'s int64 / float32), else read with their dtypes."""
        self._logits.append(logits)
        typed = count is not None
        if count is None:
            count = int(tokens.shape[0])
            typed = tokens.dtype == torch.long and confs.dtype == torch.float32
        if self._pass_hidden is not None:  # a path search's m tokens take the first m positions
            rows = self._pass_hidden
            self._hidden.append(rows if typed and count == self.block_size - 1 else rows[:count])
            self._pass_hidden = None
        if stop_at is not None:
            self._stop_at = self._drafted + stop_at
        if self._drafted or not typed:
            self._tokens = torch.cat([self._tokens, tokens])
            self._confs = torch.cat([self._confs, confs])
        else:  # the round's first pass: its tokens are the draft (no copy onto the empty one)
            self._tokens, self._confs = tokens, confs
        self._drafted += count
        if q is not None:
            self._probs.append(q)
        self._passes += 1

    def _wants(self, num_tokens: int) -> int:
        """The round's draft length after adding ``num_tokens``; ValueError for ``num_tokens < 1``."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        return self._returned + num_tokens

    def _needs_pass(self, want: int) -> bool:
        """Whether a draft of ``want`` tokens takes another pass (one block only with ``extension=none``)."""
        one_block = self._passes and self.extension == "none"
        return self._drafted < want and self._stop_at is None and not one_block and not self._path_ended

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        want = self._wants(num_tokens)
        # one request on an eager cache without a path search: its own pass (``_pass_alone``)
        alone = self.runner.static is None and self.runner.sequences is None
        while self._needs_pass(want):
            if alone:
                self._pass_alone()
            else:
                self._step([self])
        return self._handed_out(want)

    def _handed_out(self, want: int) -> Draft:
        """The round's draft of ``want`` tokens (fewer past a drafted stop token), the rest look-ahead
        (``Draft.with_lookahead``, with the count kept as a Python int: no shape read)."""
        probs = hidden = None
        if self._probs:
            probs = self._probs[0] if len(self._probs) == 1 else torch.cat(self._probs)
        if self._hidden and len(self._hidden) == self._passes:
            hidden = self._hidden[0] if len(self._hidden) == 1 else torch.cat(self._hidden)
        draft = Draft.with_lookahead(
            self._tokens, self._confs, probs, want, self._stop_at, self._passes, hidden, self._drafted, self._no_confs
        )
        self._returned = draft.length
        return draft

    @classmethod
    @no_grad
    def draft_many(cls, drafters: list[DFlashDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` for many requests with their passes batched: at each step, every request whose
        draft still takes a pass runs it in ONE pass of the network over all of them (each row its
        own block -- a first pass's ``B`` tokens or an extension pass's longer one --, the rows and
        the cached contexts padded to the longest, a mask keeping each row to its own context and
        its own block, bidirectional inside it). The newly committed positions' keys and values
        are written for all of them in one ``context_keys_values`` call too (a request with more
        than ``BATCH_POSITIONS`` of them, e.g. a new prompt, alone). Requests on the shared static
        cache (``batched``) run each step as one ``StaticDFlash`` pass instead, their
        newly committed positions in it (a request whose positions and block pass the largest
        bucket, e.g. a new prompt, writes its context alone first).

        Args:
            drafters: one per request, sharing one network, embeddings, head and stop tokens
                (the batched loop's copies of the configured drafter); otherwise, or for one
                request, each drafts alone (``draft``).
            num_tokens: tokens to add per request, each >= 1.
        Returns:
            every request's whole draft of the round so far, in order: what ``draft`` returns, the
            same tokens, confidences and ``forward_passes``. Sampling draws each pass's tokens
            request after request; a request that takes several passes in the call draws its later
            ones after the others' earlier ones (the same distributions, other draws than alone).
        Raises:
            ValueError: for a ``num_tokens`` entry < 1 (before any pass).
        """
        if len(drafters) == 1:  # one request (the batch-1 loop): ``draft`` without the base class's list
            return [drafters[0].draft(num_tokens[0])]
        lead = drafters[0] if drafters else None
        if len(drafters) > 1 and lead.path_search is None and all(d.runner.sequences is not None for d in drafters):
            return cls._draft_together(drafters, num_tokens)  # the shared static cache
        if (
            len(drafters) < 2
            or lead.path_search is not None
            or lead.runner.static is not None
            or any(d.runner.sequences is not None for d in drafters)  # some on the shared cache: each its own pass
            or any(
                d.model is not lead.model
                or d.embed_tokens is not lead.embed_tokens
                or d.head is not lead.head
                or d._stop_ids is not lead._stop_ids
                for d in drafters
            )
        ):
            return super().draft_many(drafters, num_tokens)
        return cls._draft_together(drafters, num_tokens)

    @staticmethod
    def _draft_together(drafters: list[DFlashDrafter], num_tokens: list[int]) -> list[Draft]:
        """``draft_many``'s steps: every request whose draft still takes a pass runs it in one ``_step``."""
        wants = [d._wants(n) for d, n in zip(drafters, num_tokens)]
        while True:
            step = [d for d, want in zip(drafters, wants) if d._needs_pass(want)]
            if not step:
                return [d._handed_out(want) for d, want in zip(drafters, wants)]
            DFlashDrafter._step(step)

    @staticmethod
    def _record_passes(drafters: list[DFlashDrafter], logits: torch.Tensor) -> None:
        """Each request's pass recorded from its logits ``(b, B - 1, V or Vd)`` as its own pass would
        (``_choose_blocks``)."""
        chosen, stops = drafters[0]._choose_blocks(drafters, logits)
        for j, d in enumerate(drafters):
            tokens, confs, q = chosen[j]
            d._took(logits[j], tokens, confs, q, stops[j])

    def _choose_blocks(
        self, drafters: list[DFlashDrafter], logits: torch.Tensor
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], list[int | None]]:
        """Every request's tokens from its block's logits ``(b, B - 1, V or Vd)`` (the requests sharing
        their settings, as the batched loop's do, in one ``_choose`` over every row: greedy one argmax,
        sampling one draw per token in request order; mixed settings request after request), and
        where each one's first drafted stop token is (one sync for all). Tensor work on the pass's
        output: part of the pass (``timed_calls``), as the verifier's argmax is.

        Returns:
            ``([(tokens (B - 1,) int64, confidences (B - 1,) float32, q or None)] per request, [index
            in the block of the first drafted stop token, or None] per request)``.
        """
        lead, b, new = self, logits.shape[0], logits.shape[1]
        sampling = lead._sampling
        if all(d._sampling == sampling for d in drafters):
            tokens, confs, q = lead._choose(logits.flatten(0, 1), sampling, lead.runtime.generator)
            rows = [None] * b if q is None else q.view(b, new, -1).unbind(0)
            chosen = list(zip(tokens.view(b, new), confs.view(b, new), rows))
        else:  # each request's draws in request order, from its own settings
            chosen = [d._choose(logits[j], d._sampling, d.runtime.generator) for j, d in enumerate(drafters)]
        stops: list[int | None] = [None] * b
        if lead._stop_ids.numel():  # one sync for every row: where its first drafted stop token is, if any
            hit = torch.isin(torch.stack([t for t, _, _ in chosen]), lead._stop_ids)  # (b, B - 1)
            stops = [None if s < 0 else s for s in torch.where(hit.any(dim=1), hit.int().argmax(dim=1), -1).tolist()]
        return chosen, stops

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely tokens at each position of the round's draft so far, from the passes
        that drafted it (no extra pass): ids ``(n, k) int64`` and probabilities ``(n, k) float32``,
        best first (column 0 is the drafted token when greedy). For tree policies (``failfast-tree``,
        ``block-tree``), computed when asked."""
        n = self._returned
        if not n:
            return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
        rows = [x.view(-1, x.shape[-1]) if x.dim() == 3 else x for x in self._logits]  # (1, B - 1, V) alone
        top = torch.softmax(torch.cat(rows)[:n].float(), dim=-1).topk(k, dim=-1)
        if self._target_of_draft is None:
            return top.indices, top.values
        return self._target_of_draft[top.indices], top.values

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Store the committed positions' features (the pending token's and the accepted tokens',
        ``(a + 1, F)``); they enter the cache with the next pass. Raises ``RuntimeError`` when the
        verification brought none (a verifier that ignored ``request_features``)."""
        features = verification.features
        if features is None:
            raise RuntimeError(
                "the dflash drafter got no target features from the verification; the verifier must "
                "honour request_features"
            )
        self._context = features if self._context is None else torch.cat([self._context, features])
        if self._host_block is not None:  # CPU: the committed tokens kept as they are, read when needed
            path, accepted = verification.path, verification.accepted_length
            tokens: Any = draft.token_ids
            paths = self._paths
            if path is None and len(paths) == 1 and accepted <= draft.length - draft.reused_tokens:
                # the accepted tokens are the search's path's (on the host): no read of the tensor
                tokens = paths[0]
                self._commit_ctx(tokens, accepted, verification.next_token)
            elif path is not None or self.path_search is not None:  # read now: a tree's path, the search's context
                ids = tokens.numpy()
                tokens = ids[:accepted] if path is None else ids.take(path)
                accepted = len(tokens)
                if self.path_search is not None:
                    self._commit_ctx(tokens, accepted, verification.next_token)
            self._host_commits.append((self._pending_id, tokens, accepted))
            if len(self._host_commits) >= HISTORY_FOLD:
                self._fold_host()
            self._pending_id = verification.next_token
            self._block_cells[0] = verification.next_token  # the next round's block (``_pending``: its view)
            self._new_round()
            return
        committed = verification.committed_tokens(draft)
        self._remember(self._pending, committed[:-1])
        if self.path_search is not None:  # its context on the host: one read of the committed tokens
            host = committed.cpu().numpy()
            self._set_ctx(self._host_tail(self._ctx, host))  # a new array: the verifier may reuse its buffer
        self._pending = committed[-1:]  # the correction / bonus token (chain or tree)
        self._new_round()


class HeadRows(torch.nn.Module):
    """The rows ``target_ids`` ``(Vd,) int64`` of ``lm_head`` (an ``H -> V`` linear): logits over a
    draft vocabulary, ``(..., H) -> (..., Vd)``. A copy made once at load (``Vd x H`` of the head's
    dtype; the target's head is frozen), stored transposed, ``(H, Vd)``: a block's 15 rows times it
    run faster on CPU than ``F.linear``'s layout (see ``DFlashLayer.fuse``)."""

    def __init__(self, lm_head: torch.nn.Module, target_ids: torch.Tensor) -> None:
        super().__init__()
        weight, bias = lm_head.weight.detach(), getattr(lm_head, "bias", None)
        self.register_buffer("weight_t", weight[target_ids].t().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach()[target_ids].clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return hidden @ self.weight_t
        flat = torch.addmm(self.bias, hidden.reshape(-1, hidden.shape[-1]), self.weight_t)  # as F.linear
        return flat.view(*hidden.shape[:-1], self.weight_t.shape[1])


def check_fits_target(draft_config: dict[str, Any], target_config: dict[str, Any], key: str) -> DFlashSpec:
    """Check a DFlash checkpoint's config.json against the target's (both as dicts).

    Raises:
        ConfigError: naming ``key`` and what does not fit: the hidden size (the drafter reads the
            target's embeddings), the vocabulary, the mask token, or a ``target_layer_ids`` entry
            beyond the target's layers.
    """
    spec = DFlashSpec.from_config(draft_config, key)
    layers = int(target_config.get("num_hidden_layers", 0))
    hidden, vocab = int(target_config.get("hidden_size", 0)), int(target_config.get("vocab_size", 0))
    if int(draft_config.get("hidden_size", -1)) != hidden:
        raise ConfigError(
            f"{key}: hidden_size {draft_config.get('hidden_size')} does not match the target's {hidden} "
            "(DFlash embeds its block with the target's embeddings)"
        )
    if "vocab_size" in draft_config and int(draft_config["vocab_size"]) != vocab:
        raise ConfigError(f"{key}: vocab_size {draft_config['vocab_size']} does not match the target's {vocab}")
    if not 0 <= spec.mask_token_id < vocab:
        raise ConfigError(
            f"{key}: dflash_config.mask_token_id {spec.mask_token_id} is outside the target's vocabulary "
            f"(0..{vocab - 1})"
        )
    if spec.draft_vocab_size is not None and spec.draft_vocab_size > vocab:
        raise ConfigError(
            f"{key}: dflash_config.draft_vocab_size {spec.draft_vocab_size} exceeds the target's vocabulary of {vocab}"
        )
    bad = [i for i in spec.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise ConfigError(
            f"{key}: dflash_config.target_layer_ids {list(spec.target_layer_ids)} name layers the target "
            f"does not have ({bad}; the target has {layers} layers, ids 0..{layers - 1})"
        )
    return spec


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=dflash``: known keys, the checkpoint's directory, config and weights files (not
    loaded), and -- when the target is bundled or local -- the checkpoint against the target's
    config.json (hidden size, vocabulary, mask token, layer ids)."""
    check_keys("drafter", config, CONFIG_KEYS)
    choice("drafter.extension", config.get("extension", "given"), EXTENSIONS)
    check_checkpoint(config.get("model", "dflash-drafter"), run_config, check_fits_target, DFlashSpec.from_config)
    if config.get("path_search", "none") != "none":
        check_path_search(config, target_vocabulary(run_config))


def build(config: dict[str, Any], runtime: Runtime, verifier) -> DFlashDrafter:
    """Factory for ``drafter=dflash``. Config keys: ``model`` (bundled ``dflash-drafter`` or a local
    DFlash checkpoint directory in the official layout), ``extension`` (``given`` | ``none``), and the
    path search's (``path_search``: ``none`` | ``cps``; ``ngram``, ``cps_mass``, ``cps_candidates``,
    ``cps_width``, ``cps_lambda``: ``specpolicy.models.ngram.PATH_SEARCH_DEFAULTS``). The
    embeddings and LM head are the target's (``verifier.model``).

    Raises:
        ConfigError: a checkpoint that does not fit the target, or a verifier without a Hugging
            Face model or without hidden states.
    """
    model_name = config.get("model", "dflash-drafter")
    key = f"drafter.model={model_name!r}"
    embed, head, target_config = target_parts(verifier, NAME)
    from specpolicy.models.checkpoint import read_config

    directory = resolve_model_path(model_name)
    check_fits_target(read_config(directory, key), target_config.to_dict(), key)
    model = load_dflash(directory, key).to(device=runtime.torch_device, dtype=runtime.torch_dtype)
    target_ids = model.draft_to_target()
    error = None if target_ids is None else draft_vocabulary_error(target_ids, int(target_config.vocab_size))
    if error:
        raise ConfigError(f"{key}: {error}")
    probe_verifier(verifier, model.spec.feature_layers, int(target_config.num_hidden_layers) + 1, NAME)
    stop_ids = getattr(verifier, "eos_token_ids", ())
    tokenizer = getattr(verifier, "tokenizer", None)
    vocab = tokenizer.get_vocab() if tokenizer is not None else None
    search = path_search_of(config, vocab, stop_ids, runtime.torch_device)
    extension = config.get("extension", "given")
    max_context = int(getattr(verifier, "max_context", 0) or 0)
    return DFlashDrafter(model, embed, head, runtime, stop_ids, extension, search, max_context)


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=dflash`` (``build``, checked by ``validate``)."""
    return [
        PluginEntry(
            "drafter",
            NAME,
            build,
            validate,
            "DFlash: block-diffusion drafting conditioned on the target's hidden states",
        )
    ]
