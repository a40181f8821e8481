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
text before it, e.g. the bytes of an incomplete UTF-8 character).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
            raise ValueError(f"generation.stop must be a list of strings (e.g. generation.stop=[{strings!r}]), "
                             f"got the string {strings!r}")
        strings = list(strings)
        if not strings:
            raise ValueError("generation.stop: at least one stop string is needed (or pass no StopStrings)")
        for s in strings:
            if not isinstance(s, str) or not s:
                raise ValueError(f"generation.stop must be a list of non-empty strings, got {s!r}")
        self.tokenizer = tokenizer
        self.strings = tuple(strings)
        self.max_chars = max(len(s) for s in strings)
        self.lookback = int(lookback) if lookback is not None else 4 * self.max_chars + 8
        self._tail: list[int] = []  # the last ``lookback`` output tokens

    @staticmethod
    def from_config(tokenizer: Any, strings: Sequence[str] | None) -> StopStrings | None:
        """``StopStrings`` for a ``generation.stop`` list, or None when it is empty or missing."""
        return StopStrings(tokenizer, strings) if strings or isinstance(strings, str) else None

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
        if not self._new_match(before, after):  # the common case: one decode of the window
            self._tail = (base + new)[-self.lookback:]
            return None
        prev = before
        for j in range(1, len(new) + 1):
            text = after if j == len(new) else self._decode(base + new[:j])
            if self._new_match(prev, text):
                self._tail = (base + new[:j])[-self.lookback:]
                return j
            prev = text
        # The whole window matched but no single step did (decoding not monotone): stop at the end.
        self._tail = (base + new)[-self.lookback:]
        return len(new)

    def __repr__(self) -> str:
        return f"StopStrings({list(self.strings)!r})"
