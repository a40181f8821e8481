"""Lossless said honestly: a greedy run that parts from vanilla is classified from the target's
logits re-measured after decoding -- a wrong token is NOT lossless, a parting at an exact tie is
numerically equivalent, and a bfloat16 run of the tiny family has no NOT lossless prompt."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_module

from conftest import overrides, random_prompts, sharpen, tiny_lm
from specpolicy.analysis.parting import EQUIVALENT, NOT_LOSSLESS, ULPS, RowMargins, classify, rounding_tolerance
from specpolicy.analysis.results import PromptResult
from specpolicy.analysis.summary import headline, summarize
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Verification
from specpolicy.drafters.ar import ARDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.run.experiment import run_experiment
from specpolicy.run.setup import RunSetup
from specpolicy.verifiers.hf import HFVerifier

TIE = (5, 9)  # two tokens whose LM head rows are equal: their logits tie exactly in every pass


class PickingVerifier(HFVerifier):
    """A chain greedy verifier (eager) whose token choice is ``pick(logits row) -> token``: the
    deliberately wrong or tie-breaking verifiers of these tests."""

    def __init__(self, *args, pick, **kwargs):
        super().__init__(*args, **kwargs)
        self.pick = pick

    @torch.no_grad()
    def verify(self, draft):
        k, start = draft.length, self.cached_length
        inputs = torch.cat([self._pending, draft.token_ids])[None, :]
        logits = self.model(input_ids=inputs, cache=self.cache, use_cache=True).logits[0]
        target = torch.stack([self.pick(row, k) for row in logits])
        accepted = int((target[:k] == draft.token_ids).int().cumprod(dim=0).sum())
        from specpolicy.core.cache import crop_cache

        crop_cache(self.cache, start + 1 + accepted)
        self._pending = target[accepted : accepted + 1]
        return Verification(accepted_length=accepted, next_token=int(self._pending), target_token_ids=target)


def _tied_model(seed: int = 0):
    """A tiny float64 target whose LM head rows ``TIE`` are equal and large: the two tokens tie
    exactly at the top of many positions."""
    model = sharpen(tiny_lm(seed))
    with torch.no_grad():
        row = model.lm_head.weight[TIE[0]].clone()
        model.lm_head.weight[TIE[0]] = row
        model.lm_head.weight[TIE[1]] = row
        model.lm_head.weight[list(TIE)] += 0.5 * row.sign()  # large on every input of the hidden state's sign
    return model


def _run(model, pick, prompt, dtype="float64", new=24):
    runtime = Runtime(device="cpu", dtype=dtype, seed=0)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 4})
    speculative_verifier = PickingVerifier(model, runtime, frozenset(), pick=pick)
    spec = generate(
        prompt,
        speculative_verifier,
        runtime,
        max_new_tokens=new,
        drafter=ARDrafter(model, runtime),  # the target drafts for itself: every difference is the verifier's
        policy=policy,
    )
    van = generate(prompt, HFVerifier(model, runtime, frozenset()), runtime, max_new_tokens=new)
    result = PromptResult.of("p", prompt.shape[0], spec, van)
    setup = RunSetup(
        "m", runtime, speculative_verifier, None, policy, None, None, None, new, 0, None, ""
    )  # what with_parting reads: the verifier's model and the runtime's dtype
    return setup.with_parting(result, prompt)


def _last_of_ties(row, k):
    """argmax, exact ties broken toward the LAST index (torch breaks them toward the first)."""
    flipped = row.flip(-1)
    return row.shape[-1] - 1 - flipped.argmax()


def test_a_wrong_verifier_is_not_lossless_with_its_margins():
    model = sharpen(tiny_lm(0))
    calls = {"n": 0}

    def second_best_once(row, k):  # a bug: the third verification row of a drafted round takes the runner-up
        calls["n"] += 1
        return row.topk(2).indices[1] if calls["n"] == 3 and k > 0 else row.argmax()

    result = _run(model, second_best_once, random_prompts(1)[0])
    assert result.lossless is False and result.lossless_class == NOT_LOSSLESS
    parting = result.parting
    assert parting["lossless"] == NOT_LOSSLESS and parting["position"] == result.first_difference
    for row in (parting["method_row"], parting["vanilla_row"]):  # measured: vanilla's token on top, the method's below
        assert row["vanilla_gap"] == 0.0 and row["method_gap"] > 0.0 and row["tolerance"] == 0.0
    summary = summarize("m", [result])
    assert summary["lossless_counts"] == {"identical": 0, "numerically_equivalent": 0, "not_lossless": 1}
    assert summary["not_lossless"] == {"p": result.first_difference} and summary["partings"]["p"] == parting


def test_a_parting_at_an_exact_tie_is_numerically_equivalent_even_in_float64():
    model = _tied_model()
    prompt = random_prompts(2)[1]
    result = _run(model, _last_of_ties, prompt)
    assert result.lossless is False  # the tie broke the other way: the outputs part
    parting = result.parting
    assert {parting["method_token"], parting["vanilla_token"]} == set(TIE)
    assert parting["lossless"] == EQUIVALENT and result.lossless_class == EQUIVALENT
    for row in (parting["method_row"], parting["vanilla_row"]):
        assert row["margin"] == 0.0 and row["method_gap"] == 0.0 and row["vanilla_gap"] == 0.0
    summary = summarize("m", [result])
    assert summary["lossless_counts"]["numerically_equivalent"] == 1 and summary["not_lossless"] == {}
    assert headline(summary)["lossless"] == "0/1 identical + 1 numerically equivalent"


def test_the_tolerance_is_ulps_of_the_dtype_at_the_logits_magnitude_and_zero_in_float32():
    assert rounding_tolerance(torch.bfloat16, 10.0) == ULPS * 2**-7 * 10.0
    assert rounding_tolerance(torch.float16, 10.0) == ULPS * 2**-10 * 10.0
    assert rounding_tolerance(torch.float32, 10.0) == 0.0 and rounding_tolerance(torch.float64, 1e9) == 0.0
    near = RowMargins(1, 10.0, 0.05, 0.05, 0.0, 10.0, rounding_tolerance(torch.bfloat16, 10.0))
    far = RowMargins(1, 10.0, 0.5, 0.5, 0.0, 10.0, rounding_tolerance(torch.bfloat16, 10.0))
    assert classify(near, near) == EQUIVALENT
    assert classify(near, far) == NOT_LOSSLESS and classify(near, None) == NOT_LOSSLESS


def test_a_parting_read_back_from_results_jsonl_keeps_its_class():
    result = _run(_tied_model(), _last_of_ties, random_prompts(2)[1])
    again = PromptResult.from_row(json.loads(json.dumps(result.to_row())))
    assert again.parting == result.parting and again.lossless_class == EQUIVALENT


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])  # float16 runs on CPU too (eager)
def test_a_reduced_precision_cpu_run_is_never_not_lossless_and_reports_peak_memory(family, tmp_path, dtype):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[*overrides(family, drafter="drafter"), f"runtime.dtype={dtype}", "dataset.num_prompts=3"],
        )
    summary = run_experiment(cfg, tmp_path / "run")
    counts = summary["lossless_counts"]
    assert counts["not_lossless"] == 0 and sum(counts.values()) == 3, summary.get("partings")
    assert summary["runtime"]["dtype"] == dtype
    for parting in summary["partings"].values():  # each parting measured, at a near-tie
        assert parting["lossless"] == EQUIVALENT and parting["method_row"]["tolerance"] > 0
    peak = summary["peak_memory"]
    assert peak["cpu_rss_bytes"] > 10 * 2**20 and peak["cuda_max_allocated_bytes"] is None


def test_a_model_that_cannot_fit_is_refused_in_one_line_before_loading(family, tmp_path, monkeypatch):
    from specpolicy.core.errors import ConfigError
    from specpolicy.models import memory

    loaded = []
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**10)  # a machine with 1 KiB left
    monkeypatch.setattr("specpolicy.run.experiment._load", lambda *a, **k: loaded.append(a))
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides(family))
    with pytest.raises(ConfigError) as refused:
        run_experiment(cfg, tmp_path / "run")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"verifier.model={str(family['target'])!r} does not fit: ")
    params = memory.parameter_count(json.loads((family["target"] / "config.json").read_text()))
    assert f"{params:,} parameters x 8 bytes (float64)" in line
    assert line.endswith("but the runtime has 1.0 KiB available (use a smaller model or dtype, or another device)")
    assert not loaded


def test_the_parameter_estimate_matches_the_model_it_describes():
    from specpolicy.models.memory import parameter_count

    model = tiny_lm(0)
    counted = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "bias" not in n)
    assert parameter_count(model.config.to_dict()) == counted


@pytest.mark.slow
def test_bfloat16_partings_are_near_ties_and_batch_invariant_verification_has_none():
    """A bfloat16 target drafting for itself (every draft token is its own greedy token in exact
    arithmetic): k-token verification may part from vanilla, only at near-ties (never NOT
    lossless); with runtime.batch_invariant=true (one-token passes) every prompt is identical."""
    target = sharpen(tiny_lm(0, hidden=128), 2.0).to(torch.bfloat16)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 6})
    classes = {False: [], True: []}
    for invariant in (False, True):
        runtime = Runtime(device="cpu", dtype="bfloat16", seed=0, batch_invariant=invariant)
        verifier = HFVerifier(target, runtime, frozenset())
        setup = RunSetup("m", runtime, verifier, None, policy, None, None, None, 48, 0, None, "")
        for prompt in random_prompts(8):
            spec = generate(
                prompt, verifier, runtime, max_new_tokens=48, drafter=ARDrafter(target, runtime), policy=policy
            )
            van = generate(prompt, HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=48)
            classes[invariant].append(
                setup.with_parting(PromptResult.of("p", prompt.shape[0], spec, van), prompt).lossless_class
            )
    assert NOT_LOSSLESS not in classes[False], classes
    assert classes[True] == ["identical"] * 8


def test_batch_invariant_refuses_trees_and_batches_in_one_line():
    from specpolicy.core.errors import ConfigError
    from specpolicy.run.validation import _check_core

    base = {"runtime": {"batch_invariant": True}, "generation": {"max_new_tokens": 4}}
    with pytest.raises(ConfigError, match=r"^runtime.batch_invariant=true .* policy=block-tree drafts trees"):
        _check_core({**base, "policy": {"name": "block-tree"}})
    with pytest.raises(ConfigError, match=r"generation.batch_size=4 \(use 1\)$"):
        _check_core({**base, "generation": {"max_new_tokens": 4, "batch_size": 4}})
