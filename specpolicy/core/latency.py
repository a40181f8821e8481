"""Modeled latency: what a run's rounds would cost on other hardware (hardware profiles).

A profile (``conf/profile/``, chosen with ``profile=<name>``) gives per-pass latencies; the
modeled time of a run counts forward passes and multiplies, as FailFast (arXiv 2512.20573)
models end-to-end latency from pass counts (official code ``failfast.py``,
``args.latency["vLLM_A6000"]``: drafter pass 6.1 ms; target 13.5 / 24.7 / 52.6 ms per token for
Qwen2.5-7B / 14B / 32B-Instruct on vLLM, one RTX A6000)::

    modeled ms of a round  = drafter passes x drafter_pass_ms
                             + target_ms_per_token + verify_ms_per_draft_token x speculation length
    modeled ms of vanilla  = generated tokens x target_ms_per_token      (one target step per token)
    modeled speedup        = modeled vanilla ms / sum of the rounds' modeled ms

Prefill is left out of both. ``pass_accounting`` says which drafter pass count enters the formula:
``project`` (default) = the passes this project's drafter actually ran (``drafter_forward_passes``);
``official`` = the count the official FailFast harness would report for the same rounds (its
drafter re-prefills committed blocks in most rounds, counts the prompt prefill, and spends one more
pass when a draft ends on a block's first token; ``specpolicy.core.accounting``), so a MODELED figure can
be computed the way the paper computed it. On a GPU a verification pass over a short draft is memory-bound
and costs about one decoding step, hence ``verify_ms_per_draft_token: 0`` in the A6000
profiles; the ``measured`` profile fills its null fields from the run's own timings (this
machine, where verification grows with the draft). Every figure computed here is MODELED,
not measured, and is labelled so in ``summary.json`` (``modeled`` block).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Any, cast

from specpolicy.core.accounting import PASS_ACCOUNTINGS
from specpolicy.core.types import RoundRecord

#: Profiles shipped in ``conf/profile/`` (the built-in ones, modeled in every summary).
BUILTIN_PROFILES = ("a6000-qwen7b", "a6000-qwen14b", "a6000-qwen32b", "measured")
PROFILE_KEYS = (
    "name",
    "description",
    "drafter_pass_ms",
    "drafter_pass_ms_by_drafter",
    "target_ms_per_token",
    "verify_ms_per_draft_token",
    "pass_accounting",
    "target_params",
    "peak_tflops",
    "compute_efficiency",
)
#: The optional keys of the batched-verification roofline (``specpolicy.analysis.batch_model``): (key, unit).
ROOFLINE_KEYS = (("target_params", "parameters"), ("peak_tflops", "TFLOP/s"), ("compute_efficiency", "a fraction"))
MODELED_LABEL = "MODELED (forward-pass counts x the profile's latencies), not measured"


def fit_affine(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope * x``; ``(intercept, slope)``. With fewer than two
    distinct x the slope is 0 and the intercept the mean of y (0.0 for no points)."""
    n = len(xs)
    if n == 0:
        return 0.0, 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


class NotEstimable(ValueError):
    """A figure that a run's own measurements cannot estimate; ``str(error)`` says why (shown as
    ``n/a (<why>)``, never as a number)."""


def step_problem(points: Sequence[tuple[float, float]]) -> str | None:
    """Why ``points`` -- ``(speculation length, verify_ms)`` of a run's rounds -- cannot give the
    time of a plain target decoding step (length 0), or None when they can.

    They can when a point has length 0 (a vanilla decoding step, or a round the policy decoded
    plainly). Otherwise the step is the intercept of the affine fit, an extrapolation to length 0,
    which needs two distinct lengths and must be at least what a verification spent per target
    position (``sum verify_ms / sum (length + 1)``: one forward pass over ``length + 1`` positions
    never costs more than ``length + 1`` single steps). Short runs without the vanilla baseline
    (``run.vanilla_baseline=false``) often fail that: the fit's noise then puts the intercept near
    or below 0, and every figure that divides by it would read 0.00x."""
    if any(x == 0 for x, _ in points):
        return None
    if not points:
        return "no round was measured"
    lengths = sorted({int(x) for x, _ in points})
    if len(lengths) < 2:
        return (
            f"no vanilla decoding step was measured (run.vanilla_baseline=false) and every round has "
            f"speculation length {lengths[0]}: nothing to extrapolate a plain target step (length 0) from"
        )
    intercept, _ = fit_affine([x for x, _ in points], [y for _, y in points])
    floor = sum(y for _, y in points) / sum(x + 1 for x, _ in points)
    if intercept < floor:
        return (
            f"no vanilla decoding step was measured (run.vanilla_baseline=false), and extrapolating the "
            f"verification times of lengths {lengths[0]}..{lengths[-1]} to length 0 gives a target step of "
            f"{intercept:.3g} ms, below the {floor:.3g} ms per position a verification took: too few or too "
            f"noisy rounds to estimate it"
        )
    return None


