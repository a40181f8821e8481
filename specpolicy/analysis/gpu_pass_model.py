"""Where the A6000 profiles' pass costs of DFlash and EAGLE-3 drafters come from (MODELED).

The FailFast paper's latency constants (official ``failfast.py``, ``args.latency["vLLM_A6000"]``,
vLLM on one RTX A6000, bf16) give one forward pass of four models: the 1.5B drafter 6.1 ms,
Qwen2.5-7B / 14B / 32B-Instruct 13.5 / 24.7 / 52.6 ms. A decoding pass is memory-bound: it reads
every weight once, plus a fixed cost per decoder layer (kernel launches). Fitting

    pass ms = LAYER_MS x decoder layers + GB_MS x GB of bf16 weights read

on the 1.5B drafter and the 7B target (both 28 layers) gives 0.144 ms per layer and 0.669 ms per
GB, which predicts the 14B (25.7 vs 24.7 ms) and 32B (52.0 vs 52.6 ms) within 4%. The drafters
that read the target are then costed with the weights one of their passes reads:

* EAGLE-3 (Li et al. 2025; SpecForge's Qwen2.5 heads): one decoder layer at the target's width
  whose q/k/v read 2H, ``fc`` (3H -> H), and an LM head over a 32k draft vocabulary;
* DFlash (Chen et al. 2026): five decoder layers at the target's width, ``fc`` (5H -> H, five
  target layers) -- the shape of z-lab's released Qwen3-8B drafter (``num_hidden_layers`` 5,
  ``target_layer_ids`` of five layers, block 16) -- and the target's LM head over the block
  (DFlash has none of its own: its pass reads the target's).

FailFast's neighbours are costed the same way, each with the shape its paper names:

* DART (arXiv 2601.19278; ``dart/model/llama3_dart.py``): EAGLE-3's head (one layer, q/k/v over
  2H, ``fc`` 3H -> H) and a 32k draft-vocabulary head; its d = 8 positions ride in one pass (a
  memory-bound pass reads the weights once), so a pass costs an EAGLE-3 pass. Its tree search runs
  on the host (paper: ~2 ms on an H20's host for 1.5 ms of forward) and is not in this figure;
* Falcon (arXiv 2412.12639; ``models/cnets.py``): a 2-layer LSTM (2H -> H, then H -> H), one
  decoder layer at the target's width and the target's LM head; the LSTM layers are counted as
  layers (their kernels launch like a layer's);
* DEER (arXiv 2512.15176): a 0.5B dLLM drafter, the shape of Qwen2.5-0.5B (24 layers, hidden 896);
  one pass fills the k-block;
* EasySpec (arXiv 2502.02493): the 1.5B drafter with its middle layers' attention run in groups of
  N = 4 on N devices at once (MLPs sequential): the critical path reads the first and last layers,
  every middle MLP, and one attention per group; a layer's fixed cost is split evenly between its
  attention and its MLP (an assumption), and cross-device communication is NOT modeled -- an
  upper bound of the multi-device gain, as the paper's setting (8 GPUs) is not this one.

Every figure here is MODELED, not measured; ``tests/analysis/test_gpu_pass_model.py`` checks that the
profiles in ``conf/profile/`` carry exactly these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The paper's A6000 latencies used for the fit (ms per forward pass).
DRAFTER_1_5B_MS = 6.1
TARGET_7B_MS = 13.5


@dataclass(frozen=True)
class Qwen25:
    """A Qwen2.5 decoder's shape (the Hugging Face configs of Qwen2.5-{1.5B,7B,14B,32B}-Instruct)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int = 152064
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self, attention_input: int | None = None) -> int:
        """Weights of one decoder layer (q/k/v reading ``attention_input``, default the width)."""
        d_in = attention_input or self.hidden
        kv = self.kv_heads * self.head_dim
        return d_in * self.hidden + 2 * d_in * kv + self.hidden * self.hidden + 3 * self.hidden * self.intermediate

    def params(self) -> int:
        """All weights read by a decoding pass (embedding rows aside: one row per token)."""
        return self.layers * self.layer_params() + self.vocab * self.hidden


QWEN25 = {
    "0.5b": Qwen25(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936, tied=True),
    "1.5b": Qwen25(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936, tied=True),
    "7b": Qwen25(layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4),
    "14b": Qwen25(layers=48, hidden=5120, intermediate=13824, heads=40, kv_heads=8),
    "32b": Qwen25(layers=64, hidden=5120, intermediate=27648, heads=40, kv_heads=8),
}


