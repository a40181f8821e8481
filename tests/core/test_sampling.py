"""Lossless speculative sampling (temperature > 0).

Unit tests of ``specpolicy.core.sampling`` (settings, ``warp``, ``sample``, ``speculative_verify`` on
hand-built p and q), of the drafters' q rows, draft reuse, seeding and the experiment's records,
and a STATISTICAL test of losslessness: over N seeded runs, the joint distribution of the first
T = 3 generated tokens under speculative sampling must match the target's exact sampling
distribution, for every drafter (ar, fastdllm, suffix as point masses), for FailFast (whose
draft length depends on confidences) and for plain sampling (no drafter).

Statistical design. Tiny float64 models with V = 16 tokens. The exact target distribution of
(y1, y2, y3) -- 16^3 cells -- is computed by enumeration: one batched forward pass over every
two-token continuation of the prompt, the same ``warp`` applied to each position's logits. Each
configuration generates 3 tokens (FailFast: 4, so its length decisions matter) N = 500 times,
seeds 0..N-1; the observed joint counts of the first 3 are compared with N x the exact
probabilities by Pearson's chi-square test, cells of expected count < 5 pooled into one (the usual
validity rule; about 20-25 degrees of freedom), p-value from the chi-square survival function
(``torch.special.gammaincc``). False-alarm rate: at most FAMILY_ALPHA = 1e-3 for the whole file
(a correct implementation failing any of the tests); each of the ``len(STAT_TESTS)`` tests uses
ALPHA = FAMILY_ALPHA / len(STAT_TESTS) ~ 8e-5 (Bonferroni). The runs are seeded, so an outcome is
deterministic; the rate is over the choice of seeds. Power (``test_a_broken_acceptance_rule_is_detected``):
three broken verifiers must be REJECTED at the same ALPHA -- one that accepts every draft token, one
that draws the correction token from p instead of norm(max(0, p - q)), and a subtle one that
accepts with probability sqrt(min(1, p/q)) instead of min(1, p/q). N = 500 is the least of 300,
500 and 1000 at which all three fall far below ALPHA (the AR drafter at temperature 1, when N was
chosen: p = 1.3e-3, 5.9e-8 and 4.5e-22 for the subtle one; 1.1e-8, 1.1e-15 and 2.8e-30 for the
correction from p; the always-accepting rule below 1e-34 at each N).
Verifying sampled tokens as point masses instead (ignoring q) is NOT a bug: it is lossless too,
only with lower acceptance (the point-mass rule holds for any draft token fixed by the past).
Fast-dLLM's any-order unmasking would not be lossless with per-pass q rows: shown exactly on a
toy by enumeration; the drafter's left-to-right rule is checked structurally.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2ForCausalLM

from conftest import sharpen, tiny_lm
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig, point_mass, prompt_seed, sample, speculative_verify, warp
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.policies.dart_tree import DartTreePolicy
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.failfast_tree import FailFastTreePolicy
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers import hf as hf_module
from specpolicy.verifiers.hf import HFVerifier

V = 16  # vocabulary: small, so the joint histogram of 3 tokens is meaningful
MASK = V - 1  # the fastdllm drafter's mask token
T = 3  # tokens generated per run (drafts of up to T - 1 = 2 tokens, then a bonus / correction)
N = 500  # seeded runs per configuration (the power study: module docstring)
FAMILY_ALPHA = 1e-3  # false-alarm probability of the file's distribution tests, all together
STAT_TESTS = (
    "vanilla",
    "ar",
    "fastdllm",
    "suffix",
    "failfast",
    "dflash",
    "eagle3",
    "eagle3-tree",
    "dflash-failfast-tree",
    "dflash-dart-tree",
    "dflash-cps",
    "fastdllm-cps",
)
ALPHA = FAMILY_ALPHA / len(STAT_TESTS)  # per test (Bonferroni); the power check must fall below it too
TEMPERATURE = SamplingConfig(temperature=1.0)
TRUNCATED = SamplingConfig(temperature=0.8, top_k=8, top_p=0.9)
PROMPT = torch.tensor([3])  # one token: no prefill pass, so N runs stay fast
FEATURE_PROMPT = torch.tensor([3, 7])  # two tokens: the target's features of the first reach the drafter
SUFFIX_PROMPT = torch.tensor([5, 9, 14, 3, 5, 9])  # the suffix drafter proposes 14 3 (target: p ~ 0.27, 0.68)


def _lm(seed: int, scale: float = 25.0) -> Qwen2ForCausalLM:
    """A random 1-layer Qwen2 LM, float64, its head scaled by ``scale`` (peaked enough that the
    joint of 3 tokens has ~25 cells of expected count >= 5 at N runs)."""
    return sharpen(tiny_lm(seed, layers=1, vocab=V, max_positions=64, eos=None), scale)


@pytest.fixture(scope="module")
def models() -> dict[str, Qwen2ForCausalLM]:
    target = _lm(0)
    ar = copy.deepcopy(target)  # a drafter close to the target but not equal (acceptance ~ 0.4)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        w = ar.lm_head.weight
        w.add_(0.5 * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype))
    # The dLLM drafter runs the target's weights block-causally with masks: a different q.
    return {"target": target, "ar": ar, "dllm": target}


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(device="cpu", dtype="float64", seed=0)


@torch.no_grad()
def exact_joint(target: Qwen2ForCausalLM, prompt: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """``(V, V, V) float64``: P(y1, y2, y3) of sampling 3 tokens from ``target`` after ``prompt``,
    by enumeration (one forward pass over all V^2 two-token continuations)."""
    y1, y2 = torch.meshgrid(torch.arange(V), torch.arange(V), indexing="ij")
    seqs = torch.cat([prompt.expand(V * V, -1), y1.reshape(-1, 1), y2.reshape(-1, 1)], dim=1)  # (V^2, P + 2)
    logits = target(input_ids=seqs).logits[:, -3:]  # (V^2, 3, V): predicts y1, y2 | y1, y3 | y1 y2
    probs = warp(logits.reshape(-1, V), sampling).double().reshape(V, V, 3, V)
    p1 = probs[0, 0, 0]  # (V,)
    p2 = probs[:, 0, 1]  # (V, V): [y1, y2]
    p3 = probs[:, :, 2]  # (V, V, V): [y1, y2, y3]
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's goodness-of-fit test of ``counts`` against ``probs`` (same shape), cells of
    expected count < ``min_expected`` pooled into one. Returns ``(p-value, degrees of freedom)``.
    An observation in a cell of probability 0 gives p-value 0."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    n = counts.sum()
    if bool((counts[probs <= 0] > 0).any()):
        return 0.0, 0
    expected = n * probs
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    if exp[-1] < min_expected:  # too little pooled mass: merge it into the smallest kept cell
        i = int(exp[:-1].argmin())
        obs[i] += obs[-1]
        exp[i] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = int(obs.shape[0]) - 1
    assert df >= 1, "no cell has enough expected count: raise N or sharpen the target"
    pvalue = torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return float(pvalue), df


def run_counts(
    make, prompt: torch.Tensor, sampling: SamplingConfig, runtime: Runtime, target, tokens: int = T
) -> tuple[torch.Tensor, dict]:
    """``(V, V, V) int64`` counts of the first T tokens over N runs of ``generate`` (``tokens`` >= T
    new tokens) seeded 0..N-1; ``make()`` returns ``(drafter, policy)`` or ``(None, None)``. Also
    round statistics."""
    verifier = HFVerifier(target, runtime, frozenset())  # no EOS: every run makes T tokens
    drafter, policy = make()
    counts = torch.zeros(V, V, V, dtype=torch.long)
    stats = {"rounds": 0, "speculated": 0, "accepted": 0, "passes": 0, "first_round_lengths": set()}
    for seed in range(N):
        runtime.generator.manual_seed(seed)  # (seed_everything also seeds torch's global RNG: slower)
        out = generate(
            prompt, verifier, runtime, max_new_tokens=tokens, drafter=drafter, policy=policy, sampling=sampling
        )
        y = out.output_ids.tolist()
        assert len(y) == tokens
        counts[y[0], y[1], y[2]] += 1
        stats["first_round_lengths"].add(out.rounds[0].speculation_length)
        for r in out.rounds:
            stats["rounds"] += 1
            stats["speculated"] += r.speculation_length
            stats["accepted"] += r.accepted_length
            stats["passes"] += r.drafter_forward_passes
    return counts, stats


def _fastdllm(models, runtime, threshold: float = 0.9, cls=FastDLLMDrafter):
    # threshold 0.9: usually one token per pass, so a small block takes several left-to-right passes
    return cls(
        models["dllm"],
        runtime,
        SimpleNamespace(mask_token_id=MASK),
        block_size=8,
        small_block_size=4,
        threshold=threshold,
    )


def _dflash(models, runtime, path_search=None):
    """A random DFlash drafter fitting the 1-layer target (block 3, DFlash layer id 0, the family's
    initialisation: near-uniform q, so rejections dominate); ``path_search``: DiffuSpec's CPS on it."""
    from specpolicy.drafters.dflash import DFlashDrafter
    from specpolicy.family.train_dflash import new_dflash

    target = models["target"]
    model = (
        new_dflash(
            target.config,
            MASK,
            3,
            [0],
            seed=3,
            size=dict(
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64
            ),
        )
        .double()
        .eval()
    )
    return DFlashDrafter(
        model, target.get_input_embeddings(), target.get_output_embeddings(), runtime, path_search=path_search
    )


