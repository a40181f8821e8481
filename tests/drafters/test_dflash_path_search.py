"""The ``dflash`` drafter with DiffuSpec's path search (``drafter.path_search=cps``) on one request's
host path: ``_pass_alone`` (the softmax into a kept buffer, the search on its host view) drafts what
the general step (``_step``) drafts, and the commit keeps the search's n-gram context -- the last
committed tokens, the pending one last -- from the path on the host, written in place."""

from __future__ import annotations

import random

import pytest
import torch

from conditioned_reference import write_dflash_checkpoint
from conftest import EOS, VOCAB, sharpen, tiny_lm
from specpolicy.core.path_search import PathSearch
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Verification
from specpolicy.drafters.dflash import DFlashDrafter
from specpolicy.models.dflash import load_dflash
from specpolicy.models.ngram import NGramModel

B, MASK, LAYER_IDS = 8, 5, [0, 2]
DRAFT_VOCAB = sorted(set(range(0, VOCAB, 2)) | {EOS})


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=4, vocab=VOCAB).float(), 4.0)


@pytest.fixture(scope="module", params=["official", "draft-vocab"])
def checkpoint(tmp_path_factory, request):
    vocab = DRAFT_VOCAB if request.param == "draft-vocab" else None
    return write_dflash_checkpoint(
        tmp_path_factory.mktemp("dflash"), 32, VOCAB, 4, LAYER_IDS, B, MASK, draft_vocab=vocab
    )


def _features(target, seq, start, stop):
    hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0, start:stop] for i in LAYER_IDS], -1)


def _cps(checkpoint, target, runtime, search):
    model = load_dflash(checkpoint).to(runtime.torch_dtype)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    return DFlashDrafter(model, emb, head, runtime, frozenset([EOS]), path_search=search)


@torch.no_grad()
def test_the_host_path_with_a_path_search_is_the_general_step(checkpoint, target):
    runtime = Runtime(device="cpu", dtype="float32", seed=0)
    rng = torch.Generator().manual_seed(3)
    corpus = [torch.randint(6, VOCAB - 1, (30,), generator=rng).tolist() + [EOS] for _ in range(40)]
    search = PathSearch(NGramModel.build(corpus, VOCAB, 3), torch.tensor([EOS]), lam=0.4)
    fast, slow = _cps(checkpoint, target, runtime, search), _cps(checkpoint, target, runtime, search)
    slow._pass_alone = lambda: DFlashDrafter._step([slow])  # the general step, one request
    committed = torch.randint(6, VOCAB - 1, (9,), generator=torch.Generator().manual_seed(5))
    for d in (fast, slow):
        d.prefill(committed, features=_features(target, committed, 0, 8))
    assert fast._probs_out is not None
    pick = random.Random(1)
    in_place = 0
    for _ in range(12):
        n = pick.choice([1, 3, B - 1, 2 * B])
        a, b = fast.draft(n), slow.draft(n)
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.confidences, b.confidences)
        assert (a.forward_passes, a.ends_at_stop_token, a.lookahead) == (
            b.forward_passes,
            b.ends_at_stop_token,
            b.lookahead,
        )
        accepted = pick.choice([0, a.length // 2, a.length])
        nxt = 6 + (int(a.token_ids[accepted]) + 1) % (VOCAB - 8) if accepted < a.length else 7
        new = torch.cat([committed, a.token_ids[:accepted], torch.tensor([nxt])])
        targets = torch.cat([a.token_ids, torch.tensor([0])])
        targets[accepted] = nxt
        features = _features(target, new, committed.shape[0] - 1, new.shape[0] - 1)
        in_place += fast._ctx_cells is not None and len(fast._paths) == 1
        for d, draft in ((fast, a), (slow, b)):
            d.commit(draft, Verification(accepted, nxt, targets, features=features))
        committed = new
        assert fast._ctx.tolist() == slow._ctx.tolist() == committed[-2:].tolist()
        assert fast.ngram_context.tolist() == slow.ngram_context.tolist()
    assert in_place > 0
