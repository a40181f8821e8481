"""Training of the drafters conditioned on the target computes what inference computes: the DFlash
training blocks (one-pass and extension) equal the drafter's passes on the same context, the EAGLE-3
training-time-test unroll equals the head's cached chain; the feature store returns the target's
hidden states; a short training run lowers the loss and writes an official-layout checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_lm
from specpolicy.family.data import Example
from specpolicy.family.feature_store import FeatureStore, extract_features
from specpolicy.family.train_dflash import block_layout, blocks_output, new_dflash
from specpolicy.family.train_eagle3 import new_eagle3, ttt_forward
from specpolicy.models.dflash import load_dflash
from specpolicy.models.eagle3 import load_eagle3

VOCAB = 64
MASK = 5


def _target():
    return tiny_lm(0, layers=4, vocab=VOCAB).double()


@pytest.mark.parametrize("given", [1, 6, 11])  # one-pass blocks, one and two extension passes' given tokens
def test_dflash_training_blocks_equal_inference_passes(given):
    target = _target()
    draft = new_dflash(target.config, MASK, 6, [0, 2], seed=1).double().eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(6, VOCAB - 1, (2, 30), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 25:] = False
    prompt_len = torch.tensor([4, 7])
    hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i + 1] for i in (0, 2)], dim=-1)  # DFlash ids 0, 2
    layout = block_layout(ids, valid, prompt_len, 6, 5, given, MASK, 0.0, g)
    embed = target.get_input_embeddings()
    span = given + 5
    with torch.no_grad():
        packed = blocks_output(draft, embed.weight, layout, feats)
        for r in range(2):
            n = int(valid[r].sum())
            for b in range(layout["tokens"].shape[1]):
                a = int(layout["positions"][r, b, 0])
                if not layout["context_mask"][r, b].any():  # an empty block (no anchor left)
                    assert (layout["labels"][r, b] == -100).all()
                    continue
                assert int(prompt_len[r]) - 1 <= a <= n - 1 - given
                own = draft.context_keys_values(feats[r : r + 1, :a], torch.arange(a)[None])
                block = torch.cat([ids[r, a : a + given], torch.full((5,), MASK)])
                assert torch.equal(layout["tokens"][r, b], block)
                alone = draft(embed(block)[None], torch.arange(a, a + span)[None], own)[0]
                torch.testing.assert_close(packed[r, b], alone)
                labels = layout["labels"][r, b, given:]
                want = torch.where(
                    torch.arange(a + given, a + span) < n, ids[r, (a + given + torch.arange(5)).clamp(max=29)], -100
                )
                assert torch.equal(labels, want)


def test_eagle3_training_time_test_equals_the_cached_chain():
    target = _target()
    head = new_eagle3(target.config, torch.arange(VOCAB), seed=2).double().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB - 1, (1, 20), generator=g)
    hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    layers = head.spec.feature_layers(4)
    feats = torch.cat([hs[i] for i in layers], dim=-1)
    embed = target.get_input_embeddings().weight
    steps = 4
    with torch.no_grad():
        outs = ttt_forward(head, embed, ids, feats, steps)
        for i in (0, 5, 12):  # committed through x_{i+1}: pairs 0..i real, then the chain of true tokens
            out, k, v = head(
                F.embedding(ids[:, 1 : i + 2], embed), head.fc(feats[:, : i + 1]), torch.arange(i + 1)[None], None
            )
            torch.testing.assert_close(out[0, -1], outs[0][0, i])
            last = out[:, -1:]
            for j in range(1, steps):
                if i + j + 1 >= ids.shape[1]:
                    break
                last, k, v = head(
                    F.embedding(ids[:, i + j + 1 : i + j + 2], embed), last, torch.tensor([[i + j]]), (k, v)
                )
                torch.testing.assert_close(last[0, -1], outs[j][0, i])


def test_feature_store_returns_the_targets_hidden_states(tmp_path):
    target = _target()
    path = tmp_path / "target"
    target.float().save_pretrained(path)
    g = torch.Generator().manual_seed(2)
    examples = [
        Example(
            tuple(torch.randint(0, 60, (n,), generator=g).tolist()),
            tuple(torch.randint(0, 60, (m,), generator=g).tolist()),
        )
        for n, m in ((3, 9), (5, 2), (4, 20))
    ]
    stats = extract_features(path, examples, [1, 3], tmp_path / "store", batch_tokens=40, log_every=0)
    assert stats["tokens"] == sum(len(e) for e in examples)
    store = FeatureStore(tmp_path / "store")
    model = target.float()
    batch = store.batch([2, 0], [3, 1], 30)
    for row, e in enumerate((examples[2], examples[0])):
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        want = torch.cat([hs[3][0], hs[1][0]], -1).to(torch.bfloat16).float()
        torch.testing.assert_close(batch[row, : len(e)], want)
        assert not batch[row, len(e) :].any()
    view = store.select([2])
    torch.testing.assert_close(view.batch([0], [1], 24), store.batch([2], [1], 24))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_a_short_training_run_lowers_the_loss_and_saves_the_official_layout(tmp_path, kind):
    from specpolicy.family.train_dflash import train_dflash
    from specpolicy.family.train_eagle3 import train_eagle3
    from specpolicy.family.trainer import TrainConfig

    target = tiny_lm(0, layers=4, vocab=VOCAB).float()
    path = tmp_path / "target"
    target.save_pretrained(path)
    # a learnable language: a prompt, then the count continues from its last token
    g = torch.Generator().manual_seed(3)
    examples = []
    for _ in range(40):
        start = int(torch.randint(6, 30, (1,), generator=g))
        examples.append(Example(tuple(range(start - 3, start)), tuple(range(start, start + 20))))
    extract_features(path, examples, [1, 2, 3, 4], tmp_path / "store", log_every=0)
    store = FeatureStore(tmp_path / "store")
    cfg = TrainConfig(epochs=20, batch_tokens=256, lr=1e-2, warmup_steps=5, log_every=5, bf16=False)
    small = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)
    if kind == "dflash":
        stats = train_dflash(
            path,
            examples,
            store,
            cfg,
            tmp_path / "out",
            0,
            MASK,
            block_size=6,
            target_layer_ids=(0, 2),
            anchors=4,
            size={**small, "num_hidden_layers": 1},
            train_indices=list(range(36)),
            heldout_indices=list(range(36, 40)),
            val_every=10,
            checkpoint_every=15,
        )
        model = load_dflash(tmp_path / "out")
        saved = json.loads((tmp_path / "out.checkpoint" / "config.json").read_text())
        assert 15 <= saved["train_step"] <= stats["steps"]  # the last save, at a progress line
        load_dflash(tmp_path / "out.checkpoint")
        config = json.loads((tmp_path / "out" / "config.json").read_text())
        assert config["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": MASK, "block_size": 6}
        assert model.spec.block_size == 6
    else:
        stats = train_eagle3(
            path,
            examples,
            store,
            cfg,
            tmp_path / "out",
            0,
            draft_vocab_size=40,
            steps=3,
            size=small,
            train_indices=list(range(36)),
            heldout_indices=list(range(36, 40)),
            val_every=10,
        )
        model = load_eagle3(tmp_path / "out")
        assert model.spec.draft_vocab_size == 40
        assert 0.9 < stats["draft_vocab_coverage"] < 1.0  # 44 distinct response tokens, 40 in the draft vocabulary
    curve = stats["validation_curve"]
    assert curve[0]["step"] == 0 and curve[-1]["step"] == stats["steps"]
    accuracy = "accuracy_by_distance" if kind == "dflash" else "accuracy_by_step"
    assert curve[-1][accuracy][0] > curve[0][accuracy][0] + 0.3  # held out: it learnt to count
    assert stats["final_loss"] < stats["first_loss"]
    names = set(
        __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "out" / "model.safetensors"))
    )
    assert not any(n.startswith("embed_tokens") for n in names)  # the target's embeddings, not stored again
    if kind == "dflash":
        assert not any(n.startswith("lm_head") for n in names)  # ... nor its LM head
    else:
        assert {"lm_head.weight", "d2t"} <= names  # EAGLE-3's own head over the draft vocabulary


def test_dflash_validation_counts_blocks_by_their_correct_prefix(tmp_path):
    """``validation_loss``'s ``prefix_share_ge`` (the in-loop bar's measure, teacher-forced) equals a
    block-by-block count: the longest run of right tokens from the block's first mask, over the
    blocks whose masks all lie inside their sequence."""
    from specpolicy.family.data import collate
    from specpolicy.family.train_dflash import validation_loss

    target = _target().float()
    path = tmp_path / "target"
    target.save_pretrained(path)
    g = torch.Generator().manual_seed(4)
    # responses of tokens 6 and 7 only, and a head whose argmax is always 6 or 7 (row 7 = -row 6): about
    # half the drafted tokens are right, so every threshold counts some blocks
    examples = [
        Example(
            tuple(torch.randint(6, 60, (4,), generator=g).tolist()),
            tuple(torch.randint(6, 8, (m,), generator=g).tolist()),
        )
        for m in (9, 30, 3, 22, 14)
    ]
    extract_features(path, examples, [1, 3], tmp_path / "store", log_every=0)
    store = FeatureStore(tmp_path / "store")
    draft = new_dflash(target.config, MASK, 4, [0, 2], seed=5).eval()
    embed = target.get_input_embeddings().weight.detach()
    head = torch.zeros_like(embed)
    head[6] = torch.randn(embed.shape[1], generator=g)
    head[7] = -head[6]
    got = validation_loss(draft, embed, head, examples, list(range(5)), store, seed=7, prefix_thresholds=(1, 2, 3))
    gen = torch.Generator().manual_seed(7)
    batch = collate(examples, 0)
    layout = block_layout(batch["input_ids"], batch["valid"], batch["prompt_len"], 4, 16, 1, MASK, 0.0, gen)
    with torch.no_grad():
        out = blocks_output(draft, embed, layout, store.batch(list(range(5)), [1, 3], batch["input_ids"].shape[1]))
        predicted = (out @ head.T).argmax(-1)
    lengths = []
    for r in range(5):
        for b in range(layout["labels"].shape[1]):
            labels = layout["labels"][r, b, 1:].tolist()
            if -100 in labels:
                continue
            run = 0
            while run < 3 and int(predicted[r, b, 1 + run]) == labels[run]:
                run += 1
            lengths.append(run)
    assert got["n_blocks"] == len(lengths) > 20
    for t in (1, 2, 3):
        assert got["prefix_share_ge"][str(t)] == round(sum(x >= t for x in lengths) / len(lengths), 4)
    assert 1 > got["prefix_share_ge"]["1"] > got["prefix_share_ge"]["2"] > got["prefix_share_ge"]["3"] > 0


def test_a_dflash_drafter_stored_as_int8_loads_its_quantised_weights_and_keeps_the_form(tmp_path):
    """``save_dflash(int8=True)`` stores the large 2-D weights as row-wise int8 that ``load_dflash``
    dequantises (each weight within half a step of its row's scale); giving the checkpoint a draft
    vocabulary rewrites it as int8 again, with the same weights; a bf16 checkpoint stays bf16."""
    from specpolicy.family.train_dflash import add_draft_vocabulary
    from specpolicy.models.checkpoint import stored_int8
    from specpolicy.models.dflash import save_dflash

    # every (64, 64) projection has 4096 weights, the smallest that int8 storage takes
    small = dict(num_attention_heads=2, num_key_value_heads=2, head_dim=32, intermediate_size=64, num_hidden_layers=3)
    target = tiny_lm(0, layers=4, vocab=VOCAB, hidden=64)
    draft = new_dflash(target.config, MASK, 6, [0, 2], seed=4, size=small)
    save_dflash(draft, tmp_path / "int8", int8=True)
    save_dflash(draft, tmp_path / "bf16")
    assert stored_int8(tmp_path / "int8") and not stored_int8(tmp_path / "bf16")
    assert not stored_int8(tmp_path / "missing")
    loaded = load_dflash(tmp_path / "int8")
    assert loaded.config.num_hidden_layers == 3
    reference = {k: v.float() for k, v in draft.state_dict().items() if "rotary_emb" not in k}
    quantised = 0
    for name, value in loaded.state_dict().items():
        if name not in reference:
            continue
        w = reference[name]
        if w.dim() == 2 and w.numel() >= 4096:  # stored int8: within half a step of the row's scale
            step = w.abs().amax(dim=1, keepdim=True) / 127
            assert ((value.float() - w).abs() <= step / 2 + 1e-6).all(), name
            quantised += 1
    assert quantised >= 3 * 7  # q, k, v, o, gate, up, down of every layer
    examples = [Example((1, 2), tuple(range(6, 30))) for _ in range(3)]
    add_draft_vocabulary(tmp_path / "int8", examples, 20)
    add_draft_vocabulary(tmp_path / "bf16", examples, 20)
    assert stored_int8(tmp_path / "int8") and not stored_int8(tmp_path / "bf16")
    again = load_dflash(tmp_path / "int8")
    assert again.spec.draft_vocab_size == 20
    for name, value in again.state_dict().items():
        if name in reference and reference[name].dim() == 2 and reference[name].numel() >= 4096:
            assert torch.equal(value, loaded.state_dict()[name]), name  # re-quantising is exact
