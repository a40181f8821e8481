"""The shared n-gram model (specpolicy.models.ngram): DART's trie rule against a literal re-statement
of the reference (windows inserted into a dict trie, as ``ngram_build.py::add_conversation`` and
``trie_ngram.cpp::get_probability`` describe), a hand-worked example, interpolated Kneser-Ney against
a naive dict implementation of Chen & Goodman's formula, the file round trip and the bad files."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from specpolicy.core.errors import ConfigError
from specpolicy.models.ngram import NGramModel, load_ngram, main, vocabulary_sha256


def reference_trie(documents, order):
    """DART's trie: every window of ``order`` tokens from every start (shorter at a document's end)
    is inserted; a node counts the windows that pass through or end at it."""
    counts = Counter()
    for doc in documents:
        for start in range(len(doc)):
            window = tuple(doc[start : start + order])
            for depth in range(1, len(window) + 1):
                counts[window[:depth]] += 1
    return counts


def reference_probability(counts, context, token, order):
    for j in range(order - 1, 0, -1):
        suffix = tuple(context[-j:])
        if counts.get(suffix + (token,), 0) > 0:
            return counts[suffix + (token,)] / counts[suffix]
    return 0.0


def test_the_trie_rule_on_a_hand_worked_example():
    model = NGramModel.build([[0, 1, 2, 0, 1, 3]], vocab_size=5, order=3)
    probs = model.trie_probs(torch.tensor([[0, 1], [4, 1], [2, 0]]), torch.tensor([[2, 3, 4], [2, 3, 0], [1, 0, 2]]))
    # (0 1) was followed by 2 once and 3 once; 4 never follows 1 or (0 1) -> 0, no unigram fall-back
    # (4 1) unseen: back off to (1): 1 -> 2 once, 1 -> 3 once out of two 1s; 1 -> 0 never
    # (2 0) -> 1 once out of one; 0 never after 0; 2 never after 0 or (2 0)
    assert probs.tolist() == [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize("seed", range(4))
def test_the_trie_rule_equals_the_reference_trie(seed):
    rng = random.Random(seed)
    vocab, order = 7, 3
    documents = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
    model, trie = NGramModel.build(documents, vocab, order), reference_trie(documents, order)
    contexts = torch.tensor([[rng.randrange(vocab) for _ in range(order - 1)] for _ in range(20)])
    tokens = torch.tensor([rng.sample(range(vocab), 5) for _ in range(20)])
    got = model.trie_probs(contexts, tokens)
    want = [
        [reference_probability(trie, c.tolist(), t, order) for t in row.tolist()] for c, row in zip(contexts, tokens)
    ]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def naive_kneser_ney(documents, vocab, order, start):
    """Interpolated Kneser-Ney (Chen & Goodman 1998, eq. 26 with one discount per order), from dicts."""
    grams = [Counter() for _ in range(order + 1)]
    for doc in documents:
        padded = [start] * (order - 1) + list(doc)
        for i in range(order - 1, len(padded)):
            for n in range(1, order + 1):
                grams[n][tuple(padded[i - n + 1 : i + 1])] += 1
    tables = {order: grams[order]}
    for n in range(order - 1, 0, -1):
        tables[n] = Counter(g[1:] for g in grams[n + 1])
    discount = {}
    for n, t in tables.items():
        n1, n2 = sum(1 for c in t.values() if c == 1), sum(1 for c in t.values() if c == 2)
        discount[n] = n1 / (n1 + 2 * n2) if n1 > 0 else 0.5

    def p(n, context, w):
        t, d = tables[n], discount[n]
        if n == 1:
            total = sum(t.values())
            return (max(t.get((w,), 0) - d, 0) + d * len(t) / vocab) / total
        prefix = tuple(context[-(n - 1) :])
        follows = {g: c for g, c in t.items() if g[:-1] == prefix}
        total = sum(follows.values())
        lower = p(n - 1, context, w)
        if total == 0:
            return lower
        return (max(t.get(prefix + (w,), 0) - d, 0) + d * len(follows) * lower) / total

    return lambda context, w: p(order, context, w)


def test_kneser_ney_equals_the_formula_and_sums_to_one():
    rng = random.Random(0)
    vocab, order = 6, 3
    documents = [[rng.randrange(vocab - 1) for _ in range(rng.randrange(2, 30))] for _ in range(10)]  # 5 never seen
    model = NGramModel.build(documents, vocab, order)
    reference = naive_kneser_ney(documents, vocab, order, start=vocab)
    contexts = torch.tensor([[0, 1], [1, 1], [5, 5], [vocab, vocab], [vocab, 2], [3, 5]])
    tokens = torch.arange(vocab).expand(len(contexts), -1)
    got = model.log_probs(contexts, tokens).exp()
    want = torch.tensor([[reference(c.tolist(), w) for w in range(vocab)] for c in contexts])
    assert torch.allclose(got, want.to(torch.float32), atol=1e-6)
    assert torch.allclose(got.sum(-1), torch.ones(len(contexts)), atol=1e-5)
    assert bool((got > 0).all())  # the unseen token 5 too


def test_the_file_round_trip_and_the_bad_files(tmp_path):
    vocab = {f"t{i}": i for i in range(9)}
    model = NGramModel.build(
        [[1, 2, 3, 1, 2, 4], [2, 3]], len(vocab), 3, {"tokenizer_sha256": vocabulary_sha256(vocab)}
    )
    path = model.save(tmp_path / "lm.npz")
    again = load_ngram(path, "policy.ngram", vocab)
    for a, b in zip(model.keys + model.counts, again.keys + again.counts):
        assert torch.equal(a, b)
    contexts, tokens = torch.tensor([[1, 2], [7, 2]]), torch.arange(9).expand(2, -1)
    assert torch.equal(model.trie_probs(contexts, tokens), again.trie_probs(contexts, tokens))

    def refused(file, vocabulary=None) -> str:
        with pytest.raises(ConfigError) as info:
            load_ngram(file, "policy.ngram", vocabulary)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "no such file" in refused(tmp_path / "missing.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    assert "empty" in refused(tmp_path / "empty.npz")
    (tmp_path / "junk.npz").write_bytes(b"\x00not a zip" * 20)
    assert "not a readable n-gram model file" in refused(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", header=np.frombuffer(json.dumps({"format": "else"}).encode(), dtype=np.uint8))
    assert "not a readable n-gram model file" in refused(tmp_path / "other.npz")
    other = {f"u{i}": i for i in range(9)}
    message = refused(path, other)
    assert message.startswith("policy.ngram=") and "another tokenizer" in message
    assert "another tokenizer" in refused(path, {f"t{i}": i for i in range(12)})


def test_the_command_builds_a_model_for_the_bundled_tokenizer(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"answer": f"She has {i} apples and {i + 2} pears.\n#### {2 * i + 2}"}) for i in range(30)
        ),
        encoding="utf-8",
    )
    assert main(["--corpus", str(corpus), "--field", "answer", "--out", str(tmp_path / "lm.npz")]) == 0
    assert "30 documents" in capsys.readouterr().out
    from specpolicy.models.loading import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("target"))
    model = load_ngram(tmp_path / "lm.npz", "ngram", tokenizer.get_vocab())
    ids = tokenizer.encode(" and", add_special_tokens=False)
    context = model.pad_context(tokenizer.encode("She has 3 apples", add_special_tokens=False))
    assert model.trie_probs(context[None], torch.tensor([ids[:1]])).item() == 1.0  # " and" always follows "apples"
    assert math.isclose(
        model.log_probs(context[None], torch.arange(len(tokenizer.get_vocab()))[None]).exp().sum().item(),
        1.0,
        rel_tol=1e-4,
    )
    with pytest.raises(SystemExit):
        main(["--corpus", str(corpus), "--field", "question", "--out", str(tmp_path / "x.npz")])
    assert "--field='question'" in capsys.readouterr().err


def test_the_command_takes_token_ids_as_they_are(tmp_path):
    """A .jsonl field of token ids (the family's distilled ``response_ids``) is counted as it is: the
    same model as building from the lists, no tokenizer round trip, no EOS added."""
    rows = [[5, 6, 7, 2], [5, 6, 9, 9, 2], [8]]
    corpus = tmp_path / "distill.jsonl"
    corpus.write_text("\n".join(json.dumps({"response_ids": r, "prompt_ids": [1]}) for r in rows), encoding="utf-8")
    assert main(["--corpus", str(corpus), "--field", "response_ids", "--out", str(tmp_path / "lm.npz")]) == 0
    from specpolicy.models.loading import load_tokenizer, resolve_model_path

    got = load_ngram(tmp_path / "lm.npz", "ngram", load_tokenizer(resolve_model_path("target")).get_vocab())
    want = NGramModel.build(rows, got.vocab_size, 3)
    for a, b in zip(got.keys + got.counts, want.keys + want.counts):
        assert torch.equal(a, b)


def test_the_bundled_ngram_models_fit_the_bundled_tokenizer():
    from specpolicy.models.loading import load_tokenizer, resolve_model_path
    from specpolicy.models.ngram import BUNDLED_NGRAMS, PATH_SEARCH_DEFAULTS, resolve_ngram_path

    vocab = load_tokenizer(resolve_model_path("target")).get_vocab()
    assert PATH_SEARCH_DEFAULTS["ngram"] in BUNDLED_NGRAMS
    for name in BUNDLED_NGRAMS:
        model = load_ngram(resolve_ngram_path(name), "drafter.ngram", vocab)  # refused if built for another one
        assert model.order == 3 and model.header["documents"] > 7000


def test_an_order_whose_codes_overflow_is_refused():
    with pytest.raises(ValueError, match=r"order 4 is too large for a vocabulary of 151936 tokens .* at most 3"):
        NGramModel.build([[1, 2, 3]], 151936, 4)
    NGramModel.build([[1, 2, 3]], 151936, 3)  # fits


def test_the_trie_rule_at_a_document_start():
    """A context of start symbols was never counted on its own: its count is what followed it (the
    documents' first tokens: 1 three times, 2 once; after (S, 1): 2 twice, 3 once)."""
    model = NGramModel.build([[1, 2, 3], [1, 2, 4], [1, 3], [2, 2]], 5, 3)
    assert model.trie_probs(model.pad_context([])[None], torch.arange(5)[None]).tolist() == [[0, 0.75, 0.25, 0, 0]]
    two = model.trie_probs(model.pad_context([1])[None], torch.arange(5)[None])
    assert two.tolist() == [[0, 0, pytest.approx(2 / 3), pytest.approx(1 / 3), 0]]
