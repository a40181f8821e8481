"""Fast-dLLM v2 drafter: block-causal 4D mask, small-block unmasking, pass counts, extension,
KV rollback to a fresh prefill, losslessness in the loop, Fast_dLLM_v2 checkpoint loading, bad input.

Tiny float64 Qwen2 models (vocab 64, hidden 32, 2 layers) built here, so ties cannot flip.
"""

from __future__ import annotations

import functools
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen2ForCausalLM

from conftest import sharpen as scale_head, tiny_lm
from specpolicy.core.attention import as_model_mask
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import Draft, Verification
from specpolicy.drafters.fastdllm import FastDLLMDrafter, build
from specpolicy.models.fastdllm import MASK_TOKEN, block_causal_mask, mask_token_id_of
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier

VOCAB = 64
MASK = 3
TOK = SimpleNamespace(mask_token_id=MASK)  # tokenizer stand-in


def tiny(seed: int = 0, attn: str = "sdpa", max_pos: int = 512, sharpen: float = 6.0) -> Qwen2ForCausalLM:
    """``conftest.tiny_lm`` (vocabulary 64) with ``attn`` attention; ``sharpen`` scales the LM head so
    confidences spread."""
    return scale_head(tiny_lm(seed, vocab=VOCAB, max_positions=max_pos, eos=VOCAB - 1, attn=attn), sharpen)


