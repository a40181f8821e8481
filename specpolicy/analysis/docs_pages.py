"""The results pages of the peer benchmark, the paper's tables, batched decoding, the length
policies' tuning and oracle, the loop's overhead and the model family's scale: each a template
(``templates/<page>.md.j2``) filled with the tables built here from ``benchmarks/results/``.

Column titles and formats come from ``specpolicy.analysis.labels.FIGURES``, the one metric list.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specpolicy.analysis.docs_tables import (
    RESULTS,
    cell,
    load,
    markdown_table,
    render_template,
    require,
    spread,
    timing_line,
)
from specpolicy.analysis.labels import FIGURES

#: The peer benchmark's results file, and the file the pages name it by.
PEERS_NAME = "peers-gsm8k-30x256.json"

#: The figures the benchmarks drew, copied beside the pages that show them (source, name in
#: ``docs/assets/results/``).
FIGURE_COPIES = (
    ("batched-gsm8k-30x128.png", "batched-gsm8k-30x128.png"),
    ("paper/figures/sensitivity.png", "paper-sensitivity.png"),
    ("paper/figures/concavity.png", "paper-concavity.png"),
    ("paper/figures/reliability.png", "paper-reliability.png"),
    ("paper/figures/easy_regions.png", "paper-easy-regions.png"),
)

#: The drafters of the peer benchmark, in the order the headline shows them.
DRAFTERS = {
    "ar": "AR drafter",
    "fastdllm": "Fast-dLLM v2 (dLLM)",
    "suffix": "suffix (model-free)",
    "dflash": "DFlash",
    "eagle3": "EAGLE-3",
}

# -- the peer benchmark ------------------------------------------------------------------------


def _lengths(m: Mapping[str, Any]) -> str:
    return f"{m['mean_accepted_length']:.2f} / {m['mean_speculation_length_drafted']:.2f}"


def method_name(name: str, m: Mapping[str, Any]) -> str:
    """A row's name as the pages print it: ``(tree)`` after a method that verified draft trees."""
    return f"{name} (tree)" if m.get("tree_rounds") else name


def oracle_cell(name: str, m: Mapping[str, Any]) -> str:
    """The oracle fraction with its per-prompt range."""
    by_prompt = [v for v in (m.get("oracle_fraction_by_prompt") or {}).values() if v is not None]
    span = f" ({min(by_prompt):.2f}-{max(by_prompt):.2f})" if by_prompt else ""
    return cell(m.get("oracle_fraction"), "{:.3f}") + (span if m.get("oracle_fraction") is not None else "")


def _figure(key: str, fmt: str | None = None) -> Callable[[str, Mapping[str, Any]], str]:
    return lambda n, m: cell(m.get(key), fmt or FIGURES[key].fmt)


def peers_columns(results: Mapping[str, Any]) -> list[tuple[str, Callable[[str, Mapping[str, Any]], str]]]:
    """The peer table's columns: ``(title, cell(name, method figures))``; titles and formats from
    ``FIGURES``. The host-work columns (``host_ms_per_round``, ``host_step_share``) appear when the
    results measured them (runs of ``benchmarks/peers.py`` before host time was recorded have none)."""
    f = FIGURES
    tuned = results.get("tuned_profile")
    columns = [
        ("method", method_name),
        (f["tokens_per_s"].short, _figure("tokens_per_s")),
        (f["speedup_vs_vanilla"].short, _figure("speedup_vs_vanilla")),
        ("x HF best (measured)", _figure("speedup_vs_hf_assisted_best", "{:.2f}x")),
        (f["acceptance_rate"].short, _figure("acceptance_rate")),
        ("accepted / speculation length per drafted round", lambda n, m: _lengths(m)),
        (f["rounds"].short, _figure("rounds")),
        (f["drafter_passes_per_round"].short, _figure("drafter_passes_per_round")),
        (f["lossless"].short, _figure("lossless", "{}")),
        ("oracle fraction (MODELED; per-prompt range)", oracle_cell),
        (f"MODELED speedup, {results.get('modeled_profile')}", _figure("modeled_speedup_vs_vanilla")),
    ]
    if tuned:
        columns.append((f"MODELED speedup, {tuned}", _figure("modeled_speedup_tuned_profile", "{:.2f}x")))
    if any(m.get("host_ms_per_round") is not None for m in results["methods"].values()):  # runs that measured it
        step = next((m.get("host_step_profile") for m in results["methods"].values() if m.get("host_step_profile")), "")
        columns.append((f["host_ms_per_round"].short, _figure("host_ms_per_round")))
        columns.append(
            (
                f"{f['host_step_share'].short} ({step})" if step else f["host_step_share"].short,
                _figure("host_step_share"),
            )
        )
    return columns


