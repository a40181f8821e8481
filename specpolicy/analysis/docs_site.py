"""The docs' home page answers "which strategy is fastest here, and by how much?" first: a block
of ``docs/index.md`` between ``<!-- results:fastest -->`` and ``<!-- /results:fastest -->``,
rendered from ``benchmarks/results/`` (``templates/site_fastest.md.j2``) by
``python -m specpolicy.analysis.docs``: the fastest rows per runtime (eager CPU, compiled CPU, a
GPU), each naming its results file, and the best row of each of FailFast's neighbours."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specpolicy.analysis.docs_neighbours import NEIGHBOURS_NAME
from specpolicy.analysis.docs_pages import PEERS_NAME, peers_settings
from specpolicy.analysis.docs_runtime import RUNTIME_CUDA_NAMES, RUNTIME_PEERS_NAME
from specpolicy.analysis.docs_tables import RESULTS, MissingRow, cell, load, render_template

SITE_INDEX = Path("docs/index.md")
BEGIN, END = "<!-- results:fastest -->", "<!-- /results:fastest -->"
#: The neighbours the home page names, each with how its rows are found in the neighbours run:
#: (strategy, rows whose name starts with this, or whose drafter is this).
NEIGHBOURS = (
    ("DiffuSpec (path search + ADL)", "diffuspec", None),
    ("DEER", None, "deer"),
    ("EasySpec", None, "easyspec"),
    ("DART", None, "dart"),
    ("Falcon", None, "falcon"),
    ("EAGLE-3 (the reference)", None, "eagle3"),
    ("FailFast on DFlash", "dflash+failfast", None),
)


def _ranked(methods: Mapping[str, Any], key: str = "speedup_vs_vanilla") -> list[str]:
    return sorted(
        (n for n in methods if n != "vanilla" and methods[n].get(key) is not None), key=lambda n: -methods[n][key]
    )


def _cpu_row(label: str, results: Mapping[str, Any], name: str, href: str) -> list[str]:
    methods = results["methods"]
    ranked = _ranked(methods)
    best = methods[ranked[0]]
    nxt = ", ".join(f"`{n}` {methods[n]['speedup_vs_vanilla']:.2f}x" for n in ranked[1:3])
    return [
        label,
        f"`{ranked[0]}`",
        f"{best['speedup_vs_vanilla']:.2f}x ({best['tokens_per_s']:.0f} tokens/s)",
        cell(best.get("modeled_speedup_vs_vanilla"), "{:.2f}x"),
        f"[{name}]({href})",
        nxt,
    ]


def _gpu_row(results: Mapping[str, Any], name: str) -> list[str]:
    rows = results["rows"]
    if "vanilla@compiled" not in rows:
        raise MissingRow(f"{SITE_INDEX} names the row 'vanilla@compiled', which {RESULTS}/{name} lacks")
    base = rows["vanilla@compiled"]["tokens_per_s"]
    ranked = sorted(
        (n for n in rows if n.endswith("@compiled") and not n.startswith("vanilla")),
        key=lambda n: -rows[n]["tokens_per_s"],
    )
    nxt = ", ".join(f"`{n.partition('@')[0]}` {rows[n]['tokens_per_s'] / base:.2f}x" for n in ranked[1:3])
    best = rows[ranked[0]]
    device = results["settings"].get("device_name") or "CUDA"
    return [
        f"GPU ({device}, compiled, float32)",
        f"`{ranked[0].partition('@')[0]}`",
        f"{best['tokens_per_s'] / base:.2f}x ({best['tokens_per_s']:.0f} tokens/s; compiled vanilla {base:.0f})",
        "-",
        f"[{name}](results/runtime.md#measured-on-a-gpu)",
        nxt,
    ]


def neighbour_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """Each neighbour's fastest row of the neighbours run (``MissingRow`` when one has none)."""
    methods = results["methods"]
    out = []
    for strategy, prefix, drafter in NEIGHBOURS:
        rows = [
            n
            for n in _ranked(methods)
            if (prefix and n.startswith(prefix)) or (drafter and methods[n].get("drafter") == drafter)
        ]
        if not rows:
            raise MissingRow(
                f"{SITE_INDEX} names {strategy} ({prefix or 'drafter=' + str(drafter)}), which "
                f"{RESULTS}/{NEIGHBOURS_NAME} has no row of"
            )
        m = methods[rows[0]]
        out.append(
            [strategy, f"`{rows[0]}`", f"{m['speedup_vs_vanilla']:.2f}x",
             cell(m.get("modeled_speedup_vs_vanilla"), "{:.2f}x"), cell(m.get("mean_accepted_length"), "{:.2f}")]
        )  # fmt: skip
    return out


def fastest_block(root: Path) -> str | None:
    """The home page's results block, or None without the peers and neighbours runs."""
    peers, neighbours = load(root, PEERS_NAME), load(root, NEIGHBOURS_NAME)
    if peers is None or neighbours is None:
        return None
    runtimes = [_cpu_row("eager CPU (2 cores)", peers, PEERS_NAME, "results/peers.md")]
    compiled = load(root, RUNTIME_PEERS_NAME)
    if compiled:
        href = "results/runtime.md#the-peers-table-on-the-compiled-runtime"
        runtimes.append(_cpu_row("compiled CPU (`runtime.compile=true`)", compiled, RUNTIME_PEERS_NAME, href))
    gpu = load(root, RUNTIME_CUDA_NAMES[1])
    if gpu:
        runtimes.append(_gpu_row(gpu, RUNTIME_CUDA_NAMES[1]))
    return render_template(
        "site_fastest",
        profile=peers.get("modeled_profile"),
        runtimes=[row[:-1] for row in runtimes],
        runners_up=[f"{row[0]}: {row[-1]}" for row in runtimes if row[-1]],
        neighbours=neighbour_rows(neighbours),
        neighbours_name=NEIGHBOURS_NAME,
        neighbours_settings=peers_settings(neighbours),
    )


def fill(text: str, block: str, begin: str = BEGIN, end: str = END) -> str | None:
    """``text`` with what lies between ``begin`` and ``end`` replaced by ``block``; None without them."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        return None
    return text[: start + len(begin)] + "\n" + block + text[stop:]
