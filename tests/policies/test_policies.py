"""Length policies: each rule against hand-built confidence sequences and round records,
bad configurations, factories, and the real decoding loop on tiny float64 Qwen2 models."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from conftest import sharpen, tiny_lm
from specpolicy.core.decoding import draft_round, generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Draft, RoundRecord
from specpolicy.drafters.ar import ARDrafter
from specpolicy.policies import aimd, failfast, specdecpp, static
from specpolicy.policies.aimd import AIMDPolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.specdecpp import SpecDecPPPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier

BIG_ROOM = 10_000
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_draft(confs, device="cpu") -> Draft:
    k = len(confs)
    return Draft(
        token_ids=torch.arange(k, dtype=torch.long, device=device),
        confidences=torch.tensor(confs, dtype=torch.float32, device=device),
        forward_passes=k,
    )


class TableDrafter(Drafter):
    """A drafter whose i-th drafted token has confidence ``confs[i]`` (token ids 0, 1, 2, ...)."""

    def __init__(self, confs, device="cpu") -> None:
        self.confs, self.device, self.length = list(confs), device, 0

    def prefill(self, prompt_ids, sampling=None) -> None:
        self.length = 0

    def draft(self, num_tokens: int) -> Draft:
        assert self.length + num_tokens <= len(self.confs), "test asked for more tokens than the table holds"
        self.length += num_tokens
        return make_draft(self.confs[: self.length], self.device)

    def commit(self, draft, verification) -> None:
        self.length = 0


class Answers:
    """Records every ``next_length`` answer of the wrapped policy (and checks it is an int >= 0)."""

    def __init__(self, policy: LengthPolicy) -> None:
        self.policy, self.answers = policy, []

    def next_length(self, draft: Draft) -> int:
        wanted = self.policy.next_length(draft)
        assert isinstance(wanted, int) and wanted >= 0
        self.answers.append(wanted)
        return wanted

    def __getattr__(self, name):  # name, draft_stop_reason, ...: the policy's
        return getattr(self.policy, name)


def run_round(policy: LengthPolicy, confs, room: int = BIG_ROOM, device="cpu") -> tuple[list[int], int]:
    """One round's drafting through the loop's own ``specpolicy.core.decoding.draft_round``, the drafted
    tokens' confidences drawn from ``confs``. Returns ``(answers of next_length, final speculation length)``."""
    recorder = Answers(policy)
    draft, _ = draft_round(TableDrafter(confs, device), recorder, room, device)
    return recorder.answers, draft.length


def rec(k: int, accepted: int, reused: int = 0, index: int = 0) -> RoundRecord:
    return RoundRecord(
        index=index,
        speculation_length=k,
        accepted_length=accepted,
        emitted_tokens=accepted + 1,
        drafter_forward_passes=k - reused,
        reused_tokens=reused,
        draft_ms=0.0,
        verify_ms=0.0,
    )


HI, LO = 0.9, 0.1

# -- static ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, room, answers, length",
    [
        (5, BIG_ROOM, [5, 0], 5),
        (1, BIG_ROOM, [1, 0], 1),
        (20, BIG_ROOM, [20, 0], 20),
        (5, 3, [5, 2], 3),  # the loop clamps to room; the policy asks for the rest, the loop stops
    ],
)
def test_static(k, room, answers, length):
    policy = StaticPolicy(k=k)
    for _ in range(3):  # stateless: same answers every round, whatever happened before
        assert run_round(policy, [LO] * 100, room) == (answers, length)
        policy.update(rec(length, 0))


# -- failfast --------------------------------------------------------------------------------


def with_low(n: int, low_at: tuple[int, ...], hi: float = HI, lo: float = LO) -> list[float]:
    return [lo if i in low_at else hi for i in range(n)]


@pytest.mark.parametrize(
    "params, confs, answers, length",
    [
        # N=10, tau=0.45, N_max=60 (the defaults)
        ({}, [HI] * 60, [10, 10, 10, 10, 10, 10, 0], 60),
        ({}, with_low(60, (15,)), [10, 10, 0], 20),  # low token in chunk 2: chunk 2 proposed whole
        ({}, with_low(60, (10,)), [10, 10, 0], 20),  # first token of chunk 2
        ({}, with_low(60, (19,)), [10, 10, 0], 20),  # last token of chunk 2
        ({}, with_low(60, (0,)), [10, 0], 10),
        ({}, with_low(60, (9,)), [10, 0], 10),
        ({}, with_low(60, (59,)), [10, 10, 10, 10, 10, 10, 0], 60),
        ({}, with_low(60, (35, 36, 50)), [10, 10, 10, 10, 0], 40),
        ({}, [0.45] * 60, [10, 10, 10, 10, 10, 10, 0], 60),  # confidence == tau passes
        ({}, with_low(60, (12,), lo=0.4499), [10, 10, 0], 20),
        # N_max not a multiple of N: the last chunk is capped
        ({"n_max": 25}, [HI] * 60, [10, 10, 5, 0], 25),
        ({"n_max": 10}, [HI] * 60, [10, 0], 10),
        ({"n": 3, "n_max": 10}, [HI] * 60, [3, 3, 3, 1, 0], 10),
        ({"n": 1, "n_max": 4}, with_low(60, (2,)), [1, 1, 1, 0], 3),
        # tau extremes
        ({"tau": 0.0}, [0.0] * 60, [10, 10, 10, 10, 10, 10, 0], 60),
        ({"tau": 1.0}, [1.0] * 60, [10, 10, 10, 10, 10, 10, 0], 60),
        ({"tau": 1.0}, with_low(60, (25,), hi=1.0, lo=0.999), [10, 10, 10, 0], 30),
        # chunks of 4 at tau=0.3: "0.5 0.6 0.35 0.9" pass, "0.31 0.7 0.8 0.3" pass (== tau), "0.29 ..." stops
        (
            {"tau": 0.3, "n": 4, "n_max": 20},
            [0.5, 0.6, 0.35, 0.9, 0.31, 0.7, 0.8, 0.3, 0.29] + [HI] * 20,
            [4, 4, 4, 0],
            12,
        ),
    ],
)
def test_failfast_rule(params, confs, answers, length):
    assert run_round(FailFastPolicy(**params), confs) == (answers, length)