def peers_rows(results: Mapping[str, Any]) -> list[str]:
    """Every row of a peers-style results file as one Markdown table."""
    columns = peers_columns(results)
    rows = [[c(n, m) for _, c in columns] for n, m in results["methods"].items()]
    return markdown_table([t for t, _ in columns], rows)


def peers_settings(results: Mapping[str, Any]) -> str:
    """What a peers-style run ran on, in words."""
    s = results["settings"]
    return (
        f"{s['num_prompts']} {s['dataset']} prompts (from {s.get('offset', 0)}) x {s['max_new_tokens']} new "
        f"tokens, {s['device']} {s['dtype']}, {s.get('torch_threads', '?')} torch threads"
    )


def peers_command(results: Mapping[str, Any], name: str) -> list[str]:
    s = results["settings"]
    return [
        f"python benchmarks/peers.py --num-prompts {s['num_prompts']} --max-new-tokens {s['max_new_tokens']}",
        f"mv results.json benchmarks/results/{name}",
    ]


def headline_rows(results: Mapping[str, Any], name: str = PEERS_NAME) -> list[str]:
    """The methods of the headline: vanilla, Hugging Face's best assisted generation, FailFast on
    the dLLM drafter (the paper's method), and each drafter's fastest measured row. ``MissingRow``
    when vanilla, FailFast on the dLLM drafter or the named HF row is absent."""
    methods = results["methods"]
    named = ["vanilla", results.get("hf_assisted_best"), "fastdllm+failfast"]
    require(methods, [n for n in named if n], "the headline (README.md, docs/results/index.md)", f"{RESULTS}/{name}")
    names = list(named)
    for drafter in DRAFTERS:
        rows = [(m.get("speedup_vs_vanilla") or 0.0, n) for n, m in methods.items() if m.get("drafter") == drafter]
        if rows:
            names.append(max(rows)[1])
    seen: list[str] = []
    for n in names:
        if n in methods and n not in seen:
            seen.append(n)
    return sorted(seen, key=lambda n: methods[n].get("speedup_vs_vanilla") or 0.0)


#: Shorter titles for the headline's narrow table (the full titles: the peers page, the glossary).
HEADLINE_TITLES = {"acceptance rate (accepted / drafted tokens)": "acceptance rate"}
HEADLINE_COLUMNS = (
    "method",
    "tokens/s",
    "speedup vs vanilla (measured)",
    "x HF best (measured)",
    "acceptance rate (accepted / drafted tokens)",
    "lossless",
)


def headline_markdown(results: Mapping[str, Any], name: str) -> list[str]:
    """The README's headline table (a few rows of the peer table) and the line that says what ran."""
    columns = dict(peers_columns(results))
    modeled = f"MODELED speedup, {results.get('modeled_profile')}"
    header = [*HEADLINE_COLUMNS, modeled]
    rows = [[columns[c](n, results["methods"][n]) for c in header] for n in headline_rows(results, name)]
    conditions = results.get("timing_conditions") or {}
    return [
        f"One run of `benchmarks/peers.py` on the bundled model family ({peers_settings(results)}; methods "
        f"interleaved per prompt; `benchmarks/results/{name}`). Each drafter's fastest row, Hugging Face's best "
        "assisted generation and FailFast on the dLLM drafter:",
        "",
        *markdown_table([HEADLINE_TITLES.get(h, h) for h in header], rows),
        "",
        f"{timing_line(conditions, 'Spread')} Measured ratios move from run to run with the machine's speed; "
        "the MODELED column is forward-pass counts x the A6000 profile's latencies, not measured. "
        "(tree) rows count tree nodes in acceptance rate and speculation length. "
        "Every row: [docs/results/peers.md](docs/results/peers.md).",
    ]


def peers_page(results: Mapping[str, Any], name: str) -> str:
    cal = results.get("calibration") or {}
    return render_template(
        "peers",
        settings=peers_settings(results),
        name=name,
        command=peers_command(results, name),
        hf_best=results.get("hf_assisted_best"),
        spread=timing_line(results.get("timing_conditions"), "Spread"),
        picks=", ".join(f"{k} = {v}" for k, v in cal.items() if k not in ("prompts", "tokens_per_s")),
        calibration_prompts=cal.get("prompts", "?"),
        modeled_label=results.get("modeled_label", "MODELED, not measured"),
        modeled_profile=results.get("modeled_profile"),
        tuned_profile=results.get("tuned_profile"),
        rows=peers_rows(results),
    )