def _cps(target, seed: int = 5):
    """DiffuSpec's path search with a 2-gram model of the target's own samples (so its paths are
    often accepted, and sometimes not), n-gram-led (lambda 0.2)."""
    from specpolicy.core.path_search import PathSearch
    from specpolicy.models.ngram import NGramModel

    rng = torch.Generator().manual_seed(seed)
    corpus = []
    with torch.no_grad():
        for _ in range(30):
            seq = FEATURE_PROMPT.clone()
            for _ in range(6):
                p = torch.softmax(target(seq[None]).logits[0, -1].double(), -1)
                seq = torch.cat([seq, torch.multinomial(p, 1, generator=rng)])
            corpus.append(seq.tolist())
    return PathSearch(NGramModel.build(corpus, V, 2), torch.empty(0, dtype=torch.long), mass=0.9, width=2, lam=0.2)


def _eagle3(models, runtime):
    """A random EAGLE-3 head fitting the 1-layer target (features hidden_states 0, 1, 1)."""
    from specpolicy.drafters.eagle3 import Eagle3Drafter
    from specpolicy.family.train_eagle3 import new_eagle3

    target = models["target"]
    head = (
        new_eagle3(
            target.config,
            torch.arange(V),
            seed=4,
            layer_ids=[0, 1, 1],
            size=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64),
        )
        .double()
        .eval()
    )
    with torch.no_grad():  # a peaked head: its top-k children carry real probability
        head.lm_head.weight.mul_(40.0)
    return Eagle3Drafter(head, target.get_input_embeddings(), (0, 1, 1), V, runtime)


