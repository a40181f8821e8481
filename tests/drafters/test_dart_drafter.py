"""The ``dart`` drafter: chain drafts equal a no-cache re-statement of DART's pass on a tiny
checkpoint written by hand in the released layout (``mask_rep``, ``d2t``), for any accepted
lengths and past one pass (later passes conditioned on the drafted tokens); lossless greedy
decoding against vanilla with static k, FailFast and the DART tree (with and without the n-gram);
sampling keeps the target's distribution (chain: the positions' own q; tree: point masses)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conditioned_reference import attend, committed_after, mlp, rms, rope, write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.dart import DartDrafter
from specpolicy.models.dart import load_dart
from specpolicy.models.eagle3 import default_layer_ids
from specpolicy.models.ngram import NGramModel
from specpolicy.policies.block_tree import BlockTreePolicy
from specpolicy.policies.dart_tree import DartTreePolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier

LAYERS = 6
DRAFT_VOCAB = 32  # target ids 0, 2, ..., 62 (EOS = 63 is not among them: a stop is never drafted)
HIDDEN = 32


def write_dart_checkpoint(directory: Path, seed: int = 0, scale: float = 1.0) -> Path:
    """A random DART checkpoint in the released layout: EAGLE-3's tensors plus ``midlayer.mask_rep``
    and ``draft_length``; ``scale`` sharpens the head."""
    write_eagle3_checkpoint(directory, HIDDEN, VOCAB, DRAFT_VOCAB, seed=seed)
    sd = load_file(str(directory / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 100)
    sd["midlayer.mask_rep"] = torch.randn(2 * HIDDEN, generator=g)
    sd["lm_head.weight"] = sd["lm_head.weight"] * scale
    save_file(sd, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLMDart"], draft_length=7)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def dart_reference(directory: Path, target, committed: torch.Tensor, k: int) -> torch.Tensor:
    """The k tokens DART drafts after ``committed`` (greedy), recomputed without a cache: pairs
    (feature i, token i + 1), then 7 masks (attention input mask_rep, residual its first half),
    causal; past 8 tokens the drafted tokens join as pairs with the pass's outputs as features."""
    cfg = json.loads((directory / "config.json").read_text())
    sd = {
        n: (v.float() if v.is_floating_point() else v)
        for n, v in load_file(str(directory / "model.safetensors")).items()
    }
    heads, kvh, eps, theta, D = 4, 2, cfg["rms_norm_eps"], cfg["rope_theta"], cfg["draft_length"]
    hd = HIDDEN // heads
    embed = target.get_input_embeddings()
    with torch.no_grad():
        hs = target(input_ids=committed[None, :-1], output_hidden_states=True).hidden_states
        hidden = torch.cat([hs[i][0] for i in default_layer_ids(LAYERS)], -1).float() @ sd["fc.weight"].T
        tokens, drafted = committed[1:].clone(), []
        while len(drafted) < k:
            n = tokens.shape[0]
            e = rms(embed(tokens).float(), sd["midlayer.input_layernorm.weight"], eps)
            x = torch.cat([e, rms(hidden, sd["midlayer.hidden_norm.weight"], eps)], -1)
            x = torch.cat([x, sd["midlayer.mask_rep"].expand(D, -1)])
            residual = torch.cat([hidden, sd["midlayer.mask_rep"][:HIDDEN].expand(D, -1)])
            pos = torch.arange(n + D)
            q = rope((x @ sd["midlayer.self_attn.q_proj.weight"].T).view(n + D, heads, hd), pos, theta)
            kk = rope((x @ sd["midlayer.self_attn.k_proj.weight"].T).view(n + D, kvh, hd), pos, theta)
            vv = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(n + D, kvh, hd)
            causal = torch.ones(n + D, n + D, dtype=torch.bool).tril()
            out = residual + attend(q, kk, vv, causal) @ sd["midlayer.self_attn.o_proj.weight"].T
            out = out + mlp(rms(out, sd["midlayer.post_attention_layernorm.weight"], eps), sd, "midlayer.mlp.")
            out = out[n - 1 :]  # the last pair and the masks
            ids = (rms(out, sd["norm.weight"], eps) @ sd["lm_head.weight"].T).argmax(-1)
            new = ids + sd["d2t"][ids]
            drafted += new.tolist()
            tokens, hidden = torch.cat([tokens, new]), torch.cat([hidden, out])
    return torch.tensor(drafted[:k])


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=LAYERS, vocab=VOCAB).float(), 4.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_dart_checkpoint(tmp_path_factory.mktemp("dart"))


