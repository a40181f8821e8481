"""The compiled runtime (``runtime.compile=true``, ``specpolicy.runners``): the static-cache
forward returns the Hugging Face model's logits and hidden states (chains, chunks, trees), rolls
back by its length, and decoding through it -- eager (the static cache alone) and compiled with
``torch.compile`` -- is token-identical to the eager runtime for every drafter x policy of the
losslessness tests. The compiled cases use tiny float64 models and two buckets (cheap to compile)."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from conftest import VOCAB, overrides, random_prompts, sharpen, tiny_lm
from specpolicy.core import tree
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import CompileSettings, Runtime
from specpolicy.drafters.ar import ARDrafter
from specpolicy.runners.decoder import StaticDecoder
from specpolicy.runners.static import bucket_of
from specpolicy.verifiers.hf import HFVerifier
from test_lossless import _drafter, _policy, assert_lossless


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(seed=0, layers=2), 4.0)


def _hf(model, ids, **kw):
    with torch.no_grad():
        return model(ids[None], output_hidden_states=True, **kw)


def test_logits_and_hidden_states_equal_hf_in_one_pass_and_in_chunks(target):
    ids = random_prompts(8)[5]  # 40 tokens
    ref = _hf(target, ids)
    for buckets in ((1, 2, 4, 8, 16, 32, 64), (1, 4)):  # (1, 4): ten chunks of 4
        s = StaticDecoder(target, 128, buckets=buckets)
        logits, states = s.run(ids)
        assert s.length == 40
        torch.testing.assert_close(logits, ref.logits[0], rtol=0, atol=1e-10)
        assert states.shape == (40, 3, 32)
        for i, h in enumerate(ref.hidden_states):  # embeddings, layer outputs, final norm
            torch.testing.assert_close(states[:, i], h[0], rtol=0, atol=1e-10)


def test_windows_of_the_cache_past_128_columns_give_the_same_logits(target):
    """Attention reads the cache up to the next multiple of ``WINDOW`` past the last slot written:
    a 300-token sequence fed in chunks that cross 128 and 256 equals the HF pass."""
    ids = torch.randint(0, VOCAB - 1, (300,), generator=torch.Generator().manual_seed(3))
    ref = _hf(target, ids).logits[0]
    s = StaticDecoder(target, 400, buckets=(1, 2, 4, 8, 16, 32, 64))
    got = [s.run(ids[:120])[0]]
    for a, b in ((120, 127), (127, 129), (129, 250), (250, 257), (257, 299), (299, 300)):
        got.append(s.run(ids[a:b])[0])
    torch.testing.assert_close(torch.cat(got), ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("pad", [True, False], ids=["padded", "exact"])
def test_continuing_and_rolling_back_is_a_length(target, pad):
    ids = random_prompts(8)[5]
    ref = _hf(target, ids).logits[0]
    # padded (runtime.pad_dynamic): what CUDA's static graphs run
    s = StaticDecoder(target, 128, buckets=(1, 2, 4), settings=CompileSettings(pad_dynamic=pad))
    assert s.pads == pad
    s.run(ids[:30])
    wrong, _ = s.run(torch.flip(ids[30:], [0]))  # a rejected draft
    assert not torch.allclose(wrong, ref[30:])
    s.length = 30  # roll back: nothing copied
    logits, _ = s.run(ids[30:33])  # padded: a bucket of 4
    torch.testing.assert_close(logits, ref[30:33], rtol=0, atol=1e-10)
    one, _ = s.run(ids[33:34])
    torch.testing.assert_close(one, ref[33:34], rtol=0, atol=1e-10)


def test_tree_pass_equals_hf_tree_pass_and_keep_rows_equals_the_path_fed_alone(target):
    prompt = random_prompts(8)[1]  # 31 tokens
    parents = [-1, -1, 0, 1, 1]  # draft node i's parent (-1: the root, the pending token)
    start = 30
    positions, mask = tree.verification_layout(parents, start, "cpu")
    inputs = torch.cat([prompt[-1:], torch.tensor([11, 13, 17, 19, 23])])
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        target(prompt[None, :-1], cache=cache, use_cache=True)
        ref = target(inputs[None], position_ids=positions[None], attention_mask=mask[None, None], cache=cache)
    s = StaticDecoder(target, 128, buckets=(1, 2, 4, 8))
    s.run(prompt[:-1])
    logits, _ = s.run(inputs, positions, mask)
    torch.testing.assert_close(logits, ref.logits[0], rtol=0, atol=1e-10)
    # keep the path root -> node 1 -> node 3 (rows 0, 2, 4): then one more token equals feeding the path as a chain
    path_rows = [0, 2, 4]
    s.keep_rows(start, path_rows)
    assert s.length == start + 3
    nxt, _ = s.run(torch.tensor([5]))
    chain = torch.cat([prompt, inputs[path_rows[1:]], torch.tensor([5])])
    torch.testing.assert_close(nxt, _hf(target, chain).logits[0, -1:], rtol=0, atol=1e-10)


def test_bad_inputs_raise_one_line():
    s = StaticDecoder(tiny_lm(seed=0, layers=1), 16, buckets=(1, 4))
    with pytest.raises(ValueError, match="do not fit the static cache of 16"):
        s.run(torch.zeros(17, dtype=torch.long))
    s.run(torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="7 new positions after 10 cached"):
        s.run(torch.zeros(7, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the largest bucket 4"):
        bucket_of(5, (1, 4))
    assert [bucket_of(n) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 64, 64]
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4))
    with pytest.raises(
        ValueError, match="cannot run this model: it is model_type 'gpt2' .the compiled runtime runs llama"
    ):
        StaticDecoder(gpt2, 16)
    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            rope_parameters={"rope_theta": 10000.0, **dynamic},
        )
    )
    with pytest.raises(ValueError, match="has rope_scaling type 'dynamic', whose frequencies change"):
        StaticDecoder(llama, 16)
    with pytest.raises(ValueError, match="runtime.compile must be true or false, got 'yes'"):
        Runtime("cpu", "float32", compile="yes")


def test_a_bad_runtime_compile_value_is_one_line_before_any_model_loads(family, tmp_path, monkeypatch, capsys):
    import sys

    from specpolicy.run.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr("specpolicy.models.loading.load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(sys, "argv", ["specpolicy", *overrides(family), "runtime.compile=yes"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: runtime.compile must be true or false, got 'yes'"]


def test_a_target_the_compiled_runtime_cannot_run_is_one_line_before_any_model_loads(
    family, tmp_path, monkeypatch, capsys
):
    import json
    import shutil
    import sys

    from specpolicy.run.cli import main

    other = tmp_path / "gpt2-target"
    shutil.copytree(family["target"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr("specpolicy.models.loading.load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    args = [a for a in overrides(family) if not a.startswith("verifier.model=")]
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args, f"verifier.model={other}", "runtime.compile=true"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: runtime.compile=true cannot run verifier.model='{other}': it is model_type 'gpt2' (the compiled "
        "runtime runs llama, mistral, qwen2, qwen3); or use runtime.compile=false"
    ]


def _static(verifier_or_drafter, model, compile=False):
    """Put a model on the static runtime after building it (eager static cache: no compilation)."""
    verifier_or_drafter.static = StaticDecoder(model, 512, compile=compile)
    return verifier_or_drafter


#: The policies the static cache is checked with: a policy reaches the runtime only through the
#: lengths it asks, and these span them (a fixed short draft, FailFast's extensions, goodput's
#: drafts to 16 tokens); every policy's losslessness on the eager runtime: tests/core/test_lossless.py
STATIC_RUNTIME_POLICIES = ("failfast", "static", "goodput")


@pytest.mark.parametrize(
    "policy",  # the fast subset keeps FailFast per drafter; the other two are slow
    [p if p == "failfast" else pytest.param(p, marks=pytest.mark.slow) for p in STATIC_RUNTIME_POLICIES],
)
@pytest.mark.parametrize("drafter", ["ar", "fastdllm"])
def test_static_runtime_is_token_identical_to_the_eager_runtime(runtime, target, drafter, policy):
    """Policies of every draft length (``STATIC_RUNTIME_POLICIES``), on the static cache
    (uncompiled: the same code as compiled, cheap)."""
    eager = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    static = _static(HFVerifier(target, runtime, frozenset({VOCAB - 1})), target)
    for confident in (True, False):
        d = _drafter(drafter, runtime, confident)
        if drafter == "ar":
            d = _static(d, d.model)
            d.max_context = 512
        for prompt in random_prompts(3):
            assert_lossless(prompt, static, runtime, d, _policy(policy), False)
            ref = generate(prompt, eager, runtime, max_new_tokens=40)
            out = generate(prompt, static, runtime, max_new_tokens=40, drafter=d, policy=_policy(policy))
            assert out.output_ids.tolist() == ref.output_ids.tolist()


@pytest.mark.parametrize("drafter", [None, "ar"], ids=["vanilla", "ar"])
def test_sampling_on_the_static_runtime_draws_what_the_eager_runtime_draws(runtime, target, drafter):
    """Speculative sampling reads the same logits (float64, equal to 1e-10): with the same seed the
    static runtime draws the same tokens as the eager one, so its output is distributed as before."""
    from specpolicy.core.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=0.8, top_p=0.95)
    outputs = []
    for static in (False, True):
        verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
        d = _drafter("ar", runtime, True) if drafter else None
        if static:
            _static(verifier, target)
            if d is not None:
                _static(d, d.model)
        runs = []
        for prompt in random_prompts(3):
            runtime.seed_everything(7)
            kw = {"drafter": d, "policy": _policy("static")} if d is not None else {}
            runs.append(
                generate(prompt, verifier, runtime, max_new_tokens=30, sampling=sampling, **kw).output_ids.tolist()
            )
        outputs.append(runs)
    assert outputs[0] == outputs[1]


def test_tree_policy_on_the_static_runtime_is_lossless(runtime, target):
    from specpolicy.plugins.manager import get_plugin_manager, make_policy

    policy = make_policy(
        get_plugin_manager(autoload=False), {"name": "eagle2-tree", "top_k": 3, "depth": 4, "total_tokens": 10}
    )
    static = _static(HFVerifier(target, runtime, frozenset({VOCAB - 1})), target)
    eager = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    d = _drafter("ar", runtime, True)
    d = _static(d, d.model)
    for prompt in random_prompts(4):
        ref = generate(prompt, eager, runtime, max_new_tokens=40)
        out = generate(prompt, static, runtime, max_new_tokens=40, drafter=d, policy=policy)
        assert out.output_ids.tolist() == ref.output_ids.tolist()
        assert any(r.draft_parents for r in out.rounds)  # trees were verified


@pytest.fixture
def settings() -> dict:
    """The ``runtime.*`` compile settings of a test's runtimes (``CompileSettings(**settings)``)."""
    return {}


