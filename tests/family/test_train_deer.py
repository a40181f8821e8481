"""DEER's training (``specpolicy.family.train_deer``): the two stages' masks and weights, the weighted
loss, and a tiny end-to-end run (LoRA adapter saved, merged at load; full weights from scratch)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import tiny_lm, tiny_tokenizer
from specpolicy.family.data import Example, collate, save_examples
from specpolicy.family.train_deer import (
    ALPHA,
    deer_loss,
    main,
    scribe_weights,
    stage1_targets,
    stage2_targets,
)

B = 32


def _response(spans: list[tuple[int, int]], length: int = 2 * B) -> torch.Tensor:
    r = torch.zeros(len(spans), length, dtype=torch.bool)
    for i, (a, b) in enumerate(spans):
        r[i, a:b] = True
    return r


def test_scribe_weights_worked_example():
    """Block 0 holds response tokens at offsets 10..31 (22 tokens), block 1 at 32..39 (8 tokens).
    R = 3 in block 0: offsets 29, 30, 31 masked with weights alpha^2, alpha^1, alpha^0 (token i = 1
    next to the prefix weighs alpha^(R - i)). R = 12 in block 1: only 8 response tokens, so R' = 8:
    offsets 32..39 weighted alpha^7 .. alpha^0."""
    resp = _response([(10, 40)])
    targets, weights = scribe_weights(resp, torch.tensor([[3, 12]]), alpha=1.01)
    assert targets[0].nonzero().flatten().tolist() == [29, 30, 31, *range(32, 40)]
    w = weights[0]
    assert w[29:32].tolist() == pytest.approx([1.01**2, 1.01, 1.0])
    assert w[32:40].tolist() == pytest.approx([1.01 ** (7 - j) for j in range(8)])
    assert w[:29].abs().sum() == 0 and w[40:].abs().sum() == 0


def test_stage2_masks_a_suffix_of_each_block_ending_at_its_last_response_token():
    resp = _response([(5, 64), (40, 50), (0, 33)])
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        masked, targets, weights = stage2_targets(resp, gen)
        assert not (targets & ~resp).any() and not (masked & ~targets).any()
        assert not masked[:, ::B].any()  # a block's first token is never a mask (token shift)
        for row in range(3):
            for blk in range(2):
                t = targets[row, blk * B : (blk + 1) * B]
                r = resp[row, blk * B : (blk + 1) * B]
                if not r.any():
                    assert not t.any()
                    continue
                idx = t.nonzero().flatten()
                last = int(r.nonzero().flatten()[-1])
                assert len(idx) >= 1 and int(idx[-1]) == last and idx.tolist() == list(range(int(idx[0]), last + 1))
                w = weights[row, blk * B : (blk + 1) * B][idx]
                assert w.tolist() == pytest.approx([ALPHA ** (len(idx) - 1 - j) for j in range(len(idx))])


def test_stage1_masks_a_suffix_from_a_uniform_cut():
    resp = _response([(0, 64)] * 200)
    masked, targets, weights = stage1_targets(resp, torch.Generator().manual_seed(0))
    counts = targets.view(200, 2, B).sum(-1)  # cut c -> 32 - c targets
    assert counts.min() >= 1 and counts.max() == B and len(set(counts.flatten().tolist())) > 20
    suffix = targets.view(200, 2, B).int().diff(dim=-1) >= 0  # 0 .. 0 1 .. 1
    assert suffix.all() and torch.equal(weights, targets.float())


def test_weighted_loss_is_the_weighted_mean_of_token_losses():
    model = tiny_lm(0, layers=1, vocab=64).float()
    model.config._attn_implementation = "sdpa"
    ex = [Example(tuple(range(1, 9)), tuple(range(9, 40)))]
    batch = collate(ex, 0, B)
    targets = torch.zeros(1, 2 * B, dtype=torch.bool)
    targets[0, [20, 21, 22]] = True
    masked = targets.clone()

    def one(pos):
        t = torch.zeros_like(targets)
        t[0, pos] = True
        with torch.no_grad():
            return float(deer_loss(model, batch, masked, t, t.float(), 63)[0])

    ce = [one(p) for p in (20, 21, 22)]  # same noisy input, each token's own cross-entropy
    w = torch.zeros(1, 2 * B)
    w[0, [20, 21, 22]] = torch.tensor([ALPHA**2, ALPHA, 1.0])
    with torch.no_grad():
        loss, n = deer_loss(model, batch, masked, targets, w, 63)
    want = (ALPHA**2 * ce[0] + ALPHA * ce[1] + ce[2]) / (ALPHA**2 + ALPHA + 1)
    assert n == 3 and math.isclose(float(loss), want, rel_tol=1e-5)


@pytest.fixture
def tiny_setup(tmp_path):
    tok = tiny_tokenizer()
    base = tiny_lm(1, vocab=len(tok), max_positions=1024, eos=tok.convert_tokens_to_ids("<|im_end|>")).float()
    base.config.bd_block_size = 32
    base.config.mask_token_id = tok.convert_tokens_to_ids("|<MASK>|")
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    g = torch.Generator().manual_seed(0)
    exs = [
        Example(
            tuple(torch.randint(5, 200, (12,), generator=g).tolist()),
            tuple(torch.randint(5, 200, (50,), generator=g).tolist()),
        )
        for _ in range(24)
    ]
    save_examples(exs, tmp_path / "distill.jsonl")
    return tmp_path, tok


def test_lora_run_writes_a_small_adapter_and_curves(tiny_setup):
    from specpolicy.core.runtime import Runtime
    from specpolicy.models.deer import load_deer

    tmp, tok = tiny_setup
    args = ["--distill", str(tmp / "distill.jsonl"), "--base", str(tmp / "base"), "--out", str(tmp / "deer")]
    args += ["--stage1-steps", "3", "--stage2-steps", "2", "--heldout", "4", "--batch-tokens", "256"]
    args += ["--checkpoint-every", "2", "--log-every", "1", "--rank", "4", "--threads", "1"]
    main(args)
    files = sorted(p.name for p in (tmp / "deer").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "deer.json"]
    log = json.loads((tmp / "training_log.json").read_text())
    s1, s2 = log["deer-drafter-stage1"], log["deer-drafter-stage2"]
    assert s1["steps"] == 3 and s2["steps"] == 2 and s1["heldout_curve"][0][0] == 0
    assert set(s1["heldout_curve"][-1][1]) == {"stage1", "stage2"} and s2["r_max"] == 32 and s2["alpha"] == ALPHA
    assert log["deer-drafter-weights"]["weights_bytes"] == (tmp / "deer" / "adapter_model.safetensors").stat().st_size
    meta = json.loads((tmp / "deer" / "deer.json").read_text())
    assert meta["base"] == str(tmp / "base") and meta["vocab_size"] == len(tok) and meta["kind"] == "lora"
    model, tok_source = load_deer(str(tmp / "deer"), Runtime(device="cpu", dtype="float32", seed=0))
    assert tok_source == str(tmp / "base") and not any("lora" in n for n, _ in model.named_parameters())


def test_from_scratch_run_writes_full_weights(tiny_setup, monkeypatch):
    import specpolicy.family.models as fm

    tmp, tok = tiny_setup
    tiny_size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    tiny_size |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    monkeypatch.setitem(fm.SIZES, "dllm-drafter", tiny_size)
    args = ["--distill", str(tmp / "distill.jsonl"), "--base", str(tmp / "base"), "--out", str(tmp / "scratch")]
    args += ["--from-scratch", "--stage1-steps", "2", "--stage2-steps", "1", "--heldout", "4", "--batch-tokens", "256"]
    main(args + ["--checkpoint-every", "5", "--threads", "1"])
    cfg = json.loads((tmp / "scratch" / "config.json").read_text())
    assert cfg["bd_block_size"] == 32 and cfg["num_hidden_layers"] == 1
    assert json.loads((tmp / "scratch" / "deer.json").read_text())["kind"] == "full"