@dataclass(frozen=True)
class LatencyProfile:
    """Per-pass latencies of one hardware setting, in milliseconds.

    Attributes:
        name: profile name (``profile=<name>``).
        description: what hardware/models the numbers are for.
        drafter_pass_ms: one drafter forward pass, >= 0 (None: measure in the run).
        target_ms_per_token: one target decoding step, > 0 (None: measure in the run).
        verify_ms_per_draft_token: extra verification ms per drafted token, >= 0 (None: measure).
        pass_accounting: ``"project"`` (the passes this project ran) or ``"official"`` (the official
            FailFast harness's count of the same rounds; ``specpolicy.core.accounting``).
        drafter_pass_ms_by_drafter: per drafter name (``drafter=``), a pass cost that replaces
            ``drafter_pass_ms`` for that drafter (DFlash and EAGLE-3 passes cost far less than a
            1.5B drafter's: ``specpolicy.analysis.gpu_pass_model``); ``for_drafter`` applies it.
        target_params: the target's parameters, > 0 (None: no batched roofline).
        peak_tflops: the GPU's dense tensor peak in TFLOP/s at the target's dtype, > 0 (None: no
            batched roofline).
        compute_efficiency: the fraction of ``peak_tflops`` a batched pass reaches, in (0, 1]
            (None: ``specpolicy.analysis.batch_model.COMPUTE_EFFICIENCY``). These three feed the MODELED
            throughput of the batched loop (``specpolicy.analysis.batch_model``) only.
    """

    name: str
    description: str = ""
    drafter_pass_ms: float | None = None
    target_ms_per_token: float | None = None
    verify_ms_per_draft_token: float | None = 0.0
    pass_accounting: str = "project"
    drafter_pass_ms_by_drafter: dict[str, float] = field(default_factory=dict)
    target_params: float | None = None
    peak_tflops: float | None = None
    compute_efficiency: float | None = None

    def for_drafter(self, drafter: str | None) -> LatencyProfile:
        """This profile with ``drafter``'s own pass cost when it lists one (else unchanged)."""
        if drafter in self.drafter_pass_ms_by_drafter:
            return replace(self, drafter_pass_ms=self.drafter_pass_ms_by_drafter[drafter])
        return self

    @property
    def complete(self) -> bool:
        """True when no latency is left to measure."""
        return None not in (self.drafter_pass_ms, self.target_ms_per_token, self.verify_ms_per_draft_token)

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> LatencyProfile:
        """A profile from a ``profile`` config node.

        Raises:
            ValueError: naming ``profile.<key>`` for an unknown key or a negative / non-numeric value
                (``target_ms_per_token``, ``target_params`` and ``peak_tflops`` must be > 0,
                ``compute_efficiency`` in (0, 1]).
        """
        unknown = sorted(set(config) - set(PROFILE_KEYS))
        if unknown:
            raise ValueError(f"unknown profile key(s) {unknown}; known: {', '.join(PROFILE_KEYS)}")
        if not config.get("name"):
            raise ValueError("profile.name is required")
        values: dict[str, Any] = {}
        for key in ("drafter_pass_ms", "target_ms_per_token", "verify_ms_per_draft_token"):
            v = config.get(key)
            if v is not None:
                positive = key == "target_ms_per_token"
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
                    raise ValueError(
                        f"profile.{key} must be a number {'> 0' if positive else '>= 0'} "
                        f"(ms) or null (measured), got {v!r}"
                    )
                v = float(v)
            values[key] = v
        by_drafter = config.get("drafter_pass_ms_by_drafter") or {}
        if not isinstance(by_drafter, Mapping) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in by_drafter.values()
        ):
            raise ValueError(
                f"profile.drafter_pass_ms_by_drafter must map drafter names to numbers >= 0 (ms), got {by_drafter!r}"
            )
        values["drafter_pass_ms_by_drafter"] = {str(k): float(v) for k, v in by_drafter.items()}
        accounting = config.get("pass_accounting") or "project"
        if accounting not in PASS_ACCOUNTINGS:
            raise ValueError(
                f"profile.pass_accounting must be one of {', '.join(PASS_ACCOUNTINGS)}, got {accounting!r}"
            )
        values["pass_accounting"] = accounting
        for key, unit in ROOFLINE_KEYS:
            v = config.get(key)
            if v is not None:
                bound = 1.0 if key == "compute_efficiency" else float("inf")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= bound or v == float("inf"):
                    raise ValueError(
                        f"profile.{key} must be a number {'in (0, 1]' if bound == 1 else '> 0'} "
                        f"({unit}) or null, got {v!r}"
                    )
                v = float(v)
            values[key] = v
        return LatencyProfile(name=str(config["name"]), description=str(config.get("description") or ""), **values)


