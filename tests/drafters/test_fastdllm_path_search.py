"""The ``fastdllm`` drafter with DiffuSpec's path search (``drafter.path_search=cps``): one pass over
the block's masks, its positions unmasked as the best lattice path -- the argmax when the n-gram
has no say and every position keeps one candidate, other tokens when it does; the draft ends
where the path ends; sampled tokens are point masses; the config is checked before loading."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core.errors import ConfigError
from specpolicy.core.path_search import PathSearch
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Verification
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.models.ngram import NGramModel, check_path_search
from specpolicy.runners.fastdllm_host import recent_tokens

MASK, EOS = VOCAB - 2, VOCAB - 1


def _search(lam: float, mass: float = 0.8, stops=()) -> PathSearch:
    rng = torch.Generator().manual_seed(2)
    corpus = [torch.randint(0, VOCAB - 2, (30,), generator=rng).tolist() for _ in range(40)]
    return PathSearch(
        NGramModel.build(corpus, VOCAB, 3), torch.tensor(list(stops), dtype=torch.long), mass=mass, lam=lam
    )


def _drafter(runtime, search=None, threshold=0.05, stops=()):
    model = sharpen(tiny_lm(seed=0, layers=1), 2.0)
    return FastDLLMDrafter(
        model,
        runtime,
        SimpleNamespace(mask_token_id=MASK),
        block_size=16,
        small_block_size=16,
        threshold=threshold,
        stop_token_ids=list(stops),
        path_search=search,
    )


def test_one_candidate_without_the_ngram_is_the_argmax_and_the_ngram_moves_tokens(runtime):
    prompt = torch.randint(0, VOCAB - 2, (5,), generator=torch.Generator().manual_seed(4))
    drafts = {}
    for name, drafter in [
        ("plain", _drafter(runtime, threshold=0.0)),  # one pass unmasks every mask: argmax
        ("argmax", _drafter(runtime, _search(lam=1.0, mass=1e-9))),
        ("cps", _drafter(runtime, _search(lam=0.2))),
    ]:
        drafter.prefill(prompt)
        drafts[name] = drafter.draft(10)
    assert torch.equal(drafts["argmax"].token_ids, drafts["plain"].token_ids)
    assert drafts["argmax"].forward_passes == drafts["plain"].forward_passes == 1
    assert not torch.equal(drafts["cps"].token_ids, drafts["plain"].token_ids)
    assert drafts["cps"].forward_passes == 1


def test_the_draft_ends_where_the_path_ends(runtime):
    """A path shorter than the pass's masked positions (its lattice ended: a likely stop token) ends
    the round's draft: the drafter offers no more tokens this round, however many a policy asks for,
    and no look-ahead; the next round drafts again."""

    class EndsEarly(PathSearch):
        def search_np(self, probs, context, token_ids=None):  # what the drafter calls (host arrays)
            path, q, _ = super().search_np(probs, context, token_ids)
            return path[:3], q[:3], True

    base = _search(lam=0.5)
    drafter = _drafter(runtime, EndsEarly(base.scorer, base.stop_ids, lam=0.5))
    drafter.prefill(torch.tensor([3, 4, 5, 6, 7]))
    first = drafter.draft(8)
    again = drafter.draft(5)
    assert first.length == again.length == 3 and again.lookahead == 0 and not again.ends_at_stop_token
    assert again.forward_passes == 1


def test_sampled_rounds_report_point_masses(runtime):
    drafter = _drafter(runtime, _search(lam=0.5))
    drafter.prefill(torch.tensor([3, 4, 5]), sampling=SamplingConfig(temperature=0.9, top_k=0, top_p=1.0))
    draft = drafter.draft(8)
    assert torch.equal(draft.probs.argmax(-1), draft.token_ids)
    assert torch.equal(draft.probs.sum(-1), torch.ones(draft.length, dtype=draft.probs.dtype))


@pytest.mark.parametrize(
    "config, key",
    [
        ({"path_search": "beam"}, "drafter.path_search"),
        ({"path_search": "cps", "cps_mass": 0}, "drafter.cps_mass"),
        ({"path_search": "cps", "cps_width": 0}, "drafter.cps_width"),
        ({"path_search": "cps", "cps_lambda": 1.5}, "drafter.cps_lambda"),
        ({"path_search": "cps", "ngram": "/no/such.npz"}, "drafter.ngram"),
    ],
)
def test_path_search_settings_are_checked_in_one_line(config, key):
    with pytest.raises(ConfigError) as info:
        check_path_search(config)
    assert str(info.value).startswith(key) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("S", "lam", "mass", "stops"), [(16, 0.5, 0.8, ()), (4, 0.3, 0.95, (EOS,)), (16, 0.5, 0.2, (7, 11))]
)
def test_the_host_path_with_a_path_search_is_the_general_path(S, lam, mass, stops):
    """One request's host path with the path search (``fastdllm_host``: ``draft_alone`` through
    ``search_apply`` on the pass's own logits and the kept softmax buffer, ``commit_in_place`` with the
    n-gram context left in the block) against the general path (``_fast`` off) over random rounds --
    extensions, crossings, rejections, full acceptances, paths that end early: every draft, the
    n-gram context after every commit and the cache are the same, and both host steps are taken."""
    runtime = Runtime(device="cpu", dtype="float32", seed=0)
    model = sharpen(tiny_lm(seed=1, layers=1), 1.5).float()
    search = _search(lam=lam, mass=mass, stops=stops)
    fast, slow = (
        FastDLLMDrafter(
            model, runtime, SimpleNamespace(mask_token_id=MASK), block_size=16, small_block_size=S,
            stop_token_ids=list(stops), path_search=search,
        )
        for _ in "ab"
    )  # fmt: skip
    prompt = torch.randint(0, VOCAB - 2, (19,), generator=torch.Generator().manual_seed(S))
    fast.prefill(prompt)
    slow.prefill(prompt)
    assert fast._fast
    slow._fast = False
    rng = random.Random(S)
    in_place = ended = 0
    for _ in range(30):
        for _ in range(rng.choice([1, 1, 2])):
            n = rng.choice([1, 3, 8, 16, 24])
            a, b = fast.draft(n), slow.draft(n)
            assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.confidences, b.confidences)
            sa, sb = a.extras["small_block_confidences"], b.extras["small_block_confidences"]
            assert torch.equal(sa.isnan(), sb.isnan()) and torch.equal(sa.nan_to_num(), sb.nan_to_num())
            assert (a.lookahead, a.forward_passes, a.ends_at_stop_token) == (
                b.lookahead,
                b.forward_passes,
                b.ends_at_stop_token,
            )
            assert torch.equal(a.lookahead_confidences, b.lookahead_confidences)
            ended += fast._path_len is not None
        accepted = rng.choice([0, a.length // 2, a.length, a.length])
        nxt = 4 + (int(a.token_ids[accepted]) - 3) % 50 if accepted < a.length else 5
        target = torch.cat([a.token_ids, torch.tensor([0])])
        target[accepted] = nxt
        verdict = Verification(accepted, nxt, target)
        fast.commit(a, verdict)
        slow.commit(b, verdict)
        in_place += fast._recent is None
        assert recent_tokens(fast).tolist() == slow._recent.tolist()
        assert (fast._L, fast._base, fast.sequence.length) == (slow._L, slow._base, slow.sequence.length)
        if fast._L > 200:
            break
    assert in_place > 0 and (ended > 0 or not stops)


def test_the_kept_softmax_is_torch_softmax():
    """``search_apply``'s softmax into a kept buffer (``torch._softmax(..., out=)``) after the in-place
    fill of the mask column: bit for bit ``torch.softmax`` of the filled copy, ties and extremes included."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 9, 301, generator=g) * 8
    logits[0, 2] = 0.5  # a flat row
    logits[0, 3, :40] = 30.0  # ties at the top
    expected = torch.softmax(logits[0, 1:].index_fill(-1, torch.tensor([7]), -torch.inf), -1)
    out = torch.empty(1, 12, 301)
    rows = logits.narrow(-2, 1, 8)
    rows.index_fill_(-1, torch.tensor([7]), -torch.inf)
    torch._softmax(rows, -1, False, out=out[:, :8])
    assert np.array_equal(out[0, :8].numpy().view(np.int32), expected.numpy().view(np.int32))
