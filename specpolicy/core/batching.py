"""The batched loop: many requests in flight, one target forward pass per round over all of them.

``generate_batch`` is the round loop (``specpolicy.core.loop``, which ``generate`` runs at R = 1) on
the verifier's batched form, for serving studies: up to ``batch_size`` requests in flight with continuous batching
(a finished request's row is refilled from the queue at once, Orca, Yu et al. OSDI 2022);
requests arrive all at once or as a Poisson process (``specpolicy.core.serving``). Each request keeps
its own committed sequence, KV-cache row, drafter state (a shallow copy of the configured
drafter, ``Drafter.batched`` for the batch size: same weights, its own state, which ``prefill``
replaces; on the compiled runtime the copies of EAGLE-3, the AR drafter and DFlash share a static
cache of one sequence per request, greedy or sampling, the other drafters' copies draft eagerly;
``Drafter.release`` when it leaves) and policy (a deep copy of the
configured one, reset), so it drafts its own speculation length; the target verifies every
request's chain draft in ONE forward pass (``verifiers/hf_batch.py``: padded rows, an attention
mask, caches moved per request, never recomputed). Drafting goes through ``Drafter.draft_many``:
EAGLE-3 and the AR drafter advance every drafting request by a token in one pass, Fast-dLLM runs
every drafting request's unmasking or block-boundary pass in one padded pass, DFlash drafts every
drafting request's block in one padded pass, the suffix drafter (no model) request by request. Draft
reuse (``reuse``) extends each request's draft from its own previous rejected tail, as alone.

Greedy or lossless speculative sampling per request; chains only (tree policies run in the
batch-1 loop). A request leaves the batch at EOS, its first stop string, ``max_new_tokens`` or
the context's end without disturbing the others; a prompt that does not fit is skipped and
recorded (``BatchResult.skipped``), the batch goes on.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch

from specpolicy.core.drafter import Drafter
from specpolicy.core.loop import Decoding, run_loop
from specpolicy.core.policy import LengthPolicy, TreePolicy
from specpolicy.core.protocols import BatchedVerifier, feature_layers
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.serving import RequestTiming, summarize
from specpolicy.core.stopping import StopStrings
from specpolicy.core.types import GenerationResult


@dataclass(frozen=True)
class BatchResult:
    """What the batched loop produced.

    Attributes:
        results: request index -> its ``GenerationResult`` (``wall_s``: admission to finish;
            ``prefill_ms``: its prefill, both models), for every request not skipped.
        timings: request index -> its ``specpolicy.core.serving.RequestTiming``.
        skipped: request index -> the one-line reason it was skipped (e.g. a prompt too long).
        wall_s: the run's wall-clock seconds, first arrival to last finish.
        verify_tokens: per round, the tokens the target verified over all rows (sum of ``k_i + 1``).
        batch_sizes: per round, the requests in flight.
        padded_tokens: per round, the tokens the target pass computed, ``rows x (1 + longest
            draft)`` (rows padded to the longest draft; ``specpolicy.analysis.batch_model`` models its cost).
        drafter_passes: per round, the most drafter forward passes a request spent drafting (0 for
            vanilla): the round's drafting steps when the passes of all requests run together.
    """

    results: dict[int, GenerationResult]
    timings: dict[int, RequestTiming]
    skipped: dict[int, str]
    wall_s: float
    verify_tokens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    padded_tokens: tuple[int, ...] = ()
    drafter_passes: tuple[int, ...] = ()

    def summary(self) -> dict[str, float]:
        """Throughput and TTFT / TPOT / latency statistics (``specpolicy.core.serving.summarize``),
        plus rounds and the mean requests in flight per round."""
        out = summarize([self.timings[i] for i in sorted(self.timings)], self.wall_s)
        out["rounds"] = float(len(self.batch_sizes))
        out["mean_batch_size"] = sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0
        return out


def generate_batch(
    prompts: list[torch.Tensor],
    verifier,
    runtime: Runtime,
    *,
    max_new_tokens: int,
    batch_size: int,
    drafter: Drafter | None = None,
    policy: LengthPolicy | None = None,
    arrivals: list[float] | None = None,
    sampling: SamplingConfig | None = None,
    stop: StopStrings | None = None,
    reuse: DraftReuse | None = None,
) -> BatchResult:
    """Decode ``prompts`` with up to ``batch_size`` in flight (see the module docstring).

    Args:
        prompts: ``(P_i,) int64`` prompt ids per request.
        verifier (specpolicy.core.verifier.Verifier): the run's ``hf`` verifier (its model, context
            and stop tokens serve the batch).
        runtime: device, dtype.
        max_new_tokens: per request, >= 1.
        batch_size: requests in flight at most, >= 1.
        drafter: the drafter, with ``policy`` (both: speculative; neither: vanilla batched decoding);
            copied per request.
        policy: the length policy, copied per request.
        arrivals: seconds from the start at which each request arrives (default: all at 0;
            ``specpolicy.core.serving.arrival_times``), non-decreasing.
        sampling: None or greedy: every request's output is its greedy output; otherwise lossless
            speculative sampling per request (the draws from ``runtime.generator``, in round and
            row order: a request's sample depends on what shares its batch, its distribution does not).
        stop: optional stop strings (``specpolicy.core.stopping.StopStrings``): each request matches
            them on its own output (a copy per request) and leaves the batch after the token
            completing the first one, as it does alone.
        reuse: optional draft reuse by suffix matching (FailFast App. E, ``specpolicy.core.reuse``):
            each request extends its chain draft from its own previous round's rejected tail (a
            copy per request), after the round's drafting and timed with it, as alone.
    Returns:
        a ``BatchResult``.
    Raises:
        ValueError: for ``max_new_tokens`` or ``batch_size`` < 1, a drafter without a policy (or
            the reverse), a tree policy, or ``arrivals`` of the wrong length.
    """
    sampling = None if sampling is None or sampling.is_greedy else sampling
    how = Decoding(max_new_tokens, drafter, policy, reuse if drafter is not None else None, stop, sampling)
    how.check()  # max_new_tokens, drafter and policy together (as generate)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"generation.batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(policy, TreePolicy):
        raise ValueError(f"policy={policy.name} drafts trees; the batched loop verifies chains (use batch_size=1)")
    arrivals = [0.0] * len(prompts) if arrivals is None else list(arrivals)
    if len(arrivals) != len(prompts):
        raise ValueError(f"got {len(arrivals)} arrival times for {len(prompts)} prompts")
    if not isinstance(verifier, BatchedVerifier):
        raise ValueError(
            f"verifier {getattr(verifier, 'name', type(verifier).__name__)!r} has no batched form "
            "(Verifier.batched()); the batched loop needs one (verifier=hf has it)"
        )
    with torch.inference_mode():
        # a verifier whose batched form sizes a cache takes the batch size (the compiled runtime's)
        takes_slots = "slots" in inspect.signature(verifier.batched).parameters
        target = verifier.batched(slots=batch_size) if takes_slots else verifier.batched()
        target.sampling = sampling
        target.feature_layers = feature_layers(drafter)
        if drafter is not None:  # the drafter the requests copy (Drafter.batched)
            how = dataclasses.replace(how, drafter=drafter.batched(batch_size))
        out = run_loop(
            prompts, target, runtime, how, slots=batch_size, arrivals=arrivals, own_state=True, plan_batches=True
        )
    results = {i: dataclasses.replace(r, output_ids=r.output_ids.clone()) for i, r in out.results.items()}
    return BatchResult(
        results,
        out.timings,
        {i: str(error) for i, error in out.errors.items()},
        out.wall_s,
        tuple(out.verify_tokens),
        tuple(out.batch_sizes),
        tuple(out.padded_tokens),
        tuple(out.drafter_passes),
    )
