"""Stop conditions inside an accepted draft: EOS, stop strings and ``max_new_tokens`` at every
position of a draft (accepted tokens, the correction token, the bonus token) cut the output
exactly where plain decoding stops, the first condition wins, and nothing after it is emitted.

The table runs on a scripted target (its greedy token at output position n is ``OFFSET + n``, so
every token is distinct and each condition can be placed at any position) and scripted drafters
(all right, or wrong from a given draft position); a second part checks real tiny models with a
real byte-level BPE tokenizer, and ``StopStrings`` against a whole-text reference (hypothesis).
Last, stop strings as users write them: the README's ``'generation.stop=["\\n\\n"]'`` (escapes
decoded) and a warning for a stop string the tokenizer's text can never contain."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from hydra import compose, initialize_config_module
from hypothesis import given, settings, strategies as st

from conftest import overrides, sharpen, tiny_lm, tiny_tokenizer
from specpolicy.core.decoding import generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.policy import LengthPolicy
from specpolicy.core.runtime import Runtime
from specpolicy.core.stopping import StopStrings, decode_escapes, never_matching
from specpolicy.core.types import Draft, Verification
from specpolicy.core.verifier import Verifier
from specpolicy.drafters.ar import ARDrafter
from specpolicy.run.cli import main
from specpolicy.verifiers.hf import HFVerifier

OFFSET = 10
WRONG = 9  # never a target token
K = 4  # draft length of the table


def target_token(n: int) -> int:
    return OFFSET + n


class ScriptedVerifier(Verifier):
    """The target's greedy token at output position n is ``target_token(n)``."""

    name = "scripted"
    max_context = 10_000
    vocab_size = 10_000

    def __init__(self, eos=()):
        self.eos_token_ids = frozenset(eos)

    def prefill(self, prompt_ids):
        self.n = 0  # output tokens committed

    def verify(self, draft: Draft) -> Verification:
        k = draft.length
        target = torch.tensor([target_token(self.n + j) for j in range(k + 1)])
        accepted = int((target[:k] == draft.token_ids).int().cumprod(0).sum())
        self.n += accepted + 1
        return Verification(accepted_length=accepted, next_token=int(target[accepted]), target_token_ids=target)


class ScriptedDrafter(Drafter):
    """Proposes the target's tokens, wrong from draft position ``miss`` on (None: never)."""

    name = "scripted"

    def __init__(self, miss: int | None):
        self.miss = miss

    def prefill(self, prompt_ids):
        self.n, self.tokens = 0, []

    def draft(self, num_tokens):
        for _ in range(num_tokens):
            j = len(self.tokens)
            self.tokens.append(WRONG if self.miss is not None and j >= self.miss else target_token(self.n + j))
        ids = torch.tensor(self.tokens, dtype=torch.long)
        return Draft(ids, torch.ones(len(self.tokens)), forward_passes=len(self.tokens))

    def commit(self, draft, verification):
        self.n += verification.accepted_length + 1
        self.tokens = []


class Fixed(LengthPolicy):
    name = "fixed"

    def __init__(self, k: int):
        self.k = k
        self.updates = 0

    def next_length(self, draft):
        return max(self.k - draft.length, 0)

    def update(self, record):
        self.updates += 1