# -- the paper's tables ------------------------------------------------------------------------


PAPER_SETS = ("math500", "aime24", "gsm8k", "humaneval")


def paper_page(root: Path) -> str | None:
    table1, appendix = root / RESULTS / "paper/table1.md", root / RESULTS / "paper/appendix_b.md"
    if not table1.is_file():
        return None
    sets = [(n, r) for n, r in ((n, load(root, f"paper-{n}/results.json")) for n in PAPER_SETS) if r is not None]
    command = [
        f"python benchmarks/paper_table.py --dataset {n} --num-prompts {r['settings']['num_prompts']} "
        f"--calibration-prompts {r['settings']['calibration_prompts']} --out benchmarks/results/paper-{n}"
        for n, r in sets
    ]
    command.append(
        "python benchmarks/paper_table.py combine benchmarks/results/paper-{"
        + ",".join(n for n, _ in sets)
        + "} --out benchmarks/results/paper"
    )
    sections = [
        {
            "title": title,
            "path": path.relative_to(root).as_posix(),
            "lines": [line for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("# ")],
        }
        for path, title in (
            (table1, "Table 1: speedup over vanilla decoding"),
            (appendix, "Appendix B: detailed comparison"),
        )
        if path.is_file()
    ]
    figures = [
        (f"../assets/results/{dest}", dest)
        for src, dest in FIGURE_COPIES
        if src.startswith("paper/") and (root / RESULTS / src).is_file()
    ]
    spreads = [timing_line((r.get("timing_conditions") or {}).get("evaluation"), f"Spread, {n}") for n, r in sets]
    return render_template("paper", command=command, spreads=spreads, sections=sections, figures=figures)


# -- batched decoding --------------------------------------------------------------------------


def batched_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    by_size = results["batch_sizes"]
    sizes = list(by_size)
    methods: list[str] = []
    for b in sizes:
        methods += [n for n in by_size[b] if n != "_summary" and n not in methods]
    rows = []
    for name in methods:
        cells = [
            "" if m is None else f"{m['throughput_tokens_per_s']:.0f} ({m['speedup_vs_vanilla']:.2f}x)"
            for m in (by_size[b].get(name) for b in sizes)
        ]
        rows.append([name.replace(":loop-1", " (batch-1 loop)"), *cells])
    summaries = [by_size[b].get("_summary") or {} for b in sizes]
    rows.append(["best fixed K", *[str(s.get("best_fixed_k", "-")).replace("static-", "") for s in summaries]])
    for key, title in (
        ("goodput_batch_over_best_fixed", "goodput-batch / best fixed K"),
        ("batch_schedule_over_best_fixed", "batch-schedule / best fixed K"),
    ):
        rows.append([title, *[cell(s.get(key), "{:.3f}") for s in summaries]])
    tpot = [
        f"{by_size[b]['vanilla']['tpot_p99_ms']:.1f} / {by_size[b]['goodput-batch']['tpot_p99_ms']:.1f}"
        if "goodput-batch" in by_size[b]
        else "-"
        for b in sizes
    ]
    rows.append(["TPOT p99 ms, vanilla / goodput-batch", *tpot])
    return [f"B={b}" for b in sizes], rows


def modeled_batched_rows(results: Mapping[str, Any], profile: str) -> list[list[str]]:
    sizes = list(results["batch_sizes"])
    rows = []
    for name in ("static-k4", "static-k6", "static-k8", "goodput-batch", "batch-schedule"):
        cells = []
        for b in sizes:
            m = (results["batch_sizes"][b].get(name) or {}).get("modeled") or {}
            cells.append(cell((m.get(profile) or {}).get("throughput_speedup"), "{:.2f}x"))
        if any(c != "-" for c in cells):
            rows.append([name, *cells])
    return rows


