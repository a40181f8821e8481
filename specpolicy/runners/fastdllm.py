"""How Fast-dLLM v2's block passes run (``FastDLLMRunner``): one request on its own ``DynamicCache``
(the Hugging Face forward), or many requests' blocks in ONE pass over a padded cache -- for the
drafter that states its algorithm once over ``(R, B)`` positions (``drafters/fastdllm.py``; the
model, its block-causal mask and the token/confidence read are ``specpolicy.models.fastdllm``).

A pass feeds request ``i`` its current block of ``B`` tokens at absolute positions
``start_i .. start_i + B - 1``, on top of its cache of exactly ``start_i`` positions (the complete
blocks before it), bidirectionally inside the block (Fast-dLLM v2's block-wise attention, Wu et al.,
arXiv 2509.26328): an unmasking pass keeps nothing in the cache, a boundary pass keeps the block's
keys and values (``FastDLLMPass.writes``). Completed blocks are written in one block-causal pass
(``write``).

Runtimes: eager only. A drafting call of one request runs each pass as the Hugging Face forward on
its own cache; a call of several (the batched loop) runs each step's passes as one forward over a
padded copy of their caches, rebuilt only when the rows or their cached lengths change. The
compiled runtime (``runtime.compile=true``) leaves this drafter eager, beside the compiled target
(``docs/how-to/compiled-runtime.md``): a static-cache path would go here, not in the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from specpolicy.core.attention import as_model_mask
from specpolicy.core.cache import append_columns, crop_cache, padded_cache
from specpolicy.models.fastdllm import block_causal_mask


def block_pass(
    model: PreTrainedModel,
    cache: DynamicCache,
    ids: torch.Tensor,
    start: int,
    mask: torch.Tensor,
    attn: str,
    logits_to_keep: int | torch.Tensor,
) -> torch.Tensor:
    """One forward pass over ``ids`` ((n,) int64, absolute positions ``start..start+n-1``) on top of
    ``cache`` (which must hold exactly ``start`` positions), under ``mask`` (``(1, 1, n, start + n)``
    bool, True = attend); the pass's KV is appended to the cache.

    Args:
        attn: the model's attention implementation (``sdpa`` or ``eager``: how the mask is handed over).
        logits_to_keep: the last n positions (int) or the offsets (``(m,) int64``) whose logits are kept.
    Returns:
        The kept logits ``(m, V)`` in the model dtype.
    """
    n = int(ids.shape[0])
    assert cache.get_seq_length() == start, (cache.get_seq_length(), start)
    positions = torch.arange(start, start + n, device=ids.device)[None]
    dtype = next(model.parameters()).dtype
    out = model(
        input_ids=ids[None],
        attention_mask=as_model_mask(mask, attn, dtype),
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits[0]


def runs_padded(model: PreTrainedModel) -> bool:
    """Whether :func:`padded_block_pass` can run ``model``: a plain ``Qwen2ForCausalLM``, whose
    logits are its LM head over the decoder's output with nothing after."""
    from transformers import Qwen2ForCausalLM

    return type(model) is Qwen2ForCausalLM


def padded_block_pass(
    model: PreTrainedModel,
    cache: DynamicCache,
    width: int,
    ids: torch.Tensor,
    starts: torch.Tensor,
    keeps: list[torch.Tensor],
    attn: str,
) -> list[torch.Tensor]:
    """One pass over many requests' current blocks on one padded cache.

    Row r is its block ``ids[r]`` of B tokens at absolute positions ``starts[r] + 0..B-1``, on top
    of its own ``starts[r]`` cached columns of ``cache`` (padded to the widest, W columns): a 4-D
    mask keeps each row to its own cached columns and its own block (bidirectional inside it). The
    rows' last hidden states at the offsets each keeps go through the LM head together. The
    block's keys and values are appended to ``cache`` as columns ``[W, W + B)``.

    Args:
        model: a plain ``Qwen2ForCausalLM`` (:func:`runs_padded`).
        cache: the rows' caches padded into one (``specpolicy.core.cache.padded_cache``).
        width: W, the padded cache's columns (the longest row's cached length).
        ids: ``(b, B) int64``, the rows' current blocks.
        starts: ``(b,) int64``, each row's cached length.
        keeps: per row, ``(m_r,) int64`` block offsets whose logits it needs.
        attn: ``sdpa`` or ``eager``.
    Returns:
        Per row, its logits ``(m_r, V)`` in the model dtype.
    """
    b, B = ids.shape
    device = ids.device
    positions = starts[:, None] + torch.arange(B, device=device)
    past = torch.arange(width, device=device)[None] < starts[:, None]  # (b, W): own cached columns
    mask = torch.cat(
        [past[:, None, :].expand(b, B, width), torch.ones((b, B, B), dtype=torch.bool, device=device)], dim=2
    )[:, None]
    dtype = next(model.parameters()).dtype
    hidden = model.model(
        input_ids=ids,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        attention_mask=as_model_mask(mask, attn, dtype),
    ).last_hidden_state
    counts = [int(k.shape[0]) for k in keeps]
    owners = torch.repeat_interleave(torch.arange(b, device=device), torch.tensor(counts, device=device))
    picked = hidden[owners, torch.cat(keeps)]  # (sum m_r, H): every row's kept offsets
    return list(model.lm_head(picked).split(counts))