def test_failfast_room_limit():
    # Room for 15 tokens: the loop clamps the second chunk to 5 and then stops.
    answers, length = run_round(FailFastPolicy(), [HI] * 60, room=15)
    assert length == 15 and answers == [10, 10, 10]


def test_failfast_rule_is_about_all_tokens_so_far():
    """A low-confidence token in an *older* chunk stops the round even if the policy is
    asked again afterwards (the rule is "every confidence so far >= tau")."""
    policy = FailFastPolicy()
    assert policy.next_length(make_draft(with_low(20, (3,)))) == 0
    assert policy.next_length(make_draft(with_low(30, (3,)))) == 0
    assert policy.next_length(make_draft([HI] * 20)) == 10
    assert policy.next_length(make_draft([HI] * 55)) == 5
    assert policy.next_length(make_draft([HI] * 60)) == 0
    assert policy.next_length(make_draft([HI] * 70)) == 0  # longer than n_max (e.g. external): stop


def test_failfast_is_stateless_across_rounds():
    policy = FailFastPolicy()
    for confs, expected in [([HI] * 60, 60), (with_low(60, (5,)), 10), ([HI] * 60, 60)]:
        assert run_round(policy, confs)[1] == expected
        policy.update(rec(expected, 0))
    policy.reset()
    assert run_round(policy, [HI] * 60)[1] == 60


def _with_small_blocks(confs, small_block) -> Draft:
    """A draft whose drafter also reports small-block confidences (NaN = not masked at that pass)."""
    return Draft(
        torch.arange(len(confs)),
        torch.tensor(confs, dtype=torch.float32),
        extras={"small_block_confidences": torch.tensor(small_block, dtype=torch.float32)},
    )


def test_failfast_small_block_scope_stops_where_the_paper_rule_continues():
    """The official check also reads look-ahead positions past the draft and counts every listed
    confidence toward N_max: a low look-ahead confidence, or a long list, stops drafting where
    the paper's rule (drafted tokens only, N_max on the draft) extends."""
    nan = float("nan")
    paper, official = FailFastPolicy(), FailFastPolicy(confidence_scope="small_block")
    # 10 drafted tokens (first small block: 3 committed positions -> NaN), look-ahead 10..15 with one low.
    draft = _with_small_blocks([HI] * 10, [nan] * 3 + [HI] * 5 + [HI] * 5 + [HI, LO, HI])
    assert paper.next_length(draft) == 10
    assert official.next_length(draft) == 0 and official.draft_stop_reason == "low_confidence"
    # 50 drafted tokens, 60 listed confidences (look-ahead and repeated passes): N_max reached.
    draft = _with_small_blocks([HI] * 50, [HI] * 60 + [nan] * 4)
    assert paper.next_length(draft) == 10
    assert official.next_length(draft) == 0 and official.draft_stop_reason == "n_max"
    # Below N_max the official rule extends by N uncapped (the draft may end past N_max).
    draft = _with_small_blocks([HI] * 55, [HI] * 59)
    assert paper.next_length(draft) == 5 and official.next_length(draft) == 10
    # The paper's rule ignores the list; the official one ignores the drafted confidences.
    draft = _with_small_blocks([HI, LO] + [HI] * 8, [HI] * 12)
    assert paper.next_length(draft) == 0 and official.next_length(draft) == 10
    with pytest.raises(ValueError, match="policy.confidence_scope=small_block needs a drafter"):
        official.next_length(make_draft([HI] * 10))


# -- specdecpp -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, confs, answers, length",
    [
        # 1 - prod: 0, .25, .625, .8125 -> crosses h=.75 at the 4th token
        ({"h": 0.75}, [1.0, 0.75, 0.5, 0.5] + [0.5] * 10, [1, 1, 1, 1, 0], 4),
        # exactly h stops (>=): 1 - .5 * .5 = .75
        ({"h": 0.75}, [0.5] * 10, [1, 1, 0], 2),
        # default h=0.7: 1 - prod(.9 .9 .9 .5) = .6355 < .7; *.5 -> .81775
        ({}, [0.9, 0.9, 0.9, 0.5, 0.5, 0.5], [1, 1, 1, 1, 1, 0], 5),
        # the first token alone can cross h
        ({}, [0.25] * 5, [1, 0], 1),
        # never before min_length, asked for at once
        ({"h": 0.1, "min_length": 3}, [0.5] * 10, [3, 0], 3),
        ({"h": 0.9, "min_length": 3}, [0.5] * 10, [3, 1, 0], 4),  # 1 - 1/16 = .9375
        # never beyond max_length
        ({"max_length": 5}, [1.0] * 10, [1, 1, 1, 1, 1, 0], 5),
        ({"min_length": 4, "max_length": 4}, [1.0] * 10, [4, 0], 4),
        # h = 1 stops only on a zero confidence (or at max_length)
        ({"h": 1.0, "max_length": 8}, [0.01] * 10, [1] * 8 + [0], 8),
        ({"h": 1.0, "max_length": 8}, [0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.9, 0.9], [1, 1, 1, 0], 3),
    ],
)
def test_specdecpp_rule(params, confs, answers, length):
    assert run_round(SpecDecPPPolicy(**params), confs) == (answers, length)


