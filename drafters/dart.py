"""``dart`` drafter: DART's one-pass drafting of d = 8 tokens from the target's fused features
(Liang et al., arXiv 2601.19278, §3; fvliang/DART ``dart/model/dart_utils.py``; the network is
``specpolicy.models.dart``).

One pass over the newly committed pairs (EAGLE-3's pairing: the target's feature of position i
with the token at i + 1) followed by ``draft_length`` (7) mask positions gives a distribution for
each of the next 8 tokens; the chain drafted is each position's most likely token (greedy) or a
draw from it (sampling; position j's distribution depends on the committed sequence only, so
speculative sampling stays lossless). Everything the pass decoded past what a policy asked for is
look-ahead (``Draft.lookahead``): taking it costs nothing.

Past d tokens (a static k above 8, FailFast's extension) a LATER pass is conditioned on the drafted
tokens: the previous pass's d tokens enter as pairs whose features are that pass's own outputs
(the output at the position that predicted token j stands in for the target's feature there, as
EAGLE's feature recurrence does), again followed by the masks. DART's paper drafts one pass per
round and its training never sees such pairs, so the later passes are this testbed's extension
(stated; the tree policy ``dart-tree`` uses one pass, as the paper does).

Cache: the committed pairs' keys and values; the masks' are dropped after every pass (the code's
``dart_current_length_data.fill_(prev_input_len)``), an extension pass's drafted pairs at ``commit``.

Trees: ``alternatives`` (each drafted position's top-k) and ``ngram_context`` (the committed
tokens the n-gram model reads) are what ``policy=dart-tree`` (DART's tree search) and
``policy=block-tree`` need; ``block_size`` is d.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specpolicy.core.checks import check_keys
from specpolicy.core.drafter import Drafter
from specpolicy.core.features import check_prompt_features, probe_verifier, target_parts
from specpolicy.core.runtime import Runtime, no_grad
from specpolicy.core.sampling import SamplingConfig, choose
from specpolicy.core.types import Draft, Verification
from specpolicy.models.checkpoint import check_checkpoint
from specpolicy.models.dart import DartDraftModel, DartSpec, load_dart
from specpolicy.models.eagle3 import check_head_fits_target
from specpolicy.models.kv import KVCache
from specpolicy.models.loading import resolve_model_path
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "dart"
CONFIG_KEYS = ("model",)
#: Committed tokens kept for the n-gram context (a 3-gram model reads 2; longer orders up to this).
HISTORY = 8
#: committed pieces ``commit`` keeps on the CPU before it folds them into the history (``_fold``)
HISTORY_FOLD = 16


class DartDrafter(Drafter):
    """DART drafting: d tokens per pass.

    Args:
        model: the DART head, on the runtime device in the runtime dtype, eval mode.
        embed_tokens: the target's input embedding module.
        feature_layers: the target ``hidden_states`` indices it reads (three, low -> high).
        vocab_size: the target's vocabulary size (rows of ``Draft.probs`` when sampling).
        runtime: the shared runtime.
        stop_token_ids: token ids that end generation; a draft ends at the first one it drafts.
    """

    name = NAME

    def __init__(
        self,
        model: DartDraftModel,
        embed_tokens: torch.nn.Module,
        feature_layers: tuple[int, ...],
        vocab_size: int,
        runtime: Runtime,
        stop_token_ids: frozenset[int] | tuple[int, ...] = (),
    ):
        self.model, self.embed_tokens, self.runtime = model, embed_tokens, runtime
        self.target_feature_layers = tuple(feature_layers)
        self.vocab_size = vocab_size
        self.block_size = model.block_size
        device = runtime.torch_device
        self._target_of_draft = model.to_target_ids(torch.arange(model.spec.draft_vocab_size, device=model.d2t.device))
        self._stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=device)
        self.stop_token_ids = tuple(sorted(int(t) for t in stop_token_ids))
        self.cache: KVCache | None = None
        self._committed_pairs = 0
        self._features: torch.Tensor | None = None  # (u, 3H) committed pairs' features not yet cached
        self._pair_tokens: torch.Tensor | None = None  # (u,) the token after each of them
        self._waiting: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._on_host = runtime.torch_device.type == "cpu"
        #: the last committed tokens, the pending one last (``ngram_context``): off the CPU a tensor
        #: (one cat a commit); on the CPU Python ints up to the committed pieces ``_unfolded`` holds,
        #: folded in when read or every ``HISTORY_FOLD`` commits (``_fold``: no tensor op a commit)
        self._history = torch.empty(0, dtype=torch.long, device=device)
        self._host_history: list[int] = []
        self._unfolded: list[Any] = []
        self._cached = 0  # positions the cache holds (``_pass`` sets it, ``commit`` crops to the pairs)
        # the round's empty draft, shared by every round (never written: drafted tokens replace it)
        self._no_tokens = torch.empty(0, dtype=torch.long, device=device)
        self._no_confs = torch.empty(0, dtype=torch.float32, device=device)
        self._sampling: SamplingConfig | None = None

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass: ``_pass`` (the head's forward, its logits and the choice),
        and ``alternatives`` (the top-k tree policies read)."""
        return ((self, "_pass"), (self, "alternatives"))

    @property
    def ngram_context(self) -> torch.Tensor:
        """The last committed tokens, the pending one last: ``(<= HISTORY,) int64`` (the n-gram
        context of a tree search's depth-0 candidates)."""
        if self._on_host:
            return torch.from_numpy(self.ngram_context_np())
        return self._history

    def ngram_context_np(self) -> np.ndarray:
        """``ngram_context`` as a new host array ``(<= HISTORY,) int64``: on the CPU from the host
        history (no tensor op; ``policy=dart-tree``'s search reads it each round), elsewhere read
        from the device."""
        if not self._on_host:
            return self._history.cpu().numpy()
        self._fold()
        return np.array(self._host_history, dtype=np.int64)

    def _fold(self) -> None:
        """CPU: ``_host_history`` with the committed pieces ``commit`` kept since (``_unfolded``:
        tensors or arrays of token ids): its last ``HISTORY`` tokens, as Python ints."""
        if self._unfolded:
            history = self._host_history
            for piece in self._unfolded:
                history = history + piece.tolist()
            self._host_history = history[-HISTORY:]
            self._unfolded = []

    @no_grad
    def prefill(
        self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None, features: torch.Tensor | None = None
    ) -> None:
        """Start a prompt. ``features``: ``(P - 1, 3 H_target)`` the target's features of the prompt
        but its last token (``Verifier.prompt_features``).

        Raises:
            ValueError: for an empty prompt or missing / mis-shaped features.
        """
        check_prompt_features(prompt_ids, features, "the dart drafter")
        prompt_ids = prompt_ids.to(self.runtime.torch_device)
        self.cache = KVCache(1)
        self._committed_pairs = 0
        self._features, self._pair_tokens = features, prompt_ids[1:]
        self._waiting = []
        self._cached = 0
        if self._on_host:
            self._host_history, self._unfolded = prompt_ids[-HISTORY:].tolist(), []
        else:
            self._history = prompt_ids[-HISTORY:]
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        self._tokens = self._no_tokens
        self._confs = self._no_confs
        self._drafted = 0  # tokens drafted this round (no shape read of ``_tokens``)
        self._probs: list[torch.Tensor] = []
        self._logits: list[torch.Tensor] = []  # (d, Vd) per pass
        self._last_out: torch.Tensor | None = None  # (1, d, H): the last pass's outputs
        self._passes = 0
        self._returned = 0
        self._stop_at: int | None = None  # index of the first drafted stop token
        self._hidden: list[torch.Tensor] = []  # report_hidden: (d, H) what the LM head read, per pass

    def _pass(self) -> bool:
        """One pass: the newly committed pairs (the round's first) or the previous pass's drafted
        tokens with its outputs as features (a later one), then the masks -> d more tokens. False
        when there is nothing to draft from (a one-token prompt: no feature yet)."""
        start = self.cache.length
        if self._last_out is None:
            self._join_pairs()
            if self._features is None or self._features.shape[0] == 0:
                return False
            hidden = self.model.fc(self._features.to(self.runtime.torch_dtype))[None]
            embeds = self.embed_tokens(self._pair_tokens)[None]
            self._features = self._pair_tokens = None
        else:
            hidden, embeds = self._last_out, self.embed_tokens(self._tokens[-self.block_size :])[None]
        n = embeds.shape[1]
        out, k, v = self.model(embeds, hidden, start, self.cache.layer(0) if start else None)
        self.cache.keys[0], self.cache.values[0] = k[:, :, : start + n], v[:, :, : start + n]  # masks dropped
        self._cached = start + n
        if self._passes == 0:
            self._committed_pairs = start + n
        self._last_out = out
        logits = self.model.logits(out[0])  # (d, Vd)
        draft_ids, confs, q = choose(logits, self._sampling, self.runtime.generator)
        tokens = self._target_of_draft[draft_ids]
        if q is not None:
            q = q.new_zeros((q.shape[0], self.vocab_size)).index_copy_(1, self._target_of_draft, q)
            self._probs.append(q)
        if self._stop_ids.numel():
            hit = torch.isin(tokens, self._stop_ids)
            if bool(hit.any()):  # the sync of a drafted stop token: the round's draft ends there
                self._stop_at = self._tokens.shape[0] + int(hit.int().argmax())
        self._logits.append(logits)
        if self.report_hidden:  # logits = lm_head(norm(out))
            self._hidden.append(self.model.norm(out[0]))
        self._tokens = torch.cat([self._tokens, tokens])
        self._confs = torch.cat([self._confs, confs])
        self._drafted += int(tokens.shape[0])
        self._passes += 1
        return True

    @no_grad
    def draft(self, num_tokens: int) -> Draft:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        want = self._returned + num_tokens
        while self._drafted < want and self._stop_at is None:
            if not self._pass():
                break
        probs = torch.cat(self._probs) if self._probs else None
        hidden = torch.cat(self._hidden) if self._hidden else None
        draft = Draft.with_lookahead(
            self._tokens, self._confs, probs, want, self._stop_at, self._passes, hidden, count=self._drafted
        )
        self._returned = draft.length
        return draft

    @property
    def tokens_per_pass(self) -> int:
        """Draft tokens one pass gives: d (``block_size``), the first from the last committed position."""
        return self.block_size

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely tokens at each position of the round's draft so far (target ids),
        from the passes that drafted it (no extra pass): ids ``(n, k) int64`` and probabilities
        ``(n, k) float32`` (the head's softmax over its draft vocabulary), best first."""
        n = self._returned
        if not n:
            return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
        top = torch.softmax(torch.cat(self._logits)[:n].float(), dim=-1).topk(min(k, self._logits[0].shape[-1]), dim=-1)
        return self._target_of_draft[top.indices], top.values

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Crop the drafted pairs and store the committed positions' features with the tokens after
        them (``(a + 1, 3 H)`` and ``verification.committed_tokens``). Raises ``RuntimeError`` when
        the verification brought no features."""
        features = verification.features
        if features is None:
            raise RuntimeError(
                "the dart drafter got no target features from the verification; the verifier must "
                "honour request_features"
            )
        if self._cached != self._committed_pairs:  # an extension pass's drafted pairs (one pass: none)
            self.cache.crop(self._committed_pairs)
            self._cached = self._committed_pairs
        path = verification.path
        if path is not None and self._on_host:  # a tree's path read on the host: no tensor op
            ids = draft.token_ids.numpy().take((*path, 0))
            ids[-1] = verification.next_token
            tokens = torch.from_numpy(ids)
        else:
            tokens = verification.committed_tokens(draft)  # (a + 1,): the token after each committed position
        if self._features is not None:  # a round that drafted nothing: the earlier pairs wait too
            self._waiting.append((features, tokens))
        else:
            self._features, self._pair_tokens = features, tokens
        if self._on_host:
            self._unfolded.append(tokens)
            if len(self._unfolded) >= HISTORY_FOLD:
                self._fold()
        else:
            self._history = torch.cat([self._history, tokens])[-HISTORY:]
        self._new_round()

    def _join_pairs(self) -> None:
        """Fold the pairs committed by rounds that drafted nothing into ``_features`` / ``_pair_tokens``."""
        if self._waiting:
            self._features = torch.cat([self._features, *(f for f, _ in self._waiting)])
            self._pair_tokens = torch.cat([self._pair_tokens, *(t for _, t in self._waiting)])
            self._waiting.clear()


def check_fits_target(draft_config: dict[str, Any], target_config: dict[str, Any], key: str) -> tuple[int, ...]:
    """Check a DART checkpoint's config.json against the target's (both as dicts); return the feature
    layers as ``hidden_states`` indices.

    Raises:
        ConfigError: naming ``key`` and what does not fit: the feature width, the hidden size (the
            head embeds tokens with the target's embeddings), the vocabulary, or a feature layer
            beyond the target's layers.
    """
    return check_head_fits_target(DartSpec.from_config(draft_config, key), draft_config, target_config, key, "DART")


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=dart``: known keys, the checkpoint's directory, config and weights files (not
    loaded), and -- when the target is bundled or local -- the checkpoint against the target's."""
    check_keys("drafter", config, CONFIG_KEYS)
    check_checkpoint(config.get("model", "dart-drafter"), run_config, check_fits_target, DartSpec.from_config)


def build(config: dict[str, Any], runtime: Runtime, verifier) -> DartDrafter:
    """Factory for ``drafter=dart``. Config key: ``model`` (bundled ``dart-drafter`` or a local DART
    checkpoint directory). The embeddings are the target's (``verifier.model``).

    Raises:
        ConfigError: a checkpoint that does not fit the target, or a verifier without a Hugging
            Face model or without hidden states.
    """
    model_name = config.get("model", "dart-drafter")
    key = f"drafter.model={model_name!r}"
    embed, _, target_config = target_parts(verifier, NAME)
    from specpolicy.models.checkpoint import read_config

    directory = resolve_model_path(model_name)
    layers = check_fits_target(read_config(directory, key), target_config.to_dict(), key)
    model = load_dart(directory, key).to(device=runtime.torch_device, dtype=runtime.torch_dtype)
    probe_verifier(verifier, layers, int(target_config.num_hidden_layers) + 1, NAME)
    return DartDrafter(
        model, embed, layers, int(target_config.vocab_size), runtime, getattr(verifier, "eos_token_ids", ())
    )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=dart`` (``build``, checked by ``validate``)."""
    return [PluginEntry("drafter", NAME, build, validate, "DART: 8 tokens per pass from the target's fused features")]
