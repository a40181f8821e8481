"""``policy=failfast-tree`` and ``policy=block-tree`` with the ``dflash`` (and ``eagle3``) drafters:
the tree's shape (FailFast's chain plus sibling leaves at unsure positions; best-first over one
block's marginals), one drafter pass per block, lossless through the loop greedy and sampling;
branching off is exactly the chain policy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from conditioned_reference import write_dflash_checkpoint, write_eagle3_checkpoint
from conftest import EOS, VOCAB, random_prompts, sharpen, tiny_lm
from specpolicy.core import tree
from specpolicy.core.decoding import generate
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.drafters.dflash import DFlashDrafter
from specpolicy.drafters.eagle3 import Eagle3Drafter
from specpolicy.models.dflash import load_dflash
from specpolicy.models.eagle3 import load_eagle3
from specpolicy.models.ngram import NGramModel
from specpolicy.policies.block_tree import BlockTreePolicy
from specpolicy.policies.dart_tree import DartTreePolicy
from specpolicy.policies.failfast import FailFastPolicy
from specpolicy.policies.failfast_tree import FailFastTreePolicy
from specpolicy.verifiers.hf import HFVerifier

B = 8
#: an order-3 n-gram over the tiny vocabulary, for DART's tree over DFlash's block
NGRAM = NGramModel.build([torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(1)).tolist()], VOCAB)


@pytest.fixture(scope="module")
def target():
    return sharpen(tiny_lm(0, layers=4, vocab=VOCAB).double(), 4.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return (
        write_dflash_checkpoint(d / "dflash", 32, VOCAB, 4, [0, 2], B, 5),
        write_eagle3_checkpoint(d / "eagle3", 32, VOCAB, VOCAB, layer_ids=[1, 2, 3]),
    )


def _drafter(kind, checkpoints, target, rt, stop=frozenset({EOS})):
    if kind == "dflash":
        return DFlashDrafter(
            load_dflash(checkpoints[0]).double(),
            target.get_input_embeddings(),
            target.get_output_embeddings(),
            rt,
            stop,
        )
    return Eagle3Drafter(
        load_eagle3(checkpoints[1]).double(), target.get_input_embeddings(), (1, 2, 3), VOCAB, rt, stop
    )


def test_failfast_tree_is_the_chain_plus_siblings_where_unsure(target, checkpoints):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())
    prompt = torch.tensor([3, 17, 9, 22, 41])
    verifier.request_features((1, 3))
    verifier.prefill(prompt)
    policy = FailFastTreePolicy(n=4, tau=0.5, n_max=12, branch_k=3, max_nodes=20)
    chain_drafter, tree_drafter = (_drafter("dflash", checkpoints, target, rt, frozenset()) for _ in range(2))
    for d in (chain_drafter, tree_drafter):
        d.prefill(prompt, features=verifier.prompt_features)
    from specpolicy.core.decoding import draft_round

    chain, _ = draft_round(chain_drafter, FailFastPolicy(n=4, tau=0.5, n_max=12), 100, "cpu")
    draft, _ = policy.draft_tree(tree_drafter, 100, 100)
    k = chain.length
    assert torch.equal(draft.token_ids[:k], chain.token_ids)  # the chain first
    assert draft.parents[:k].tolist() == list(range(-1, k - 1))
    ids, probs = chain_drafter.alternatives(3)
    unsure = [j for j in range(k) if float(chain.confidences[j]) < 0.5]
    want = [(j - 1, int(ids[j, r])) for j in unsure for r in (1, 2) if int(ids[j, r]) != int(chain.token_ids[j])]
    got = list(zip(draft.parents[k:].tolist(), draft.token_ids[k:].tolist()))
    assert got == want[: 20 - k] and draft.length <= 20
    assert draft.forward_passes == chain.forward_passes


def test_block_tree_is_best_first_over_the_blocks_marginals(target, checkpoints):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())
    prompt = torch.tensor([3, 17, 9, 22, 41])
    verifier.request_features((1, 3))
    verifier.prefill(prompt)
    drafter = _drafter("dflash", checkpoints, target, rt, frozenset())
    drafter.prefill(prompt, features=verifier.prompt_features)
    draft, _ = BlockTreePolicy(depth=B - 1, top_k=3, total_tokens=12).draft_tree(drafter, 100, 100)
    assert draft.length == 12 and draft.forward_passes == 1
    tree.validate(draft.parents, 12)
    ids, probs = drafter.alternatives(3)
    depth = tree.depths(draft.parents)
    logp = probs.log()
    # a node's confidence is its path's probability: the product of the marginals along it
    for i in range(12):
        path = tree.path_to(i, draft.parents.tolist())
        score = sum(float(logp[d, (ids[d] == draft.token_ids[j]).int().argmax()]) for d, j in enumerate(path))
        assert float(draft.confidences[i]) == pytest.approx(torch.tensor(score).exp().item(), rel=1e-6)
        assert int(depth[i]) == len(path)
    # best-first: no candidate left outside the tree (a top-3 child of the root or of a node not at
    # the block's end, not already in the tree) scores above the tree's worst node
    worst = float(draft.confidences.min())
    parents, tokens = draft.parents.tolist(), draft.token_ids.tolist()
    frontier = []
    for parent, score, d in [(-1, 1.0, 0)] + [(i, float(draft.confidences[i]), int(depth[i])) for i in range(12)]:
        if d >= B - 1:
            continue
        taken = {tokens[j] for j in range(12) if parents[j] == parent}
        frontier += [score * float(probs[d, r]) for r in range(3) if int(ids[d, r]) not in taken]
    assert frontier and max(frontier) <= worst * (1 + 1e-9)


@pytest.mark.parametrize(
    "kind, policy",
    # the fast subset: FailFast's tree on each drafter and the block tree; the second FailFast tree
    # and DART's search over DFlash's block (its own tests: tests/policies/test_dart_tree.py) slow
    [
        pytest.param(kind, policy, marks=() if i == 0 else pytest.mark.slow)
        for kind in ("dflash", "eagle3")
        for i, policy in enumerate(
            (
                FailFastTreePolicy(n=3, tau=0.6, n_max=12, branch_k=3),
                FailFastTreePolicy(n=4, tau=0.0, n_max=20, branch_tau=0.9, max_nodes=10),
            )
        )
    ]
    + [("dflash", BlockTreePolicy(depth=B - 1, top_k=2, total_tokens=10))]
    # DART's search over DFlash's block: the best-first path (beams as wide as the tree) and the beams
    + [
        pytest.param(
            "dflash",
            DartTreePolicy(top_k=4, beam_width=width, total_tokens=10, ngram_model=NGRAM),
            marks=pytest.mark.slow,
        )
        for width in (10, 3)
    ],
)
def test_tree_policies_are_lossless(target, checkpoints, kind, policy):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    for prompt in random_prompts(4):
        drafter = _drafter(kind, checkpoints, target, rt)
        out = generate(prompt, verifier, rt, max_new_tokens=30, drafter=drafter, policy=policy)
        assert torch.equal(out.output_ids, generate(prompt, verifier, rt, max_new_tokens=30).output_ids)


def test_dflash_gives_dart_tree_its_ngram_context_and_one_pass(target, checkpoints):
    """The committed tokens, the pending one last, follow the rounds; one pass gives B - 1 depths."""
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter("dflash", checkpoints, target, rt, stop=frozenset())
    seen, prompt, policy = [], random_prompts(1)[0], DartTreePolicy(top_k=3, total_tokens=8, ngram_model=NGRAM)
    remember = lambda r: seen.append((r, drafter.ngram_context.tolist()))  # noqa: E731
    out = generate(prompt, verifier, rt, max_new_tokens=20, drafter=drafter, policy=policy, on_round=remember)
    text, emitted = prompt.tolist() + out.output_ids.tolist(), len(prompt)
    assert len(seen) > 2
    for record, context in seen[:-1]:  # the last round's output may be cut at max_new_tokens
        emitted += record.emitted_tokens
        assert context == text[:emitted][-9:]  # after a round: the last 9 tokens, its bonus token last
        assert record.drafter_forward_passes == 1
        assert max(len(p) for p in _paths(record)) <= B - 1
    # a second request on the same drafter starts from its own prompt alone
    other = torch.tensor([5, 8, 13])
    generate(other, verifier, rt, max_new_tokens=2, drafter=drafter, policy=policy, on_round=remember)
    assert seen[-1][1][: len(other)] == other.tolist() and len(seen[-1][1]) <= len(other) + 2


def _dart_tree_rounds(target, checkpoints, total, prepare):
    """The rounds (trees, confidences, accepted paths) of DART's tree over DFlash's block on one prompt,
    24 tokens, after ``prepare(policy, drafter)`` (a variant of the policy's adoption)."""
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter("dflash", checkpoints, target, rt, stop=frozenset())
    policy = DartTreePolicy(top_k=3, beam_width=2, total_tokens=total, ngram_model=NGRAM)
    prepare(policy, drafter)
    out = generate(random_prompts(1)[0], verifier, rt, max_new_tokens=24, drafter=drafter, policy=policy)
    return [(r.draft_token_ids, r.draft_parents, r.confidences, r.accepted_path) for r in out.rounds]


def _after_adoption(policy, then):
    """``policy._adopt`` followed by ``then(policy)`` on every adoption."""
    adopt = policy._adopt

    def adopted(d):
        adopt(d)
        then(policy)

    policy._adopt = adopted


@pytest.mark.parametrize("total", [8, 2])  # beams narrower than the tree (8 > top_k), then as wide
def test_dart_tree_off_the_host_path_is_the_host_path(target, checkpoints, total):
    """The search off the CPU (the pass's tensors read to the host, the tree moved back:
    ``_draft_on_device``, run here on CPU tensors) gives the rounds the host path gives (numpy
    views, the drafter's host n-gram context): the same trees, confidences and outputs."""
    runs = [
        _dart_tree_rounds(
            target,
            checkpoints,
            total,
            lambda policy, drafter, on_host=on_host: _after_adoption(policy, lambda p: setattr(p, "_on_host", on_host)),
        )
        for on_host in (True, False)
    ]
    assert runs[0] == runs[1] and any(len(parents) > 1 for _, parents, _, _ in runs[0])


@pytest.mark.parametrize("total", [8, 2])  # beams narrower than the tree (8 > top_k), then as wide
def test_dart_tree_packs_its_searches_when_it_adopts_a_drafter(target, checkpoints, total):
    """The searches' states are packed for the drafter's block when the policy adopts it (not in the
    first round that reaches a new depth): the same states a round packs, and the same rounds as a
    policy that packs them in its rounds (its states reset to one depth after the adoption)."""

    def packed_on_adoption(policy, drafter):
        policy._adopt(drafter)
        for best_first, (depths, state) in policy._searches.items():
            assert depths == drafter.tokens_per_pass
            assert np.array_equal(state, policy._search_state(best_first, depths)[1])

    def packed_in_rounds(policy, drafter):
        _after_adoption(policy, lambda p: setattr(p, "_searches", {bf: p._search_state(bf, 1) for bf in (False, True)}))

    runs = [
        _dart_tree_rounds(target, checkpoints, total, prepare) for prepare in (packed_on_adoption, packed_in_rounds)
    ]
    assert runs[0] == runs[1] and any(len(parents) > 1 for _, parents, _, _ in runs[0])


@pytest.mark.parametrize("read_every", [1, 5, 40])
def test_dflash_ngram_context_after_chain_rounds(target, checkpoints, read_every):
    """On chain rounds the CPU drafter keeps the commits as they came and reads them when asked
    (or every ``HISTORY_FOLD`` commits): the context is the last committed tokens, the pending one
    last, whether it is read every round, now and then, or once after 40 rounds."""
    from specpolicy.policies.static import StaticPolicy

    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset())
    drafter = _drafter("dflash", checkpoints, target, rt, stop=frozenset())
    prompt, emitted, reads = random_prompts(1)[0], [], []
    text = prompt.tolist() + generate(prompt, verifier, rt, max_new_tokens=60).output_ids.tolist()

    def remember(record):
        emitted.append(record.emitted_tokens)
        if len(emitted) % read_every == 0:
            reads.append((drafter.ngram_context.tolist(), text[: len(prompt) + sum(emitted)][-9:]))

    generate(prompt, verifier, rt, max_new_tokens=60, drafter=drafter, policy=StaticPolicy(3), on_round=remember)
    reads = reads[:-1] if len(emitted) % read_every == 0 else reads  # the last round's output may be cut
    assert len(emitted) > 40 and reads and all(got == want for got, want in reads), reads