@pytest.fixture
def two_buckets(settings) -> dict:
    """``runtime.buckets=[1, 8]``: two graphs to compile; the settings, for ``CompileSettings(**...)``."""
    settings["buckets"] = (1, 8)
    return settings


@pytest.fixture(params=[False, True], ids=["exact", "padded"])
def padding(request, settings):
    """Both ways a pass's width is set: exact (CPU's default) and padded to the bucket (CUDA's)."""
    settings["pad_dynamic"] = request.param
    return request.param


@pytest.fixture(scope="module")
def compiled():
    """The compiled models this module's compiled-runtime tests share, each compiled once, on first
    use: ``compiled(key, build)`` is ``build()``'s result for ``key`` (a runtime and what was built on
    it: a verifier, drafters). Tests share the compiled runners, never a request's state: every
    ``generate`` prefills its own prompt, and a batched form is built once per batch size."""
    made: dict = {}

    def get(key, build):
        if key not in made:
            made[key] = build()
        return made[key]

    return get


def compiled_verifier(compiled, model, settings: dict, name: str):
    """``(runtime, verifier)``: ``model`` (``name``: which) behind an HF verifier on a compiled runtime of
    ``settings``, compiled once per module (``compiled``)."""

    def build():
        rt = Runtime("cpu", "float64", seed=0, compile=True, compiled=CompileSettings(**settings))
        return rt, HFVerifier(model, rt, frozenset({VOCAB - 1}))

    return compiled((name, repr(CompileSettings(**settings))), build)


@pytest.fixture(scope="module")
def target6():
    """The 6-layer target the EAGLE-3 tests draft for (its layers 1, 3, 5 read by the head)."""
    return sharpen(tiny_lm(0, layers=6), 4.0)


def compiled_eagle3(compiled, target6, checkpoint, settings: dict):
    """``(runtime, verifier, drafter)``: the 6-layer target and the EAGLE-3 head compiled once per
    module on a runtime of ``settings``."""
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3

    rt, verifier = compiled_verifier(compiled, target6, settings, "target6")

    def build():
        head = load_eagle3(checkpoint).double()
        embed = target6.get_input_embeddings()
        return Eagle3Drafter(head, embed, tuple(default_layer_ids(6)), VOCAB, rt, frozenset({VOCAB - 1}))

    return rt, verifier, compiled(("eagle3", repr(CompileSettings(**settings))), build)