def test_specdecpp_stops_where_one_minus_product_crosses_h():
    """Random confidence streams: the length is the first L >= min_length where
    1 - prod(conf[:L]) >= h (product in float64 of the float32 values), capped at max_length."""
    rng = random.Random(0)
    for _ in range(200):
        h = rng.choice([0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0])
        lo = rng.randint(1, 5)
        hi = rng.randint(lo, 40)
        confs = [rng.choice([1.0, rng.random(), 1 - rng.random() * 0.05]) for _ in range(hi)]
        c32 = torch.tensor(confs, dtype=torch.float32).double().tolist()
        expected, prod = hi, 1.0
        for i, c in enumerate(c32, start=1):
            prod *= c
            if i >= lo and 1.0 - prod >= h:
                expected = i
                break
        answers, length = run_round(SpecDecPPPolicy(h=h, min_length=lo, max_length=hi), confs)
        assert length == expected, (h, lo, hi, confs)
        assert answers == [lo] + [1] * (length - lo) + [0]


# -- aimd ------------------------------------------------------------------------------------


def drive_aimd(policy: AIMDPolicy, rounds: list[tuple[int, int]]) -> list[int]:
    """Feed ``(speculation_length, accepted_length)`` records; return the window before each
    round and after the last (the length the policy asks for with the empty draft)."""
    windows = []
    for i, (k, a) in enumerate(rounds):
        windows.append(run_round(policy, [LO] * BIG_ROOM)[1])
        policy.update(rec(k, a, index=i))
    windows.append(run_round(policy, [LO] * BIG_ROOM)[1])
    return windows


@pytest.mark.parametrize(
    "params, outcomes, windows",
    [
        # defaults: w_init 5, +2 on full acceptance, halve (floor) on a rejection, w_min 1
        ({}, ["full", "full", 3, 0, 0, 0, "full", "full"], [5, 7, 9, 4, 2, 1, 1, 3, 5]),
        ({"beta": 0.7, "w_init": 10, "a": 1}, [0, 0, "full", 2], [10, 7, 4, 5, 3]),
        ({"w_min": 3}, [0, 0, "full"], [5, 3, 3, 5]),
        ({"w_init": 57}, ["full", "full", "full", 0], [57, 59, 60, 60, 30]),  # bounded by n_max
        ({"n_max": 8, "w_init": 8}, ["full", 1, "full", "full"], [8, 8, 4, 6, 8]),
        # Hugging Face's heuristic: +2 on full acceptance, -1 otherwise, never below 1
        (
            {"mode": "heuristic"},
            ["full", 0, 5, "full", 0, 0, 0, 0, 0, 0, 0, 0],
            [5, 7, 6, 5, 7, 6, 5, 4, 3, 2, 1, 1, 1],
        ),
        ({"mode": "heuristic", "beta": 0.5, "w_init": 1}, [0, "full", "full"], [1, 1, 3, 5]),  # beta unused
        ({"mode": "heuristic", "w_init": 59}, ["full", "full", 0], [59, 60, 60, 59]),
    ],
)
def test_aimd_window_trajectory(params, outcomes, windows):
    policy = AIMDPolicy(**params)
    policy.reset()
    got = []
    for i, outcome in enumerate(outcomes):
        w = policy.next_length(make_draft([]))
        got.append(w)
        assert policy.next_length(make_draft([LO] * w)) == 0  # one draft of w tokens per round
        accepted = w if outcome == "full" else outcome
        policy.update(rec(w, accepted, index=i))
    got.append(policy.next_length(make_draft([])))
    assert got == windows


def test_aimd_judges_the_proposed_round():
    policy = AIMDPolicy()
    # Fewer tokens than the window (room-limited) but all accepted: a full acceptance.
    policy.update(rec(3, 3))
    assert policy.w == 7
    # Draft reuse appended tokens beyond the window; every proposed token accepted: full.
    policy.update(rec(12, 12, reused=5))
    assert policy.w == 9
    # A rejection inside the reused tokens is a rejection of the round.
    policy.update(rec(12, 10, reused=3))
    assert policy.w == 4


def test_aimd_zero_length_round_leaves_window_unchanged():
    for mode in ("aimd", "heuristic"):
        policy = AIMDPolicy(mode=mode)
        policy.update(rec(0, 0))  # nothing proposed (fully_accepted is vacuously true)
        assert policy.w == 5
        policy.update(rec(5, 1))
        w = policy.w
        policy.update(rec(0, 0))
        assert policy.w == w


@pytest.mark.parametrize("mode", ["aimd", "heuristic"])
def test_aimd_reset_per_prompt(mode):
    policy = AIMDPolicy(mode=mode)
    policy.update(rec(5, 5))
    policy.update(rec(7, 7))
    assert policy.w == 9
    policy.reset()  # before the next prompt: back to w_init (the default)
    assert policy.w == 5

    keep = AIMDPolicy(mode=mode, keep_across_prompts=True)
    keep.reset()
    keep.update(rec(5, 5))
    keep.reset()  # carried over, as Hugging Face's "heuristic" schedule does
    assert keep.w == 7
    assert drive_aimd(keep, [(7, 0)])[-1] == (3 if mode == "aimd" else 6)


