"""Published model shapes for the real-scale profile and replay (``benchmarks/real_scale.py``).

The ``config.json`` fields of the targets and drafter bases that issue 48 names, copied from the
published files on the Hugging Face hub (the fields a decoder's shape and RoPE depend on; the four
of ``tests/models/families/*.json`` are the same files' fields):

* targets: ``Qwen/Qwen2.5-7B-Instruct``, ``Qwen/Qwen3-8B``, ``meta-llama/Llama-3.1-8B-Instruct``,
  ``Qwen/Qwen2.5-32B-Instruct``;
* drafter bases: ``Qwen/Qwen2.5-1.5B-Instruct`` (Fast-dLLM v2 1.5B, FailFast's drafter, is
  Qwen2.5-1.5B's shape) and ``Qwen/Qwen2.5-0.5B-Instruct`` (DEER's 0.5B dLLM).

``drafter_shapes`` gives each drafter's pass as a shape, as ``specpolicy.analysis.gpu_pass_model``
costs it: EAGLE-3 (one decoder layer at the target's width, ``fc`` 3H -> H, a 32k draft vocabulary
head: SpecForge's Qwen2.5 / Llama-3.1 heads), DART (EAGLE-3's head, d = 8 positions a pass; arXiv
2601.19278), DFlash (five decoder layers at the target's width, ``fc`` 5H -> H, the target's LM
head: z-lab's Qwen3-8B drafter), Falcon (a 2-layer LSTM 2H -> H, H -> H, one decoder layer and the
target's LM head; arXiv 2412.12639 ``models/cnets.py``), Fast-dLLM v2 1.5B and DEER 0.5B (whole
causal LMs). Pure data: no torch here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

_QWEN2 = {
    "model_type": "qwen2",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "initializer_range": 0.02,
}

#: ``config.json`` fields of the published targets (shape and RoPE), by short name.
TARGETS: dict[str, dict[str, Any]] = {
    "qwen2.5-7b": {
        **_QWEN2,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "qwen3-8b": {
        "model_type": "qwen3",
        "hidden_act": "silu",
        "attention_bias": False,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "vocab_size": 151936,
    },
    "llama-3.1-8b": {
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "vocab_size": 128256,
    },
    "qwen2.5-32b": {
        **_QWEN2,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
}

#: ``config.json`` fields of the drafters' base models, by short name.
BASES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": {
        **_QWEN2,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
    "qwen2.5-0.5b": {
        **_QWEN2,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
}

#: EAGLE-3 / DART draft vocabulary (SpecForge's heads: 32,000 target ids).
DRAFT_VOCAB = 32000
#: The drafters profiled, by the ``drafter=`` name whose passes they cost.
DRAFTERS = ("fastdllm", "dflash", "eagle3", "dart", "falcon", "deer")
#: Tiny cut for the CPU checks (``--tiny``): layers, width, vocabulary, heads, KV heads.
TINY = {"layers": 2, "hidden": 64, "vocab": 512, "heads": 4, "kv_heads": 1}


@dataclass(frozen=True)
class DrafterShape:
    """One drafter's pass as shapes: a causal LM ``config`` (``model_type``, width, layers, vocab)
    whose decoder layers and LM head the pass reads, plus ``fc_in`` (the fused features' width,
    in multiples of the target's hidden size H: ``fc`` fc_in x H -> H; 0: none) and ``lstm``
    (Falcon's 2-layer LSTM 2H -> H, H -> H before the layer)."""

    name: str
    config: dict[str, Any]
    fc_in: int = 0
    lstm: bool = False
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


def cut_tiny(config: dict[str, Any], layers: int | None = None) -> dict[str, Any]:
    """``config`` cut to ``TINY``'s shape (``layers`` decoder layers, default ``TINY["layers"]``),
    its family's RoPE and norms kept; for the CPU dry run and the tests."""
    out = copy.deepcopy(config)
    out.update(
        num_hidden_layers=int(layers or TINY["layers"]),
        hidden_size=TINY["hidden"],
        intermediate_size=2 * TINY["hidden"],
        vocab_size=TINY["vocab"],
        num_attention_heads=TINY["heads"],
        num_key_value_heads=TINY["kv_heads"],
        head_dim=TINY["hidden"] // TINY["heads"],
        max_position_embeddings=16384,
    )
    return out


def target_config(name: str, tiny: bool = False) -> dict[str, Any]:
    """Target ``name``'s ``config.json`` fields (``TARGETS``), cut by ``cut_tiny`` when ``tiny``.

    Raises:
        KeyError: naming the known targets, for an unknown ``name``.
    """
    if name not in TARGETS:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    config = copy.deepcopy(TARGETS[name])
    return cut_tiny(config) if tiny else config


def drafter_shapes(target: str, tiny: bool = False) -> dict[str, DrafterShape]:
    """The drafter passes profiled beside target ``target`` (see the module docstring), by drafter
    name (``DRAFTERS``); ``tiny``: every config cut by ``cut_tiny`` (DFlash keeping 5 layers' worth
    as 2, the others 1-2 layers).

    Raises:
        KeyError: for an unknown target.
    """
    t = target_config(target)

    def at_width(layers: int, vocab: int) -> dict[str, Any]:
        config = copy.deepcopy(t)
        config.update(num_hidden_layers=layers, vocab_size=vocab, tie_word_embeddings=False)
        return cut_tiny(config, layers=min(layers, TINY["layers"])) if tiny else config

    def base(name: str) -> dict[str, Any]:
        config = copy.deepcopy(BASES[name])
        return cut_tiny(config) if tiny else config

    draft_vocab = TINY["vocab"] if tiny else DRAFT_VOCAB
    return {
        "fastdllm": DrafterShape(
            "fastdllm", base("qwen2.5-1.5b"), source="Fast-dLLM v2 1.5B (arXiv 2509.26328): Qwen2.5-1.5B's shape"
        ),
        "dflash": DrafterShape(
            "dflash",
            at_width(5, int(t["vocab_size"])),
            fc_in=5,
            source="DFlash (arXiv 2602.06036; z-lab's Qwen3-8B drafter): 5 layers, fc 5H -> H, the target's LM head",
        ),
        "eagle3": DrafterShape(
            "eagle3",
            at_width(1, draft_vocab),
            fc_in=3,
            source="EAGLE-3 (arXiv 2503.01840; SpecForge): 1 layer, fc 3H -> H, 32k draft vocabulary",
            notes=("q/k/v read H here, 2H in the real head: the proxy reads 2 x (H x H + 2 x H x kv) fewer weights",),
        ),
        "dart": DrafterShape(
            "dart",
            at_width(1, draft_vocab),
            fc_in=3,
            source="DART (arXiv 2601.19278): EAGLE-3's head, d = 8 positions a pass",
            notes=("the host tree search is not in the pass",),
        ),
        "falcon": DrafterShape(
            "falcon",
            at_width(1, int(t["vocab_size"])),
            lstm=True,
            source="Falcon (arXiv 2412.12639, models/cnets.py): 2-layer LSTM, 1 layer, the target's LM head",
        ),
        "deer": DrafterShape("deer", base("qwen2.5-0.5b"), source="DEER (arXiv 2512.15176): Qwen2.5-0.5B's shape"),
    }
