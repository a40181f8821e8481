"""The ``dflash`` drafter: drafts exactly the official DFlash semantics (checked against a no-cache
reference on a tiny checkpoint written in the official layout), through the real loop and with
arbitrary accepted lengths; extension passes; losslessness with every built-in policy, greedy and
sampling; its checkpoint checks against the target, one line each."""

from __future__ import annotations

import json

import pytest
import torch

from conditioned_reference import committed_after, dflash_reference, write_dflash_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.errors import ConfigError
from specpolicy.core.features import FeaturesUnsupported
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.dflash import DFlashDrafter, build, check_fits_target
from specpolicy.models.dflash import load_dflash
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier

B, MASK, LAYER_IDS = 8, 5, [0, 2]


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=4, vocab=VOCAB).float(), 4.0)


#: a draft vocabulary (the opt-in extension): every other target id, and the stop token
DRAFT_VOCAB = sorted(set(range(0, VOCAB, 2)) | {EOS})


@pytest.fixture(scope="module", params=["official", "draft-vocab"])
def checkpoint(tmp_path_factory, request):
    """A tiny checkpoint in the official layout, and one with a draft vocabulary: every test runs on both."""
    return write_dflash_checkpoint(
        tmp_path_factory.mktemp("dflash"),
        32,
        VOCAB,
        4,
        LAYER_IDS,
        B,
        MASK,
        draft_vocab=DRAFT_VOCAB if request.param == "draft-vocab" else None,
    )


def _drafter(checkpoint, target, runtime, stop=()):
    model = load_dflash(checkpoint).to(runtime.torch_dtype)
    return DFlashDrafter(model, target.get_input_embeddings(), target.get_output_embeddings(), runtime, stop)


@pytest.fixture
def rt():
    return Runtime(device="cpu", dtype="float32", seed=0)


def test_checkpoint_reads_both_config_layouts(tmp_path):
    old = write_dflash_checkpoint(tmp_path / "old", 32, VOCAB, 4, LAYER_IDS, B, MASK, top_level=True)
    new = write_dflash_checkpoint(tmp_path / "new", 32, VOCAB, 4, LAYER_IDS, B, MASK)
    for d in (old, new):
        spec = load_dflash(d).spec
        assert (spec.block_size, spec.mask_token_id, spec.target_layer_ids) == (B, MASK, tuple(LAYER_IDS))
        assert spec.feature_layers == (1, 3)  # DFlash id i = output of layer i = hidden_states[i + 1]


def test_drafts_equal_the_official_semantics_through_the_loop(checkpoint, target, rt):
    """policy=static k=B-1 with the real verifier: every round's draft is what the reference drafts
    from the committed sequence of that round."""
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter(checkpoint, target, rt)
    policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": B - 1})
    for prompt in random_prompts(3):
        rounds = []
        generate(prompt, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy, on_round=rounds.append)
        committed = prompt.clone()
        for r in rounds:
            want = dflash_reference(checkpoint, target, committed)
            assert len(r.draft_token_ids) == B - 1 or r.draft_stop_reason == "room"
            assert r.draft_token_ids == tuple(want.tolist())[: len(r.draft_token_ids)]
            assert r.speculation_length == len(r.draft_token_ids)  # the length the drafter counted (Draft.counted)
            committed = committed_after(committed, r)


def _features(target, seq, start, stop):
    hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0, start:stop] for i in LAYER_IDS], -1)


@torch.no_grad()
def test_drafts_equal_the_reference_for_any_accepted_lengths(checkpoint, target, rt):
    """Commits of every accepted length (0 .. B-1, some with the bonus token) and a plain-decoding
    round in between: the drafter's cache never drifts from a fresh computation."""
    g = torch.Generator().manual_seed(4)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (9,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 8))
    for accept in (3, 0, 7, 1, None, 5, 7):
        if accept is None:  # a plain-decoding round: nothing drafted, one token committed
            draft, a = Draft.empty(), 0
        else:
            draft = drafter.draft(B - 1)
            assert torch.equal(draft.token_ids, dflash_reference(checkpoint, target, committed))
            a = accept
        nxt = torch.randint(6, VOCAB - 1, (1,), generator=g)
        new = torch.cat([committed, draft.token_ids[:a], nxt])
        verification = Verification(
            a,
            int(nxt),
            torch.cat([draft.token_ids[:a], nxt]),
            features=_features(target, new, committed.shape[0] - 1, committed.shape[0] + a),
        )
        drafter.commit(draft, verification)
        committed = new
        assert drafter.cache.length <= committed.shape[0] - 1
    # the last commit too: its features enter the cache with the next pass
    assert torch.equal(drafter.draft(B - 1).token_ids, dflash_reference(checkpoint, target, committed))
    assert drafter.cache.length == committed.shape[0] - 1  # every committed position but the pending one