# -- every policy: devices, validation, factories ------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_confidences_on_any_device(device):
    cases = [
        (FailFastPolicy(), with_low(60, (25,)), 30),
        (SpecDecPPPolicy(h=0.75), [1.0, 0.75, 0.5, 0.5, 0.5], 4),
        (StaticPolicy(k=4), [LO] * 10, 4),
        (AIMDPolicy(w_init=6), [LO] * 10, 6),
    ]
    for policy, confs, length in cases:
        assert run_round(policy, confs, device=device)[1] == length


@pytest.mark.parametrize(
    "cls, kwargs, key",
    [
        (StaticPolicy, {"k": 0}, "policy.k"),
        (StaticPolicy, {"k": -3}, "policy.k"),
        (StaticPolicy, {"k": 2.5}, "policy.k"),
        (StaticPolicy, {"k": True}, "policy.k"),
        (FailFastPolicy, {"tau": 1.5}, "policy.tau must be in [0, 1], got 1.5"),
        (FailFastPolicy, {"tau": -0.01}, "policy.tau must be in [0, 1]"),
        (FailFastPolicy, {"tau": "high"}, "policy.tau"),
        (FailFastPolicy, {"n": 0}, "policy.n must be an integer >= 1"),
        (FailFastPolicy, {"n": 10, "n_max": 5}, "policy.n_max must be an integer >= policy.n (10), got 5"),
        (FailFastPolicy, {"n_max": 60.0}, "policy.n_max"),
        (
            FailFastPolicy,
            {"confidence_scope": "block"},
            "policy.confidence_scope must be one of draft, small_block, got 'block'",
        ),
        (SpecDecPPPolicy, {"h": 0.0}, "policy.h must be in (0, 1], got 0.0"),
        (SpecDecPPPolicy, {"h": 1.2}, "policy.h must be in (0, 1]"),
        (SpecDecPPPolicy, {"min_length": 0}, "policy.min_length must be an integer >= 1"),
        (
            SpecDecPPPolicy,
            {"min_length": 5, "max_length": 4},
            "policy.max_length must be an integer >= policy.min_length (5)",
        ),
        (AIMDPolicy, {"mode": "cubic"}, "policy.mode must be one of aimd, heuristic, got 'cubic'"),
        (AIMDPolicy, {"w_init": 0}, "policy.w_init must be an integer in [1, 60]"),
        (AIMDPolicy, {"w_init": 61}, "policy.w_init"),
        (AIMDPolicy, {"w_init": 2, "w_min": 3}, "policy.w_init must be an integer in [3, 60]"),
        (AIMDPolicy, {"a": 0}, "policy.a must be an integer >= 1"),
        (AIMDPolicy, {"beta": 1.0}, "policy.beta must be in (0, 1), got 1.0"),
        (AIMDPolicy, {"beta": 0}, "policy.beta must be in (0, 1)"),
        (AIMDPolicy, {"w_min": 0}, "policy.w_min must be an integer >= 1"),
        (AIMDPolicy, {"n_max": 0}, "policy.n_max must be an integer >= policy.w_min (1)"),
        (AIMDPolicy, {"keep_across_prompts": "yes"}, "policy.keep_across_prompts"),
    ],
)
def test_bad_configuration_names_the_key(cls, kwargs, key):
    with pytest.raises(ValueError) as err:
        cls(**kwargs)
    assert key in str(err.value)


FACTORIES = {static: StaticPolicy, failfast: FailFastPolicy, specdecpp: SpecDecPPPolicy, aimd: AIMDPolicy}


@pytest.mark.parametrize(
    "name, config, cls, attrs",
    [
        ("static", {"k": 7}, StaticPolicy, {"k": 7}),
        ("failfast", {"tau": 0.3}, FailFastPolicy, {"tau": 0.3, "n": 10, "n_max": 60}),
        ("failfast", {}, FailFastPolicy, {"tau": 0.45, "n": 10, "n_max": 60, "confidence_scope": "draft"}),
        ("failfast", {"confidence_scope": "small_block"}, FailFastPolicy, {"confidence_scope": "small_block"}),
        ("specdecpp", {"h": 0.5, "max_length": 9}, SpecDecPPPolicy, {"h": 0.5, "min_length": 1, "max_length": 9}),
        ("aimd", {}, AIMDPolicy, {"mode": "aimd", "w_init": 5, "a": 2, "beta": 0.5, "w_min": 1, "n_max": 60}),
        ("aimd", {"mode": "heuristic", "w_init": 3}, AIMDPolicy, {"mode": "heuristic", "w": 3}),
    ],
)
def test_factories(name, config, cls, attrs):
    """Each built-in policy module declares one entry, whose factory builds its class."""
    declared = [e for m in FACTORIES for e in m.specpolicy_register() if e.name == name]
    assert len(declared) == 1 and declared[0].kind == "policy" and declared[0].description
    made = declared[0].factory(config=dict(config))
    assert type(made) is cls and made.name == name
    for attr, value in attrs.items():
        assert getattr(made, attr) == value
    assert not [e for m in FACTORIES for e in m.specpolicy_register() if e.name == "nope"]


def test_factory_rejects_bad_values():
    (entry,) = failfast.specpolicy_register()
    with pytest.raises(ValueError, match="policy.tau"):
        entry.factory(config={"tau": 2.0})
    with pytest.raises(ValueError, match="policy.tau"):
        entry.validate(config={"tau": 2.0})