@dataclass
class FastDLLMPass:
    """One request's part of a block pass (``FastDLLMSteps.run``).

    Attributes:
        cache: the request's cache, holding exactly ``start`` positions (its complete blocks).
        ids: ``(B,) int64`` its current block (committed tokens, drafted tokens, mask tokens).
        start: the block's first absolute position (a multiple of B).
        keep: ``(m,) int64`` the block offsets whose logits it needs (an unmasking pass), or None:
            the block's last logit (a boundary pass, whose first-token logit opens the next block).
        writes: keep the block's keys and values in ``cache`` (a boundary pass) or leave the cache
            as it was (an unmasking pass).
    """

    cache: DynamicCache
    ids: torch.Tensor
    start: int
    keep: torch.Tensor | None
    writes: bool


class FastDLLMRunner:
    """How a Fast-dLLM v2 model's block passes run (see the module docstring).

    Args:
        model: the block-diffusion LM (a causal LM, e.g. ``Qwen2ForCausalLM``), eval mode.
        attn: its attention implementation, ``sdpa`` or ``eager`` (``models.fastdllm.check_model``).
        block_size: B, tokens per block.
    """

    def __init__(self, model: PreTrainedModel, attn: str, block_size: int) -> None:
        self.model, self.attn, self.block_size = model, attn, block_size
        #: several requests' passes run as one padded forward (a plain ``Qwen2ForCausalLM``)
        self.pads = runs_padded(model)

    def open(self) -> DynamicCache:
        """A new request's empty cache."""
        return DynamicCache()

    def crop(self, cache: DynamicCache, length: int) -> None:
        """Roll ``cache`` back to its first ``length`` positions (a no-op if shorter)."""
        crop_cache(cache, length)

    def write(self, cache: DynamicCache, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Write the keys and values of complete blocks ``ids`` (``(n,) int64``, n a multiple of B, from
        block boundary ``start``, the cache holding exactly ``start`` positions) in one block-causal
        pass. Returns the last position's logits ``(1, V)`` (the next block's first token)."""
        n = int(ids.shape[0])
        mask = block_causal_mask(start, n, start + n, self.block_size, ids.device)
        return block_pass(self.model, cache, ids, start, mask, self.attn, logits_to_keep=1)

    def steps(self, requests: int) -> FastDLLMSteps:
        """The passes of one drafting call of ``requests`` requests: each request's passes alone on
        its own cache (one request, or a model the padded pass does not run), else each step's
        passes in one padded forward."""
        return FastDLLMSteps(self, padded=requests > 1 and self.pads)


class FastDLLMSteps:
    """The passes of one drafting call (``FastDLLMRunner.steps``): ``run`` a step's passes, one per
    request that takes one. Padded: the requests' caches copied into one padded cache, kept from
    step to step while the same rows stand at the same cached lengths."""

    def __init__(self, runner: FastDLLMRunner, padded: bool) -> None:
        self.runner, self.padded = runner, padded
        self._copy: tuple | None = None  # (the rows' caches by identity, cached lengths, the padded cache)

    @torch.no_grad()
    def run(self, passes: list[FastDLLMPass]) -> list[torch.Tensor]:
        """One step: request ``i``'s block ``passes[i].ids`` after its cached blocks. Returns each
        request's kept logits ``(m_i, V)`` in the model dtype (a boundary pass: ``(1, V)``); a
        writing pass's keys and values join its cache, the others' leave it as it was."""
        if not self.padded:
            return [self._alone(p) for p in passes]
        return self._together(passes)

    def _alone(self, p: FastDLLMPass) -> torch.Tensor:
        """One request's pass as the Hugging Face forward on its own cache, under an all-visible
        mask (the cached blocks and the whole block)."""
        runner, B = self.runner, self.runner.block_size
        mask = torch.ones(1, 1, B, p.start + B, dtype=torch.bool, device=p.ids.device)
        keep = 1 if p.keep is None else p.keep
        logits = block_pass(runner.model, p.cache, p.ids, p.start, mask, runner.attn, keep)
        if not p.writes:
            crop_cache(p.cache, p.start)  # an unmasking pass adds nothing to the cache
        return logits

    def _together(self, passes: list[FastDLLMPass]) -> list[torch.Tensor]:
        """Every request's pass in ONE padded forward (``padded_block_pass``); a writing row's new
        columns join its own cache, and the padded copy drops the step's columns."""
        runner = self.runner
        device = passes[0].ids.device
        owners, lengths = [id(p.cache) for p in passes], [p.start for p in passes]
        for p in passes:
            assert p.cache.get_seq_length() == p.start, (p.cache.get_seq_length(), p.start)
        if self._copy is None or self._copy[0] != owners or self._copy[1] != lengths:
            self._copy = (owners, lengths, padded_cache([p.cache for p in passes])[0])
        cache, width = self._copy[2], max(lengths)
        last = torch.tensor([runner.block_size - 1], device=device)
        keeps = [last if p.keep is None else p.keep for p in passes]
        ids = torch.stack([p.ids for p in passes])  # (b, B)
        logits = padded_block_pass(
            runner.model, cache, width, ids, torch.tensor(lengths, device=device), keeps, runner.attn
        )
        for r, p in enumerate(passes):
            if p.writes:  # the block's keys and values join the row's own cache
                append_columns(p.cache, cache, r, slice(width, None))
        crop_cache(cache, width)  # the padded copy drops this step's columns
        if any(p.writes for p in passes):
            self._copy = None  # a row's cached length moved: copy again
        return logits
