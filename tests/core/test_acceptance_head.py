"""SpecDec++'s acceptance head (arXiv 2405.19715 §4): the head, its loss and metrics, the drafters'
hidden states, the policies' head rule, losslessness with the head, and the bad-input errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from specpolicy.core.acceptance import AcceptanceChoice, HeadAcceptance
from specpolicy.core.decoding import generate
from specpolicy.core.errors import ConfigError
from specpolicy.core.types import LAST_HIDDEN, Draft
from specpolicy.drafters.ar import ARDrafter
from specpolicy.family.train_acceptance_head import brier, ece, roc_auc, weighted_bce
from specpolicy.models.acceptance_head import AcceptancePredictionHead, load_head, save_head
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.goodput import GoodputPolicy
from specpolicy.policies.specdecpp import SpecDecPPPolicy
from test_sampling import (
    ALPHA,
    FEATURE_PROMPT,
    PROMPT,
    TEMPERATURE,
    TRUNCATED,
    _dflash,
    _eagle3,
    chi_square_pvalue,
    exact_joint,
    models,  # noqa: F401 - the module fixture
    run_counts,
    runtime,  # noqa: F401 - the fixture
)

# -- the head ----------------------------------------------------------------------------------


def test_head_is_residual_blocks_then_two_logits():
    torch.manual_seed(0)
    head = AcceptancePredictionHead(8, num_layers=3)
    assert len(head.blocks) == 3 and head.out.out_features == 2
    x = torch.randn(5, 8)
    y = x
    for block in head.blocks:  # each block: x + SiLU(Linear(x)), its own weights
        y = y + torch.nn.functional.silu(block.linear(y))
    assert torch.allclose(head(x), head.out(y))
    assert head.blocks[0].linear.weight.data_ptr() != head.blocks[1].linear.weight.data_ptr()
    p = head.acceptance_probs(x)
    assert p.shape == (5,) and p.dtype == torch.float32
    assert torch.allclose(p, torch.softmax(head(x), -1)[:, 1])


@pytest.mark.parametrize("inputs", ["hidden", "hidden+confidence"])
def test_the_fused_head_is_the_heads_forward(inputs):
    """``FusedAcceptanceHead`` (the policies' per-decision path) gives the module's probabilities."""
    torch.manual_seed(3)
    head = AcceptancePredictionHead(8, 3, inputs=inputs)
    for block in head.blocks:  # weights large enough that SiLU's both sides and the sigmoid's tails are hit
        torch.nn.init.normal_(block.linear.weight, std=0.5)
    torch.nn.init.normal_(head.out.weight, std=2.0)
    x = torch.randn(6, 8, dtype=torch.bfloat16) * 2
    conf = torch.tensor([0.0, 0.2, 0.5, 0.9, 0.999, 1.0]) if inputs != "hidden" else None
    with torch.no_grad():  # centred: estimates on both sides of 1/2
        margin = head(x, conf) @ torch.tensor([-1.0, 1.0])
        head.out.bias[1] -= float(margin.median())
    fused = head.fused().acceptance_probs(x, conf)
    assert fused.dtype == np.float64 and fused.shape == (6,)
    expected = head.acceptance_probs(x, conf).double().numpy()
    assert np.allclose(fused, expected, atol=1e-6) and expected.min() < 0.1 and expected.max() > 0.9
    if inputs != "hidden":
        with pytest.raises(ValueError, match="reads the confidences too"):
            head.fused().acceptance_probs(x)


def test_save_load_round_trip_and_hidden_size_check(tmp_path):
    torch.manual_seed(1)
    head = AcceptancePredictionHead(8, 2, {"drafter": "ar", "drafter_hidden_size": 8})
    save_head(head, tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["hidden_size"] == 8 and config["num_layers"] == 2 and config["drafter"] == "ar"
    again = load_head(tmp_path / "h", drafter_hidden_size=8)
    x = torch.randn(4, 8)
    assert torch.equal(again.acceptance_probs(x), head.acceptance_probs(x))
    with pytest.raises(
        ValueError, match=r"^policy\.acceptance_head=.*hidden size 8, but the drafter's hidden size is 16"
    ):
        load_head(tmp_path / "h", drafter_hidden_size=16)
    with pytest.raises(ValueError, match=r"^policy\.acceptance_head=.*holds no acceptance head"):
        load_head(tmp_path / "nothing")


def test_a_confidence_reading_head_starts_as_the_confidence():
    from specpolicy.family.train_acceptance_head import start_as_confidence

    head = AcceptancePredictionHead(8, 3, inputs="hidden+confidence")
    assert head.blocks[0].linear.in_features == 9
    start_as_confidence(head, 6.0)
    with torch.no_grad():
        head.out.bias[1] += math.log(6.0)  # the trainer's prior correction
    conf = torch.tensor([0.1, 0.5, 0.93, 0.999])
    assert torch.allclose(head.acceptance_probs(torch.randn(4, 8), conf), conf, atol=1e-5)
    with pytest.raises(ValueError, match="reads the confidences too"):
        head(torch.randn(4, 8))


# -- loss and metrics against hand-computed values ---------------------------------------------


def test_weighted_bce_by_hand():
    # row 0: p1 = 1/2, label 1; row 1: p1 = 3/4, label 0 (weight 6): (ln 2 + 6 ln 4) / (6 + 1)
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    loss = weighted_bce(logits, torch.tensor([1.0, 0.0]), 6.0)
    assert float(loss) == pytest.approx(13 * math.log(2) / 7)
    assert float(weighted_bce(logits, torch.tensor([1.0, 0.0]), 1.0)) == pytest.approx((math.log(2) + math.log(4)) / 2)


def test_ece_brier_auc_by_hand():
    p, y = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])
    assert roc_auc(p, y) == pytest.approx(0.75)  # 3 of the 4 (positive, negative) pairs ordered right
    assert brier(p, y) == pytest.approx((0.01 + 0.16 + 0.4225 + 0.04) / 4)
    assert ece(p, y) == pytest.approx((0.1 + 0.4 + 0.65 + 0.2) / 4)  # one token per bin
    assert ece(np.array([0.9, 0.92]), np.array([1, 0])) == pytest.approx(0.41)  # one bin: |0.5 - 0.91|
    assert roc_auc(np.array([0.5, 0.5]), np.array([1, 0])) == pytest.approx(0.5)  # a tie
    from specpolicy.family.train_acceptance_head import by_distance

    rows = by_distance(p, np.array([0.9, 0.9, 0.9, 0.9]), y, np.array([1, 2, 1, 2]))
    assert [r["distance"] for r in rows] == [1, 2] and [r["tokens"] for r in rows] == [2, 2]
    assert rows[0]["head_brier"] == pytest.approx((0.01 + 0.4225) / 2)  # distance 1: p 0.1 (0), 0.35 (1)
    assert rows[1]["confidence_ece"] == pytest.approx(abs(0.5 - 0.9))  # distance 2: one bin, accuracy 1/2


# -- the policies' head rule -------------------------------------------------------------------


class StubHead:
    """A head whose estimate is the hidden state's first column; counts the rows it is run on."""

    hidden_size = 2

    def __init__(self) -> None:
        self.rows = 0

    def acceptance_probs(self, hidden: torch.Tensor, confidences: torch.Tensor | None = None) -> torch.Tensor:
        self.rows += int(hidden.shape[0])
        return hidden[:, 0].float()


def _draft(p_accept: list[float], conf: float = 1.0, reused: int = 0) -> Draft:
    k = len(p_accept)
    hidden = torch.tensor([[p, 0.0] for p in p_accept[: k - reused]]).reshape(-1, 2)
    return Draft(
        torch.arange(k),
        torch.full((k,), conf),
        reused_tokens=reused,
        extras={LAST_HIDDEN: hidden},
    )


def _drive(policy, p_accept: list[float]) -> list[int]:
    """Answers of ``policy`` while a draft grows by what it asks, token estimates from ``p_accept``."""
    answers, k = [], 0
    while True:
        n = policy.next_length(_draft(p_accept[:k]))
        answers.append(n)
        if n == 0:
            return answers
        k += n


def test_specdecpp_head_rule_is_the_references_worked_example():
    # 1 - prod p: after 2 tokens 0.19, after 3 0.352 > 0.3: stop at 3 (bound (2, 20), threshold 0.3);
    # the confidences (all 1.0) would never stop it before max_length
    head = StubHead()
    policy = SpecDecPPPolicy(h=0.3, min_length=2, max_length=20, acceptance="head")
    policy.acceptance_choice.use_head(head)
    assert _drive(policy, [0.9, 0.9, 0.8, 0.9] + [1.0] * 30) == [2, 1, 0]
    assert policy.draft_stop_reason == "low_confidence"
    assert head.rows == 3  # incremental: each row through the head once within the round
    assert _drive(policy, [1.0] * 40) == [2] + [1] * 18 + [0]  # the bound's maximum
    assert policy.draft_stop_reason == "policy_bound"
    confidence = SpecDecPPPolicy(h=0.3, min_length=2, max_length=20)
    assert _drive(confidence, [0.9, 0.9, 0.8] + [1.0] * 30) == [2] + [1] * 18 + [0]


def test_failfast_and_goodput_read_the_head():
    head = StubHead()
    failfast = FailFastPolicy(n=2, tau=0.5, n_max=20, acceptance="head")
    failfast.acceptance_choice.use_head(head)
    assert _drive(failfast, [0.9, 0.9, 0.9, 0.4] + [1.0] * 30) == [2, 2, 0]
    goodput = GoodputPolicy(max_length=8, cost_profile="a6000-qwen7b", acceptance="head")
    goodput.acceptance_choice.use_head(StubHead())
    low = _drive(goodput, [0.01] * 10)
    goodput.reset()
    high = _drive(goodput, [0.999] * 10)
    assert sum(low) < sum(high)  # the head's estimates decide the length, not the (all 1.0) confidences


def test_head_estimates_fall_back_to_confidence_without_rows():
    estimate = HeadAcceptance(StubHead())
    draft = _draft([0.2, 0.3, 0.9], conf=0.7, reused=1)  # the reused last token has no hidden row
    assert estimate.probs(draft).tolist() == pytest.approx([0.2, 0.3, 0.7])
    plain = Draft(torch.arange(2), torch.tensor([0.6, 0.5]))
    estimate.new_round()
    assert estimate.probs(plain).tolist() == pytest.approx([0.6, 0.5])


def test_a_head_policy_without_a_loaded_head_fails_in_one_line():
    policy = SpecDecPPPolicy(h=0.3, min_length=1, acceptance="head")
    with pytest.raises(ValueError, match="^policy.acceptance=head but no acceptance head was loaded"):
        policy.next_length(_draft([0.5]))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"h": 1.0, "acceptance": "head"}, "policy.h"),
        ({"h": 0.5, "min_length": 5, "max_length": 4}, "policy.max_length"),
        ({"acceptance": "trained"}, "policy.acceptance"),
        ({"acceptance_head": "/x"}, "policy.acceptance_head"),
    ],
)
def test_specdecpp_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}"):
        SpecDecPPPolicy(**kwargs)


