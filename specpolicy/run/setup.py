"""What a run decodes with and what becomes of each prompt: ``RunSetup`` (the loaded method and
settings) and ``PromptPlan`` (the prompts, read back, skipped or warmed up), handed by
``specpolicy.run.experiment`` to its batch-1 phase and to the batched one
(``specpolicy.run.batch_experiment``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from specpolicy.analysis.parting import measure_parting
from specpolicy.analysis.results import PromptResult
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig, prompt_seed
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import GenerationResult


@dataclass
class RunSetup:
    """What the run decodes with, loaded once and handed to both phases (batch 1 in
    ``specpolicy.run.experiment``, the batched loop in ``specpolicy.run.batch_experiment``).

    Attributes:
        method: the method's printed name (``method_name``).
        runtime / verifier / drafter / policy: the loaded runtime and models.
        reuse / stop / sampling: the run's draft reuse, stop strings and sampling settings.
        max_new_tokens: per prompt; seed: the run's seed (each call reseeded per prompt).
        tokenizer: the target's, encoding prompts and decoding outputs.
        fingerprint: the config hash recorded in each row (what a resume may reuse).
    """

    method: str
    runtime: Runtime
    verifier: Any
    drafter: Any
    policy: Any
    reuse: DraftReuse | None
    stop: StopStrings | None
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    tokenizer: Any
    fingerprint: str

    def decode(self, ids, speculative: bool, prompt_id: str = "", on_round=None) -> GenerationResult:
        """One prompt through ``generate``, seeded from ``(seed, prompt id)``: sampled outputs do
        not depend on the prompt order, on which method ran first, or on resuming
        (``specpolicy.core.sampling.prompt_seed``). ``speculative`` False: vanilla decoding."""
        self.runtime.seed_everything(prompt_seed(self.seed, prompt_id))
        method = dict(drafter=self.drafter, policy=self.policy, reuse=self.reuse) if speculative else {}
        return generate(
            ids,
            self.verifier,
            self.runtime,
            max_new_tokens=self.max_new_tokens,
            on_round=on_round,
            sampling=self.sampling,
            stop=self.stop,
            **method,
        )

    def with_parting(self, result: PromptResult, prompt_ids) -> PromptResult:
        """``result`` with its parting from vanilla measured when the greedy outputs differ
        (``specpolicy.analysis.parting.measure_parting``: a re-run of the target over the common
        prefix, after decoding, outside every timed span), else ``result`` itself."""
        if result.lossless is not False or result.vanilla is None or result.first_difference is None:
            return result
        parting = measure_parting(
            getattr(self.verifier, "model", None),
            prompt_ids,
            result.speculative.output_ids.tolist(),
            result.vanilla.output_ids.tolist(),
            result.first_difference,
            result.speculative.rounds,
            self.runtime.torch_dtype,
        )
        return replace(result, parting=parting.to_dict())


@dataclass
class PromptPlan:
    """The run's prompts and what becomes of each: ``token_ids`` (prompt id -> ``(P,) int64``),
    ``finished`` (read back from an earlier run: id -> ``PromptResult``), ``too_long`` (id -> the
    reason it is skipped), ``warmup`` (prompts decoded once, untimed, before measuring)."""

    prompts: list
    token_ids: dict[str, Any]
    finished: dict[str, PromptResult]
    too_long: dict[str, str]
    warmup: int
