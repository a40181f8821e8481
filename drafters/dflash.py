"""``dflash`` drafter: DFlash block-diffusion drafting conditioned on the target's hidden states
(Chen, Liang, Liu, arXiv 2602.06036; the network is ``specpolicy.draft_models.dflash``).

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
positions' features, written by the first pass after they arrive (``commit`` only stores the
features ``Verification.features`` brought) and never recomputed; the block's own keys and values
are never cached, so nothing needs cropping on rejection. With ``policy=static policy.k=B-1``
the drafts are exactly the official ``dflash_generate``'s given the same committed sequence
(``tests/test_dflash.py`` checks it on an official-layout checkpoint).

Sampling: each drafted token is drawn from ``warp`` of its position's logits and reported in
``Draft.probs``; its distribution depends on the context and (in an extension pass) on the given
earlier drafted tokens only, so speculative sampling stays lossless.
"""

from __future__ import annotations

from typing import Any

import torch

from specpolicy.draft_models.dflash import DFlashDraftModel, DFlashSpec, load_dflash
from specpolicy.draft_models.kv import KVCache
from specpolicy.drafter import Drafter
from specpolicy.errors import ConfigError
from specpolicy.features import check_checkpoint, probe_verifier, target_parts
from specpolicy.hookspecs import hookimpl
from specpolicy.models import resolve_model_path
from specpolicy.runtime import Runtime
from specpolicy.sampling import SamplingConfig, choose
from specpolicy.types import Draft, Verification
from specpolicy.validation import check_keys, choice

NAME = "dflash"
CONFIG_KEYS = ("model", "extension")
#: ``drafter.extension``: how a draft goes past one block -- ``given`` (an extension pass with the
#: tokens drafted so far given before B - 1 new masks) or ``none`` (no extension: B - 1 tokens at most).
EXTENSIONS = ("given", "none")


