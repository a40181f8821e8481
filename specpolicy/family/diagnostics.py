"""Drafter diagnostics: how far one-pass drafts hold, and whether their confidence can be trusted.

Usage::

    python -m specpolicy.family.diagnostics --drafter dllm-drafter --out diag.json
    python -m specpolicy.family.diagnostics --kind dflash --out dflash.json --in-loop
    python -m specpolicy.family.diagnostics --kind eagle3 --out eagle3.json
    python -m specpolicy.family.diagnostics --kind dart --in-loop --out dart.json
    python -m specpolicy.family.diagnostics --kind falcon --in-loop --out falcon.json
    python -m specpolicy.family.diagnostics --kind deer --in-loop --out deer.json
    python -m specpolicy.family.diagnostics --drafter /path/to/dllm-drafter --in-loop
    python -m specpolicy.family.diagnostics --results outputs/<run>/results.jsonl

``--kind`` picks the drafter: ``fastdllm`` (the default), ``deer`` (DEER's one-step dLLM drafter,
threshold 0, one pass per block of 32), or ``dflash`` / ``eagle3`` / ``dart`` / ``falcon``, which read
the target's hidden states: each start position gets the target's features of its committed prefix,
as the loop's verifier hands them over. A DFlash draft of 64 tokens is one pass per block of B - 1
(extension passes past the first); an EAGLE-3 draft is a chain (one pass per token); a DART draft
is one pass per d = 8 tokens (past 8, later passes conditioned on the drafted tokens, as in a
``policy=static`` chain: ``drafters/dart.py``); a Falcon draft one pass per k = 2 tokens
(semi-autoregressive, ``drafters/falcon.py``). Every kind but ``fastdllm`` is drafted as a chain
policy asks for it, length by length (8, 16, 32, ``max_distance``), which gives ``passes_by_length``.

The drafter is run exactly as the ``fastdllm`` drafter runs it in the loop
(:class:`specpolicy.drafters.fastdllm.FastDLLMDrafter`, float32 on CPU, block 32, small block 8,
unmask threshold 0.05: one pass per small block, FailFast arXiv 2512.20573 §4.1). For each
prompt the target's greedy output (fp32, ``max_new_tokens``) is the reference. From every
``stride``-th response position ``c`` the drafter is prefilled with ``prompt + output[:c]``
(the committed prefix) and drafts ``max_distance`` tokens in one call. Measured, per data set:

* ``agreement[d-1]``, d = 1..``max_distance``: share of drafts whose token at distance d
  (position ``c + d - 1``) equals the target's greedy token there (unconditional: earlier
  draft tokens may be wrong), over drafts that reach a position of the output;
* ``longest_correct_prefix[n]`` for n in ``draft_lengths`` (8/16/32/64): mean length of the
  longest prefix of the first n draft tokens that equals the target's tokens -- the accepted
  length of a greedy verification of that draft, bonus token excluded (a draft running past
  the end of the output counts only the positions the output has);
* ``passes_by_length[n]`` (every kind but ``fastdllm``): mean drafter forward passes of an n-token draft;
* calibration of the confidence (the max probability of the pass that unmasked each token)
  against correctness: ``ece`` (expected calibration error, 10 equal-width bins, Guo et al.
  2017) over all distances 1..``calibration_distance``, ``ece_by_distance``, and the per-bin
  table ``reliability`` (mean confidence, accuracy, count);
* ``mean_confidence_by_distance`` beside ``agreement`` (over- or under-confidence per distance);
* the same conditioned on an accepted prefix -- ``agreement_given_prefix_correct[d-1]`` and
  ``ece_given_prefix_correct``: only positions whose draft tokens 1..d-1 all equal the target's,
  i.e. the positions a greedy verifier actually judges. Past a wrong token the drafter
  continues its own draft, so its confidence there is about its own continuation, not the
  target's; the unconditional ECE counts those positions, the conditional one does not.

Data sets: GSM8K test (held out: the family trains on GSM8K train), MATH-500 and HumanEval
through :func:`specpolicy.data.datasets.load_prompts` (the prompts the loop sees).

The in-loop measure (``--in-loop``, or ``--results`` of an existing run): a normal run
``python -m specpolicy drafter=fastdllm drafter.model=... policy=static policy.k=16
dataset.num_prompts=10 run.vanilla_baseline=false``; from its ``results.jsonl``, the share of
drafted rounds whose accepted length reaches d >= 1, 3, 5, 10 (:func:`accepted_length_shares`).
Every kind but ``fastdllm`` runs it with the vanilla baseline, for the measured cost of one drafter
pass against one target step (:func:`pass_cost`; the MODELED A6000 pass costs are
``specpolicy/analysis/gpu_pass_model.py``'s). Static k (``--in-loop-k``): :data:`IN_LOOP_K`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

DATASETS = ("gsm8k", "math500", "humaneval")
DRAFT_LENGTHS = (8, 16, 32, 64)
SHARE_THRESHOLDS = (1, 3, 5, 10)
N_BINS = 10
#: ``--kind`` choices: the drafters the diagnostics run (``drafter=<kind>`` in the loop).
KINDS = ("fastdllm", "dflash", "eagle3", "dart", "falcon", "deer")
#: Default ``--drafter`` per kind (bundled names).
DEFAULT_DRAFTERS = {
    "fastdllm": "dllm-drafter",
    "dflash": "dflash-drafter",
    "eagle3": "eagle3-drafter",
    "dart": "dart-drafter",
    "deer": "deer-drafter",
    "falcon": "falcon-drafter",
}
#: Static k of ``--in-loop`` per kind (dflash: B - 1 of its checkpoint): EAGLE-3's chain of 5, one DART
#: pass (d = 8), three Falcon passes (k = 2 each), DEER's paper setting (32).
IN_LOOP_K = {"fastdllm": 16, "eagle3": 5, "dart": 8, "falcon": 6, "deer": 32}


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = N_BINS) -> float:
    """ECE = sum over equal-width confidence bins of (bin share) * |accuracy - mean confidence|.

    Args:
        confidence: ``(N,) float`` in [0, 1]. correct: ``(N,) bool``.
    Returns:
        the ECE in [0, 1] (0.0 for N = 0).
    """
    n = int(confidence.numel())
    if n == 0:
        return 0.0
    conf = confidence.double().clamp(0, 1)
    bins = (conf * n_bins).long().clamp(max=n_bins - 1)
    corr = correct.double()
    total = 0.0
    for b in range(n_bins):
        sel = bins == b
        m = int(sel.sum())
        if m:
            total += m / n * abs(float(corr[sel].mean()) - float(conf[sel].mean()))
    return total


def reliability_table(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = N_BINS) -> list[dict]:
    """Per equal-width bin: ``lo``, ``hi``, ``n``, ``mean_confidence``, ``accuracy`` (None when empty)."""
    conf = confidence.double().clamp(0, 1)
    bins = (conf * n_bins).long().clamp(max=n_bins - 1)
    out = []
    for b in range(n_bins):
        sel = bins == b
        m = int(sel.sum())
        out.append(
            {
                "lo": b / n_bins,
                "hi": (b + 1) / n_bins,
                "n": m,
                "mean_confidence": round(float(conf[sel].mean()), 4) if m else None,
                "accuracy": round(float(correct[sel].double().mean()), 4) if m else None,
            }
        )
    return out


def summarize_drafts(
    drafts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    max_distance: int,
    draft_lengths=DRAFT_LENGTHS,
    calibration_distance: int = 32,
) -> dict:
    """The diagnostics of a set of drafts.

    Args:
        drafts: per draft ``(draft ids (n,) int64, confidences (n,) float32, reference ids
            (m,) int64)`` where the reference holds the target's tokens from the draft's first
            position on (``m`` may be smaller than ``n`` near the end of an output; positions
            past ``m`` are not scored).
        max_distance: distances 1..max_distance are reported.
        draft_lengths: draft lengths n of ``longest_correct_prefix``.
        calibration_distance: the overall ECE pools distances 1..this.
    Returns:
        dict: ``n_drafts``, ``agreement`` (list over distance), ``n_by_distance``,
        ``mean_confidence_by_distance``, ``longest_correct_prefix`` ({n: mean}),
        ``ece``, ``ece_by_distance``, ``reliability``, ``agreement_given_prefix_correct``,
        ``n_given_prefix_correct``, ``ece_given_prefix_correct``, ``reliability_given_prefix_correct``.
    """
    D = max_distance
    match = torch.zeros(len(drafts), D, dtype=torch.bool)
    conf = torch.zeros(len(drafts), D)
    scored = torch.zeros(len(drafts), D, dtype=torch.bool)
    for i, (ids, c, ref) in enumerate(drafts):
        m = min(D, int(ids.shape[0]), int(ref.shape[0]))
        match[i, :m] = ids[:m] == ref[:m]
        conf[i, :m] = c[:m].float()
        scored[i, :m] = True
    n_d = scored.sum(0)
    agree = (match & scored).sum(0).double() / n_d.clamp(min=1)
    mconf = (conf * scored).sum(0).double() / n_d.clamp(min=1)
    # longest correct prefix: leading run of matches among scored positions
    run = (match & scored).int().cumprod(dim=1).sum(1)  # (N,)
    lcp = {
        str(n): round(float(run.clamp(max=n).double().mean()), 3) if len(drafts) else 0.0
        for n in draft_lengths
        if n <= D
    }
    cd = min(calibration_distance, D)
    pooled = scored[:, :cd]
    ece_d = [
        round(expected_calibration_error(conf[:, d][scored[:, d]], match[:, d][scored[:, d]]), 4) for d in range(D)
    ]
    # positions whose earlier draft tokens are all correct (the ones a greedy verifier judges)
    reached = torch.zeros_like(scored)
    reached[:, 0] = scored[:, 0]
    if D > 1:
        reached[:, 1:] = (match & scored).int().cumprod(dim=1)[:, :-1].bool() & scored[:, 1:]
    n_r = reached.sum(0)
    agree_r = (match & reached).sum(0).double() / n_r.clamp(min=1)
    pooled_r = reached[:, :cd]
    return {
        "n_drafts": len(drafts),
        "agreement_given_prefix_correct": [round(float(x), 4) for x in agree_r],
        "n_given_prefix_correct": [int(x) for x in n_r],
        "ece_given_prefix_correct": round(
            expected_calibration_error(conf[:, :cd][pooled_r], match[:, :cd][pooled_r]), 4
        ),
        "reliability_given_prefix_correct": reliability_table(conf[:, :cd][pooled_r], match[:, :cd][pooled_r]),
        "agreement": [round(float(x), 4) for x in agree],
        "n_by_distance": [int(x) for x in n_d],
        "mean_confidence_by_distance": [round(float(x), 4) for x in mconf],
        "longest_correct_prefix": lcp,
        "ece": round(expected_calibration_error(conf[:, :cd][pooled], match[:, :cd][pooled]), 4),
        "ece_distances": cd,
        "ece_by_distance": ece_d,
        "reliability": reliability_table(conf[:, :cd][pooled], match[:, :cd][pooled]),
    }


@torch.no_grad()
def collect_drafts(
    drafter,
    prompts: list[torch.Tensor],
    outputs: list[torch.Tensor],
    stride: int,
    max_distance: int,
    verifier=None,
    passes: dict | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One-pass drafts from every ``stride``-th committed position of each output.

    Args:
        drafter: a :class:`specpolicy.drafters.fastdllm.FastDLLMDrafter` (or any ``Drafter`` with
            ``prefill``/``draft``).
        prompts: ``(P_i,) int64`` prompt ids. outputs: ``(R_i,) int64`` target greedy outputs.
        stride: distance between start positions (>= 1), starting at 0.
        max_distance: tokens drafted from each start.
        verifier: for a drafter that reads the target (``target_feature_layers``): the target's
            verifier; its features of ``prompt + output`` (one pass per prompt) feed each prefill.
        passes: when given, the draft is extended length by length (``DRAFT_LENGTHS``, as a chain
            policy asks for more) and ``passes`` is filled as ``{n: [forward passes of each n-token
            draft]}``; None: one ``draft(max_distance)`` call.
    Returns:
        ``(draft ids, confidences, reference ids)`` per start (see :func:`summarize_drafts`).
    """
    layers = tuple(getattr(drafter, "target_feature_layers", ()) or ())
    marks = [n for n in DRAFT_LENGTHS if n < max_distance] + [max_distance]
    out = []
    for p, r in zip(prompts, outputs):
        features = None
        if layers:
            verifier.request_features(layers)
            verifier.prefill(torch.cat([p, r]))
            features = verifier.prompt_features
        for c in range(0, int(r.shape[0]), stride):
            prefix = torch.cat([p, r[:c]])
            if features is None:
                drafter.prefill(prefix)
            else:
                drafter.prefill(prefix, features=features[: prefix.shape[0] - 1])
            if passes is None:
                d = drafter.draft(max_distance)
            else:
                done = 0
                for n in marks:  # the same draft, extended length by length: passes per length
                    d = drafter.draft(n - done)
                    done = n
                    if passes is not None and n in DRAFT_LENGTHS:
                        passes.setdefault(n, []).append(d.forward_passes)
                    if d.ends_at_stop_token or d.length < n:
                        break
            out.append((d.token_ids.cpu(), d.confidences.cpu(), r[c : c + max_distance]))
    if layers:
        verifier.request_features(())
    return out


