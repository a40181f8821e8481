"""Fast tests of the dLLM drafter's matched objective (suffix masks, soft targets) and of the
drafter diagnostics (specpolicy.family.diagnostics) on tiny models."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from specpolicy.core.runtime import Runtime
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.family.block_diffusion import mixed_noise, sample_noise, sample_suffix_noise
from specpolicy.family.data import Example, collate
from specpolicy.family.diagnostics import (
    accepted_length_shares,
    collect_drafts,
    expected_calibration_error,
    summarize_drafts,
)
from specpolicy.family.distill import greedy_generate, load_soft_targets, save_soft_targets
from specpolicy.family.evaluate import dllm_block_draft
from specpolicy.family.models import new_model
from specpolicy.family.tokenizer import build_tokenizer, encode_prompt, encode_response
from specpolicy.family.train_dllm import (
    dllm_loss_from_inputs,
    make_dllm_inputs,
    soft_batch,
    soft_cross_entropy,
    train_dllm_model,
)
from specpolicy.family.trainer import TrainConfig
from test_family import _rows


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(_rows(60), vocab_size=400)


@pytest.fixture(scope="module")
def examples(tok):
    return [
        Example(tuple(encode_prompt(tok, r["question"])), tuple(encode_response(tok, r["answer"]))) for r in _rows(6)
    ]


def _tiny(tok, seed=0, dtype=torch.float32):
    m = new_model("tiny", tok, seed)
    with torch.no_grad():  # make attention matter in the random model
        for n, p in m.named_parameters():
            if "layers" in n and p.ndim == 2:
                p.mul_(6)
    return m.to(dtype).eval()


# ---------------------------------------------------------------- masks


def test_suffix_masks_are_block_suffixes():
    g = torch.Generator().manual_seed(0)
    resp = torch.zeros(64, 96, dtype=torch.bool)
    resp[:, 10:90] = True
    masked, targets = sample_suffix_noise(resp, g, 32, 8, boundary_prob=0.5)
    off = torch.arange(96) % 32
    assert not (targets & ~resp).any()  # only response tokens
    assert torch.equal(masked, targets & (off > 0))  # offset 0 is a target but never a mask
    cuts = []
    for b in range(3):
        blk_t, blk_r = targets[:, 32 * b : 32 * b + 32], resp[:, 32 * b : 32 * b + 32]
        for r in range(64):
            idx = blk_t[r].nonzero().flatten().tolist()
            if idx:  # a suffix: every response token from the first target on is a target
                assert blk_t[r, idx[0] :].tolist() == blk_r[r, idx[0] :].tolist()
                if b == 1:
                    cuts.append(idx[0])
    assert len(set(cuts)) > 8  # uniform cuts occur ...
    share_boundary = sum(c % 8 == 0 for c in cuts) / len(cuts)
    assert share_boundary > 0.4  # ... and small-block boundaries are favoured (0.5 + 0.5 * 4/32 expected)
    _, t1 = sample_suffix_noise(resp, torch.Generator().manual_seed(1), 32, 8, boundary_prob=1.0)
    firsts = [int(t1[r, 32:64].nonzero()[0]) for r in range(64) if t1[r, 32:64].any()]
    assert set(firsts) <= {0, 8, 16, 24} and len(set(firsts)) > 1
    with pytest.raises(ValueError, match="small_block_size"):
        sample_suffix_noise(resp, g, 32, 5)


def test_mixed_noise_keeps_the_original_recipe_and_mixes_per_block():
    resp = torch.zeros(8, 128, dtype=torch.bool)
    resp[:, 5:120] = True
    a, b = sample_noise(resp, torch.Generator().manual_seed(3), 32)
    m0, t0 = mixed_noise(resp, torch.Generator().manual_seed(3), 32, suffix_prob=0.0)
    assert torch.equal(m0, torch.cat([a, b])) and torch.equal(t0, m0)  # same draws as Fast-dLLM v2 alone
    m1, t1 = mixed_noise(resp, torch.Generator().manual_seed(3), 32, suffix_prob=1.0)
    r2 = resp.repeat(2, 1)
    for r in range(16):
        for blk in range(4):
            t = t1[r, 32 * blk : 32 * blk + 32]
            if t.any():
                first = int(t.nonzero()[0])
                assert torch.equal(t[first:], r2[r, 32 * blk + first : 32 * blk + 32])
    mh, th = mixed_noise(resp, torch.Generator().manual_seed(3), 32, suffix_prob=0.5)
    # per block either complementary random masks (copies disjoint, union = response) or suffixes
    B = 8
    kinds = set()
    for r in range(B):
        for blk in range(4):
            s = slice(32 * blk, 32 * blk + 32)
            comp = not (mh[r, s] & mh[B + r, s]).any() and torch.equal(mh[r, s] | mh[B + r, s], resp[r, s])
            kinds.add(comp)
    assert kinds == {True, False}


# ---------------------------------------------------------------- loss


def test_soft_cross_entropy_equals_full_vocabulary_ce():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 12, generator=g)
    p = torch.randn(5, 12, generator=g).softmax(-1)
    lp, ids = p.log().topk(12, dim=-1)  # k = V: no rest bucket
    assert torch.allclose(soft_cross_entropy(logits, ids, lp), F.cross_entropy(logits, p), atol=1e-5)
    lp4, ids4 = p.log().topk(4, dim=-1)  # k < V: the rest is one bucket
    q = logits.softmax(-1)
    q_top = q.gather(1, ids4)
    p_rest = 1 - lp4.exp().sum(-1)
    manual = -((lp4.exp() * q_top.log()).sum(-1) + p_rest * (1 - q_top.sum(-1)).log()).mean()
    assert torch.allclose(soft_cross_entropy(logits, ids4, lp4), manual, atol=1e-5)


def test_matched_loss_uses_the_token_shift_and_soft_targets(tok, examples):
    m = _tiny(tok, dtype=torch.float64)
    batch = collate(examples, tok.pad_token_id, 32)
    batch["index"] = torch.arange(len(examples))
    B, L = batch["input_ids"].shape
    inp = make_dllm_inputs(
        batch, tok.mask_token_id, torch.Generator().manual_seed(5), 32, suffix_prob=1.0, boundary_prob=1.0
    )
    noisy = inp["input_ids"][:, :L]
    assert torch.equal(noisy == tok.mask_token_id, inp["masked"])
    first = inp["targets"] & ~inp["masked"]  # targets kept visible: block offset 0 only
    assert first.any() and (first.nonzero()[:, 1] % 32 == 0).all()
    V, k = len(tok), 3
    g = torch.Generator().manual_seed(9)
    soft = []
    for e in examples:
        lp = torch.randn(len(e.response_ids), V, generator=g).log_softmax(-1)
        v, i = lp.topk(k, dim=-1)
        soft.append((i.to(torch.int16), v.to(torch.float16)))
    sids, slps = soft_batch(batch, soft)
    with torch.no_grad():
        loss, n = dllm_loss_from_inputs(m, inp, 32, (sids, slps), soft_weight=0.3)
        logits = m(input_ids=inp["input_ids"], position_ids=inp["position_ids"], attention_mask=inp["mask"]).logits
    hard = soft_sum = 0.0
    cnt = 0
    plen = batch["prompt_len"].repeat(2)
    for r in range(2 * B):
        for i in inp["targets"][r].nonzero().flatten().tolist():
            src = i - 1 if i % 32 else L + i - 1  # token shift: noisy i-1, or clean i-1 at a block start
            lg = logits[r, src]
            hard += F.cross_entropy(lg[None], inp["clean"][r, i][None]).item()
            ti, tl = soft[r % B]
            j = i - int(plen[r])
            q = lg.softmax(-1)
            pt = tl[j].double().exp()
            qt = q[ti[j].long()]
            soft_sum += -((pt * qt.log()).sum() + (1 - pt.sum()) * (1 - qt.sum()).log()).item()
            cnt += 1
    assert n == cnt
    assert abs(loss.item() - (0.7 * hard + 0.3 * soft_sum) / cnt) < 1e-6


def test_matched_phase_trains_and_saves(tok, examples, tmp_path):
    from specpolicy.family.models import load_model, save_model

    save_model(_tiny(tok), tok, tmp_path / "init")
    soft = [
        (
            torch.tensor([[t]] * 1, dtype=torch.int16).repeat(len(e.response_ids), 1),
            torch.zeros(len(e.response_ids), 1, dtype=torch.float16),
        )
        for e, t in zip(examples, range(10, 16))
    ]
    cfg = TrainConfig(epochs=2, max_steps=3, batch_tokens=512, lr=1e-3, warmup_steps=1, pad_to_multiple=32, log_every=1)
    st = train_dllm_model(
        tmp_path / "init",
        examples,
        tok,
        cfg,
        tmp_path / "out",
        suffix_prob=0.5,
        soft_targets=soft,
        soft_weight=0.5,
        checkpoint_every=2,
    )
    assert st["steps"] == 3 and st["suffix_prob"] == 0.5 and st["soft_weight"] == 0.5
    assert load_model(tmp_path / "out").config.bd_block_size == 32
    ckpt = load_model(tmp_path / "out.checkpoint").config
    assert ckpt.train_step == 2 and ckpt.bd_block_size == 32
    with pytest.raises(ValueError, match="soft"):
        train_dllm_model(tmp_path / "init", examples, tok, cfg, tmp_path / "x", soft_weight=0.5)


def test_distill_soft_targets_roundtrip(tok, tmp_path):
    m = _tiny(tok, seed=1)
    prompts = [encode_prompt(tok, r["question"]) for r in _rows(4)]
    ids, soft = greedy_generate(m, prompts, -1, tok.pad_token_id, 6, batch_size=4, top_k=5)
    assert ids == greedy_generate(m, prompts, -1, tok.pad_token_id, 6, batch_size=4)
    for o, (ti, tl) in zip(ids, soft):
        assert ti.shape == tl.shape == (len(o), 5)
        assert (tl[:, :-1] >= tl[:, 1:]).all() and (tl <= 0).all()  # sorted log-probabilities
        assert ti[:, 0].long().tolist() == o  # the greedy token is the top-1
    save_soft_targets(soft, tmp_path / "s.pt")
    back = load_soft_targets(tmp_path / "s.pt")
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(back, soft))


def test_pipeline_rejects_out_of_range_objective_options(capsys):
    from specpolicy.family.pipeline import build_parser, check_args

    with pytest.raises(SystemExit, match=r"--suffix-prob=1.5; it must be in \[0, 1\]"):
        check_args(build_parser().parse_args(["--suffix-prob", "1.5"]))
    with pytest.raises(SystemExit, match="at least one"):
        check_args(build_parser().parse_args(["--dllm-epochs", "0", "--dllm-matched-epochs", "0"]))


# ---------------------------------------------------------------- diagnostics


def test_ece_and_summary_on_known_drafts():
    conf = torch.tensor([0.95, 0.95, 0.55, 0.55])
    correct = torch.tensor([True, True, True, False])
    # bins: 0.9-1.0 acc 1.0 conf 0.95 -> 0.05; 0.5-0.6 acc 0.5 conf 0.55 -> 0.05
    assert expected_calibration_error(conf, correct) == pytest.approx(0.05, abs=1e-6)
    assert expected_calibration_error(torch.tensor([0.3]), torch.tensor([False])) == pytest.approx(0.3, abs=1e-3)
    ref = torch.arange(100, 140)
    d1 = ref.clone()
    d1[3] = 0  # correct prefix 3
    d2 = ref.clone()  # all correct
    d3 = ref.clone()
    d3[0] = 0  # wrong first, right later
    drafts = [
        (d1, torch.full((40,), 0.9), ref),
        (d2, torch.full((40,), 0.9), ref),
        (d3, torch.full((40,), 0.9), ref[:10]),
    ]  # the third reference ends after 10 tokens
    s = summarize_drafts(drafts, 40, draft_lengths=(8, 16, 32), calibration_distance=32)
    assert s["agreement"][0] == pytest.approx(2 / 3, abs=1e-3) and s["agreement"][3] == pytest.approx(2 / 3, abs=1e-3)
    assert s["agreement"][1] == 1.0 and s["n_by_distance"][9] == 3 and s["n_by_distance"][10] == 2
    assert s["agreement"][20] == 1.0  # only d1, d2 reach distance 21; d1 matches there again
    assert s["longest_correct_prefix"] == {
        "8": pytest.approx((3 + 8 + 0) / 3, abs=1e-3),
        "16": pytest.approx((3 + 16) / 3, abs=1e-3),
        "32": pytest.approx((3 + 32) / 3, abs=1e-3),
    }
    assert s["mean_confidence_by_distance"][0] == pytest.approx(0.9, abs=1e-3)
    assert s["ece_by_distance"][0] == pytest.approx(abs(2 / 3 - 0.9), abs=1e-4)


def test_accepted_length_shares(tmp_path):
    rows = [
        {"rounds": [{"speculation_length": 16, "accepted_length": a} for a in (0, 2, 5, 12)]},
        {
            "rounds": [
                {"speculation_length": 16, "accepted_length": 16},
                {"speculation_length": 0, "accepted_length": 0},
            ]
        },
    ]
    p = tmp_path / "results.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = accepted_length_shares(p)
    assert s["rounds"] == 5 and s["share_ge"] == {"1": 0.8, "3": 0.6, "5": 0.6, "10": 0.4}
    assert s["mean_accepted_length"] == pytest.approx(35 / 5)


def test_collect_drafts_runs_the_loop_drafter(tok):
    """The one-pass draft's first small block equals one block-causal pass over prefix + masks
    (the same model through evaluate.dllm_block_draft), and drafts cross block boundaries.
    Threshold 0 makes every small block one pass (the random model's confidences are low)."""
    m = _tiny(tok, seed=2, dtype=torch.float64)
    m.config.bd_block_size = 32
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    drafter = FastDLLMDrafter(m, rt, tok, block_size=32, small_block_size=8, threshold=0.0)
    prompt = torch.tensor(encode_prompt(tok, _rows(1)[0]["question"]))
    out = torch.tensor(greedy_generate(m, [prompt.tolist()], -1, tok.pad_token_id, 40)[0])
    drafts = collect_drafts(drafter, [prompt], [out], stride=7, max_distance=40)
    assert len(drafts) == len(range(0, 40, 7))
    for (ids, conf, ref), c in zip(drafts, range(0, 40, 7)):
        assert ids.shape == conf.shape == (40,) and torch.equal(ref, out[c : c + 40])
        assert ((conf > 0) & (conf <= 1)).all()
        prefix = torch.cat([prompt, out[:c]]).tolist()
        off = len(prefix) % 32
        if off:
            n_first = 8 - off % 8  # the rest of the current small block: decoded by the first pass
            one = dllm_block_draft(m, prefix, tok.mask_token_id, tok.pad_token_id, 32)
            assert ids[:n_first].tolist() == one[:n_first].tolist()


# ---------------------------------------------------------------- calibration


def test_temperature_fit_and_fold(tok, examples, tmp_path):
    from specpolicy.family.calibrate import calibrate_saved, fit_temperature, fold_temperature
    from specpolicy.family.models import load_model, save_model

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4000, 6, generator=g) * 2
    targets = torch.multinomial(z.softmax(-1), 1, generator=g).squeeze(1)  # calibrated at T = 1 on z
    t, before, after = fit_temperature(z * 1.4, targets)  # logits 1.4x too sharp: over-confident
    assert 1.3 <= t <= 1.5 and after < before / 3
    t, _, _ = fit_temperature(z * 0.7, targets)  # under-confident
    assert 0.6 <= t <= 0.8
    m = _tiny(tok)
    x = torch.tensor([examples[0].prompt_ids])
    with torch.no_grad():
        ref = m(input_ids=x).logits
        fold_temperature(m, 1.25)
        assert torch.allclose(m(input_ids=x).logits, ref / 1.25, atol=1e-4)  # every logit divided by T
    save_model(_tiny(tok), tok, tmp_path / "d", extra_config={"bd_block_size": 32, "mask_token_id": tok.mask_token_id})
    cal = calibrate_saved(tmp_path / "d", examples, tok)
    assert cal["positions"] > 0 and 0.5 <= cal["temperature"] <= 1.5
    cfg = load_model(tmp_path / "d").config
    assert cfg.confidence_temperature == pytest.approx(cal["temperature"]) and cfg.bd_block_size == 32
