"""The neighbours page (``docs/results/neighbours.md``): what FailFast's neighbours (DiffuSpec,
DEER, EasySpec, DART, Falcon) measure on the bundled family, then what their papers report, the
commands folded at the end. Prose: ``templates/neighbours.md.j2``; the tables are built here from
``benchmarks/results/neighbours-gsm8k-30x256.json`` (``benchmarks/peers.py --method ...``) and the
results files each section names. Every row a section names must be in the results
(``docs_tables.MissingRow`` otherwise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specpolicy.analysis.docs_pages import peers_rows, peers_settings
from specpolicy.analysis.docs_tables import RESULTS, render_template, require, timing_line

PAGE = "docs/results/neighbours.md"
NEIGHBOURS_NAME = "neighbours-gsm8k-30x256.json"
EASYSPEC_DEPTH_NAME = "easyspec-depth.json"
GPU_NAME = "runtime-cuda-compiled.json"

#: What each neighbour's paper reports against EAGLE-3 (greedy), with where: static text, not results.
NEIGHBOUR_CLAIMS = [
    (
        "DiffuSpec",
        "arXiv 2510.02358, main results",
        "Qwen2.5-32B target, Dream-7B dLLM drafter (one refinement step), Spec-Bench, A100",
        "3.08x, mean accepted length 6.99 (math: 4.02x)",
        "2.80x, 4.28",
        "here: `policy=diffuspec`, `drafter.path_search=cps` on `fastdllm` and `dflash`",
    ),
    (
        "DEER",
        "arXiv 2512.15176",
        "Qwen3 targets, 0.5B dLLM drafter, one denoising step per 32-token block",
        "GSM8K at T = 0.6: 2.23x (tau 2.70); HumanEval 5.54x (tau 6.58)",
        "1.92x (tau 2.43) on GSM8K",
        "here: `drafter=deer` (a LoRA on the bundled dLLM drafter), `method=deer-k32`, `method=deer+failfast`",
    ),
    (
        "EasySpec",
        "arXiv 2502.02493",
        "70B targets, 8 x A100, layer-parallel drafter",
        "up to 4.17x; drafting 1.62x faster",
        "-",
        "here: `drafter=easyspec` (`layer_parallel`), `method=easyspec-lp2-k5`",
    ),
    (
        "DART",
        "arXiv 2601.19278",
        "Qwen3-8B, H20, draft length 8",
        "2.71x, tau 3.61",
        "2.20x, tau 3.72",
        "here: `drafter=dart`, `policy=dart-tree`, `method=dart+dart-tree` / `dart+failfast` / `dart-static`",
    ),
    (
        "Falcon",
        "arXiv 2412.12639",
        "Vicuna-7B, H800, greedy",
        "MT-Bench / HumanEval / GSM8K 3.10x / 3.21x / 2.92x",
        "-",
        "here: `drafter=falcon`, `policy=falcon-tree` (weights not bundled: `train_drafter falcon`)",
    ),
]
#: EasySpec's rows: the sequential AR drafter, the lean pass alone, the lean pass grouped.
EASYSPEC_ROWS = [
    ("ar-k5", "AR drafter, Hugging Face forward, sequential layers"),
    ("easyspec-lp1-k5", "lean per-token pass, layer_parallel 1 (control)"),
    ("easyspec-lp2-k5", "lean pass, the 2 middle layers grouped (layer_parallel 2)"),
    ("ar+goodput", "AR drafter, goodput policy"),
    ("easyspec-lp2+goodput", "layer_parallel 2, goodput policy"),
]
#: Pairs whose accepted lengths the page compares: (what, the plain one-pass row, the path-search row).
CPS_PAIRS = [
    ("fastdllm, one pass over 16 masks, lambda 0.5 (paper)", "fastdllm-1pass-k16", "fastdllm-1pass-k16+cps"),
    (
        "fastdllm, one pass over 16 masks, lambda 0.8 (this testbed)",
        "fastdllm-1pass-k16",
        "fastdllm-1pass-k16+cps-l0.8",
    ),
    ("dflash, one pass over 15 masks, lambda 0.5 (paper)", "dflash-k15", "dflash-k15+cps"),
    ("dflash, one pass over 15 masks, lambda 0.8 (this testbed)", "dflash-k15", "dflash-k15+cps-l0.8"),
]
#: DEER against the bundled dLLM drafter, one pass at the same k: (k, the dLLM row, the DEER row).
DEER_PAIRS = [(16, "fastdllm-1pass-k16", "deer-k16"), (32, "fastdllm-1pass-k32", "deer-k32")]
#: DART's tree with and without the n-gram term: (the n-gram row, the row without it).
DART_NGRAM_PAIR = ("dart+dart-tree", "dart+dart-tree-no-ngram")
#: DART's tree search over DFlash's one-pass block against the block's own best-first tree: (row, tree).
DFLASH_DART_ROWS = [
    ("dflash+block-tree-d15k3t16", "block tree: best-first by the block's log-probabilities, top-3, 16 nodes"),
    ("dflash+dart-tree-t16-no-ngram", "DART's search without the n-gram term, 16 nodes"),
    ("dflash+dart-tree-t16", "DART's search (top-25, its step score with the n-gram term), 16 nodes"),
    ("dflash+dart-tree-t24", "the same, 24 nodes (beam 24)"),
    ("dflash+dart-tree", "the same at DART's settings: beam 20, 60 nodes"),
]
#: Falcon's rows: (name, what it drafts).
FALCON_ROWS = [
    ("falcon-k4", "chain of 4: two passes of 2 tokens"),
    ("falcon+failfast", "FailFast's rule, 2 tokens a pass (n = 2)"),
    ("falcon+falcon-tree", "27-node tree, depth 8 (this testbed's)"),
    ("falcon+falcon-tree-paper", "the released 165-node tree, depth 8"),
]
#: Drafters that draft a block in one pass (the issue's "one-pass drafting"), and EAGLE-3.
ONE_PASS_DRAFTERS = ("dart", "dflash", "fastdllm", "deer")
#: The rows the page compares in prose.
EAGLE_TREE, CHAIN_ROW = "eagle3+eagle2-tree", "dflash-k15"
#: The drafters' diagnostics shown side by side (``python -m specpolicy.family.diagnostics``), by kind.
DIAGNOSTICS_KINDS = {"dflash": "DFlash", "eagle3": "EAGLE-3", "dart": "DART", "falcon": "Falcon", "deer": "DEER"}


def named_rows() -> list[str]:
    """Every row of the neighbours run the page names."""
    return [
        *(n for n, _ in EASYSPEC_ROWS),
        *(x for _, a, b in CPS_PAIRS for x in (a, b)),
        *(x for _, a, b in DEER_PAIRS for x in (a, b)),
        *DART_NGRAM_PAIR,
        *(n for n, _ in DFLASH_DART_ROWS),
        *(n for n, _ in FALCON_ROWS),
        EAGLE_TREE,
        CHAIN_ROW,
    ]


def _best(methods: Mapping[str, Any], drafters: tuple[str, ...], key: str) -> tuple[float, str] | None:
    rows = [(m[key], n) for n, m in methods.items() if m.get("drafter") in drafters and m.get(key) is not None]
    return max(rows) if rows else None


def lift_rows(methods: Mapping[str, Any]) -> list[list[str]]:
    """The path search's lift on each pair of ``CPS_PAIRS``."""
    rows = []
    for what, plain, searched in CPS_PAIRS:
        a, b = methods[plain]["mean_accepted_length"], methods[searched]["mean_accepted_length"]
        rows.append([what, f"{a:.2f}", f"{b:.2f}", f"{b / a - 1:+.1%}" if a else "-",
                     f"{methods[plain]['speedup_vs_vanilla']:.2f}x", f"{methods[searched]['speedup_vs_vanilla']:.2f}x"])  # fmt: skip
    return rows


