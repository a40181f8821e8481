"""``drafter=easyspec``: EasySpec's layer-parallel drafting (arXiv 2502.02493, §3). The grouped pass
equals a literal re-statement of the rule (the group's attention sublayers on the group's first
input, computed from the exact prefix's hidden states; MLPs in order); with ``layer_parallel`` 1 the
lean pass is the AR drafter's exact pass; bonus calibration leaves the cache a fresh prefill of the
committed sequence; lossless with every chain policy; ``layer_parallel`` checked in one line."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.errors import ConfigError
from specpolicy.core.types import Verification
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.easyspec import EasySpecDrafter, layer_groups, validate
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier
from test_verifier import _assert_cache_equal, _fresh_cache

LAYERS = 6


@pytest.fixture(scope="module")
def drafter_model():
    return sharpen(tiny_lm(seed=0, layers=LAYERS), 3.0)


def test_layer_groups():
    assert layer_groups(6, 2) == [[0], [1, 2], [3, 4], [5]]
    assert layer_groups(6, 4) == [[0], [1, 2, 3, 4], [5]]
    assert layer_groups(6, 3) == [[0], [1, 2, 3], [4], [5]]
    assert layer_groups(4, 1) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match=r"drafter.layer_parallel must be an integer in \[1, 2\]"):
        layer_groups(4, 3)


def reference_grouped_logits(model, sequence: torch.Tensor, groups) -> torch.Tensor:
    """The last token's logits under the grouped rule, from scratch: every earlier position's keys
    and values come from its exact hidden states (the prefix was fed exactly); the last token runs
    the group's attention sublayers on the group's input, then the MLPs in order."""
    inner = model.model
    prefix = sequence[:-1]
    exact = model(input_ids=prefix[None], output_hidden_states=True).hidden_states  # inputs of each layer
    positions = torch.arange(len(sequence))[None]
    h = inner.embed_tokens(sequence[-1:])[None]
    cos, sin = inner.rotary_emb(h, positions)

    def attention(index: int, x_new: torch.Tensor) -> torch.Tensor:
        """Layer ``index``'s attention output for the last token, its input ``x_new`` (1, 1, H)."""
        layer = inner.layers[index]
        attn = layer.self_attn
        x = torch.cat([layer.input_layernorm(exact[index]), layer.input_layernorm(x_new)], dim=1)  # (1, n, H)
        d = attn.head_dim
        q = attn.q_proj(x).view(1, -1, attn.config.num_attention_heads, d).transpose(1, 2)
        k = attn.k_proj(x).view(1, -1, attn.config.num_key_value_heads, d).transpose(1, 2)
        v = attn.v_proj(x).view(1, -1, attn.config.num_key_value_heads, d).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        rot = lambda t: torch.cat([-t[..., d // 2 :], t[..., : d // 2]], dim=-1)  # noqa: E731
        q, k = q * c + rot(q) * s, k * c + rot(k) * s
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        w = torch.softmax((q[:, :, -1:] @ k.transpose(-1, -2)) / d**0.5, dim=-1)  # the last query sees all
        return attn.o_proj((w @ v).transpose(1, 2).reshape(1, 1, -1))

    for group in groups:
        h_in = h
        outs = [attention(i, h_in) for i in group]  # every attention of the group on the group's input
        for i, a in zip(group, outs):
            layer = inner.layers[i]
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(inner.norm(h))[0, -1]


@pytest.mark.parametrize("parallel", [2, 4])
def test_the_grouped_pass_equals_the_rule(drafter_model, runtime, parallel):
    drafter = EasySpecDrafter(drafter_model, runtime, parallel)
    prompt = random_prompts(1, seed=3)[0]
    drafter.prefill(prompt)
    draft = drafter.draft(2)  # the first token exact, the second grouped (over the exact prefix)
    for i in (1,):
        sequence = torch.cat([prompt, draft.token_ids[:i]])
        logits = reference_grouped_logits(drafter_model, sequence, drafter.groups)
        # the draft's token i: the reference's argmax (greedy), its confidence the softmax maximum
        probs = torch.softmax(logits, -1)
        assert int(probs.argmax()) == int(draft.token_ids[i])
        torch.testing.assert_close(draft.confidences[i].double(), probs.max(), rtol=1e-9, atol=1e-9)


def test_one_layer_per_group_is_the_exact_ar_pass(drafter_model, runtime):
    lean, exact = EasySpecDrafter(drafter_model, runtime, 1), ARDrafter(drafter_model, runtime)
    for prompt in random_prompts(3, seed=5):
        lean.prefill(prompt)
        exact.prefill(prompt)
        a, b = lean.draft(6), exact.draft(6)
        assert torch.equal(a.token_ids, b.token_ids)
        torch.testing.assert_close(a.confidences, b.confidences, rtol=1e-9, atol=1e-9)


def test_bonus_calibration_rebuilds_the_exact_cache(drafter_model, runtime):
    drafter = EasySpecDrafter(drafter_model, runtime, 2)
    prompt = random_prompts(1, seed=7)[0]
    drafter.prefill(prompt)
    draft = drafter.draft(5)
    accepted = 3
    bonus = torch.tensor([11])
    target = torch.cat([draft.token_ids[:accepted], bonus, draft.token_ids[accepted + 1 :]])  # (k + 1,)
    verification = Verification(accepted_length=accepted, next_token=11, target_token_ids=target)
    drafter.commit(draft, verification)
    drafter.draft(1)  # the next round's exact first pass feeds the accepted tokens and the bonus token
    committed = torch.cat([prompt, draft.token_ids[:accepted], bonus])
    _assert_cache_equal(drafter.cache, _fresh_cache(drafter_model, committed))


@pytest.mark.parametrize(
    "policy",
    [
        {"name": "failfast", "n": 2, "tau": 0.3, "n_max": 12},  # the fast subset: FailFast; the rest slow
        pytest.param({"name": "static", "k": 4}, marks=pytest.mark.slow),
        pytest.param({"name": "aimd", "n_max": 10}, marks=pytest.mark.slow),
        pytest.param({"name": "adl", "k_min": 2, "k_max": 8, "delta": 3}, marks=pytest.mark.slow),
    ],
)
def test_lossless_with_chain_policies(drafter_model, runtime, policy):
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    drafter = EasySpecDrafter(drafter_model, runtime, 2)
    built = make_policy(get_plugin_manager(autoload=False), policy)
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, runtime, max_new_tokens=40)
        spec = generate(prompt, verifier, runtime, max_new_tokens=40, drafter=drafter, policy=built)
        assert torch.equal(spec.output_ids, vanilla.output_ids)


def test_layer_parallel_is_checked_against_the_bundled_drafter():
    with pytest.raises(ConfigError) as info:
        validate({"model": "ar-drafter", "layer_parallel": 3})
    message = str(info.value)
    assert message.startswith("drafter.layer_parallel must be an integer in [1, 2]") and "got 3" in message
    validate({"model": "ar-drafter", "layer_parallel": 2})  # accepted: no error


@pytest.mark.slow  # the AR drafter's sampled chain (tests/core/test_sampling.py) with layer-parallel passes
def test_speculative_sampling_keeps_the_target_distribution():
    """The statistical test of ``tests/core/test_sampling.py`` on EasySpec (a random peaked 4-layer
    drafter, 2 layers in parallel, drafts of 2 tokens): the first 3 sampled tokens of N = 500 seeded
    runs follow the target's exact joint, the drafts' tokens verified with q the warped rows they
    were drawn from."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.policies.static import StaticPolicy
    from test_sampling import ALPHA, PROMPT, TEMPERATURE, T, V, _lm, chi_square_pvalue, exact_joint, run_counts

    rt = Runtime(device="cpu", dtype="float64", seed=0)
    target = _lm(0)
    model = sharpen(tiny_lm(seed=1, layers=4, vocab=V, max_positions=64, eos=None), 25.0)

    def make():
        return EasySpecDrafter(model, rt, 2), StaticPolicy(k=T - 1)

    counts, stats = run_counts(make, PROMPT, TEMPERATURE, rt, target)
    pvalue, df = chi_square_pvalue(counts, exact_joint(target, PROMPT, TEMPERATURE))
    assert 20 <= stats["accepted"] < stats["speculated"], stats  # acceptance and rejection exercised
    assert df >= 10 and pvalue > ALPHA, (pvalue, df, stats)


@pytest.mark.parametrize("parallel", [1, 2])
def test_layer_parallel_position_is_the_cache_length(drafter_model, runtime, parallel, monkeypatch):
    """``_next_logits`` gives each layer-parallel pass its position from the round's counts (the exact
    first pass's cache length + the passes since): the cache's length it replaced, every pass, over
    rounds with accepted, rejected and one-token drafts and drafts extended by later calls."""
    drafter = EasySpecDrafter(drafter_model, runtime, parallel)
    positions: list[tuple[int, int]] = []
    held = EasySpecDrafter._parallel_pass

    def watched(self, token, position):
        positions.append((position, self.cache.get_seq_length()))
        return held(self, token, position)

    monkeypatch.setattr(EasySpecDrafter, "_parallel_pass", watched)
    prompt = random_prompts(1, seed=3)[0]
    drafter.prefill(prompt)
    for calls, accepted in (((3, 2), 4), ((1,), 0), ((1, 1, 1), 3), ((4,), 1), ((2, 3), 5)):
        for n in calls:
            draft = drafter.draft(n)
        target = torch.cat([draft.token_ids[:accepted], torch.tensor([7]), draft.token_ids[accepted + 1 :]])
        drafter.commit(draft, Verification(accepted_length=accepted, next_token=7, target_token_ids=target))
    assert len(positions) == 4 + 0 + 2 + 3 + 4  # the calls' passes past each round's first
    assert all(given == length for given, length in positions)
