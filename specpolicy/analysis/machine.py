"""Honest timings: what the machine was doing while a run measured its speedup.

A measured speedup compares two wall-clock times taken in the same run; other processes on the
machine slow both, but not alike (they come and go), so on a busy machine the figure can be far
off (0.71x measured where an idle machine gives 1.22x). ``MachineWatch`` records, per
invocation of a run:

* ``load_average_start`` / ``load_average_end``: ``os.getloadavg()`` (1, 5, 15 min) before the
  first prompt and after the last -- runnable processes, this one included;
* ``cpu_count``: CPUs this process may use (``os.sched_getaffinity``, else ``os.cpu_count``);
* ``process_cpu_s`` / ``wall_s`` / ``cpu_per_wall``: CPU seconds of this process (all threads,
  ``time.process_time``) against wall-clock seconds over the same span, and their ratio (the
  cores this process kept busy on average);
* ``vanilla_tokens_per_s_cv``: the spread of vanilla decoding's speed across prompts (standard
  deviation / mean, over every row of the run, resumed ones included), the speed of a prompt
  being its generated tokens per second of target forward passes (``vanilla_verify_ms``; prefill
  excluded, so short outputs do not look slow): vanilla decoding does nearly the same work per
  token on every prompt, so a large spread means the machine's speed changed during the run;

and judges them (``timing_trusted``, ``timing_warnings``): the speedup cannot be trusted when
the load from other processes -- the 1-minute load average less this process's own
``cpu_per_wall`` -- exceeded the CPUs this process did not use (``cpu_count - cpu_per_wall``)
by more than ``LOAD_TOLERANCE``, at the start or the end; or when ``vanilla_tokens_per_s_cv``
exceeds ``MAX_VANILLA_CV``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: Largest coefficient of variation of vanilla tokens/s across prompts for a trusted timing.
MAX_VANILLA_CV = 0.25
#: CPUs of load from other processes tolerated beyond the CPUs this process left free.
LOAD_TOLERANCE = 0.5
#: Least prompts with a vanilla timing for the spread to be judged.
MIN_PROMPTS_FOR_SPREAD = 3


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    """``os.getloadavg()`` rounded to 0.01 (1, 5, 15 min), or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def vanilla_spread(results: Iterable[Any]) -> float | None:
    """Coefficient of variation (population std / mean) of vanilla decoding's speed over
    ``results`` (``specpolicy.analysis.results.PromptResult``; skipped ones and those without a baseline
    are left out): generated tokens per second of its rounds' ``verify_ms`` (its ``wall_s`` when
    it has no verify time), rounded to 0.001; None with fewer than ``MIN_PROMPTS_FOR_SPREAD``
    timed prompts."""
    speeds = []
    for r in results:
        van = None if getattr(r, "skipped", None) else r.vanilla
        if van is None:
            continue
        seconds = sum(rd.verify_ms for rd in van.rounds) / 1e3 or van.wall_s
        if seconds > 0 and van.generated_tokens:
            speeds.append(van.generated_tokens / seconds)
    if len(speeds) < MIN_PROMPTS_FOR_SPREAD:
        return None
    mean = sum(speeds) / len(speeds)
    return round(math.sqrt(sum((s - mean) ** 2 for s in speeds) / len(speeds)) / mean, 3) if mean > 0 else None


def judge(conditions: Mapping[str, Any]) -> list[str]:
    """The reasons (one short phrase each) why the timings of ``conditions`` (the
    ``timing_conditions`` block) cannot be trusted; empty when they can."""
    reasons = []
    cores = conditions["cpu_count"]
    own = conditions.get("cpu_per_wall") or 0.0
    loads = {when: conditions.get(f"load_average_{when}") for when in ("start", "end")}
    loads = {when: load[0] for when, load in loads.items() if load}
    if any(load - own > cores - own + LOAD_TOLERANCE for load in loads.values()):
        busiest = max(loads.values()) - own
        reasons.append(
            f"other processes kept up to {busiest:.1f} of {cores} CPUs busy (1-min load average "
            + ", ".join(f"{load:.2f} at the {when}" for when, load in loads.items())
            + f"; this process used {own:.1f})"
        )
    cv = conditions.get("vanilla_tokens_per_s_cv")
    if cv is not None and cv > MAX_VANILLA_CV:
        reasons.append(
            f"vanilla decoding speed varied {cv:.0%} across prompts (coefficient of variation; "
            f"more than {MAX_VANILLA_CV:.0%})"
        )
    return reasons


class MachineWatch:
    """Samples the machine at ``start()`` and ``stop(rows)`` (see the module docstring)."""

    def __init__(self) -> None:
        self._start: tuple[list[float] | None, float, float] | None = None

    def start(self) -> None:
        self._start = (load_average(), time.process_time(), time.perf_counter())

    @property
    def started(self) -> bool:
        """Whether ``start()`` was called (``stop`` needs it)."""
        return self._start is not None

    def stop(self, results: Iterable[Any]) -> dict[str, Any]:
        """The ``timing_conditions`` block of ``summary.json`` for the span since ``start()``
        (``results``: the run's ``PromptResult``s, for ``vanilla_spread``)."""
        if self._start is None:
            raise RuntimeError("MachineWatch.stop() before start()")
        load_start, cpu0, wall0 = self._start
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        conditions: dict[str, Any] = {
            "cpu_count": cpu_count(),
            "load_average_start": load_start,
            "load_average_end": load_average(),
            "process_cpu_s": round(cpu_s, 3),
            "wall_s": round(wall_s, 3),
            "cpu_per_wall": round(cpu_s / wall_s, 3) if wall_s > 0 else None,
            "vanilla_tokens_per_s_cv": vanilla_spread(results),
        }
        reasons = judge(conditions)
        conditions["timing_trusted"] = not reasons
        conditions["timing_warnings"] = reasons
        return conditions


def warning_line(conditions: Mapping[str, Any] | None) -> str | None:
    """The one line printed under the summary when the speedup cannot be trusted, else None."""
    if not conditions or conditions.get("timing_trusted", True):
        return None
    return (
        "WARNING: the measured speedup cannot be trusted: "
        + "; ".join(conditions["timing_warnings"])
        + " -- re-time on an idle machine with run.resume=false (runtime.threads=N sets the CPU threads a run uses)"
    )


#: The mark put next to a measured figure whose timings cannot be trusted (tables, pages, figures),
#: explained once by ``UNTRUSTED_NOTE`` beside it.
UNTRUSTED_MARK = "*"
UNTRUSTED_NOTE = (
    "timing cannot be trusted: the machine was busy or its speed varied while the run measured "
    "(summary.json: timing_conditions.timing_trusted false); re-time on an idle machine with "
    "run.resume=false"
)


def timing_trusted(summary: Mapping[str, Any] | None) -> bool | None:
    """Whether the measured timings of a run (its ``summary.json``) can be trusted: the
    ``timing_conditions.timing_trusted`` the run recorded; None when it recorded none (a summary
    written before timing conditions were recorded, or by a benchmark)."""
    conditions = (summary or {}).get("timing_conditions")
    if not isinstance(conditions, Mapping) or "timing_trusted" not in conditions:
        return None
    return bool(conditions["timing_trusted"])


def untrusted_reasons(summary: Mapping[str, Any] | None) -> list[str]:
    """Why a run's timings cannot be trusted (``timing_conditions.timing_warnings``); empty when
    they can, or when the run recorded no timing conditions."""
    if timing_trusted(summary) is not False:
        return []
    return [str(w) for w in summary["timing_conditions"].get("timing_warnings") or []] or ["no reason recorded"]
