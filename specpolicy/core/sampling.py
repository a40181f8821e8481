"""Lossless speculative *sampling* (temperature > 0): the settings, the warping of logits into
probabilities, row sampling, and the acceptance rule -- in one place.

Sources: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023, arXiv 2211.17192), Algorithm 1 and Appendix A.1; Chen et al.,
"Accelerating Large Language Model Decoding with Speculative Sampling" (arXiv 2302.01318),
Algorithm 2. For each draft token x_i, drawn from the drafter's distribution q_i, the target
with distribution p_i accepts it with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the
first rejection the next token is drawn from ``norm(max(0, p_i - q_i))``; when every draft
token is accepted a bonus token is drawn from p_{k}. The emitted tokens are then distributed
exactly as sampling from p token by token, whatever q is, provided x_i ~ q_i given everything
the acceptance of the earlier tokens depended on.

Point masses: a token not sampled by the drafter from a distribution it reports (a model-free
drafter, a reused token, a drafter that ignores the sampling settings) is verified with
q = δ_x: accepted with probability p(x), otherwise replaced by a draw from p with x removed.
That is lossless for any x fixed by the past (Leviathan et al. 2023 with q one-hot).

Temperature, top-k and top-p are applied by ``warp`` to the target's logits and to the
drafter's, identically; the output distribution is that of sampling from ``warp`` of the
target's logits. Temperature 0 is greedy decoding (argmax, the project's default), handled by
the greedy code paths, not by this module.

Randomness comes from one ``torch.Generator`` (``Runtime.generator``, seeded by
``Runtime.seed_everything``), so a seed fixes the output.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings, applied identically to target (p) and drafter (q) logits.

    Args:
        temperature: logits are divided by it, a finite number >= 0; 0 = greedy decoding
            (top_k / top_p are then ignored). Config key ``generation.temperature``.
        top_k: keep the ``top_k`` largest logits per row (ties with the k-th kept too); 0 = all.
            Config key ``generation.top_k``.
        top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability
            reaches ``top_p`` (after temperature and top-k), in (0, 1]; 1 = all.
            Config key ``generation.top_p``.
    Raises:
        ValueError: naming ``generation.temperature``, ``generation.top_k`` or
            ``generation.top_p`` when out of range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"generation.temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"generation.top_k must be an integer >= 0 (0 = no top-k), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"generation.top_p must be a number in (0, 1] (1 = no top-p), got {p!r}")

    @property
    def is_greedy(self) -> bool:
        """True at temperature 0 (argmax decoding, token-identical to vanilla greedy)."""
        return self.temperature == 0

    @classmethod
    def from_config(cls, generation: Mapping[str, Any] | None) -> SamplingConfig:
        """From the ``generation`` config section (keys ``temperature``, ``top_k``, ``top_p``;
        missing keys take the defaults, i.e. greedy). Integral floats are accepted for top_k."""
        g = dict(generation or {})
        temperature, top_k, top_p = g.get("temperature", 0.0), g.get("top_k", 0), g.get("top_p", 1.0)
        if isinstance(top_k, float) and top_k.is_integer():
            top_k = int(top_k)
        if isinstance(temperature, int) and not isinstance(temperature, bool):
            temperature = float(temperature)
        if isinstance(top_p, int) and not isinstance(top_p, bool):
            top_p = float(top_p)
        return cls(temperature=temperature, top_k=top_k, top_p=top_p)

    def describe(self) -> dict[str, Any]:
        """The settings as a plain dict (``summary.json``'s ``sampling``), with the mode."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "mode": "greedy" if self.is_greedy else "sampling",
        }


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A per-prompt seed from the run's ``seed`` and the prompt's id (stable across processes,
    prompt orders, dataset offsets and resumed runs: CRC-32 of the id, not Python's ``hash``).
    Returns an int in [0, 2**63)."""
    return (int(seed) * 1_000_003 + zlib.crc32(str(prompt_id).encode("utf-8"))) % (2**63)


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Probabilities of sampling from ``logits`` under ``sampling``: temperature, then top-k, then
    top-p (the order of Hugging Face's logits warpers), then softmax. The same function makes p
    (target) and q (drafter).

    Args:
        logits: ``(n, V)`` (or ``(V,)``) logits, any float dtype.
        sampling: a non-greedy ``SamplingConfig``.
    Returns:
        ``(n, V)`` (or ``(V,)``) float32 probabilities; each row sums to 1 and is 0 outside the
        kept tokens (top-k keeps ties with the k-th logit; top-p always keeps the most likely token).
    Raises:
        ValueError: for a greedy ``sampling`` (temperature 0 has no distribution: use argmax).
    """
    if sampling.is_greedy:
        raise ValueError("warp() needs generation.temperature > 0 (temperature 0 is greedy: argmax)")
    x = logits.float() / float(sampling.temperature)
    vocab = x.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # probability of the strictly more likely tokens
        drop_sorted = mass_before >= sampling.top_p  # never the first (mass_before = 0 < top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` by inverse-CDF sampling (one uniform per row, cumulative
    sums in float64; rows need not be normalised; no host sync).

    Args:
        probs: ``(n, V)`` non-negative weights, any float dtype, each row with a positive sum.
        generator: the random stream (``Runtime.generator``), on ``probs``' device; None = torch's
            default generator.
    Returns:
        ``(n,) int64`` token ids; a token of weight 0 is never drawn.
    """
    weights = probs.double()
    cdf = weights.cumsum(dim=-1)  # (n, V)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)  # first index with cdf > u * total
    # Rounding can put u * total on the total: never go past the last token of positive weight.
    positions = torch.arange(cdf.shape[-1], device=cdf.device)
    last = torch.where(weights > 0, positions, 0).amax(dim=-1, keepdim=True)
    return torch.minimum(idx, last).squeeze(-1)


def point_mass(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(k, V) float32`` one-hot rows: q = δ_x for tokens not sampled from a reported distribution
    (``speculative_verify`` then accepts x with probability p(x))."""
    rows = torch.zeros(token_ids.shape[0], vocab_size, dtype=torch.float32, device=token_ids.device)
    return rows.scatter_(1, token_ids[:, None], 1.0)