def compiled_dflash(compiled, family, settings: dict):
    """``(runtime, verifier, drafter)``: the tiny family's target and DFlash drafter compiled once per
    module on a runtime of ``settings``."""
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter

    def build():
        rt = Runtime("cpu", "float64", seed=0, compile=True, compiled=CompileSettings(**settings))
        verifier = make_verifier_hf(family, rt)
        pm = get_plugin_manager(autoload=False)
        return rt, verifier, make_drafter(pm, {"name": "dflash", "model": str(family["dflash"])}, rt, verifier)

    return compiled(("dflash", repr(CompileSettings(**settings))), build)


@pytest.mark.slow
def test_compiled_runtime_is_token_identical_and_reports_its_warmup(two_buckets, padding, target, compiled):
    """``runtime.compile=true`` end to end: verifier and ar drafter built compiled (two buckets,
    tiny float64 models), warm-up counted, the output of vanilla, static, failfast and a tree
    policy identical to the eager runtime's."""
    eager_rt = Runtime("cpu", "float64", seed=0)
    rt, verifier = compiled_verifier(compiled, target, two_buckets, "target")
    assert verifier.static is not None and verifier.static.compiled and verifier.static.buckets == (1, 8)
    assert verifier.static.pads == padding
    draft_model = sharpen(tiny_lm(seed=0, layers=1))
    d = ARDrafter(draft_model, rt)
    assert d.static is not None and rt.warmup_s > 0 and rt.describe()["compile"] is True
    eager = HFVerifier(target, eager_rt, frozenset({VOCAB - 1}))
    from specpolicy.plugins.manager import get_plugin_manager, make_policy

    tree_policy = make_policy(
        get_plugin_manager(autoload=False), {"name": "eagle2-tree", "top_k": 3, "depth": 4, "total_tokens": 10}
    )
    for prompt in random_prompts(3):
        ref = generate(prompt, eager, eager_rt, max_new_tokens=30)
        assert generate(prompt, verifier, rt, max_new_tokens=30).output_ids.tolist() == ref.output_ids.tolist()
        for policy in (_policy("static"), _policy("failfast"), tree_policy):
            out = generate(prompt, verifier, rt, max_new_tokens=30, drafter=d, policy=policy)
            assert out.output_ids.tolist() == ref.output_ids.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("cpu_matmul", ["reduction", "blas"])
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "not-frozen"])
def test_compiled_cpu_passes_of_every_width_equal_hf(cpu_matmul, freeze, target, monkeypatch):
    """The compiled CPU passes in both ``runtime.cpu_matmul`` forms, with and without freezing: the one-row
    pass (a sum over weight rows, plain attention, with ``"reduction"``) and the 2-, 4- and 8-row
    buckets (BLAS, or oneDNN on weights frozen into the graph), fed after a 37-token prefix, give
    HF's float64 logits and hidden states -- to 1e-6: inductor's compiled CPU kernels differ from
    HF's by about 1e-8 in float64 on this model, either way (a mixed-up row or weight would differ
    by whole units) -- and the HF model's own weights are left as they were."""
    ids = torch.randint(0, VOCAB - 1, (45,), generator=torch.Generator().manual_seed(5))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    settings = CompileSettings(cpu_matmul=cpu_matmul, cpu_freeze=freeze)
    s = StaticDecoder(target, 64, compile=True, buckets=(1, 2, 4, 8), settings=settings)
    assert s.reduction == (cpu_matmul == "reduction")
    for n in range(1, 9):
        ref = _hf(target, ids[: 37 + n])
        s.length = 0
        s.run(ids[:37])
        logits, states = s.run(ids[37 : 37 + n])
        torch.testing.assert_close(logits, ref.logits[0, 37:], rtol=0, atol=1e-6)
        for i, h in enumerate(ref.hidden_states):
            torch.testing.assert_close(states[:, i], h[0, 37:], rtol=0, atol=1e-6)
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.slow
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "exact"])
def test_compiled_cpu_passes_run_at_their_exact_width_on_one_graph(pad, target, monkeypatch):
    """On CPU the multi-row graph takes dynamic sizes, so a pass of n rows runs at width n
    (``runtime.pad_dynamic`` off, the default), or padded to its bucket when asked; either way no width
    compiles a graph after the warm-up, and the logits are HF's."""
    from torch._dynamo.utils import counters

    ids = torch.randint(0, VOCAB - 1, (45,), generator=torch.Generator().manual_seed(6))
    s = StaticDecoder(target, 64, compile=True, buckets=(1, 2, 4, 8), settings=CompileSettings(pad_dynamic=pad))
    s.warmup()
    graphs = counters["stats"]["unique_graphs"]
    widths = []
    compiled_pass = s._pass

    def spy(*rows):
        widths.append(int(rows[0].shape[1]))  # (R, width)
        return compiled_pass(*rows)

    monkeypatch.setattr(s, "_pass", spy)
    for n in range(2, 9):
        s.length = 0
        s.run(ids[:37])
        widths.clear()
        logits, _ = s.run(ids[37 : 37 + n])
        assert widths == [bucket_of(n) if pad else n]
        torch.testing.assert_close(logits, _hf(target, ids[: 37 + n]).logits[0, 37:], rtol=0, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == graphs


def test_bad_compile_settings_raise_one_line():
    """Each ``runtime.*`` compile setting refused in one line naming the key, its value and what it
    accepts: as the runtime is built (``Runtime.from_config``), before any model loads."""
    for runtime, message in (
        ({"cpu_matmul": "mkl"}, "runtime.cpu_matmul='mkl' is not one of reduction, blas"),
        ({"cuda_mode": "fast"}, "runtime.cuda_mode='fast' is not one of reduce-overhead, default, cudagraphs"),
        ({"buckets": [0, 8]}, "runtime.buckets=(0, 8) must be a list of distinct positive integers"),
        ({"buckets": [8, 8]}, "runtime.buckets=(8, 8) must be a list of distinct positive integers"),
        ({"chain_steps": []}, "runtime.chain_steps=() must be a list of distinct positive integers"),
        ({"window": 0}, "runtime.window=0 must be an integer >= 1"),
        ({"cpu_freeze": "yes"}, "runtime.cpu_freeze must be true or false, got 'yes'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            Runtime.from_config({"device": "cpu", **runtime})
    rt = Runtime.from_config({"device": "cpu", "buckets": [8, 1], "pad_dynamic": True, "chain_steps": [2, 1]}, seed=3)
    assert rt.compiled == CompileSettings(buckets=(1, 8), pad_dynamic=True, chain_steps=(1, 2)) and rt.seed == 3
    assert Runtime.from_config({}).compiled == CompileSettings()  # the defaults: the measured settings


@pytest.fixture(scope="module")
def eagle3_checkpoint(tmp_path_factory):
    from conditioned_reference import write_eagle3_checkpoint

    return write_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), 32, VOCAB, 30, with_embeddings=True)


@pytest.mark.parametrize(
    "policy",
    [
        {"name": "static", "k": 3},
        {"name": "failfast", "n": 3, "tau": 0.3, "n_max": 12},
        {"name": "eagle2-tree", "top_k": 3, "depth": 4, "total_tokens": 10},
    ],
    ids=["static", "failfast", "eagle2-tree"],
)
def test_eagle3_on_the_static_runtime_drafts_and_decodes_as_on_the_eager_one(eagle3_checkpoint, runtime, policy):
    """The EAGLE-3 head's chain steps, tree root and tree levels on the static cache (StaticEagle3):
    the same drafts, round for round, and the same output as the eager runtime (float64)."""
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
    from specpolicy.plugins.manager import get_plugin_manager, make_policy
    from specpolicy.runners.eagle3 import StaticEagle3

    target = sharpen(tiny_lm(0, layers=6), 4.0)
    layers = tuple(default_layer_ids(6))
    head = load_eagle3(eagle3_checkpoint).double()
    embed = target.get_input_embeddings()
    runs = []
    for static in (False, True):
        verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
        drafter = Eagle3Drafter(head, embed, layers, VOCAB, runtime, frozenset({VOCAB - 1}))
        if static:
            verifier.static = StaticDecoder(target, 512)
            drafter.static = StaticEagle3(head, embed, 600)
        built = make_policy(get_plugin_manager(autoload=False), policy)
        runs.append(
            [
                generate(prompt, verifier, runtime, max_new_tokens=30, drafter=drafter, policy=built)
                for prompt in random_prompts(3)
            ]
        )
    for eager, static in zip(*runs):
        assert static.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in static.rounds] == [r.draft_token_ids for r in eager.rounds]
        assert [r.draft_parents for r in static.rounds] == [r.draft_parents for r in eager.rounds]


