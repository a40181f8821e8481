"""The ``eagle3`` drafter: chain drafts equal a no-cache reference of EAGLE-3's semantics on a tiny
checkpoint in the EAGLE / SpecForge layout (draft vocabulary with ``d2t``), through the loop and for
arbitrary accepted lengths; losslessness with every built-in policy, greedy and sampling; checkpoint
checks against the target, one line each."""

from __future__ import annotations

import json

import pytest
import torch

from conditioned_reference import committed_after, eagle3_reference, write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.errors import ConfigError
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.eagle3 import Eagle3Drafter, check_fits_target
from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier

LAYERS = 6  # target depth: default feature layers [2, 3, 3]
DRAFT_VOCAB = 30  # target ids 0, 2, ..., 58


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=LAYERS, vocab=VOCAB).float(), 4.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), 32, VOCAB, DRAFT_VOCAB, with_embeddings=True)


@pytest.fixture
def rt():
    return Runtime(device="cpu", dtype="float32", seed=0)


def _drafter(checkpoint, target, rt, stop=()):
    layers = tuple(default_layer_ids(LAYERS))
    return Eagle3Drafter(load_eagle3(checkpoint), target.get_input_embeddings(), layers, VOCAB, rt, stop)


def _features(target, seq, start, stop):
    hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0, start:stop] for i in default_layer_ids(LAYERS)], -1)


def test_checkpoint_layout(checkpoint):
    model = load_eagle3(checkpoint)  # embed_tokens in the file is ignored: the target's are used
    assert model.spec.draft_vocab_size == DRAFT_VOCAB and model.spec.layer_ids is None
    assert torch.equal(model.to_target_ids(torch.arange(3)), torch.tensor([0, 2, 4]))
    assert model.spec.feature_layers(32) == (2, 16, 29)  # INPUT of layers [2, L//2, L-3]: hidden_states[i]


def test_chain_drafts_equal_the_reference_through_the_loop(checkpoint, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(checkpoint, target, rt)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 4})
    for prompt in random_prompts(3):
        rounds = []
        generate(prompt, verifier, rt, max_new_tokens=20, drafter=drafter, policy=policy, on_round=rounds.append)
        committed = prompt.clone()
        for r in rounds:
            want = eagle3_reference(checkpoint, target, committed, len(r.draft_token_ids), default_layer_ids(LAYERS))
            assert r.draft_token_ids == tuple(want.tolist())
            assert r.drafter_forward_passes == len(r.draft_token_ids)
            assert r.speculation_length == len(r.draft_token_ids)  # the length the drafter counted (Draft.counted)
            committed = committed_after(committed, r)


@torch.no_grad()
def test_chain_drafts_equal_the_reference_for_any_accepted_lengths(checkpoint, target, rt):
    g = torch.Generator().manual_seed(3)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(0, VOCAB - 1, (8,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 7))
    for accept in (2, 0, None, 5, 1, 5):
        if accept is None:
            draft, a = Draft.empty(), 0
        else:
            draft = drafter.draft(2)
            draft = drafter.draft(3)  # extended within the round
            assert torch.equal(
                draft.token_ids, eagle3_reference(checkpoint, target, committed, 5, default_layer_ids(LAYERS))
            )
            a = accept
        nxt = torch.randint(0, VOCAB - 1, (1,), generator=g)
        new = torch.cat([committed, draft.token_ids[:a], nxt])
        drafter.commit(
            draft,
            Verification(
                a,
                int(nxt),
                torch.cat([draft.token_ids[:a], nxt]),
                features=_features(target, new, committed.shape[0] - 1, committed.shape[0] + a),
            ),
        )
        committed = new
        # committed pairs only: cached, or waiting for the next round's first pass
        waiting = drafter._features.shape[0] + sum(f.shape[0] for f, _ in drafter._waiting)
        assert drafter.cache.length + waiting == committed.shape[0] - 1
    # the last commit too
    drafter.draft(2)
    assert torch.equal(
        drafter.draft(3).token_ids, eagle3_reference(checkpoint, target, committed, 5, default_layer_ids(LAYERS))
    )


@pytest.mark.parametrize(
    "policy",
    [
        {"name": "static", "k": 3},
        {"name": "failfast", "n": 3, "tau": 0.3, "n_max": 12},
        pytest.param({"name": "specdecpp"}, marks=pytest.mark.slow),  # the fast subset: static, FailFast
        pytest.param({"name": "aimd"}, marks=pytest.mark.slow),
        pytest.param({"name": "goodput"}, marks=pytest.mark.slow),
    ],
)
def test_lossless_with_every_policy(checkpoint, target, rt, policy):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafter(checkpoint, target, rt, stop=frozenset({EOS}))
    built = make_policy(get_plugin_manager(autoload=False), policy)
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=30)
        assert torch.equal(
            generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=built).output_ids,
            vanilla.output_ids,
        )