def speculative_verify(
    p: torch.Tensor, q: torch.Tensor | None, draft_ids: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling's verification of one draft (Leviathan et al. 2023, Alg. 1; Chen et
    al. 2023, Alg. 2), vectorised: no per-token loop, one host sync.

    Draft token i is accepted iff ``u_i * q_i(x_i) < p_i(x_i)`` with ``u_i ~ U[0, 1)`` (i.e. with
    probability ``min(1, p_i(x_i) / q_i(x_i))``); the accepted length a is the number of leading
    acceptances. The next token is drawn from ``norm(max(0, p_a - q_a))`` when a < k (from p_a
    if that residual is all zero, a numerical corner: it then has probability ~0) and from p_k
    (the bonus token) when a = k.

    Args:
        p: ``(k + 1, V)`` target probabilities (from ``warp``) at the k draft positions and one
            past the draft; row i is the distribution of the token at draft position i given the
            committed sequence and ``draft_ids[:i]``.
        q: ``(k, V')`` the drafter's probabilities each draft token was sampled from, or None:
            every token a point mass (accept with probability p(x)). A one-hot row is a point
            mass. Columns are token ids: a narrower q is padded with zeros, a wider one cut to V.
        draft_ids: ``(k,) int64`` the draft, k >= 0.
        generator: the random stream (``Runtime.generator``), on ``p``'s device.
    Returns:
        ``(accepted_length, next_token)`` as Python ints, ``0 <= accepted_length <= k``.
    Raises:
        ValueError: for inconsistent shapes.
    """
    k = int(draft_ids.shape[0])
    if p.dim() != 2 or p.shape[0] != k + 1:
        raise ValueError(f"p must be (k + 1, V) = ({k + 1}, V) for a draft of {k} tokens, got {tuple(p.shape)}")
    vocab = p.shape[1]
    if q is not None:
        if q.dim() != 2 or q.shape[0] != k:
            raise ValueError(f"q must be (k, V) = ({k}, V) for a draft of {k} tokens, got {tuple(q.shape)}")
        if q.shape[1] < vocab:
            q = torch.nn.functional.pad(q, (0, vocab - q.shape[1]))
        elif q.shape[1] > vocab:
            q = q[:, :vocab]
        q = q.to(p.dtype)
    device = p.device
    u = torch.rand(k, generator=generator, device=device, dtype=p.dtype)  # acceptance uniforms
    idx = draft_ids[:, None]
    px = p[:k].gather(1, idx).squeeze(1)  # (k,)
    qx = torch.ones_like(px) if q is None else q.gather(1, idx).squeeze(1)
    accept = u * qx < px  # u < p/q without dividing (q(x) = 0 accepts iff p(x) > 0)
    a = accept.int().cumprod(dim=0).sum()  # 0-d int64 on device: leading acceptances
    # The row the next token comes from, selected on device: residual at a < k, bonus p_k at a = k.
    p_row = p.index_select(0, a.view(1))[0]  # (V,)
    if k == 0:
        row = p_row
    else:
        i = a.clamp(max=k - 1).view(1)
        if q is None:
            residual = p_row.scatter(0, draft_ids.index_select(0, i), 0.0)
        else:
            residual = (p_row - q.index_select(0, i)[0]).clamp(min=0.0)
        residual = torch.where(residual.sum() > 0, residual, p_row)
        row = torch.where(a < k, residual, p_row)
    nxt = sample(row[None], generator)[0]
    accepted, next_token = torch.stack([a, nxt]).tolist()  # the one host sync
    return int(accepted), int(next_token)


def choose(
    logits: torch.Tensor, sampling: SamplingConfig | None, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A drafter's tokens from its logits, one per row.

    Greedy (``sampling`` None or greedy): the argmax, its softmax probability as the confidence,
    no distribution. Sampling: a draw from ``warp(logits)`` (q of speculative sampling), the
    confidence the largest q of the row.

    Args:
        logits: ``(n, V)`` any float dtype.
        sampling: the prompt's sampling settings.
        generator: the random stream (``Runtime.generator``).
    Returns:
        ``(tokens (n,) int64, confidences (n,) float32, q (n, V) float32 or None)``.
    """
    if sampling is None or sampling.is_greedy:
        tokens = logits.argmax(dim=-1)  # the logits' argmax (a softmax could round two tokens equal)
        # its softmax probability: fewer, cheaper ops than exp(max - logsumexp) on CPU
        return tokens, torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, tokens[..., None])[..., 0], None
    q = warp(logits, sampling)
    return sample(q, generator), q.max(dim=-1).values, q


def choose_rows(
    logits: torch.Tensor, samplings: list[SamplingConfig | None], generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """``choose`` for a batched drafter pass, row ``i`` (one request) under ``samplings[i]``.

    The batched loop's requests share the run's settings: then ONE ``choose`` over all rows (one
    uniform per row, drawn in row order); mixed settings go row by row, in order.

    Args:
        logits: ``(b, V)`` any float dtype, one row per request.
        samplings: ``b`` settings (None or greedy: the argmax).
        generator: the random stream (``Runtime.generator``).
    Returns:
        ``(tokens (b,) int64, confidences (b,) float32, q)``: ``q[i]`` is row i's ``(1, V)``
        float32 distribution when it samples, else None.
    """
    first = samplings[0]
    if all(s == first for s in samplings):
        tokens, confs, q = choose(logits, first, generator)
        return tokens, confs, [None] * len(samplings) if q is None else list(q[:, None].unbind(0))
    rows = [choose(logits[i : i + 1], s, generator) for i, s in enumerate(samplings)]
    return torch.cat([t for t, _, _ in rows]), torch.cat([c for _, c, _ in rows]), [q for _, _, q in rows]
