"""Where a greedy run parts from vanilla decoding: rounding or a bug (``identical`` /
``numerically equivalent`` / ``NOT lossless``).

Greedy speculative decoding is lossless in exact arithmetic: every emitted token is the target's
argmax. In reduced precision the target's logits at a position depend on how they were computed
-- a verification pass over k + 1 tokens and a one-token decoding step round differently
(different matmul shapes, different accumulation orders) -- so at a near-tie the two runs'
argmaxes can differ and the outputs part there, with no error in the algorithm.

``measure_parting`` tells the two apart AFTER decoding, never inside the loop: at the first
differing output position it re-runs the target (the run's model and dtype) over the common
prefix -- one pass over the prompt and the common prefix up to the method's round, then the
method's verification pass of that round (its pending token and its whole chain draft, the same
width) and the vanilla-style one-token step -- and reads, in each of the two re-run logit rows,
the top-2 margin and the logit gaps of the two emitted tokens to the top one.

Classification (``classify``): the parting is *numerically equivalent* when, in BOTH re-run rows,
both emitted tokens lie within the dtype's rounding tolerance of the top logit
(``rounding_tolerance``); otherwise *NOT lossless*. A row the re-run cannot produce (a verifier
without a Hugging Face ``model``, a length mismatch, a tree round) is NOT lossless: the check never
excuses what it did not measure.

Tolerance (``rounding_tolerance``): ``ULPS * eps * magnitude`` with ``eps = torch.finfo(dtype).eps``
(the spacing of the dtype's numbers in [1, 2): bfloat16 2^-7, float16 2^-10) and ``magnitude`` the
larger of the top logit's absolute value and the absolute dot product ``sum_i |h_i W_ti|`` of the
final hidden state ``h`` and the LM head row ``W_t`` of the top token (the logit's condition: a
rounding of ``h`` by the dtype moves the logit by at most ``eps/2 * sum_i |h_i W_ti|``, the final
rounding of the logit by at most ``eps/2 * |logit|``). ``ULPS = 4`` allows those two roundings in
each of the two runs (``4 * eps/2 = 2 eps``) twice over for what earlier layers' rounding carries
into ``h``; a bug that swaps a token is not a near-tie at that scale (the wrong-token test). In
float32 and float64 the tolerance is 0: a parting there is numerically equivalent only at an exact
tie (both tokens' logits equal the top logit in both rows), the strict behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

#: Classes of a greedy prompt against vanilla decoding.
IDENTICAL = "identical"
EQUIVALENT = "numerically equivalent"
NOT_LOSSLESS = "NOT lossless"
#: Rounding units (eps * magnitude) a near-tie may span in a reduced-precision dtype (module doc).
ULPS = 4
#: Dtypes whose partings must be exact ties (tolerance 0).
STRICT_DTYPES = (torch.float32, torch.float64)


def rounding_tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """The logit difference two computations of the same logit may show from rounding alone:
    ``ULPS * torch.finfo(dtype).eps * magnitude`` for bfloat16 / float16, 0 for float32 / float64
    (module doc). ``magnitude``: the logit's scale (``max(|logit|, sum_i |h_i W_i|)``), >= 0."""
    if dtype in STRICT_DTYPES:
        return 0.0
    return ULPS * float(torch.finfo(dtype).eps) * float(magnitude)


@dataclass(frozen=True)
class RowMargins:
    """One re-run logit row at the parting position (float32 values of the run's-dtype logits).

    Attributes:
        top_token / top_logit: the argmax and its logit.
        margin: top-2 logit margin (top minus second), >= 0.
        method_gap / vanilla_gap: top logit minus the logit of the token the method / vanilla
            emitted there, >= 0.
        magnitude: ``max(|top logit|, sum_i |h_i W_top,i|)`` (the tolerance's scale).
        tolerance: ``rounding_tolerance`` of the run's dtype at ``magnitude``.
    """

    top_token: int
    top_logit: float
    margin: float
    method_gap: float
    vanilla_gap: float
    magnitude: float
    tolerance: float

    @property
    def near_tie(self) -> bool:
        """Both emitted tokens within the tolerance of the top logit."""
        return self.method_gap <= self.tolerance and self.vanilla_gap <= self.tolerance


