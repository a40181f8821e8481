"""``falcon`` drafter: Falcon's semi-autoregressive drafting, k = 2 tokens per drafter pass (Gao et
al., arXiv 2412.12639, §3; the network is ``specpolicy.models.falcon``; Bestpay-inc/Falcon
``models/cnets.py``, ``topK_genrate``).

Drafter position i pairs the target's top-layer feature f_i with the token x_{i+1}; its output is a
predicted f_{i+k}, read by the target's LM head as x_{i+k+1}. Under the relaxed causal mask the
last committed block -- the pairs of the k positions before the pending token x_n -- drafts
x_{n+1} .. x_{n+k} in ONE pass; each further pass feeds the previous block's k predicted features
with its k drafted tokens (and continues its LSTM state) and drafts the next k.

Cache: the decoder's KV cache holds the committed pairs but the last k - 1 and the LSTM state
after them; each round's first pass runs those k - 1 held-back pairs again with the newly
committed ones (the target's features from the verification), so the last block sees itself
whole (the released code drops and recomputes them likewise when fewer than k were accepted).
Drafted blocks are appended during the round and cropped at ``commit``. A prompt of fewer than
k + 1 tokens drafts nothing until k pairs exist.

Chains (``draft``): passes of k tokens; a request for an odd number of tokens runs whole passes
and reports the rest of the last pass as ``Draft.lookahead`` (the next call takes it first, no
pass). Sampling draws each token from the head's (warped) distribution at its position and
reports those rows as q. ``alternatives`` gives each chain position's top tokens
(``policy=failfast-tree``). Trees (``tree_block_root`` / ``tree_block_expand``): Falcon's static
decoding tree (``policy=falcon-tree``): blocks of k nodes, each block's pass conditioned on its
parent block's predicted features, tokens and LSTM state, under tree attention (on the CPU
``tree_root_host`` / ``tree_pass_host``: each pass laid out by the policy's compiled call in kept buffers).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from specpolicy.core import compiled_falcon, tree
from specpolicy.core.checks import check_keys
from specpolicy.core.drafter import Drafter
from specpolicy.core.errors import ConfigError
from specpolicy.core.features import check_prompt_features, probe_verifier, target_parts
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, choose
from specpolicy.core.types import LAST_HIDDEN, Draft, Verification
from specpolicy.models.checkpoint import check_checkpoint
from specpolicy.models.falcon import FalconDraftModel, FalconSpec, check_fits_target, load_falcon
from specpolicy.models.kv import KVCache
from specpolicy.models.loading import resolve_model_path
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "falcon"
CONFIG_KEYS = ("model",)


class FalconDrafter(Drafter):
    """Falcon's semi-autoregressive drafting (chains and static trees).

    Args:
        model: the Falcon head, on the runtime device in the runtime dtype, eval mode.
        embed_tokens: the target's input embedding module. lm_head: the target's LM head module.
        feature_layer: the target ``hidden_states`` index it reads (the last: the LM head's input).
        runtime: the shared runtime.
        stop_token_ids: token ids that end generation; a draft ends at the first one it drafts.
    """

    name = NAME

    def __init__(
        self,
        model: FalconDraftModel,
        embed_tokens: torch.nn.Module,
        lm_head: torch.nn.Module,
        feature_layer: int,
        runtime: Runtime,
        stop_token_ids: frozenset[int] | tuple[int, ...] = (),
    ):
        self.model, self.embed_tokens, self.lm_head, self.runtime = model, embed_tokens, lm_head, runtime
        self.k = model.k
        self.target_feature_layers = (int(feature_layer),)
        self._stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=runtime.torch_device)
        self.cache: KVCache | None = None
        self._sampling: SamplingConfig | None = None
        device = runtime.torch_device  # a round's draft before any pass: no tokens, no confidences (made once)
        self._no_draft = (torch.empty(0, dtype=torch.long, device=device), torch.empty(0, device=device))
        #: the passes' layouts are views of host buffers (numpy) on these devices
        self._on_host = device.type in _HOST_DEVICES
        self._cast_features = False  # the target's features are not in the runtime dtype (read at prefill)
        #: CPU: the chain layouts' host buffers (``_host_layout``): positions 0 .. width - 1, an all-True
        #: mask of k rows, a root mask's room; grown by ``_layout_room``
        self._arange = np.zeros(0, dtype=np.int64)
        self._ones = np.zeros(0, dtype=bool)
        self._root_mask = np.zeros(0, dtype=bool)
        #: a static tree's passes laid out on the host (``tree_root_host`` / ``tree_pass_host``): the CPU
        #: at a dtype numpy shares (float32, float64)
        self.grows_trees_on_host = self._on_host and runtime.torch_dtype in _NUMPY_DTYPES
        self._levels: compiled_falcon.FalconLevels | None = None  # their buffers, kept from round to round
        self._tree_round = False  # this round drafted through ``tree_root_host``
        #: the head's width H, its LSTM's layers and the vocabulary (a tree's buffers: ``FalconLevels``)
        weight, vocab = cast(torch.Tensor, embed_tokens.weight), cast(torch.Tensor, lm_head.weight)
        self._head_shape = (int(weight.shape[1]), int(model.lstm.num_layers), int(vocab.shape[0]))
        self._host_dtype = np.dtype(np.float64 if runtime.torch_dtype == torch.float64 else np.float32)
        if self.grows_trees_on_host:
            _warm_kernels(_NUMPY_DTYPES[runtime.torch_dtype])  # compiled (or loaded) now, not in a round

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass (``_pass``: chains and tree blocks alike), the LM head on its
        outputs, the choice of a chain pass's tokens from its logits with the search for a drafted
        stop token (``_choose``), the top-k of a tree block's distributions (``_top``) and of the
        chain's (``alternatives``), and the target's embeddings (``ForwardTimer``). The choice and
        the top-k are tensor work on the pass's output: part of the pass (``specpolicy.core.passes``),
        as the other drafters' are (``eagle3``'s ``_choose`` / ``top_tokens``, ``dflash``'s
        ``_choose_blocks``)."""
        return (
            (self, "_pass"),
            self.lm_head,
            (self, "_choose"),
            (self, "_top"),
            (self, "alternatives"),
            self.embed_tokens,
        )

    # -- committed state --------------------------------------------------------------------

    @no_grad
    def prefill(
        self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None, features: torch.Tensor | None = None
    ) -> None:
        """Start a prompt. ``features``: ``(P - 1, H)`` the target's top-layer features of the prompt
        but its last token (``Verifier.prompt_features``).

        Raises:
            ValueError: for an empty prompt or missing / mis-shaped features.
        """
        check_prompt_features(prompt_ids, features, "the falcon drafter")
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        self.cache = KVCache(len(self.model.layers))
        self._cached = 0  # committed pairs whose keys/values stay cached (all but the last k - 1)
        self._state = None  # the LSTM state after them
        # pairs not cached yet: their features and next tokens (a numpy copy on the host), and how many
        self._features, self._pair_tokens = features, prompt_ids[1:]
        self._uncached = int(prompt_ids.shape[0]) - 1
        self._cast_features = features is not None and features.dtype != self.runtime.torch_dtype
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        self._tree_round = False  # set by ``tree_root_host``: its rounds change ``_block``, ``_passes``, ``_chain_end``
        # drafted, shown or not: each pass's tokens (int64) and confidences (float32), joined on demand
        self._token_parts: list[torch.Tensor] = []
        self._conf_parts: list[torch.Tensor] = []
        self._joined: tuple[torch.Tensor, torch.Tensor] = self._no_draft
        self._joined_count = 0  # tokens in ``_joined``
        self._count = 0  # tokens drafted this round
        self._chain_end = 0  # the cache's length after the round's last chain pass (Python int: no shape read)
        self._logits: list[torch.Tensor] = []  # (k, V) per pass
        self._probs: list[torch.Tensor] = []  # (k, V) per pass when sampling
        self._shown = 0  # tokens returned by ``draft`` so far
        self._block: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None  # (out (k, H), state)
        self._passes = 0
        self._ended = False
        self._hidden: list[torch.Tensor] = []  # report_hidden: (k, H) what the LM head read, per pass

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Crop the drafted positions and the held-back pairs; queue the committed pairs
        (``verification.features`` ``(a + 1, H)`` with ``verification.committed_tokens``) for the
        next round's first pass. Raises ``RuntimeError`` when the verification brought no features."""
        if verification.features is None:
            raise RuntimeError(
                "the falcon drafter got no target features from the verification; the verifier must "
                "honour request_features"
            )
        self.cache.crop(self._cached)
        held: Any = self._features
        features = verification.features
        if self._cast_features:  # the held features are in the prompt features' dtype
            features = features.to(held.dtype)
        self._features = torch.cat([held, features])
        accepted = verification.accepted_length
        if verification.path is None:  # a chain: the accepted draft tokens, then the next token (one cat)
            nxt = verification.target_token_ids[accepted : accepted + 1]
            self._pair_tokens = torch.cat([self._pair_tokens, draft.token_ids[:accepted], nxt])
        elif self._on_host:  # a tree on the CPU: ``committed_tokens`` on numpy (the path's tokens, ``next_token``)
            path = verification.path
            tokens = np.empty(len(path) + 1, dtype=np.int64)
            draft.token_ids.numpy().take(path, out=tokens[:-1])
            tokens[-1] = verification.next_token
            self._pair_tokens = torch.from_numpy(np.concatenate((self._pair_tokens.numpy(), tokens)))
        else:
            self._pair_tokens = torch.cat([self._pair_tokens, verification.committed_tokens(draft)])
        self._uncached += accepted + 1
        if self._tree_round:  # ``tree_root_host`` / ``tree_pass_host`` changed these of ``_new_round``'s alone
            self._block, self._passes, self._chain_end, self._tree_round = None, 0, 0, False
        else:
            self._new_round()

    # -- passes ----------------------------------------------------------------------------

    def _pass(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        state,
        mask: torch.Tensor,
        split: int | None = None,
        top_k: int = 0,
        choose: bool = False,
        into: tuple | None = None,
    ):
        """One drafter pass over b rows of n positions (``tokens`` ``(b, n) int64``, embedded with the
        target's embeddings, and ``hidden`` ``(b, n, H)``; one row may come as ``(n,)`` / ``(n, H)``;
        ``positions`` ``(1, b * n)``, ``mask`` ``(b * n, cached + b * n)``): the LSTM per row from
        ``state``, the decoder over all rows' positions in one sequence (keys/values appended to the
        cache). ``split``: run the LSTM in two pieces and also return the state after the first
        ``split`` positions (the committed pairs that stay cached). The LM head's work on the outputs
        runs in the same pass: ``top_k`` > 0 the top tokens of its outputs (``_top``), ``choose`` a chain
        block's tokens (``_choose``). Returns ``(out, state after each row, state after split or None,
        the head's result or None)``, ``out`` ``(b, n, H)``, of a one-row pass its last k ``(k, H)``
        (the block that drafts)."""
        embeds = self.embed_tokens(tokens)
        if tokens.dim() == 1:
            embeds, hidden = embeds[None], hidden[None]
        mid = None
        if split is not None:
            x1, mid = self.model.encode(embeds[:, :split], hidden[:, :split], state)
            x2, state = self.model.encode(embeds[:, split:], hidden[:, split:], mid)
            x = torch.cat([x1, x2], dim=1)
        else:
            x, state = self.model.encode(embeds, hidden, state)
        b, n, h = x.shape
        past = None if self.cache.length == 0 else [self.cache.layer(i) for i in range(len(self.model.layers))]
        out, kv = self.model.decode(x.reshape(1, b * n, h), positions, past, mask)
        for i, (k, v) in enumerate(kv):
            self.cache.keys[i], self.cache.values[i] = k, v
        out = out.view(b, n, h) if tokens.dim() == 2 else out[0, -self.k :]
        head = None
        if into is not None:  # the top tokens written into kept tensors (``_top_into``)
            self._top_into(out, top_k, into)
        elif top_k or choose:
            head = self._top(out, top_k) if top_k else self._choose(out)
        return out, state, mid, head

    def _root(self, top_k: int = 0, choose: bool = False, into: tuple | None = None) -> tuple[torch.Tensor, Any] | None:
        """The round's first pass: the held-back and newly committed pairs; the last k of them form
        the block that drafts the first k tokens. Returns its outputs ``(k, H)`` (also kept with its
        LSTM state as ``_block``) and the head's result on them (``_pass``'s ``top_k`` / ``choose``),
        or None when fewer than k pairs exist."""
        u = self._uncached
        if self._cached + u < self.k or u == 0:
            return None
        dtype, device = self.runtime.torch_dtype, self.runtime.torch_device
        start = self._cached  # the cache after ``commit``'s crop (or a new prompt's: empty)
        if self._on_host:  # one compiled call into kept buffers: no per-op dispatch
            positions, mask = self._host_layout(start, u, root=True)
        else:
            positions = torch.arange(start, start + u, device=device)[None]
            mask = root_mask(u, start, self.k, device)
        keep = u - (self.k - 1)  # pairs that stay cached
        features: Any = self._features
        if self._cast_features:
            features = features.to(dtype)
        block, state, mid, head = self._pass(
            self._pair_tokens, features, positions, self._state, mask, keep if keep > 0 else None, top_k, choose, into
        )
        if keep > 0:
            self._state, self._cached, self._uncached = mid, self._cached + keep, u - keep
            self._features, self._pair_tokens = self._features[keep:], self._pair_tokens[keep:]
        self._chain_end = start + u
        self._passes = 1
        self._block = (block, state)
        return block, head

    # -- chains ----------------------------------------------------------------------------

    @classmethod
    def draft_many(cls, drafters: list[Drafter], num_tokens: list[int]) -> list[Draft]:
        """``draft`` one request after another (one request, the batch-1 loop: without the base class's list)."""
        if len(drafters) == 1:
            return [drafters[0].draft(num_tokens[0])]
        return super().draft_many(drafters, num_tokens)

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        want = self._shown + num_tokens
        while self._count < want and not self._ended:
            if not self._advance():
                break
        self._shown = min(want, self._count)
        return self._current()

    def _advance(self) -> bool:
        """One pass, k more drafted tokens; False when there is nothing to draft from."""
        k = self.k
        if self._block is None:
            count = min(self._uncached, k)  # the block's rows: the last k of the pass's
            root = self._root(choose=True)
            if root is None:
                return False
            out, chosen = root
        else:
            parent_out, state = self._block
            start = self._chain_end
            if self._on_host:
                positions, mask = self._host_layout(start, k, root=False)
            else:
                positions, mask = chain_layout(start, k, parent_out.device)
            out, state, _, chosen = self._pass(self._token_parts[-1], parent_out, positions, state, mask, choose=True)
            self._block = (out, state)
            self._chain_end = start + k
            self._passes += 1
            count = k
        logits, tokens, confs, q, end = chosen
        self._logits.append(logits)
        if q is not None:
            self._probs.append(q)
        if end is not None:  # the draft ends at a drafted stop token
            tokens, confs = tokens[:end], confs[:end]
            self._ended = True
            count = end
        if self.report_hidden:
            self._hidden.append(out if count == k else out[:count])
        self._token_parts.append(tokens)
        self._conf_parts.append(confs)  # ``choose``'s: float32
        self._count += count
        return True

    def _host_layout(self, start: int, u: int, root: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass's positions ``(1, u) int64`` (``start`` ..) and mask ``(u, start + u) bool`` on the CPU,
        views of kept host buffers: the round's first pass's (``root``: ``root_mask``'s, written by one
        compiled call) or a chain pass's (all True: ``chain_layout``'s). The same values as
        ``compiled_falcon.falcon_root_layout``."""
        width = start + u
        if width > self._arange.shape[0] or (root and u * width > self._root_mask.shape[0]):
            self._layout_room(width, u * width if root else 0)
        positions = self._arange[None, start:width]
        if root:
            mask = self._root_mask[: u * width].reshape(u, width)
            compiled_falcon.falcon_root_mask_into(mask, start, self.k)
        else:
            mask = self._ones[: u * width].reshape(u, width)
        return torch.from_numpy(positions), torch.from_numpy(mask)

    def _layout_room(self, width: int, root_cells: int) -> None:
        """Grow ``_host_layout``'s buffers (doubling) to ``width`` positions and ``root_cells`` root-mask cells."""
        if width > self._arange.shape[0]:
            cap = max(width, 2 * self._arange.shape[0], 256)
            self._arange = np.arange(cap, dtype=np.int64)
            self._ones = np.ones(self.k * cap, dtype=bool)
        if root_cells > self._root_mask.shape[0]:
            self._root_mask = np.empty(max(root_cells, 2 * self._root_mask.shape[0]), dtype=bool)

    def _drafted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's drafted tokens ``(n,) int64`` and confidences ``(n,) float32`` (joined once per
        new pass)."""
        if self._joined_count != self._count:
            parts = len(self._token_parts)
            self._joined = (
                self._token_parts[0] if parts == 1 else torch.cat(self._token_parts),
                self._conf_parts[0] if parts == 1 else torch.cat(self._conf_parts),
            )
            self._joined_count = self._count
        return self._joined

    def _choose(
        self, out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
        """A chain pass's tokens from its outputs ``out`` ``(k, H)``: the LM head's logits ``(k, V)``,
        the tokens ``(k,) int64`` (greedy the argmax, sampling a draw) with their confidences ``(k,)``
        and q ``(k, V)`` (None when greedy), and the number of tokens up to the first drafted stop
        token (None: none drafted; one sync per pass). Tensor work on the pass's output: part of
        the pass (``timed_calls``), as the verifier's argmax is."""
        logits = self.lm_head(out)
        tokens, confs, q = choose(logits, self._sampling, self.runtime.generator)
        end = None
        if self._stop_ids.numel():
            hit = torch.isin(tokens, self._stop_ids)
            if bool(hit.any()):
                end = int(hit.int().argmax()) + 1
        return logits, tokens, confs, q, end

    def _current(self) -> Draft:
        n = self._shown
        probs = torch.cat(self._probs)[:n] if self._probs else None
        tokens, confs = self._drafted()
        whole = n == self._count  # no lookahead: the joined tensors as they are (no slicing op)
        draft = Draft(
            tokens if whole else tokens[:n],
            confs if whole else confs[:n],
            forward_passes=self._passes,
            probs=probs,
            lookahead=self._count - n,
            lookahead_confidences=self._no_draft[1] if whole else confs[n:],
            ends_at_stop_token=self._ended and n == self._count,
            extras={LAST_HIDDEN: torch.cat(self._hidden)} if self._hidden else {},
        )
        return draft.counted(n)

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely tokens at each position of the round's chain so far, from the passes
        that drafted it: ids ``(n, k) int64`` and probabilities ``(n, k) float32``, best first."""
        n = self._shown
        if not n:
            return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
        top = torch.softmax(torch.cat(self._logits)[:n].float(), dim=-1).topk(k, dim=-1)
        return top.indices, top.values

    # -- static trees (``policies/falcon_tree.py``) -------------------------------------------

    @no_grad
    def tree_block_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Start the round's tree: the round's first pass (block 0, the root).

        Returns:
            the ``top_k`` tokens at each of the next k positions: ids ``(k, top_k) int64`` and
            log-probabilities ``(k, top_k) float32``, best first; empty when fewer than k pairs exist.
        """
        root = self._root(top_k=top_k)
        if root is None:
            return torch.empty((0, top_k), dtype=torch.long), torch.empty((0, top_k))
        out, top = root
        _, state = self._block
        self._tree_out = out[None]  # (blocks, k, H)
        self._tree_h, self._tree_c = state  # (layers, blocks, H)
        self._tree = tree.GrowingTree(self.cache.length, out.device)
        return top

    def _top(self, out: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``top_k`` tokens of each row's distribution (``out`` ``(..., H)``): ids ``(..., top_k)
        int64`` and log-probabilities ``(..., top_k) float32``, best first. Tensor work on the pass's
        output: part of the pass (``timed_calls``)."""
        logp = torch.log_softmax(self.lm_head(out).float(), dim=-1)
        values, ids = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        return ids, values

    def _top_into(self, out: torch.Tensor, top_k: int, into: tuple[torch.Tensor, torch.Tensor]) -> None:
        """``_top`` written into ``into``: kept tensors of ids ``(..., top_k) int64`` and log-probabilities
        ``(..., top_k) float32`` (``FalconLevels.pass_of``), by the same operations (``topk``'s ``out=``)."""
        logp = torch.log_softmax(self.lm_head(out).float(), dim=-1)
        torch.topk(logp, min(top_k, logp.shape[-1]), dim=-1, out=(into[1], into[0]))

    @no_grad
    def tree_block_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | np.ndarray | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` blocks to the round's tree in ONE pass: block j holds the k tokens
        ``tokens[j]`` (the nodes at the k depths below its parent block) and is fed the parent
        block's k predicted features and its LSTM state; each of its positions sees the committed
        pairs, its ancestor blocks and its whole block.

        Args:
            tokens: ``(m, k) int64``. parents: ``(m,)`` block numbers (0 = the root block, else a
                number this method returned; a tensor, array or list).
            top_k: tokens reported per position.
        Returns:
            ``(block numbers (m,) int64, ids (m, k, top_k) int64, log-probabilities (m, k, top_k) float32)``.
        """
        if not isinstance(parents, torch.Tensor):
            parents = torch.as_tensor(parents, dtype=torch.long, device=tokens.device)
        m, k = tokens.shape
        committed = self._tree.committed
        nodes, depth_pos, block_mask = self._tree.add(parents)
        positions, mask = block_layout(depth_pos, block_mask, committed, k)
        state = (self._tree_h.index_select(1, parents), self._tree_c.index_select(1, parents))
        out, (h, c), _, (ids, logp) = self._pass(
            tokens, self._tree_out.index_select(0, parents), positions, state, mask, top_k=top_k
        )
        self._tree_out = torch.cat([self._tree_out, out])
        self._tree_h, self._tree_c = torch.cat([self._tree_h, h], dim=1), torch.cat([self._tree_c, c], dim=1)
        self._passes += 1
        return nodes, ids, logp

    @no_grad
    def tree_root_host(self, top_k: int, blocks: int) -> tuple | None:
        """``tree_block_root`` for a tree whose passes the caller lays out on the host in one compiled
        call each (``grows_trees_on_host``; ``policies/falcon_tree.py`` with
        ``compiled_falcon.falcon_tree_level``): the same pass, its results as numpy arrays sharing
        its tensors, and the round's ``FalconLevels`` (room for ``blocks`` blocks, the root's
        included), which ``tree_pass_host`` passes read.

        Returns:
            None when fewer than k pairs exist, else ``(outputs (1, k, H), LSTM state (layers, 1, H)
            twice, ids (1, k, top_k) int64, log-probabilities (1, k, top_k) float32, the buffers
            (``FalconLevels``), cached positions)``.
        """
        committed, k, (width, layers, top) = self._cached + self._uncached, self.k, self._head_shape
        levels, key = self._levels, (k, width, layers, self._host_dtype, min(top_k, top))
        if levels is None or not levels.fits(key, blocks, committed + blocks * k):
            columns = tree.host_buffer_width(committed + blocks * k, 0 if levels is None else levels.columns)
            most = blocks if levels is None else max(blocks, levels.blocks)
            levels = self._levels = compiled_falcon.FalconLevels(*key, most, columns)
        first = levels.pass_of(1)
        root = self._root(top_k=top_k, into=levels.root_into)
        if root is None:
            return None
        (out, _), (h, c) = root, cast(tuple, self._block)[1]
        self._tree_committed, self._tree_round = committed, True  # the cache's length after the pass
        return out.numpy()[None], h.numpy(), c.numpy(), first[3], first[4], levels, committed

    def tree_pass_host(
        self, tokens: torch.Tensor, base: int, m: int, top_k: int, outputs: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray, np.ndarray]:
        """One tree pass over blocks ``base + 1 .. base + m`` (tokens ``(m, k) int64``) as
        ``compiled_falcon.falcon_tree_level`` laid them out in the round's ``FalconLevels`` (after
        ``tree_root_host``, under its caller's no-grad): the parents' outputs, LSTM state and the
        positions as tensors sharing the buffers, the attention rows ``(m k, cached + (base + m) k)
        bool`` a view (tree attention, as ``tree_block_expand``).

        Returns:
            numpy arrays sharing the pass's tensors: outputs ``(m, k, H)``, LSTM state ``(layers, m,
            H)`` twice (None, None, None unless ``outputs``: the round's last pass), top ids ``(m, k,
            top_k) int64`` and log-probabilities ``(m, k, top_k) float32``.
        """
        levels = cast(compiled_falcon.FalconLevels, self._levels)
        _, (hidden, h, c, positions), into, ids, logp = levels.pass_of(m)
        k = self.k
        mask = torch.from_numpy(levels.mask[: m * k, : self._tree_committed + (base + m) * k])
        out, (h, c), _, _ = self._pass(tokens, hidden, positions, (h, c), mask, top_k=top_k, into=into)
        self._passes += 1
        if not outputs:
            return None, None, None, ids, logp
        return out.numpy(), h.numpy(), c.numpy(), ids, logp

    @property
    def tree_passes(self) -> int:
        """Drafter passes spent on the round's tree so far."""
        return self._passes


#: device types whose layouts are built in numpy (the tensors share its arrays); others use tensor ops
_HOST_DEVICES = frozenset({"cpu"})
#: runtime dtypes the compiled tree pass copies (a bfloat16 or float16 tree keeps its state in tensors)
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _warm_kernels(dtype: type) -> None:
    """Run the CPU's compiled calls (``compiled_falcon.falcon_root_layout``, ``falcon_root_mask_into``,
    ``falcon_tree_level``) once on tiny arrays of ``dtype``, so their first call in a round neither
    compiles nor loads."""
    compiled_falcon.falcon_root_layout(3, 1, 2)
    compiled_falcon.falcon_root_mask_into(np.ones((3, 4), dtype=bool), 1, 2)
    levels = compiled_falcon.FalconLevels(1, 1, 1, dtype, 1, 2, 4)
    # two nodes, one per pass (each the rank-0 token of its block): nodes, node_path, blocks, bounds
    plan = (np.array([[0, 1], [0, 0], [0, 0]]), np.array([[0, 1]]), np.zeros((2, 2), np.int64))
    bounds = np.array([[0, 1, 0, 1], [1, 2, 1, 1]], dtype=np.int64)
    scratch = np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, np.float32), np.zeros((2, 1), np.int64)
    first, level = levels.pass_of(1), cast(Any, compiled_falcon.falcon_tree_level)
    for b in (0, 1):  # both branches: a pass with a next one, the last
        level(
            b, first[3], first[4], *plan, bounds, scratch[0], scratch[1], scratch[2], scratch[3], scratch[1],
            scratch[2], *levels.rows, *first[0], 1, b, first[0][0], first[0][1], first[0][2],
        )  # fmt: skip


def root_mask(u: int, start: int, k: int, device: torch.device | str) -> torch.Tensor:
    """The round's first pass's attention ``(u, start + u) bool`` (True = attend) over ``u`` new
    pairs after ``start`` cached ones: every cached position, causal among the new ones, and the last
    ``k`` (the block that drafts) whole. On the CPU built in numpy (no per-op dispatch), else in
    tensor ops on ``device``; the same mask."""
    if torch.device(device).type in _HOST_DEVICES:
        grid = np.ones((u, start + u), dtype=bool)
        own = grid[:, start:]
        own[:] = np.tri(u, dtype=bool)  # causal
        own[max(u - k, 0) :, max(u - k, 0) :] = True  # the last block whole
        return torch.from_numpy(grid)
    i = torch.arange(u, device=device)
    block = i >= u - k
    mask = (i[None, :] <= i[:, None]) | (block[None, :] & block[:, None])  # causal; the last block whole
    return torch.cat([torch.ones((u, start), dtype=torch.bool, device=device), mask], dim=1)


def chain_layout(start: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain pass's positions ``(1, k) int64`` (``start`` .. ``start + k - 1``) and mask ``(k, start +
    k) bool`` (all True: the block sees the cache and itself whole). On the CPU in numpy (no per-op
    dispatch: ``compiled_falcon.falcon_root_layout``), else in tensor ops on ``device``; the same."""
    if device.type in _HOST_DEVICES:  # the first pass's layout over one block: all True, one compiled call
        positions_np, mask_np = compiled_falcon.falcon_root_layout(k, start, k)
        return torch.from_numpy(positions_np), torch.from_numpy(mask_np)
    positions = torch.arange(start, start + k, device=device)[None]
    return positions, torch.ones((k, start + k), dtype=torch.bool, device=device)


def block_layout(
    depth_pos: torch.Tensor, block_mask: torch.Tensor, committed: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree pass's layout from its ``m`` blocks' ``GrowingTree`` rows (one node per block):
    positions ``(1, m k) int64`` (block j's k tokens from ``committed + (depth_pos[j] - committed) *
    k``) and the mask ``(m k, committed + blocks k) bool`` (each block row repeated k times, each
    block column k times). On the CPU in numpy (no per-op dispatch), else in tensor ops; the same."""
    m = int(depth_pos.shape[0])
    if block_mask.device.type in _HOST_DEVICES:
        rows = block_mask.numpy()
        cols = np.concatenate([rows[:, :committed], np.repeat(rows[:, committed:], k, axis=1)], axis=1)
        first = committed + (depth_pos.numpy() - committed) * k
        positions = torch.from_numpy((first[:, None] + np.arange(k)).reshape(1, m * k))
        return positions, torch.from_numpy(np.repeat(cols, k, axis=0))
    tensor_cols = torch.cat([block_mask[:, :committed], block_mask[:, committed:].repeat_interleave(k, dim=1)], dim=1)
    mask = tensor_cols.repeat_interleave(k, dim=0)  # (m k, committed + blocks k)
    tensor_first = committed + (depth_pos - committed) * k  # (m,) each block's first position
    return (tensor_first[:, None] + torch.arange(k, device=depth_pos.device)).reshape(1, m * k), mask


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=falcon``: known keys, the checkpoint's directory, config and weights files (not
    loaded), and -- when the target is bundled or local -- the checkpoint against the target's
    config.json (hidden size, vocabulary)."""
    check_keys("drafter", config, CONFIG_KEYS)
    check_bundled(config.get("model", "falcon-drafter"))
    check_checkpoint(config.get("model", "falcon-drafter"), run_config, check_fits_target, FalconSpec.from_config)


def check_bundled(model: str) -> None:
    """``falcon-drafter`` is bundled (``specpolicy/family/bundle/falcon-drafter``); an install whose
    bundle lacks it (a partial copy) is told so in one line before anything loads.

    Raises:
        ConfigError: one line naming ``drafter.model`` and what to pass instead.
    """
    from specpolicy.models.loading import bundled_dir

    if model == "falcon-drafter" and not (bundled_dir() / model / "config.json").is_file():
        raise ConfigError(
            f"drafter.model='falcon-drafter': {bundled_dir() / model} is missing from this install; pass a "
            f"Falcon checkpoint directory (or train one with python -m specpolicy.family.train_drafter falcon)"
        )


def build(config: dict[str, Any], runtime: Runtime, verifier) -> FalconDrafter:
    """Factory for ``drafter=falcon``. Config key: ``model`` (a Falcon checkpoint directory in the
    released layout, or the bundled name ``falcon-drafter``). The embeddings and LM head
    are the target's (``verifier.model``); the feature is its last ``hidden_states`` entry.

    Raises:
        ConfigError: a checkpoint that does not fit the target.
        FeaturesUnsupported: a verifier without a Hugging Face model or without hidden states.
    """
    model_name = config.get("model", "falcon-drafter")
    check_bundled(model_name)
    key = f"drafter.model={model_name!r}"
    embed, lm_head, target_config = target_parts(verifier, NAME)
    from specpolicy.models.checkpoint import read_config

    directory = resolve_model_path(model_name)
    check_fits_target(read_config(directory, key), target_config.to_dict(), key)
    model = load_falcon(directory, key).to(device=runtime.torch_device, dtype=runtime.torch_dtype)
    top = int(target_config.num_hidden_layers)
    probe_verifier(verifier, (top,), top + 1, NAME)
    return FalconDrafter(model, embed, lm_head, top, runtime, getattr(verifier, "eos_token_ids", ()))


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=falcon`` (``build``, checked by ``validate``)."""
    return [PluginEntry("drafter", NAME, build, validate, "Falcon: semi-autoregressive drafting, 2 tokens per pass")]