def test_batched_requests_do_not_share_a_drafters_static_cache(eagle3_checkpoint, runtime):
    """The batched loop copies the drafter per request: with a static cache (the compiled
    runtime's ``StaticEagle3``, one per drafter) the copies must not share it -- they draft as the
    eager drafter does, round for round (a shared cache gave garbage drafts, still lossless)."""
    from specpolicy.core.batching import generate_batch
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
    from specpolicy.plugins.manager import get_plugin_manager, make_policy
    from specpolicy.runners.eagle3 import StaticEagle3

    target = sharpen(tiny_lm(0, layers=6), 4.0)
    head = load_eagle3(eagle3_checkpoint).double()
    embed = target.get_input_embeddings()
    prompts = random_prompts(3)
    runs = []
    for static in (False, True):
        verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
        drafter = Eagle3Drafter(head, embed, tuple(default_layer_ids(6)), VOCAB, runtime, frozenset({VOCAB - 1}))
        if static:
            drafter.static = StaticEagle3(head, embed, 600)
        policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 3})
        runs.append(
            generate_batch(prompts, verifier, runtime, max_new_tokens=30, batch_size=3, drafter=drafter, policy=policy)
        )
    for i in range(len(prompts)):
        eager, static = runs[0].results[i], runs[1].results[i]
        assert static.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in static.rounds] == [r.draft_token_ids for r in eager.rounds]


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["static", "compiled"])
def test_eagle3_chain_equals_its_steps_one_by_one(two_buckets, eagle3_checkpoint, monkeypatch, compile):
    """``StaticEagle3.chain`` (greedy steps fused per chunk of ``runtime.chain_steps``, here 1 and 2; 1 to
    5 steps, so runs of 2 and a last 1): the tokens, confidences, last output, logits and cache of
    the same steps done one ``passes`` call at a time with ``choose``'s greedy rule (float64; the
    RoPE's cos and sin are float32 in both, from different kernels: a relative 1e-6)."""
    from specpolicy.core.sampling import choose
    from specpolicy.models.eagle3 import load_eagle3
    from specpolicy.runners.eagle3 import StaticEagle3

    head = load_eagle3(eagle3_checkpoint).double()
    embed = tiny_lm(0, layers=2).double().get_input_embeddings()
    settings = CompileSettings(**two_buckets, chain_steps=(1, 2))
    chained = StaticEagle3(head, embed, 64, compile=compile, settings=settings)
    stepped = StaticEagle3(head, embed, 64, settings=settings)
    assert sorted(chained._chains) == [1, 2]
    g = torch.Generator().manual_seed(0)
    context = (
        torch.randint(0, VOCAB - 1, (6,), generator=g),
        torch.randn(6, chained.hidden_size, generator=g, dtype=torch.float64),
    )
    with torch.inference_mode():
        for steps in range(1, 6):
            for s in (chained, stepped):
                s.reset()
                out, _ = s.passes(list(context))
            token, hidden = torch.tensor([7]), out[-1:]
            tokens, confs, last, logits = chained.chain(token, hidden, steps)
            want_tokens, want_confs, want_logits = [], [], []
            for _ in range(steps):
                hidden, step_logits = stepped.passes([token, hidden])
                ids, conf, _ = choose(step_logits, None, None)
                token = head.to_target_ids(ids)
                want_tokens.append(token), want_confs.append(conf), want_logits.append(step_logits)
            assert tokens.tolist() == torch.cat(want_tokens).tolist()
            assert chained.length == stepped.length == 6 + steps
            torch.testing.assert_close(confs, torch.cat(want_confs), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(logits, torch.cat(want_logits), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(last, hidden, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(
                chained.keys[0][:, :, : 6 + steps], stepped.keys[0][:, :, : 6 + steps], rtol=1e-6, atol=1e-6
            )
    with pytest.raises(ValueError, match="0 chain steps after"):
        chained.chain(token, hidden, 0)


@pytest.mark.slow
def test_eagle3_compiled_is_token_identical_to_eager(two_buckets, eagle3_checkpoint, compiled, target6):
    """``runtime.compile=true`` with EAGLE-3: target and head compiled (two buckets, float64), a chain
    and a tree policy, the same drafts and output as the eager runtime."""
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
    from specpolicy.plugins.manager import get_plugin_manager, make_policy

    layers = tuple(default_layer_ids(6))
    head = load_eagle3(eagle3_checkpoint).double()
    runs = []
    for compile in (False, True):
        if compile:  # compiled once for the module's EAGLE-3 tests
            rt, verifier, drafter = compiled_eagle3(compiled, target6, eagle3_checkpoint, two_buckets)
        else:
            rt = Runtime("cpu", "float64", seed=0)
            verifier = HFVerifier(target6, rt, frozenset({VOCAB - 1}))
            drafter = Eagle3Drafter(head, target6.get_input_embeddings(), layers, VOCAB, rt, frozenset({VOCAB - 1}))
        assert (drafter.static is not None) == compile and (rt.warmup_s > 0) == compile
        out = []
        for policy in (
            {"name": "static", "k": 3},
            {"name": "failfast", "n": 3, "tau": 0.3, "n_max": 12},  # chains of 2, 3, 5, ... steps
            {"name": "eagle2-tree", "top_k": 3, "depth": 4, "total_tokens": 10},
        ):
            built = make_policy(get_plugin_manager(autoload=False), policy)
            out += [
                generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=built)
                for prompt in random_prompts(2)
            ]
        runs.append(out)
    for eager, compiled in zip(*runs):
        assert compiled.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in compiled.rounds] == [r.draft_token_ids for r in eager.rounds]


@pytest.mark.parametrize(
    "policy",
    [{"name": "static", "k": 5}, {"name": "failfast", "n": 4, "tau": 0.0, "n_max": 40}],
    ids=["static", "failfast"],
)
def test_dflash_on_the_static_runtime_drafts_and_decodes_as_on_the_eager_one(family, runtime, policy):
    """DFlash's passes -- the first block, extension passes with drafted tokens given (FailFast up
    to 40), the context written by the same pass -- on the static cache (StaticDFlash): the same
    drafts round for round and the same output as the eager runtime (float64)."""
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy
    from specpolicy.verifiers.hf import build

    pm = get_plugin_manager(autoload=False)
    runs = []
    for static in (False, True):
        verifier = build({"model": str(family["target"])}, runtime)
        drafter = make_drafter(pm, {"name": "dflash", "model": str(family["dflash"])}, runtime, verifier)
        if static:
            from specpolicy.runners.dflash import StaticDFlash

            verifier.static = StaticDecoder(verifier.model, verifier.max_context)
            drafter.static = StaticDFlash(drafter.model, 600)
        built = make_policy(pm, policy)
        runs.append(
            [
                generate(prompt, verifier, runtime, max_new_tokens=40, drafter=drafter, policy=built)
                for prompt in random_prompts(3)
            ]
        )
    for eager, static in zip(*runs):
        assert static.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in static.rounds] == [r.draft_token_ids for r in eager.rounds]
    if policy["name"] == "failfast":  # tau 0: every draft extends to 40, past the block of 8: extension passes
        assert max(r.speculation_length for run in runs[1] for r in run.rounds) > 8


