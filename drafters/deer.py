"""``deer`` drafter: DEER's one-step block drafting (Cheng et al., arXiv 2512.15176, §3.4).

DEER drafts with a dLLM aligned to the target (``specpolicy.family.train_deer``: Stage I AR-style
distillation, Stage II "scribe" refinement): the committed prefix followed by k mask tokens, ONE
denoising step fills them all, and the block is verified as a chain (greedy: by equality;
sampling: the standard ``min(1, p/q)`` acceptance with residual resampling, q being the drafter's
warped distribution at each position). No adaptive length in the paper: ``policy=static
policy.k=32`` is its main setting; any chain policy runs on it (``policy=failfast``: FailFast's
rule on DEER's drafts, a row neither paper has).

This is the ``fastdllm`` drafter's code path (:class:`FastDLLMDrafter`) on a DEER checkpoint
(:mod:`specpolicy.models.deer`: a LoRA adapter merged into the bundled dLLM drafter, or full
weights) with DEER's decoding: one small block = the whole block (``small_block_size =
block_size``) and unmask threshold 0, so one pass unmasks every masked position of the block.
The bundled drafter's attention is block-causal over ABSOLUTE blocks of 32 positions, so a draft
within the current block is one pass; one that crosses a block boundary also pays the boundary
pass (writing the block's KV) and one pass over the next block, as in ``fastdllm``.
"""

from __future__ import annotations

from typing import Any

from specpolicy.core.checks import check_keys
from specpolicy.core.errors import ConfigError
from specpolicy.core.runtime import Runtime
from specpolicy.drafters.fastdllm import FastDLLMDrafter, check_settings, model_block_size
from specpolicy.models.checkpoint import target_config_of
from specpolicy.models.deer import BUNDLED_NAME, check_deer_checkpoint, load_deer, resolve_deer_path
from specpolicy.models.loading import check_attention, check_same_vocabulary, load_tokenizer
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.runners.fastdllm import check_buckets

NAME = "deer"
CONFIG_KEYS = ("model", "block_size", "small_block_size", "threshold", "attn_implementation", "confidence_dtype")
_SUPPORTED_ATTENTION = ("sdpa", "eager")


class DEERDrafter(FastDLLMDrafter):
    """One-step block drafting (see the module docstring); the arguments of :class:`FastDLLMDrafter`
    with DEER's defaults: ``small_block_size`` = ``block_size`` (None), ``threshold`` 0.

    Raises:
        ValueError: as :class:`FastDLLMDrafter`.
    """

    name = NAME

    def __init__(self, model, runtime: Runtime, tokenizer: Any, block_size: int = 32, small_block_size=None, **kw):
        kw.setdefault("threshold", 0.0)
        super().__init__(model, runtime, tokenizer, block_size, small_block_size or block_size, **kw)


def _target_vocab_size(run_config: dict | None) -> int | None:
    cfg = target_config_of(run_config)
    return None if cfg is None or cfg.get("vocab_size") is None else int(cfg["vocab_size"])


def validate(config: dict[str, Any], run_config: dict[str, Any]) -> None:
    """``drafter=deer``: known keys, the checkpoint (adapter and base, or full weights; its
    vocabulary against the target's when the target is bundled or local), ``block_size`` against
    the checkpoint's, the settings and the attention -- before any model loads.

    Raises:
        ConfigError: one line naming the key.
    """
    check_keys("drafter", config, CONFIG_KEYS)
    model = config.get("model", BUNDLED_NAME)
    check_deer_checkpoint("drafter.model", model, _target_vocab_size(run_config))
    from specpolicy.models.deer import deer_meta

    trained = deer_meta(resolve_deer_path(model)).get("block_size")
    block_size = config.get("block_size")
    block_size = (trained or 32) if block_size is None else block_size
    try:
        check_settings(
            block_size,
            config.get("small_block_size") or block_size,
            config.get("threshold", 0.0),
            config.get("confidence_dtype", "float32"),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if trained is not None and block_size != trained:
        raise ConfigError(
            f"drafter.block_size={block_size!r} but the DEER checkpoint {model!r} was trained with block size "
            f"{trained}; use {trained} or null"
        )
    check_attention("drafter.attn_implementation", config.get("attn_implementation", "sdpa"), _SUPPORTED_ATTENTION)
    if (run_config.get("runtime") or {}).get("compile"):
        try:
            check_buckets(block_size, run_config["runtime"].get("buckets") or (block_size,))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def build(config: dict[str, Any], runtime: Runtime, verifier) -> DEERDrafter:
    """Factory for ``drafter=deer``: ``model`` (``deer-drafter`` or a DEER checkpoint directory),
    ``block_size`` (null: the checkpoint's), ``small_block_size`` (null: ``block_size``),
    ``threshold`` (0), ``attn_implementation`` (sdpa), ``confidence_dtype`` (float32). Drafting stops at
    the verifier's EOS tokens.

    Raises:
        ConfigError: a checkpoint that is missing or incomplete.
        ValueError: a vocabulary other than the target's, or a constructor error.
    """
    model, tok_source = load_deer(config.get("model", BUNDLED_NAME), runtime, config.get("attn_implementation", "sdpa"))
    tokenizer = load_tokenizer(tok_source)
    check_same_vocabulary(verifier.tokenizer, tokenizer, NAME)
    block_size = config.get("block_size") or model_block_size(model.config) or 32
    return DEERDrafter(
        model,
        runtime,
        tokenizer,
        block_size=block_size,
        small_block_size=config.get("small_block_size"),
        threshold=config.get("threshold", 0.0),
        stop_token_ids=getattr(verifier, "eos_token_ids", ()),
        confidence_dtype=config.get("confidence_dtype", "float32"),
    )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: ``drafter=deer`` (``build``, checked by ``validate``)."""
    return [PluginEntry("drafter", NAME, build, validate, "DEER: one-step block drafting")]
