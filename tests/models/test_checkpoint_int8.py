"""int8 row-wise checkpoint storage (``save_checkpoint(..., int8=True)`` / ``load_weights``)."""

from __future__ import annotations

import torch

from specpolicy.models.checkpoint import INT8_SCALE, dequantize_int8, load_weights, quantize_int8, save_checkpoint


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "fc.weight": torch.randn(96, 128, generator=g),
        "norm.weight": torch.rand(128, generator=g) + 0.5,  # 1-D: kept as it is
        "small.weight": torch.randn(8, 8, generator=g),  # under min_numel: kept
        "d2t": torch.arange(32),  # integer: kept
    }


def test_round_trip_error_is_at_most_half_a_step_per_row():
    state = _state()
    packed = quantize_int8(state)
    assert packed["fc.weight"].dtype == torch.int8
    assert packed["fc.weight" + INT8_SCALE].shape == (96,)
    assert packed["norm.weight"] is state["norm.weight"] and packed["small.weight"] is state["small.weight"]
    back = dequantize_int8(packed)
    assert set(back) == set(state)
    step = state["fc.weight"].abs().amax(dim=1, keepdim=True) / 127
    err = (back["fc.weight"] - state["fc.weight"]).abs()
    assert bool((err <= step / 2 + 1e-7).all())
    assert err.max() > 0  # it is a real quantization, not a copy
    assert torch.equal(back["d2t"], state["d2t"])


def test_saved_int8_checkpoint_is_about_half_the_bfloat16_one_and_loads_back(tmp_path):
    state = {"a.weight": torch.randn(256, 512), "b.weight": torch.randn(512, 256)}
    save_checkpoint(tmp_path / "bf16", {"k": 1}, state)
    save_checkpoint(tmp_path / "int8", {"k": 1}, state, int8=True)
    bf16 = (tmp_path / "bf16" / "model.safetensors").stat().st_size
    int8 = (tmp_path / "int8" / "model.safetensors").stat().st_size
    assert int8 < 0.52 * bf16
    loaded = load_weights(tmp_path / "int8", "drafter.model")
    assert set(loaded) == set(state) and loaded["a.weight"].dtype == torch.float32
    rel = (loaded["a.weight"] - state["a.weight"]).norm() / state["a.weight"].norm()
    assert rel < 0.01


def test_a_state_without_int8_tensors_is_returned_unchanged():
    state = _state()
    assert dequantize_int8(state) is state