@torch.no_grad()
def row_margins(
    logits: torch.Tensor, hidden: torch.Tensor | None, head: torch.Tensor | None, tokens: tuple[int, int], dtype
) -> RowMargins:
    """``RowMargins`` of one logit row ``(V,)`` for the emitted ``tokens`` (method's, vanilla's);
    ``hidden`` ``(H,)`` the final hidden state and ``head`` ``(V, H)`` the LM head weight, when
    known, give the dot-product magnitude (else ``|top logit|``)."""
    values = logits.float()
    top2 = values.topk(2)
    top_value, top_token = float(top2.values[0]), int(top2.indices[0])
    magnitude = abs(top_value)
    if hidden is not None and head is not None:
        magnitude = max(magnitude, float((hidden.float().abs() * head[top_token].float().abs()).sum()))
    return RowMargins(
        top_token=top_token,
        top_logit=top_value,
        margin=top_value - float(top2.values[1]),
        method_gap=top_value - float(values[tokens[0]]),
        vanilla_gap=top_value - float(values[tokens[1]]),
        magnitude=magnitude,
        tolerance=rounding_tolerance(dtype, magnitude),
    )


@dataclass(frozen=True)
class Parting:
    """The first position where a greedy method's output differs from vanilla's, measured.

    Attributes:
        position: output position (tokens after the prompt) of the first difference.
        method_token / vanilla_token: what each emitted there (-1: that output had ended).
        dtype: the run's dtype (``"bfloat16"``).
        method_row / vanilla_row: ``RowMargins`` of the re-run verification pass (the method's
            round, same width) and of the re-run one-token step; None when not measured.
        lossless: ``EQUIVALENT`` or ``NOT_LOSSLESS`` (``classify``).
        note: why it was not measured, else ``""``.
    """

    position: int
    method_token: int
    vanilla_token: int
    dtype: str
    method_row: RowMargins | None
    vanilla_row: RowMargins | None
    lossless: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``results.jsonl`` ``parting``, ``summary.json`` ``partings``)."""
        out = asdict(self)
        for key in ("method_row", "vanilla_row"):
            if out[key] is not None:
                out[key] = {k: round(v, 6) if isinstance(v, float) else v for k, v in out[key].items()}
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Parting:
        """The inverse of ``to_dict``."""
        rows = {k: RowMargins(**data[k]) if data.get(k) else None for k in ("method_row", "vanilla_row")}
        return Parting(
            position=int(data["position"]),
            method_token=int(data["method_token"]),
            vanilla_token=int(data["vanilla_token"]),
            dtype=str(data["dtype"]),
            lossless=str(data["lossless"]),
            note=str(data.get("note") or ""),
            **rows,
        )


def classify(method_row: RowMargins | None, vanilla_row: RowMargins | None) -> str:
    """``EQUIVALENT`` when both rows were measured and each is a near-tie of the two emitted tokens
    (``RowMargins.near_tie``), else ``NOT_LOSSLESS``."""
    rows = (method_row, vanilla_row)
    return EQUIVALENT if all(r is not None and r.near_tie for r in rows) else NOT_LOSSLESS


def _round_of(emitted: Sequence[int], position: int) -> tuple[int, int] | None:
    """``(round index, first output position of that round)`` of the round that emitted ``position``."""
    start = 0
    for index, count in enumerate(emitted):
        if start <= position < start + count:
            return index, start
        start += count
    return None


@torch.no_grad()
def _rerun(model, prefix: torch.Tensor, start: int, block: torch.Tensor, row: int) -> tuple[tuple, tuple]:
    """The re-run: ``prefix[:start]`` into a cache (one pass), then ``block`` (the method's round)
    as one pass -> its row ``row``; the cache cropped back, then ``prefix[start:-1]`` as one pass and
    ``prefix[-1]`` as a one-token step -> its row. Returns ``((logits, hidden), (logits, hidden))``
    of the method-style and the vanilla-style rows."""
    from transformers import DynamicCache

    from specpolicy.core.cache import crop_cache

    cache = DynamicCache()

    def run(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(input_ids=ids[None], cache=cache, use_cache=True, output_hidden_states=True)
        return out.logits[0], out.hidden_states[-1][0]

    def fill(ids: torch.Tensor) -> None:  # the cache only: one logit row, no hidden states kept
        model(input_ids=ids[None], cache=cache, use_cache=True, logits_to_keep=1)

    if start > 0:
        fill(prefix[:start])
    logits, hidden = run(block)
    method = (logits[row], hidden[row])
    crop_cache(cache, start)
    if prefix.shape[0] - 1 > start:
        fill(prefix[start:-1])
    logits, hidden = run(prefix[-1:])
    return method, (logits[0], hidden[0])


def measure_parting(
    model,
    prompt_ids: torch.Tensor,
    method_ids: Sequence[int],
    vanilla_ids: Sequence[int],
    position: int,
    method_rounds: Sequence[Any],
    dtype: torch.dtype,
) -> Parting:
    """Measure the parting at output ``position`` (module doc): a few target passes over the prompt
    and the common prefix, after decoding (never in the timed loop).

    Args:
        model: the target (a Hugging Face causal LM in the run's dtype; None: not measured).
        prompt_ids: ``(P,) int64``; method_ids / vanilla_ids: the two outputs (token ids).
        position: the first differing output position (``results.first_difference``).
        method_rounds: the method's ``RoundRecord``s (which round emitted ``position``, its draft).
        dtype: the run's dtype (the tolerance's).
    Returns:
        a ``Parting`` classified by ``classify``.
    """
    a = int(method_ids[position]) if position < len(method_ids) else -1
    b = int(vanilla_ids[position]) if position < len(vanilla_ids) else -1
    name = str(dtype).removeprefix("torch.")

    def unmeasured(note: str) -> Parting:
        return Parting(position, a, b, name, None, None, NOT_LOSSLESS, note)

    if a < 0 or b < 0:
        return unmeasured("one output ended before the other")
    if model is None or not callable(model):
        return unmeasured("the verifier has no Hugging Face model to re-run")
    found = _round_of([r.emitted_tokens for r in method_rounds], position)
    if found is None:
        return unmeasured("no round of the method emitted this position")
    round_ = method_rounds[found[0]]
    if round_.is_tree:
        return unmeasured("the parting round verified a tree (its re-run is not implemented)")
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).cpu()
    prefix = torch.cat([prompt, torch.tensor([int(t) for t in method_ids[:position]], dtype=torch.long)]).to(device)
    row = position - found[1]  # the row of the round's pass that predicted `position`
    start = prompt.shape[0] - 1 + found[1]  # the cache before the round: the prompt but its pending token
    draft = torch.tensor(list(round_.draft_token_ids[row:]), dtype=torch.long, device=device)
    block = torch.cat([prefix[start:], draft])  # [pending] + the round's chain draft, as verified
    (m_logits, m_hidden), (v_logits, v_hidden) = _rerun(model, prefix, start, block, row)
    head_module = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = None if head_module is None else head_module.weight.detach()
    method_row = row_margins(m_logits, m_hidden, head, (a, b), dtype)
    vanilla_row = row_margins(v_logits, v_hidden, head, (a, b), dtype)
    return Parting(position, a, b, name, method_row, vanilla_row, classify(method_row, vanilla_row))


def parting_line(prompt_id: str, parting: dict[str, Any]) -> str:
    """One line of a run's table for a parting: position, class, margins and tolerance."""
    head = f"{parting['lossless']}: prompt {prompt_id} parts from vanilla at output position {parting['position']}"
    rows: list[tuple[str, dict[str, Any]]] = [
        (label, parting[key])
        for label, key in (("verify", "method_row"), ("one-token", "vanilla_row"))
        if parting.get(key)
    ]
    if len(rows) < 2:
        return f"{head} ({parting.get('note') or 'not measured'})"
    parts = [
        f"{label} pass: top-2 margin {r['margin']:.4g}, method's token {r['method_gap']:.4g} / vanilla's "
        f"{r['vanilla_gap']:.4g} below the top, tolerance {r['tolerance']:.4g}"
        for label, r in rows
    ]
    return f"{head} ({parting['dtype']}; {'; '.join(parts)})"