class DFlashDrafter(Drafter):
    """DFlash drafting: B - 1 tokens per forward pass, from the target's features.

    Args:
        model: the DFlash network, on the runtime device in the runtime dtype, eval mode.
        embed_tokens: the target's input embedding module (``(V, H)``).
        lm_head: the target's LM head module (``H -> V``).
        runtime: the shared runtime (device, dtype, random stream).
        stop_token_ids: token ids that end generation; a draft ends at the first one it drafts.
        extension: ``"given"`` (default: past B - 1 tokens, extension passes with the drafted tokens
            given) or ``"none"`` (one block per round: a policy asking for more gets no more).
    Raises:
        ValueError: for an ``extension`` not in ``EXTENSIONS``.
    """

    name = NAME

    def __init__(self, model: DFlashDraftModel, embed_tokens: torch.nn.Module, lm_head: torch.nn.Module,
                 runtime: Runtime, stop_token_ids: frozenset[int] | tuple[int, ...] = (), extension: str = "given"):
        if extension not in EXTENSIONS:
            raise ValueError(f"drafter.extension must be one of {', '.join(EXTENSIONS)}, got {extension!r}")
        self.extension = extension
        self.model, self.embed_tokens, self.lm_head, self.runtime = model, embed_tokens, lm_head, runtime
        self.block_size = model.spec.block_size
        self.target_feature_layers = model.spec.feature_layers
        device = runtime.torch_device
        self._stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=device)
        self._masks = torch.full((self.block_size - 1,), model.spec.mask_token_id, dtype=torch.long, device=device)
        self.cache: KVCache | None = None
        self._context: torch.Tensor | None = None  # (u, F) committed positions' features not yet cached
        self._pending: torch.Tensor | None = None  # (1,) int64: the last committed token
        self._sampling: SamplingConfig | None = None

    @property
    def timed_calls(self) -> tuple:
        """The entry points of a pass: the network's forward, its context caching
        (``context_keys_values``, which calls fc, norms and k/v projections directly), the
        target's embeddings and LM head, and the top-k of the drafted positions' distributions
        (``alternatives``, which tree policies ask for). Benchmarks time a drafter's forward passes
        as their outermost calls (``specpolicy.profiling.ForwardTimer``)."""
        return (self.model, (self.model, "context_keys_values"), self.embed_tokens, self.lm_head,
                (self, "alternatives"))

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None,
                features: torch.Tensor | None = None) -> None:
        """Start a prompt. ``features``: ``(P - 1, F)`` the target's features of the prompt but its
        last token (``Verifier.prompt_features``).

        Raises:
            ValueError: for an empty prompt, missing features, or features of the wrong shape.
        """
        n = int(prompt_ids.shape[0])
        if n < 1:
            raise ValueError("prompt_ids is empty; the dflash drafter needs at least one token")
        if features is None or tuple(features.shape[:1]) != (n - 1,):
            raise ValueError(f"the dflash drafter needs the target's features of the prompt's first {n - 1} positions "
                             f"(got {None if features is None else tuple(features.shape)}); run it through "
                             "specpolicy.decoding.generate, which asks the verifier for them")
        self.cache = KVCache(len(self.model.layers))
        self._context = features
        self._pending = prompt_ids[-1:].to(self.runtime.torch_device)
        self._sampling = None if sampling is None or sampling.is_greedy else sampling
        self._new_round()

    def _new_round(self) -> None:
        device = self.runtime.torch_device
        self._tokens = torch.empty(0, dtype=torch.long, device=device)  # (d,) drafted this round, look-ahead included
        self._confs = torch.empty(0, dtype=torch.float32, device=device)
        self._probs: list[torch.Tensor] = []  # sampling: (B - 1, V) q per pass
        self._returned = 0  # tokens handed out in the draft so far
        self._stop_at: int | None = None  # index of the first drafted stop token, if any
        self._passes = 0
        self._logits: list[torch.Tensor] = []  # (B - 1, V) per pass

    def _cache_context(self) -> None:
        """Write the keys and values of the newly committed positions' features into the cache."""
        if self._context is None or self._context.shape[0] == 0:
            return
        start = self.cache.length
        positions = torch.arange(start, start + self._context.shape[0], device=self.runtime.torch_device)[None]
        features = self._context.to(self.runtime.torch_dtype)[None]
        for i, (k, v) in enumerate(self.model.context_keys_values(features, positions)):
            self.cache.append(i, k, v)
        self._context = None

    def _pass(self) -> None:
        """One forward pass: the block ``[pending, drafted so far, MASK x (B - 1)]`` -> B - 1 more tokens."""
        self._cache_context()
        ids = torch.cat([self._pending, self._tokens, self._masks])
        start = self.cache.length  # the pending token's position: every committed position before it is cached
        positions = torch.arange(start, start + ids.shape[0], device=ids.device)[None]
        context = [self.cache.layer(i) for i in range(len(self.model.layers))]
        out = self.model(self.embed_tokens(ids)[None], positions, context)[0]  # (q, H)
        logits = self.lm_head(out[1 + self._tokens.shape[0]:])  # (B - 1, V)
        tokens, confs, q = choose(logits, self._sampling, self.runtime.generator)
        self._logits.append(logits)  # (B - 1, V): tree policies read their top-k (``alternatives``)
        if self._stop_ids.numel():
            hit = torch.isin(tokens, self._stop_ids)
            if bool(hit.any()):  # the sync of a drafted stop token: nothing past it is drafted
                self._stop_at = self._tokens.shape[0] + int(hit.int().argmax())
        self._tokens = torch.cat([self._tokens, tokens])
        self._confs = torch.cat([self._confs, confs])
        if q is not None:
            self._probs.append(q)
        self._passes += 1

    @torch.no_grad()
    def draft(self, num_tokens: int) -> Draft:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        want = self._returned + num_tokens
        while self._tokens.shape[0] < want and self._stop_at is None:
            if self._passes and self.extension == "none":
                break  # one block per round: nothing more to propose
            self._pass()
        end = self._tokens.shape[0] if self._stop_at is None else self._stop_at + 1
        k = min(want, end)
        self._returned = k
        probs = torch.cat(self._probs)[:k] if self._probs else None
        return Draft(self._tokens[:k], self._confs[:k], forward_passes=self._passes, probs=probs,
                     ends_at_stop_token=self._stop_at is not None and k == end,
                     lookahead=end - k, lookahead_confidences=self._confs[k:end])

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely tokens at each position of the round's draft so far, from the passes
        that drafted it (no extra pass): ids ``(n, k) int64`` and probabilities ``(n, k) float32``,
        best first (column 0 is the drafted token when greedy). For tree policies (``failfast-tree``,
        ``block-tree``), computed when asked."""
        n = self._returned
        if not n:
            return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
        top = torch.softmax(torch.cat(self._logits)[:n].float(), dim=-1).topk(k, dim=-1)
        return top.indices, top.values

    def commit(self, draft: Draft, verification: Verification) -> None:
        """Store the committed positions' features (the pending token's and the accepted tokens',
        ``(a + 1, F)``); they enter the cache with the next pass. Raises ``RuntimeError`` when the
        verification brought none (a verifier that ignored ``request_features``)."""
        features = verification.features
        if features is None:
            raise RuntimeError("the dflash drafter got no target features from the verification; the verifier must "
                               "honour request_features")
        self._context = features if self._context is None else torch.cat([self._context, features])
        self._pending = verification.committed_tokens(draft)[-1:]  # the correction / bonus token (chain or tree)
        self._new_round()


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
        raise ConfigError(f"{key}: hidden_size {draft_config.get('hidden_size')} does not match the target's {hidden} "
                          "(DFlash embeds its block with the target's embeddings)")
    if "vocab_size" in draft_config and int(draft_config["vocab_size"]) != vocab:
        raise ConfigError(f"{key}: vocab_size {draft_config['vocab_size']} does not match the target's {vocab}")
    if not 0 <= spec.mask_token_id < vocab:
        raise ConfigError(f"{key}: dflash_config.mask_token_id {spec.mask_token_id} is outside the target's vocabulary "
                          f"(0..{vocab - 1})")
    bad = [i for i in spec.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise ConfigError(f"{key}: dflash_config.target_layer_ids {list(spec.target_layer_ids)} name layers the target "
                          f"does not have ({bad}; the target has {layers} layers, ids 0..{layers - 1})")
    return spec


@hookimpl
def specpolicy_validate_config(group: str, name: str, config: dict[str, Any], run_config: dict[str, Any]):
    """``drafter=dflash``: known keys, the checkpoint's directory, config and weights files (not
    loaded), and -- when the target is bundled or local -- the checkpoint against the target's
    config.json (hidden size, vocabulary, mask token, layer ids)."""
    if group != "drafter" or name != NAME:
        return None
    check_keys("drafter", config, CONFIG_KEYS)
    choice("drafter.extension", config.get("extension", "given"), EXTENSIONS)
    check_checkpoint(config.get("model", "dflash-drafter"), run_config, check_fits_target, DFlashSpec.from_config)
    return True


@hookimpl
def specpolicy_make_drafter(name: str, config: dict[str, Any], runtime: Runtime, verifier):
    """Factory for ``drafter=dflash``. Config keys: ``model`` (bundled ``dflash-drafter`` or a local
    DFlash checkpoint directory in the official layout), ``extension`` (``given`` | ``none``). The
    embeddings and LM head are the target's (``verifier.model``).

    Raises:
        ConfigError: a checkpoint that does not fit the target, or a verifier without a Hugging
            Face model or without hidden states.
    """
    if name != NAME:
        return None
    model_name = config.get("model", "dflash-drafter")
    key = f"drafter.model={model_name!r}"
    embed, head, target_config = target_parts(verifier, NAME)
    from specpolicy.draft_models.checkpoint import read_config

    directory = resolve_model_path(model_name)
    check_fits_target(read_config(directory, key), target_config.to_dict(), key)
    model = load_dflash(directory, key).to(device=runtime.torch_device, dtype=runtime.torch_dtype)
    probe_verifier(verifier, model.spec.feature_layers, int(target_config.num_hidden_layers) + 1, NAME)
    return DFlashDrafter(model, embed, head, runtime, getattr(verifier, "eos_token_ids", ()),
                         config.get("extension", "given"))