@pytest.mark.slow
def test_dflash_compiled_is_token_identical_to_eager(two_buckets, padding, family, compiled):
    """``runtime.compile=true`` with DFlash + FailFast: target and DFlash compiled (float64), extension
    passes included; the same drafts and output as the eager runtime."""
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy

    pm = get_plugin_manager(autoload=False)
    runs = []
    for compile in (False, True):
        if compile:  # compiled once for the module's DFlash tests
            rt, verifier, drafter = compiled_dflash(compiled, family, two_buckets)
        else:
            rt = Runtime("cpu", "float64", seed=0)
            verifier = make_verifier_hf(family, rt)
            drafter = make_drafter(pm, {"name": "dflash", "model": str(family["dflash"])}, rt, verifier)
        assert (drafter.static is not None) == compile
        policy = make_policy(pm, {"name": "failfast", "n": 4, "tau": 0.0, "n_max": 20})
        runs.append(
            [
                generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy)
                for prompt in random_prompts(2)
            ]
        )
    for eager, compiled in zip(*runs):
        assert compiled.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in compiled.rounds] == [r.draft_token_ids for r in eager.rounds]


def test_eagle3_batched_static_cache_equals_one_cache_per_request(two_buckets, eagle3_checkpoint):
    """``StaticEagle3.run_rows`` of 3 sequences: sequences fed different numbers of new positions at their own
    lengths give each the outputs and logits of a batch-1 ``StaticEagle3`` with the same history
    (float64); an idle sequence -- one a step leaves out, here one column short of the capacity
    -- keeps every column of its cache as it was (its pass goes to scratch columns); a sequence one
    column short of the capacity takes one more position beside longer feeds elsewhere."""
    from specpolicy.models.eagle3 import load_eagle3
    from specpolicy.runners.eagle3 import StaticEagle3

    head = load_eagle3(eagle3_checkpoint).double()
    embed = tiny_lm(0, layers=2).double().get_input_embeddings()
    capacity, H = 40, head.fc.weight.shape[0]
    settings = CompileSettings(**two_buckets)
    batch = StaticEagle3(head, embed, capacity, rows=3, settings=settings)
    alone = [StaticEagle3(head, embed, capacity, settings=settings) for _ in range(3)]
    assert batch.buckets == (8,)
    g = torch.Generator().manual_seed(0)
    starts = torch.zeros(3, dtype=torch.long)
    with torch.inference_mode():
        for counts in ([5, 2, 0], [1, 3, 0], [0, 1, 0], [9, 1, 0]):  # sequence 2 idle throughout
            n = max(counts)
            ids = torch.randint(0, VOCAB - 1, (3, n), generator=g)
            hidden = torch.randn(3, n, H, generator=g, dtype=torch.float64)
            if counts == [9, 1, 0]:  # the idle sequence one column short of the capacity
                starts[2] = capacity - 1
                before = (batch.keys[0][2, :, :capacity].clone(), batch.values[0][2, :, :capacity].clone())
            out, logits = batch.run_rows(ids, hidden, starts, torch.tensor(counts))
            for r, c in enumerate(counts):
                if c:
                    want_out, want_logits = alone[r].passes([ids[r, :c], hidden[r, :c]])
                    torch.testing.assert_close(out[r, :c], want_out, rtol=1e-6, atol=1e-6)
                    torch.testing.assert_close(logits[r, :c], want_logits, rtol=1e-6, atol=1e-6)
                    starts[r] += c
        assert torch.equal(batch.keys[0][2, :, :capacity], before[0])
        assert torch.equal(batch.values[0][2, :, :capacity], before[1])
        # one new position one column short of the capacity beside 9 elsewhere: fits (the padding goes to scratch)
        batch.run_rows(ids, hidden, torch.tensor([capacity - 1, 0, 0]), torch.tensor([1, 9, 0]))
        with pytest.raises(ValueError, match="do not fit"):  # two real positions past it do not
            batch.run_rows(ids[:, :2], hidden[:, :2], torch.tensor([capacity - 1, 0, 0]), torch.tensor([2, 0, 0]))


