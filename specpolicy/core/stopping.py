"""Stop strings: end generation when the decoded output first contains one of ``generation.stop``.

The decoding loop works on token ids and has no tokenizer; ``StopStrings`` is the small object
it is handed (``generate(..., stop=StopStrings(tokenizer, strings))``). Each round the loop
feeds it the round's new output tokens (already cut at EOS / ``max_new_tokens``) and it answers
how many of them to keep: up to and including the token whose text completes a stop string
for the first time, exactly where plain decoding -- which checks after every token -- stops.

Matching is on decoded text (``tokenizer.decode(ids, skip_special_tokens=True)``), so a stop
string may span several tokens and need not align with token boundaries. It is incremental:
each check decodes a bounded window -- the last ``lookback`` output tokens plus the round's new
tokens -- never the whole output. A completion is *new* at token ``j`` when a stop string occurs
in the window's text ending after the part of the text that was already there before token
``j`` (the common prefix of the texts before and after ``j``: a token can change the decoded
text before it, e.g. the bytes of an incomplete UTF-8 character). A stop string holding U+FFFD,
the replacement character an incomplete UTF-8 character decodes to until its next byte, can
match such a passing text, so then every token's text is checked, as plain decoding does.

Escapes: a stop string given in a config or on the command line is read with its backslash
escapes decoded (``config_strings``), since Hydra keeps ``'generation.stop=["\\n\\n"]'`` as a
backslash and an ``n``: ``\\n``, ``\\t``, ``\\r``, ``\\\\``, ``\\"``, ``\\'``, ``\\xHH``,
``\\uXXXX`` and ``\\UXXXXXXXX`` become the characters they name; any other backslash stays as
written (``\\boxed{`` is a backslash and ``boxed{``). ``never_matching`` names stop strings the
tokenizer's decoded text can never contain (a character it cannot produce, a special token's text).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: The backslash escapes ``decode_escapes`` turns into characters (others stay as written).
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|[ntr\\\"'])")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def decode_escapes(text: str) -> str:
    """``text`` with the escapes ``\\n \\t \\r \\\\ \\" \\' \\xHH \\uXXXX \\UXXXXXXXX`` replaced by the
    characters they name, left to right (``\\\\n`` is a backslash and an ``n``); any other
    backslash is kept. Raises ValueError naming ``generation.stop`` for an escape naming no
    character (``\\UFFFFFFFF``)."""

    def one(match: re.Match) -> str:
        body = match.group(1)
        if body in _SIMPLE:
            return _SIMPLE[body]
        try:
            return chr(int(body[1:], 16))
        except (ValueError, OverflowError):  # beyond U+10FFFF
            raise ValueError(
                f"generation.stop: the escape \\{body} names no character (at most \\U0010FFFF), in {text!r}"
            ) from None

    return _ESCAPE.sub(one, text)


def config_strings(value: Any) -> Any:
    """A ``generation.stop`` config value with the escapes of each string decoded
    (``decode_escapes``); a value that is not a list of strings is returned as it is, for
    ``StopStrings`` to reject with its message."""
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        return [decode_escapes(s) for s in value]
    return value


def never_matching(tokenizer: Any, strings: Sequence[str]) -> list[str]:
    """One line per stop string that the tokenizer's decoded text can never contain, saying why:
    a character that encoding and decoding (``skip_special_tokens=True``, as matching decodes)
    does not give back -- one the vocabulary cannot produce --, or text that does not come back
    whole, such as a special token's text (special tokens are skipped before matching). Empty for
    a tokenizer without ``encode`` (nothing can be said).

    Args:
        tokenizer: with ``encode(text, add_special_tokens=False) -> list[int]`` and ``decode``.
        strings: the stop strings (escapes already decoded).
    """
    if not callable(getattr(tokenizer, "encode", None)):
        return []

    def round_trip(text: str) -> str:  # between two letters, so no tokenizer strips a leading space
        ids = tokenizer.encode(f"a{text}a", add_special_tokens=False)
        return tokenizer.decode(ids, skip_special_tokens=True)

    lines = []
    for s in strings:
        lost = next((c for c in dict.fromkeys(s) if c not in round_trip(c)), None)
        if lost is not None:
            lines.append(
                f"generation.stop string {s!r} can never match: the target's tokenizer cannot produce the "
                f"character {lost!r} (U+{ord(lost):04X}), so the decoded output never contains it"
            )
        elif s not in round_trip(s):
            back = tokenizer.decode(tokenizer.encode(s, add_special_tokens=False), skip_special_tokens=True)
            lines.append(
                f"generation.stop string {s!r} can never match: the target's tokenizer does not give this "
                f"text back (encoded and decoded it reads {back!r}; a special token's text is skipped), and "
                f"stop strings are matched on the decoded output"
            )
    return lines


class StopStrings:
    """Detects the first completion of any of ``strings`` in the decoded output.

    Args:
        tokenizer: anything with ``decode(ids: list[int], skip_special_tokens: bool) -> str``.
        strings: the stop strings, non-empty ``str`` each (at least one).
        lookback: output tokens kept before a round's new tokens for matching (default
            ``4 * longest stop string + 8``: a stop string of c characters spans at most c
            tokens of >= 1 character each, or about 4 tokens per character for byte-level
            tokens of one multi-byte character).
    Raises:
        ValueError: naming ``generation.stop`` for an empty list, an empty string or a non-string.
    """

    def __init__(self, tokenizer: Any, strings: Sequence[str], lookback: int | None = None) -> None:
        if isinstance(strings, str):
            raise ValueError(
                f"generation.stop must be a list of strings (e.g. generation.stop=[{strings!r}]), "
                f"got the string {strings!r}"
            )
        strings = list(strings)
        if not strings:
            raise ValueError("generation.stop: at least one stop string is needed (or pass no StopStrings)")
        for s in strings:
            if not isinstance(s, str) or not s:
                raise ValueError(f"generation.stop must be a list of non-empty strings, got {s!r}")
        self.tokenizer = tokenizer
        self.strings = tuple(strings)
        # a stop string with U+FFFD can match a transient text: the replacement character an
        # incomplete UTF-8 character decodes to until its next byte arrives; then every token is checked
        self._transient = any("\ufffd" in s for s in self.strings)
        self.max_chars = max(len(s) for s in strings)
        self.lookback = int(lookback) if lookback is not None else 4 * self.max_chars + 8
        self._tail: list[int] = []  # the last ``lookback`` output tokens

    @staticmethod
    def from_config(tokenizer: Any, strings: Sequence[str] | None) -> StopStrings | None:
        """``StopStrings`` for a ``generation.stop`` list as a config holds it (escapes decoded here,
        ``config_strings``), or None when it is empty or missing."""
        return StopStrings(tokenizer, config_strings(strings)) if strings or isinstance(strings, str) else None

    def reset(self) -> None:
        """Start a new prompt (the loop calls it before the first round)."""
        self._tail = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _new_match(self, before: str, after: str) -> bool:
        """True when ``after`` holds a stop string that ends past the common prefix with ``before``."""
        common = 0
        for x, y in zip(before, after):
            if x != y:
                break
            common += 1
        start = max(0, common - self.max_chars + 1)
        window = after[start:]
        return any(s in window for s in self.strings)

    def check(self, new_ids: Sequence[int]) -> int | None:
        """Feed a round's new output tokens (in order, after the EOS / ``max_new_tokens`` cut).

        Returns:
            ``j`` in ``1..len(new_ids)``: the first ``j`` tokens reach the output and the j-th
            completes a stop string (generation ends); or None: no stop string completed, all
            tokens are kept. Only the kept tokens are remembered.
        """
        new = [int(t) for t in new_ids]
        if not new:
            return None
        base = self._tail
        before = self._decode(base)
        after = self._decode(base + new)
        if not self._transient and not self._new_match(before, after):  # the common case: one decode
            self._tail = (base + new)[-self.lookback :]
            return None
        prev = before
        for j in range(1, len(new) + 1):
            text = after if j == len(new) else self._decode(base + new[:j])
            if self._new_match(prev, text):
                self._tail = (base + new[:j])[-self.lookback :]
                return j
            prev = text
        self._tail = (base + new)[-self.lookback :]
        if self._transient and not self._new_match(before, after):  # no step matched, nor the window
            return None
        # The whole window matched but no single step did (decoding not monotone): stop at the end.
        return len(new)

    def __repr__(self) -> str:
        return f"StopStrings({list(self.strings)!r})"