@pytest.fixture
def rt():
    return Runtime(device="cpu", dtype="float32", seed=0)


def _drafter(checkpoint, target, rt, stop=()):
    layers = tuple(default_layer_ids(LAYERS))
    return DartDrafter(load_dart(checkpoint), target.get_input_embeddings(), layers, VOCAB, rt, stop)


def _features(target, seq, start, stop):
    hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0, start:stop] for i in default_layer_ids(LAYERS)], -1)


def test_one_pass_drafts_eight_and_later_passes_extend(checkpoint, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    for k, passes in ((3, 1), (8, 1), (12, 2), (20, 3)):
        rounds = []
        drafter = _drafter(checkpoint, target, rt)
        prompt = random_prompts(1, seed=k)[0]
        generate(
            prompt, verifier, rt, max_new_tokens=24, drafter=drafter, policy=StaticPolicy(k), on_round=rounds.append
        )
        committed = prompt.clone()
        for r in rounds:
            assert r.draft_token_ids == tuple(
                dart_reference(checkpoint, target, committed, len(r.draft_token_ids)).tolist()
            )
            if len(r.draft_token_ids) == k:
                assert r.drafter_forward_passes == passes
            committed = committed_after(committed, r)


@torch.no_grad()
def test_chain_drafts_equal_the_reference_for_any_accepted_lengths(checkpoint, target, rt):
    g = torch.Generator().manual_seed(3)
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(0, VOCAB - 1, (8,), generator=g)
    drafter.prefill(committed, features=_features(target, committed, 0, 7))
    for accept in (2, 0, None, 9, 1, 12):
        if accept is None:
            draft, a = Draft.empty(), 0
        else:
            first = drafter.draft(3)
            assert first.lookahead == 5 and first.forward_passes == 1  # one pass decoded 8
            draft = drafter.draft(10)  # extended within the round: a second pass
            assert torch.equal(draft.token_ids, dart_reference(checkpoint, target, committed, 13))
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
        waiting = drafter._features.shape[0] + sum(f.shape[0] for f, _ in drafter._waiting)
        assert drafter.cache.length + waiting == committed.shape[0] - 1  # committed pairs only
        assert drafter.ngram_context.tolist() == committed[-8:].tolist()
    assert torch.equal(drafter.draft(9).token_ids, dart_reference(checkpoint, target, committed, 9))


def _ngram():
    docs = [p.tolist() for p in random_prompts(20, seed=9)]
    return NGramModel.build(docs, VOCAB, 3)


POLICIES = {
    "static-3": lambda: StaticPolicy(3),
    "static-8": lambda: StaticPolicy(8),
    "static-12": lambda: StaticPolicy(12),
    "failfast": lambda: FailFastPolicy(n=8, tau=0.2, n_max=24),
    "dart-tree": lambda: DartTreePolicy(total_tokens=20, ngram_model=_ngram()),
    "dart-tree-no-ngram": lambda: DartTreePolicy(total_tokens=20, use_ngram=False),
    "dart-tree-small": lambda: DartTreePolicy(top_k=3, beam_width=2, total_tokens=6, depth=4, ngram_model=_ngram()),
    "block-tree": lambda: BlockTreePolicy(depth=8, top_k=3, total_tokens=12),
}


#: the fast subset's policies (a chain, FailFast, DART's tree with and without the n-gram); the rest slow
FAST_POLICIES = ("static-3", "failfast", "dart-tree", "dart-tree-no-ngram")


@pytest.mark.parametrize(
    "name", [n if n in FAST_POLICIES else pytest.param(n, marks=pytest.mark.slow) for n in POLICIES]
)
def test_greedy_is_lossless(checkpoint, target, rt, name):
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafter(checkpoint, target, rt, stop=frozenset({EOS}))
    policy = POLICIES[name]()
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, rt, max_new_tokens=30)
        got = generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy)
        assert torch.equal(got.output_ids, vanilla.output_ids), name
        if name.startswith("dart-tree"):
            assert all(r.drafter_forward_passes <= 1 for r in got.rounds)  # the tree is one pass