def _config(name: str, models, runtime):
    """(make, prompt, sampling, tokens generated per run) of a named statistical-test configuration."""
    static = lambda: StaticPolicy(k=T - 1)
    if name == "vanilla":  # plain sampling from the target (the bonus path alone)
        return (lambda: (None, None)), PROMPT, TEMPERATURE, T
    if name == "ar":  # temperature, top-k and top-p on both p and q
        return (lambda: (ARDrafter(models["ar"], runtime), static())), PROMPT, TRUNCATED, T
    if name == "fastdllm":
        return (lambda: (_fastdllm(models, runtime), static())), PROMPT, TEMPERATURE, T
    if name == "suffix":  # point masses
        return (lambda: (SuffixDrafter(runtime, min_match=1, max_match=4), static())), SUFFIX_PROMPT, TEMPERATURE, T
    if name in ("dflash", "dflash-failfast-tree", "dflash-dart-tree"):  # drafters that read the target
        policy = {
            "dflash": static,
            "dflash-failfast-tree": lambda: FailFastTreePolicy(n=1, tau=0.5, n_max=T - 1, branch_k=3),
            # DART's search over the block's 2 positions, best-first (beams as wide as the tree): point masses
            "dflash-dart-tree": lambda: DartTreePolicy(top_k=4, beam_width=6, total_tokens=6, use_ngram=False),
        }[name]
        return (lambda: (_dflash(models, runtime), policy())), FEATURE_PROMPT, TEMPERATURE, T
    if name == "fastdllm-cps":  # one pass over the block, the path search's tokens: point masses

        def make():
            drafter = FastDLLMDrafter(
                models["dllm"],
                runtime,
                SimpleNamespace(mask_token_id=MASK),
                block_size=8,
                small_block_size=8,
                path_search=_cps(models["target"]),
            )
            return drafter, static()

        return make, PROMPT, TEMPERATURE, T
    if name == "dflash-cps":  # the path search's tokens: point masses
        return (lambda: (_dflash(models, runtime, _cps(models["target"])), static())), FEATURE_PROMPT, TEMPERATURE, T
    if name in ("eagle3", "eagle3-tree"):  # a tree: deterministic top-k children (point masses)
        policy = static if name == "eagle3" else (lambda: Eagle2TreePolicy(depth=T - 1, top_k=3, total_tokens=5))
        return (lambda: (_eagle3(models, runtime), policy())), FEATURE_PROMPT, TRUNCATED, T
    if name == "failfast":
        # n = 1, 4 tokens per run (T = 3 compared): the draft grows token by token while every
        # confidence is >= tau; the first token's confidence is fixed by the prompt (0.47, always
        # extended), the second's depends on the sampled first token (about half extend), and so
        # do the confidences of the rounds after a rejection.
        return (
            (lambda: (_fastdllm(models, runtime), FailFastPolicy(n=1, tau=0.35, n_max=T))),
            PROMPT,
            TEMPERATURE,
            T + 1,
        )
    raise KeyError(name)