def test_acceptance_confidence_is_todays_rule():
    for p in ([0.9, 0.8, 0.95, 0.3, 0.9], [0.99] * 70, [0.2]):
        for default, explicit in (
            (SpecDecPPPolicy(h=0.5), SpecDecPPPolicy(h=0.5, acceptance="confidence")),
            (FailFastPolicy(n=2, tau=0.5), FailFastPolicy(n=2, tau=0.5, acceptance="confidence")),
        ):
            drafts = [Draft(torch.arange(k), torch.tensor(p[:k])) for k in range(len(p) + 1)]
            assert [default.next_length(d) for d in drafts] == [explicit.next_length(d) for d in drafts]


# -- the drafters' hidden states ---------------------------------------------------------------


def _ar(models, runtime):  # noqa: F811
    return ARDrafter(models["ar"], runtime)


DRAFTERS = {
    "ar": (_ar, lambda d, h: d.model.lm_head(h), PROMPT),
    "eagle3": (_eagle3, lambda d, h: d.model.lm_head(h), FEATURE_PROMPT),
    "dflash": (_dflash, lambda d, h: d.head(h), FEATURE_PROMPT),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_hidden_states_are_what_the_lm_head_reads_and_change_nothing(models, runtime, name):  # noqa: F811
    make, lm_head, prompt = DRAFTERS[name]
    verifier_outputs = []
    for report in (False, True):
        drafter = make(models, runtime)
        drafter.report_hidden = report
        from specpolicy.verifiers.hf import HFVerifier

        verifier = HFVerifier(models["target"], runtime, frozenset())
        seen = []

        def record(d, v, _commit=drafter.commit):
            seen.append(d)
            _commit(d, v)

        drafter.commit = record
        policy = FailFastPolicy(n=2, tau=0.0, n_max=4)
        out = generate(prompt, verifier, runtime, max_new_tokens=12, drafter=drafter, policy=policy)
        verifier_outputs.append(
            (out.output_ids.tolist(), [(d.token_ids.tolist(), d.confidences.tolist()) for d in seen])
        )
        for d in seen:
            assert (LAST_HIDDEN in d.extras) == report
            if report:
                hidden = d.extras[LAST_HIDDEN]
                assert hidden.shape[0] == d.length + d.lookahead
                with torch.no_grad():
                    probs = torch.softmax(lm_head(drafter, hidden[: d.length]).double(), -1)
                assert torch.allclose(probs.max(-1).values, d.confidences.double(), atol=1e-6)
    assert verifier_outputs[0] == verifier_outputs[1]  # the same drafts and output with and without


# -- lossless sampling with the head -----------------------------------------------------------


def _random_head(size: int, seed: int) -> AcceptancePredictionHead:
    torch.manual_seed(seed)
    head = AcceptancePredictionHead(size, 3)
    with torch.no_grad():
        head.out.weight.mul_(30.0)  # spread estimates: the length really depends on the head
    return head.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_sampling_with_the_head_matches_the_target_distribution(models, runtime, name):  # noqa: F811
    make_drafter, _, prompt = DRAFTERS[name]
    policies = {
        "ar": lambda: SpecDecPPPolicy(h=0.5, min_length=1, max_length=2, acceptance="head"),
        "eagle3": lambda: SpecDecPPPolicy(h=0.6, min_length=1, max_length=2, acceptance="head"),
        "dflash": lambda: FailFastPolicy(n=1, tau=0.5, n_max=2, acceptance="head"),
    }

    def make():
        drafter = make_drafter(models, runtime)
        drafter.report_hidden = True
        policy = policies[name]()
        policy.acceptance_choice.use_head(_random_head(models["target"].config.hidden_size, 3))
        return drafter, policy

    sampling = TRUNCATED if name != "dflash" else TEMPERATURE
    counts, stats = run_counts(make, prompt, sampling, runtime, models["target"])
    pvalue, df = chi_square_pvalue(counts, exact_joint(models["target"], prompt, sampling))
    assert stats["accepted"] >= 10, stats
    assert df >= 10 and pvalue > ALPHA, (name, pvalue, df, stats)


# -- the run: checks before models load, lossless greedy presets -------------------------------


def _config(overrides: list[str]) -> dict:
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


def _validate(overrides: list[str]) -> None:
    from specpolicy.plugins.manager import get_plugin_manager
    from specpolicy.run.validation import validate_config

    validate_config(_config(overrides), get_plugin_manager(autoload=False))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["drafter=suffix", "policy=specdecpp", "policy.acceptance=head"],
            r"^policy.acceptance=head: drafter 'suffix'",
        ),
        (
            ["drafter=ar", "policy=specdecpp", "policy.acceptance=head", "policy.h=1.0"],
            r"^policy.h must be in \(0, 1\)",
        ),
        (["drafter=ar", "policy=specdecpp", "policy.min_length=5", "policy.max_length=3"], r"^policy.max_length"),
        (["drafter=ar", "policy=specdecpp", "policy.acceptance=head", "runtime.compile=true"], r"compiled runtime"),
    ],
)
def test_bad_head_settings_are_one_line_before_models_load(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        _validate(overrides)
    assert "\n" not in str(error.value)


def test_a_head_of_another_hidden_size_is_refused_before_models_load(tmp_path):
    save_head(AcceptancePredictionHead(8, 1, {"drafter": "ar"}), tmp_path / "head")
    overrides = [
        "drafter=ar",
        "policy=specdecpp",
        "policy.acceptance=head",
        f"policy.acceptance_head={tmp_path / 'head'}",
    ]
    with pytest.raises(
        ConfigError, match=r"^policy.acceptance_head=.*hidden size 8, but the drafter's hidden size is 192"
    ):
        _validate(overrides)


def test_choice_copies_share_the_head():
    import copy

    choice = AcceptanceChoice("head")
    head = StubHead()
    choice.use_head(head)
    clone = copy.deepcopy(choice)
    assert clone.estimate.head is head and clone.wants_head


#: The presets that read the bundled heads (``conf/method/``); the first runs in the fast subset.
HEAD_PRESETS = (
    "ar+specdecpp-head",
    "ar+specdecpp-head-tuned",
    "ar+goodput-head",
    "eagle3+specdecpp-head",
    "eagle3+specdecpp-head-tuned",
    "eagle3+goodput-head",
    "dflash+specdecpp-head",
    "dflash+specdecpp-head-tuned",
    "dflash+failfast-head",
    "ar+goodput-head-a6000-qwen7b",
    "eagle3+specdecpp-head-a6000-qwen7b",
    "dflash+goodput-head-a6000-qwen7b",
)


@pytest.fixture(scope="module")
def bundled():
    from specpolicy.core.runtime import Runtime
    from specpolicy.family.tokenizer import encode_prompt
    from specpolicy.plugins.manager import get_plugin_manager, make_verifier

    rt = Runtime.from_config({"device": "cpu", "dtype": "float32"}, seed=0)
    pm = get_plugin_manager(autoload=False)
    verifier = make_verifier(pm, {"name": "hf", "model": "target"}, rt)
    questions = ["Sam has 5 pens and gives away 2. How many are left?", "What is 12 times 7?"]
    prompts = [torch.tensor(encode_prompt(verifier.tokenizer, q)) for q in questions]
    vanilla = [generate(p, verifier, rt, max_new_tokens=32).output_ids.tolist() for p in prompts]
    return pm, rt, verifier, prompts, vanilla


@pytest.mark.parametrize(
    "preset", [p if i == 0 else pytest.param(p, marks=pytest.mark.slow) for i, p in enumerate(HEAD_PRESETS)]
)
def test_head_presets_are_lossless_greedy_on_the_bundled_family(bundled, preset):
    from specpolicy.models.acceptance_head import wire_acceptance
    from specpolicy.plugins.manager import make_drafter, make_policy

    pm, rt, verifier, prompts, vanilla = bundled
    config = _config([f"method={preset}"])
    _validate([f"method={preset}"])  # the bundled head is found and fits, before any model loads
    drafter = make_drafter(pm, config["drafter"], rt, verifier)
    policy = make_policy(pm, config["policy"])
    assert wire_acceptance(policy, drafter, config["drafter"]) and drafter.report_hidden
    for prompt, ref in zip(prompts, vanilla):
        out = generate(prompt, verifier, rt, max_new_tokens=32, drafter=drafter, policy=policy)
        assert out.output_ids.tolist() == ref
        assert any(r.speculation_length for r in out.rounds)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dart", "falcon"])
def test_bundled_dart_and_falcon_report_what_their_lm_head_reads_and_stay_lossless(bundled, name):
    from specpolicy.models.acceptance_head import wire_acceptance
    from specpolicy.plugins.manager import make_drafter, make_policy

    pm, rt, verifier, prompts, vanilla = bundled
    config = _config([f"drafter={name}", "policy=specdecpp", "policy.acceptance=head", "policy.h=0.8"])
    drafter = make_drafter(pm, config["drafter"], rt, verifier)
    policy = make_policy(pm, config["policy"])
    assert wire_acceptance(policy, drafter, config["drafter"])
    seen = []

    def record(d, v, _commit=drafter.commit):
        seen.append(d)
        _commit(d, v)

    drafter.commit = record
    lm_head = drafter.model.lm_head if name == "dart" else drafter.lm_head  # DART: lm_head(norm(out))
    for prompt, ref in zip(prompts, vanilla):
        assert (
            generate(prompt, verifier, rt, max_new_tokens=32, drafter=drafter, policy=policy).output_ids.tolist() == ref
        )
    assert seen
    for d in seen:
        hidden = d.extras[LAST_HIDDEN]
        assert hidden.shape[0] == d.length + d.lookahead
        with torch.no_grad():
            logits = lm_head(hidden[: d.length])
        assert torch.allclose(torch.softmax(logits.float(), -1).max(-1).values, d.confidences.float(), atol=1e-5)
