"""The architectures users bring (issue 48, item 1): random targets built from the real
``config.json`` of Llama-3.1-8B (RoPE ``llama3``), Qwen2.5-7B (q/k/v biases), Qwen3-8B (q/k norms)
and Mistral-7B-v0.3 (``tests/family_models.py``, cut to 2 layers and width 64 with ``head_dim``
128, the GQA ratio, biases and norms kept), float64:

- the static forward (``specpolicy.runners.decoder.StaticDecoder``) gives HF's logits and hidden
  states (chain, chunks, tree) for each family, each RoPE type it runs and tied embeddings, and
  refuses in one line the RoPE types and sliding windows it does not reproduce;
- greedy decoding is token-identical to vanilla on the eager runtime and on the static cache,
  chain and tree, with an AR drafter that is the target itself (every draft accepted), one close to
  it (accepted and rejected), and random EAGLE-3 and DFlash drafters of the target's shapes
  (losslessness holds whatever they draft); compiled (``runtime.compile=true``, slow): the same,
  one compilation per family;
- speculative sampling is distributed as the target (the chi-square test of
  ``tests/core/test_sampling.py``) on a one-layer model of each family;
- one layer at each family's real width (slow): the shape and memory paths.
"""

from __future__ import annotations

import pytest
import torch

from family_models import FAMILIES, family_lm, perturbed
from specpolicy.core import tree
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import CompileSettings, Runtime
from specpolicy.drafters.ar import ARDrafter
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.policies.failfast_tree import FailFastTreePolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.runners.decoder import StaticDecoder
from specpolicy.verifiers.hf import HFVerifier

VOCAB = 256
EOS = VOCAB - 1
CONTEXT = 512  # the verifiers' max_context (tokens)
SHARP = 40.0  # the targets' LM head scale: peaked enough for drafts close to the target to be accepted


def prompts(n: int = 2, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, EOS, (length,), generator=g) for length in (17, 33, 9)[:n]]


@pytest.fixture(
    scope="module",  # the fast subset keeps Llama (llama3 RoPE, explicit head_dim); the others are slow
    params=[f if f == "llama-3.1-8b" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES],
)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def target(arch):
    return family_lm(arch, sharpen=SHARP)


def _hf(model, ids, **kw):
    with torch.no_grad():
        return model(ids[None], output_hidden_states=True, **kw)