# -- the statistical test of losslessness ------------------------------------------------------


#: the fast subset's configurations: every drafter with a static length; plain sampling (whose
#: draws every drafter's bonus and correction tokens use) and the policies and variants (FailFast,
#: the trees, the path search) are ``slow``
FAST_STAT_TESTS = ("ar", "fastdllm", "suffix", "dflash", "eagle3")


@pytest.mark.parametrize(
    "name", [name if name in FAST_STAT_TESTS else pytest.param(name, marks=pytest.mark.slow) for name in STAT_TESTS]
)
def test_speculative_sampling_matches_target_distribution(models, runtime, name):
    make, prompt, sampling, tokens = _config(name, models, runtime)
    counts, stats = run_counts(make, prompt, sampling, runtime, models["target"], tokens)
    pvalue, df = chi_square_pvalue(counts, exact_joint(models["target"], prompt, sampling))
    if name != "vanilla":  # the test must exercise acceptance AND rejection
        rate = stats["accepted"] / stats["speculated"]
        # random heads (dflash, eagle3): mostly rejected; a tree's rate counts all its nodes
        low = 0.005 if name.endswith("tree") else 0.02 if name.startswith(("dflash", "eagle3")) else 0.15
        assert low < rate < 0.9 and stats["accepted"] >= 20, (name, stats)  # acceptance exercised, not once
    if name == "failfast":  # the draft length really depends on the (sampled) confidences
        assert stats["first_round_lengths"] == {2, 3}, stats
    assert df >= 10, df
    assert pvalue > ALPHA, f"{name}: chi-square p = {pvalue:.2e} <= {ALPHA:.1e} (df {df}), {stats}"


def _always_accept(p, q, draft_ids, generator):
    """A broken rule: accept every draft token, bonus from p."""
    k = int(draft_ids.shape[0])
    return k, int(sample(p[k:], generator)[0])


def _correction_from_p(p, q, draft_ids, generator):
    """A broken rule: the right acceptances, but the correction token drawn from p_a instead of
    norm(max(0, p_a - q_a)) (the output then over-weights the rejected token's neighbours)."""
    accepted, next_token = speculative_verify(p, q, draft_ids, generator)
    if accepted < int(draft_ids.shape[0]):
        next_token = int(sample(p[accepted : accepted + 1], generator)[0])
    return accepted, next_token


def _lenient(p, q, draft_ids, generator):
    """A subtly broken rule: accept draft token i with probability sqrt(min(1, p_i(x) / q_i(x)))
    instead of min(1, p_i(x) / q_i(x)); the correction as it should be (and the right rule for an
    empty draft, which has no q)."""
    k = int(draft_ids.shape[0])
    if q is None:
        return speculative_verify(p, q, draft_ids, generator)
    px = p[:k].gather(1, draft_ids[:, None]).squeeze(1)
    qx = q.to(p.dtype).gather(1, draft_ids[:, None]).squeeze(1)
    u = torch.rand(k, generator=generator, dtype=p.dtype)
    a = int((u < (px / qx).clamp(max=1.0).sqrt()).int().cumprod(0).sum())
    if a == k:
        return k, int(sample(p[k:], generator)[0])
    residual = (p[a] - q.to(p.dtype)[a]).clamp(min=0.0)
    return a, int(sample((residual if residual.sum() > 0 else p[a])[None], generator)[0])


#: name -> (broken verifier, sampling): the power study of the module docstring; the subtle rule
#: (the hardest to detect) in the fast subset
BROKEN_RULES = {
    "lenient": (_lenient, TEMPERATURE),
    "correction-from-p": (_correction_from_p, TEMPERATURE),
    "always-accept": (_always_accept, TRUNCATED),
}


