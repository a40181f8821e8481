"""The results notes (``docs/results/notes.md``): why the numbers move and what each run was,
every figure read from ``benchmarks/results/`` (each naming its file) or from the config it
describes (``conf/method/dflash-failfast-tuned.yaml``'s N and τ) -- none typed by hand. Prose:
``templates/notes.md.j2``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from specpolicy.analysis.docs_pages import CEILING_NAME, DRAFTERS, PEERS_NAME, TUNE_NAME, peers_settings
from specpolicy.analysis.docs_runtime import RUNTIME_NAME
from specpolicy.analysis.docs_tables import RESULTS, MissingRow, cell, load, render_template, timing_line

TUNED_PRESET = Path("conf/method/dflash-failfast-tuned.yaml")
PAPER_DEFAULTS = Path("conf/policy/failfast.yaml")
BATCHED_NAME = "batched-gsm8k-30x128.json"
PAGE = "docs/results/notes.md"


def _settings(s: Mapping[str, Any]) -> str:
    return f"{s['num_prompts']} {s['dataset']} prompts x {s['max_new_tokens']} new tokens"


def peers_context(results: Mapping[str, Any]) -> dict[str, Any]:
    methods, profile = results["methods"], results.get("modeled_profile")
    rows = []
    for drafter, label in DRAFTERS.items():
        mine = [n for n in methods if methods[n].get("drafter") == drafter]
        if mine:
            best = max(mine, key=lambda n: methods[n].get("speedup_vs_vanilla") or 0.0)
            m = methods[best]
            rows.append([label, f"`{best}`", f"{m['speedup_vs_vanilla']:.2f}x",
                         cell(m.get("modeled_speedup_vs_vanilla"), "{:.2f}x")])  # fmt: skip
    cal = results.get("calibration") or {}
    s = results["settings"]
    return {
        "name": PEERS_NAME,
        "heading": f"{s['num_prompts']} {s['dataset'].upper()} prompts x {s['max_new_tokens']} new tokens",
        "settings": peers_settings(results),
        "count": len(methods),
        "vanilla": f"{methods['vanilla']['tokens_per_s']:.1f}",
        "spread": timing_line(results.get("timing_conditions"), "Spread"),
        "calibration_prompts": cal.get("prompts", "?"),
        "picks": ", ".join(f"{k} = {v}" for k, v in cal.items() if k not in ("prompts", "tokens_per_s")) or "-",
        "profile": profile,
        "rows": rows,
    }


def tune_context(root: Path, tune: Mapping[str, Any]) -> dict[str, Any]:
    """The retuning of FailFast for DFlash beside the preset that runs it (N and τ from the config)."""
    preset = (yaml.safe_load((root / TUNED_PRESET).read_text(encoding="utf-8")) or {}).get("policy") or {}
    paper = yaml.safe_load((root / PAPER_DEFAULTS).read_text(encoding="utf-8")) or {}
    rows = {r["method"]: r for r in tune["rows"]}
    if "dflash+failfast" not in rows:
        raise MissingRow(f"{PAGE} names the row 'dflash+failfast', which {RESULTS}/{TUNE_NAME} lacks")
    speedups = [r["speedup"] for r in tune["rows"] if r.get("n_tau")]
    best = tune["best"]
    s = tune["settings"]
    return {
        "name": TUNE_NAME,
        "settings": f"{_settings(s)} from row {s['offset']}, {s['device']} {s['dtype']}",
        "best_n": best["n"],
        "best_tau": best["tau"],
        "best_speedup": f"{best['speedup']:.2f}x",
        "paper_speedup": f"{rows['dflash+failfast']['speedup']:.2f}x",
        "grid_spread": f"{min(speedups):.2f}-{max(speedups):.2f}x",
        "paper_n": paper.get("n"),
        "paper_tau": paper.get("tau"),
        "preset_n": preset.get("n"),
        "preset_tau": preset.get("tau"),
    }


def notes_page(root: Path) -> str | None:
    """The notes page, or None when a results file it reads is missing."""
    peers, tune, ceiling = load(root, PEERS_NAME), load(root, TUNE_NAME), load(root, CEILING_NAME)
    packing, batched, runtime = load(root, "packing.json"), load(root, BATCHED_NAME), load(root, RUNTIME_NAME)
    if None in (peers, tune, ceiling, packing, batched, runtime):
        return None
    ceiling_rows = [
        [drafter, policy, f"{m['fraction_of_oracle']:.3f}"]
        for drafter, d in ceiling["drafters"].items()
        for policy, m in d["methods"].items()
    ]
    packing_rows = [[str(p["batch_size"]), p["drafts"], f"{p['packed_over_padded']:.2f}"] for p in packing["passes"]]
    summaries = {b: v.get("_summary") or {} for b, v in batched["batch_sizes"].items()}
    batched_rows = [
        [
            b,
            str(s.get("best_fixed_k", "-")).replace("static-", ""),
            cell(s.get("goodput_batch_over_best_fixed"), "{:.3f}"),
        ]
        for b, s in summaries.items()
    ]
    rows = runtime["rows"]
    return render_template(
        "notes",
        peers=peers_context(peers),
        tune=tune_context(root, tune),
        ceiling={"name": CEILING_NAME, "settings": _settings(ceiling["settings"]), "rows": ceiling_rows},
        packing_rows=packing_rows,
        batched={"name": BATCHED_NAME, "rows": batched_rows},
        runtime={
            "name": RUNTIME_NAME,
            "vanilla": f"{rows['vanilla@compiled']['tokens_per_s'] / rows['vanilla@eager']['tokens_per_s']:.2f}x",
            "identical": "yes" if all(r["identical"] for r in rows.values()) else "NO",
            "bandwidth": f"{runtime['machine']['bandwidth_GBps']:.1f}",
        },
    )