def make_verifier_hf(family, rt):
    from specpolicy.verifiers.hf import build

    return build({"model": str(family["target"])}, rt)


@pytest.mark.parametrize(  # EAGLE-3's static batched pass is the AR one's with target features: slow
    "kind", ["vanilla", "ar", pytest.param("eagle3", marks=pytest.mark.slow)]
)
def test_the_batched_loop_on_a_static_cache_decodes_every_request_as_alone(eagle3_checkpoint, runtime, kind):
    """The batched loop's static verifier (``StaticBatchedHFVerifier``: one sequence of the static
    cache per request, accepted entries left where they were written), and EAGLE-3's and the AR
    drafter's requests drafting on a batched static cache of their own (``StaticEagle3``,
    ``StaticDecoder`` of several sequences: one sequence each, idle ones untouched): 10 prompts through 4 slots (requests join and leave), static and FailFast
    policies -- every request's output, drafts and accepted lengths are those of the eager
    batch-1 loop (float64). Sampling: plain decoding of 4 requests on the static batched verifier
    draws the same tokens as the eager batched verifier under the same seed; sampling requests
    draft on the shared caches too, and one request at a time they draw the same tokens as on the
    eager batched loop (several at a time, a batched pass draws for its requests in row order:
    ``tests/core/test_batching.py`` checks their distribution)."""
    from specpolicy.core.batching import generate_batch
    from specpolicy.core.sampling import SamplingConfig
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
    from specpolicy.plugins.manager import get_plugin_manager, make_policy
    from specpolicy.runners.eagle3 import StaticEagle3
    from specpolicy.verifiers.hf_batch import StaticBatchedHFVerifier

    target = sharpen(tiny_lm(0, layers=6), 4.0)
    stop = frozenset({VOCAB - 1})
    head = load_eagle3(eagle3_checkpoint).double()
    drafters = {
        "vanilla": lambda: None,
        "ar": lambda: ARDrafter(sharpen(tiny_lm(1, layers=1), 4.0), runtime),
        "eagle3": lambda: Eagle3Drafter(
            head, target.get_input_embeddings(), tuple(default_layer_ids(6)), VOCAB, runtime, stop
        ),
    }
    prompts = [p[: 3 + 4 * i] for i, p in enumerate(random_prompts(10, seed=5))]
    static = HFVerifier(target, runtime, stop)
    static.static = StaticDecoder(target, static.max_context)
    eager = HFVerifier(target, runtime, stop)
    pm = get_plugin_manager(autoload=False)
    for choice in (
        [None]
        if kind == "vanilla"
        else [{"name": "static", "k": 3}, {"name": "failfast", "n": 3, "tau": 0.3, "n_max": 12}]
    ):
        make = lambda: (drafters[kind](), None if choice is None else make_policy(pm, choice))  # noqa: E731
        alone = [
            generate(p, eager, runtime, max_new_tokens=24, drafter=d, policy=q) for p in prompts for d, q in [make()]
        ]
        d, q = make()
        if kind == "eagle3":  # the head's static cache too: the requests draft on StaticEagle3's sequences
            d.static = StaticEagle3(head, target.get_input_embeddings(), 600)
        if kind == "ar":  # the AR drafter's: its requests draft on a StaticDecoder's sequences
            d.static = StaticDecoder(d.model, d.max_context)
        leads = []
        if d is not None:  # keep the drafter the run copies (Drafter.batched)
            d.batched = lambda slots, _batched=d.batched: leads.append(_batched(slots)) or leads[-1]
        batched = generate_batch(prompts, static, runtime, max_new_tokens=24, batch_size=4, drafter=d, policy=q)
        assert isinstance(static.batched(slots=4), StaticBatchedHFVerifier)
        if kind in ("eagle3", "ar"):  # the run's shared sequences: used, and every one given back
            shared = _shared_of(leads[-1])
            assert isinstance(shared.static, StaticEagle3 if kind == "eagle3" else StaticDecoder)
            assert shared.static.rows == 4
            assert sorted(shared.free) == [0, 1, 2, 3] and max(shared.lengths) > 0
        assert max(batched.batch_sizes) == 4 and sorted(batched.results) == list(range(10))
        for i, ref in enumerate(alone):
            got = batched.results[i]
            assert got.output_ids.tolist() == ref.output_ids.tolist(), (kind, choice, i)
            assert [(r.draft_token_ids, r.accepted_length) for r in got.rounds] == [
                (r.draft_token_ids, r.accepted_length) for r in ref.rounds
            ], (kind, choice, i)
    sampling = SamplingConfig(temperature=1.0)
    draws = []
    for verifier in (eager, static):
        d, q = make()
        if kind == "eagle3" and verifier is static:
            d.static = StaticEagle3(head, target.get_input_embeddings(), 600)
        if kind == "ar" and verifier is static:
            d.static = StaticDecoder(d.model, d.max_context)
        leads.clear()
        if d is not None:
            d.batched = lambda slots, _batched=d.batched: leads.append(_batched(slots)) or leads[-1]
        runtime.generator.manual_seed(7)
        out = generate_batch(  # vanilla: 4 requests on the static batched verifier; drafting: one at a time
            prompts, verifier, runtime, max_new_tokens=16, batch_size=4 if d is None else 1, drafter=d, policy=q,
            sampling=sampling,
        )  # fmt: skip
        draws.append([out.results[i].output_ids.tolist() for i in range(10)])
        if kind != "vanilla" and verifier is static:  # the sampling requests drafted on the shared sequence
            assert _shared_of(leads[-1]) is not None and _shared_of(leads[-1]).lengths[0] > 0
    assert draws[0] == draws[1]


def _shared_of(lead):
    """A batched run's shared sequences of a drafter's static cache (its runner's)."""
    return lead.runner.sequences