@pytest.mark.parametrize(
    "rule", [r if r == "lenient" else pytest.param(r, marks=pytest.mark.slow) for r in BROKEN_RULES]
)
def test_a_broken_acceptance_rule_is_detected(models, runtime, monkeypatch, rule):
    """Power: the same test, at the same N and ALPHA, rejects a verifier that breaks the rule
    (``BROKEN_RULES``: the output then leaves the target's distribution on drafted positions)."""
    broken, sampling = BROKEN_RULES[rule]
    monkeypatch.setattr(hf_module, "speculative_verify", broken)
    make = lambda: (ARDrafter(models["ar"], runtime), StaticPolicy(k=T - 1))
    counts, _ = run_counts(make, PROMPT, sampling, runtime, models["target"])
    pvalue, _ = chi_square_pvalue(counts, exact_joint(models["target"], PROMPT, sampling))
    assert pvalue < ALPHA, f"{rule}: p = {pvalue:.3g} not below {ALPHA:.1e}"


def _two_token_output(p1, p2, first, second, r1, r2) -> torch.Tensor:
    """Exact ``(V, V)`` distribution of the first two tokens emitted by speculative sampling of a
    2-token draft, by enumeration: ``first``/``second`` give P(x1, x2) ((V, V)), ``r1[x1, x2]`` /
    ``r2[x1, x2]`` the q rows the drafter reports for x1 / x2 ((V, V, V)); p1 (V,), p2 (V, V)."""
    n = p1.shape[0]
    out = torch.zeros(n, n, dtype=torch.float64)
    joint = first * second
    for x1 in range(n):
        for x2 in range(n):
            w, q1, q2 = joint[x1, x2], r1[x1, x2], r2[x1, x2]
            acc1 = min(1.0, float(p1[x1] / q1[x1]))
            res1 = (p1 - q1).clamp(min=0)
            res1 = res1 / res1.sum() if res1.sum() > 0 else p1
            acc2 = min(1.0, float(p2[x1, x2] / q2[x2]))
            res2 = (p2[x1] - q2).clamp(min=0)
            res2 = res2 / res2.sum() if res2.sum() > 0 else p2[x1]
            out[x1] += w * acc1 * (acc2 * torch.nn.functional.one_hot(torch.tensor(x2), n).double() + (1 - acc2) * res2)
            out += w * (1 - acc1) * res1[:, None] * p2  # rejected at 1: o1 ~ residual, o2 ~ p2(. | o1)
    return out


def test_left_to_right_unmasking_is_what_makes_the_dllm_q_valid():
    """Why the fastdllm drafter unmasks left to right when sampling (exact, by enumeration).
    Left to right: x1 ~ q1, then x2 ~ q2(. | x1), each reported with its own row: lossless.
    Any order (Fast-dLLM v2's rule): x2 unmasked first from q2, then x1 ~ q1(. | x2), reporting
    q1(. | x2) for x1 -- each token is sampled from its reported row, yet the output is biased,
    because accepting x1 depends on x2 through q1(. | x2)."""
    g = torch.Generator().manual_seed(0)
    n = 4
    rand = lambda *shape: torch.softmax(3 * torch.randn(*shape, n, generator=g, dtype=torch.float64), -1)
    p1, p2 = rand(), rand(n)
    q1, q2_given_x1 = rand(), rand(n)  # left to right
    ones = torch.ones(n, n, dtype=torch.float64)
    l2r = _two_token_output(
        p1, p2, q1[:, None] * ones, q2_given_x1, q1.expand(n, n, n), q2_given_x1[:, None].expand(n, n, n)
    )
    q2, q1_given_x2 = rand(), rand(n)  # any order: q1_given_x2[x2] is x1's row
    any_order = _two_token_output(
        p1, p2, q1_given_x2.T, q2[None, :] * ones, q1_given_x2[None].expand(n, n, n), q2.expand(n, n, n)
    )
    target = p1[:, None] * p2
    assert (l2r - target).abs().sum() / 2 < 1e-12
    assert (any_order - target).abs().sum() / 2 > 1e-3