@torch.no_grad()
def test_extension_passes_give_the_drafted_tokens_before_the_masks(checkpoint, target, rt):
    g = torch.Generator().manual_seed(5)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (12,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 11))
    first = drafter.draft(3)
    assert first.forward_passes == 1 and first.length == 3 and first.lookahead == B - 1 - 3
    assert torch.allclose(first.lookahead_confidences, drafter.draft(B - 4).confidences[3:])
    longer = drafter.draft(B)  # past one block: an extension pass, then another
    assert longer.length == 2 * (B - 1) + 1 and longer.forward_passes == 3
    one = dflash_reference(checkpoint, target, committed)
    two = dflash_reference(checkpoint, target, committed, given=one)
    three = dflash_reference(checkpoint, target, committed, given=torch.cat([one, two]))
    assert torch.equal(longer.token_ids, torch.cat([one, two, three])[: longer.length])


def test_a_drafted_stop_token_ends_the_draft(checkpoint, target, rt):
    committed = torch.randint(6, VOCAB - 1, (7,), generator=torch.Generator().manual_seed(6))
    full = dflash_reference(checkpoint, target, committed)
    stop = int(full[2])
    drafter = _drafter(checkpoint, target, rt, stop=frozenset({stop}))
    drafter.prefill(committed, features=_features(target, committed, 0, 6))
    draft = drafter.draft(B - 1)
    first = int((full == stop).int().argmax())
    assert draft.ends_at_stop_token and draft.length == first + 1 and draft.lookahead == 0


@pytest.mark.parametrize(  # the fast subset: a short static draft and FailFast; the rest slow
    "policy",
    [
        {"name": "static", "k": 3},
        pytest.param({"name": "static", "k": 20}, marks=pytest.mark.slow),
        {"name": "failfast", "n": 4, "tau": 0.3, "n_max": 30},
        pytest.param({"name": "specdecpp"}, marks=pytest.mark.slow),
        pytest.param({"name": "aimd"}, marks=pytest.mark.slow),
        pytest.param({"name": "goodput"}, marks=pytest.mark.slow),
    ],
)
def test_lossless_with_every_policy(checkpoint, target, rt, policy):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafter(checkpoint, target, rt, stop=frozenset({EOS}))
    built = make_policy(get_plugin_manager(autoload=False), policy)
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=40)
        spec = generate(prompt, verifier, rt, max_new_tokens=40, drafter=drafter, policy=built)
        assert torch.equal(spec.output_ids, vanilla.output_ids)


def test_sampling_reports_the_distribution_each_token_was_drawn_from(checkpoint, target, rt):
    sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (10,), generator=torch.Generator().manual_seed(7))
    drafter.prefill(committed, sampling=sampling, features=_features(target, committed, 0, 9))
    draft = drafter.draft(2 * B)
    assert draft.probs.shape == (draft.length, VOCAB)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(draft.length))
    assert bool((draft.probs.gather(1, draft.token_ids[:, None]) > 0).all())
    torch.testing.assert_close(draft.confidences, draft.probs.max(-1).values)
    d2t = load_dflash(checkpoint).state_dict().get("d2t")
    if d2t is not None:  # q lives on the draft vocabulary: zero on every other target id
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[torch.arange(d2t.shape[0]) + d2t] = False
        assert float(draft.probs[:, outside].abs().sum()) == 0.0


