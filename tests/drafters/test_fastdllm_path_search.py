"""The ``fastdllm`` drafter with DiffuSpec's path search (``drafter.path_search=cps``): one pass over
the block's masks, its positions unmasked as the best lattice path -- the argmax when the n-gram
has no say and every position keeps one candidate, other tokens when it does; the draft ends
where the path ends; sampled tokens are point masses; the config is checked before loading."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import VOCAB, sharpen, tiny_lm
from specpolicy.core.errors import ConfigError
from specpolicy.core.path_search import PathSearch
from specpolicy.core.sampling import SamplingConfig
from specpolicy.drafters.fastdllm import FastDLLMDrafter
from specpolicy.models.ngram import NGramModel, check_path_search

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