def test_shipped_configs_build():
    """Each ``conf/policy/<choice>.yaml`` composes into a config that exactly one factory accepts."""
    import hydra
    from omegaconf import OmegaConf

    built = {}
    with hydra.initialize_config_module(version_base=None, config_module="specpolicy.conf"):
        for choice in ["static", "failfast", "specdecpp", "aimd", "heuristic"]:
            config = OmegaConf.to_container(hydra.compose("config", overrides=[f"policy={choice}"]).policy)
            name = config.pop("name")
            hits = [e for m in FACTORIES for e in m.specpolicy_register() if e.name == name]
            assert len(hits) == 1, choice
            built[choice] = hits[0].factory(config=dict(config))
    assert built["heuristic"].mode == "heuristic" and built["aimd"].mode == "aimd"
    assert type(built["failfast"]) is FailFastPolicy and (built["failfast"].n, built["failfast"].n_max) == (10, 60)


def test_plugin_manager_makes_policies():
    from specpolicy.plugins.manager import get_plugin_manager, make_policy

    pm = get_plugin_manager(autoload=False)
    policy = make_policy(pm, {"name": "failfast", "tau": 0.3})
    assert type(policy) is FailFastPolicy and policy.tau == 0.3 and policy.n == 10 and policy.n_max == 60
    assert type(make_policy(pm, {"name": "static", "k": 3})) is StaticPolicy
    assert type(make_policy(pm, {"name": "specdecpp"})) is SpecDecPPPolicy
    assert make_policy(pm, {"name": "aimd", "mode": "heuristic"}).mode == "heuristic"
    with pytest.raises(ValueError, match="no registered plugin"):
        make_policy(pm, {"name": "nope"})


# -- the real loop on tiny models ------------------------------------------------------------

MAX_NEW = 24
PROMPTS = [[3, 14, 15, 9, 26, 5], [27, 18, 28, 18], [1, 41, 42, 1, 7, 33, 2, 8]]


def tiny_qwen2(seed: int):
    """``conftest.tiny_lm`` with 50 tokens (float64: no argmax ties between cached/uncached), its head
    sharpened: confidences spread over (0, 1) instead of ~1/50."""
    return sharpen(tiny_lm(seed, vocab=50, max_positions=256, eos=None), 20.0)


@torch.no_grad()
def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding, full recompute every step (no cache, no loop code)."""
    ids = torch.tensor(prompt, dtype=torch.long)
    out = []
    for _ in range(n):
        nxt = int(model(input_ids=ids[None]).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt])])
    return out


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threading only adds overhead
    target = tiny_qwen2(0)
    noisy = copy.deepcopy(target)  # a drafter that agrees with the target part of the time
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2 * p.std())
    runtime = Runtime(device="cpu", dtype="float64")
    refs = [greedy_reference(target, p, MAX_NEW) for p in PROMPTS]
    yield {"target": target, "same": target, "noisy": noisy, "runtime": runtime, "refs": refs}
    torch.set_num_threads(threads)


POLICIES = {
    "static4": lambda: StaticPolicy(k=4),
    "failfast": lambda: FailFastPolicy(),
    "failfast-eager": lambda: FailFastPolicy(n=3, tau=0.2, n_max=25),
    "specdecpp": lambda: SpecDecPPPolicy(),
    "specdecpp-long": lambda: SpecDecPPPolicy(h=0.99, min_length=2, max_length=30),
    "aimd": lambda: AIMDPolicy(),
    "heuristic": lambda: AIMDPolicy(mode="heuristic", w_init=3),
}


def replay(make_policy, result, max_new_tokens: int) -> None:
    """Re-run the policy's rule on the recorded confidences of every round: the drafted
    length must be exactly what the rule gives (room = tokens left - 1)."""
    policy = make_policy()
    policy.reset()
    generated = 0
    for record in result.rounds:
        drafted = record.speculation_length - record.reused_tokens
        room = max_new_tokens - generated - 1
        confs = list(record.confidences[:drafted])
        answers, length = run_round(policy, confs + [0.0] * 200, room)  # padding is never reached
        assert length == drafted, (record.index, answers)
        policy.update(record)
        generated += record.emitted_tokens


# Reuse needs rejected tails, which the target drafting for itself never leaves.
@pytest.mark.parametrize(
    "drafter_kind, use_reuse",
    [("same", False), ("noisy", False), ("noisy", True)],
    ids=["same", "noisy", "noisy-reuse"],
)
@pytest.mark.parametrize("policy_name", list(POLICIES))
def test_loop_is_lossless(models, policy_name, drafter_kind, use_reuse):
    runtime = models["runtime"]
    verifier = HFVerifier(models["target"], runtime, frozenset())
    drafter = ARDrafter(models[drafter_kind], runtime)
    policy = POLICIES[policy_name]()
    reuse = DraftReuse(min_match=2) if use_reuse else None
    n_prompts = len(PROMPTS) if drafter_kind == "same" else 2  # the noisy drafter costs more passes
    for prompt, ref in zip(PROMPTS[:n_prompts], models["refs"]):
        result = generate(
            torch.tensor(prompt), verifier, runtime, max_new_tokens=MAX_NEW, drafter=drafter, policy=policy, reuse=reuse
        )
        assert result.output_ids.tolist() == ref
        assert result.finish_reason == "max_new_tokens"
        assert sum(r.emitted_tokens for r in result.rounds) == MAX_NEW
        if not use_reuse:
            assert all(r.reused_tokens == 0 for r in result.rounds)
            replay(POLICIES[policy_name], result, MAX_NEW)
        if drafter_kind == "same":  # the target drafting for itself: everything is accepted
            assert all(r.fully_accepted for r in result.rounds)


def test_loop_long_drafts_and_bonus_tokens(models):
    """Same weights, FailFast with tau=0: every round drafts up to N_max (or the room) and is
    fully accepted, so each round emits N_max + 1 tokens (the bonus token)."""
    runtime = models["runtime"]
    verifier = HFVerifier(models["target"], runtime, frozenset())
    drafter = ARDrafter(models["same"], runtime)
    result = generate(
        torch.tensor(PROMPTS[0]),
        verifier,
        runtime,
        max_new_tokens=MAX_NEW,
        drafter=drafter,
        policy=FailFastPolicy(n=4, tau=0.0, n_max=10),
    )
    assert result.output_ids.tolist() == models["refs"][0]
    # 11 + 11 + 2 = 24 tokens; the last round has room for 1 draft token only.
    assert [r.speculation_length for r in result.rounds] == [10, 10, 1]
    assert [r.emitted_tokens for r in result.rounds] == [11, 11, 2]
    assert [r.drafter_forward_passes for r in result.rounds] == [10, 10, 1]


def test_loop_reuse_happens_and_stays_lossless(models):
    runtime = models["runtime"]
    verifier = HFVerifier(models["target"], runtime, frozenset())
    drafter = ARDrafter(models["noisy"], runtime)
    reused = 0
    for prompt, ref in zip(PROMPTS[:2], models["refs"]):
        result = generate(
            torch.tensor(prompt),
            verifier,
            runtime,
            max_new_tokens=MAX_NEW,
            drafter=drafter,
            policy=FailFastPolicy(n=6, tau=0.0, n_max=12),
            reuse=DraftReuse(min_match=1),
        )
        assert result.output_ids.tolist() == ref
        reused += sum(r.reused_tokens for r in result.rounds)
    assert reused > 0


@pytest.mark.parametrize("policy_name", ["failfast-eager", "specdecpp-long", "aimd"])
def test_loop_stops_at_eos(models, policy_name):
    """EOS inside a long accepted draft: the output is cut right after it, as in greedy decoding."""
    runtime = models["runtime"]
    ref = models["refs"][0]
    eos = ref[17]
    expected = ref[: ref.index(eos) + 1]
    verifier = HFVerifier(models["target"], runtime, frozenset({eos}))
    for kind in ("same", "noisy"):
        result = generate(
            torch.tensor(PROMPTS[0]),
            verifier,
            runtime,
            max_new_tokens=MAX_NEW,
            drafter=ARDrafter(models[kind], runtime),
            policy=POLICIES[policy_name](),
            reuse=DraftReuse(),
        )
        assert result.output_ids.tolist() == expected
        assert result.finish_reason == "eos"


class _GlitchLM(torch.nn.Module):
    """The target, except that the token at absolute position ``pos`` is predicted as ``wrong``;
    ``wrong`` read as input stands for ``right``. A drafter on it makes exactly one "minor
    correction" (FailFast App. E) and its tokens after the slip are still the target's."""

    def __init__(self, target, pos: int, right: int, wrong: int) -> None:
        super().__init__()
        self.target, self.config = target, target.config
        self.pos, self.right, self.wrong = pos, right, wrong

    def forward(self, input_ids, cache=None, **kwargs):
        start = cache.get_seq_length() if cache is not None else 0
        ids = torch.where(input_ids == self.wrong, self.right, input_ids)
        out = self.target(input_ids=ids, cache=cache, **kwargs)
        if start + input_ids.shape[1] == self.pos:  # the last logit predicts position start + len
            logits = out.logits.clone()
            logits[0, -1, self.wrong] = logits[0, -1].max() + 1.0
            out.logits = logits
        return out