class BracketTokenizer:
    """Token t decodes to ``[t]``."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"[{int(t)}]" for t in ids)


def _stop_string_at(p: int) -> str:
    """A stop string completed by output token p: it spans tokens p - 1 and p when p > 0."""
    if p == 0:
        return f"[{target_token(0)}]"
    return f"{target_token(p - 1)}][{target_token(p)}"


def _run(condition: dict, drafter: Drafter | None):
    runtime = Runtime("cpu", "float32")
    verifier = ScriptedVerifier(condition.get("eos", ()))
    stop = StopStrings(BracketTokenizer(), condition["stop"]) if condition.get("stop") else None
    policy = Fixed(K) if drafter is not None else None
    out = generate(
        torch.tensor([1, 2, 3]),
        verifier,
        runtime,
        max_new_tokens=condition.get("max_new_tokens", 100),
        drafter=drafter,
        policy=policy,
        stop=stop,
    )
    return out, policy


CONDITIONS = {
    "eos": lambda p: ({"eos": (target_token(p),)}, "eos"),
    "stop_string": lambda p: ({"stop": [_stop_string_at(p)]}, "stop_string"),
    "max_new_tokens": lambda p: ({"max_new_tokens": p + 1}, "max_new_tokens"),
}
# Drafters: every draft token right (stops land on accepted tokens and bonus tokens), wrong from
# draft position 2 (accepted tokens and corrections), and always wrong (every round one correction).
DRAFTERS = {"all-accepted": None, "miss-at-2": 2, "miss-at-0": 0}


def _check(out, policy, expected_len: int, reason: str) -> None:
    assert out.output_ids.tolist() == [target_token(n) for n in range(expected_len)]
    assert out.finish_reason == reason
    assert sum(r.emitted_tokens for r in out.rounds) == expected_len  # nothing past the stop is emitted
    assert [r.finish_reason for r in out.rounds] == [""] * (len(out.rounds) - 1) + [reason]
    if policy is not None:
        assert policy.updates == len(out.rounds) - 1  # the final round is not learned from


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("condition", list(CONDITIONS))
@pytest.mark.parametrize("p", range(3 * (K + 1)))
def test_stop_condition_at_every_position_of_a_draft(condition, drafter, p):
    setup, reason = CONDITIONS[condition](p)
    plain, _ = _run(setup, None)
    _check(plain, None, p + 1, reason)  # plain decoding stops at output position p
    out, policy = _run(setup, ScriptedDrafter(DRAFTERS[drafter]))
    _check(out, policy, p + 1, reason)  # so does speculative decoding, wherever p falls in a round
    assert out.output_ids.tolist() == plain.output_ids.tolist()


def test_the_table_covers_every_draft_position_and_the_bonus_token():
    """With K = 4 and every draft accepted, rounds emit 5 tokens: positions 0..3 are accepted
    draft tokens, 4 the bonus token; with a miss at 2, 0..1 accepted and 2 the correction."""
    out, _ = _run({}, ScriptedDrafter(None))
    assert [r.emitted_tokens for r in out.rounds][:3] == [K + 1] * 3
    out, _ = _run({}, ScriptedDrafter(2))
    assert [(r.accepted_length, r.emitted_tokens) for r in out.rounds][:3] == [(2, 3)] * 3


PAIRS = [("eos", "stop_string"), ("stop_string", "max_new_tokens"), ("eos", "max_new_tokens")]


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("first,second", PAIRS + [(b, a) for a, b in PAIRS])
@pytest.mark.parametrize("p,q", [(0, 1), (2, 3), (3, 4), (4, 5), (1, 7), (5, 5)])
def test_the_first_condition_wins(first, second, drafter, p, q):
    a, reason_a = CONDITIONS[first](p)
    b, _ = CONDITIONS[second](q)
    setup = {**a, **b}
    if p == q:  # the same token: EOS before a stop string before max_new_tokens
        order = ["eos", "stop_string", "max_new_tokens"]
        reason = min((first, second), key=order.index)
    else:
        reason = reason_a
    plain, _ = _run(setup, None)
    out, policy = _run(setup, ScriptedDrafter(DRAFTERS[drafter]))
    _check(plain, None, p + 1, reason)
    _check(out, policy, p + 1, reason)


def test_stop_strings_reject_bad_values():
    with pytest.raises(ValueError, match="generation.stop"):
        StopStrings(BracketTokenizer(), [])
    with pytest.raises(ValueError, match="generation.stop"):
        StopStrings(BracketTokenizer(), ["ok", ""])
    with pytest.raises(ValueError, match="generation.stop"):
        StopStrings(BracketTokenizer(), "###")
    assert StopStrings.from_config(BracketTokenizer(), []) is None


# -- StopStrings against a whole-text reference ---------------------------------------------------

TOKENIZER = tiny_tokenizer()
SPECIAL = set(TOKENIZER.all_special_ids)
NORMAL_IDS = [i for i in range(len(TOKENIZER)) if i not in SPECIAL]


def reference_cut(ids: list[int], strings: list[str]) -> int | None:
    """Plain decoding's stop: the first j such that the decoded ``ids[:j]`` contains a stop string."""
    for j in range(1, len(ids) + 1):
        text = TOKENIZER.decode(ids[:j], skip_special_tokens=True)
        if any(s in text for s in strings):
            return j
    return None


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_incremental_matching_equals_the_whole_text_reference(data):
    ids = data.draw(st.lists(st.sampled_from(NORMAL_IDS + sorted(SPECIAL)), min_size=1, max_size=40))
    text = TOKENIZER.decode(ids, skip_special_tokens=True)
    strings = []
    for _ in range(data.draw(st.integers(1, 3))):
        if text and data.draw(st.booleans()):  # a piece of the output text (often found)
            i = data.draw(st.integers(0, len(text) - 1))
            strings.append(text[i : i + data.draw(st.integers(1, 6))])
        else:
            strings.append(data.draw(st.text(alphabet="abcdehlnost .,\n", min_size=1, max_size=3)))
    stop = StopStrings(TOKENIZER, strings)
    stop.reset()
    pos, cut = 0, None
    while pos < len(ids) and cut is None:  # feed the tokens in random chunks, as rounds do
        n = data.draw(st.integers(1, 8))
        got = stop.check(ids[pos : pos + n])
        if got is not None:
            cut = pos + got
        pos += n
    assert cut == reference_cut(ids, strings)