def diffuspec_context(methods: Mapping[str, Any]) -> dict[str, Any] | None:
    eagle = [(m["speedup_vs_vanilla"], n) for n, m in methods.items() if m.get("drafter") == "eagle3"]
    diffuspec = [(m["speedup_vs_vanilla"], n) for n, m in methods.items() if n.startswith("diffuspec")]
    if not (eagle and diffuspec):
        return None
    (speedup, name), (eagle_speedup, eagle_name) = max(diffuspec), max(eagle)
    return {"name": name, "speedup": speedup, "eagle_name": eagle_name, "eagle": eagle_speedup}


def layer_rows(methods: Mapping[str, Any]) -> list[list[str]]:
    """EasySpec's rows: drafting ms per drafted token, acceptance, accepted length, speedup."""
    rows = []
    for name, what in EASYSPEC_ROWS:
        m = methods[name]
        drafted = m["mean_speculation_length"] * m["rounds"]
        rows.append([f"`{name}`", what, f"{m['draft_ms'] / drafted:.3f}" if drafted else "-",
                     f"{m['acceptance_rate']:.3f}", f"{m['mean_accepted_length']:.2f}",
                     f"{m['speedup_vs_vanilla']:.2f}x"])  # fmt: skip
    return rows


def depth_context(depth: Mapping[str, Any] | None, methods: Mapping[str, Any]) -> dict[str, Any] | None:
    """EasySpec's staleness at the paper's N = 4: the 12-layer target as its own drafter
    (``benchmarks/easyspec_depth.py``), beside the bundled AR drafter's drop in ``methods``."""
    if not depth:
        return None
    drops = [1 - r["acceptance_rate"] for r in depth["rows"] if r["layer_parallel"] > 1]
    ar, lp2 = methods["ar-k5"], methods["easyspec-lp2-k5"]
    s = depth["settings"]
    return {
        "name": EASYSPEC_DEPTH_NAME,
        "s": s,
        "rows": [
            [str(r["layer_parallel"]), f"{r['acceptance_rate']:.3f}", f"{r['mean_accepted_length']:.2f}"]
            for r in depth["rows"]
        ],  # fmt: skip
        "worst": f"{1 - max(drops):.2f}",
        "drops": f"{min(drops):.0%}-{max(drops):.0%}",
        "bundled": f" (the bundled AR drafter: {lp2['acceptance_rate'] / ar['acceptance_rate'] - 1:+.0%})",
        "command": f"python benchmarks/easyspec_depth.py --num-prompts {s['num_prompts']} "
        f"--max-new-tokens {s['max_new_tokens']} --out benchmarks/results/{EASYSPEC_DEPTH_NAME}",
    }


