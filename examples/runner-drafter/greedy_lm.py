"""A drafter written against the runner: greedy drafting with a small causal LM.

It states its algorithm once, as passes over ``(R, n)`` positions of ``R`` requests
(``specpolicy.runners.causal.CausalRunner.forward``), and never says how a pass runs: the runner
runs it eagerly, compiled (``runtime.compile=true``: a static KV cache under ``torch.compile``), and
batched (``generation.batch_size`` > 1: one static cache of a sequence per request, one compiled
pass for all of them). ``docs/how-to/write-a-drafter-or-verifier.md`` ("A drafter on the runner")
walks through it; ``tests/drafters/test_runner_drafter.py`` runs it every way against vanilla.
"""

from __future__ import annotations

import copy

import torch

from specpolicy import Draft, Drafter, SamplingConfig, Verification
from specpolicy.runners.causal import CausalRunner


class GreedyLMDrafter(Drafter):
    """Drafts the argmax of a small causal LM, token after token (greedy decoding only).

    Args:
        model: a Hugging Face causal LM sharing the target's vocabulary (compiled: Llama, Mistral, Qwen2 or Qwen3), on
            ``runtime.torch_device`` in ``runtime.torch_dtype``.
        runtime: the run's runtime (``runtime.compile`` picks how the passes run).
    """

    name = "greedy-lm"

    def __init__(self, model: torch.nn.Module, runtime, static_cache: bool | None = None) -> None:
        self.runner = CausalRunner(model, runtime, static_cache=static_cache)
        self.max_context = self.runner.capacity
        self.sequence = None  # this request's sequence on the runner (its KV cache)
        self.unfed = torch.empty(0, dtype=torch.long)  # committed tokens not fed to the model yet
        self.tokens: list[torch.Tensor] = []  # this round's drafted tokens, (1,) each
        self.confs: list[torch.Tensor] = []

    # -- the batched loop: its copies of ``batched(slots)`` share that runner, a sequence each
    def batched(self, slots: int) -> GreedyLMDrafter:
        lead = copy.copy(self)
        lead.runner = self.runner.batched(slots)
        return lead

    def release(self) -> None:
        self.runner.close(self.sequence)
        self.sequence = None

    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        if sampling is not None and not sampling.is_greedy:
            raise ValueError("the greedy-lm drafter drafts greedily; use generation.temperature=0")
        self.release()
        self.sequence = self.runner.open()
        self.unfed = prompt_ids.to(self.runner.runtime.torch_device)
        self.tokens, self.confs = [], []

    def draft(self, num_tokens: int) -> Draft:
        return self.draft_many([self], [num_tokens])[0]

    @classmethod
    @torch.no_grad()
    def draft_many(cls, drafters: list[GreedyLMDrafter], num_tokens: list[int]) -> list[Draft]:
        """The algorithm, once, for every request: each step is ONE pass over the requests that
        still draft -- a round's first pass feeds a request's unfed committed tokens, a later one
        its last drafted token -- and each takes the argmax of its last position."""
        if any(n < 1 for n in num_tokens):
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        goals = [len(d.tokens) + n for d, n in zip(drafters, num_tokens)]
        while step := [d for d, goal in zip(drafters, goals) if len(d.tokens) < goal]:
            inputs = [d.tokens[-1] if d.tokens else d.unfed for d in step]
            logits = step[0].runner.forward([d.sequence for d in step], inputs)  # [(n_i, V)]
            for d, rows in zip(step, logits):
                conf, token = torch.softmax(rows[-1].float(), dim=-1).max(dim=-1)
                d.tokens.append(token[None])
                d.confs.append(conf[None])
        return [Draft(torch.cat(d.tokens), torch.cat(d.confs), forward_passes=len(d.tokens)) for d in drafters]

    def commit(self, draft: Draft, verification: Verification) -> None:
        committed = verification.committed_tokens(draft)  # the accepted tokens and the correction
        drafted = len(self.tokens)
        if drafted == 0:
            self.unfed = torch.cat([self.unfed, committed])
        else:  # fed this round: the unfed tokens and d_1 .. d_{m-1}; keep the accepted ones
            keep = min(verification.accepted_length, drafted - 1)
            self.sequence.crop(self.sequence.length - (drafted - 1) + keep)
            self.unfed = committed[keep:]
        self.tokens, self.confs = [], []
