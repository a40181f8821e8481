"""Shared test builders: tiny Qwen2 models built in the test (float64 so argmax near-ties cannot
flip), and the tiny on-disk model family for runs of the command line. Tests marked ``slow``
(pyproject.toml: multirun, Optuna, subprocess, training and benchmark runs, and the wide
matrices past the cases the fast subset keeps) run by default; ``python -m pytest -q -m "not
slow"`` deselects them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specpolicy.core.runtime import Runtime

# Tiny models: one thread is faster than two (no sync overhead); the suite runs on two worker
# processes (pytest-xdist, ``-n 2`` in pyproject.toml), one thread each: one per core on CI's two.
torch.set_num_threads(1)

VOCAB = 64
EOS = VOCAB - 1


def tiny_lm(
    seed: int = 0,
    layers: int = 2,
    vocab: int = VOCAB,
    hidden: int = 32,
    max_positions: int = 512,
    eos: int | None = EOS,
    attn: str | None = None,
) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 causal LM in float64, eval mode (the same weights for the same seed,
    layers, vocab and hidden size, whatever the other settings)."""
    torch.manual_seed(seed)
    extra = {"attn_implementation": attn} if attn else {}
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=eos,
        **extra,
    )
    return Qwen2ForCausalLM(config).double().eval()


def sharpen(model: Qwen2ForCausalLM, factor: float = 8.0) -> Qwen2ForCausalLM:
    """Scale the LM head so the model is confident (long accepted drafts, FailFast extensions)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(device="cpu", dtype="float64", seed=0)


def random_prompts(n: int, seed: int = 1, vocab: int = VOCAB) -> list[torch.Tensor]:
    """``n`` random prompts ((P,) int64, lengths 3..40, no EOS) for losslessness checks."""
    g = torch.Generator().manual_seed(seed)
    lengths = (
        [3, 31, 32, 33, 17, 40, 8, 64][:n] if n <= 8 else [int(x) for x in torch.randint(3, 40, (n,), generator=g)]
    )
    return [torch.randint(0, vocab - 1, (length,), generator=g) for length in lengths]


# -- the tiny on-disk family: a byte-level BPE tokenizer with a ChatML template and |<MASK>|, a
# random Qwen2 target and a random Qwen2 drafter saved with save_pretrained (~1 MB) ------------

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? Let's think step by step.",
] * 4


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny family's tokenizer (300 tokens, ChatML chat template, ``<|im_end|>`` as EOS)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        mask_token="|<MASK>|",
        chat_template=CHAT_TEMPLATE,
    )


def save_tiny_family(directory: Path) -> dict[str, Path]:
    """Save ``target`` and ``drafter`` (float32, each with the tokenizer) under ``directory``, and
    random drafters that read the target, in their official layouts: ``dflash`` (block 8, DFlash
    layer ids 0 and 1) and ``eagle3`` (features ``hidden_states[0, 1, 2]``)."""
    from conditioned_reference import write_dflash_checkpoint, write_eagle3_checkpoint

    tokenizer = tiny_tokenizer()
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    paths = {}
    for name, seed in (("target", 0), ("drafter", 1)):
        path = Path(directory) / name
        tiny_lm(seed, vocab=vocab, max_positions=2048, eos=eos).float().save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    paths["dflash"] = write_dflash_checkpoint(
        Path(directory) / "dflash", 32, vocab, 2, [0, 1], 8, tokenizer.convert_tokens_to_ids("|<MASK>|"), seed=2
    )
    paths["eagle3"] = write_eagle3_checkpoint(
        Path(directory) / "eagle3", 32, vocab, vocab // 2, seed=3, layer_ids=[0, 1, 2]
    )
    return paths


@pytest.fixture(scope="session")
def family(tmp_path_factory) -> dict[str, Path]:
    """The tiny family on disk, built once per session (read-only for tests)."""
    return save_tiny_family(tmp_path_factory.mktemp("family"))


def overrides(paths: dict[str, Path], drafter: str = "target") -> list[str]:
    """CLI overrides running on the tiny family: float64 on CPU (no argmax near-ties), 2 GSM8K
    prompts, 16 new tokens, no warm-up, the AR drafter (``drafter="target"`` drafts with the
    target's own weights: every draft token is accepted)."""
    return [
        f"verifier.model={paths['target']}",
        "drafter=ar",
        f"drafter.model={paths[drafter]}",
        "runtime=cpu",
        "runtime.dtype=float64",
        "dataset.num_prompts=2",
        "generation.max_new_tokens=16",
        "run.warmup_prompts=0",
    ]


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` loaded as the module ``specpolicy_bench_<name>`` (the benchmarks
    are scripts, not a package), freshly each call; ``benchmarks/`` is on ``sys.path`` while it
    loads, for the scripts that import each other (``overhead.py`` imports ``peers``)."""
    spec = importlib.util.spec_from_file_location(f"specpolicy_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