def test_static_forward_equals_hf_in_chunks_and_trees(arch, target):
    """Logits and every hidden state of HF's forward, in one pass and in chunks of 4, then a tree
    pass after the prefix (positions by depth, a tree mask)."""
    ids = prompts(2)[1]
    ref = _hf(target, ids)
    for buckets in ((1, 2, 4, 8, 16, 32, 64), (1, 4)):
        s = StaticDecoder(target, 128, buckets=buckets)
        logits, states = s.run(ids)
        torch.testing.assert_close(logits, ref.logits[0], rtol=0, atol=1e-10)
        assert states.shape == (33, 3, 64)
        for i, h in enumerate(ref.hidden_states):
            torch.testing.assert_close(states[:, i], h[0], rtol=0, atol=1e-10)
    from transformers import DynamicCache

    parents, start = [-1, -1, 0, 1, 1], 32
    positions, mask = tree.verification_layout(parents, start, "cpu")
    inputs = torch.cat([ids[-1:], torch.tensor([11, 13, 17, 19, 23])])
    cache = DynamicCache()
    with torch.no_grad():
        target(ids[None, :-1], cache=cache, use_cache=True)
        tree_ref = target(inputs[None], position_ids=positions[None], attention_mask=mask[None, None], cache=cache)
    s = StaticDecoder(target, 128, buckets=(1, 2, 4, 8))
    s.run(ids[:-1])
    logits, _ = s.run(inputs, positions, mask)
    torch.testing.assert_close(logits, tree_ref.logits[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
    ids=lambda r: r["rope_type"],
)
def test_every_rope_type_the_static_forward_runs_equals_hf_past_the_original_context(rope):
    """Each RoPE type of ``STATIC_ROPE_TYPES`` (yarn with its attention scaling), over 120 positions
    -- past the 64 of ``original_max_position_embeddings`` -- on a Llama cut: HF's logits."""
    from transformers import LlamaForCausalLM

    model = family_lm("llama-3.1-8b", sharpen=SHARP)
    config = model.config
    config.rope_parameters = {"rope_theta": 500000.0, **rope}
    fresh = LlamaForCausalLM(config).double().eval()
    fresh.load_state_dict(model.state_dict())
    ids = torch.randint(0, EOS, (120,), generator=torch.Generator().manual_seed(2))
    logits, _ = StaticDecoder(fresh, 256).run(ids)
    torch.testing.assert_close(logits, _hf(fresh, ids).logits[0], rtol=0, atol=1e-10)


def test_tied_embeddings_and_what_the_static_forward_cannot_run_are_one_line():
    """Tied embeddings (Llama-3.2-1B's ``tie_word_embeddings``): HF's logits. Refused in one
    line, before a pass: ``dynamic`` and ``longrope`` RoPE (frequencies that change with the
    length), and a sliding window narrower than the cache (Mistral-7B-v0.1's 4,096 tokens)."""
    tied = family_lm("llama-3.1-8b", tie=True)
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    ids = prompts(1)[0]
    torch.testing.assert_close(StaticDecoder(tied, 64).run(ids)[0], _hf(tied, ids).logits[0], rtol=0, atol=1e-10)
    for rope in (
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 64,
            "long_factor": [2.0] * 64,
            "original_max_position_embeddings": 64,
        },
    ):
        model = family_lm("llama-3.1-8b")
        model.config.rope_parameters = {"rope_theta": 500000.0, **rope}
        with pytest.raises(ValueError, match=f"has rope_scaling type '{rope['rope_type']}', whose frequencies change"):
            StaticDecoder(model, 64)
    mistral = family_lm("mistral-7b-v0.3")
    mistral.config.sliding_window = 256  # Mistral-7B-v0.1 slides over 4,096 tokens
    StaticDecoder(mistral, 256)  # a context within the window: every position attends to all
    with pytest.raises(ValueError, match="sliding window of 256 tokens, .* the context is 257 tokens"):
        StaticDecoder(mistral, 257)


# -- greedy losslessness, eager and on the static cache ----------------------------------------


def _eagle3(target, runtime):
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.family.train_eagle3 import new_eagle3

    layers = [0, 1, 2]
    size = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
    head = new_eagle3(target.config, torch.arange(VOCAB), seed=4, layer_ids=layers, size=size).double().eval()
    with torch.no_grad():
        head.lm_head.weight.mul_(SHARP)
    embed = target.get_input_embeddings()
    return Eagle3Drafter(head, embed, tuple(layers), VOCAB, runtime, frozenset({EOS}), CONTEXT)


def _dflash(target, runtime):
    from specpolicy.drafters.dflash import DFlashDrafter
    from specpolicy.family.train_dflash import init_final_norm, new_dflash

    size = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
    model = new_dflash(target.config, EOS - 1, 4, [0, 1], seed=3, size=size)
    init_final_norm(model, target)
    model = model.double().eval()
    return DFlashDrafter(
        model,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        runtime,
        frozenset({EOS}),
        max_context=CONTEXT,
    )


def _drafters(target, runtime) -> dict:
    """Each drafter with its chain and tree policies."""
    chain = lambda: StaticPolicy(k=4)  # noqa: E731
    eagle_tree = lambda: Eagle2TreePolicy(depth=4, top_k=3, total_tokens=10)  # noqa: E731
    return {
        "self": (ARDrafter(target, runtime), (chain, eagle_tree)),
        "close": (ARDrafter(perturbed(target), runtime), (chain, eagle_tree)),
        "eagle3": (_eagle3(target, runtime), (chain, eagle_tree)),
        "dflash": (_dflash(target, runtime), (chain, lambda: FailFastTreePolicy(n=1, tau=0.2, n_max=3, branch_k=3))),
    }


