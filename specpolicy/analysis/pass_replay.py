"""Every model pass of a run's rounds, in order, for the real-scale replay (``benchmarks/real_scale.py replay``).

A ``results.jsonl`` row carries the prompt's length P and its rounds (``RoundRecord``: speculation
length k, emitted tokens e, drafter passes n). Before round r the committed sequence holds
``C = P + sum of the earlier rounds' e`` tokens, the last one pending (not yet in the target's
cache: the first round's pending token is the prompt's last). So:

* **target** (every method; ``specpolicy/core/loop.py``): one verification pass of width ``k + 1``
  (the pending token and k drafted tokens; a tree's k nodes) after ``C - 1`` cached positions;
* **vanilla**: token i (0-based) is one width-1 pass after ``P - 1 + i`` cached positions.

The drafter's ``n`` passes of a round, per drafter (``f`` = tokens the drafter has not fed yet: the
previous round's e, 1 in the first round; its cache then holds ``C - f``):

* ``ar``, ``easyspec``, ``eagle3`` chains (``drafters/ar.py``, ``drafters/easyspec.py``,
  ``drafters/eagle3.py``): one token a pass; the first pass feeds the f new tokens (width f after
  ``C - f``), each later pass one token (width 1 after ``C + j - 1`` for the j-th later pass).
  EAGLE-3 trees (``draft_parents``, ``policy=eagle2-tree``): pass j > 1 feeds the nodes of depth
  ``j - 1`` that have children (at least 1) after ``C`` plus the nodes fed before;
* ``dart`` (``drafters/dart.py``): the first pass feeds the f new pairs and ``d - 1 = 7`` masks
  (width ``f + 7``); an extension pass feeds the previous pass's d pairs and 7 masks (width 15),
  after the pairs cached so far;
* ``dflash`` (``drafters/dflash.py``): the first pass is one block of B (``drafter.block_size``,
  16 by default) after ``C - 1`` cached context positions; extension pass j feeds the block with
  the ``(j - 1)(B - 1)`` tokens drafted so far (width ``B + (j - 1)(B - 1)``);
* ``fastdllm`` and ``deer`` (``drafters/fastdllm.py``, ``drafters/deer.py``): every pass runs over
  the current block of B (``drafter.block_size``, 32) with the complete blocks cached: pass j
  (0-based) after ``floor((C + j k / n) / B) x B`` (the round's k drafted tokens spread evenly over
  its n passes, so a pass after a block boundary sees that block cached);
* ``falcon`` (``drafters/falcon.py``, k = 2): the first pass feeds the held-back pair and the f new
  pairs (width ``f + 1`` after ``C - f - 1``), each later pass one block of 2;
* model-free drafters (``suffix``, n-gram) and ``vanilla`` have no drafter pass.

These are the shapes the drafters run; a pass's cost at real scale is looked up or executed per
(model, width, KV length). Everything here is pure Python on the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specpolicy.core.types import RoundRecord

#: Drafters whose passes are a chain of single tokens after a first pass of the new tokens.
CHAIN_DRAFTERS = ("ar", "easyspec", "eagle3")
#: Block drafters and their default block sizes B (tokens).
BLOCK_SIZES = {"dflash": 16, "fastdllm": 32, "deer": 32}
#: DART's positions per pass (d) and Falcon's tokens per pass (k).
DART_POSITIONS = 8
FALCON_BLOCK = 2
#: Drafters without a model pass.
MODEL_FREE = ("suffix", "ngram", "none", "vanilla", "")
#: Every drafter this module derives passes for.
KNOWN_DRAFTERS = (*CHAIN_DRAFTERS, "dart", *BLOCK_SIZES, "falcon", *MODEL_FREE)


@dataclass(frozen=True)
class Pass:
    """One model pass: ``model`` ``"target"`` or ``"drafter"``, ``width`` new positions (tokens)
    after ``kv`` cached positions (tokens)."""

    model: str
    width: int
    kv: int


def _depths(parents: Sequence[int]) -> list[int]:
    """Depth (1 = a root's child) of each node of a draft tree given by parent indices (-1: the root)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def drafter_passes(
    drafter: str, record: RoundRecord, committed: int, fresh: int, block_size: int | None = None
) -> list[Pass]:
    """The drafter's passes of one round (module docstring), in order.

    Args:
        drafter: the run's ``drafter.name`` (``KNOWN_DRAFTERS``).
        record: the round.
        committed: C, tokens committed before the round (prompt included).
        fresh: f, tokens the drafter has not fed yet (the previous round's emitted tokens; 1 first).
        block_size: a block drafter's B (None: ``BLOCK_SIZES``).
    Returns:
        ``record.drafter_forward_passes`` passes (none for a model-free drafter).
    Raises:
        ValueError: for a drafter outside ``KNOWN_DRAFTERS``.
    """
    n = int(record.drafter_forward_passes)
    if drafter in MODEL_FREE or n <= 0:
        if drafter not in KNOWN_DRAFTERS:
            raise ValueError(f"drafter {drafter!r}: no pass derivation; known: {', '.join(KNOWN_DRAFTERS)}")
        return []
    out: list[Pass] = []
    if drafter in CHAIN_DRAFTERS:
        out.append(Pass("drafter", fresh, committed - fresh))
        if record.draft_parents:
            depths = _depths(record.draft_parents)
            fed = committed
            for j in range(2, n + 1):
                with_children = {record.draft_parents[i] for i, d in enumerate(depths) if d == j}
                width = max(1, len(with_children))
                out.append(Pass("drafter", width, fed))
                fed += width
        else:
            out += [Pass("drafter", 1, committed + j) for j in range(n - 1)]
    elif drafter == "dart":
        out.append(Pass("drafter", fresh + DART_POSITIONS - 1, committed - fresh))
        out += [Pass("drafter", 2 * DART_POSITIONS - 1, committed + DART_POSITIONS * j) for j in range(n - 1)]
    elif drafter == "dflash":
        b = int(block_size or BLOCK_SIZES["dflash"])
        out += [Pass("drafter", b + j * (b - 1), committed - 1) for j in range(n)]
    elif drafter in ("fastdllm", "deer"):
        b = int(block_size or BLOCK_SIZES[drafter])
        k = int(record.speculation_length)
        out += [Pass("drafter", b, (committed + j * k // n) // b * b) for j in range(n)]
    elif drafter == "falcon":
        out.append(Pass("drafter", fresh + FALCON_BLOCK - 1, committed - fresh - FALCON_BLOCK + 1))
        out += [Pass("drafter", FALCON_BLOCK, committed + FALCON_BLOCK * j) for j in range(n - 1)]
    else:
        raise ValueError(f"drafter {drafter!r}: no pass derivation; known: {', '.join(KNOWN_DRAFTERS)}")
    return [Pass(p.model, max(1, p.width), max(0, p.kv)) for p in out]


def round_passes(
    drafter: str, rounds: Iterable[RoundRecord], prompt_tokens: int, block_size: int | None = None
) -> list[list[Pass]]:
    """Per round, its passes in order: the drafter's (``drafter_passes``), then the target's
    verification (width ``k + 1`` after ``C - 1``).

    Raises:
        ValueError: for an unknown drafter or a prompt of fewer than 1 token.
    """
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    committed, fresh = int(prompt_tokens), 1
    out: list[list[Pass]] = []
    for record in rounds:
        passes = drafter_passes(drafter, record, committed, fresh, block_size)
        passes.append(Pass("target", int(record.speculation_length) + 1, committed - 1))
        out.append(passes)
        committed += int(record.emitted_tokens)
        fresh = max(1, int(record.emitted_tokens))
    return out


def vanilla_passes(prompt_tokens: int, generated_tokens: int) -> list[Pass]:
    """Vanilla decoding's passes: token i a width-1 target pass after ``P - 1 + i`` cached positions."""
    return [Pass("target", 1, prompt_tokens - 1 + i) for i in range(generated_tokens)]


def drafter_of(config: Mapping[str, Any]) -> tuple[str, int | None]:
    """``(drafter name, block size or None)`` of a run's resolved config (``summary.json`` ``config``)."""
    node = config.get("drafter") or {}
    name = str(node.get("name") or "") if isinstance(node, Mapping) else ""
    size = node.get("block_size") if isinstance(node, Mapping) else None
    return name, (int(size) if isinstance(size, int) and size > 0 else None)
