"""MODELED throughput of the batched loop on a GPU: a roofline for the target's batched pass.

The batch-1 profiles (``specpolicy.core.latency``) charge a verification one memory-bound target step
whatever the draft: on a GPU a pass over a few tokens reads every weight once and costs about a
decoding step. A round of the batched loop verifies ``rows x (1 + longest draft)`` tokens in one
target pass (``BatchResult.padded_tokens``, rows padded to the longest draft), and past some
count a pass is bound by the GPU's arithmetic, not by its memory. The roofline (Williams, Waterman
and Patterson, "Roofline: an insightful visual performance model for multicore architectures",
CACM 2009) takes the larger of the two::

    target pass over T tokens (ms)  = max(target_ms_per_token, T x ms_per_token_compute)
    ms_per_token_compute            = 2 x target_params / (peak_tflops x 1e12 x compute_efficiency) x 1e3
    modeled ms of a round           = drafter_passes x drafter_pass_ms + target pass over padded_tokens
    modeled throughput (tokens/s)   = generated tokens / sum of the rounds' modeled seconds

* ``target_ms_per_token``: the profile's memory-bound decoding step (FailFast's vLLM latencies on
  one RTX A6000, arXiv 2512.20573: 13.5 / 24.7 / 52.6 ms for Qwen2.5-7B / 14B / 32B-Instruct).
* 2 FLOPs per target parameter per token: the forward pass's matrix products (Kaplan et al. 2020,
  "Scaling laws for neural language models": C_forward ~ 2N). Attention over the context is left
  out; the input embedding (a lookup, no FLOPs) is counted -- a few percent too many FLOPs, so the
  knee comes a little early.
* ``target_params``: Qwen2.5-7B / 14B / 32B-Instruct, 7.6e9 / 14.8e9 / 32.8e9 (the Hugging Face
  safetensors counts; the model cards say 7.61B / 14.7B / 32.5B).
* ``peak_tflops``: the RTX A6000's dense FP16 / BF16 tensor peak with FP32 accumulate, 154.8
  TFLOP/s (NVIDIA RTX A6000 datasheet; its 309.7 assumes structured sparsity, not used here).
* ``compute_efficiency``: the fraction of that peak a real pass reaches, 0.6 in the A6000 profiles
  (``COMPUTE_EFFICIENCY``, the default when a profile gives none): an assumption, not a
  measurement, and the model's softest number -- the knee grows in proportion to it (at 0.8 it
  moves a third higher).

The knee, the tokens from which a pass is compute-bound (``knee_tokens`` =
``target_ms_per_token / ms_per_token_compute``): ~82 tokens for 7B (0.164 ms per token), ~78 for
14B (0.319 ms), ~74 for 32B (0.706 ms). It is consistent with the README's remark that
verification on the A6000 is near-flat up to ~64 tokens (the ground of the batch-1 profiles'
``verify_ms_per_draft_token: 0``): every knee is above 64, so a single request's draft of up to
64 tokens still costs one decoding step here, while 16 requests drafting 4 tokens each (80 padded
tokens) are past every knee.

Drafting (an assumption, stated): on a GPU the drafter's passes of a round run for all requests at
once -- one pass per drafting step over every request still drafting, as EAGLE-3's ``draft_many``
does here -- so a round's drafting costs its most drafter passes of any request
(``BatchResult.drafter_passes``) x the profile's pass ms for the run's drafter
(``LatencyProfile.for_drafter``), whatever the batch size: a drafter pass is taken to stay
memory-bound (its own compute bound is not modeled). The drafters that draft request by request
on this CPU are modeled as batched too.

Left out, as in the batch-1 model: prefill, the commit of accepted tokens to the drafter, and the
loop's own work. The profile's ``verify_ms_per_draft_token`` is not used (the roofline gives what
a verified token costs; it is 0 in the A6000 profiles). Vanilla batched decoding is the same
formula on its own rounds (one token per row, no drafter), so the ratio of two modeled throughputs
at the same batch size is the modeled speedup there (vanilla's own: 1). A profile without
``target_params`` or ``peak_tflops`` -- ``measured`` -- gets no batched figure: the model does not
apply, and the reason is reported instead of a number. Every figure here is MODELED, not measured,
and labelled ``BATCH_MODELED_LABEL``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specpolicy.core.latency import BUILTIN_PROFILES, LatencyProfile, load_profile

#: Fraction of the GPU's tensor peak a batched target pass reaches when a profile gives no
#: ``compute_efficiency`` (an assumption; see the module docstring).
COMPUTE_EFFICIENCY = 0.6
BATCH_MODELED_LABEL = (
    "MODELED (roofline: a target pass over T tokens costs max(one decoding step, "
    "T x 2 x target params / (peak FLOP/s x efficiency)); drafter passes batched across "
    "requests, x the profile's pass ms), not measured"
)


@dataclass(frozen=True)
class RoundCounts:
    """What the model reads of a run (or of several runs, added with ``+``).

    Attributes:
        padded_tokens: per round, the tokens the target pass computed (rows x (1 + longest draft)).
        drafter_passes: per round, the most drafter forward passes a request spent (0 for vanilla).
        tokens: tokens generated over all requests.
    """

    padded_tokens: tuple[int, ...] = ()
    drafter_passes: tuple[int, ...] = ()
    tokens: int = 0

    @staticmethod
    def of(result: Any) -> RoundCounts:
        """The counts of a ``specpolicy.core.batching.BatchResult``."""
        return RoundCounts(
            tuple(result.padded_tokens), tuple(result.drafter_passes), sum(t.tokens for t in result.timings.values())
        )

    @staticmethod
    def of_rounds(rounds: Iterable[Any], tokens: int) -> RoundCounts:
        """The counts of batch-1 chain rounds (``RoundRecord``s of ``specpolicy.core.decoding.generate``):
        one row of ``1 + speculation length`` tokens per target pass."""
        rounds = list(rounds)
        return RoundCounts(
            tuple(1 + r.speculation_length for r in rounds), tuple(r.drafter_forward_passes for r in rounds), tokens
        )

    def __add__(self, other: RoundCounts) -> RoundCounts:
        return RoundCounts(
            self.padded_tokens + other.padded_tokens,
            self.drafter_passes + other.drafter_passes,
            self.tokens + other.tokens,
        )


def why_not_modeled(profile: LatencyProfile) -> str | None:
    """Why the roofline does not apply to ``profile`` (a sentence), or None when it does."""
    missing = [k for k in ("target_params", "peak_tflops") if getattr(profile, k) is None]
    if missing:
        return (
            f"profile {profile.name} gives no {' or '.join(missing)}: the batched roofline does not apply "
            f"(no figure rather than an invented one)"
        )
    missing = [k for k in ("target_ms_per_token", "drafter_pass_ms") if getattr(profile, k) is None]
    if missing:
        return (
            f"profile {profile.name} leaves {' and '.join(missing)} to be measured in the run: the batched "
            f"roofline needs the GPU's own latencies"
        )
    return None


def ms_per_token_compute(profile: LatencyProfile) -> float:
    """Compute-bound ms per token of a target pass: ``2 x target_params / (peak FLOP/s x efficiency)``.

    Raises:
        ValueError: when the roofline does not apply to ``profile`` (``why_not_modeled``).
    """
    why = why_not_modeled(profile)
    if why:
        raise ValueError(why)
    efficiency = COMPUTE_EFFICIENCY if profile.compute_efficiency is None else profile.compute_efficiency
    return 2.0 * profile.target_params / (profile.peak_tflops * 1e12 * efficiency) * 1e3


def knee_tokens(profile: LatencyProfile) -> float:
    """Tokens per target pass from which it is compute-bound (``target_ms_per_token /
    ms_per_token_compute``). Raises ValueError as ``ms_per_token_compute``."""
    return profile.target_ms_per_token / ms_per_token_compute(profile)


def target_pass_ms(tokens: int, profile: LatencyProfile) -> float:
    """Modeled ms of one target pass over ``tokens`` tokens (all rows, padded), >= 1:
    ``max(target_ms_per_token, tokens x ms_per_token_compute)``. Raises ValueError as
    ``ms_per_token_compute``."""
    return max(profile.target_ms_per_token, tokens * ms_per_token_compute(profile))


def modeled_ms(counts: RoundCounts, profile: LatencyProfile, drafter: str | None = None) -> float:
    """Modeled ms of a run's rounds (prefill excluded): per round, its drafter passes x the
    profile's pass ms for ``drafter`` plus its target pass. Raises ValueError as
    ``ms_per_token_compute``."""
    pass_ms = profile.for_drafter(drafter).drafter_pass_ms
    return sum(
        passes * pass_ms + target_pass_ms(tokens, profile)
        for tokens, passes in zip(counts.padded_tokens, counts.drafter_passes, strict=True)
    )


def _rate(tokens: int, ms: float) -> float | None:
    return tokens / ms * 1e3 if ms > 0 and tokens else None


def modeled_batched(
    speculative: RoundCounts,
    vanilla: RoundCounts | None = None,
    drafter: str | None = None,
    profiles: Sequence[LatencyProfile] | None = None,
    selected: LatencyProfile | None = None,
) -> dict[str, Any]:
    """The MODELED throughput of a batched run under every profile: the one function behind every
    reported batched MODELED figure (``summary.json``'s ``serving.modeled``, the serving table,
    ``benchmarks/batched.py``).

    Args:
        speculative: the counts of the method's run (``RoundCounts.of(batch_result)``).
        vanilla: the counts of vanilla batched decoding at the same batch size, or None.
        drafter: the run's drafter name (``drafter=``): each profile's ``for_drafter`` pass ms applies.
        profiles: the profiles modeled (default: every shipped one, ``BUILTIN_PROFILES``).
        selected: the run's own profile (``profile=``): modeled in place of the shipped profile of
            its name, or after them when it has another name.
    Returns:
        ``{"label", "drafter", "by_profile": {name: {"knee_tokens", "ms_per_token_compute",
        "drafter_pass_ms", "speculative_ms", "speculative_tokens_per_s", "vanilla_ms",
        "vanilla_tokens_per_s", "throughput_speedup"}}}`` (ms and tokens/s MODELED; the vanilla
        figures and the speedup None without ``vanilla``, a throughput None without rounds or
        tokens), plus ``"unavailable": {name: why}`` for the profiles the roofline does not apply
        to (``measured``).
    """
    profiles = list(profiles) if profiles is not None else [load_profile(n) for n in BUILTIN_PROFILES]
    if selected is not None:
        names = [p.name for p in profiles]
        profiles = [selected if p.name == selected.name else p for p in profiles] + (
            [] if selected.name in names else [selected]
        )
    by_profile: dict[str, dict[str, float | None]] = {}
    unavailable: dict[str, str] = {}
    for profile in profiles:
        why = why_not_modeled(profile)
        if why:
            unavailable[profile.name] = why
            continue
        spec_ms = modeled_ms(speculative, profile, drafter)
        van_ms = modeled_ms(vanilla, profile) if vanilla is not None else None
        spec_rate = _rate(speculative.tokens, spec_ms)
        van_rate = _rate(vanilla.tokens, van_ms) if vanilla is not None else None
        by_profile[profile.name] = {
            "knee_tokens": knee_tokens(profile),
            "ms_per_token_compute": ms_per_token_compute(profile),
            "drafter_pass_ms": profile.for_drafter(drafter).drafter_pass_ms,
            "speculative_ms": spec_ms,
            "speculative_tokens_per_s": spec_rate,
            "vanilla_ms": van_ms,
            "vanilla_tokens_per_s": van_rate,
            "throughput_speedup": spec_rate / van_rate if spec_rate is not None and van_rate else None,
        }
    out: dict[str, Any] = {"label": BATCH_MODELED_LABEL, "drafter": drafter, "by_profile": by_profile}
    if unavailable:
        out["unavailable"] = unavailable
    return out
