"""``drafter=deer``: one denoising step over the block, lossless greedy (static, failfast) and sampling,
the checkpoint forms (LoRA adapter merged at load, full weights) and bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import VOCAB, random_prompts, sharpen, tiny_lm, tiny_tokenizer
from specpolicy.core.decoding import generate
from specpolicy.core.errors import ConfigError
from specpolicy.drafters.deer import DEERDrafter, validate
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy, make_verifier
from specpolicy.verifiers.hf import HFVerifier

MASK = VOCAB - 2


def _drafter(model, runtime, block_size=32):
    return DEERDrafter(model, runtime, SimpleNamespace(mask_token_id=MASK), block_size=block_size)


def test_one_pass_fills_the_rest_of_the_block(runtime):
    """From a committed prefix of 5, a 27-token draft is ONE pass: the argmax of each position of a
    single bidirectional pass over prefix + 27 masks (one block of 32), read with the token shift."""
    model = tiny_lm(3, layers=2)
    d = _drafter(model, runtime)
    prompt = torch.tensor([5, 9, 14, 3, 7])
    d.prefill(prompt)
    draft = d.draft(27)
    assert draft.forward_passes == 1 and draft.length == 27
    seq = torch.cat([prompt, torch.full((27,), MASK)])[None]
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=torch.ones(1, 1, 32, 32, dtype=torch.bool)).logits[0]
    assert torch.equal(draft.token_ids, logits[4:31].argmax(-1))


def test_a_draft_crossing_the_block_pays_the_boundary_pass(runtime):
    d = _drafter(tiny_lm(3, layers=2), runtime)
    d.prefill(torch.arange(1, 21))  # 20 committed: 12 positions left in the block
    draft = d.draft(32)
    assert draft.length == 32 and draft.forward_passes == 3  # the block, its KV + next first token, the next block


@pytest.mark.parametrize(
    "policy",
    [
        {"name": "static", "k": 8},
        {"name": "static", "k": 32},
        {"name": "failfast", "n": 4, "tau": 0.3, "n_max": 40},
    ],
)
def test_greedy_is_lossless(runtime, policy):
    target = sharpen(tiny_lm(0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset({VOCAB - 1}))
    drafter = _drafter(sharpen(tiny_lm(0, layers=2), 4.0), runtime)  # the target's weights, masked: long accepts
    built = make_policy(get_plugin_manager(autoload=False), policy)
    accepted = 0
    for prompt in random_prompts(4):
        vanilla = generate(prompt, verifier, runtime, max_new_tokens=60)
        spec = generate(prompt, verifier, runtime, max_new_tokens=60, drafter=drafter, policy=built)
        assert torch.equal(spec.output_ids, vanilla.output_ids)
        accepted += sum(r.accepted_length for r in spec.rounds)
    assert accepted > 0


def test_sampling_matches_the_target_distribution():
    """The statistical test of ``tests/core/test_sampling.py`` on DEER: one pass samples the block
    from its per-position q (independent of the other samples), verified with min(1, p/q)."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.policies.static import StaticPolicy
    from test_sampling import (
        ALPHA,
        MASK as SMASK,
        PROMPT,
        TEMPERATURE,
        T,
        _lm,
        chi_square_pvalue,
        exact_joint,
        run_counts,
    )

    rt = Runtime(device="cpu", dtype="float64", seed=0)
    target = _lm(0)

    def make():
        drafter = DEERDrafter(target, rt, SimpleNamespace(mask_token_id=SMASK), block_size=8)
        return drafter, StaticPolicy(k=T - 1)

    counts, stats = run_counts(make, PROMPT, TEMPERATURE, rt, target)
    pvalue, df = chi_square_pvalue(counts, exact_joint(target, PROMPT, TEMPERATURE))
    rate = stats["accepted"] / stats["speculated"]
    assert 0.15 < rate < 0.9 and stats["passes"] > 0, stats  # acceptance and rejection exercised
    assert df >= 10 and pvalue > ALPHA, (pvalue, df, stats)


# -- checkpoints: LoRA adapter on a base dLLM, full weights --------------------------------------