def _paths(record):
    """Every root-to-node path of a round's tree."""
    paths: dict[int, tuple] = {}
    for i, (t, p) in enumerate(zip(record.draft_token_ids, record.draft_parents)):
        paths[i] = (paths[p] if p >= 0 else ()) + (t,)
    return list(paths.values())


def test_failfast_tree_with_sampling_runs(target, checkpoints):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    drafter = _drafter("dflash", checkpoints, target, rt)
    out = generate(
        torch.tensor([4, 9, 2, 30]),
        verifier,
        rt,
        max_new_tokens=20,
        drafter=drafter,
        policy=FailFastTreePolicy(n=3, tau=0.9, n_max=9),
        sampling=SamplingConfig(0.9, 8, 1.0),
    )
    assert out.generated_tokens == 20 or out.finish_reason == "eos"


def test_branch_k_one_is_failfast(target, checkpoints):
    rt = Runtime(device="cpu", dtype="float64", seed=0)
    verifier = HFVerifier(target, rt, frozenset({EOS}))
    prompt = random_prompts(1)[0]
    rounds = [[], []]
    for i, policy in enumerate(
        (FailFastPolicy(n=3, tau=0.4, n_max=9), FailFastTreePolicy(n=3, tau=0.4, n_max=9, branch_k=1))
    ):
        generate(
            prompt,
            verifier,
            rt,
            max_new_tokens=24,
            drafter=_drafter("dflash", checkpoints, target, rt),
            policy=policy,
            on_round=rounds[i].append,
        )
    assert [r.draft_token_ids for r in rounds[0]] == [r.draft_token_ids for r in rounds[1]]


