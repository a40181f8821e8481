"""A tiny on-disk model family for CLI tests (no bundled weights needed): a byte-level BPE
tokenizer with a ChatML chat template and ``|<MASK>|``, a random Qwen2 target and a random
Qwen2 AR drafter saved with ``save_pretrained`` (sub-second to build, ~1 MB)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
          "How many clips did Natalia sell altogether in April and May? Let's think step by step."] * 4


def _tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   mask_token="|<MASK>|", chat_template=CHAT_TEMPLATE)


def _model(vocab: int, eos: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=eos, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


def save_tiny_family(directory: Path) -> dict[str, Path]:
    """Save ``target`` and ``drafter`` (each with the tokenizer) under ``directory``."""
    tokenizer = _tokenizer()
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    paths = {}
    for name, seed in (("target", 0), ("drafter", 1)):
        path = Path(directory) / name
        _model(vocab, eos, seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


def overrides(paths: dict[str, Path], drafter: str = "target") -> list[str]:
    """CLI overrides running on the tiny family: float64 on CPU (no argmax near-ties), 2 GSM8K
    prompts, 16 new tokens, no warm-up, the AR drafter (``drafter="target"`` drafts with the
    target's own weights: every draft token is accepted)."""
    return [f"verifier.model={paths['target']}", "drafter=ar", f"drafter.model={paths[drafter]}",
            "runtime=cpu", "runtime.dtype=float64", "dataset.num_prompts=2", "generation.max_new_tokens=16",
            "run.warmup_prompts=0"]