def _family_base(tmp_path):
    """A tiny block-diffusion base (float32, the tiny tokenizer with its mask token) and its target."""
    tok = tiny_tokenizer()
    vocab = len(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    paths = {}
    for name, seed in (("target", 0), ("base", 1)):
        m = tiny_lm(seed, vocab=vocab, max_positions=1024, eos=eos).float()
        m.config.bd_block_size = 32
        m.config.mask_token_id = tok.convert_tokens_to_ids("|<MASK>|")
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        paths[name] = tmp_path / name
    return paths, tok


def _adapter(tmp_path, paths, tok):
    """A LoRA adapter with nonzero weights on the base, saved as train_deer saves it."""
    from specpolicy.family.train_deer import lora_model, save_adapter

    model, peft_model = lora_model(paths["base"], rank=4, seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    meta = {"block_size": 32, "mask_token_id": tok.convert_tokens_to_ids("|<MASK>|"), "vocab_size": len(tok)}
    save_adapter(peft_model, tmp_path / "deer", str(paths["base"]), meta)
    return model, tmp_path / "deer"


def test_adapter_is_merged_at_load_and_lossless(tmp_path):
    from specpolicy.core.runtime import Runtime

    paths, tok = _family_base(tmp_path)
    trained, deer_dir = _adapter(tmp_path, paths, tok)
    rt = Runtime(device="cpu", dtype="float32", seed=0)
    pm = get_plugin_manager(autoload=False)
    verifier = make_verifier(pm, {"name": "hf", "model": str(paths["target"])}, rt)
    drafter = make_drafter(pm, {"name": "deer", "model": str(deer_dir)}, rt, verifier)
    assert isinstance(drafter, DEERDrafter) and drafter.small_block_size == 32 and drafter.threshold == 0.0
    assert "lora" not in " ".join(n for n, _ in drafter.model.named_parameters())  # merged: a plain model
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    with torch.no_grad():  # the merged model computes what the adapter model computed (bf16-stored adapter)
        a = drafter.model(input_ids=ids).logits
        b = trained(input_ids=ids).logits
    assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()
    base = tiny_lm(1, vocab=len(tok), max_positions=1024).float()(input_ids=ids).logits
    assert not torch.allclose(a, base, atol=1e-3)  # the adapter changed the base
    prompt = torch.tensor([5, 9, 14, 3, 7])
    vanilla = generate(prompt, verifier, rt, max_new_tokens=40)
    spec = generate(
        prompt, verifier, rt, max_new_tokens=40, drafter=drafter, policy=make_policy(pm, {"name": "static", "k": 32})
    )
    assert torch.equal(spec.output_ids, vanilla.output_ids)


def _validate(model, target=None, **extra):
    run = {"verifier": {"model": str(target)}} if target else {}
    return validate({"model": str(model), **extra}, run)


def test_bad_input_is_one_line_naming_the_key(tmp_path, monkeypatch):
    paths, tok = _family_base(tmp_path)
    _, deer_dir = _adapter(tmp_path, paths, tok)
    _validate(deer_dir, paths["target"])  # accepted: no error
    cases = []
    # missing directory
    cases.append((tmp_path / "nowhere", "no DEER checkpoint directory"))
    # adapter without its weights
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("adapter_config.json", "deer.json"):
        (broken / f).write_text((deer_dir / f).read_text())
    cases.append((broken, "adapter's weights"))
    # another vocabulary
    other = tmp_path / "other"
    other.mkdir()
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        (other / f).write_bytes((deer_dir / f).read_bytes())
    meta = json.loads((deer_dir / "deer.json").read_text())
    (other / "deer.json").write_text(json.dumps({**meta, "vocab_size": 151936}))
    cases.append((other, "151936-token vocabulary; the target has"))
    # an empty directory
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append((empty, "neither a DEER adapter"))
    for path, words in cases:
        with pytest.raises(ConfigError) as info:
            _validate(path, paths["target"])
        msg = str(info.value)
        assert msg.startswith(f"drafter.model='{path}'") and words in msg and "\n" not in msg, msg
    monkeypatch.setattr("specpolicy.models.loading.bundled_dir", lambda: tmp_path / "bundle")
    with pytest.raises(ConfigError, match=r"^drafter.model='deer-drafter': no DEER checkpoint .*not bundled yet"):
        validate({"model": "deer-drafter"}, {})
    with pytest.raises(ConfigError, match=r"^drafter.block_size=16 but the DEER checkpoint"):
        _validate(deer_dir, paths["target"], block_size=16)
    with pytest.raises(ConfigError, match=r"^unknown key drafter.path_search; drafter has keys"):
        _validate(deer_dir, paths["target"], path_search="cps")