class _ScriptedPolicy(LengthPolicy):
    name = "scripted"

    def __init__(self, lengths: list[int]) -> None:
        self.lengths, self.round = lengths, 0

    def reset(self) -> None:
        self.round = 0

    def next_length(self, draft: Draft) -> int:
        return self.lengths[min(self.round, len(self.lengths) - 1)] if draft.length == 0 else 0

    def update(self, record: RoundRecord) -> None:
        self.round += 1


def test_loop_accepts_reused_tokens(models):
    """A 12-token draft slips at its 4th token; the next round drafts 3 correct tokens whose
    suffix occurs in the rejected tail, reuse appends the tail's remaining (correct) tokens,
    the target accepts them, and the drafter resumes after them: output still greedy."""
    runtime = models["runtime"]
    prompt, ref = PROMPTS[2], models["refs"][2]
    wrong = next(t for t in range(50) if t not in ref and t not in prompt)
    glitch = _GlitchLM(models["target"], pos=len(prompt) + 3, right=ref[3], wrong=wrong)
    result = generate(
        torch.tensor(prompt),
        HFVerifier(models["target"], runtime, frozenset()),
        runtime,
        max_new_tokens=MAX_NEW,
        drafter=ARDrafter(glitch, runtime),
        policy=_ScriptedPolicy([12, 3, 4]),
        reuse=DraftReuse(min_match=3),
    )
    assert result.output_ids.tolist() == ref
    first, second = result.rounds[:2]
    assert (first.speculation_length, first.accepted_length) == (12, 3)
    assert second.reused_tokens > 0 and second.fully_accepted  # reused tokens accepted, plus the bonus
    assert second.speculation_length == 3 + second.reused_tokens


# -- aimd: speculation off when it does not pay (off_when_slower) ------------------------------


def timed(k: int, accepted: int, ms: float, emitted: int | None = None) -> RoundRecord:
    """A round that took ``ms`` milliseconds (40% drafting, 60% verification)."""
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=accepted,
        emitted_tokens=accepted + 1 if emitted is None else emitted,
        drafter_forward_passes=k,
        reused_tokens=0,
        draft_ms=0.4 * ms,
        verify_ms=0.6 * ms,
    )