def test_alternatives_are_target_ids_led_by_the_drafted_token(checkpoint, target, rt):
    """Tree policies read ``alternatives``: target ids (a draft vocabulary's mapped back), best
    first, column 0 the greedy drafted token."""
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (9,), generator=torch.Generator().manual_seed(11))
    drafter.prefill(committed, features=_features(target, committed, 0, 8))
    draft = drafter.draft(B - 1)
    ids, probs = drafter.alternatives(3)
    assert torch.equal(ids[:, 0], draft.token_ids)
    assert bool((probs[:, :-1] >= probs[:, 1:]).all())
    if "d2t" in load_dflash(checkpoint).state_dict():  # draft ids mapped back to the target ids they stand for
        assert set(ids.flatten().tolist()) <= set(DRAFT_VOCAB)


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cached, new, block", [(6, 3, B), (0, 4, B), (6, 0, B), (0, 0, B), (5, 2, 3 * B - 2)])
def test_the_one_request_pass_equals_caching_then_forward(checkpoint, dtype, cached, new, block):
    """``draft_pass`` (new context joined to the block's projections, stacked weights) gives what
    ``context_keys_values`` then ``forward`` give, to float rounding in float32 and bfloat16 alike:
    the output and the cache afterwards; with and without a cached context, with and without new
    positions, and for an extension pass's longer block. Not bit for bit: one joint multiply and two
    separate ones may be blocked differently by the BLAS (it picks kernels by shape and CPU; exact on
    an AVX2 host, a few ulp apart on an AVX-512 one)."""
    _check_pass_equals_forward(load_dflash(checkpoint).to(dtype), dtype, cached, new, block)


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_request_pass_equals_caching_then_forward_with_biases(checkpoint, dtype):
    """The same with ``attention_bias`` (q/k/v and o biases, added inside the transposed
    projections' multiply as ``F.linear`` adds them)."""
    from specpolicy.models.dflash import DFlashDraftModel, qwen3_config

    reference = load_dflash(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    torch.manual_seed(3)
    biased = DFlashDraftModel(qwen3_config({**config, "attention_bias": True}), reference.spec)
    assert biased.layers[0].self_attn.o_proj.bias is not None
    _check_pass_equals_forward(biased.to(dtype), dtype, 6, 3, B)


def _check_pass_equals_forward(model, dtype, cached, new, block):
    from specpolicy.models.kv import KVCache

    model.fuse()
    g = torch.Generator().manual_seed(12)
    old, fresh = torch.randn(1, cached, 64, generator=g).to(dtype), torch.randn(1, new, 64, generator=g).to(dtype)
    block_embeds = torch.randn(1, block, 32, generator=g).to(dtype)
    slow, fast = KVCache(2), KVCache(2)
    for cache in (slow, fast):
        if cached:
            for i, (k, v) in enumerate(model.context_keys_values(old, torch.arange(cached)[None])):
                cache.append(i, k, v)
    if new:
        for i, (k, v) in enumerate(model.context_keys_values(fresh, torch.arange(cached, cached + new)[None])):
            slow.append(i, k, v)
    context = [slow.layer(i) for i in range(2)] if slow.length else None
    want = model(block_embeds, torch.arange(cached + new, cached + new + block)[None], context)
    got = model.draft_pass(block_embeds, fast, fresh if new else None)
    torch.testing.assert_close(got, want)  # the dtype's default tolerances: float rounding, no more
    assert fast.length == slow.length == cached + new
    for i in range(2 if fast.length else 0):
        torch.testing.assert_close(fast.keys[i], slow.keys[i])
        torch.testing.assert_close(fast.values[i], slow.values[i])


def test_rope_past_the_table_and_before_fuse(checkpoint):
    """Positions past ``max_position_embeddings`` get RoPE computed, equal to the table's formula;
    ``draft_pass`` before ``fuse`` says what is missing."""
    from specpolicy.models.dflash import _signed
    from specpolicy.models.kv import KVCache

    model = load_dflash(checkpoint)
    with pytest.raises(RuntimeError, match="needs fuse"):
        model.draft_pass(torch.zeros(1, B, 32), KVCache(2), None)
    model.fuse()
    end = model.rope_cos.shape[0]
    for start, stop in ((end - 5, end), (end - 3, end + 4)):
        cos, sin = model._rope_at(start, stop)
        want_cos, want_sin = _signed(*model.rope(model.fc.weight, torch.arange(start, stop)[None]))
        torch.testing.assert_close(cos, want_cos)
        torch.testing.assert_close(sin, want_sin)


def _target_config(**changes):
    base = {"num_hidden_layers": 4, "hidden_size": 32, "vocab_size": VOCAB}
    return {**base, **changes}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 48}, "hidden_size 32 does not match the target's 48"),
        ({"vocab_size": 100}, "vocab_size 64 does not match the target's 100"),
        ({"num_hidden_layers": 2}, "target_layer_ids [0, 2] name layers the target does not have ([2]"),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_target_is_one_line(checkpoint, change, message):
    draft_config = json.loads((checkpoint / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        check_fits_target(draft_config, _target_config(**change), "drafter.model='x'")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_draft_vocabulary_that_does_not_fit_is_one_line(tmp_path, target, rt):
    """``draft_vocab_size`` beyond the target's vocabulary (from config.json, before loading), and a
    ``d2t`` mapping outside it or onto one id twice (once loaded): one line each."""
    big = write_dflash_checkpoint(tmp_path / "big", 32, VOCAB, 4, LAYER_IDS, B, MASK, draft_vocab=list(range(VOCAB)))
    config = json.loads((big / "config.json").read_text())
    config["dflash_config"]["draft_vocab_size"] = VOCAB + 1
    with pytest.raises(ConfigError) as err:
        check_fits_target(config, _target_config(), "drafter.model='x'")
    assert "draft_vocab_size 65 exceeds the target's vocabulary of 64" in str(err.value)
    verifier = HFVerifier(target, rt, frozenset())
    for name, ids in (("outside", [1, 2, VOCAB + 3]), ("twice", [1, 2, 2])):
        ckpt = write_dflash_checkpoint(tmp_path / name, 32, VOCAB, 4, LAYER_IDS, B, MASK, draft_vocab=ids)
        with pytest.raises(ConfigError) as err:
            build({"model": str(ckpt)}, rt, verifier)
        assert "d2t maps the draft vocabulary outside the target's vocabulary of 64" in str(err.value)
        assert "\n" not in str(err.value)
    # half a draft vocabulary: d2t without draft_vocab_size in config.json, and the other way round
    half = write_dflash_checkpoint(tmp_path / "half", 32, VOCAB, 4, LAYER_IDS, B, MASK, draft_vocab=[1, 2, 5])
    config = json.loads((half / "config.json").read_text())
    del config["dflash_config"]["draft_vocab_size"]
    (half / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError,
        match=r"the weights have d2t but config.json has no draft_vocab_size "
        r"\(set it to d2t's length, 3\)",
    ):
        load_dflash(half)
    config["dflash_config"]["draft_vocab_size"] = 3
    (half / "config.json").write_text(json.dumps(config))
    plain = write_dflash_checkpoint(tmp_path / "plain", 32, VOCAB, 4, LAYER_IDS, B, MASK)
    (plain / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="config.json has draft_vocab_size 3 but the weights have no d2t"):
        load_dflash(plain)


def test_a_verifier_without_hidden_states_is_refused_when_built(checkpoint, target, rt):
    from specpolicy.core.verifier import Verifier

    class NoFeatures(Verifier):
        name = "plain"
        model = target

        def prefill(self, prompt_ids, sampling=None):
            pass

        def verify(self, draft):
            pass

    with pytest.raises(FeaturesUnsupported, match="verifier 'plain' cannot return the target's hidden states"):
        build({"model": str(checkpoint)}, rt, NoFeatures())


def test_extension_none_keeps_a_draft_to_one_block(checkpoint, target, rt):
    drafter = _drafter(checkpoint, target, rt)
    drafter.extension = "none"
    committed = torch.randint(6, VOCAB - 1, (9,), generator=torch.Generator().manual_seed(8))
    drafter.prefill(committed, features=_features(target, committed, 0, 8))
    assert drafter.draft(B - 1).length == B - 1
    more = drafter.draft(5)  # nothing more: the loop stops drafting ("no_proposal")
    assert more.length == B - 1 and more.forward_passes == 1
    with pytest.raises(ValueError, match="drafter.extension must be one of given, none, got 'twice'"):
        DFlashDrafter(
            load_dflash(checkpoint),
            target.get_input_embeddings(),
            target.get_output_embeddings(),
            rt,
            extension="twice",
        )


@torch.no_grad()
def test_after_a_tree_round_the_next_block_starts_from_the_bonus_token(checkpoint, target, rt):
    """A tree whose accepted path is not its first nodes (a sibling won): the drafter continues
    from the committed sequence -- the path and the token after it -- as the reference does."""
    g = torch.Generator().manual_seed(9)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (8,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 7))
    chain = drafter.draft(2)
    tree_draft = Draft(
        torch.cat([chain.token_ids, torch.tensor([40])]), torch.ones(3), parents=torch.tensor([-1, 0, -1])
    )
    nxt = torch.tensor([33])
    new = torch.cat([committed, torch.tensor([40]), nxt])  # node 2 (a root child) accepted, then 33
    targets = torch.tensor([0, 0, 0, 33])  # the target's tokens at the root and after each node
    drafter.commit(tree_draft, Verification(1, 33, targets, features=_features(target, new, 7, 9), path=(2,)))
    assert torch.equal(drafter.draft(B - 1).token_ids, dflash_reference(checkpoint, target, new))


def _cps_drafter(checkpoint, target, runtime, lam=0.5, mass=0.8, stop=True):
    """The drafter with DiffuSpec's path search over a 3-gram model of random token sequences."""
    from specpolicy.core.path_search import PathSearch
    from specpolicy.models.ngram import NGramModel

    rng = torch.Generator().manual_seed(3)
    corpus = [torch.randint(6, VOCAB - 1, (30,), generator=rng).tolist() + [EOS] for _ in range(40)]
    stops = [EOS] if stop else []
    search = PathSearch(NGramModel.build(corpus, VOCAB, 3), torch.tensor(stops, dtype=torch.long), mass=mass, lam=lam)
    model = load_dflash(checkpoint).to(runtime.torch_dtype)
    return DFlashDrafter(
        model,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        runtime,
        frozenset(stops),
        path_search=search,
    )


@pytest.mark.parametrize(  # the fast subset: FailFast; the static drafts slow
    "policy",
    [
        pytest.param({"name": "static", "k": 3}, marks=pytest.mark.slow),
        pytest.param({"name": "static", "k": 20}, marks=pytest.mark.slow),
        {"name": "failfast", "n": 4, "tau": 0.3, "n_max": 30},
    ],
)
def test_path_search_drafts_are_lossless(checkpoint, target, rt, policy):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _cps_drafter(checkpoint, target, rt)
    built = make_policy(get_plugin_manager(autoload=False), policy)
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=40)
        spec = generate(prompt, verifier, rt, max_new_tokens=40, drafter=drafter, policy=built)
        assert torch.equal(spec.output_ids, vanilla.output_ids)