def deer_rows(methods: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for k, a, b in DEER_PAIRS:
        la, lb = methods[a]["mean_accepted_length"], methods[b]["mean_accepted_length"]
        rows.append([str(k), f"{la:.2f}", f"{lb:.2f}", f"{lb / la:.2f}x" if la else "-"])
    return rows


def dart_context(methods: Mapping[str, Any]) -> dict[str, str]:
    with_ngram, without = (methods[n]["mean_accepted_length"] for n in DART_NGRAM_PAIR)
    return {
        "with_name": DART_NGRAM_PAIR[0],
        "without_name": DART_NGRAM_PAIR[1],
        "with_length": f"{with_ngram:.2f}",
        "without_length": f"{without:.2f}",
        "lift": f"{with_ngram / without - 1:+.1%}" if without else "-",
    }


def dflash_dart_rows(methods: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for n, what in DFLASH_DART_ROWS:
        m = methods[n]
        tuned = m.get("modeled_speedup_tuned_profile")
        rows.append([f"`{n}`", what, f"{m['mean_accepted_length']:.2f}", f"{m['draft_ms'] / max(m['rounds'], 1):.2f}",
                     f"{m['speedup_vs_vanilla']:.2f}x", f"{tuned:.2f}x" if tuned else "-"])  # fmt: skip
    return rows


def charged_context(methods: Mapping[str, Any], tuned_profile: str | None) -> dict[str, str] | None:
    """What the host search would cost ``dflash+dart-tree``'s MODELED figure at this CPU's cost
    (needs a profile with a target step)."""
    searched, chain = methods["dflash+dart-tree"], methods[CHAIN_ROW]
    if not (tuned_profile and searched.get("modeled_speedup_tuned_profile")):
        return None
    from specpolicy.core.latency import load_profile

    step_ms = load_profile(tuned_profile).target_ms_per_token or 0.0  # None: a measured profile
    if not (step_ms and searched["rounds"] and chain["rounds"]):
        return None
    extra = searched["draft_ms"] / searched["rounds"] - chain["draft_ms"] / chain["rounds"]
    modeled = searched["modeled_speedup_tuned_profile"]
    charged = 1 / (1 / modeled + searched["rounds"] * extra / (searched["generated_tokens"] * step_ms))
    return {
        "extra": f"{extra:.2f}",
        "step_ms": f"{step_ms:g}",
        "modeled": f"{modeled:.2f}x",
        "charged": f"{charged:.2f}x",
    }


def falcon_rows(methods: Mapping[str, Any]) -> list[list[str]]:
    return [
        [f"`{n}`", what, f"{methods[n]['mean_accepted_length']:.2f}", f"{methods[n]['drafter_passes_per_round']:.2f}",
         f"{methods[n]['speedup_vs_vanilla']:.2f}x"]
        for n, what in FALCON_ROWS
    ]  # fmt: skip


def headline_lines(methods: Mapping[str, Any], tuned_profile: str | None, gpu: Mapping[str, Any] | None) -> list[str]:
    """One-pass drafting against EAGLE-3: measured, MODELED, and on a GPU (its own results file)."""
    lines = []
    one_pass, eagle = (
        _best(methods, ONE_PASS_DRAFTERS, "speedup_vs_vanilla"),
        _best(methods, ("eagle3",), "speedup_vs_vanilla"),
    )
    if one_pass and eagle:
        lines.append(
            f"- measured: the best one-pass-drafting row, `{one_pass[1]}`, {one_pass[0]:.2f}x against the best "
            f"EAGLE-3 row, `{eagle[1]}`, {eagle[0]:.2f}x: {one_pass[0] / eagle[0]:.2f} of it;"
        )
    dart_tree, eagle_tree = methods[DART_NGRAM_PAIR[0]], methods[EAGLE_TREE]
    lines.append(
        f"- measured: `{DART_NGRAM_PAIR[0]}` {dart_tree['speedup_vs_vanilla']:.2f}x (accepted length "
        f"{dart_tree['mean_accepted_length']:.2f}) against `{EAGLE_TREE}` "
        f"{eagle_tree['speedup_vs_vanilla']:.2f}x ({eagle_tree['mean_accepted_length']:.2f});"
    )
    key = "modeled_speedup_tuned_profile"
    modeled, modeled_eagle = _best(methods, ("dart", "dflash"), key), _best(methods, ("eagle3",), key)
    if modeled and modeled_eagle:
        lines.append(
            f"- MODELED under `{tuned_profile}` (forward-pass counts x the profile's pass costs, not measured): the "
            f"best DART or DFlash row, `{modeled[1]}`, {modeled[0]:.2f}x against the best EAGLE-3 row, "
            f"`{modeled_eagle[1]}`, {modeled_eagle[0]:.2f}x (host work such as a tree search left out: see DART's "
            "tree search over DFlash's block below)."
        )
    if gpu:
        rows = gpu.get("rows", {})
        require(rows, ["dflash+failfast@compiled"], PAGE, f"{RESULTS}/{GPU_NAME}")
        chain = next((n for n in rows if n.startswith("eagle3+") and n.endswith("@compiled")), None)
        if chain:
            one, other = rows["dflash+failfast@compiled"]["tokens_per_s"], rows[chain]["tokens_per_s"]
            lines.append(
                f"- measured on a GPU ({gpu['settings'].get('device_name') or 'CUDA'}, compiled runtime; another run, "
                f"`benchmarks/results/{GPU_NAME}`, [runtime page](runtime.md#measured-on-a-gpu)): `dflash+failfast` "
                f"{one:.0f} tokens/s against the EAGLE-3 chain `{chain.partition('@')[0]}` {other:.0f}: "
                f"{one / other:.2f}x -- the chain only (EAGLE-3 with goodput or a tree did not run there), so not the "
                "bar's comparison, but the direction the neighbours' papers report once a pass's cost no longer "
                "grows with its width. That run had the 2-layer DFlash drafter bundled before the 3-layer one "
                "measured above."
            )
    return lines


def diagnostics_context(diagnostics: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The drafters that draft a block or read the target, diagnosed side by side on GSM8K test
    prompts (``benchmarks/results/diagnostics-<kind>-gsm8k.json``): agreement with the target by
    distance into a one-pass draft, its longest correct prefix, calibration, and the loop measure."""
    rows = []
    for kind, label in DIAGNOSTICS_KINDS.items():
        d = diagnostics.get(kind)
        if not d or "gsm8k" not in d:
            continue
        g, loop = d["gsm8k"], d.get("in_loop") or {}
        agreement = g["agreement"]
        rows.append([label, " / ".join(f"{agreement[i]:.2f}" for i in (0, 4, 9) if i < len(agreement)),
                     f"{g['longest_correct_prefix'].get('32', float('nan')):.2f}",
                     f"{g['ece']:.3f} / {g['ece_given_prefix_correct']:.3f}",
                     f"{loop['k']}: {loop['mean_accepted_length']:.2f}" if loop else "-",
                     f"{loop['pass_over_target_step']:.2f}" if loop else "-"])  # fmt: skip
    if not rows:
        return None
    any_diag = next(d for d in diagnostics.values() if d and "gsm8k" in d)
    return {
        "rows": rows,
        "last_prompt": any_diag["num_prompts"]["gsm8k"] - 1,
        "stride": any_diag["stride"],
        "max_distance": any_diag["max_distance"],
    }


#: The bundled drafters with an acceptance head (SpecDec++'s, ``specpolicy.models.acceptance_head``), by kind.
HEAD_KINDS = {"ar": "AR", "eagle3": "EAGLE-3", "dflash": "DFlash", "dart": "DART", "falcon": "Falcon"}
#: Draft positions of the heads' calibration-by-distance columns.
HEAD_DISTANCES = (1, 4, 8)


def head_calibration_context(heads: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The bundled acceptance heads beside the drafters' diagnostics: each head's ``config.json``
    ``calibration`` (``python -m specpolicy.family.train_drafter acceptance-head``: held-out drafts of
    its training run), one row for the head's estimate and one for the drafter's raw confidence on the
    same tokens -- ECE and Brier score over every position and at draft positions ``HEAD_DISTANCES``
    (``calibration.by_distance``), and AUC. None when no head has them."""
    rows, tokens, settings = [], [], None
    for kind, label in HEAD_KINDS.items():
        config = heads.get(kind) or {}
        calibration = config.get("calibration") or {}
        if "by_distance" not in calibration:
            continue
        settings = settings or config.get("training") or {}
        tokens.append(f"{label} {calibration['held_out_tokens']}")
        by_distance = {int(r["distance"]): r for r in calibration["by_distance"]}
        at = [by_distance.get(d) for d in HEAD_DISTANCES]
        for estimate in ("head", "confidence"):
            whole = calibration[estimate]
            rows.append([
                f"{label} {estimate}",
                f"{whole['ece']:.3f}",
                "/".join("-" if r is None else f"{r[estimate + '_ece']:.3f}" for r in at),
                f"{whole['brier']:.3f}",
                "/".join("-" if r is None else f"{r[estimate + '_brier']:.3f}" for r in at),
                f"{whole['auc']:.3f}",
            ])  # fmt: skip
    if not rows:
        return None
    assert settings is not None
    first = int(settings.get("prompt_offset", 0))
    return {
        "rows": rows,
        "tokens": ", ".join(tokens),
        "distances": "/".join(str(d) for d in HEAD_DISTANCES),
        "prompts": f"{first}-{first + int(settings.get('num_prompts', 0)) - 1}",
        "holdout": settings.get("holdout"),
        "max_draft": settings.get("max_draft"),
        "mixing_ratio": settings.get("mixing_ratio"),
    }


def headroom_context(headroom: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """What drafter-side features add to the confidence's ranking of drafted tokens
    (``benchmarks/acceptance_headroom.py``, ``benchmarks/results/acceptance-headroom-<kind>.json``):
    per drafter, the held-out AUC of the raw confidence, of the best fitted feature set and of the
    bundled head. None when no result is there."""
    rows = []
    for kind, result in headroom.items():
        if not result:
            continue
        best_name, best = max(
            ((name, max(s["logistic"]["auc"], s["mlp16"]["auc"])) for name, s in result["sets"].items()),
            key=lambda item: item[1],
        )
        head = result.get("bundled_head") or {}
        rows.append([
            HEAD_KINDS.get(kind, kind),
            f"{result['tokens']['held_out']:,}",
            f"{result['raw_confidence']['auc']:.4f}",
            f"{best:.4f} ({best_name}; {best - result['raw_confidence']['auc']:+.4f})",
            f"{head['auc']:.4f}" if "auc" in head else "-",
        ])  # fmt: skip
    return {"rows": rows} if rows else None


def command_lines(s: Mapping[str, Any]) -> list[str]:
    """The peers command behind the neighbours run, one flag a line."""
    command = [
        f"python benchmarks/peers.py --num-prompts {s['num_prompts']} --offset {s.get('offset', 0)} "
        f"--max-new-tokens {s['max_new_tokens']}{' --no-oracle' if s.get('no_oracle') else ''} "
        f"--out benchmarks/results/{NEIGHBOURS_NAME} \\",
        *[
            f"    --{key.replace('_', '-')} {s[key]} \\"
            for key in ("dart_drafter", "falcon_drafter", "deer_drafter")
            if s.get(key) not in (None, key.replace("_", "-"))
        ],
        *[f"    --method {m} \\" for m in s.get("method") or []],
    ]
    command[-1] = command[-1].removesuffix(" \\")
    return command


def neighbours_page(
    results: Mapping[str, Any] | None,
    depth: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
    diagnostics: Mapping[str, Mapping[str, Any] | None] | None = None,
    heads: Mapping[str, Mapping[str, Any] | None] | None = None,
    headroom: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> str:
    """The neighbours' rows measured here, then their papers' claims, the commands folded at the end.
    Raises ``MissingRow`` when ``results`` lacks a row the page names."""
    claims = [list(c) for c in NEIGHBOUR_CLAIMS]
    if results is None:
        return render_template("neighbours", results=None, name=NEIGHBOURS_NAME, claims=claims)
    methods, tuned = results["methods"], results.get("tuned_profile")
    require(methods, named_rows(), PAGE, f"{RESULTS}/{NEIGHBOURS_NAME}")
    return render_template(
        "neighbours",
        results=results,
        name=NEIGHBOURS_NAME,
        claims=claims,
        settings=peers_settings(results),
        spread=timing_line(results.get("timing_conditions"), "Spread"),
        headline=headline_lines(methods, tuned, gpu),
        lifts=lift_rows(methods),
        diffuspec=diffuspec_context(methods),
        layer_rows=layer_rows(methods),
        depth=depth_context(depth, methods),
        deer=deer_rows(methods),
        dart=dart_context(methods),
        tuned_profile=tuned,
        dflash_dart=dflash_dart_rows(methods),
        charged=charged_context(methods, tuned),
        falcon=falcon_rows(methods),
        diagnostics=diagnostics_context(diagnostics or {}),
        heads=head_calibration_context(heads or {}),
        headroom=headroom_context(headroom or {}),
        every_row=peers_rows(results),
        command=command_lines(results["settings"]),
    )