def test_fastdllm_unmasks_left_to_right_when_sampling(models, runtime, monkeypatch):
    """Structural guard of the rule above: at every pass the masked positions of the small block
    are a suffix and the pass unmasks a prefix of them; the reported q rows are distributions
    with the drafted token in their support and the confidence is their max."""
    import specpolicy.drafters.fastdllm as fastdllm_module

    threshold = 0.5
    seen = []
    step = fastdllm_module.unmask_step

    def recording(tokens, conf, lo, block_ids, block_conf, masked, *rest):  # each pass's rule, recorded
        before = torch.from_numpy(masked[lo : lo + tokens.shape[0]].copy())
        result = step(tokens, conf, lo, block_ids, block_conf, masked, *rest)
        seen.append((before, torch.from_numpy(rest[-2][: tokens.shape[0]].copy())))  # the picks it wrote
        return result

    drafter = FastDLLMDrafter(
        models["dllm"],
        runtime,
        SimpleNamespace(mask_token_id=MASK),
        block_size=16,
        small_block_size=8,
        threshold=threshold,
    )
    monkeypatch.setattr(fastdllm_module, "unmask_step", recording)
    for seed in range(20):
        runtime.seed_everything(seed)
        drafter.prefill(torch.tensor([3, 1, 4]), sampling=TEMPERATURE)
        draft = drafter.draft(12)  # crosses the small-block and block boundaries
        assert draft.probs.shape == (12, V) and draft.probs.dtype == torch.float32
        torch.testing.assert_close(draft.probs.sum(-1), torch.ones(12))
        assert bool((draft.probs.gather(1, draft.token_ids[:, None]) > 0).all())
        torch.testing.assert_close(draft.confidences, draft.probs.max(-1).values)
    multi = 0
    for masked, pick in seen:
        m = masked.int()
        assert bool((m.cummax(0).values == m).all()), "masked positions must be a suffix"
        first = int(m.argmax())
        picked = pick[first:].int()
        assert bool(pick[:first].logical_not().all()) and picked[0] == 1
        assert bool((picked.cummin(0).values == picked).all()), "a pass unmasks a prefix of the masks"
        multi += int(picked.sum()) > 1
    assert multi > 0 and len(seen) > 40  # several passes per small block, some unmasking several tokens


# -- unit tests: settings, warp, sample, speculative_verify ------------------------------------


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"temperature": -0.1}, "generation.temperature"),
        ({"temperature": float("nan")}, "generation.temperature"),
        ({"top_k": -1}, "generation.top_k"),
        ({"top_k": 2.5}, "generation.top_k"),
        ({"top_p": 0.0}, "generation.top_p"),
        ({"top_p": 1.5}, "generation.top_p"),
    ],
)
def test_sampling_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        SamplingConfig(**kwargs)


def test_sampling_config_defaults_and_from_config():
    assert SamplingConfig().is_greedy and not SamplingConfig(temperature=0.5).is_greedy
    assert SamplingConfig.from_config(None) == SamplingConfig()
    assert SamplingConfig.from_config(
        {"max_new_tokens": 8, "temperature": 1, "top_k": 5.0, "top_p": 1}
    ) == SamplingConfig(temperature=1.0, top_k=5, top_p=1.0)
    assert SamplingConfig(temperature=0.7).describe()["mode"] == "sampling"
    with pytest.raises(ValueError, match="temperature > 0"):
        warp(torch.zeros(1, 4), SamplingConfig())
    assert prompt_seed(0, "gsm8k-3") == prompt_seed(0, "gsm8k-3") != prompt_seed(1, "gsm8k-3")


def test_warp_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    torch.testing.assert_close(warp(logits, SamplingConfig(temperature=1.0)), logits.exp().float())
    torch.testing.assert_close(warp(logits, SamplingConfig(temperature=2.0)), torch.softmax(logits / 2, -1).float())
    top2 = warp(logits, SamplingConfig(temperature=1.0, top_k=2))
    torch.testing.assert_close(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top-p keeps the smallest set of most likely tokens whose mass reaches top_p
    torch.testing.assert_close(warp(logits, SamplingConfig(temperature=1.0, top_p=0.8)), top2)
    assert int((warp(logits, SamplingConfig(temperature=1.0, top_p=0.81)) > 0).sum()) == 3
    assert int((warp(logits, SamplingConfig(temperature=1.0, top_p=1e-6)) > 0).sum()) == 1  # always the top one
    tied = warp(torch.tensor([2.0, 1.0, 1.0, 0.0]), SamplingConfig(temperature=1.0, top_k=2))
    assert (tied > 0).tolist() == [True, True, True, False]  # ties with the k-th are kept
    # top-k, then top-p on the renormalised top-k distribution (0.625 < 0.7 <= 1)
    assert int((warp(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.7)) > 0).sum()) == 2
    batch = warp(torch.randn(5, 7, dtype=torch.bfloat16), SamplingConfig(temperature=0.7, top_k=3, top_p=0.9))
    assert batch.dtype == torch.float32 and batch.shape == (5, 7)
    torch.testing.assert_close(batch.sum(-1), torch.ones(5))


