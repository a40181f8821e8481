#!/usr/bin/env python
"""How close to the oracle can a length policy get with a given drafter? MODELED, offline.

    python benchmarks/ceiling.py --num-prompts 30 --max-new-tokens 256 \\
        --costs benchmarks/results/peers-gsm8k-30x256.json --out benchmarks/results/ceiling-gsm8k-30x256.json

The oracle (``specpolicy.analysis.oracle``) knows every round's accepted length before it drafts. A causal
policy knows what the drafter tells it. This benchmark measures how much of the gap between
them is the policy's rule and how much is its information, by giving ``goodput`` (the cost-aware
policy) more and more information and costing every run with ONE cost model:

* ``static-k5`` and ``failfast`` (paper defaults; the presets ``<drafter>+static-k5`` and
  ``<drafter>+failfast``, ``METHODS``): checks. Their decisions do not depend on timings,
  so their fractions reproduce the peer run's exactly when ``--costs`` is that run's JSON;
* ``goodput`` (the preset ``<drafter>+goodput``): calibration learned online as shipped, but its costs given (the cost model, as a
  hardware profile) instead of measured, so its decisions are free of timing noise; its longest
  draft is the oracle's (``max_length``), as for the variants below;
* ``goodput-hindsight``: its calibration (confidence x position -> P(accepted | earlier accepted),
  ``specpolicy.core.calibration``) fitted beforehand on the rounds of the ``goodput`` run and frozen:
  what refitting this calibration on one whole run adds;
* ``goodput-verdict``: each drafted token's confidence replaced by its *verdict* -- 1.0 when the
  target accepts it (it and every earlier draft token equal the target's greedy tokens), 0.0 when
  not -- as soon as it is drafted (decoded-ahead tokens one at a time, their verdicts not announced
  before they are taken); calibration learned online, then ``goodput-verdict-hindsight`` with it
  fitted on that run and frozen. The same rule knows then everything verification will say about
  the tokens it has drafted, and nothing about those it has not: it still pays for drafting the
  first wrong token of a round, which the oracle never does. It is one rule given the verdicts,
  not a bound over all policies.

The loop is the real one (``specpolicy.core.decoding.generate``) with the real drafter, against a
*reference verifier* that replays the target's greedy output (vanilla decoding, computed once):
the accepted length is the longest draft prefix equal to it; no target pass runs, so nothing
here is a measured time. Every run's rounds are costed by the cost model (drafter passes x ms per
pass + verification base + per-token slope: ``specpolicy.analysis.oracle.CostModel``) and compared with the
exact oracle (drafter replayed at every prefix: ``replay_match_lengths``) by
``specpolicy.analysis.oracle.compare``, as ``benchmarks/peers.py`` does. ``--costs`` takes the cost models a
peer run fitted (its JSON's ``oracle.<drafter>.cost_model``, and the oracle's ``max_length``);
without it the costs are measured here from a timed static-k5 run and vanilla steps.

Output: a printed table per drafter and ``--out`` JSON (fractions, modeled speedups, per prompt,
and where each run's modeled ms go past the accepted tokens' own: ``waste``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from specpolicy.analysis.oracle import DEFAULT_MAX_LENGTH, CostModel, compare, oracle_max_length, replay_match_lengths
from specpolicy.core.calibration import calibration_from_rounds
from specpolicy.core.decoding import generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.types import Draft, GenerationResult, Verification
from specpolicy.core.verifier import Verifier
from specpolicy.data.datasets import load_prompts

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  benchmarks/peers.py: the shared model loading and policy configs

DRAFTERS = ("fastdllm", "ar")
#: The rules costed on each drafter: ``conf/method/`` presets by name, ``<drafter>+<row>`` (the rows of
#: the table): the static and FailFast checks, and goodput, run with its costs given and its longest
#: draft the oracle's, then with more information (``goodput-hindsight``, ``goodput-verdict``, ...).
ROWS = ("static-k5", "failfast", "goodput")
METHODS = tuple(f"{d}+{row}" for d in DRAFTERS for row in ROWS)


class ReferenceVerifier(Verifier):
    """Verifies against a recorded greedy output instead of running the target.

    ``reference`` (``(n,) int64``, the target's greedy output for the prompt being decoded) is
    set before each ``generate`` call; ``verify`` accepts the longest draft prefix equal to the
    reference from the committed position and returns the reference's next token as the
    correction or bonus token. ``target_token_ids`` is the reference's window: up to the correction
    it is what the target returns; past it, where the target would read the wrong draft token, it
    is not (the policies here learn from confidences and accepted lengths only). Positions past
    the end of the reference (after its EOS) match nothing (-1).
    """

    name = "reference"

    def __init__(self, real: Verifier) -> None:
        self.tokenizer, self.eos_token_ids = real.tokenizer, real.eos_token_ids
        self.max_context, self.vocab_size = real.max_context, real.vocab_size
        self.reference = torch.empty(0, dtype=torch.long)  # (n,) int64, CPU
        self.committed = 0  # output tokens committed so far

    def prefill(self, prompt_ids: torch.Tensor, sampling=None) -> None:
        self.committed = 0

    def verify(self, draft: Draft) -> Verification:
        """Greedy only (``draft.probs`` is ignored). ``target_token_ids``: ``(k + 1,) int64`` on the
        draft's device."""
        k = draft.length
        target = torch.full((k + 1,), -1, dtype=torch.long)
        window = self.reference[self.committed : self.committed + k + 1]
        target[: window.shape[0]] = window
        accepted = int((draft.token_ids.cpu() == target[:k]).int().cumprod(0).sum())
        self.committed += accepted + 1
        return Verification(
            accepted_length=accepted,
            next_token=int(target[accepted]),
            target_token_ids=target.to(draft.token_ids.device),
        )


class VerdictDrafter(Drafter):
    """Wraps a drafter: every drafted token's confidence becomes its verdict (1.0 accepted by the
    target given the tokens before it, 0.0 not), known the moment it is drafted; decoded-ahead
    tokens are not announced (``lookahead_confidences`` None), so a policy takes them one at a time.
    ``small_block_confidences`` stay the drafter's own; greedy only (``prefill`` drops ``sampling``)."""

    name = "verdict"

    def __init__(self, inner: Drafter, verifier: ReferenceVerifier) -> None:
        self.inner, self.verifier = inner, verifier
        self.max_context = inner.max_context

    def prefill(self, prompt_ids: torch.Tensor, sampling=None) -> None:
        self.inner.prefill(prompt_ids)

    def draft(self, num_tokens: int) -> Draft:
        d = self.inner.draft(num_tokens)
        ids = d.token_ids.cpu()
        ref = self.verifier.reference[self.verifier.committed : self.verifier.committed + ids.shape[0]]
        same = torch.zeros(ids.shape[0], dtype=torch.int32)
        same[: ref.shape[0]] = (ids[: ref.shape[0]] == ref).int()
        verdict = same.cumprod(0).float().to(d.confidences.device)  # (k,) 1.0 up to the first wrong token
        return replace(d, confidences=verdict, lookahead_confidences=None)

    def commit(self, draft: Draft, verification: Verification) -> None:
        self.inner.commit(draft, verification)


def run(
    prompt_ids, references, verifier: ReferenceVerifier, drafter: Drafter, policy, runtime, max_new_tokens: int
) -> list[GenerationResult]:
    """``policy`` with ``drafter`` on every prompt (``prompt_ids``: ``(P,) int64`` each) against the
    reference verifier, ``references[i]`` (``(n,) int64``, CPU) the target's greedy output for
    prompt i. Returns one ``GenerationResult`` per prompt.

    Raises:
        RuntimeError: when an output differs from its reference (the loop would not be lossless).
    """
    out = []
    for ids, ref in zip(prompt_ids, references):
        verifier.reference = ref
        res = generate(ids, verifier, runtime, max_new_tokens=max_new_tokens, drafter=drafter, policy=policy)
        if not torch.equal(res.output_ids, ref):
            raise RuntimeError(f"{policy!r}: output differs from the reference")
        out.append(res)
    return out


def frozen(policy, results: list[GenerationResult]) -> Any:
    """``policy`` (a fresh ``goodput`` that keeps its state across prompts) with its calibration
    fitted on the rounds of ``results`` that a policy learns from (every round but each prompt's
    last; the drafter's own tokens, as ``GoodputPolicy.update`` queues them) and frozen: verified
    rounds still teach it costs, throughput and chunk sizes, never the calibration."""
    if not policy.keep_across_prompts:
        raise ValueError("frozen(): the policy must keep its calibration across prompts")
    cal = policy.calibration
    policy.calibration = calibration_from_rounds(
        [r for res in results for r in res.rounds[:-1]],
        prior_strength=cal.prior_strength,
        position_strength=cal.position_strength,
        prior_acceptance=cal.prior_acceptance,
    )
    policy.calibration.observe_many = lambda drafts: None  # the calibration stays as fitted
    return policy


def cost_models(args, bench, prompt_ids, specs: dict[str, peers.MethodSpec]) -> dict[str, tuple[CostModel, int]]:
    """Per drafter: ``(cost model, longest speculation)`` from ``--costs`` (a peer run's JSON: its
    fitted cost model and its oracle's ``max_length``), or measured here: a timed static-k5 run with
    the real target and vanilla steps, and ``DEFAULT_MAX_LENGTH``."""
    if args.costs:
        data = json.loads(Path(args.costs).read_text())["oracle"]
        return {d: (CostModel(**data[d]["cost_model"]), int(data[d]["max_length"])) for d in DRAFTERS}
    van = [
        r.verify_ms
        for ids in prompt_ids
        for r in generate(ids, bench.verifier, bench.runtime, max_new_tokens=args.max_new_tokens).rounds
    ]
    out = {}
    for d in DRAFTERS:
        rounds = [
            r
            for ids in prompt_ids
            for r in generate(
                ids,
                bench.verifier,
                bench.runtime,
                max_new_tokens=args.max_new_tokens,
                drafter=bench.drafters[d],
                policy=bench.parts(specs[f"{d}+static-k5"])[1],
            ).rounds
        ]
        out[d] = (CostModel.fit(rounds, van), DEFAULT_MAX_LENGTH)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="benchmarks/ceiling.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--costs", default=None, help="a peer run's JSON: use its fitted cost models")
    p.add_argument("--out", default="ceiling.json")
    peers.add_model_arguments(p)
    args = p.parse_args(argv)
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        p.error("--num-prompts and --max-new-tokens must be >= 1")
    specs = {name: peers.parse_method(name) for name in METHODS}  # composed before any model loads
    log = peers.start_benchmark(args.threads)
    began = time.perf_counter()
    bench = peers.Bench(args)
    prompts = load_prompts(args.dataset, None, args.num_prompts)
    prompt_ids = [q.token_ids(bench.tokenizer) for q in prompts]
    start = time.perf_counter()
    references = [
        generate(ids, bench.verifier, bench.runtime, max_new_tokens=args.max_new_tokens).output_ids
        for ids in prompt_ids
    ]
    log(f"references: {len(references)} prompts, {time.perf_counter() - start:.1f} s")
    costs = cost_models(args, bench, prompt_ids, specs)
    verifier = ReferenceVerifier(bench.verifier)
    results: dict[str, Any] = {"drafters": {}}
    for d in DRAFTERS:
        cost, cap = costs[d]
        profile = {
            "name": f"cost-model-{d}",
            "drafter_pass_ms": cost.draft_ms_per_pass,
            "target_ms_per_token": cost.verify_ms_base,
            "verify_ms_per_draft_token": cost.verify_ms_per_token,
        }
        drafter = bench.drafters[d]
        verdict = VerdictDrafter(drafter, verifier)

        def goodput(d=d, profile=profile, cap=cap):  # costs given, longest draft the oracle's
            return bench.parts(specs[f"{d}+goodput"], cost_profile=profile, max_length=cap)[1]

        runs: dict[str, list[GenerationResult]] = {}
        plans = [
            ("static-k5", drafter, lambda d=d: bench.parts(specs[f"{d}+static-k5"])[1]),
            ("failfast", drafter, lambda d=d: bench.parts(specs[f"{d}+failfast"])[1]),
            ("goodput", drafter, goodput),
            ("goodput-hindsight", drafter, lambda: frozen(goodput(), runs["goodput"])),
            ("goodput-verdict", verdict, goodput),
            ("goodput-verdict-hindsight", verdict, lambda: frozen(goodput(), runs["goodput-verdict"])),
        ]
        for name, source, make in plans:
            start = time.perf_counter()
            runs[name] = run(prompt_ids, references, verifier, source, make(), bench.runtime, args.max_new_tokens)
            log(f"{d}+{name}: {time.perf_counter() - start:.1f} s")
        # the oracle may draft as far as any run did (so it is never shorter-sighted than a policy)
        max_length = max(oracle_max_length(x for r in runs.values() for x in _rounds(r)), cap)
        start = time.perf_counter()
        match = [replay_match_lengths(drafter, ids, ref, max_length) for ids, ref in zip(prompt_ids, references)]
        log(f"{d}: oracle replay {time.perf_counter() - start:.1f} s")
        rows = {}
        for name, res_list in runs.items():
            res = compare({q.prompt_id: r for q, r in zip(prompts, res_list)}, cost, max_length, match=match)
            rounds = _rounds(res_list)
            row = {
                k: res[k]
                for k in (
                    "fraction_of_oracle",
                    "policy_speedup_modeled",
                    "oracle_speedup_modeled",
                    "policy_ms",
                    "oracle_ms",
                )
            }
            row["rounds"] = len(rounds)
            row["mean_speculation_length"] = sum(r.speculation_length for r in rounds) / len(rounds)
            row["mean_accepted_length"] = sum(r.accepted_length for r in rounds) / len(rounds)
            row["drafter_passes"] = sum(r.drafter_forward_passes for r in rounds)
            row["fraction_by_prompt"] = [q["fraction_of_oracle"] for q in res["per_prompt"]]
            row.update(waste(res_list, match, cost))
            row["fraction_without_rejected_verification"] = res["oracle_ms"] / (
                res["policy_ms"] - row["wasted_verify_ms"]
            )
            rows[name] = row
            log(f"{d}+{name}: {row['fraction_of_oracle']:.3f} of the oracle")
        results["drafters"][d] = {
            "cost_model": asdict(cost),
            "max_length": max_length,
            "policy_max_length": cap,
            "methods": rows,
        }
        peers._print_columns(
            [
                ("method", "method", ""),
                ("fraction of oracle", "", ""),
                ("MODELED speedup", "", ""),
                ("rounds", "", ""),
                ("mean spec. / acc. length", "", ""),
                ("drafter passes", "", ""),
                ("ms: all / wasted passes", "", ""),
                ("ms: rejected tokens' verification", "", ""),
            ],
            [
                [
                    n,
                    f"{r['fraction_of_oracle']:.3f}",
                    f"{r['policy_speedup_modeled']:.2f}x",
                    str(r["rounds"]),
                    f"{r['mean_speculation_length']:.2f} / {r['mean_accepted_length']:.2f}",
                    str(r["drafter_passes"]),
                    f"{r['policy_ms']:.0f} / {r['wasted_pass_ms']:.0f}",
                    f"{r['wasted_verify_ms']:.0f}",
                ]
                for n, r in rows.items()
            ],
            title=f"{d}: fraction of the oracle (MODELED: this cost model, not measured); "
            f"oracle {next(iter(rows.values()))['oracle_speedup_modeled']:.2f}x over vanilla",
        )
    results["settings"] = {
        **vars(args),
        "device": str(bench.runtime.torch_device),
        "dtype": str(bench.runtime.torch_dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "benchmark_s": time.perf_counter() - began,
        "prompt_ids": [q.prompt_id for q in prompts],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    log(f"wrote {out}")
    return results


def waste(results: list[GenerationResult], match, cost: CostModel) -> dict[str, Any]:
    """Where a run's modeled ms go beyond the accepted tokens' own.

    Args:
        results: one ``GenerationResult`` per prompt; ``match``: the same prompts' ``(M, passes)``
            from ``replay_match_lengths`` (``passes[i][l]``: drafter passes to draft ``l`` tokens at
            output position ``i``); ``cost``: the cost model (ms).
    Returns:
        ``wasted_pass_ms`` -- drafter passes past those that drafting only the accepted tokens takes,
        i.e. passes that found only rejected tokens; ``zero_accept_pass_ms`` -- the part of them
        spent in rounds that accepted nothing (``zero_accept_rounds``), where the oracle decodes
        plainly; ``wasted_verify_ms`` -- verification of rejected draft tokens (per-token slope);
        ``unmatched_rounds`` -- rounds whose accepted length the replay does not reach (a final
        round accepting a drafted EOS), counted without waste.
    """
    out = {
        "wasted_pass_ms": 0.0,
        "zero_accept_pass_ms": 0.0,
        "zero_accept_rounds": 0,
        "wasted_verify_ms": 0.0,
        "unmatched_rounds": 0,
    }
    for res, (_, passes) in zip(results, match):
        position = 0
        for r in res.rounds:
            a = r.accepted_length
            if a < len(passes[position]):
                wasted = max(r.drafter_forward_passes - passes[position][a], 0) * cost.draft_ms_per_pass
            else:
                wasted = 0.0
                out["unmatched_rounds"] += 1
            out["wasted_pass_ms"] += wasted
            out["wasted_verify_ms"] += (r.speculation_length - a) * cost.verify_ms_per_token
            if r.speculation_length and not a:
                out["zero_accept_rounds"] += 1
                out["zero_accept_pass_ms"] += wasted
            position += r.emitted_tokens
    return out


def _rounds(results: list[GenerationResult]):
    return [r for res in results for r in res.rounds]


if __name__ == "__main__":
    main()