def drive_switch(policy: AIMDPolicy, spec_rounds, plain_ms: float = 2.0) -> str:
    """Drive ``policy`` through rounds: when its first answer is 0 the round is plain decoding
    (1 token in ``plain_ms``); otherwise the next entry of ``spec_rounds`` ((accepted, ms) of a
    round drafting the policy's answer) is used. Returns "P" / "S" per round."""
    out, spec = [], iter(spec_rounds)
    while True:
        k = run_round(policy, [LO] * BIG_ROOM)[1]
        if k == 0:
            out.append("P")
            policy.update(timed(0, 0, plain_ms))
            continue
        try:
            accepted, ms = next(spec)
        except StopIteration:
            return "".join(out)
        out.append("S")
        policy.update(timed(k, min(accepted, k), ms))


SLOW = (1, 10.0)  # 2 tokens in 10 ms = 0.2 tokens/ms, plain decoding 1 token in 2 ms = 0.5
FAST = (5, 4.0)  # 6 tokens in 4 ms (when k >= 5) = 1.5 tokens/ms


@pytest.mark.parametrize(
    "spec_rounds, expected",
    [
        # first round plain (the plain estimate); speculation slower: off for 3 rounds, probe,
        # still slower: off twice as long (6), then capped at backoff_max (8)
        ([SLOW] * 5, "P" + "S" + "PPP" + "S" + "P" * 6 + "S" + "P" * 8 + "S" + "P" * 8 + "S" + "P" * 8),
        # speculation faster: on for good after the first plain round
        ([FAST] * 6, "P" + "S" * 6),
        # slower, then the probe is faster: on again until the average after the back-off
        # (3 + 5 + 2 + 2 tokens in 4 + 4 + 10 + 10 ms) falls below plain decoding's, after two
        # slow rounds; the back-off is 3 rounds again, not 6, and the last (slow) probe doubles it
        ([SLOW, FAST, FAST, SLOW, SLOW, SLOW], "P" + "S" + "PPP" + "S" + "S" + "SS" + "PPP" + "S" + "P" * 6),
        # the speculative speed is an average: one slow round after fast ones keeps it on
        ([FAST, FAST, FAST, SLOW, FAST], "P" + "SSSSS"),
    ],
    ids=["slower", "faster", "probe-succeeds", "averaged"],
)
def test_aimd_switches_speculation_off_when_slower(spec_rounds, expected):
    policy = AIMDPolicy(w_init=5, n_max=20, off_when_slower=True, backoff_rounds=3, backoff_max=8, probe_rounds=1)
    assert drive_switch(policy, spec_rounds) == expected


def test_aimd_switch_state_carries_across_prompts_and_plain_rounds_keep_the_window():
    policy = AIMDPolicy(w_init=5, n_max=20, off_when_slower=True, backoff_rounds=4, backoff_max=8, probe_rounds=1)
    assert policy.next_length(make_draft([])) == 0  # the plain probe
    policy.update(timed(0, 0, 2.0))
    assert policy.next_length(make_draft([])) == 5
    policy.update(timed(5, 1, 10.0))  # slower than plain decoding: off
    w = policy.w
    policy.reset()  # a new prompt: the window restarts, the measured decision does not
    assert policy.w == 5 and policy.off_left == 4 and not policy.speculating
    for _ in range(4):
        assert policy.next_length(make_draft([])) == 0
        policy.update(timed(0, 0, 2.0))
    assert policy.w == 5 and policy.speculating  # plain rounds leave the window alone
    assert w == 2  # the slow round (1 of 5 accepted) had halved it


def test_aimd_without_the_switch_or_without_timings_never_stops_speculating():
    plain = AIMDPolicy(w_init=5)
    assert drive_switch(plain, [SLOW] * 5) == "SSSSS"  # the default: the window rule only
    untimed = AIMDPolicy(w_init=5, off_when_slower=True, probe_rounds=1)
    assert untimed.next_length(make_draft([])) == 0  # the plain probe round
    untimed.update(rec(0, 0))  # no timings: nothing measured, nothing decided
    for _ in range(5):
        assert untimed.next_length(make_draft([])) > 0
        untimed.update(rec(untimed.w, 0))


@pytest.mark.parametrize(
    "spec_rounds, expected",
    [
        # three plain rounds first; a slow first speculative round alone decides nothing
        ([SLOW, FAST, FAST, FAST, FAST], "PPP" + "SSSSS"),
        # three slow rounds: off for 3 plain rounds, then a fresh probe of three rounds
        ([SLOW] * 6, "PPP" + "SSS" + "PPP" + "SSS" + "P" * 6),
    ],
    ids=["one-slow-round", "slow-probe"],
)
def test_aimd_switch_measures_probe_rounds_before_deciding(spec_rounds, expected):
    policy = AIMDPolicy(w_init=5, n_max=20, off_when_slower=True, backoff_rounds=3, backoff_max=8, probe_rounds=3)
    assert drive_switch(policy, spec_rounds) == expected


def test_aimd_speed_is_a_ratio_of_averages_not_an_average_of_ratios():
    """Rounds of 2 tokens in 40 ms and 11 tokens in 60 ms: 13 tokens in 100 ms = 0.13 tokens/ms
    (the throughput), while the mean of the per-round rates would be (0.05 + 0.183) / 2 = 0.117."""
    policy = AIMDPolicy(w_init=10, n_max=20, off_when_slower=True, probe_rounds=2)
    for _ in range(2):  # the plain probe: 1 token in 8 ms = 0.125 tokens/ms
        assert policy.next_length(make_draft([])) == 0
        policy.update(timed(0, 0, 8.0))
    assert policy.next_length(make_draft([])) == 10
    policy.update(timed(10, 1, 40.0))
    policy.update(timed(10, 10, 60.0, emitted=11))
    assert policy.spec.rate == pytest.approx(0.13)
    assert policy.speculating  # 0.13 > 0.125: on (the mean of ratios, 0.117, would switch it off)


