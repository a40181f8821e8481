"""The DART head (``specpolicy.models.dart``) and its training (``specpolicy.family.train_dart``): the
official checkpoint layout round-trips through ``save_checkpoint`` / ``load_weights``; the one pass
equals a plain re-statement of the layer (masks from ``mask_rep``, causal); prefix-shared masked
training gives every prefix exactly what the drafter's pass over that prefix gives; the loss is
the gamma-weighted KL; bad checkpoints are one line each."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specpolicy.core.errors import ConfigError
from specpolicy.drafters.dart import check_fits_target
from specpolicy.family.train_dart import DartTrainee, dart_loss, new_dart, prefix_shared_forward
from specpolicy.models.dart import ARCHITECTURE, DartSpec, load_dart, save_dart

H, V = 32, 50
SIZE = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48)
CFG = SimpleNamespace(
    hidden_size=H, vocab_size=V, rms_norm_eps=1e-6, max_position_embeddings=256, rope_parameters={"rope_theta": 1e4}
)
TARGET = {"num_hidden_layers": 6, "hidden_size": H, "vocab_size": V}


def _head(seed: int = 0):
    return new_dart(CFG, torch.arange(0, V, 2), seed, SIZE).double().eval()


def test_checkpoint_layout_round_trips(tmp_path):
    head = _head()
    save_dart(head, tmp_path / "dart", 6)
    config = json.loads((tmp_path / "dart" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["draft_length"] == 7
    assert config["draft_vocab_size"] == 25 and "eagle_config" not in config  # default layers not written
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "dart" / "model.safetensors")))
    assert {
        "fc.weight",
        "midlayer.mask_rep",
        "midlayer.self_attn.q_proj.weight",
        "d2t",
        "t2d",
        "lm_head.weight",
    } <= keys
    loaded = load_dart(tmp_path / "dart")
    assert loaded.block_size == 8 and loaded.spec.feature_layers(6) == (2, 3, 3)
    assert torch.equal(loaded.to_target_ids(torch.arange(4)), torch.tensor([0, 2, 4, 6]))
    for name, value in head.state_dict().items():
        if "rotary" not in name:  # bfloat16 on disk
            torch.testing.assert_close(loaded.state_dict()[name].double(), value.to(torch.bfloat16).double())


def _plain_pass(head, embeds, hidden):
    """The layer re-stated: pairs then 7 masks (attention input mask_rep, residual its first H), causal."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    n, D = embeds.shape[0], head.spec.draft_length
    x = torch.cat([layer.attention_input(embeds[None], hidden[None])[0], layer.mask_rep.expand(D, -1)])
    residual = torch.cat([hidden, layer.mask_rep[:H].expand(D, -1)])
    pos = torch.arange(n + D)
    cos, sin = head.rotary_emb(x[None], pos[None])
    q, k, v = attn.qkv(x[None], cos, sin)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / 8**0.5
    scores = scores.masked_fill(~torch.ones(n + D, n + D, dtype=torch.bool).tril(), float("-inf"))
    out = layer.finish(residual[None], scores.softmax(-1) @ v)[0]
    return out[n - 1 :]


def test_one_pass_is_the_layer_with_masks_and_the_cache_split_changes_nothing():
    head = _head(1)
    g = torch.Generator().manual_seed(0)
    embeds, hidden = (
        torch.randn(9, H, generator=g, dtype=torch.double),
        torch.randn(9, H, generator=g, dtype=torch.double),
    )
    want = _plain_pass(head, embeds, hidden)
    out, k, v = head(embeds[None], hidden[None], 0, None)
    torch.testing.assert_close(out[0], want)
    assert k.shape[2] == 9 + 7  # the masks' keys come back; the drafter keeps the first 9
    _, k5, v5 = head(embeds[None, :5], hidden[None, :5], 0, None)
    out2, _, _ = head(embeds[None, 5:], hidden[None, 5:], 5, (k5[:, :, :5], v5[:, :, :5]))
    torch.testing.assert_close(out2[0], want)


def test_prefix_shared_training_gives_each_prefix_its_own_pass():
    head = _head(2)
    g = torch.Generator().manual_seed(1)
    embed = torch.randn(V, H, generator=g, dtype=torch.double)
    ids = torch.randint(0, V, (2, 12), generator=g)
    feats = torch.randn(2, 12, 3 * H, generator=g, dtype=torch.double)
    out = prefix_shared_forward(head, embed, ids, feats)  # (2, 11, 8, H)
    assert out.shape == (2, 11, 8, H)
    for r in range(2):
        for i in range(11):
            one, _, _ = head(embed[ids[r : r + 1, 1 : i + 2]], head.fc(feats[r : r + 1, : i + 1]), 0, None)
            torch.testing.assert_close(out[r, i], one[0])


def test_the_loss_is_the_gamma_weighted_kl():
    head = _head(3).float()
    g = torch.Generator().manual_seed(2)
    embed = torch.randn(V, H, generator=g)
    target_head = torch.randn(25, H, generator=g)
    ids = torch.randint(0, V, (1, 14), generator=g)
    feats, last = torch.randn(1, 14, 3 * H, generator=g), torch.randn(1, 14, H, generator=g)
    feats, last = feats.bfloat16().float(), last.bfloat16().float()  # bf16, as the feature store holds them

    class Store:
        def batch(self, idx, layers, L, dtype=torch.float32):  # FeatureStore.batch
            return (feats if len(layers) == 3 else last).to(dtype)

    batch = {
        "input_ids": ids,
        "valid": torch.ones(1, 14, dtype=torch.bool),
        "prompt_len": torch.tensor([4]),
        "index": torch.tensor([0]),
    }
    trainee = DartTrainee(head, embed, target_head)
    loss, count = dart_loss(Store(), [2, 3, 3], 6, 0.6)(trainee, batch, None)
    out = prefix_shared_forward(head, embed, ids, feats)
    want = 0.0
    for t in range(8):  # step t + 1: pair i's block position t predicts token i + t + 2
        kls = []
        for i in range(2, 12 - t):  # i >= prompt_len - 2, i + t + 2 < 14
            q = torch.log_softmax(last[0, i + t + 1] @ target_head.T, -1)
            p = torch.log_softmax(head.logits(out[0, i, t]), -1)
            kls.append((q.exp() * (q - p)).sum())
        want += 0.6**t * torch.stack(kls).mean()
    torch.testing.assert_close(loss, want)
    assert count == sum(10 - t for t in range(8))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 48}, "target_hidden_size 32 does not match the target's hidden size 48"),
        ({"vocab_size": 20}, "do not fit the target's vocabulary of 20"),
        ({"num_hidden_layers": 2}, r"must be three layers of the target's 2 \(0..2\)"),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_target_is_one_line(tmp_path, change, message):
    save_dart(_head(), tmp_path / "d", 6)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    if change.get("num_hidden_layers"):
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 3, 5]}
    with pytest.raises(ConfigError, match=message) as info:
        check_fits_target(config, {**TARGET, **change}, "drafter.model='d'")
    assert "\n" not in str(info.value) and str(info.value).startswith("drafter.model='d': ")


def test_bad_config_fields_are_one_line():
    with pytest.raises(ConfigError, match=r"draft_length must be >= 1"):
        DartSpec.from_config({"hidden_size": H, "vocab_size": V, "draft_length": 0}, "drafter.model")
    with pytest.raises(ConfigError, match=r"num_hidden_layers 1, got 2"):
        DartSpec.from_config({"hidden_size": H, "vocab_size": V, "num_hidden_layers": 2}, "drafter.model")