def test_path_search_reranks_the_pass_and_is_the_argmax_without_the_ngram(checkpoint, target, rt):
    """lambda 1 with one candidate a position (no stop token, which is always a candidate): the plain
    drafter's tokens; lambda 0.3: the n-gram moves some tokens off the argmax, and each token's
    confidence is the drafter's probability of it."""
    committed = torch.randint(6, VOCAB - 1, (10,), generator=torch.Generator().manual_seed(7))
    drafts = {}
    for name, drafter in [
        ("plain", _drafter(checkpoint, target, rt)),
        ("argmax", _cps_drafter(checkpoint, target, rt, lam=1.0, mass=1e-6, stop=False)),
        ("cps", _cps_drafter(checkpoint, target, rt, lam=0.3)),
    ]:
        drafter.prefill(committed, features=_features(target, committed, 0, 9))
        drafts[name] = drafter.draft(2 * B)
    plain, argmax, cps = drafts["plain"], drafts["argmax"], drafts["cps"]
    assert torch.equal(argmax.token_ids, plain.token_ids)
    torch.testing.assert_close(argmax.confidences, plain.confidences)
    m = min(plain.length, cps.length)
    assert not torch.equal(cps.token_ids[:m], plain.token_ids[:m])
    assert bool((cps.confidences > 0).all()) and bool((cps.confidences <= plain.confidences.max() + 1e-6).all())


def test_path_search_tokens_are_point_masses_when_sampling(checkpoint, target, rt):
    drafter = _cps_drafter(checkpoint, target, rt)
    committed = torch.randint(6, VOCAB - 1, (10,), generator=torch.Generator().manual_seed(7))
    drafter.prefill(
        committed,
        sampling=SamplingConfig(temperature=0.8, top_k=0, top_p=1.0),
        features=_features(target, committed, 0, 9),
    )
    draft = drafter.draft(B - 1)
    assert draft.probs.shape == (draft.length, VOCAB)
    assert torch.equal(draft.probs.argmax(-1), draft.token_ids) and torch.equal(
        draft.probs.sum(-1), torch.ones(draft.length)
    )
