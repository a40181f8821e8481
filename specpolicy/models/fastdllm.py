"""Fast-dLLM v2's block-diffusion LM run on a plain ``Qwen2ForCausalLM`` (Wu et al., arXiv 2509.26328).

Fast-dLLM v2 turns an AR model into a block-diffusion LM: the sequence is cut into blocks of
``block_size`` (B = 32) tokens at ABSOLUTE positions; a token attends to every token of its own
block (bidirectionally) and of earlier blocks, never to later ones (block-wise causal attention).
The AR "token shift" is kept: the logits at position p - 1 predict the token at position p.

The model is the standard transformers ``Qwen2ForCausalLM`` (no ``trust_remote_code``; a
``Fast_dLLM_Qwen`` checkpoint loads as one through ``specpolicy.models.loading``): block-causal
attention is imposed with a custom 4D attention mask, which transformers 5 passes to the attention
kernel unchanged (``masking_utils._preprocess_mask_arguments``: "If the mask is already 4D, simply
return as-is"). Supported attention implementations: ``sdpa`` (boolean mask, True = attend) and
``eager`` (additive float mask).

Here: the mask token, the block size a checkpoint records, the block-causal mask, and greedy
tokens and confidences from logits as the official code reads them (:func:`greedy`). How its
passes run -- one request's block on its ``DynamicCache``, many requests' blocks on one padded
cache -- is ``specpolicy.runners.fastdllm``; the drafting algorithm (unmasking, boundaries, the
cache invariant between rounds) is ``specpolicy.drafters.fastdllm``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

#: The mask token of Fast-dLLM v2 (id 151665 in the Qwen2.5 vocabulary) and of the bundled family (id 3).
MASK_TOKEN = "|<MASK>|"
#: Config keys under which a checkpoint records the block size it was trained with
#: (the bundled family writes ``bd_block_size``; Fast_dLLM_v2 checkpoints write ``bd_size``).
BLOCK_SIZE_CONFIG_KEYS = ("bd_block_size", "bd_size")
#: Attention implementations that take the block-causal 4D mask.
SUPPORTED_ATTENTION = ("sdpa", "eager")


def block_causal_mask(
    query_start: int, query_length: int, key_length: int, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Boolean block-causal mask over absolute positions (Fast-dLLM v2 block-wise attention).

    Query ``i`` (absolute position ``query_start + i``) may attend to key ``j`` (absolute
    position ``j``, keys start at 0: cached positions first, then the queries themselves) iff
    ``floor((query_start + i) / block_size) >= floor(j / block_size)``.

    Args:
        query_start: absolute position of the first query token (= tokens already in the cache).
        query_length: number of query tokens fed in the pass.
        key_length: number of key positions, normally ``query_start + query_length``.
        block_size: B, tokens per block (>= 1).
        device: where to build the mask.
    Returns:
        ``(1, 1, query_length, key_length) bool``; True = may attend.
    """
    q_block = torch.arange(query_start, query_start + query_length, device=device) // block_size
    k_block = torch.arange(key_length, device=device) // block_size
    return (q_block[:, None] >= k_block[None, :])[None, None]


def mask_token_id_of(tokenizer: Any) -> int:
    """The mask token id of ``tokenizer``: ``tokenizer.mask_token_id`` when set, else the id of
    the token ``|<MASK>|`` (how Fast_dLLM_v2's Qwen2.5 tokenizer carries it: an added token that
    is not declared as ``mask_token``).

    Args:
        tokenizer: a Hugging Face tokenizer, or any object with an int ``mask_token_id``.
    Returns:
        The mask token id, an int >= 0.
    Raises:
        ValueError: naming the mask token when the tokenizer has neither.
    """
    mid = getattr(tokenizer, "mask_token_id", None)
    if mid is None and hasattr(tokenizer, "convert_tokens_to_ids"):
        cand = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        # Tokenizers with an unk token map unknown strings to it: accept only a real round trip.
        if isinstance(cand, int) and cand >= 0 and tokenizer.convert_ids_to_tokens(cand) == MASK_TOKEN:
            mid = cand
    if mid is None:
        raise ValueError(
            f"the fastdllm drafter needs a mask token: the tokenizer has no mask_token and no {MASK_TOKEN!r} token"
        )
    mid = int(mid)
    if mid < 0:
        raise ValueError(f"mask token id must be >= 0, got {mid}")
    return mid


def model_block_size(config: Any) -> int | None:
    """Block size recorded in a model config (``bd_block_size`` or ``bd_size``), or None."""
    for key in BLOCK_SIZE_CONFIG_KEYS:
        value = getattr(config, key, None)
        if value is not None:
            return int(value)
    return None


def check_model(model: PreTrainedModel, mask_id: int) -> tuple[int, str]:
    """Check that ``model`` can run as a block-diffusion LM with mask token ``mask_id``.

    Returns:
        ``(vocabulary size, attention implementation)``: the LM head's rows and ``sdpa`` or ``eager``.
    Raises:
        ValueError: a mask id outside the vocabulary, an attention implementation that does not
            take a custom 4D mask, or sliding-window attention layers.
    """
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if mask_id >= vocab:
        raise ValueError(f"mask token id {mask_id} is outside the drafter vocabulary of {vocab} tokens")
    attn = getattr(model.config, "_attn_implementation", None) or "eager"
    if attn not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"the fastdllm drafter needs a custom 4D attention mask: attn_implementation must be one of "
            f"{SUPPORTED_ATTENTION}, got {attn!r}"
        )
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        raise ValueError("the fastdllm drafter does not support sliding-window attention layers")
    return vocab, attn


def greedy(
    logits: torch.Tensor, in_model_dtype: bool = False, probs_argmax: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and their softmax probabilities (confidences) of ``logits`` ((m, V), any float
    dtype): ``((m,) int64, (m,) float32)``.

    ``in_model_dtype=False`` (``confidence_dtype: float32``, the default): argmax of the logits and
    its probability computed in at least float32, without materialising probabilities.
    ``in_model_dtype=True`` (``confidence_dtype: model``): as the official Fast-dLLM v2 / FailFast
    code (``sample_with_top_p`` at temperature 0): softmax in the logits' dtype (e.g. bfloat16),
    the token = argmax of those rounded probabilities (ties -> the first index) when
    ``probs_argmax``, else argmax of the logits (the official first token of a block); confidence
    = its rounded probability, returned as float32. The two differ only where rounding ties the
    top probabilities (rare in bfloat16), and in float32 / float64 only at exact rounding ties.
    """
    if in_model_dtype:
        probs = torch.softmax(logits, dim=-1)  # (m, V) in the logits' dtype
        tok = (probs if probs_argmax else logits).argmax(dim=-1)
        return tok, probs.gather(-1, tok[:, None])[:, 0].to(torch.float32)
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    top, tok = x.max(dim=-1)
    conf = torch.exp(top - torch.logsumexp(x, dim=-1))
    return tok, conf.to(torch.float32)