def test_the_tree_is_verified_in_one_target_pass_and_accepts_more_than_the_chain(tmp_path, target, rt):
    ckpt = write_dart_checkpoint(tmp_path / "sharp", seed=1, scale=3.0)
    verifier = HFVerifier(target, rt, frozenset())
    accepted = {}
    calls = []
    hook = target.register_forward_hook(lambda *_: calls.append(1))
    for name, policy in (("chain", StaticPolicy(8)), ("tree", DartTreePolicy(total_tokens=30, use_ngram=False))):
        rounds = []
        for prompt in random_prompts(3):
            calls.clear()
            before = len(rounds)
            generate(
                prompt,
                verifier,
                rt,
                max_new_tokens=20,
                drafter=_drafter(ckpt, target, rt),
                policy=policy,
                on_round=rounds.append,
            )
            assert len(calls) == 1 + len(rounds) - before  # the prompt's pass, then one per round
        accepted[name] = sum(r.accepted_length for r in rounds) / len(rounds)
        if name == "tree":
            assert max(len(r.draft_parents) for r in rounds) > 8  # a tree, not a chain
    hook.remove()
    assert accepted["tree"] >= accepted["chain"]


def test_one_token_prompt_drafts_nothing_then_continues(checkpoint, target, rt):
    verifier = HFVerifier(target, rt, frozenset())
    rounds = []
    out = generate(
        torch.tensor([9]),
        verifier,
        rt,
        max_new_tokens=10,
        drafter=_drafter(checkpoint, target, rt),
        policy=StaticPolicy(3),
        on_round=rounds.append,
    )
    assert rounds[0].speculation_length == 0 and rounds[1].speculation_length == 3
    assert torch.equal(out.output_ids, generate(torch.tensor([9]), verifier, rt, max_new_tokens=10).output_ids)


def test_sampling_q_is_each_positions_own_distribution(checkpoint, target, rt):
    drafter = _drafter(checkpoint, target, rt)
    committed = torch.randint(0, VOCAB - 1, (6,), generator=torch.Generator().manual_seed(5))
    drafter.prefill(committed, sampling=SamplingConfig(temperature=1.0), features=_features(target, committed, 0, 5))
    draft = drafter.draft(10)
    assert draft.probs.shape == (10, VOCAB) and draft.forward_passes == 2
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(10))
    assert not draft.probs[:, 1::2].any()  # odd target ids are outside the draft vocabulary
    assert bool((draft.probs.gather(1, draft.token_ids[:, None]) > 0).all())


# -- sampling: the target's distribution, through test_sampling's chi-square machinery ---------------


def _sampling_module():
    path = Path(__file__).resolve().parents[1] / "core" / "test_sampling.py"
    spec = importlib.util.spec_from_file_location("_dart_sampling", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(  # the chain in the fast subset, the trees and FailFast slow
    "kind", ["chain", *(pytest.param(k, marks=pytest.mark.slow) for k in ("tree", "tree-best-first", "failfast"))]
)
def test_speculative_sampling_keeps_the_target_distribution(kind):
    from specpolicy.family.train_dart import new_dart

    s = _sampling_module()
    target = s._lm(0)
    runtime = Runtime(device="cpu", dtype="float64", seed=0)
    head = new_dart(
        target.config,
        torch.arange(s.V),
        4,
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64),
    )
    head = head.double().eval()
    with torch.no_grad():
        head.lm_head.weight.mul_(40.0)  # peaked: its tokens are accepted now and then
    policy = {
        "chain": lambda: StaticPolicy(s.T - 1),
        "tree": lambda: DartTreePolicy(top_k=8, beam_width=4, total_tokens=12, use_ngram=False),
        "tree-best-first": lambda: DartTreePolicy(top_k=8, beam_width=12, total_tokens=12, use_ngram=False),
        "failfast": lambda: FailFastPolicy(n=1, tau=0.3, n_max=s.T),
    }[kind]
    make = lambda: (DartDrafter(head, target.get_input_embeddings(), (0, 1, 1), s.V, runtime), policy())  # noqa: E731
    counts, stats = s.run_counts(make, s.FEATURE_PROMPT, s.TEMPERATURE, runtime, target, s.T)
    pvalue, _ = s.chi_square_pvalue(counts, s.exact_joint(target, s.FEATURE_PROMPT, s.TEMPERATURE))
    assert stats["accepted"] >= 20, stats  # acceptance exercised
    assert pvalue > s.ALPHA, (kind, pvalue, stats)