def _gb(params: int) -> float:
    return params * 2 / 1e9  # bf16


def fit() -> tuple[float, float]:
    """``(ms per layer, ms per GB)`` from the 1.5B drafter's and the 7B target's A6000 latencies."""
    small, big = QWEN25["1.5b"], QWEN25["7b"]
    gb_ms = (TARGET_7B_MS - DRAFTER_1_5B_MS) / (_gb(big.params()) - _gb(small.params()))
    layer_ms = (DRAFTER_1_5B_MS - gb_ms * _gb(small.params())) / small.layers
    return layer_ms, gb_ms


def pass_ms(layers: int, params: int) -> float:
    """Modeled A6000 ms of one memory-bound forward pass over ``layers`` decoder layers reading
    ``params`` bf16 weights."""
    layer_ms, gb_ms = fit()
    return layer_ms * layers + gb_ms * _gb(params)


def eagle3_pass_ms(target: str, draft_vocab: int = 32000) -> float:
    """One EAGLE-3 head pass for a Qwen2.5 target (``"7b"``, ``"14b"``, ``"32b"``), in ms (MODELED)."""
    t = QWEN25[target]
    params = t.layer_params(attention_input=2 * t.hidden) + 3 * t.hidden * t.hidden + draft_vocab * t.hidden
    return pass_ms(1, params)


def dflash_pass_ms(target: str, layers: int = 5, context_layers: int = 5) -> float:
    """One DFlash block pass for a Qwen2.5 target, in ms (MODELED): ``layers`` decoder layers at the
    target's width, ``fc`` over ``context_layers`` target layers, and the target's LM head."""
    t = QWEN25[target]
    params = layers * t.layer_params() + context_layers * t.hidden * t.hidden + t.vocab * t.hidden
    return pass_ms(layers, params)


def dart_pass_ms(target: str, draft_vocab: int = 32000) -> float:
    """One DART pass (d = 8 positions) for a Qwen2.5 target, in ms (MODELED): the weights of an
    EAGLE-3 head, read once; the host-side tree search is not included."""
    return eagle3_pass_ms(target, draft_vocab)


def falcon_pass_ms(target: str) -> float:
    """One Falcon pass (k = 2 tokens) for a Qwen2.5 target, in ms (MODELED): a 2-layer LSTM
    (2H -> H, H -> H: 4 gates each), one decoder layer at the target's width and the target's LM head."""
    t = QWEN25[target]
    h = t.hidden
    lstm = 4 * h * (2 * h + h) + 4 * h * (h + h)
    return pass_ms(3, lstm + t.layer_params() + t.vocab * h)


def deer_pass_ms() -> float:
    """One DEER pass (a 0.5B dLLM, the shape of Qwen2.5-0.5B), in ms (MODELED)."""
    d = QWEN25["0.5b"]
    return pass_ms(d.layers, d.params())


def easyspec_pass_ms(group: int = 4, drafter: str = "1.5b") -> float:
    """One EasySpec drafter step with the middle layers' attention in groups of ``group`` on as
    many devices, in ms (MODELED; communication not modeled): the critical path reads the first and
    last layers whole, every middle MLP, one attention sublayer per group."""
    d = QWEN25[drafter]
    middle = d.layers - 2
    groups = -(-middle // group)
    kv = d.kv_heads * d.head_dim
    attention = 2 * d.hidden * d.hidden + 2 * d.hidden * kv
    mlp = 3 * d.hidden * d.intermediate
    params = 2 * d.layer_params() + middle * mlp + groups * attention + d.vocab * d.hidden
    return pass_ms(2, params) + fit()[0] * 0.5 * (middle + groups)


def neighbour_pass_ms(target: str) -> dict[str, float]:
    """The MODELED pass cost of every drafter the A6000 profiles name, for a Qwen2.5 target (ms,
    rounded to 0.01 as the profiles carry them)."""
    return {
        "dflash": round(dflash_pass_ms(target), 2),
        "eagle3": round(eagle3_pass_ms(target), 2),
        "dart": round(dart_pass_ms(target), 2),
        "falcon": round(falcon_pass_ms(target), 2),
        "deer": round(deer_pass_ms(), 2),
        "easyspec": round(easyspec_pass_ms(), 2),
    }