def _static_drafter(name: str, drafter):
    """Put a drafter on the static cache after building it (uncompiled: the compiled code, cheap)."""
    if name in ("self", "close"):
        drafter.static = StaticDecoder(drafter.model, CONTEXT)
    elif name == "eagle3":
        from specpolicy.runners.eagle3 import StaticEagle3

        drafter.static = StaticEagle3(drafter.model, drafter.embed_tokens, CONTEXT + 128)
    else:
        from specpolicy.runners.dflash import StaticDFlash

        drafter.static = StaticDFlash(drafter.model, CONTEXT + drafter.block_size)
    return drafter


def _assert_lossless_family(target, verifier, runtime, drafters, vanilla, accepted: dict) -> None:
    for name, (drafter, policies) in drafters.items():
        for policy in policies:
            for prompt, ref in zip(prompts(), vanilla):
                out = generate(prompt, verifier, runtime, max_new_tokens=32, drafter=drafter, policy=policy())
                assert out.output_ids.tolist() == ref, (name, type(policy()).__name__)
                accepted[name] = accepted.get(name, 0) + sum(r.accepted_length for r in out.rounds)


@pytest.fixture(scope="module")
def vanilla(arch, target) -> list[list[int]]:
    """The target's vanilla greedy outputs of ``prompts()`` on the eager runtime (32 tokens each)."""
    runtime = Runtime(device="cpu", dtype="float64", seed=0)
    eager = HFVerifier(target, runtime, frozenset({EOS}), max_context=CONTEXT)
    return [generate(p, eager, runtime, max_new_tokens=32).output_ids.tolist() for p in prompts()]