def test_a_one_token_prompt_drafts_nothing_then_continues(checkpoint, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(checkpoint, target, rt)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 3})
    rounds = []
    out = generate(
        torch.tensor([9]), verifier, rt, max_new_tokens=8, drafter=drafter, policy=policy, on_round=rounds.append
    )
    assert rounds[0].speculation_length == 0 and rounds[0].draft_stop_reason == "no_proposal"
    assert rounds[1].speculation_length == 3
    assert torch.equal(out.output_ids, generate(torch.tensor([9]), verifier, rt, max_new_tokens=8).output_ids)


def test_sampling_q_lives_on_the_draft_vocabulary(checkpoint, target, rt):
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(0, VOCAB - 1, (6,), generator=torch.Generator().manual_seed(5))
    drafter.prefill(
        committed,
        sampling=SamplingConfig(temperature=1.0, top_k=0, top_p=1.0),
        features=_features(target, committed, 0, 5),
    )
    draft = drafter.draft(4)
    assert draft.probs.shape == (4, VOCAB)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
    assert not draft.probs[:, 1::2].any()  # odd target ids are not in the draft vocabulary
    assert bool((draft.probs.gather(1, draft.token_ids[:, None]) > 0).all())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 48}, "target_hidden_size 32 does not match the target's hidden size 48"),
        ({"vocab_size": 100}, "do not fit the target's vocabulary of 100"),
        ({"num_hidden_layers": 2}, "must be three layers of the target's 2"),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_target_is_one_line(checkpoint, change, message):
    config = json.loads((checkpoint / "config.json").read_text())
    if change.get("num_hidden_layers"):
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 5]}
    target = {"num_hidden_layers": LAYERS, "hidden_size": 32, "vocab_size": VOCAB, **change}
    with pytest.raises(ConfigError) as err:
        check_fits_target(config, target, "drafter.model='x'")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_explicit_layer_ids_are_read_by_the_engines_convention(tmp_path):
    """Explicit ``eagle_aux_hidden_state_layer_ids`` [1, 3, 4]: vLLM reads inputs of those layers
    (hidden_states[i]), SGLang / SpecForge outputs (hidden_states[i + 1]); the default ids are the
    input of [2, L//2, L-3] either way, and a saved checkpoint writes ids only when not the default."""
    from specpolicy.models.eagle3 import checkpoint_config

    path = write_eagle3_checkpoint(tmp_path / "ids", 32, VOCAB, VOCAB, layer_ids=[1, 3, 4])
    config = json.loads((path / "config.json").read_text())
    target = {"num_hidden_layers": LAYERS, "hidden_size": 32, "vocab_size": VOCAB}
    assert check_fits_target(config, target, "k") == (1, 3, 4)
    assert check_fits_target(config, target, "k", "output") == (2, 4, 5)
    default = load_eagle3(write_eagle3_checkpoint(tmp_path / "default", 32, VOCAB, VOCAB))
    assert default.spec.feature_layers(LAYERS, "output") == default.spec.feature_layers(LAYERS) == (2, 3, 3)
    assert "eagle_config" not in checkpoint_config(default, LAYERS)
    mine = load_eagle3(path)
    assert checkpoint_config(mine, LAYERS)["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    with pytest.raises(ValueError, match="drafter.layer_id_convention must be one of input, output, got 'x'"):
        mine.spec.feature_layers(LAYERS, "x")


@torch.no_grad()
def test_the_reported_hidden_state_is_the_norm_its_logits_read_computed_once(checkpoint, target, rt):
    """``report_hidden``: each drafted token's row of ``extras[LAST_HIDDEN]`` is the LM head's input of
    its pass, normed once per pass (the eager pass keeps it: ``Eagle3Runner.normed``) and equal to
    normalising the pass's output again, as before."""
    from specpolicy.core.types import LAST_HIDDEN

    committed = torch.randint(0, VOCAB - 1, (8,), generator=torch.Generator().manual_seed(5))
    reported, norms = [], []
    for keep_normed in (True, False):
        drafter = _drafter(checkpoint, target, rt)
        drafter.report_hidden = True
        if not keep_normed:  # the pass keeps nothing: the drafter normalises its output itself
            one = drafter.runner.one

            def forgetful(p, one=one, runner=drafter.runner):
                out = one(p)
                runner.normed = None
                return out

            drafter.runner.one = forgetful
        calls = []
        handle = drafter.model.norm.register_forward_hook(lambda *_: calls.append(1))
        drafter.prefill(committed, features=_features(target, committed, 0, 7))
        draft = drafter.draft(4)
        handle.remove()
        reported.append((draft.token_ids, draft.extras[LAST_HIDDEN]))
        norms.append(len(calls))
    assert draft.forward_passes == 4 and reported[0][1].shape[0] == 4
    assert torch.equal(reported[0][0], reported[1][0]) and torch.equal(reported[0][1], reported[1][1])
    assert norms == [4, 8]  # once per pass, against twice when the pass keeps nothing
