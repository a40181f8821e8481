"""The how-to's drafter on the runner (``examples/runner-drafter/greedy_lm.py``,
``docs/how-to/write-a-drafter-or-verifier.md``): written once against
``specpolicy.runners.causal.CausalRunner``, it runs eagerly, on the static cache, compiled
(``runtime.compile=true``) and batched (a batch of 2 sharing one static cache of 2 sequences),
each way token-identical to vanilla decoding, without writing any of those paths itself."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core.batching import generate_batch
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import CompileSettings, Runtime
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.runners.decoder import StaticDecoder
from specpolicy.verifiers.hf import HFVerifier

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "runner-drafter" / "greedy_lm.py"
HOWTO = ROOT / "docs" / "how-to" / "write-a-drafter-or-verifier.md"


def _example():
    spec = importlib.util.spec_from_file_location("greedy_lm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(seed=0, layers=2), 4.0)


@pytest.fixture(scope="module")
def small():
    return sharpen(tiny_lm(seed=1, layers=1), 4.0)  # the drafter: another model, the same vocabulary


def _runs(drafter, target, rt, prompts, policy) -> tuple[list, list]:
    """Every prompt's output alone (batch 1) and in a batch of 2, and vanilla's."""
    eager = Runtime("cpu", "float64", seed=0)
    verifier = HFVerifier(target, eager, frozenset({VOCAB - 1}))
    vanilla = [generate(p, verifier, eager, max_new_tokens=24).output_ids.tolist() for p in prompts]
    alone = [generate(p, verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy) for p in prompts]
    batch = generate_batch(prompts, verifier, rt, max_new_tokens=24, batch_size=2, drafter=drafter, policy=policy)
    assert [r.output_ids.tolist() for r in alone] == vanilla
    assert [batch.results[i].output_ids.tolist() for i in range(len(prompts))] == vanilla
    assert sum(r.accepted_length for out in alone for r in out.rounds) > 0  # drafts were accepted
    return alone, [batch.results[i] for i in range(len(prompts))]


@pytest.mark.parametrize("static_cache", [False, True], ids=["hf-forward", "static-cache"])
@pytest.mark.parametrize("policy", ["static", "failfast"])
def test_the_runner_drafter_is_token_identical_to_vanilla_eager_and_batched(target, small, static_cache, policy):
    """Eager runtime: the runner's Hugging Face forward, or its static cache run uncompiled (the
    compiled runtime's passes, cheap to check) -- alone and in a batch of 2 whose requests draft in
    ONE pass over the shared static cache of 2 sequences."""
    rt = Runtime("cpu", "float64", seed=0)
    drafter = _example().GreedyLMDrafter(small, rt, static_cache=static_cache)
    policy = StaticPolicy(3) if policy == "static" else FailFastPolicy(n=3, tau=0.2, n_max=12)
    widths = []
    if static_cache:
        run_rows = StaticDecoder.run_rows

        def spy(self, input_ids, starts, counts=None):
            widths.append(int((counts > 0).sum()))
            return run_rows(self, input_ids, starts, counts)

        StaticDecoder.run_rows = spy
    try:
        _runs(drafter, target, rt, random_prompts(4), policy)
    finally:
        if static_cache:
            StaticDecoder.run_rows = run_rows
    if static_cache:
        lead = drafter.batched(2)
        assert drafter.runner.static.rows == 1 and lead.runner.static.rows == 2
        assert drafter.batched(2).runner is lead.runner  # built once per batch size
        assert max(widths) == 2  # one pass drafted for both requests of the batch
    else:
        assert drafter.runner.static is None and drafter.batched(2).runner is drafter.runner


@pytest.mark.slow
def test_the_runner_drafter_runs_compiled_and_batched(target, small):
    """``runtime.compile=true`` (two buckets, float64): the drafter's passes compiled once (batch 1:
    one sequence; batch 2: a static cache of 2 sequences, compiled once for the batch size), the
    output of vanilla both ways, and no graph compiled past the warm-up."""
    from torch._dynamo.utils import counters

    rt = Runtime("cpu", "float64", seed=0, compile=True, compiled=CompileSettings(buckets=(1, 8)))
    drafter = _example().GreedyLMDrafter(small, rt)
    assert drafter.runner.static.compiled and drafter.runner.static.buckets == (1, 8) and rt.warmup_s > 0
    lead = drafter.batched(2)
    assert lead.runner.static.compiled and lead.runner.static.rows == 2 and lead.runner.static.buckets == (8,)
    graphs = counters["stats"]["unique_graphs"]
    _runs(drafter, target, rt, random_prompts(4), StaticPolicy(3))
    assert counters["stats"]["unique_graphs"] == graphs


def test_the_how_to_shows_the_example_drafter_as_it_is():
    """The how-to's code block is the example file, verbatim (the file is what the tests run)."""
    page = HOWTO.read_text()
    blocks = re.findall(r"```python\n(# examples/runner-drafter/greedy_lm\.py\n.*?)```", page, re.S)
    assert len(blocks) == 1
    assert blocks[0].split("\n", 1)[1] == EXAMPLE.read_text()


def test_a_sampling_request_is_refused_in_one_line(small):
    from specpolicy.core.sampling import SamplingConfig

    drafter = _example().GreedyLMDrafter(small, Runtime("cpu", "float64", seed=0))
    with pytest.raises(ValueError, match="drafts greedily; use generation.temperature=0"):
        drafter.prefill(torch.tensor([1, 2, 3]), SamplingConfig(temperature=1.0))