def load_profile(name: str) -> LatencyProfile:
    """A profile shipped in ``conf/profile/<name>.yaml``.

    Raises:
        FileNotFoundError: for an unknown name (listing the shipped ones).
    """
    from omegaconf import OmegaConf

    file = resources.files("specpolicy.conf") / "profile" / f"{name}.yaml"
    if not file.is_file():
        raise FileNotFoundError(f"no latency profile {name!r}; shipped: {', '.join(BUILTIN_PROFILES)}")
    return LatencyProfile.from_config(
        cast(Mapping[str, Any], OmegaConf.to_container(OmegaConf.create(file.read_text())))
    )


def measure_profile(
    spec_rounds: Iterable[RoundRecord],
    vanilla_rounds: Iterable[RoundRecord] = (),
    name: str = "measured",
    description: str = "this machine, measured in the run",
) -> LatencyProfile:
    """Latencies measured from a run's rounds.

    * ``drafter_pass_ms`` = sum of ``draft_ms`` / sum of ``drafter_forward_passes`` over rounds
      with passes (0.0 for a model-free drafter);
    * ``verify_ms_per_draft_token`` and the intercept of an affine least-squares fit of
      ``verify_ms`` over the speculation length, on speculative and vanilla rounds together
      (slope clamped at >= 0);
    * ``target_ms_per_token`` = mean ``verify_ms`` of the vanilla rounds (one target step each),
      or the fit's intercept without vanilla rounds.

    Raises:
        NotEstimable: without vanilla rounds, when the rounds cannot give a target step
            (``step_problem``: e.g. ``run.vanilla_baseline=false`` with too few or too noisy rounds).
    """
    spec_rounds, vanilla_rounds = list(spec_rounds), list(vanilla_rounds)
    passes = sum(r.drafter_forward_passes for r in spec_rounds)
    draft_ms = sum(r.draft_ms for r in spec_rounds if r.drafter_forward_passes > 0)
    points = [(r.speculation_length, r.verify_ms) for r in spec_rounds + vanilla_rounds]
    problem = step_problem(points)
    if problem:
        raise NotEstimable(problem)
    intercept, slope = fit_affine([p[0] for p in points], [p[1] for p in points])
    van = [r.verify_ms for r in vanilla_rounds]
    target = sum(van) / len(van) if van else intercept
    return LatencyProfile(
        name=name,
        description=description,
        drafter_pass_ms=draft_ms / passes if passes else 0.0,
        target_ms_per_token=max(target, 1e-9),
        verify_ms_per_draft_token=max(slope, 0.0),
    )


def resolve_profile(
    profile: LatencyProfile, spec_rounds: Iterable[RoundRecord], vanilla_rounds: Iterable[RoundRecord] = ()
) -> LatencyProfile:
    """``profile`` with its null latencies filled from the run (``measure_profile``).

    Raises:
        NotEstimable: when a null latency cannot be measured from these rounds.
    """
    if profile.complete:
        return profile
    measured = measure_profile(spec_rounds, vanilla_rounds)
    return replace(
        profile,
        **{
            k: getattr(measured, k)
            for k in ("drafter_pass_ms", "target_ms_per_token", "verify_ms_per_draft_token")
            if getattr(profile, k) is None
        },
    )


