"""The metric glossary: per-position conditional acceptance, positions past a stop unobserved,
accepted length without / with the bonus token, tokens per round, token- vs prompt-weighted
aggregates, summaries rebuilt from results.jsonl rows, and a description for every summary field."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module

from conftest import overrides
from specpolicy.analysis.metrics import (
    FIELDS,
    acceptance_by_position,
    aggregate,
    describe_fields,
    observed,
    weighted_aggregates,
)
from specpolicy.analysis.results import PromptResult
from specpolicy.core.types import GenerationResult, RoundRecord
from specpolicy.run.experiment import run_experiment


def rnd(k, a, e=None, finish="", stop="policy_bound", ms=1.0):
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=a,
        emitted_tokens=a + 1 if e is None else e,
        drafter_forward_passes=k,
        reused_tokens=0,
        draft_ms=ms,
        verify_ms=ms,
        draft_stop_reason=stop,
        finish_reason=finish,
    )


def result(tokens, wall_s, rounds):
    return GenerationResult(
        output_ids=torch.zeros(tokens, dtype=torch.long),
        rounds=tuple(rounds),
        finish_reason="",
        wall_s=wall_s,
        prefill_ms=0.0,
    )


def test_per_position_acceptance_counts_only_rounds_whose_draft_reached_the_position():
    rounds = [rnd(3, 3), rnd(3, 1), rnd(1, 0), rnd(0, 0, stop="length_0")]
    pos = acceptance_by_position(rounds)
    assert pos["position"] == [1, 2, 3]
    assert pos["drafted"] == [3, 2, 2]  # the 1-token draft never reached positions 2, 3: unobserved
    assert pos["accepted"] == [2, 1, 1]
    assert pos["rate"] == pytest.approx([2 / 3, 1 / 2, 1 / 2])
    assert pos["reached"] == [3, 2, 1]  # position 3 reached with 1..2 accepted only in the first round
    assert pos["conditional_rate"] == pytest.approx([2 / 3, 1 / 2, 1.0])


def test_positions_past_the_stop_are_unobserved():
    assert observed(rnd(5, 5, e=2, finish="eos")) == (2, 2)  # EOS on the 2nd accepted token
    assert observed(rnd(5, 1, e=2, finish="stop_string")) == (2, 1)  # the stop on the correction token
    assert observed(rnd(5, 5, e=6, finish="max_new_tokens")) == (5, 5)  # on the bonus token
    assert observed(rnd(5, 3)) == (5, 3)  # rounds that did not end generation count whole
    agg = aggregate([result(8, 1.0, [rnd(5, 5), rnd(5, 5, e=2, finish="eos")])])
    assert agg["acceptance_rate"] == pytest.approx(7 / 7)
    assert agg["finish_reasons"] == {"eos": 1}


def test_accepted_length_without_and_with_bonus_and_tokens_per_round():
    rounds = [rnd(4, 2), rnd(4, 4), rnd(0, 0, stop="length_0"), rnd(2, 0)]
    agg = aggregate([result(3 + 5 + 1 + 1, 2.0, rounds)])
    assert agg["mean_accepted_length"] == pytest.approx((2 + 4 + 0) / 3)  # drafted rounds, bonus excluded
    assert agg["mean_accepted_length_with_bonus"] == pytest.approx((3 + 5 + 1) / 3)  # bonus included
    assert agg["tokens_per_round"] == pytest.approx(10 / 4)  # every round, the plain one included
    assert agg["acceptance_rate"] == pytest.approx(6 / 10)
    assert agg["draft_stop_reasons"] == {"policy_bound": 3, "length_0": 1}


def test_token_and_prompt_weighted_aggregates_are_both_reported():
    big = result(30, 1.0, [rnd(9, 9)] * 3)  # rate 1.0
    small = result(2, 1.0, [rnd(2, 0)] * 2)  # rate 0.0
    spec = aggregate([big, small])
    per_prompt = {"a": aggregate([big]), "b": aggregate([small])}
    agg = weighted_aggregates(spec, per_prompt, speedup=None)
    assert agg["token_weighted"]["acceptance_rate"] == pytest.approx(27 / 31)
    assert agg["prompt_weighted"]["acceptance_rate"] == pytest.approx(0.5)
    assert agg["token_weighted"]["tokens_per_s"] == pytest.approx(16.0)
    assert agg["prompt_weighted"]["tokens_per_s"] == pytest.approx((30 + 2) / 2)


def test_vanilla_rounds_come_back_from_a_row():
    row = {
        "prompt_id": "p",
        "output_ids": [5, 6, 7, 8],
        "wall_s": 0.4,
        "rounds": [],
        "lossless": True,
        "first_difference": None,
        "vanilla_generated_tokens": 4,
        "vanilla_wall_s": 0.5,
        "vanilla_rounds": 4,
        "vanilla_draft_ms": 0.4,
        "vanilla_verify_ms": 8.0,
        "vanilla_stop_reason": "eos",
    }  # an old row
    van = PromptResult.from_row(row).vanilla
    agg = aggregate([van])
    assert (agg["rounds"], agg["generated_tokens"], agg["tokens_per_round"]) == (4, 4, 1.0)
    assert agg["verify_ms"] == pytest.approx(8.0) and agg["draft_ms"] == pytest.approx(0.4)
    assert agg["finish_reasons"] == {"eos": 1} and agg["draft_stop_reasons"] == {"vanilla": 4}
    assert van.output_ids.tolist() == [5, 6, 7, 8]  # lossless: vanilla's output is the method's
    assert [r.target_token_ids for r in van.rounds] == [(5,), (6,), (7,), (8,)]
    assert PromptResult.from_row({k: row[k] for k in ("prompt_id", "output_ids", "wall_s", "rounds")}).vanilla is None


@pytest.fixture(scope="module")
def summary(family, tmp_path_factory):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*overrides(family, drafter="drafter"), "policy=failfast", "policy.n=2"])
    return run_experiment(cfg, tmp_path_factory.mktemp("run"))


def test_every_summary_field_is_described(summary):
    fields = summary["fields"]
    assert set(summary) <= set(fields)
    assert "(undocumented)" not in fields.values(), [k for k, v in fields.items() if v == "(undocumented)"]
    assert fields == describe_fields(summary)
    assert "WITHOUT" in fields["mean_accepted_length"] and "WITH" in fields["mean_accepted_length_with_bonus"]
    assert set(FIELDS) >= {"acceptance_by_position", "draft_stop_reasons", "per_prompt", "aggregates"}


def test_summary_holds_per_prompt_values_next_to_labelled_aggregates(summary):
    assert set(summary["aggregates"]) == {"token_weighted", "prompt_weighted"}
    assert summary["aggregates"]["token_weighted"]["acceptance_rate"] == summary["acceptance_rate"]
    per = summary["per_prompt"]
    assert list(per) == ["gsm8k/0", "gsm8k/1"]
    assert sum(p["generated_tokens"] for p in per.values()) == summary["generated_tokens"]
    assert all(
        {"acceptance_rate", "tokens_per_s", "speedup_vs_vanilla", "finish_reason", "lossless"} <= set(p)
        for p in per.values()
    )
    assert sum(summary["draft_stop_reasons"].values()) == summary["rounds"]
    assert sum(summary["finish_reasons"].values()) == summary["prompts"]
    assert summary["acceptance_by_position"]["position"][:2] == [1, 2]


def test_summary_records_sampling_dtype_device_and_versions(summary):
    import torch
    import transformers

    runtime = summary["runtime"]
    assert (runtime["device"], runtime["dtype"]) == ("cpu", "float64")
    assert (runtime["torch"], runtime["transformers"]) == (torch.__version__, transformers.__version__)
    assert "temperature" in summary["sampling"]