@pytest.mark.slow
def test_the_batched_loop_compiled_decodes_every_request_as_alone(two_buckets, target, compiled):
    """``runtime.compile=true``, batch size 3, 6 prompts: the compiled static batched verifier
    (its passes padded to 8 columns) gives every request the eager batch-1 output."""
    from specpolicy.core.batching import generate_batch
    from specpolicy.verifiers.hf_batch import StaticBatchedHFVerifier

    prompts = random_prompts(6)
    rt, static = compiled_verifier(compiled, target, two_buckets, "target")  # the module's compilation
    eager_rt = Runtime("cpu", "float64", seed=0)
    eager = HFVerifier(target, eager_rt, frozenset({VOCAB - 1}))
    alone = [generate(p, eager, eager_rt, max_new_tokens=20).output_ids.tolist() for p in prompts]
    warm = rt.warmup_s
    batched = generate_batch(prompts, static, rt, max_new_tokens=20, batch_size=3)
    verifier = static.batched(slots=3)
    assert isinstance(verifier, StaticBatchedHFVerifier) and verifier.static.compiled
    assert verifier.static.buckets == (8,) and rt.warmup_s > warm
    assert [batched.results[i].output_ids.tolist() for i in range(6)] == alone


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ar", "eagle3"])
def test_the_batched_loop_compiled_drafts_as_alone(two_buckets, eagle3_checkpoint, kind, compiled, target6):
    """``runtime.compile=true`` with EAGLE-3 or the AR drafter, batch size 3, 6 prompts, static
    k = 3: the requests draft on the drafter's compiled batched cache (``StaticEagle3``,
    ``StaticDecoder`` of 3 sequences; built once for the batch size, its compile seconds in the warm-up) --
    every request's output and drafts are those of the eager batch-1 loop, and the run compiles no
    graph past the warm-up."""
    from torch._dynamo.utils import counters

    from specpolicy.core.batching import generate_batch
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.models.eagle3 import default_layer_ids, load_eagle3
    from specpolicy.plugins.manager import get_plugin_manager, make_policy

    head = load_eagle3(eagle3_checkpoint).double()
    stop, layers = frozenset({VOCAB - 1}), tuple(default_layer_ids(6))
    prompts = random_prompts(6)
    runs = []
    for compile in (False, True):
        if compile:  # the module's compiled target (and EAGLE-3 head); the AR drafter compiled here
            rt, verifier, drafter = compiled_eagle3(compiled, target6, eagle3_checkpoint, two_buckets)
        else:
            rt = Runtime("cpu", "float64", seed=0)
            verifier = HFVerifier(target6, rt, stop)
            drafter = Eagle3Drafter(head, target6.get_input_embeddings(), layers, VOCAB, rt, stop)
        if kind == "ar":
            drafter = ARDrafter(sharpen(tiny_lm(1, layers=1), 4.0), rt)
        policy = make_policy(get_plugin_manager(autoload=False), {"name": "static", "k": 3})
        if not compile:
            runs.append([generate(p, verifier, rt, max_new_tokens=20, drafter=drafter, policy=policy) for p in prompts])
            continue
        warm = rt.warmup_s
        lead, _ = drafter.batched(3), verifier.batched(slots=3)  # built and warmed up once per batch size
        graphs = counters["stats"]["unique_graphs"]
        out = generate_batch(prompts, verifier, rt, max_new_tokens=20, batch_size=3, drafter=drafter, policy=policy)
        assert counters["stats"]["unique_graphs"] == graphs  # the warm-up compiled every graph the run met
        batch = _shared_of(lead).static
        assert batch.compiled and batch.buckets == (8,) and batch.warmup_s > 0 and rt.warmup_s > warm
        runs.append([out.results[i] for i in range(6)])
    for eager, compiled in zip(*runs):
        assert compiled.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in compiled.rounds] == [r.draft_token_ids for r in eager.rounds]


@pytest.mark.parametrize("policy", [{"name": "static", "k": 7}, {"name": "failfast", "n": 4, "tau": 0.0, "n_max": 20}])
def test_the_batched_loop_on_a_static_cache_drafts_dflash_as_alone(family, runtime, policy):
    """DFlash's requests in the batched loop drafting on a static cache of one context sequence
    each (``StaticDFlash`` of 4 sequences: newly committed positions and block in one pass for every
    request, idle sequences untouched): 9 prompts through 4 slots (requests join and leave; one
    prompt of 140 tokens, whose context plus block pass the largest bucket, 128, so its context is
    written alone first), one-block drafts and FailFast's extension passes -- every request's
    output, drafts and accepted lengths are those of the eager batch-1 loop (float64)."""
    from specpolicy.core.batching import generate_batch
    from specpolicy.core.sampling import SamplingConfig
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy
    from specpolicy.runners.dflash import StaticDFlash

    pm = get_plugin_manager(autoload=False)
    verifier = make_verifier_hf(family, runtime)
    make = lambda: (  # noqa: E731
        make_drafter(pm, {"name": "dflash", "model": str(family["dflash"])}, runtime, verifier),
        make_policy(pm, policy),
    )
    prompts = [p[: 3 + 4 * i] for i, p in enumerate(random_prompts(8, seed=5))]
    prompts.append(torch.randint(0, VOCAB - 1, (140,), generator=torch.Generator().manual_seed(9)))
    alone = [
        generate(p, verifier, runtime, max_new_tokens=24, drafter=d, policy=q) for p in prompts for d, q in [make()]
    ]
    d, q = make()
    d.static = StaticDFlash(d.model, 600)  # the batch-1 static cache: the requests draft on one of 4 sequences
    leads = []
    d.batched = lambda slots, _batched=d.batched: leads.append(_batched(slots)) or leads[-1]
    batched = generate_batch(prompts, verifier, runtime, max_new_tokens=24, batch_size=4, drafter=d, policy=q)
    shared = _shared_of(leads[-1])
    assert isinstance(shared.static, StaticDFlash) and shared.static.rows == 4
    assert sorted(shared.free) == [0, 1, 2, 3] and max(shared.lengths) >= 140
    sampled = generate_batch(
        prompts[:3],
        verifier,
        runtime,
        max_new_tokens=8,
        batch_size=4,
        drafter=d,
        policy=q,
        sampling=SamplingConfig(1.0),
    )
    assert sorted(sampled.results) == [0, 1, 2]
    again = _shared_of(leads[1])
    assert len(leads) == 2 and again.static is shared.static  # the same cache, built once
    assert sorted(again.free) == [0, 1, 2, 3] and max(again.lengths) > 0  # sampled on it
    assert max(batched.batch_sizes) == 4 and sorted(batched.results) == list(range(9))
    if policy["name"] == "failfast":  # tau 0: drafts past the block of 8 (extension passes)
        assert max(r.speculation_length for r in batched.results[0].rounds) > 8
    for i, ref in enumerate(alone):
        got = batched.results[i]
        assert got.output_ids.tolist() == ref.output_ids.tolist(), i
        assert [(r.draft_token_ids, r.accepted_length) for r in got.rounds] == [
            (r.draft_token_ids, r.accepted_length) for r in ref.rounds
        ], i