def test_a_stop_string_with_the_replacement_character_matches_a_passing_text():
    """Hypothesis's find: token 130 is the first byte of a two-byte character, so the text after
    [4, 130] ends in U+FFFD until token 98 completes it; plain decoding, checking after every
    token, stops at token 2 on the stop string U+FFFD, and so must a round of 3 tokens."""
    ids, strings = [4, 130, 98, 98], ["\ufffd", "a"]
    assert [TOKENIZER.decode(ids[:j], skip_special_tokens=True)[-1] for j in (2, 3)] == ["\ufffd", "\xa1"]
    stop = StopStrings(TOKENIZER, strings)
    stop.reset()
    assert stop.check(ids[:3]) == 2 == reference_cut(ids, strings)


# -- real tiny models: speculative == plain decoding under the same stop strings ------------------


@pytest.fixture(scope="module")
def real():
    vocab = len(TOKENIZER)
    target = sharpen(tiny_lm(seed=3, vocab=vocab), 4.0)
    prompt = torch.tensor(TOKENIZER.encode("Natalia sold clips to 48 of her friends"), dtype=torch.long)
    return target, prompt


@pytest.mark.parametrize("drafter_seed", [3, 4])  # the target itself (long accepted drafts), another model
def test_real_models_stop_strings_inside_drafts(real, drafter_seed):
    runtime = Runtime("cpu", "float64")
    target, prompt = real
    verifier = HFVerifier(target, runtime, frozenset())
    free = generate(prompt, verifier, runtime, max_new_tokens=40).output_ids.tolist()
    text = TOKENIZER.decode(free, skip_special_tokens=True)
    assert len(text) > 10
    drafter_model = target if drafter_seed == 3 else sharpen(tiny_lm(seed=drafter_seed, vocab=len(TOKENIZER)), 4.0)
    checked = 0
    for end in range(1, len(text) + 1, max(1, len(text) // 15)):  # stop strings ending all along the text
        strings = [text[max(0, end - 3) : end]]
        if not strings[0].strip():
            continue
        expected = reference_cut(free, strings)
        plain = generate(prompt, verifier, runtime, max_new_tokens=40, stop=StopStrings(TOKENIZER, strings))
        spec = generate(
            prompt,
            verifier,
            runtime,
            max_new_tokens=40,
            drafter=ARDrafter(drafter_model, runtime),
            policy=Fixed(6),
            stop=StopStrings(TOKENIZER, strings),
        )
        assert plain.output_ids.tolist() == free[:expected]
        assert spec.output_ids.tolist() == free[:expected]
        assert spec.finish_reason == plain.finish_reason == "stop_string"
        assert sum(r.emitted_tokens for r in spec.rounds) == expected
        checked += 1
    assert checked >= 8


# -- stop strings as the README writes them: escapes decoded, unmatchable ones named --------------

README_STOP = 'generation.stop=["\\n\\n"]'  # exactly the README's line (in single quotes for bash)


def test_stop_string_escapes_are_decoded_and_other_backslashes_kept():
    assert decode_escapes(r"\n\n") == "\n\n"
    assert decode_escapes(r"a\tb\r") == "a\tb\r"
    assert decode_escapes(r"\\n") == "\\n"  # an escaped backslash, then a plain n
    assert decode_escapes(r"\"q\" \'") == '"q" \''
    assert decode_escapes(r"\x41\u00e9\U0001F600") == "A\u00e9\U0001f600"
    assert decode_escapes(r"\boxed{ \d \s") == r"\boxed{ \d \s"  # no escape a user would mean: kept as written
    assert decode_escapes("é\n") == "é\n"  # decoded text and non-ASCII pass through unchanged
    with pytest.raises(ValueError, match=r"generation.stop: the escape \\UFFFFFFFF names no character"):
        decode_escapes(r"\UFFFFFFFF")


def test_the_readme_stop_line_ends_generation_at_a_blank_line():
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        raw = compose("config", overrides=[README_STOP]).generation.stop
    assert list(raw) == ["\\n\\n"]  # what Hydra hands over: backslash, n, backslash, n
    stop = StopStrings.from_config(TOKENIZER, list(raw))
    assert stop.strings == ("\n\n",)
    ids = TOKENIZER.encode("Natalia sold clips.\n\nHow many clips?", add_special_tokens=False)
    stop.reset()
    cut = stop.check(ids)
    assert cut is not None and TOKENIZER.decode(ids[:cut]).endswith("\n\n")
    assert "\n\n" not in TOKENIZER.decode(ids[: cut - 1])


class _LettersOnly:
    """A tokenizer whose vocabulary is the letters a-z and a space (anything else is unknown, dropped)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text if c == " " or "a" <= c <= "z"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_stop_strings_that_can_never_match_are_named():
    lines = never_matching(_LettersOnly(), ["the end", "\n\n", "done."])
    assert lines == [
        "generation.stop string '\\n\\n' can never match: the target's tokenizer cannot produce the character "
        "'\\n' (U+000A), so the decoded output never contains it",
        "generation.stop string 'done.' can never match: the target's tokenizer cannot produce the character '.' "
        "(U+002E), so the decoded output never contains it",
    ]
    # a byte-level tokenizer produces any character, but a special token's text is skipped in the output
    assert never_matching(TOKENIZER, ["\n\n", "é", "\\n", " clips"]) == []
    assert never_matching(TOKENIZER, ["<|im_end|>"]) == [
        "generation.stop string '<|im_end|>' can never match: the target's tokenizer does not give this text back "
        "(encoded and decoded it reads ''; a special token's text is skipped), and stop strings are matched on the "
        "decoded output"
    ]


def test_a_run_matches_the_readme_stop_line_as_written_and_warns_of_an_unmatchable_one(
    family, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "specpolicy",
            *overrides(family),
            "dataset.num_prompts=1",
            'generation.stop=["\\n\\n","<|im_end|>"]',
            "hydra.run.dir=out",
        ],
    )
    main()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["config"]["generation"]["stop"] == ["\n\n", "<|im_end|>"]  # newlines, as matched
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: generation.stop")]
    assert warnings == [
        "warning: generation.stop string '<|im_end|>' can never match: the target's tokenizer does "
        "not give this text back (encoded and decoded it reads ''; a special token's text is "
        "skipped), and stop strings are matched on the decoded output"
    ]