def test_sample_follows_the_weights_and_never_draws_zero_weight():
    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([[0.0, 2.0, 0.0, 6.0, 0.0]]).expand(20000, 5)  # unnormalised
    draws = sample(weights, g)
    assert set(draws.tolist()) == {1, 3}
    assert abs(float((draws == 3).double().mean()) - 0.75) < 0.02
    edge = torch.tensor([[0.0, 1.0, 0.0]])
    assert all(int(sample(edge, g)[0]) == 1 for _ in range(50))


def _within(freq: float, prob: float, trials: int) -> bool:
    """``freq`` within 5 standard deviations of ``prob`` (false alarm ~ 6e-7 per check)."""
    return abs(freq - prob) <= 5 * (prob * (1 - prob) / trials) ** 0.5 + 1e-12


def test_speculative_verify_matches_leviathan_algorithm_1():
    p = torch.tensor([[0.2, 0.8, 0.0], [0.1, 0.2, 0.7]])  # position 0, then the bonus position
    q = torch.tensor([[0.6, 0.3, 0.1]])
    g, trials = torch.Generator().manual_seed(1), 6000
    fixed = [speculative_verify(p, q, torch.tensor([0]), g) for _ in range(trials)]
    # x = 0: accepted w.p. min(1, 0.2 / 0.6) = 1/3, then a bonus from p[1]; rejected: max(0, p - q) = [0, .5, 0]
    accepted = [t for a, t in fixed if a == 1]
    assert _within(len(accepted) / trials, 1 / 3, trials)
    assert all(t == 1 for a, t in fixed if a == 0)
    assert _within(accepted.count(2) / len(accepted), 0.7, len(accepted))
    # x ~ q: the emitted first token is distributed as p[0] (lossless), never token 2
    first = []
    for _ in range(trials):
        x = sample(q, g)
        a, t = speculative_verify(p, q, x, g)
        first.append(int(x[0]) if a == 1 else t)
    assert 2 not in first and _within(first.count(0) / trials, 0.2, trials)


def test_speculative_verify_point_mass_and_edge_cases():
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    g, trials = torch.Generator().manual_seed(1), 6000
    out = [speculative_verify(p, None, torch.tensor([1]), g) for _ in range(trials)]
    assert _within(sum(a for a, _ in out) / trials, 0.75, trials)  # point mass: accept w.p. p(x)
    assert {t for a, t in out if a == 0} == {0}  # rejected: never x itself
    # a one-hot q row is the same point mass
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ids = torch.tensor([1])
    for _ in range(50):
        assert speculative_verify(p, None, ids, g1) == speculative_verify(p, point_mass(ids, 2), ids, g2)
    g = torch.Generator().manual_seed(0)
    same = torch.tensor([[0.3, 0.7], [0.3, 0.7], [0.5, 0.5]])
    for _ in range(50):  # q == p: always accepted
        assert speculative_verify(same, same[:2], torch.tensor([1, 0]), g)[0] == 2
    assert speculative_verify(torch.tensor([[0.0, 1.0]]), None, torch.empty(0, dtype=torch.long), g) == (0, 1)
    zero = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    assert speculative_verify(zero, torch.tensor([[0.0, 1.0]]), torch.tensor([1]), g) == (0, 0)  # p(x) = 0
    narrow = speculative_verify(
        torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([1]), g
    )
    assert narrow == (0, 2)  # a narrower q is padded with zeros
    with pytest.raises(ValueError, match="p must be"):
        speculative_verify(torch.ones(2, 3) / 3, None, torch.tensor([0, 1]), g)
    with pytest.raises(ValueError, match="q must be"):
        speculative_verify(torch.ones(3, 3) / 3, torch.ones(1, 3) / 3, torch.tensor([0, 1]), g)


# -- drafters, reuse, the loop, the experiment -------------------------------------------------