def test_dflash_batched_static_cache_equals_one_cache_per_request(family):
    """``StaticDFlash.run_rows`` over 3 sequences: sequences 0 and 2 fed together, at their own
    lengths, different numbers of newly committed positions and blocks of different lengths (a
    first pass's 8, an extension pass's 12), give each the block outputs of the same forward at
    ``R`` = 1 (a ``StaticDFlash`` of one sequence, the batch-1 loop's) with the same context, and
    of the eager network's one-request ``draft_pass``; sequence 1, left out of every pass, keeps
    every column of its cache (float64)."""
    from specpolicy.models.dflash import load_dflash
    from specpolicy.models.kv import KVCache
    from specpolicy.runners.dflash import StaticDFlash

    model = load_dflash(family["dflash"]).double()
    model.fuse()
    batch = StaticDFlash(model, 64, rows=3, buckets=(1, 2, 4, 8))
    alone = {0: StaticDFlash(model, 64), 2: StaticDFlash(model, 64)}
    eager = {0: KVCache(len(model.layers)), 2: KVCache(len(model.layers))}
    assert alone[0].buckets == (1, 2, 4, 8, 16, 32, 64, 128)  # one sequence: the one-row graph kept
    assert batch.buckets == (2, 4, 8, 128)  # no one-row graph in a batched cache; DFlash's 128 added
    g = torch.Generator().manual_seed(4)
    lengths = [0, 0, 0]
    for news in ({0: (5, 8), 2: (3, 12)}, {0: (7, 12), 2: (2, 8)}):
        n = max(u + q for u, q in news.values())
        context = torch.zeros((3, n, batch.features), dtype=torch.float64)
        block = torch.zeros((3, n, batch.hidden_size), dtype=torch.float64)
        counts, context_counts, refs = [0, 0, 0], [0, 0, 0], {}
        for slot, (u, q) in news.items():
            features = torch.randn((u, batch.features), generator=g, dtype=torch.float64)
            embeds = torch.randn((q, batch.hidden_size), generator=g, dtype=torch.float64)
            context[slot, :u], block[slot, u : u + q] = features, embeds
            counts[slot], context_counts[slot] = u + q, u
            one = alone[slot]
            refs[slot] = one.run_rows(
                torch.cat([embeds.new_zeros((u, batch.hidden_size)), embeds])[None],
                torch.cat([features, features.new_zeros((q, batch.features))])[None],
                torch.tensor([u]),
                torch.tensor([u + q]),
                torch.tensor([lengths[slot]]),
            )[0, u:]
            with torch.inference_mode():
                want = model.draft_pass(embeds[None], eager[slot], features[None])[0]
            torch.testing.assert_close(refs[slot], want, rtol=1e-5, atol=1e-5)  # RoPE tables: other kernels
        before = [(k[1].clone(), v[1].clone()) for k, v in zip(batch.keys, batch.values)]
        out = batch.run_rows(block, context, torch.tensor(context_counts), torch.tensor(counts), torch.tensor(lengths))
        for slot, (u, q) in news.items():
            lengths[slot] += u
            torch.testing.assert_close(out[slot, u : u + q], refs[slot], rtol=0, atol=1e-10)
        for (k, v), (k0, v0) in zip(zip(batch.keys, batch.values), before):
            assert torch.equal(k[1, :, :64], k0[:, :64]) and torch.equal(v[1, :, :64], v0[:, :64])


@pytest.mark.slow
def test_the_batched_loop_compiled_drafts_dflash_as_alone(two_buckets, family, compiled):
    """``runtime.compile=true`` with DFlash + FailFast (extension passes), batch size 3, 6 prompts:
    the requests draft on the drafter's compiled batched cache (``StaticDFlash`` of 3 sequences, built once
    for the batch size, its compile seconds in the warm-up) -- every request's output and drafts
    are those of the eager batch-1 loop, and the run compiles no graph past the warm-up."""
    from torch._dynamo.utils import counters

    from specpolicy.core.batching import generate_batch
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy
    from specpolicy.runners.dflash import StaticDFlash

    pm = get_plugin_manager(autoload=False)
    prompts = random_prompts(6)
    runs = []
    for compile in (False, True):
        if compile:  # the module's compiled target and DFlash drafter
            rt, verifier, drafter = compiled_dflash(compiled, family, two_buckets)
        else:
            rt = Runtime("cpu", "float64", seed=0)
            verifier = make_verifier_hf(family, rt)
            drafter = make_drafter(pm, {"name": "dflash", "model": str(family["dflash"])}, rt, verifier)
        policy = make_policy(pm, {"name": "failfast", "n": 4, "tau": 0.0, "n_max": 20})
        if not compile:
            runs.append([generate(p, verifier, rt, max_new_tokens=20, drafter=drafter, policy=policy) for p in prompts])
            continue
        warm = rt.warmup_s
        batch, _ = _shared_of(drafter.batched(3)).static, verifier.batched(slots=3)  # built and warmed up
        graphs = counters["stats"]["unique_graphs"]
        out = generate_batch(prompts, verifier, rt, max_new_tokens=20, batch_size=3, drafter=drafter, policy=policy)
        assert counters["stats"]["unique_graphs"] == graphs  # the warm-up compiled every graph the run met
        assert isinstance(batch, StaticDFlash) and batch.rows == 3 and batch.compiled and batch.buckets == (8, 128)
        assert batch.warmup_s > 0 and rt.warmup_s > warm
        runs.append([out.results[i] for i in range(6)])
    for eager, compiled in zip(*runs):
        assert compiled.output_ids.tolist() == eager.output_ids.tolist()
        assert [r.draft_token_ids for r in compiled.rounds] == [r.draft_token_ids for r in eager.rounds]


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_a_drafter_s_static_cache_is_sized_by_the_verifier_s_context(kind, family, monkeypatch):
    """On the compiled runtime the DFlash and EAGLE-3 drafters size their static caches by the
    verifier's ``max_context`` (plus one block, or 128 tree nodes), not by their own
    ``max_position_embeddings``: a request the verifier accepts fits the drafter's cache, and a
    shorter ``verifier.max_context`` bounds its memory."""
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_verifier

    sizes = []

    class Recorder:  # the static cache's constructor, without compiling anything
        def __init__(self, *args, compile=False, settings=None, **kwargs):
            sizes.append(args[-1])
            self.capacity = args[-1]

        def warmup(self):
            return 0.0

    from specpolicy.runners import dflash, eagle3

    monkeypatch.setattr(dflash, "StaticDFlash", Recorder)
    monkeypatch.setattr(eagle3, "StaticEagle3", Recorder)
    pm = get_plugin_manager(autoload=False)
    eager = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = make_verifier(pm, {"name": "hf", "model": str(family["target"]), "max_context": 300}, eager)
    compiled = Runtime(device="cpu", dtype="float64", seed=0, compile=True)
    drafter = make_drafter(pm, {"name": kind, "model": str(family[kind])}, compiled, verifier)
    margin = drafter.block_size if kind == "dflash" else 128
    assert sizes == [300 + margin] and drafter.static.capacity == 300 + margin