def _dart_and_falcon(target, verifier, runtime, directory) -> dict:
    """Random DART (the released layout: EAGLE-3's tensors over ``hidden_states[0, 1, 2]`` and
    ``mask_rep``) and Falcon (k = 2) checkpoints of the target's width and vocabulary, built by their
    factories against ``verifier`` (eager: neither has a static cache), with their tree policies."""
    import json

    from safetensors.torch import load_file, save_file

    from conditioned_reference import write_eagle3_checkpoint
    from specpolicy.family.train_falcon import new_falcon
    from specpolicy.models.falcon import save_falcon
    from specpolicy.plugins.manager import get_plugin_manager, make_drafter
    from specpolicy.policies.dart_tree import DartTreePolicy
    from specpolicy.policies.falcon_tree import FalconTreePolicy

    hidden = int(target.config.hidden_size)
    dart = write_eagle3_checkpoint(directory / "dart", hidden, VOCAB, VOCAB // 2, seed=5, layer_ids=[0, 1, 2])
    weights = load_file(str(dart / "model.safetensors"))
    weights["midlayer.mask_rep"] = torch.randn(2 * hidden, generator=torch.Generator().manual_seed(6))
    save_file(weights, str(dart / "model.safetensors"))
    config = json.loads((dart / "config.json").read_text())
    (dart / "config.json").write_text(
        json.dumps({**config, "architectures": ["LlamaForCausalLMDart"], "draft_length": 7})
    )
    size = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
    falcon = save_falcon(new_falcon(target.config, 7, size=size), directory / "falcon")
    pm = get_plugin_manager(autoload=False)
    chain = lambda: StaticPolicy(k=4)  # noqa: E731
    return {
        "dart": (
            make_drafter(pm, {"name": "dart", "model": str(dart)}, runtime, verifier),
            (chain, lambda: DartTreePolicy(top_k=4, beam_width=6, total_tokens=6, use_ngram=False)),
        ),
        "falcon": (
            make_drafter(pm, {"name": "falcon", "model": str(falcon)}, runtime, verifier),
            (chain, FalconTreePolicy),
        ),
    }


def test_greedy_decoding_is_vanilla_on_the_eager_runtime(arch, target, vanilla, runtime):
    """Every drafter x {chain, tree} on the eager runtime -- AR, EAGLE-3, DFlash: vanilla's tokens;
    the self-drafting and close AR drafters get drafts accepted (the path where acceptance matters)."""
    eager = HFVerifier(target, runtime, frozenset({EOS}), max_context=CONTEXT)
    accepted: dict = {}
    _assert_lossless_family(target, eager, runtime, _drafters(target, runtime), vanilla, accepted)
    assert accepted["self"] > 50 and accepted["close"] > 5, accepted


@pytest.mark.slow
def test_dart_and_falcon_decode_every_family_as_vanilla(arch, target, vanilla, runtime, tmp_path):
    """DART and Falcon checkpoints of the family's width, built by their factories, chain and tree
    (eager: the runtime they run on, beside a compiled target too): vanilla's tokens."""
    eager = HFVerifier(target, runtime, frozenset({EOS}), max_context=CONTEXT)
    _assert_lossless_family(target, eager, runtime, _dart_and_falcon(target, eager, runtime, tmp_path), vanilla, {})


def test_greedy_decoding_is_vanilla_on_the_static_cache(arch, target, vanilla, runtime):
    """The same on the static cache (uncompiled: the compiled runtime's code, cheap): the target
    alone and every drafter x {chain, tree}, each drafter on its own static cache."""
    static = HFVerifier(target, runtime, frozenset({EOS}), max_context=CONTEXT)
    static.static = StaticDecoder(target, CONTEXT)
    assert [generate(p, static, runtime, max_new_tokens=32).output_ids.tolist() for p in prompts()] == vanilla
    drafters = {name: (_static_drafter(name, d), p) for name, (d, p) in _drafters(target, runtime).items()}
    accepted: dict = {}
    _assert_lossless_family(target, static, runtime, drafters, vanilla, accepted)
    assert accepted["self"] > 50 and accepted["close"] > 5, accepted


# -- compiled: one compilation per family ------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(arch, target):
    """The family's compiled verifier, EAGLE-3 and DFlash drafters (``runtime.compile=true``, two
    buckets), built once per family, and an eager self-drafting AR drafter. Llama's are compiled
    with the CPU's default settings (inductor's freezing: the weights folded in as constants); the
    other families' without freezing (``runtime.cpu_freeze=false``), which traces about twice as
    fast: what differs between families -- RoPE, ``head_dim``, the attention's shapes -- is in the
    graphs either way, and freezing only turns the same weights into constants."""
    eager_rt = Runtime("cpu", "float64", seed=0)
    settings = CompileSettings(buckets=(1, 8), cpu_freeze=arch == "llama-3.1-8b")
    rt = Runtime("cpu", "float64", seed=0, compile=True, compiled=settings)
    verifier = HFVerifier(target, rt, frozenset({EOS}), max_context=CONTEXT)
    drafters = {k: v for k, v in _drafters(target, rt).items() if k in ("eagle3", "dflash")}
    drafters["self"] = (ARDrafter(target, eager_rt), _drafters(target, eager_rt)["self"][1])  # eager beside it
    return verifier, rt, drafters


@pytest.mark.slow
def test_compiled_runtime_decodes_every_family_as_vanilla(arch, target, vanilla, compiled):
    """``runtime.compile=true``: the compiled target alone and with EAGLE-3 and DFlash compiled
    (chain and tree) and a self-drafting AR drafter: the eager runtime's vanilla tokens."""
    verifier, rt, drafters = compiled
    assert verifier.static is not None and verifier.static.compiled and rt.warmup_s > 0
    assert drafters["eagle3"][0].static is not None and drafters["dflash"][0].static is not None
    assert [generate(p, verifier, rt, max_new_tokens=32).output_ids.tolist() for p in prompts()] == vanilla
    accepted: dict = {}
    _assert_lossless_family(target, verifier, rt, drafters, vanilla, accepted)
    assert accepted["self"] > 50, accepted


# -- sampling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n if n == "qwen3-8b" else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES])
def test_speculative_sampling_is_distributed_as_the_target_for_every_family(name):
    """A one-layer model of the family over 16 tokens (``test_sampling``'s V) and a drafter close
    to it, N = 500 seeded runs of 3 tokens: the joint of the 3 matches the target's exact one
    (chi-square, ``test_sampling.ALPHA``), with drafts both accepted and rejected."""
    from test_sampling import ALPHA, TEMPERATURE, V, chi_square_pvalue, exact_joint, run_counts

    runtime = Runtime(device="cpu", dtype="float64", seed=0)
    target = family_lm(name, layers=1, hidden=32, vocab=V, sharpen=16.0)  # >= 15 cells of count >= 5 at N
    with torch.no_grad():  # no EOS among the 16: every run makes 3 tokens
        target.generation_config.eos_token_id = None
    drafter_model = perturbed(target, scale=0.5)
    prompt = torch.tensor([3])
    counts, stats = run_counts(
        lambda: (ARDrafter(drafter_model, runtime), StaticPolicy(k=2)), prompt, TEMPERATURE, runtime, target
    )
    pvalue, df = chi_square_pvalue(counts, exact_joint(target, prompt, TEMPERATURE))
    rate = stats["accepted"] / stats["speculated"]
    assert 0.1 < rate < 0.95 and df >= 10, (stats, df)
    assert pvalue > ALPHA, f"{name}: chi-square p = {pvalue:.2e} <= {ALPHA:.1e} (df {df}), {stats}"


# -- the real width --------------------------------------------------------------------------


@pytest.mark.slow
def test_one_layer_at_each_familys_real_width_runs_static_and_lossless():
    """One layer at the published width, heads, key/value heads, ``head_dim`` and intermediate
    size (Llama-3.1-8B, Mistral-7B-v0.3, Qwen3-8B: 4096 wide; Qwen2.5-7B: 3584), float32, a 1,024
    vocabulary (the embeddings are the only part cut): the static cache's buffers have the real
    shapes, its logits are HF's (to float32's rounding), and self-drafted greedy decoding on it (the
    verifier's projections packed, the drafter's the model's own) is vanilla's."""
    runtime = Runtime(device="cpu", dtype="float32", seed=0)
    for name in FAMILIES:
        model = family_lm(name, layers=1, hidden=None, vocab=1024, dtype=torch.float32, sharpen=1.0)
        config = model.config
        static = StaticDecoder(model, 64)
        assert static.keys[0].shape == (1, config.num_key_value_heads, 64 + 64, 128)
        ids = torch.randint(0, 1023, (24,), generator=torch.Generator().manual_seed(4))
        torch.testing.assert_close(static.run(ids)[0], _hf(model, ids).logits[0], rtol=1e-4, atol=1e-4)
        eager = HFVerifier(model, runtime, frozenset({1023}), max_context=64)
        ref = generate(ids, eager, runtime, max_new_tokens=8).output_ids.tolist()
        verifier = HFVerifier(model, runtime, frozenset({1023}), max_context=64)
        verifier.static = static  # the cache just checked (the verifier's prefill resets it): one packing less
        drafter = ARDrafter(model, runtime)
        # the drafter's static cache on the model's own weights (runtime.cpu_pack=false): the unpacked
        # projections at the real width too, and no second packed copy of ~200M weights to build
        drafter.static = StaticDecoder(model, 64, settings=CompileSettings(cpu_pack=False))
        assert not drafter.static.packed and static.packed
        out = generate(ids, verifier, runtime, max_new_tokens=8, drafter=drafter, policy=StaticPolicy(k=4))
        assert out.output_ids.tolist() == ref, name
        del model, static, eager, verifier, drafter


# -- bad input: one line, before any model loads -------------------------------------------------


def _cli_error(monkeypatch, capsys, tmp_path, family, *args: str) -> list[str]:
    """Run the CLI on the tiny family with ``args`` (each replacing the key it sets) and every model
    load refused; return its stderr lines (the run must stop with status 2)."""
    import sys

    from conftest import overrides
    from specpolicy.run.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr("specpolicy.models.loading.load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    keys = tuple(a.split("=")[0] + "=" for a in args)
    base = [a for a in overrides(family) if not a.startswith(keys)]
    monkeypatch.setattr(sys, "argv", ["specpolicy", *base, *args])
    capsys.readouterr()  # what came before (a save's progress bar)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def _target_dir(tmp_path, name: str, **fields):
    """Family ``name``'s cut model on disk, its ``config.json`` fields set to ``fields``."""
    import json

    from family_models import write_family_checkpoint

    directory = write_family_checkpoint(name, tmp_path / f"{name}-target")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return directory


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"model_type": "phi3"}, "is model_type 'phi3' (the compiled runtime runs llama, mistral, qwen2, qwen3)"),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "rope_parameters": None},
            "has rope_scaling type 'dynamic', whose frequencies change with the sequence's length (the compiled "
            "runtime reproduces default, linear, llama3, yarn)",
        ),
        (
            {"sliding_window": 256, "max_position_embeddings": 1024},  # Mistral-7B-v0.1's window, scaled down
            "attends over a sliding window of 256 tokens, which the static forward does not implement, and the "
            "context is 1024 tokens (set verifier.max_context <= 256)",
        ),
    ],
    ids=["architecture", "rope-type", "sliding-window"],
)
def test_a_target_the_compiled_runtime_does_not_reproduce_is_one_line(
    fields, why, family, tmp_path, monkeypatch, capsys
):
    directory = _target_dir(tmp_path, "mistral-7b-v0.3", **fields)
    lines = _cli_error(monkeypatch, capsys, tmp_path, family, f"verifier.model={directory}", "runtime.compile=true")
    assert lines == [
        f"error: runtime.compile=true cannot run verifier.model='{directory}': it {why}; or use runtime.compile=false"
    ]