def lossless_lines(root: Path) -> list[str]:
    out = []
    for path in sorted((root / RESULTS).glob("batched-lossless-*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        s = r["settings"]
        runs = [(combo, b, n) for combo, by_b in r["identical"].items() for b, n in by_b.items()]
        equal = sum(1 for _, _, n in runs if n == s["num_prompts"])
        cmd = (
            f"python benchmarks/batched_lossless.py --num-prompts {s['num_prompts']} --max-new-tokens "
            f"{s['max_new_tokens']} --batch-sizes {s['batch_sizes']} --drafters {s['drafters']} --policies "
            f"{s['policies']}{' --reuse' if s.get('reuse') else ''} --out benchmarks/results/{path.name}"
        )
        out += [
            f"- `{path.name}`: {equal} of {len(runs)} runs (drafter x policy x batch size) gave every one of "
            f"the {s['num_prompts']} requests its batch-1 greedy output"
            f"{'' if r.get('all_lossless', equal == len(runs)) else ' -- NOT all lossless'}.",
            f"  `{cmd}`",
        ]
    return out


def batched_page(root: Path, name: str) -> str | None:
    results = load(root, name)
    if results is None:
        return None
    s = results["settings"]
    header, rows = batched_rows(results)
    png = Path(name).with_suffix(".png").name
    modeled = results.get("modeled") or {}
    profile = "a6000-qwen32b"
    return render_template(
        "batched",
        s=s,
        command=(
            f"python benchmarks/batched.py --num-prompts {s['num_prompts']} --max-new-tokens {s['max_new_tokens']} "
            + "".join(f"--method {s['drafter']}+static-k{k} " for k in str(s["ks"]).split(","))
            + f"--method {s['drafter']}+batch-schedule --method {s['drafter']}+goodput-batch "
            f"--batch-sizes {s['batch_sizes']} --repeats {s['repeats']} "
            f"--out benchmarks/results/{name} --figure benchmarks/results/{png}"
        ),
        spread=timing_line(results.get("timing_conditions"), "Spread"),
        header=header,
        rows=rows,
        png=png if (root / RESULTS / png).is_file() else None,
        profile=profile,
        modeled_rows=modeled_batched_rows(results, profile),
        modeled_label=modeled.get("label", "MODELED, not measured"),
        modeled_drafter=modeled.get("drafter", s["drafter"]),
        lossless=lossless_lines(root),
    )


# -- length policies: tuning and the oracle ----------------------------------------------------


def tune_context(results: Mapping[str, Any], name: str) -> dict[str, Any]:
    s, best = results["settings"], results.get("best") or {}
    rows = [
        [r["method"], r["policy"], f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
         cell(r.get("mean_accepted_length"), "{:.2f}"), f"{r['lossless']}/{s['num_prompts']}"]
        for r in sorted(results["rows"], key=lambda r: -r["speedup"])
    ]  # fmt: skip
    speedups = [r["speedup"] for r in results["rows"] if r.get("n_tau")]
    return {
        "s": s,
        "name": name,
        "best": {"n": best.get("n"), "tau": best.get("tau")},
        "best_speedup": cell(best.get("speedup"), "{:.2f}x"),
        "grid_spread": f"{min(speedups):.2f}-{max(speedups):.2f}x",
        "spread": timing_line(results.get("timing_conditions"), "Spread"),
        "rows": rows,
    }


def ceiling_context(results: Mapping[str, Any], name: str) -> dict[str, Any]:
    rows = [
        [drafter, policy, f"{m['fraction_of_oracle']:.3f}",
         spread(m["fraction_by_prompt"]) if m.get("fraction_by_prompt") else "-",
         f"{m['policy_speedup_modeled']:.2f}x", f"{m['oracle_speedup_modeled']:.2f}x",
         f"{m['mean_speculation_length']:.2f}", f"{m['mean_accepted_length']:.2f}", str(m["rounds"])]
        for drafter, d in results["drafters"].items()
        for policy, m in d["methods"].items()
    ]  # fmt: skip
    return {"s": results["settings"], "name": name, "rows": rows}


TUNE_NAME, CEILING_NAME = "tune-failfast-dflash.json", "ceiling-gsm8k-30x256.json"


def drafters_page(root: Path) -> str | None:
    tune, ceiling = load(root, TUNE_NAME), load(root, CEILING_NAME)
    if tune is None and ceiling is None:
        return None
    return render_template(
        "drafters",
        tune=tune_context(tune, TUNE_NAME) if tune else None,
        ceiling=ceiling_context(ceiling, CEILING_NAME) if ceiling else None,
    )


# -- overhead, packing -------------------------------------------------------------------------


def overhead_page(root: Path) -> str | None:
    overhead, packing = load(root, "overhead-gsm8k-5x256.json"), load(root, "packing.json")
    if overhead is None and packing is None:
        return None
    over = pack = None
    if overhead:
        rows = [
            [n, f"{m['wall_ms']:.0f}", f"{m['forward_ms']:.0f}", f"{100 * m['outside_fraction']:.1f}%",
             f"{100 * m['policy_fraction']:.1f}%", str(m["target_forward_calls"]), str(m["drafter_forward_calls"]),
             str(m["tokens"]), str(m["rounds"])]
            for n, m in overhead["methods"].items()
        ]  # fmt: skip
        over = {"s": overhead["settings"], "rows": rows}
    if packing:
        rows = [
            [str(p["batch_size"]), p["drafts"], str(p["padded_tokens"]), str(p["packed_tokens"]),
             f"{p['padded_ms']:.2f}", f"{p['packed_ms']:.2f}", f"{p['packed_over_padded']:.3f}"]
            for p in packing["passes"]
        ]  # fmt: skip
        pack = {
            "s": packing["settings"],
            "rows": rows,
            "spread": timing_line(packing.get("timing_conditions"), "Spread"),
        }
    return render_template(
        "overhead",
        overhead=over,
        packing=pack,
        host=host_work_context(load(root, HOST_WORK_NAME)),
        paired=host_work_paired_context(load(root, HOST_WORK_PAIRED_NAME)),
        split=host_work_split_context(load(root, HOST_WORK_SPLIT_NAME)),
    )


HOST_WORK_NAME = "host-work-gsm8k-3x64.json"
#: ``benchmarks/host_work.py --passes-on-core 1 --paired-control``'s results (the overhead page's second host table)
HOST_WORK_PAIRED_NAME = "host-work-gsm8k-3x64-passes-core1.json"
#: ``benchmarks/host_work.py --warm-split``'s results (the overhead page's third host table)
HOST_WORK_SPLIT_NAME = "host-work-warm-split.json"
#: The host-work page's component columns: (heading, the ``benchmarks/host_work.py`` components summed).
HOST_COLUMNS = (
    ("policy", ("policy.next_length", "policy.update", "policy.draft_tree")),
    ("searches", ("path_search", "ngram")),
    ("drafter", ("drafter.draft", "drafter.alternatives", "drafter.commit")),
    ("verify", ("verify",)),
    ("loop", ("loop",)),
)


def host_work_context(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """Host work per round of every method (``benchmarks/host_work.py``): ms per round (the least of
    the repeats), its share of the profile's target step, and the exclusive ms of each component
    group (``HOST_COLUMNS``, from the run with timers), least first, and the host probe's median and
    range over the run (``host_probe_us``), and round-like host work right after a target pass and warm
    (``after_pass_probe``; each None in a result from before it). None without results."""
    if not results:
        return None
    s, methods = results["settings"], results["methods"]
    goal = float(s["goal_ms"])
    rows = []
    for name, m in sorted(methods.items(), key=lambda item: item[1]["host_ms_per_round"]):
        parts = m.get("components") or {}
        rows.append([
            f"`{name}`",
            f"{m['host_ms_per_round']:.2f}",
            f"{100 * m['host_step_share']:.1f}%",
            *[f"{sum(parts.get(c, 0.0) for c in group):.2f}" for _, group in HOST_COLUMNS],
            str(m["rounds"]),
        ])  # fmt: skip
    values = [m["host_ms_per_round"] for m in methods.values()]
    neighbours = [m["host_ms_per_round"] for m in methods.values() if m.get("in_neighbours_table")]
    return {
        "neighbours": len(neighbours),
        "neighbours_within_goal": sum(v <= goal for v in neighbours),
        "neighbours_median": statistics.median(neighbours) if neighbours else None,
        "s": s,
        "rows": rows,
        "columns": [heading for heading, _ in HOST_COLUMNS],
        "methods": len(values),
        "within_goal": sum(v <= goal for v in values),
        "median": statistics.median(values),
        "goal": goal,
        "probe": results.get("host_probe_us"),  # the machine's host speed over the run (interleaved runs)
        # round-like host work right after a target pass, and warm (medians: a probe that names its samples)
        "after_pass": probe if (probe := results.get("after_pass_probe")) and "samples" in probe else None,
    }


def host_work_paired_context(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """Host work per round with the passes on another core than the host work and, paired, on the
    host's own core (``benchmarks/host_work.py --passes-on-core C --paired-control``): per method both
    readings (the least of the repeats) and the median of the repeats' paired ratios (each repeat's
    two readings taken back to back), least first; the counts within the goal, the medians, and the
    median and range of the methods' ratios, and the range of the single repeats' ratios, over the
    methods whose two readings decoded the same rounds (``same_rounds``: not those whose rounds
    follow measured costs). None without results."""
    if not results:
        return None
    s, methods = results["settings"], results["methods"]
    goal = float(s["goal_ms"])
    rows, ratios, pairs = [], [], []
    for name, m in sorted(methods.items(), key=lambda item: item[1]["host_ms_per_round"]):
        off, on = m["host_ms_per_round"], m["host_ms_per_round_control"]
        own = [a / b for a, b in zip(m["host_ms_per_round_repeats"], m["control_repeats"])]
        paired = statistics.median(own)
        same = m.get("same_rounds", True)
        if same:
            ratios.append(paired)
            pairs += own
        rows.append([
            f"`{name}`", f"{off:.2f}", f"{on:.2f}", f"{paired:.2f}" + ("" if same else " *"),
            "yes" if off <= goal else "no",
        ])  # fmt: skip
    off_core = [m["host_ms_per_round"] for m in methods.values()]
    on_core = [m["host_ms_per_round_control"] for m in methods.values()]
    return {
        "s": s,
        "rows": rows,
        "methods": len(rows),
        "compared": len(ratios),
        "goal": goal,
        "within_goal": sum(v <= goal for v in off_core),
        "within_goal_control": sum(v <= goal for v in on_core),
        "median": statistics.median(off_core),
        "median_control": statistics.median(on_core),
        "median_ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
        "pair_range": (min(pairs), max(pairs)),  # single repeats' ratios: the noise a pair carries
    }


def host_work_split_context(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """The heaviest host calls' own work (``benchmarks/host_work.py --warm-split``): per method and
    function it called, its calls per round, its mean µs a call in the run and warm (replayed on its
    captured inputs; "-" where it was not replayed, the reason in ``not_replayed``), the warm share,
    and both as ms per round (calls per round x µs); ``*`` where the two decodes' rounds differed; the
    command's methods and functions (``settings``) for the page's command. None without results."""
    if not results:
        return None
    s, rows, shares, unreplayed = results["settings"], [], [], []
    for method, functions in results["warm_split"].items():
        for target, r in functions.items():
            if not r["calls"]:
                continue
            name = f"`{target.rsplit('.', 1)[-1]}`" + ("" if r.get("same_rounds", True) else " *")
            warm = r["warm_us"]
            if warm is None:
                unreplayed.append(f"`{method}` / `{target}`: {r['not_replayed']}")
            else:
                shares.append(r["own_share"])
            rows.append([
                f"`{method}`", name, f"{r['calls_per_round']:.2f}", f"{r['in_run_us']:.0f}",
                "-" if warm is None else f"{warm:.0f}", "-" if warm is None else f"{100 * r['own_share']:.0f}%",
                f"{r['calls_per_round'] * r['in_run_us'] / 1e3:.2f}",
                "-" if warm is None else f"{r['calls_per_round'] * warm / 1e3:.2f}",
            ])  # fmt: skip
    low, high = (min(shares), max(shares)) if shares else (None, None)
    return {
        "s": s,
        "rows": rows,
        "flags": " ".join([*(f"--method {m}" for m in s["method"]), *(f"--warm-split {t}" for t in s["warm_split"])]),
        "share_range": None
        if low is None
        else (f"{100 * low:.0f}%" if low == high else f"{100 * low:.0f}-{100 * high:.0f}%"),
        "unreplayed": unreplayed,
        "differed": any("*" in row[1] for row in rows),
    }


# -- the model family's scale ------------------------------------------------------------------


def family_page(root: Path) -> str | None:
    r = load(root, "family-scale.json")
    if r is None:
        return None
    drafters = [[n, f"{d['params'] / 1e6:.1f}M", f"{d['block_pass_ms']:.2f}"] for n, d in r["drafters"].items()]
    targets = [
        [n, f"{t['params'] / 1e6:.1f}M", f"{t['step_ms']:.2f}", f"{t['train_tokens_per_s']:.0f}",
         f"{t['vanilla_main_job_s']:.0f}", f"{t['target_stage_h']:.1f}", t["largest_drafter"]]
        for n, t in r["targets"].items()
    ]  # fmt: skip
    s = dict(r["settings"])
    s.setdefault("torch", None)
    s.setdefault("threads", None)
    return render_template("family", s=s, targets=targets, drafters=drafters)