@pytest.mark.parametrize(
    "key, value", [("off_when_slower", 1), ("backoff_rounds", 0), ("backoff_max", 2), ("probe_rounds", 0)]
)
def test_aimd_switch_bad_values_name_the_key(key, value):
    kwargs = {"backoff_rounds": 4, key: value}
    with pytest.raises(ValueError, match=f"policy.{key}"):
        AIMDPolicy(**kwargs)


def test_aimd_off_rounds_are_recorded_as_length_0_and_stay_lossless(models):
    runtime = models["runtime"]
    policy = AIMDPolicy(off_when_slower=True, backoff_rounds=2, backoff_max=4, probe_rounds=1)
    verifier = HFVerifier(models["target"], runtime, frozenset())
    for prompt, ref in zip(PROMPTS, models["refs"]):
        result = generate(
            torch.tensor(prompt),
            verifier,
            runtime,
            max_new_tokens=MAX_NEW,
            drafter=ARDrafter(models["noisy"], runtime),
            policy=policy,
        )
        assert result.output_ids.tolist() == ref
        for r in result.rounds:
            if r.speculation_length == 0:
                assert r.draft_stop_reason in ("length_0", "room")
            assert r.draft_stop_reason != "length_0" or r.speculation_length == 0
    # the very first round of the policy's life is the plain probe
    fresh = AIMDPolicy(off_when_slower=True)
    first = generate(
        torch.tensor(PROMPTS[0]),
        verifier,
        runtime,
        max_new_tokens=MAX_NEW,
        drafter=ARDrafter(models["noisy"], runtime),
        policy=fresh,
    ).rounds[0]
    assert (first.speculation_length, first.draft_stop_reason) == (0, "length_0")


@pytest.mark.parametrize(
    "make, allowed",
    [
        (lambda: FailFastPolicy(n=3, tau=0.5, n_max=9), {"low_confidence", "n_max", "room"}),
        (lambda: SpecDecPPPolicy(h=0.5, max_length=6), {"low_confidence", "policy_bound", "room"}),
        (lambda: StaticPolicy(k=4), {"policy_bound", "room"}),
    ],
)
def test_policies_report_why_drafting_stopped(models, make, allowed):
    runtime = models["runtime"]
    seen = set()
    for prompt in PROMPTS:
        result = generate(
            torch.tensor(prompt),
            HFVerifier(models["target"], runtime, frozenset()),
            runtime,
            max_new_tokens=MAX_NEW,
            drafter=ARDrafter(models["noisy"], runtime),
            policy=make(),
        )
        seen |= {r.draft_stop_reason for r in result.rounds}
        last = result.rounds[-1]
        assert last.speculation_length == 0 or last.draft_stop_reason == "room" or last.draft_stop_reason in allowed
    assert seen <= allowed and seen - {"room"}


def test_failfast_stop_reasons_by_rule():
    policy = FailFastPolicy(n=2, tau=0.5, n_max=4)
    assert policy.next_length(make_draft([HI, LO])) == 0 and policy.draft_stop_reason == "low_confidence"
    assert policy.next_length(make_draft([HI] * 4)) == 0 and policy.draft_stop_reason == "n_max"
    spp = SpecDecPPPolicy(h=0.5, max_length=3)
    assert spp.next_length(make_draft([LO])) == 0 and spp.draft_stop_reason == "low_confidence"
    assert spp.next_length(make_draft([HI] * 3)) == 0 and spp.draft_stop_reason == "policy_bound"


# -- a policy that never ends its drafts (the protocol misread) -----------------------------------


class _AlwaysThree(LengthPolicy):
    """The README's first attempt: "3 tokens per round", answered after every extension too."""

    name = "always3"

    def next_length(self, draft: Draft) -> int:
        return 3


class _ThreeThenStop(LengthPolicy):
    """The same intent written as the protocol asks."""

    name = "three"

    def next_length(self, draft: Draft) -> int:
        return max(3 - draft.length, 0)


def test_a_policy_that_never_answers_0_is_warned_about_once_per_run(capsys):
    runtime = Runtime("cpu", "float64")
    verifier = HFVerifier(tiny_lm(seed=0), runtime, frozenset())
    drafter = ARDrafter(tiny_lm(seed=1), runtime)  # another model: drafts are rejected, many rounds
    prompts = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7])]
    runaway, fixed = _AlwaysThree(), _ThreeThenStop()
    for prompt in prompts:
        out = generate(prompt, verifier, runtime, max_new_tokens=24, drafter=drafter, policy=runaway)
        assert out.rounds[0].speculation_length == 23  # the whole room, not 3
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: policy 'always3' answered next_length with 3 after every extension and never with 0, "
        "so its drafts grew until the room ran out (22 tokens after 9 answers; 2 rounds so far): "
        "next_length is asked again after each extension and a draft ends only when it answers 0 -- "
        "for k tokens per round, answer max(k - draft.length, 0) (docs: How-to, Write a policy plugin)"
    ]
    for prompt in prompts:  # the protocol followed: 3-token drafts, no warning
        out = generate(prompt, verifier, runtime, max_new_tokens=24, drafter=drafter, policy=fixed)
        assert {r.speculation_length for r in out.rounds} <= {0, 1, 2, 3}
    filling = FailFastPolicy(n=3, tau=0.0, n_max=60)  # fills the room by design (n_max > max_new_tokens)
    generate(prompts[0], verifier, runtime, max_new_tokens=24, drafter=drafter, policy=filling)
    assert capsys.readouterr().err == ""