class _BlockOn:
    """A block drafter's round as the tree policies read it -- one pass's chain and its top-k per
    position -- on ``device``, with a ``runtime`` attribute only when given one (a third-party drafter
    may carry none: the policies then take the device its drafts are on)."""

    tokens_per_pass, stop_token_ids = 4, ()

    def __init__(self, device, runtime=None):
        self.device = torch.device(device)
        if runtime is not None:
            self.runtime = runtime
        g = torch.Generator().manual_seed(3)
        self._probs = torch.softmax(3 * torch.randn(4, 6, generator=g), dim=-1).sort(dim=-1, descending=True)
        self._ids = torch.randperm(VOCAB, generator=g)[:24].view(4, 6)

    def draft(self, n):
        from specpolicy.core.types import Draft

        ids = self._ids[:n, 0].to(self.device)
        return Draft(token_ids=ids, confidences=self._probs.values[:n, 0].float().to(self.device), forward_passes=1)

    def alternatives(self, k):
        return self._ids[:, :k].to(self.device), self._probs.values[:, :k].float().to(self.device)

    @property
    def ngram_context(self):
        return torch.tensor([3, 17, 9], device=self.device)

    def ngram_context_np(self):
        return np.array([3, 17, 9], dtype=np.int64)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))],
)
@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockTreePolicy(depth=4, top_k=3, total_tokens=8),
        lambda: DartTreePolicy(top_k=3, beam_width=2, total_tokens=8, ngram_model=NGRAM),
    ],
    ids=["block-tree", "dart-tree"],
)
def test_a_drafter_without_a_runtime_gets_its_tree_on_its_drafts_device(device, make):
    """A drafter with no ``runtime`` (a third-party one): the block and DART trees take the device of
    its drafts -- the search on the host, the tree back on that device -- and are the trees a drafter
    with a runtime on that device gets."""
    trees = []
    for runtime in (Runtime(device=device, dtype="float32", seed=0), None):
        drafter = _BlockOn(device, runtime)
        draft, stop = make().draft_tree(drafter, 100, 100)
        assert draft.token_ids.device.type == draft.parents.device.type == torch.device(device).type, stop
        trees.append((draft.token_ids.tolist(), draft.parents.tolist(), draft.confidences.tolist()))
    assert trees[0] == trees[1] and len(trees[0][0]) == 8 and any(p >= 0 for p in trees[0][1])