def cycle_model(skip: tuple[int, ...] = ()) -> Qwen2ForCausalLM:
    """A context-free model that follows one fixed cycle through the 63 non-mask tokens.

    Attention and MLP outputs are zeroed, so the last hidden state is the current token's
    embedding (random unit rows; the mask token's is zero, so a masked input predicts a uniform
    distribution) and LM-head row ``next(x)`` is ``3 * embedding(x)``. As a dLLM drafter it
    decodes left to right exactly like the AR model (confidence ~1 after a known token, 1/64
    after a mask): long accepted drafts. ``skip``: tokens whose successor jumps one step ahead
    (a target that disagrees with the drafter after those tokens only).
    """
    model = tiny(0, sharpen=1.0)
    g = torch.Generator().manual_seed(7)
    order = [t for t in torch.randperm(VOCAB, generator=g).tolist() if t != MASK]
    succ = {x: order[(i + 1) % len(order)] for i, x in enumerate(order)}
    for x in skip:
        succ[x] = succ[succ[x]]
    emb = torch.randn(VOCAB, model.config.hidden_size, generator=g, dtype=torch.float64)
    emb = emb / emb.norm(dim=-1, keepdim=True)
    emb[MASK] = 0
    head = torch.zeros_like(emb)
    for x, y in succ.items():
        head[y] += 3.0 * emb[x]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(head)
    return model


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(device="cpu", dtype="float64", seed=0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest single-threaded (and do not fight the machine's other jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prompt_of(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(4, VOCAB - 1, (n,), generator=g)  # no special ids (mask, eos)
    return ids


def drafter(model, runtime, B=32, S=8, thr=0.05) -> FastDLLMDrafter:
    return FastDLLMDrafter(model, runtime, TOK, block_size=B, small_block_size=S, threshold=thr)


# -- an uncached reference Fast-dLLM v2 decoder -----------------------------------------------


@functools.cache
def ref_mask(n: int, B: int) -> torch.Tensor:
    """Block-causal mask built element by element (independent of the module's helper)."""
    return torch.tensor([[i // B >= j // B for j in range(n)] for i in range(n)])[None, None]


@torch.no_grad()
def full_logits(model, seq: list[int], B: int) -> torch.Tensor:
    """Logits of the WHOLE sequence, no cache, full block-causal mask: ``(n, V)``. The mask is
    additive (0 / -inf), which sdpa and eager attention both take."""
    n = len(seq)
    mask = torch.zeros(1, 1, n, n, dtype=torch.float64).masked_fill(~ref_mask(n, B), float("-inf"))
    out = model(input_ids=torch.tensor([seq]), attention_mask=mask, position_ids=torch.arange(n)[None])
    return out.logits[0]


@torch.no_grad()
def reference_draft(model, committed: torch.Tensor, n: int, B: int, S: int, thr: float):
    """Fast-dLLM v2 decoding of ``n`` tokens after ``committed`` recomputing everything each pass;
    a small block is decoded until the requested positions are unmasked (or it has no masks).
    Returns (tokens, confidences, passes) with the drafter's pass accounting."""
    seq, L = committed.tolist(), int(committed.shape[0])
    confs: list[float] = []
    passes = 0
    while len(seq) < L + n:
        q = len(seq)
        s = q // B * B
        if q == s:  # block start: the last logit of the previous block's pass
            probs = torch.softmax(full_logits(model, seq, B)[q - 1], -1)
            passes += q > L  # a boundary pass when the previous block was drafted this round
            seq.append(int(probs.argmax()))
            confs.append(float(probs.max()))
            continue
        a = s + (q - s) // S * S
        b = a + S
        blk = seq[s:] + [MASK] * (s + B - q)
        masked = [p >= q for p in range(s, s + B)]
        conf_at = [0.0] * B
        while any(masked[q - s : min(b, L + n) - s]):
            logits = full_logits(model, seq[:s] + blk, B)
            passes += 1
            cand = []
            for p in range(a, b):
                if masked[p - s]:
                    probs = torch.softmax(logits[p - 1], -1)
                    cand.append((float(probs.max()), p, int(probs.argmax())))
            chosen = [c for c in cand if c[0] > thr] or [max(cand)]
            if max(cand) not in chosen:
                chosen.append(max(cand))
            for c, p, t in chosen:
                blk[p - s], masked[p - s], conf_at[p - s] = t, False, c
        seq = seq[:s] + blk[: b - s]
        confs += conf_at[q - s : b - s]
    return seq[L : L + n], confs[:n], passes


# -- the 4D mask --------------------------------------------------------------------------------


def test_block_causal_mask_entries():
    m = block_causal_mask(0, 6, 6, 2)[0, 0]
    expected = torch.tensor(
        [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0], [1] * 6, [1] * 6]
    ).bool()
    assert m.shape == (6, 6) and torch.equal(m, expected)
    # Queries at absolute positions 5..8 (block size 4) over a cache of 5: block of 5..7 is [4, 8), 8 is in [8, 12).
    m = block_causal_mask(5, 4, 9, 4)[0, 0]
    assert torch.equal(m, ref_mask(9, 4)[0, 0, 5:9])
    assert m[0].tolist() == [True] * 8 + [False] and m[3].all()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_cached_block_pass_equals_uncached_block_causal_forward(runtime, attn):
    B, n = 32, 80
    model = tiny(1, attn=attn)
    d = drafter(model, runtime)
    seq = prompt_of(n)
    ref = full_logits(model, seq.tolist(), B)  # (80, V) uncached, full mask
    with torch.no_grad():
        causal = model(input_ids=seq[None]).logits[0]
    assert (ref - causal).abs().max() > 1e-3  # transformers really applies the 4D mask

    d.prefill(seq)  # cache: blocks [0, 32) and [32, 64) in one pass
    assert d.sequence.length == 64
    from specpolicy.core.attention import as_model_mask

    mask = as_model_mask(block_causal_mask(64, 16, 80, B), attn, torch.float64)
    with torch.no_grad():
        out = model(
            input_ids=seq[None, 64:],
            attention_mask=mask,
            position_ids=torch.arange(64, 80)[None],
            cache=d.sequence.cache,
            use_cache=True,
        ).logits[0]
    torch.testing.assert_close(out, ref[64:], rtol=0, atol=1e-10)

    # Bidirectional inside a block, blind to later blocks.
    seq2 = seq.clone()
    seq2[70] = (seq2[70] + 1) % 60 + 4
    ref2 = full_logits(model, seq2.tolist(), B)
    assert (ref2[65] - ref[65]).abs().max() > 1e-6  # position 65 sees 70 (same block)
    torch.testing.assert_close(ref2[:64], ref[:64], rtol=0, atol=0)  # earlier blocks do not


def test_prefill_caches_complete_blocks_only(runtime):
    model = tiny(2)
    for n in (5, 32, 33, 70):
        d = drafter(model, runtime)
        seq = prompt_of(n)
        d.prefill(seq)
        base = n // 32 * 32
        assert d.sequence.length == base
        if base:
            fresh = DynamicCache()
            with torch.no_grad():
                model(input_ids=seq[None, :base], attention_mask=ref_mask(base, 32), cache=fresh, use_cache=True)
            _assert_cache_equal(d.sequence.cache, fresh)
        assert (d._first is not None) == (n == base)


# -- drafting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("thr", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("plen,n", [(5, 10), (31, 10), (32, 12), (33, 40), (28, 40), (64, 3)])
def test_draft_matches_uncached_reference(runtime, thr, plen, n):
    model = tiny(3)
    prompt = prompt_of(plen, seed=plen)
    d = drafter(model, runtime, thr=thr)
    d.prefill(prompt)
    got = d.draft(n)
    toks, confs, passes = reference_draft(model, prompt, n, 32, 8, thr)
    assert got.token_ids.tolist() == toks
    assert got.token_ids.dtype == torch.int64 and got.confidences.dtype == torch.float32
    torch.testing.assert_close(got.confidences, torch.tensor(confs, dtype=torch.float32))
    assert got.forward_passes == passes
    assert d.sequence.length == (plen + n - 1) // 32 * 32  # tentative blocks of the draft only


def test_draft_with_other_block_sizes_matches_reference(runtime):
    model = tiny(4)
    for B, S, plen in [(8, 4, 6), (8, 2, 8), (16, 16, 3), (4, 1, 9)]:
        prompt = prompt_of(plen, seed=B)
        d = drafter(model, runtime, B=B, S=S, thr=0.05)
        d.prefill(prompt)
        got = d.draft(21)
        toks, confs, passes = reference_draft(model, prompt, 21, B, S, 0.05)
        assert got.token_ids.tolist() == toks and got.forward_passes == passes, (B, S)
    eager = tiny(4, attn="eager")  # the additive-mask path
    d = drafter(eager, runtime)
    prompt = prompt_of(30)
    d.prefill(prompt)
    toks, confs, passes = reference_draft(eager, prompt, 12, 32, 8, 0.05)
    got = d.draft(12)
    assert got.token_ids.tolist() == toks and got.forward_passes == passes


def test_pass_counts(runtime):
    model = tiny(5)
    # threshold 0: one pass per small block touched.
    d = drafter(model, runtime, thr=0.0)
    d.prefill(prompt_of(5))
    assert d.draft(3).forward_passes == 1  # positions 5..7: small block [0, 8)
    assert d.draft(1).forward_passes == 2  # position 8: small block [8, 16)
    assert d.draft(23).forward_passes == 4  # up to 30: small blocks [16, 24), [24, 32)
    # Crossing the boundary: one full-block pass writes [0, 32) and gives token 32 (no unmasking pass).
    assert d.draft(1).forward_passes == 5 and d.sequence.length == 32
    assert d.draft(1).forward_passes == 6  # position 33: small block [32, 40)

    # threshold 1: nothing exceeds it, exactly one token per pass (at least one is always unmasked).
    d = drafter(model, runtime, thr=1.0)
    d.prefill(prompt_of(5))
    draft = d.draft(3)
    assert draft.forward_passes == 3
    assert d.draft(8).forward_passes == 3 + 8  # positions 8..15: 8 masks, 8 passes
    # A draft crossing a boundary: 30, 31 (2 passes), boundary pass, 32 free, then passes until 33 and 34
    # are unmasked (any order, one per pass): 2 to 7 passes, never the whole of [33, 40) unless it must.
    d = drafter(model, runtime, thr=1.0)
    d.prefill(prompt_of(30))
    passes = d.draft(5).forward_passes
    assert passes == reference_draft(model, prompt_of(30), 5, 32, 8, 1.0)[2]
    assert 2 + 1 + 2 <= passes <= 2 + 1 + 7

    # Threshold 0.05 on a sharpened model: fewer passes than tokens, at least one per small block.
    d = drafter(model, runtime, thr=0.05)
    d.prefill(prompt_of(5))
    p = d.draft(27).forward_passes
    assert 4 <= p < 27


def test_prompt_on_block_boundary_first_token_is_prefill_logit(runtime):
    model = tiny(6)
    prompt = prompt_of(64)
    d = drafter(model, runtime, thr=0.0)
    d.prefill(prompt)
    draft = d.draft(1)
    probs = torch.softmax(full_logits(model, prompt.tolist(), 32)[-1], -1)
    assert draft.forward_passes == 0  # the first token of a block costs no pass
    assert int(draft.token_ids[0]) == int(probs.argmax())
    assert float(draft.confidences[0]) == pytest.approx(float(probs.max()), abs=1e-6)


@pytest.mark.parametrize("plen", [5, 30, 32])
def test_extension_does_not_redo_passes(runtime, plen):
    model = tiny(7)
    prompt = prompt_of(plen)
    a = drafter(model, runtime)
    a.prefill(prompt)
    a.draft(10)
    two = a.draft(10)
    b = drafter(model, runtime)
    b.prefill(prompt)
    one = b.draft(20)
    assert torch.equal(two.token_ids, one.token_ids)
    assert torch.equal(two.confidences, one.confidences)
    assert two.forward_passes == one.forward_passes
    # Look-ahead: after draft(3), the rest of the small block is decoded; draft(1) needs no pass.
    c = drafter(model, runtime, thr=0.0)
    c.prefill(prompt_of(8))  # L = 8: small block [8, 16)
    assert c.draft(3).forward_passes == 1
    ext = c.draft(4)
    assert ext.forward_passes == 1 and ext.length == 7


# -- commit / rollback ----------------------------------------------------------------------------


def _assert_cache_equal(a: DynamicCache, b: DynamicCache) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    if b.get_seq_length() == 0:
        return
    for la, lb in zip(a.layers, b.layers):
        torch.testing.assert_close(la.keys, lb.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(la.values, lb.values, rtol=0, atol=1e-10)


def _verdict(draft: Draft, accepted: int, next_token: int | None = None) -> Verification:
    """Greedy verdict: ``accepted`` tokens, then a correction (different from the draft token) or bonus."""
    k = draft.length
    if next_token is None:
        next_token = 4 + (int(draft.token_ids[accepted]) - 3) % 59 if accepted < k else 5
    target = torch.cat([draft.token_ids, torch.tensor([0])]).clone()
    target[accepted] = next_token
    return Verification(accepted, next_token, target)


def _assert_same_as_fresh(d: FastDLLMDrafter, committed: torch.Tensor, model, runtime, **kw) -> None:
    """The drafter's state equals a fresh prefill of ``committed``, and it drafts the same."""
    fresh = drafter(model, runtime, **kw)
    fresh.prefill(committed)
    assert d._L == committed.shape[0]
    assert np.array_equal(d._tail, fresh._tail)
    _assert_cache_equal(d.sequence.cache, fresh.sequence.cache)
    assert (d._first is None) == (fresh._first is None)
    if fresh._first is not None:
        assert int(d._first[0]) == int(fresh._first[0])
        assert float(d._first[1]) == pytest.approx(float(fresh._first[1]), abs=1e-6)
    carry = d._carry
    a, b = d.draft(12), fresh.draft(12)
    assert torch.equal(a.token_ids, b.token_ids)
    torch.testing.assert_close(a.confidences, b.confidences)
    assert a.forward_passes == b.forward_passes + carry


CASES = {
    # name: (prompt length, draft length, accepted, expected cache length after commit, commit passes)
    "partial": (5, 10, 3, 0, 0),
    "full": (5, 10, 10, 0, 0),
    "across-boundary-kept": (28, 10, 6, 32, 0),
    "correction-inside-tentative": (28, 10, 2, 0, 0),
    "correction-completes-tentative": (28, 10, 3, 32, 1),
    "bonus-completes-block": (28, 3, 3, 32, 1),
    "bonus-at-block-start": (28, 4, 4, 32, 1),
    "two-blocks-kept": (28, 40, 40, 64, 0),
    "second-tentative-cropped": (28, 40, 20, 32, 0),
    "prompt-on-boundary": (32, 10, 0, 32, 0),
    "reject-first-token-of-block": (60, 10, 4, 64, 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_commit_rolls_back_to_fresh_prefill(runtime, case):
    plen, k, accepted, cached, commit_passes = CASES[case]
    model = tiny(8)
    prompt = prompt_of(plen, seed=plen)
    d = drafter(model, runtime)
    d.prefill(prompt)
    draft = d.draft(k)
    verdict = _verdict(draft, accepted)
    d.commit(draft, verdict)
    committed = torch.cat([prompt, verdict.committed_tokens(draft)])
    assert d.sequence.length == cached == committed.shape[0] // 32 * 32
    assert d._carry == commit_passes
    _assert_same_as_fresh(d, committed, model, runtime)


def test_commit_of_reused_and_empty_rounds(runtime):
    model = tiny(9)
    prompt = prompt_of(28)
    d = drafter(model, runtime)
    d.prefill(prompt)
    empty = Draft.empty()
    v = _verdict(empty, 0, next_token=9)
    d.commit(empty, v)  # speculation length 0
    committed = torch.cat([prompt, torch.tensor([9])])
    draft = d.draft(2)
    reused = Draft(
        torch.cat([draft.token_ids, torch.arange(4, 44)]), torch.ones(42), draft.forward_passes, reused_tokens=40
    )
    v = _verdict(reused, 42)  # accepted past the drafter's tokens, over two block boundaries
    d.commit(reused, v)
    committed = torch.cat([committed, v.committed_tokens(reused)])
    assert committed.shape[0] == 72 and d.sequence.length == 64 and d._carry == 1  # one pass, two blocks
    _assert_same_as_fresh(d, committed, model, runtime)
    with pytest.raises(ValueError, match="drafter tokens"):
        d.commit(Draft.empty(), _verdict(Draft.empty(), 0, 9))  # this round drafted 12


def test_random_rounds_keep_cache_equal_to_fresh_prefill(runtime):
    model = tiny(10)
    rng = random.Random(0)
    prompt = prompt_of(30)
    d = drafter(model, runtime, B=16, S=4)
    d.prefill(prompt)
    committed = prompt
    for _ in range(25):
        k = rng.choice([0, 1, 3, 7, 16, 20, 33])
        draft = d.draft(k) if k else Draft.empty()
        a = rng.randint(max(0, k - 3), k) if rng.random() < 0.5 else rng.randint(0, k)
        v = _verdict(draft, a)
        d.commit(draft, v)
        committed = torch.cat([committed, v.committed_tokens(draft)])
        fresh = drafter(model, runtime, B=16, S=4)
        fresh.prefill(committed)
        _assert_cache_equal(d.sequence.cache, fresh.sequence.cache)
        assert np.array_equal(d._tail, fresh._tail)
    _assert_same_as_fresh(d, committed, model, runtime, B=16, S=4)


# -- losslessness in the loop -------------------------------------------------------------------------


def _greedy(target, runtime, prompt, n) -> torch.Tensor:
    return generate(prompt, HFVerifier(target, runtime, frozenset()), runtime, max_new_tokens=n).output_ids


@pytest.mark.parametrize(  # the fast subset: a long draft with reuse; the others slow
    "k,reuse",
    [pytest.param(10, False, marks=pytest.mark.slow), (40, True), pytest.param(10, True, marks=pytest.mark.slow)],
)
def test_generation_is_lossless(runtime, k, reuse):
    target = tiny(11, sharpen=2.0)
    model = tiny(12, sharpen=12.0)  # confident enough to unmask several tokens per pass
    for plen in (5, 31, 32, 33, 64):
        prompt = prompt_of(plen, seed=plen)
        want = _greedy(target, runtime, prompt, 40)
        got = generate(
            prompt,
            HFVerifier(target, runtime, frozenset()),
            runtime,
            max_new_tokens=40,
            drafter=drafter(model, runtime),
            policy=StaticPolicy(k),
            reuse=DraftReuse() if reuse else None,
        )
        assert torch.equal(got.output_ids, want), plen


@pytest.mark.parametrize("k", [pytest.param(10, marks=pytest.mark.slow), 40])  # the fast subset: 40
def test_generation_is_lossless_with_long_acceptance(runtime, k):
    """A drafter/target pair following one token cycle: drafts are accepted across block
    boundaries (tentative blocks kept); a target that skips after a few tokens forces
    corrections at varied offsets (tentative blocks cropped, blocks rewritten by commit)."""
    dmodel = cycle_model()
    for skip in ((), (10, 30, 50)):
        target = cycle_model(skip)
        accepted = proposed = 0
        for plen in (5, 32, 45):
            prompt = prompt_of(plen, seed=plen)
            want = _greedy(target, runtime, prompt, 100)
            got = generate(
                prompt,
                HFVerifier(target, runtime, frozenset()),
                runtime,
                max_new_tokens=100,
                drafter=drafter(dmodel, runtime),
                policy=StaticPolicy(k),
                reuse=DraftReuse(),
            )
            assert torch.equal(got.output_ids, want), plen
            accepted += sum(r.accepted_length for r in got.rounds)
            proposed += sum(r.speculation_length for r in got.rounds)
        if skip:
            assert 0.2 < accepted / proposed < 1.0
        else:
            assert accepted == proposed


# -- stopping early: requested tokens unmasked, drafted stop tokens --------------------------------


def _cycle_successors(model, start: int, n: int) -> list[int]:
    """The cycle model's next ``n`` tokens after token ``start`` (its LM-head argmax chain)."""
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    out, x = [], start
    for _ in range(n):
        x = int((head @ emb[x]).argmax())
        out.append(x)
    return out


def test_threshold_0_9_stops_once_the_requested_tokens_are_unmasked(runtime):
    """The cycle model decodes left to right at threshold 0.9 (confidence ~1 after a known token,
    1/64 after a mask), one token per pass: a draft of k tokens costs k passes, not the rest of its
    small block; an extension continues the partial small block without repeating a pass."""
    model = cycle_model()
    prompt = prompt_of(5)  # L = 5: small block [0, 8) has masks at 5, 6, 7
    d = drafter(model, runtime, thr=0.9)
    d.prefill(prompt)
    one = d.draft(1)
    assert one.forward_passes == 1  # finishing the small block would cost 3
    assert reference_draft(model, prompt, 1, 32, 8, 0.9)[2] == 1
    two = d.draft(1)  # continues the same small block: one more pass, position 6
    assert two.forward_passes == 2 and two.token_ids[:1].tolist() == one.token_ids.tolist()
    ten = d.draft(8)  # up to position 14: 5..7 (3 passes) + 8..14 (7 of the 8 of [8, 16))
    assert ten.forward_passes == 10
    assert ten.token_ids.tolist() == _cycle_successors(model, int(prompt[-1]), 10)
    # The same draft in one call spends exactly the same passes; a fresh whole-small-block decode
    # (threshold 0.9 before this change) would spend 3 + 8 = 11.
    e = drafter(model, runtime, thr=0.9)
    e.prefill(prompt)
    whole = e.draft(10)
    assert whole.forward_passes == 10 < 11
    assert torch.equal(whole.token_ids, ten.token_ids) and torch.equal(whole.confidences, ten.confidences)
    # The tokens past the draft are still masked: the look-ahead is only what was decoded.
    assert bool(e._blk_masked[15]) and not bool(e._blk_masked[14])


def test_drafter_stops_at_a_drafted_stop_token(runtime):
    model = cycle_model()
    prompt = prompt_of(5)
    chain = _cycle_successors(model, int(prompt[-1]), 12)
    stop = chain[3]  # the 4th drafted token is the stop token
    assert stop not in chain[:3]
    free = drafter(model, runtime, thr=0.05)
    free.prefill(prompt)
    assert free.draft(10).forward_passes == 10  # left to right: one token per pass
    d = FastDLLMDrafter(model, runtime, TOK, threshold=0.05, stop_token_ids=[stop])
    d.prefill(prompt)
    draft = d.draft(10)
    assert draft.token_ids.tolist() == chain[:4] and draft.ends_at_stop_token
    assert draft.forward_passes == 4  # no pass past the stop token
    again = d.draft(6)  # asking for more adds nothing and spends nothing
    assert again.token_ids.tolist() == chain[:4] and again.forward_passes == 4 and again.ends_at_stop_token
    # A stop token in the look-ahead does not end a shorter draft, and costs no pass when reached.
    plain = tiny(2)
    free = drafter(plain, runtime, thr=0.0)
    free.prefill(prompt_of(8))  # small block [8, 16); threshold 0: one pass decodes all of it
    look = free.draft(8).token_ids.tolist()
    i = next(i for i in range(1, 8) if look[i] not in look[:i])
    d = FastDLLMDrafter(plain, runtime, TOK, threshold=0.0, stop_token_ids=[look[i]])
    d.prefill(prompt_of(8))
    short = d.draft(i)
    assert short.length == i and not short.ends_at_stop_token and short.forward_passes == 1
    longer = d.draft(5)
    assert longer.token_ids.tolist() == look[: i + 1] and longer.ends_at_stop_token and longer.forward_passes == 1
    # The first token of a block (from the pass that wrote the previous block) may be the stop token.
    p32 = prompt_of(32)
    first = _cycle_successors(model, int(p32[-1]), 1)[0]
    d = FastDLLMDrafter(model, runtime, TOK, threshold=0.05, stop_token_ids=[first])
    d.prefill(p32)
    only = d.draft(10)
    assert only.token_ids.tolist() == [first] and only.ends_at_stop_token and only.forward_passes == 0


def test_loop_verifies_a_draft_ending_at_a_stop_token(runtime):
    """In the loop: drafting stops at the drafted EOS (reason ``stop_token``), the output equals the
    target's greedy output, which ends at the same EOS."""
    model = cycle_model()
    prompt = prompt_of(5)
    eos = _cycle_successors(model, int(prompt[-1]), 30)[24]
    verifier = HFVerifier(cycle_model(), runtime, frozenset({eos}))
    want = generate(prompt, verifier, runtime, max_new_tokens=60).output_ids
    assert int(want[-1]) == eos and want.shape[0] == 25
    d = FastDLLMDrafter(model, runtime, TOK, threshold=0.05, stop_token_ids=[eos])
    got = generate(prompt, verifier, runtime, max_new_tokens=60, drafter=d, policy=StaticPolicy(20), reuse=DraftReuse())
    assert torch.equal(got.output_ids, want)
    last = got.rounds[-1]
    assert last.draft_stop_reason == "stop_token" and last.finish_reason == "eos"
    # round 1 drafts 20 + bonus = 21 tokens; round 2 drafts 22..25 (25 = EOS), one pass each, none past it
    assert len(got.rounds) == 2 and last.speculation_length == 4 and last.drafter_forward_passes == 4


def test_confidence_dtype_model_breaks_bfloat16_ties_as_the_official_code():
    """bfloat16 logits whose top two softmax probabilities round to the same bfloat16 value:
    ``model`` takes the argmax of the rounded probabilities (the first index, as the official
    ``sample_with_top_p``), ``float32`` the argmax of the logits (the larger one)."""
    from specpolicy.models.fastdllm import greedy

    logits = torch.zeros(1, 64, dtype=torch.bfloat16)
    logits[0, 10], logits[0, 20] = 0.5390625, 0.54296875  # one bfloat16 step apart
    probs = torch.softmax(logits, dim=-1)
    assert probs[0, 10] == probs[0, 20]  # the tie the model dtype creates
    tok32, conf32 = greedy(logits, in_model_dtype=False)
    tokm, confm = greedy(logits, in_model_dtype=True)
    assert tok32.tolist() == [20] and tokm.tolist() == [10]
    assert conf32.dtype == confm.dtype == torch.float32
    assert float(confm) == float(probs[0, 10]) and float(conf32) != float(confm)
    # The first token of a block: argmax of the logits in both modes (the official code does not softmax it).
    assert greedy(logits, in_model_dtype=True, probs_argmax=False)[0].tolist() == [20]
    # In float64 the two modes agree (no rounding ties).
    x = torch.randn(5, 64, dtype=torch.float64)
    a, b = greedy(x, False), greedy(x, True)
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1])


def test_confidence_dtype_is_validated_and_plumbed(runtime):
    model = tiny(1)
    with pytest.raises(ValueError, match="drafter.confidence_dtype must be one of float32, model, got 'bf16'"):
        FastDLLMDrafter(model, runtime, TOK, confidence_dtype="bf16")
    with pytest.raises(ValueError, match="drafter.confidence_dtype"):  # the factory checks before loading
        build({"model": "/nonexistent", "confidence_dtype": "half"}, runtime, None)
    prompt = prompt_of(20)
    a, b = drafter(model, runtime), FastDLLMDrafter(model, runtime, TOK, confidence_dtype="model")
    a.prefill(prompt)
    b.prefill(prompt)
    da, db = a.draft(30), b.draft(30)  # float64 model: identical drafts
    assert torch.equal(da.token_ids, db.token_ids) and da.forward_passes == db.forward_passes
    torch.testing.assert_close(da.confidences, db.confidences)


def test_small_block_confidences_cover_every_masked_position_of_each_pass(runtime):
    """At threshold 0 each small block costs one pass; its record holds the confidence of every
    position that was masked (look-ahead past the draft included) and NaN for committed ones."""
    model = tiny(2)
    d = drafter(model, runtime, thr=0.0)
    d.prefill(prompt_of(5))  # small block [0, 8): maskable offsets [1, 8), committed 1..4
    draft = d.draft(4)  # positions 5..8: small blocks [0, 8) and [8, 16)
    sb = draft.extras["small_block_confidences"]
    assert sb.dtype == torch.float32 and sb.shape == (7 + 8,)
    assert torch.isnan(sb[:4]).all() and not torch.isnan(sb[4:]).any()
    torch.testing.assert_close(sb[4:7], draft.confidences[:3])  # positions 5..7
    assert float(sb[7]) == pytest.approx(float(draft.confidences[3]))  # position 8; 9..15 are look-ahead
    assert int((~torch.isnan(sb)).sum()) == 3 + 8 > draft.length


def test_failfast_small_block_scope_stops_where_the_paper_rule_continues(runtime):
    """The cycle drafter at threshold 0.05 unmasks left to right, one token per pass: each pass also
    sees the small block's still-masked positions at confidence 1/64. The paper's rule reads the
    drafted tokens (confidence ~1) and extends to N_max; the official rule reads every masked
    position of the pass and stops after the first chunk. Both are lossless."""
    from specpolicy.policies.failfast import FailFastPolicy

    prompt = prompt_of(5)
    target = HFVerifier(cycle_model(), runtime, frozenset())
    want = _greedy(cycle_model(), runtime, prompt, 45)
    for scope, first_round, reason in (("draft", 20, "n_max"), ("small_block", 4, "low_confidence")):
        policy = FailFastPolicy(n=4, tau=0.45, n_max=20, confidence_scope=scope)
        got = generate(
            prompt, target, runtime, max_new_tokens=45, drafter=drafter(cycle_model(), runtime), policy=policy
        )
        assert torch.equal(got.output_ids, want), scope
        assert got.rounds[0].speculation_length == first_round and got.rounds[0].draft_stop_reason == reason


# -- checkpoints and the factory --------------------------------------------------------------------


def _tokenizer(declare_mask: bool) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab[MASK_TOKEN] = MASK
    del vocab[f"t{MASK}"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kw = {"mask_token": MASK_TOKEN} if declare_mask else {"additional_special_tokens": [MASK_TOKEN]}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{VOCAB - 1}", **kw)


def _save_fast_dllm_layout(model, path, bd_size=32) -> None:
    """Save like Efficient-Large-Model/Fast_dLLM_v2_1.5B: Qwen2 weights, remote-code config."""
    model.save_pretrained(path)
    _tokenizer(declare_mask=False).save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(
        model_type="Fast_dLLM_Qwen",
        architectures=["Fast_dLLM_QwenForCausalLM"],
        auto_map={
            "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
            "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
        },
        bd_size=bd_size,
    )
    (path / "config.json").write_text(json.dumps(cfg))


def test_fast_dllm_v2_checkpoint_loads_as_qwen2(runtime, tmp_path):
    model = tiny(14)
    _save_fast_dllm_layout(model, tmp_path)
    verifier = SimpleNamespace(tokenizer=_tokenizer(declare_mask=False))
    d = build(config={"model": str(tmp_path), "small_block_size": 8}, runtime=runtime, verifier=verifier)
    assert isinstance(d, FastDLLMDrafter) and d.block_size == 32 and d.mask_token_id == MASK
    assert type(d.model).__name__ == "Qwen2ForCausalLM"
    loaded, orig = d.model.state_dict(), model.state_dict()
    assert loaded.keys() == orig.keys()
    for name, w in orig.items():
        assert torch.equal(loaded[name], w), name
    ref = drafter(model, runtime)
    prompt = prompt_of(20)
    d.prefill(prompt)
    ref.prefill(prompt)
    assert torch.equal(d.draft(15).token_ids, ref.draft(15).token_ids)
    with pytest.raises(ValueError, match="block_size"):
        build(config={"model": str(tmp_path), "block_size": 16}, runtime=runtime, verifier=verifier)
    other = _tokenizer(declare_mask=False)
    other.add_tokens(["an-extra-token"])
    with pytest.raises(ValueError, match="vocabulary"):
        build(config={"model": str(tmp_path)}, runtime=runtime, verifier=SimpleNamespace(tokenizer=other))


def test_mask_token_lookup():
    assert mask_token_id_of(_tokenizer(declare_mask=True)) == MASK
    assert mask_token_id_of(_tokenizer(declare_mask=False)) == MASK  # the |<MASK>| token itself
    with pytest.raises(ValueError, match="mask"):
        mask_token_id_of(SimpleNamespace(mask_token_id=None))
    from tokenizers import Tokenizer, models

    bare = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")), unk_token="a"
    )
    with pytest.raises(ValueError, match="mask"):
        mask_token_id_of(bare)


def test_bad_input(runtime):
    model = tiny(15)
    with pytest.raises(ValueError, match="mask token"):
        FastDLLMDrafter(model, runtime, SimpleNamespace(mask_token_id=None))
    with pytest.raises(ValueError, match="small_block_size"):
        FastDLLMDrafter(model, runtime, TOK, block_size=32, small_block_size=5)
    with pytest.raises(ValueError, match="small_block_size"):
        FastDLLMDrafter(model, runtime, TOK, block_size=8, small_block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        FastDLLMDrafter(model, runtime, TOK, block_size=0)
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="threshold"):
            FastDLLMDrafter(model, runtime, TOK, threshold=bad)
    with pytest.raises(ValueError, match="mask token id"):
        FastDLLMDrafter(model, runtime, SimpleNamespace(mask_token_id=VOCAB))
    d = drafter(model, runtime)
    with pytest.raises(ValueError, match="prompt_ids"):
        d.prefill(torch.zeros(0, dtype=torch.long))
    d.prefill(prompt_of(5))
    with pytest.raises(ValueError, match="num_tokens"):
        d.draft(0)


def test_context_limit(runtime):
    model = tiny(16, max_pos=64)
    d = drafter(model, runtime)
    with pytest.raises(ValueError, match="prompt_ids has 64 tokens"):
        d.prefill(prompt_of(64))
    d.prefill(prompt_of(60))
    assert d.draft(4).length == 4  # positions 60..63: block [32, 64) fits
    with pytest.raises(ValueError, match="draft of 5 tokens"):
        d.draft(1)  # position 64 needs block [64, 96)


@pytest.mark.parametrize(("S", "thr", "stops"), [(8, 0.05, ()), (32, 0.0, ()), (8, 0.9, (11, 17))])
def test_host_path_is_the_general_path(S, thr, stops):
    """One request's host path (``runners.fastdllm_host``: ``draft_alone``, ``commit_in_place`` with the
    tail left in the block and ``compiled.block_reopen``) against the general path (``_fast`` off) over
    random rounds -- extensions within a round, crossings, rejections before and after a boundary, full
    acceptances: every draft (ids, confidences, small-block confidences, look-ahead, passes, stop) and
    the state after every commit are the same, and the in-place commit is taken."""
    runtime = Runtime(device="cpu", dtype="float32", seed=0)  # the host path's: float32 logits on the CPU
    model = tiny(12).float()
    rng = random.Random(S + int(thr * 100))
    fast, slow = (
        FastDLLMDrafter(model, runtime, TOK, small_block_size=S, threshold=thr, stop_token_ids=stops) for _ in "ab"
    )
    prompt = prompt_of(21, seed=3)
    fast.prefill(prompt)
    slow.prefill(prompt)
    assert fast._fast
    slow._fast = False
    in_place = 0
    for _ in range(24):
        for _ in range(rng.choice([1, 1, 2])):  # a round's drafting calls
            n = rng.choice([1, 3, 8, 16, 30, 40])
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
            if a.ends_at_stop_token:
                break
        accepted = rng.choice([0, a.length // 2, a.length, a.length])
        verdict = _verdict(a, accepted)
        fast.commit(a, verdict)
        slow.commit(b, verdict)
        in_place += fast._tail_held is None
        assert (fast._L, fast._base, fast._carry, fast.sequence.length) == (
            slow._L,
            slow._base,
            slow._carry,
            slow.sequence.length,
        )
        held = fast._tail_held  # None: in the block's ids, the last token pending (not copied out here)
        tail = held if held is not None else np.append(fast._blk_ids[: fast._tail_len - 1], fast._pending)
        assert tail.tolist() == slow._tail.tolist()
        assert fast._first == slow._first  # (id, confidence, None) or None
        if fast._L > 120:
            break
    _assert_cache_equal(fast.sequence.cache, slow.sequence.cache)
    assert in_place > 0


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_alone_inputs_per_start_are_fresh_ones(attn):
    """``FastDLLMRunner.alone_inputs``' views kept per block start (back and forth, across the full
    ones' growth) are the all-visible mask and the positions a fresh build gives for that start."""
    runtime = Runtime(device="cpu", dtype="float32", seed=0)
    model = tiny(12).float()
    d = FastDLLMDrafter(model, runtime, TOK)
    runner, B = d.runner, d.block_size
    runner.attn = attn
    for start in (0, 32, 0, 64, 32, 256, 0, 448, 96, 32):
        mask, positions = runner.alone_inputs(start)
        fresh = as_model_mask(torch.ones(1, 1, B, start + B, dtype=torch.bool), attn, torch.float32)
        assert mask.shape == fresh.shape and torch.equal(mask, fresh)
        assert torch.equal(positions, torch.arange(start, start + B)[None])
        assert runner.alone_inputs(start)[0] is mask  # kept