def accepted_length_shares(results_path: str | Path, thresholds=SHARE_THRESHOLDS) -> dict:
    """Share of drafted rounds (speculation length > 0) whose accepted length reaches each threshold.

    Args:
        results_path: a run's ``results.jsonl`` (one row per prompt with ``rounds``).
    Returns:
        ``{"rounds": N, "mean_accepted_length": x, "share_ge": {"1": s, "3": s, ...}}``.
    Raises:
        FileNotFoundError: no such file.
    """
    acc = []
    with open(results_path) as f:
        for line in f:
            if line.strip():
                for rd in json.loads(line)["rounds"]:
                    if int(rd["speculation_length"]) > 0:
                        acc.append(int(rd["accepted_length"]))
    n = len(acc)
    return {
        "rounds": n,
        "mean_accepted_length": round(sum(acc) / n, 3) if n else 0.0,
        "share_ge": {str(t): round(sum(a >= t for a in acc) / n, 4) if n else 0.0 for t in thresholds},
    }


def pass_cost(results_path: str | Path) -> dict:
    """MEASURED cost of one drafter pass against one target decoding step, from a run with the
    vanilla baseline: ``draft_ms / drafter passes`` of the speculative rounds over the mean
    ``verify_ms`` of the vanilla rounds (one target step each). Timings: run alone.

    Returns:
        ``{"pass_ms", "target_step_ms", "pass_over_target_step"}``.
    """
    draft_ms = passes = vanilla_ms = vanilla_rounds = 0.0
    with open(results_path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                for rd in row["rounds"]:
                    draft_ms += rd["draft_ms"]
                    passes += rd["drafter_forward_passes"]
                vanilla_ms += row.get("vanilla_verify_ms") or 0.0
                vanilla_rounds += row.get("vanilla_rounds") or 0
    pass_ms = draft_ms / passes if passes else 0.0
    step = vanilla_ms / vanilla_rounds if vanilla_rounds else 0.0
    return {
        "pass_ms": round(pass_ms, 3),
        "target_step_ms": round(step, 3),
        "pass_over_target_step": round(pass_ms / step, 3) if step else None,
    }


def run_in_loop(
    drafter: str,
    run_dir: str | Path,
    num_prompts: int = 10,
    k: int = 16,
    max_new_tokens: int = 256,
    threshold: float = 0.05,
    kind: str = "fastdllm",
    offset: int = 0,
) -> dict:
    """Run the loop (static k, GSM8K test from ``offset``; fastdllm at ``threshold`` without the
    vanilla baseline, every other kind with it, for :func:`pass_cost`) in a subprocess and summarize
    its ``results.jsonl`` with :func:`accepted_length_shares`.

    Raises:
        subprocess.CalledProcessError: the run failed.
    """
    run_dir = Path(run_dir)
    if Path(drafter).is_dir():  # a local checkpoint: the run's working directory may differ
        drafter = str(Path(drafter).resolve())
    extra = [f"drafter.threshold={threshold}", "run.vanilla_baseline=false"] if kind == "fastdllm" else []
    cmd = [
        sys.executable,
        "-m",
        "specpolicy",
        f"drafter={kind}",
        f"drafter.model={drafter}",
        *extra,
        "policy=static",
        f"policy.k={k}",
        f"dataset.num_prompts={num_prompts}",
        f"dataset.offset={offset}",
        f"generation.max_new_tokens={max_new_tokens}",
        "run.resume=false",
        "runtime=cpu",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    res = accepted_length_shares(run_dir / "results.jsonl")
    res.update(k=k, num_prompts=num_prompts, offset=offset, max_new_tokens=max_new_tokens)
    if kind == "fastdllm":
        res["threshold"] = threshold
    else:
        res.update(pass_cost(run_dir / "results.jsonl"))
    return res


def diagnose(
    drafter_path: str,
    target_path: str = "target",
    datasets=DATASETS,
    num_prompts: dict | int = 50,
    max_new_tokens: int = 256,
    stride: int = 9,
    max_distance: int = 64,
    threshold: float = 0.05,
    small_block_size: int = 8,
    log=print,
    on_result=None,
    kind: str = "fastdllm",
    offset: int = 0,
) -> dict:
    """Every per-data-set diagnostic of the module docstring for one drafter.

    Args:
        drafter_path / target_path: bundled names or model dirs.
        kind: one of :data:`KINDS` (``drafter=<kind>``).
        offset: first prompt of each data set.
        num_prompts: prompts per data set (an int for all, or ``{name: n}``).
        stride: start positions ``0, stride, 2 stride, ...`` of each output (>= 1).
        on_result: called as ``on_result(name, result)`` after each data set (e.g. to save
            partial results).
    Returns:
        ``{dataset: summarize_drafts(...) + {"n_prompts", "mean_output_tokens", "wall_s"}}``.
    """
    from specpolicy.core.runtime import Runtime
    from specpolicy.data.datasets import load_prompts
    from specpolicy.drafters.fastdllm import FastDLLMDrafter
    from specpolicy.family.distill import greedy_generate
    from specpolicy.models.fastdllm import model_block_size
    from specpolicy.models.loading import load_causal_lm, load_tokenizer

    rt = Runtime(device="cpu", dtype="float32", seed=0)
    tok = load_tokenizer(target_path)
    verifier = None
    if kind == "fastdllm":
        target = load_causal_lm(target_path, rt)
        dmodel = load_causal_lm(drafter_path, rt)
        drafter = FastDLLMDrafter(
            dmodel,
            rt,
            load_tokenizer(drafter_path),
            block_size=model_block_size(dmodel.config) or 32,
            small_block_size=small_block_size,
            threshold=threshold,
        )
        context = dmodel.config.max_position_embeddings
    else:
        from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_verifier

        pm = get_plugin_manager(autoload=False)
        verifier = make_verifier(pm, {"name": "hf", "model": target_path}, rt)
        drafter = make_drafter(pm, {"name": kind, "model": drafter_path}, rt, verifier)
        target, context = verifier.model, verifier.max_context
    res = {}
    for name in datasets:
        t0 = time.time()
        n = num_prompts[name] if isinstance(num_prompts, dict) else num_prompts
        prompts = [p.token_ids(tok) for p in load_prompts(name, num_prompts=n, offset=offset)]
        prompts = [p for p in prompts if p.shape[0] + max_new_tokens + 64 < context]
        outs = greedy_generate(
            target, [p.tolist() for p in prompts], tok.eos_token_id, tok.pad_token_id, max_new_tokens, batch_size=64
        )
        outs = [torch.tensor(o, dtype=torch.long) for o in outs]
        passes: dict | None = None if kind == "fastdllm" else {}  # fastdllm: one call, as measured before
        drafts = collect_drafts(drafter, prompts, outs, stride, max_distance, verifier, passes)
        r = summarize_drafts(drafts, max_distance)
        if passes:
            r["passes_by_length"] = {str(k): round(sum(v) / len(v), 3) for k, v in passes.items()}
        r.update(
            n_prompts=len(prompts),
            mean_output_tokens=round(sum(len(o) for o in outs) / max(1, len(outs)), 1),
            wall_s=round(time.time() - t0, 1),
        )
        res[name] = r
        if on_result is not None:
            on_result(name, r)
        log(
            f"[{name}] {len(prompts)} prompts, {len(drafts)} drafts: agreement d1..5 {r['agreement'][:5]} "
            f"d10 {r['agreement'][9]} d32 {r['agreement'][31] if max_distance >= 32 else None}; "
            f"longest correct prefix {r['longest_correct_prefix']}; ECE {r['ece']} "
            f"(given a correct prefix: {r['ece_given_prefix_correct']})"
        )
    return res


def _block_size(drafter: str) -> int:
    """A DFlash checkpoint's block size B (from its config.json)."""
    from specpolicy.models.checkpoint import read_config
    from specpolicy.models.dflash import DFlashSpec
    from specpolicy.models.loading import resolve_model_path

    return DFlashSpec.from_config(read_config(resolve_model_path(drafter), "--drafter")).block_size


def main(argv: list[str] | None = None) -> dict:
    """CLI (``python -m specpolicy.family.diagnostics``); writes ``--out`` as JSON."""
    ap = argparse.ArgumentParser(prog="python -m specpolicy.family.diagnostics", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="fastdllm", choices=KINDS, help="the drafter's kind")
    ap.add_argument(
        "--drafter",
        default=None,
        help="bundled name or checkpoint dir (default: the bundled drafter of --kind)",
    )
    ap.add_argument("--offset", type=int, default=0, help="first prompt of each data set")
    ap.add_argument(
        "--in-loop-k",
        type=int,
        default=None,
        help="static k of --in-loop (default: 16 for fastdllm, B - 1 for dflash, 5 for eagle3, 8 for dart, "
        "6 for falcon, 32 for deer)",
    )
    ap.add_argument("--target", default="target", help="bundled name or model dir of the target")
    ap.add_argument("--datasets", nargs="*", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--num-prompts", type=int, default=30, help="GSM8K test prompts (held out)")
    ap.add_argument("--num-prompts-other", type=int, default=10, help="MATH-500 / HumanEval prompts")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--stride", type=int, default=12, help="tokens between draft start positions")
    ap.add_argument("--max-distance", type=int, default=64, help="tokens per one-pass draft (>= 32)")
    ap.add_argument(
        "--in-loop",
        action="store_true",
        help="also run the loop measure (static k = --in-loop-k, 10 GSM8K test prompts from --offset)",
    )
    ap.add_argument("--in-loop-dir", default=None, help="run dir of --in-loop (default: <out>.loop)")
    ap.add_argument("--results", default=None, help="only summarize this results.jsonl (accepted-length shares)")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    for name, v, lo in (
        ("--num-prompts", a.num_prompts, 1),
        ("--num-prompts-other", a.num_prompts_other, 1),
        ("--stride", a.stride, 1),
        ("--max-distance", a.max_distance, 32),
        ("--max-new-tokens", a.max_new_tokens, 1),
    ):
        if v < lo:
            ap.exit(2, f"error: {name}={v}; it must be an integer >= {lo}\n")
    if a.offset < 0:
        ap.exit(2, f"error: --offset={a.offset}; it must be an integer >= 0\n")
    if a.threads:
        torch.set_num_threads(a.threads)
    a.drafter = a.drafter or DEFAULT_DRAFTERS[a.kind]

    def save(res: dict) -> None:  # after every part: a stopped run keeps what it measured
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(res, indent=1) + "\n")

    if a.results:
        res = {"in_loop": accepted_length_shares(a.results)}
    else:
        t0 = time.time()
        npr = {d: a.num_prompts if d == "gsm8k" else a.num_prompts_other for d in DATASETS}
        res = {
            "kind": a.kind,
            "drafter": a.drafter,
            "stride": a.stride,
            "max_distance": a.max_distance,
            "offset": a.offset,
            "num_prompts": {d: npr[d] for d in a.datasets},
        }
        if a.kind == "fastdllm":
            res.update(threshold=0.05, small_block_size=8)
        first = [d for d in a.datasets if d == "gsm8k"]  # GSM8K (the bars), then the loop, then the others
        rest = [d for d in a.datasets if d != "gsm8k"]

        def keep(name, r):
            res[name] = r
            save(res)

        common = dict(on_result=keep, kind=a.kind, offset=a.offset)
        diagnose(a.drafter, a.target, first, npr, a.max_new_tokens, a.stride, a.max_distance, **common)
        if a.in_loop:
            loop_dir = a.in_loop_dir or (str(a.out) + ".loop" if a.out else "outputs/diagnostics-loop")
            k = a.in_loop_k or IN_LOOP_K.get(a.kind) or _block_size(a.drafter) - 1
            res["in_loop"] = run_in_loop(a.drafter, loop_dir, k=k, kind=a.kind, offset=a.offset)
            print(f"[in-loop] {res['in_loop']}", flush=True)
            save(res)
        if rest:
            diagnose(a.drafter, a.target, rest, npr, a.max_new_tokens, a.stride, a.max_distance, **common)
        res["wall_s"] = round(time.time() - t0, 1)
    if a.results:
        print(f"[in-loop] {res['in_loop']}")
    save(res)
    return res


if __name__ == "__main__":
    main()