@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockTreePolicy(depth=4, top_k=3, total_tokens=8),
        lambda: DartTreePolicy(top_k=3, beam_width=2, total_tokens=8, ngram_model=NGRAM),
    ],
    ids=["block-tree", "dart-tree"],
)
def test_a_runtime_less_drafter_s_tree_goes_back_to_its_drafts_device_not_the_cpu(make):
    """Runs on the CPU: a runtime-less drafter whose drafts are on torch's ``meta`` device (its
    alternatives on the CPU, so the search reads them): the tree is built off the host path and
    moved to ``meta``, where a policy that assumed the CPU would leave it."""

    class MetaDrafts(_BlockOn):
        def draft(self, n):
            draft = super().draft(n)
            return replace(draft, token_ids=draft.token_ids.to("meta"), confidences=draft.confidences.to("meta"))

    policy = make()
    draft, stop = policy.draft_tree(MetaDrafts("cpu"), 100, 100)
    assert draft.token_ids.device.type == draft.parents.device.type == "meta", stop
    assert draft.token_ids.shape == (8,) and draft.parents.shape == (8,)
    on_cpu, _ = make().draft_tree(_BlockOn("cpu"), 100, 100)  # the same search, the tree on the CPU
    assert on_cpu.token_ids.shape == (8,)


