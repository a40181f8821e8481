"""Losslessness, the invariant: every drafter x policy (x draft reuse) reproduces the target's
greedy output token for token, on several prompts (tiny float64 models built here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.plugins.manager import get_plugin_manager, make_policy
from specpolicy.verifiers.hf import HFVerifier

MASK = VOCAB - 2
# Small-but-real parameters for every policy config in conf/policy (so drafts stay short on tiny models).
POLICIES = {
    "static": {"k": 4},
    "failfast": {"n": 4, "tau": 0.3, "n_max": 40},
    "specdecpp": {"h": 0.7, "max_length": 12},
    "aimd": {"n_max": 20},
    "adl": {"k_min": 2, "k_max": 12, "delta": 4},
    "heuristic": {"n_max": 20},
    # Free drafting and flat verification: every length pays, so drafts run to max_length (with
    # measured costs the tiny random drafters, which the target hardly ever accepts, get length 0).
    "goodput": {
        "max_length": 16,
        "cost_profile": {
            "name": "free-drafting",
            "drafter_pass_ms": 0.0,
            "target_ms_per_token": 1.0,
            "verify_ms_per_draft_token": 0.0,
        },
    },
}


def assert_lossless(
    prompt, verifier, runtime, drafter, policy, reuse: bool, max_new_tokens: int = 40, vanilla: dict | None = None
) -> None:
    """Speculative decoding of ``prompt`` equals vanilla greedy decoding, and the rounds account
    for every output token. ``vanilla``: a cache of vanilla outputs by (prompt, max_new_tokens),
    for callers whose verifier is the same in every call (one target, one set of stop tokens)."""
    key = (tuple(prompt.tolist()), max_new_tokens)
    if vanilla is None or key not in vanilla:
        ref = generate(prompt, verifier, runtime, max_new_tokens=max_new_tokens).output_ids.tolist()
        if vanilla is not None:
            vanilla[key] = ref
    else:
        ref = vanilla[key]
    out = generate(
        prompt,
        verifier,
        runtime,
        max_new_tokens=max_new_tokens,
        drafter=drafter,
        policy=policy,
        reuse=DraftReuse(1) if reuse else None,
    )
    assert out.output_ids.tolist() == ref
    assert sum(r.emitted_tokens for r in out.rounds) == len(out.output_ids)
    # a drafter that hands its count over (``Draft.counted``) counts the tokens it hands out
    assert all(r.speculation_length == len(r.draft_token_ids) for r in out.rounds)


def _policy(choice: str):
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=[f"policy={choice}"]).policy)
    cfg.update(POLICIES[choice])
    return make_policy(get_plugin_manager(autoload=False), cfg)


def _path_search(seed: int):
    """DiffuSpec's path search with a 3-gram model of random sequences (EOS-terminated)."""
    from specpolicy.core.path_search import PathSearch
    from specpolicy.models.ngram import NGramModel

    rng = torch.Generator().manual_seed(int(seed))
    corpus = [torch.randint(0, VOCAB - 2, (24,), generator=rng).tolist() + [VOCAB - 1] for _ in range(30)]
    return PathSearch(NGramModel.build(corpus, VOCAB, 3), torch.tensor([VOCAB - 1]), lam=0.5)


def _drafter(kind: str, runtime, confident: bool):
    model = tiny_lm(seed=0 if confident else 5, layers=1)  # seed 0 shares the target's embeddings
    if confident:
        sharpen(model)
    if kind == "ar":
        return ARDrafter(model, runtime)
    if kind == "fastdllm-cps":  # DiffuSpec's setting: one pass over the whole block, path search on its lattice
        return FastDLLMDrafter(
            model,
            runtime,
            SimpleNamespace(mask_token_id=MASK),
            block_size=16,
            small_block_size=16,
            stop_token_ids=[VOCAB - 1],
            path_search=_path_search(confident),
        )
    # As the factory builds it: drafting stops at the verifier's EOS. Threshold 0.9 (Fast-dLLM's
    # default) stops unmasking mid small block, and extensions continue from there.
    return FastDLLMDrafter(
        model,
        runtime,
        SimpleNamespace(mask_token_id=MASK),
        block_size=16,
        small_block_size=4,
        threshold=0.9 if kind == "fastdllm-t0.9" else 0.05,
        stop_token_ids=[VOCAB - 1],
    )


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(seed=0, layers=2), 4.0)


@pytest.fixture(scope="module")
def vanilla() -> dict:
    """The target's vanilla outputs, made once per prompt for the whole matrix (only read)."""
    return {}


def _combination(drafter: str, policy: str, reuse: bool):
    """The fast subset keeps each drafter once with FailFast (AR and Fast-dLLM with reuse, the path
    search without) and the AR drafter with a static length (each policy's own losslessness tests,
    tests/policies/, are fast too); the rest of the matrix is ``slow``."""
    fast = (drafter, policy, reuse) in (
        ("ar", "static", False),
        ("ar", "failfast", True),
        ("fastdllm", "failfast", True),
        ("fastdllm-cps", "failfast", False),
    )
    return pytest.param(
        drafter,
        policy,
        reuse,
        id=f"{drafter}-{policy}-{'reuse' if reuse else 'no-reuse'}",
        marks=() if fast else pytest.mark.slow,
    )


@pytest.mark.parametrize(
    "drafter, policy, reuse",
    [
        _combination(drafter, policy, reuse)
        for drafter in ("ar", "fastdllm", "fastdllm-t0.9", "fastdllm-cps")
        for policy in sorted(POLICIES)
        for reuse in (False, True)
    ],
)
def test_every_drafter_policy_combination_is_lossless(runtime, target, vanilla, drafter, policy, reuse):
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    for confident in (True, False):
        d = _drafter(drafter, runtime, confident)
        p = _policy(policy)
        for prompt in random_prompts(4):
            assert_lossless(prompt, verifier, runtime, d, p, reuse, vanilla=vanilla)
