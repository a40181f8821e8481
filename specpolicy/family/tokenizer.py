"""Byte-level BPE tokenizer of the bundled model family, trained on GSM8K.

The tokenizer mirrors Qwen2.5's conventions at a small scale:

* byte-level BPE (``tokenizers`` library), every byte is in the alphabet, so any text
  round-trips exactly (``decode(encode(s)) == s``);
* pre-tokenization splits digits individually (``Digits(individual_digits=True)``) and
  then applies ``ByteLevel(add_prefix_space=False)``, so numbers are always one token per
  digit;
* special tokens, with fixed ids in this order: ``<|endoftext|>`` = 0 (pad),
  ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (eos), ``|<MASK>|`` = 3 (mask, used by the
  block-diffusion drafter);
* a Qwen2.5-style chat template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
  message and ``<|im_start|>assistant\\n`` when ``add_generation_prompt=True`` (no default
  system message).

A prompt is encoded with :func:`encode_prompt` (``apply_chat_template`` on one user
message, generation prompt added) and an assistant target with :func:`encode_response`
(the raw GSM8K answer followed by ``<|im_end|>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "|<MASK>|"
#: Special tokens in id order (ids 0..3).
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, MASK_TOKEN]

#: Qwen2.5-style chat template without the default system message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DEFAULT_VOCAB_SIZE = 4096


def read_gsm8k(path: str | Path) -> list[dict]:
    """Read a GSM8K jsonl file.

    Args:
        path: jsonl file, one object per line with string fields ``question`` and ``answer``.
    Returns:
        The rows as dicts, in file order.
    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if a row lacks ``question`` or ``answer`` (message names the line number).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
                raise ValueError(f"{path}:{n}: row needs string fields 'question' and 'answer'")
            rows.append(row)
    return rows


def _corpus(rows: Iterable[dict]) -> Iterator[str]:
    for row in rows:
        yield row["question"]
        yield row["answer"]


def build_tokenizer(rows: list[dict], vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on GSM8K questions and answers.

    Training is deterministic for a given corpus (the ``tokenizers`` BPE trainer breaks
    ties by pair order).

    Args:
        rows: GSM8K rows (see :func:`read_gsm8k`); questions and answers are both used.
        vocab_size: total vocabulary size, special tokens and the 256 byte symbols
            included. Must be > 256 + 4.
    Returns:
        A ``PreTrainedTokenizerFast`` with eos ``<|im_end|>``, pad ``<|endoftext|>``,
        mask ``|<MASK>|``, bos None and the chat template set. ``len(tok) <= vocab_size``
        (BPE may stop early on a tiny corpus).
    Raises:
        ValueError: if ``vocab_size`` is too small or ``rows`` is empty.
    """
    if vocab_size <= 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    if not rows:
        raise ValueError("no rows to train the tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rows), trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        padding_side="right",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode_prompt(tokenizer: PreTrainedTokenizerFast, question: str) -> list[int]:
    """Token ids of the chat prompt for one GSM8K question (Qwen2.5 style).

    Equivalent to ``tokenizer.apply_chat_template([{"role": "user", "content": question}],
    add_generation_prompt=True)``, i.e. ``<|im_start|>user\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n``.

    Returns:
        list of int token ids (length >= 6).
    """
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding by default
        out = out["input_ids"]
    return list(out)


def encode_response(tokenizer: PreTrainedTokenizerFast, answer: str) -> list[int]:
    """Token ids of the assistant target: the answer text verbatim, then ``<|im_end|>``.

    Returns:
        list of int token ids; the last one is ``tokenizer.eos_token_id``.
    """
    return tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def train_and_save(
    data_path: str | Path, out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> PreTrainedTokenizerFast:
    """Train the tokenizer on ``data_path`` and ``save_pretrained`` it into ``out_dir``.

    Raises:
        FileNotFoundError / ValueError: as :func:`read_gsm8k` and :func:`build_tokenizer`.
    """
    tok = build_tokenizer(read_gsm8k(data_path), vocab_size)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by :func:`train_and_save` (or from any model dir of the family)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