def test_a_sliding_window_within_the_context_and_the_eager_runtime_pass_validation(family, tmp_path):
    """``verifier.max_context`` within the window passes; so does any model on the eager runtime."""
    from specpolicy.run.validation import _check_compiled_target

    directory = _target_dir(tmp_path, "mistral-7b-v0.3", sliding_window=256)
    _check_compiled_target({"name": "hf", "model": str(directory), "max_context": 256}, {})
    for name in FAMILIES:
        _check_compiled_target({"name": "hf", "model": str(_target_dir(tmp_path, name))}, {"name": "ar"})


@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_a_drafter_whose_width_or_vocabulary_does_not_fit_the_target_is_one_line(
    drafter, family, tmp_path, monkeypatch, capsys
):
    """An EAGLE-3 head or a DFlash drafter of width 32 (the tiny family's) against a Llama target of
    width 64; then of the target's width but another vocabulary."""
    from conditioned_reference import write_dflash_checkpoint, write_eagle3_checkpoint

    target = _target_dir(tmp_path, "llama-3.1-8b")

    def checkpoint(hidden: int, vocab: int):
        if drafter == "eagle3":
            return write_eagle3_checkpoint(
                tmp_path / f"e{hidden}-{vocab}", hidden, vocab, vocab // 2, layer_ids=[0, 1, 2]
            )
        return write_dflash_checkpoint(tmp_path / f"d{hidden}-{vocab}", hidden, vocab, 2, [0, 1], 4, 3)

    narrow = checkpoint(32, VOCAB)
    lines = _cli_error(
        monkeypatch,
        capsys,
        tmp_path,
        family,
        f"verifier.model={target}",
        f"drafter={drafter}",
        f"drafter.model={narrow}",
    )
    assert len(lines) == 1 and lines[0].startswith(f"error: drafter.model='{narrow}': ")
    assert "hidden_size 32 does not match the target's 64" in lines[0] or "target_hidden_size 32" in lines[0]
    other = checkpoint(64, 300)
    lines = _cli_error(
        monkeypatch,
        capsys,
        tmp_path,
        family,
        f"verifier.model={target}",
        f"drafter={drafter}",
        f"drafter.model={other}",
    )
    assert len(lines) == 1 and lines[0].startswith(f"error: drafter.model='{other}': ") and "300" in lines[0], lines
    assert "256" in lines[0], lines
