"""The Falcon head (``specpolicy.models.falcon``): the relaxed causal mask (a worked example and what
it lets each position see), the LSTM running along the sequence (the paper; the released file's
LSTM is not batch_first), the checkpoint layout of the released code and its round trip, and
one-line errors for a checkpoint that does not fit the target."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import VOCAB, tiny_lm
from specpolicy.core.errors import ConfigError
from specpolicy.family.train_falcon import new_falcon
from specpolicy.models.checkpoint import load_weights, save_checkpoint
from specpolicy.models.falcon import FalconSpec, check_fits_target, load_falcon, relaxed_mask, save_falcon

SIZE = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, layers=2)


def _head(target, seed=1, size=SIZE):
    return new_falcon(target.config, seed, size=size).double().eval()


def test_relaxed_mask_worked_example():
    # 5 new positions in blocks of 2 after 1 cached one: {0, 1}, {2, 3}, {4}
    want = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(relaxed_mask(5, 2, past=1), want)
    assert torch.equal(relaxed_mask(3, 1), torch.ones(3, 3).tril().bool())  # k = 1: causal


@torch.no_grad()
def test_each_position_sees_its_whole_block_and_nothing_later(target):
    head = _head(target)
    g = torch.Generator().manual_seed(0)
    embeds, hidden = (
        torch.randn(1, 6, 32, generator=g, dtype=torch.float64),
        torch.randn(1, 6, 32, generator=g).double(),
    )
    positions = torch.arange(6)[None]
    out, _, _ = head(embeds, hidden, positions)
    for j in range(6):  # change position j's input: positions before j's block are untouched
        e2 = embeds.clone()
        e2[0, j] += 1.0
        out2, _, _ = head(e2, hidden, positions)
        changed = (out2 - out).abs().amax(-1)[0] > 1e-12
        block_start = j - j % 2
        assert not changed[:block_start].any() and changed[block_start:].all(), (j, changed)


@torch.no_grad()
def test_the_lstm_runs_along_the_sequence_and_its_state_carries(target):
    head = _head(target)
    g = torch.Generator().manual_seed(1)
    embeds, hidden = torch.randn(1, 5, 32, generator=g).double(), torch.randn(1, 5, 32, generator=g).double()
    x, state = head.encode(embeds, hidden)
    e2 = embeds.clone()
    e2[0, 0] += 1.0
    assert (head.encode(e2, hidden)[0][0, 1:] - x[0, 1:]).abs().amax() > 1e-6  # later positions feel position 0
    x1, s1 = head.encode(embeds[:, :3], hidden[:, :3])
    x2, s2 = head.encode(embeds[:, 3:], hidden[:, 3:], s1)  # carried state = one run
    torch.testing.assert_close(torch.cat([x1, x2], 1), x)
    torch.testing.assert_close(s2[0], state[0])


def test_checkpoint_layout_and_round_trip(target, tmp_path):
    head = _head(target)
    path = save_falcon(head, tmp_path / "falcon")
    state = load_weights(path, "k")
    for layer in (0, 1):
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            assert f"lstm.{kind}_l{layer}" in state
    assert state["lstm.weight_ih_l0"].shape == (4 * 32, 2 * 32)  # 2H -> H
    assert "layers.0.self_attn.q_proj.weight" in state and "layers.0.mlp.gate_proj.weight" in state
    assert "layers.0.input_layernorm.weight" not in state  # layer 0 reads the LSTM directly, as released
    assert not any(k.startswith(("embed_tokens", "lm_head", "norm")) for k in state)  # the target's
    config = json.loads((path / "config.json").read_text())
    assert config["k_mask"] == 2 and config["hidden_size"] == 32
    loaded = load_falcon(path).double()
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(b, a.to(torch.bfloat16).double(), msg=name)
    # a released-style file with the embeddings loads (they are ignored)
    save_checkpoint(tmp_path / "with_embed", config, {**state, "embed_tokens.weight": torch.zeros(VOCAB, 32)})
    load_falcon(tmp_path / "with_embed")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 48}, "hidden_size 32 does not match the target's 48"),
        ({"vocab_size": 100}, "vocab_size 64 does not match the target's 100"),
    ],
)
def test_a_checkpoint_that_does_not_fit_the_target_is_one_line(target, tmp_path, change, message):
    config = json.loads((save_falcon(_head(target), tmp_path / "f") / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        check_fits_target(config, {"hidden_size": 32, "vocab_size": VOCAB, **change}, "drafter.model='x'")
    assert message in str(err.value) and "drafter.model='x'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"vocab_size": 64}, "config.json has no hidden_size"),
        ({"hidden_size": 32, "vocab_size": 64, "k_mask": 0}, "k_mask must be an integer >= 1, got 0"),
    ],
)
def test_a_malformed_checkpoint_is_one_line(config, message):
    with pytest.raises(ConfigError) as err:
        FalconSpec.from_config(config, "drafter.model='x'")
    assert message in str(err.value) and "\n" not in str(err.value)
