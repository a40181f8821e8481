"""Fast tests of specpolicy.family (tokenizer, block-diffusion masks/shift, training, generation, eval)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specpolicy.family.block_diffusion import (
    block_causal_mask,
    dual_stream_mask,
    sample_noise,
    shift_source,
    to_attention_mask,
)
from specpolicy.family.data import Example, batch_plan, collate, fit_length, load_examples
from specpolicy.family.distill import greedy_generate
from specpolicy.family.evaluate import answer_metrics, simulate_rounds
from specpolicy.family.models import count_params, load_model, new_model
from specpolicy.family.tokenizer import (
    IM_END,
    MASK_TOKEN,
    PAD_TOKEN,
    build_tokenizer,
    encode_prompt,
    encode_response,
    load_tokenizer,
)
from specpolicy.family.train_ar import ar_loss, train_ar_model
from specpolicy.family.train_dllm import dllm_loss_from_inputs, make_dllm_inputs, train_dllm_model
from specpolicy.family.trainer import TrainConfig, bf16_autocast_pays


def _rows(n: int = 120, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert"]
    items = ["clips", "apples", "pages", "letters", "eggs", "pencils"]
    rows = []
    for _ in range(n):
        who, what = rng.choice(names), rng.choice(items)
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append(
            {
                "question": f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have?",
                "answer": f"{who} has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} {what}.\n#### {a + b}",
            }
        )
    return rows


@pytest.fixture(scope="module")
def rows():
    return _rows()


@pytest.fixture(scope="module")
def tok(rows):
    return build_tokenizer(rows, vocab_size=400)


@pytest.fixture(scope="module")
def data_file(rows, tmp_path_factory):
    p = tmp_path_factory.mktemp("gsm") / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_special_tokens_and_roundtrip(tok, rows, tmp_path):
    assert [tok.convert_tokens_to_ids(t) for t in (PAD_TOKEN, "<|im_start|>", IM_END, MASK_TOKEN)] == [0, 1, 2, 3]
    assert tok.eos_token == IM_END and tok.eos_token_id == 2
    assert tok.pad_token == PAD_TOKEN and tok.pad_token_id == 0
    assert tok.mask_token == MASK_TOKEN and tok.mask_token_id == 3
    assert len(tok) <= 400
    for r in rows[:20] + [{"answer": "Ünïcödé 12,345.50 $<<3*4=12>>12 \n\t#### -7"}]:
        ids = tok(r["answer"], add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == r["answer"]
    # digits are split individually
    toks = tok.convert_ids_to_tokens(tok("<<48/2=24>>24", add_special_tokens=False)["input_ids"])
    assert all(len(t.strip("Ġ")) == 1 for t in toks if any(c.isdigit() for c in t))
    assert toks.count("4") == 3 and toks.count("2") == 3
    # save / load round trip keeps everything
    tok.save_pretrained(tmp_path)
    t2 = load_tokenizer(tmp_path)
    assert t2.mask_token_id == 3 and t2.eos_token_id == 2 and t2.pad_token_id == 0
    assert encode_prompt(t2, "hi 42") == encode_prompt(tok, "hi 42")


def test_chat_template(tok):
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_prompt(tok, "What is 2+3?")
    assert ids[0] == 1 and tok.decode(ids) == text
    assert ids.count(2) == 1  # one <|im_end|> (after the user turn)
    two = tok.apply_chat_template(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], tokenize=False
    )
    assert two == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
    r = encode_response(tok, "x = <<1+1=2>>2\n#### 2")
    assert r[-1] == tok.eos_token_id and tok.decode(r) == "x = <<1+1=2>>2\n#### 2<|im_end|>"


# ---------------------------------------------------------------- data


def test_data_examples_and_batches(tok, data_file):
    exs, st = load_examples(data_file, tok, max_len=384)
    assert st["n_out"] == len(exs) == 120 and st["n_dropped"] == 0
    short, st2 = fit_length(exs, max_len=40, overflow="drop")
    assert st2["n_dropped"] + len(short) == 120 and all(len(e) <= 40 for e in short)
    tr, st3 = fit_length(exs, max_len=40, overflow="truncate")
    assert len(tr) == 120 and all(len(e) <= 40 for e in tr)
    b = collate(exs[:3], tok.pad_token_id, pad_to_multiple=32)
    assert b["input_ids"].shape[1] % 32 == 0
    for i, e in enumerate(exs[:3]):
        p = len(e.prompt_ids)
        assert b["response"][i].nonzero().flatten().tolist() == list(range(p, len(e)))
        assert b["valid"][i].sum() == len(e)
        assert (b["input_ids"][i, len(e) :] == tok.pad_token_id).all()
    lens = [len(e) for e in exs]
    plan = batch_plan(lens, 500, seed=1, epoch=0)
    assert sorted(i for bb in plan for i in bb) == list(range(120))
    assert all(len(bb) * max(lens[i] for i in bb) <= 500 for bb in plan)
    assert plan == batch_plan(lens, 500, seed=1, epoch=0) != batch_plan(lens, 500, seed=1, epoch=1)


# ---------------------------------------------------------------- block diffusion conventions


def test_dual_stream_mask_entries():
    L, bs = 8, 4  # blocks {0..3}, {4..7}
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, 6:] = False  # row 1: positions 6, 7 are padding
    m = dual_stream_mask(valid, bs)
    assert m.shape == (2, 1, 2 * L, 2 * L) and m.dtype == torch.bool
    m0 = m[0, 0]
    N, C = 0, L  # offsets of the noisy / clean streams
    # noisy query in block 1 (pos 5): noisy keys of block 1 only, clean keys of block 0 only
    assert [bool(m0[N + 5, N + j]) for j in range(L)] == [False] * 4 + [True] * 4
    assert [bool(m0[N + 5, C + j]) for j in range(L)] == [True] * 4 + [False] * 4
    # noisy query in block 0: its own noisy block, no clean key at all
    assert [bool(m0[N + 1, N + j]) for j in range(L)] == [True] * 4 + [False] * 4
    assert not m0[N + 1, C:].any()
    # clean query in block 0: clean keys of block 0 (bidirectional), no noisy key
    assert [bool(m0[C + 1, C + j]) for j in range(L)] == [True] * 4 + [False] * 4
    assert not m0[C + 1, :L].any()
    # clean query in block 1: clean keys of blocks 0 and 1
    assert m0[C + 4, C:].all() and not m0[C + 4, :L].any()
    # padding keys are masked for every query except themselves (keeps softmax finite)
    m1 = m[1, 0]
    pad_keys = [N + 6, N + 7, C + 6, C + 7]
    for q in range(2 * L):
        allowed = set(m1[q].nonzero().flatten().tolist())
        assert allowed & set(pad_keys) <= {q}
    assert m1[C + 4, C + 5] and m1[N + 4, N + 5] and m1[N + 5, C + 3]
    assert m1[N + 6].nonzero().flatten().tolist() == [N + 4, N + 5, N + 6, C + 0, C + 1, C + 2, C + 3]
    # otherwise row 1 equals row 0 on real keys
    real = [N + j for j in range(6)] + [C + j for j in range(6)]
    assert torch.equal(m1[:, real][real], m0[:, real][real])
    # single-stream block-causal mask equals the clean-clean quadrant
    assert torch.equal(block_causal_mask(valid, bs)[:, 0], m[:, 0, L:, L:])


def test_sample_noise_and_shift():
    g = torch.Generator().manual_seed(0)
    resp = torch.zeros(3, 96, dtype=torch.bool)
    resp[:, 10:90] = True
    a, b = sample_noise(resp, g, 32)
    assert not (a & b).any() and torch.equal(a | b, resp)
    assert not a[:, :10].any() and not b[:, 90:].any()
    # one rate per block: masking rates differ across blocks
    rates = torch.stack([a[:, 32 * k : 32 * k + 32].float().mean(1) for k in (1, 2)])
    assert rates.std() > 0
    src = shift_source(64, 32)
    assert src[1] == 0 and src[31] == 30  # inside block 0: noisy stream, position i-1
    assert src[32] == 64 + 31  # first token of block 1: clean stream, position 31
    assert src[33] == 32 and src[63] == 62
    assert src[0] == 0


def _tiny(tok, seed=0):
    m = new_model("tiny", tok, seed)
    # make the random model's attention matter (otherwise the residual dominates)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "layers" in n and p.ndim == 2:
                p.mul_(6)
    return m.eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_transformers_uses_custom_4d_mask(tok, impl):
    m = _tiny(tok)
    m.config._attn_implementation = impl
    torch.manual_seed(0)
    L, bs = 12, 4
    ids = torch.randint(4, len(tok), (2, L))
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, 9:] = False
    noisy = ids.clone()
    noisy[:, [5, 6, 10]] = 3
    x = torch.cat([noisy, ids], 1)
    pos = torch.arange(L).repeat(2)[None].expand(2, -1)
    with torch.no_grad():
        out = m(
            input_ids=x, position_ids=pos, attention_mask=to_attention_mask(dual_stream_mask(valid, bs), impl)
        ).logits
        # reference: clean stream alone under the block-causal mask
        ref = m(input_ids=ids, attention_mask=to_attention_mask(block_causal_mask(valid, bs), impl)).logits
        plain = m(input_ids=ids).logits
        # reference for noisy block 1: single stream [clean block 0 ; noisy block 1]
        s = torch.cat([ids[:, :4], noisy[:, 4:8]], 1)
        ref_noisy = m(input_ids=s, attention_mask=to_attention_mask(block_causal_mask(valid[:, :8], bs), impl)).logits
    assert torch.allclose(out[0, L:], ref[0], atol=1e-5)
    assert torch.allclose(out[1, L : L + 9], ref[1, :9], atol=1e-5)  # real tokens of the padded row
    assert torch.allclose(out[:, 4:8], ref_noisy[:, 4:8], atol=1e-5)
    assert not torch.allclose(out[0, L:], plain[0], atol=1e-3)  # the mask is really applied


def test_dllm_loss_matches_manual(tok, rows):
    m = _tiny(tok)
    exs = [
        Example(tuple(encode_prompt(tok, r["question"])), tuple(encode_response(tok, r["answer"]))) for r in rows[:3]
    ]
    batch = collate(exs, tok.pad_token_id, 32)
    g = torch.Generator().manual_seed(3)
    inp = make_dllm_inputs(batch, tok.mask_token_id, g, 32)
    B, L = batch["input_ids"].shape
    assert inp["input_ids"].shape == (2 * B, 2 * L) and inp["mask"].shape == (2 * B, 1, 2 * L, 2 * L)
    assert torch.equal(inp["position_ids"][0], torch.cat([torch.arange(L), torch.arange(L)]))
    # copies are complementary over the response; the clean half is the clean sequence
    assert torch.equal(inp["masked"][:B] | inp["masked"][B:], batch["response"])
    assert torch.equal(inp["input_ids"][:B, L:], batch["input_ids"])
    noisy = inp["input_ids"][:, :L]
    assert torch.equal(noisy == tok.mask_token_id, inp["masked"])
    with torch.no_grad():
        loss, n = dllm_loss_from_inputs(m, inp, 32)
        logits = m(input_ids=inp["input_ids"], position_ids=inp["position_ids"], attention_mask=inp["mask"]).logits
    manual, cnt = 0.0, 0
    for r in range(2 * B):
        for i in inp["masked"][r].nonzero().flatten().tolist():
            src = i - 1 if i % 32 else L + i - 1
            manual += torch.nn.functional.cross_entropy(logits[r, src][None], inp["clean"][r, i][None]).item()
            cnt += 1
    assert n == cnt == int(batch["response"].sum())
    assert abs(loss.item() - manual / cnt) < 1e-4


# ---------------------------------------------------------------- training, saving, generation


def test_ar_loss_is_response_only(tok, rows):
    m = _tiny(tok)
    exs = [
        Example(tuple(encode_prompt(tok, r["question"])), tuple(encode_response(tok, r["answer"]))) for r in rows[:3]
    ]
    batch = collate(exs, tok.pad_token_id)
    with torch.no_grad():
        loss, n = ar_loss(m, batch)
        manual = []
        for e in exs:  # unpadded forward per example, loss on response tokens only
            logits = m(input_ids=torch.tensor([e.prompt_ids + e.response_ids])).logits[0]
            p = len(e.prompt_ids)
            manual.append(
                torch.nn.functional.cross_entropy(
                    logits[p - 1 : len(e) - 1], torch.tensor(e.response_ids), reduction="sum"
                )
            )
    assert n == sum(len(e.response_ids) for e in exs)
    assert abs(loss.item() - (sum(manual) / n).item()) < 1e-4


@pytest.mark.slow  # training
def test_tiny_training_saves_loadable_models(tok, rows, tmp_path):
    exs = [
        Example(tuple(encode_prompt(tok, r["question"])), tuple(encode_response(tok, r["answer"]))) for r in rows[:16]
    ]
    cfg = TrainConfig(epochs=8, batch_tokens=2048, lr=1e-2, warmup_steps=2, seed=0, log_every=1000)
    st = train_ar_model("tiny", exs, tok, cfg, tmp_path / "ar", vocab_size=len(tok))
    assert st["steps"] >= 8 and st["final_loss"] < st["first_loss"] - 0.5
    assert st["config"]["bf16"] is bf16_autocast_pays("cpu")  # the default: bf16 autocast only where it is native
    assert st["params"] == count_params(load_model(tmp_path / "ar"))
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "ar")
    t = AutoTokenizer.from_pretrained(tmp_path / "ar")
    assert m.config.tie_word_embeddings and t.mask_token_id == tok.mask_token_id
    assert m.model.embed_tokens.weight.data_ptr() == m.lm_head.weight.data_ptr()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ar" / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    dcfg = TrainConfig(epochs=1, max_steps=2, batch_tokens=256, lr=1e-3, warmup_steps=1, pad_to_multiple=32)
    st2 = train_dllm_model(tmp_path / "ar", exs, tok, dcfg, tmp_path / "dllm")
    assert st2["steps"] == 2
    d = load_model(tmp_path / "dllm")
    assert d.config.bd_block_size == 32 and d.config.mask_token_id == tok.mask_token_id
    assert type(d).__name__ == "Qwen2ForCausalLM"


def test_bf16_autocast_only_where_the_device_runs_it_natively(monkeypatch):
    from specpolicy.family import trainer

    assert trainer.uses_bf16(TrainConfig(bf16=True)) and not trainer.uses_bf16(TrainConfig(bf16=False))
    for avx512_bf16, amx in ((True, False), (False, True), (False, False)):  # a CPU: native bf16 arithmetic only
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert trainer.bf16_autocast_pays("cpu") is (avx512_bf16 or amx)
        assert trainer.uses_bf16(TrainConfig()) is (avx512_bf16 or amx)
        assert trainer.uses_bf16(TrainConfig(bf16=False)) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for major, native in ((7, False), (8, True), (9, True)):  # CUDA: Ampere on (a V100/T4 emulates it)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, m=major: (m, 0))
        assert trainer.bf16_autocast_pays("cuda:1") is native
    assert trainer.bf16_autocast_pays("meta") is False


def test_greedy_generate_batched_equals_single(tok, rows):
    m = _tiny(tok, seed=1)
    prompts = [encode_prompt(tok, r["question"]) for r in rows[:10]]
    ref = greedy_generate(m, prompts, -1, tok.pad_token_id, 12, batch_size=10)
    from collections import Counter

    eos = Counter(t for o in ref for t in o).most_common(1)[0][0]  # a frequent token, so rows stop early
    batched = greedy_generate(m, prompts, eos, tok.pad_token_id, 12, batch_size=10, compact_every=100)
    single = [greedy_generate(m, [p], eos, tok.pad_token_id, 12, batch_size=1)[0] for p in prompts]
    assert batched == single
    assert any(len(o) < 12 for o in batched) and all(o[-1] == eos or len(o) == 12 for o in batched)
    with torch.no_grad():  # and equal to naive full-recompute greedy decoding
        ids = torch.tensor([prompts[0]])
        for t in single[0]:
            nxt = int(m(input_ids=ids).logits[0, -1].argmax())
            assert nxt == t
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)


def test_eval_helpers():
    q = "Natalia sold 48 clips in April and half as many in May. How many in total?"
    good = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    assert answer_metrics(q, good, "...\n#### 72") == {
        "ends_with_answer": True,
        "uses_question_number": True,
        "correct": True,
    }
    bad = "She sold 5 clips.\n#### 1,000"
    assert answer_metrics(q, bad, "#### 72") == {
        "ends_with_answer": True,
        "uses_question_number": False,
        "correct": False,
    }
    assert not answer_metrics(q, "48 and more", None)["ends_with_answer"]
    match = [True, True, False, True, True, True, True, True, False, True]
    d, a, n = simulate_rounds(lambda c, k: match[c : c + k], len(match), 3)
    # rounds: c=0 [T,T,F] acc 2 -> c=3 [T,T,T] acc 3 -> c=7 [T,F,T] acc 1 -> c=9 [T] acc 1 -> c=11
    assert (d, a, n) == (10, 7, 4)


def test_what_is_not_bundled_goes_to_a_work_dir_outside_the_package(tmp_path):
    """distill/ and features/ (GBs) never land in the bundle: beside ``--out`` as ``<out>.work``,
    or ``./family-work`` when ``--out`` is inside the package (``specpolicy/family/bundle``)."""
    import specpolicy
    from specpolicy.family.pipeline import default_work_dir

    assert default_work_dir(tmp_path / "fam") == tmp_path / "fam.work"
    bundle = Path(specpolicy.__file__).parent / "family" / "bundle"
    assert default_work_dir(bundle) == Path("family-work")
    assert not default_work_dir(bundle).resolve().is_relative_to(Path(specpolicy.__file__).parent)


def test_saved_models_share_the_familys_tokenizer_through_a_link(tok, tmp_path):
    from specpolicy.family.models import save_model, share_tokenizer

    tok.save_pretrained(str(tmp_path / "tokenizer"))
    out = save_model(new_model("tiny", tok, seed=0), tok, tmp_path / "target")
    link = out / "tokenizer.json"
    assert link.is_symlink() and link.resolve() == (tmp_path / "tokenizer" / "tokenizer.json").resolve()
    loaded = AutoTokenizer.from_pretrained(out)  # still a complete Hugging Face directory
    assert loaded("48 clips")["input_ids"] == tok("48 clips")["input_ids"]
    assert share_tokenizer(out)  # idempotent
    # a model saved with another tokenizer keeps its own file
    other = tmp_path / "other"
    save_model(new_model("tiny", tok, seed=0), tok, other)
    assert (other / "tokenizer.json").is_symlink()
    (other / "tokenizer.json").unlink()
    (other / "tokenizer.json").write_text("{}")
    assert not share_tokenizer(other) and not (other / "tokenizer.json").is_symlink()


def test_the_bundled_models_tokenizers_are_the_shared_one():
    from specpolicy.models.loading import bundled_dir

    shared = (bundled_dir() / "tokenizer" / "tokenizer.json").read_bytes()
    for name in ("target", "ar-drafter", "dllm-drafter"):
        assert (bundled_dir() / name / "tokenizer.json").read_bytes() == shared


def test_the_bundled_family_stays_within_48_mb():
    """The limit for ``specpolicy/family`` (code, weights, tokenizer, n-grams, log; 40 MB until the
    Falcon drafter joined the bundle, issue 46): 48,000,000 bytes, a link counted as the link (``lstat``), caches left out."""
    from specpolicy.models.loading import bundled_dir

    family = bundled_dir().parent
    files = [p for p in family.rglob("*") if "__pycache__" not in p.parts and (p.is_symlink() or p.is_file())]
    assert sum(p.lstat().st_size for p in files) <= 48_000_000