def modeled_round_ms(record: Any, profile: LatencyProfile) -> float:
    """Modeled ms of one round (see module docstring). ``profile`` must be complete."""
    return (
        record.drafter_forward_passes * profile.drafter_pass_ms
        + profile.target_ms_per_token
        + profile.verify_ms_per_draft_token * record.speculation_length
    )


def modeled_ms(rounds: Iterable[RoundRecord], profile: LatencyProfile) -> float:
    """Modeled ms of a sequence of rounds (prefill excluded)."""
    return sum(modeled_round_ms(r, profile) for r in rounds)


def modeled_speedup(rounds: Sequence[RoundRecord], generated_tokens: int, profile: LatencyProfile) -> float:
    """Modeled vanilla ms (``generated_tokens`` target steps) / modeled ms of ``rounds``; 0.0 without rounds."""
    ms = modeled_ms(rounds, profile)  # a complete profile (modeled_round_ms): target_ms_per_token is set
    return generated_tokens * cast(float, profile.target_ms_per_token) / ms if ms > 0 else 0.0


def modeled_summary(
    spec_rounds: Sequence[RoundRecord],
    generated_tokens: int,
    profile: LatencyProfile,
    vanilla_rounds: Sequence[RoundRecord] = (),
    all_profiles: Iterable[str] = BUILTIN_PROFILES,
    drafter: str | None = None,
) -> dict[str, Any]:
    """The ``modeled`` block of ``summary.json``.

    Args:
        spec_rounds: every round of the speculative method (all prompts), their
            ``drafter_forward_passes`` counted under ``profile.pass_accounting`` (the caller converts
            them: ``specpolicy.core.accounting.with_pass_accounting``); every profile of
            ``speedup_by_profile`` is modeled on the same counts.
        generated_tokens: tokens the method generated (= vanilla's when lossless).
        profile: the selected profile (``profile=``); null latencies are measured from the rounds.
        vanilla_rounds: the vanilla baseline's rounds (for the ``measured`` profile).
        all_profiles: shipped profiles also modeled, for the ``speedup_by_profile`` table.
        drafter: the run's drafter name: every profile's ``for_drafter`` pass cost applies.
    Returns:
        ``{"label", "pass_accounting", "profile" (resolved, as a dict), "speedup_vs_vanilla", "ms",
        "vanilla_ms", "speedup_by_profile": {name: speedup}}``, plus ``"unavailable": {name: why}``
        for the profiles whose latencies the run cannot measure (``NotEstimable``: their speedup is
        None -- ``n/a``, never a number; the selected profile's ``speedup_vs_vanilla``, ``ms`` and
        ``vanilla_ms`` too when it is one of them).
    """
    unavailable: dict[str, str] = {}

    def resolved_or_none(p: LatencyProfile) -> LatencyProfile | None:
        try:
            return resolve_profile(p, spec_rounds, vanilla_rounds)
        except NotEstimable as why:
            unavailable[p.name] = str(why)
            return None

    resolved = resolved_or_none(profile.for_drafter(drafter))
    by_profile: dict[str, float | None] = {}
    for name in all_profiles:
        p = resolved if name == profile.name else resolved_or_none(load_profile(name).for_drafter(drafter))
        by_profile[name] = None if p is None else modeled_speedup(spec_rounds, generated_tokens, p)
    shown = resolved or profile.for_drafter(drafter)
    accounting = "" if shown.pass_accounting == "project" else f"; {shown.pass_accounting} pass accounting"
    out = {
        "label": f"{MODELED_LABEL}; profile {shown.name}: {shown.description}{accounting}",
        "pass_accounting": shown.pass_accounting,
        "profile": asdict(shown),
        "speedup_vs_vanilla": None if resolved is None else modeled_speedup(spec_rounds, generated_tokens, resolved),
        "ms": None if resolved is None else modeled_ms(spec_rounds, resolved),
        "vanilla_ms": None if resolved is None else generated_tokens * cast(float, resolved.target_ms_per_token),
        "speedup_by_profile": by_profile,
    }
    if unavailable:
        out["unavailable"] = unavailable
    return out