def test_ar_drafter_reports_q_rows_and_greedy_stays_greedy(models, runtime):
    drafter = ARDrafter(models["ar"], runtime)
    drafter.prefill(PROMPT, sampling=TRUNCATED)
    draft = drafter.draft(3)
    assert draft.probs.shape == (3, V)
    assert bool((draft.probs.gather(1, draft.token_ids[:, None]) > 0).all())
    assert int((draft.probs > 0).sum(-1).max()) <= 8  # top-k = 8 applied to q
    torch.testing.assert_close(draft.confidences, draft.probs.max(-1).values)
    drafter.prefill(PROMPT)  # None: greedy again
    greedy = drafter.draft(3)
    assert greedy.probs is None


def test_reused_tokens_are_point_masses():
    reuse = DraftReuse(min_match=1)
    probs = torch.full((3, 5), 0.2)
    prev = Draft(torch.tensor([1, 2, 3]), torch.ones(3), probs=probs)
    reuse.observe(prev, Verification(accepted_length=0, next_token=4, target_token_ids=torch.tensor([4, 0, 0, 0])))
    new = Draft(torch.tensor([4, 2]), torch.ones(2), probs=torch.full((2, 5), 0.2))
    out = reuse.extend(new, room=10)
    assert out.token_ids.tolist() == [4, 2, 3] and out.reused_tokens == 1
    torch.testing.assert_close(out.probs[2], torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0]))
    greedy = reuse.extend(Draft(torch.tensor([4, 2]), torch.ones(2)), room=10)
    assert greedy.probs is None


def test_sampling_is_seeded_and_greedy_config_is_plain_greedy(models, runtime):
    verifier = HFVerifier(models["target"], runtime, frozenset())
    prompt = torch.tensor([3, 1, 4, 1, 5])

    def run(seed, sampling, drafter=True):
        runtime.seed_everything(seed)
        d, p = (_fastdllm(models, runtime), FailFastPolicy(n=2, tau=0.3, n_max=8)) if drafter else (None, None)
        return generate(
            prompt,
            verifier,
            runtime,
            max_new_tokens=24,
            drafter=d,
            policy=p,
            reuse=DraftReuse(1) if drafter else None,
            sampling=sampling,
        ).output_ids.tolist()

    assert run(1, TEMPERATURE) == run(1, TEMPERATURE)
    assert len({tuple(run(s, TEMPERATURE)) for s in range(4)}) > 1
    assert run(1, TEMPERATURE, drafter=False) == run(1, TEMPERATURE, drafter=False)
    assert run(1, SamplingConfig()) == run(2, None) == run(3, None, drafter=False)  # temperature 0 = greedy


def test_a_verifier_that_cannot_sample_is_refused_and_old_drafters_are_point_masses(models, runtime):
    class OldVerifier(HFVerifier):
        name = "old"

        def prefill(self, prompt_ids):
            super().prefill(prompt_ids)

    with pytest.raises(ValueError, match="generation.temperature"):
        generate(
            PROMPT, OldVerifier(models["target"], runtime, frozenset()), runtime, max_new_tokens=2, sampling=TEMPERATURE
        )

    class OldDrafter(ARDrafter):
        def prefill(self, prompt_ids):
            super().prefill(prompt_ids)  # greedy drafts, no probs: verified as point masses

    out = generate(
        PROMPT,
        HFVerifier(models["target"], runtime, frozenset()),
        runtime,
        max_new_tokens=6,
        drafter=OldDrafter(models["ar"], runtime),
        policy=StaticPolicy(k=2),
        sampling=TEMPERATURE,
    )
    assert len(out.output_ids) == 6


def test_experiment_records_sampling_and_does_not_report_false_lossless_failures(family, tmp_path):
    from hydra import compose, initialize_config_module

    from conftest import overrides
    from specpolicy.run.experiment import run_experiment

    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *overrides(family, drafter="drafter"),
                "policy=static",
                "policy.k=3",
                "generation.temperature=0.9",
                "generation.top_p=0.95",
                "logger=[jsonl]",
            ],
        )
    first = run_experiment(cfg, tmp_path / "a")
    assert first["sampling"] == {"temperature": 0.9, "top_k": 0, "top_p": 0.95, "mode": "sampling"}
    assert "lossless_fraction" not in first and first["lossless"] == "n/a (sampling)"
    rows = [json.loads(line) for line in (tmp_path / "a" / "results.jsonl").read_text().splitlines()]
    assert all(r["lossless"] == "n/a (sampling)" for r in rows)
    run_experiment(cfg, tmp_path / "b")  # same seed, same outputs
    again = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    assert [r["output_ids"] for r in again] == [r["output_ids"] for r in rows]