def test_an_empty_tree_on_a_device_the_policy_guessed_is_the_runs_empty_draft():
    """A round with no room (``draft_tree`` at depth 0) before a runtime-less drafter's first draft:
    the policy cannot know the drafter's device and returns an empty draft elsewhere (here ``meta``;
    the CPU beside a CUDA verifier); the loop hands the verifier the run's empty draft instead. A
    tree it drafted is left where it is."""
    from specpolicy.core.loop import _InFlight, draft_rows
    from specpolicy.core.types import Draft

    class EmptyElsewhere(BlockTreePolicy):
        def draft_tree(self, drafter, room, node_room):
            if room < 1:
                return Draft.empty("meta"), "room"
            return super().draft_tree(drafter, room, node_room)

    policy = EmptyElsewhere(depth=4, top_k=3, total_tokens=8)
    request = _InFlight(0, 1, 100, _BlockOn("cpu"), policy, None, None, 0.0, 0.0, drafts_tree=True)
    (empty,), (stop,) = draft_rows([request], [0], [100], torch.device("cpu"), [[]])
    assert stop == "room" and empty.length == 0 and empty.token_ids.device.type == "cpu"
    (tree,), _ = draft_rows([request], [100], [100], torch.device("meta"), [[]])
    assert tree.length == 8 and tree.token_ids.device.type == "cpu"  # drafted: not moved
