"""Figures added to every ``summary.json`` beyond the measured ones: modeled latency for the
configured hardware profile (``specpolicy.latency``) and the oracle length policy
(``specpolicy.oracle``, rounds source). Both are computed from the recorded rounds after the
timed decoding, so they never affect measured times."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specpolicy.accounting import with_pass_accounting
from specpolicy.latency import LatencyProfile, field, load_profile, modeled_summary
from specpolicy.metrics import prompt_parts
from specpolicy.oracle import CostModel, compare

#: Profile used when the config has no ``profile`` node (e.g. summaries built outside the CLI).
DEFAULT_PROFILE = "a6000-qwen7b"
#: The oracle may always speculate at least this far (FailFast's N_max default).
ORACLE_MIN_MAX_LENGTH = 60


def profile_from(config: Mapping[str, Any] | None) -> LatencyProfile:
    """The run's latency profile: the ``profile`` config node, else the default profile.

    Raises:
        ValueError: for an invalid ``profile`` node (naming the key).
    """
    node = (config or {}).get("profile")
    return LatencyProfile.from_config(node) if node else load_profile(DEFAULT_PROFILE)


def extend_summary(summary: dict[str, Any], spec_results: Sequence[Any], vanilla_results: Sequence[Any],
                   rows: Sequence[dict[str, Any]], config: Mapping[str, Any] | None) -> None:
    """Add ``modeled_speedup_vs_vanilla``, ``modeled_profile``, ``modeled`` (see
    ``latency.modeled_summary``; labelled MODELED) and ``oracle`` (the policy's modeled speedup as
    a fraction of the oracle's, overall and per prompt) to ``summary`` in place."""
    spec_parts = [prompt_parts(res) for res in spec_results]  # GenerationResult or results.jsonl-style dicts
    spec_rounds = [r for _, _, rounds in spec_parts for r in rounds]
    van_rounds = [r for res in vanilla_results for r in prompt_parts(res)[2]]
    tokens = sum(t for t, _, _ in spec_parts)
    profile = profile_from(config)
    modeled_rounds = spec_rounds
    if profile.pass_accounting != "project":  # count the passes as the official FailFast harness does
        drafter = (config or {}).get("drafter") or {}
        if any("prompt_tokens" not in row for row in rows):
            raise ValueError(f"profile.pass_accounting={profile.pass_accounting} needs each row's prompt_tokens")
        modeled_rounds = with_pass_accounting([(rounds, int(row["prompt_tokens"]))
                                               for (_, _, rounds), row in zip(spec_parts, rows)],
                                              profile.pass_accounting, str(drafter.get("name", "")),
                                              drafter.get("block_size"))
    modeled = modeled_summary(modeled_rounds, tokens, profile, van_rounds)
    summary["modeled_speedup_vs_vanilla"] = modeled["speedup_vs_vanilla"]
    summary["modeled_profile"] = modeled["profile"]["name"]
    summary["modeled"] = modeled
    if not spec_rounds:
        return
    cost = CostModel.fit(spec_rounds, [field(r, "verify_ms") for r in van_rounds])
    max_length = max([ORACLE_MIN_MAX_LENGTH] + [field(r, "speculation_length") for r in spec_rounds])
    oracle = compare(rows, cost, max_length)
    summary["oracle"] = {
        **{k: oracle[k] for k in ("definition", "source", "fraction_of_oracle", "policy_speedup_modeled",
                                  "oracle_speedup_modeled", "censored_positions", "cost_model")},
        "max_length": max_length,
        "fraction_by_prompt": {p["prompt_id"]: p["fraction_of_oracle"] for p in oracle["per_prompt"]},
    }
