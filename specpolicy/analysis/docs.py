"""The results pages of the documentation, rendered from the measured results -- one path from
``benchmarks/results/*.json`` to ``docs/results/*.md``, never copied by hand.

``python -m specpolicy.analysis.docs`` writes, under the repository root (``--root``, default the
current directory):

* ``docs/results/*.md``: one page per family of results (the peer benchmark, the paper's tables,
  batched decoding, the drafters that read the target and the limit of a length policy, the
  loop's overhead, the model family's scale), each naming the command that regenerates its
  numbers and the measured spread the JSON records (vanilla decoding's speed across prompts,
  per-prompt ranges); MODELED figures are labelled as such;
* ``docs/assets/headline.png``: the peer benchmark's measured speedups (matplotlib, Agg);
* ``docs/assets/results/*.png``: the figures the benchmarks drew, for the pages to show;
* the results block of the docs' home page (``docs/index.md``, between ``<!-- results:fastest -->``
  and ``<!-- /results:fastest -->``: the fastest rows per runtime and FailFast's neighbours);
* the headline table of ``README.md``, between ``<!-- results:headline -->`` and
  ``<!-- /results:headline -->`` (skipped, with a note, when the markers are absent).

``--check`` renders in memory and exits 1 naming every stale file when what is committed differs
(a PNG the generator draws is compared by the digest of the data it plots, stored in the PNG's
``Description`` text chunk, so another matplotlib version's pixels do not count as stale).

The pages' prose is in Markdown templates (``specpolicy/analysis/templates/*.md.j2``, Jinja2);
their tables are built by ``docs_pages`` (peers, paper, batched, length policies, overhead, family),
``docs_neighbours`` and ``docs_runtime``, with the helpers of ``docs_tables``. A row a page names and
the results lack stops the render with one line naming the page, the row and the results file
(``docs_tables.MissingRow``). Column titles and formats come from
``specpolicy.analysis.labels.FIGURES``, the one metric list.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specpolicy.analysis.docs_neighbours import (
    DIAGNOSTICS_KINDS,
    EASYSPEC_DEPTH_NAME,
    HEAD_KINDS,
    NEIGHBOURS_NAME,
    neighbours_page,
)
from specpolicy.analysis.docs_notes import notes_page
from specpolicy.analysis.docs_pages import (
    DRAFTERS,
    FIGURE_COPIES,
    PEERS_NAME,
    batched_page,
    drafters_page,
    family_page,
    headline_markdown,
    method_name,
    overhead_page,
    paper_page,
    peers_page,
    peers_settings,
)
from specpolicy.analysis.docs_runtime import (
    RUNTIME_CUDA_NAMES,
    RUNTIME_NAME,
    RUNTIME_PEERS_NAME,
    batched_runtime_section,
    runtime_page,
)
from specpolicy.analysis.docs_site import BEGIN as SITE_BEGIN, END as SITE_END, SITE_INDEX, fastest_block, fill
from specpolicy.analysis.docs_tables import GENERATED, RESULTS, MissingRow, load, markdown_table
from specpolicy.analysis.labels import FIGURES

__all__ = ["MissingRow", "batched_runtime_section", "main", "render", "sync"]

PAGES = Path("docs/results")
ASSETS = Path("docs/assets")
HEADLINE_PNG = ASSETS / "headline.png"
README = Path("README.md")
BEGIN, END = "<!-- results:headline -->", "<!-- /results:headline -->"
DIGEST_KEY = "Description"
DIGEST_PREFIX = "specpolicy-docs data sha256 "


# -- overview, headline figure -----------------------------------------------------------------


PAGE_TITLES = {
    "peers.md": "Peers: every method on the bundled family",
    "paper.md": "The paper's tables",
    "batched.md": "Batched decoding",
    "drafters.md": "Length policies: tuning and the oracle",
    "overhead.md": "Loop overhead and verification packing",
    "family.md": "Scaling the bundled model family",
    "neighbours.md": "FailFast's neighbours: the papers' claims beside this testbed",
    "runtime.md": "The compiled runtime: eager vs compiled, and the machine's floor",
}


def index_page(pages: Sequence[str], headline: Sequence[str] | None) -> str:
    links = [f"- [{PAGE_TITLES[p]}]({p})" for p in PAGE_TITLES if p in pages]
    body = [
        "Every table in these pages is rendered from `benchmarks/results/` by `python -m specpolicy.analysis.docs` "
        "(`--check` says which pages are stale); each page names the command that regenerates its numbers. "
        "Figures labelled MODELED come from forward-pass counts x a latency profile, not from a clock.",
        "",
        *links,
        "- [Notes on the runs](notes.md): which host, which round of training, why a number moved.",
        "",
    ]
    if headline:
        body += [
            "## Headline",
            "",
            *[line.replace("docs/results/peers.md", "peers.md") for line in headline],
            "",
            "![Measured speedup over vanilla decoding per method](../assets/headline.png)",
            "",
        ]
    return "\n".join([GENERATED, "", "# Results", "", *body]).rstrip() + "\n"


def headline_data(results: Mapping[str, Any]) -> list[tuple[str, float, str | None]]:
    """``(method, measured speedup, drafter)`` of every peer row without draft reuse, slowest first."""
    rows = [
        (method_name(n, m), float(m["speedup_vs_vanilla"]), m.get("drafter"))
        for n, m in results["methods"].items()
        if "+reuse" not in n and m.get("speedup_vs_vanilla") is not None
    ]
    return sorted(rows, key=lambda r: r[1])


def data_digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def headline_png(results: Mapping[str, Any]) -> bytes:
    """The peer benchmark's measured speedups as a horizontal bar chart (one bar per method, by
    drafter colour), the digest of the plotted data in the PNG's ``Description``."""
    from specpolicy.analysis.plot import _pyplot

    plt = _pyplot()
    rows = headline_data(results)
    colors = dict(zip([None, *DRAFTERS], plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(8.0, 0.22 * len(rows) + 1.4), dpi=100)
    ax.barh(range(len(rows)), [r[1] for r in rows], color=[colors.get(r[2], "grey") for r in rows])
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    for i, (_, value, _) in enumerate(rows):
        ax.text(value + 0.02, i, f"{value:.2f}x", va="center", fontsize=6.5)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup vs vanilla decoding (measured, same run, methods interleaved per prompt)", fontsize=8)
    ax.set_title(f"benchmarks/peers.py: {peers_settings(results)}", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[d]) for d in [*DRAFTERS, None]]
    ax.legend(
        handles,
        [*DRAFTERS.values(), "none (vanilla, n-gram lookup)"],
        fontsize=7,
        loc="lower right",
        title="drafter",
        title_fontsize=7,
    )
    ax.margins(y=0.01)
    ax.set_xlim(0, max(r[1] for r in rows) * 1.12)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": None, DIGEST_KEY: DIGEST_PREFIX + data_digest(rows)})
    plt.close(fig)
    return out.getvalue()


def png_digest(data: bytes) -> str | None:
    from PIL import Image

    text = getattr(Image.open(io.BytesIO(data)), "text", {}) or {}
    value = text.get(DIGEST_KEY, "")
    return value[len(DIGEST_PREFIX) :] if value.startswith(DIGEST_PREFIX) else None


# -- the metric glossary -----------------------------------------------------------------------


METRICS_PAGE = Path("docs/reference/metrics.md")


#: Which figures are clock-free and which follow this machine's clock (the glossary's section).
CLOCK_SECTION = [
    "## Which figures follow the clock",
    "",
    *markdown_table(
        ["figure", "clock-free?", "why"],
        [
            [
                "MODELED speedup (`modeled_speedup_vs_vanilla`, a shipped profile such as `a6000-qwen7b`)",
                "yes",
                "forward-pass counts x the profile's costs: the same rounds give the same figure on any machine",
            ],
            [
                "oracle fraction with the profile's costs (`oracle.profile_costs.fraction_of_oracle`)",
                "yes",
                "the policy's and the oracle's rounds priced with the profile's costs",
            ],
            [
                "oracle fraction with measured costs (`oracle.fraction_of_oracle`)",
                "no",
                "the rounds priced with this run's measured drafting and verification ms",
            ],
            ["measured speedup, tokens/s, TTFT / TPOT / latency", "no", "wall-clock timings of this machine"],
            ["MODELED speedup with `profile=measured`", "no", "the profile's costs are fitted on this run's timings"],
            [
                "anything of a cost-aware policy (`goodput`, `goodput-batch`), MODELED included",
                "no",
                "the policy picks its lengths from this machine's measured costs, so its rounds follow the load "
                "(clock-free again when `policy.cost_profile=` prices them with a profile)",
            ],
            [
                "acceptance rate, accepted and speculation lengths, rounds, passes (any other policy)",
                "yes",
                "counts of the rounds, which a length policy that reads no clock chooses alike on any machine",
            ],
        ],
        text_columns=3,
    ),
    "",
    "Compare methods across jobs or machines by the clock-free figures; compare measured speedups within one "
    "run (`benchmarks/peers.py` interleaves methods per prompt). The run's oracle line gives both fractions.",
    "",
]


def _definitions() -> list[str]:
    """The "Definitions:" list of ``specpolicy.analysis.metrics``' docstring, as Markdown items."""
    from specpolicy.analysis import metrics

    text = (metrics.__doc__ or "").split("Definitions:", 1)[-1]
    items: list[str] = []
    after: list[str] = []  # the paragraph after the list (not an item)
    for line in text.strip().splitlines():
        if line.startswith("* ") and not after:
            items.append(line[2:].strip())
        elif items and line.startswith("  ") and not after:
            items[-1] += " " + line.strip()
        elif line.strip():
            after.append(line.strip())
    return [f"- {item}" for item in items] + (["", " ".join(after)] if after else [])


def metrics_page() -> str:
    """The metric glossary: the figures of the one metric list (``labels.FIGURES``: how each is titled
    and formatted), their definitions (``metrics.FIELDS`` and the module's definitions), and every
    ``summary.json`` field."""
    from specpolicy.analysis.metrics import FIELDS

    def meaning(key: str) -> str:
        if key == "lossless":  # the count of prompts equal to vanilla; its fraction and the sampling case
            return f"k/n prompts whose {FIELDS['lossless_fraction'].split(' whose ', 1)[-1]}; {FIELDS['lossless']}"
        return FIGURES[key].definition or FIELDS.get(key) or FIELDS.get(f"methods.*.{key}") or "-"

    figures = [
        [f"`{key}`", fig.label, fig.short, meaning(key), "yes" if fig.drafting else "no"]
        for key, fig in FIGURES.items()
    ]
    fields = [[f"`{key}`", text.replace("[", "\\[")] for key, text in FIELDS.items()]
    lines = [
        "<!-- Generated by `python -m specpolicy.analysis.docs` from specpolicy/analysis/labels.py (FIGURES) and "
        "specpolicy/analysis/metrics.py (FIELDS): edit those, not this file. -->",
        "",
        "# Metric glossary",
        "",
        "Every number a run prints comes from one function, `specpolicy.analysis.summary.summarize`, over the run's "
        "per-prompt results (`results.jsonl`), so the run's own table, the sweep report "
        "(`python -m specpolicy.analysis.report`) and `benchmarks/peers.py` print the same figure under the same "
        "name. Every `summary.json` also carries these definitions under `fields`.",
        "",
        '!!! note "Draft trees count nodes"',
        "    A row whose method verifies a draft tree (`policy=eagle2-tree`, `block-tree`, `failfast-tree`; marked "
        "(tree) in the results pages) counts tree NODES: its speculation length is the number of nodes verified "
        "in the round and its acceptance rate is accepted tokens / nodes verified. A tree of 60 nodes that "
        "accepts 6 tokens shows speculation length 60.00 and acceptance rate 0.10 -- not comparable with a "
        "chain's. Its accepted length is the accepted path, and `mean_draft_depth` its deepest node.",
        "",
        "## The columns of the run's table",
        "",
        "What `python -m specpolicy` prints after a run (one row per figure; `run.wide_tables=true`: one column "
        "each), the report's and the peer table's column titles, and what each figure is. \"Drafting only\": "
        "shown as `-` for a method that never drafted (vanilla).",
        "",
        *markdown_table(
            ["summary.json key", "row (the run's table)", "column (report, peers)", "definition", "drafting only"],
            figures,
            4,
        ),
        "",
        "Figures marked MODELED come from forward-pass counts x a latency profile (`profile=`, "
        "[Configuration keys](config.md#profile)), not from a clock.",
        "",
        *CLOCK_SECTION,
        "## Definitions",
        "",
        *_definitions(),
        "",
        "## Every summary.json field",
        "",
        *markdown_table(["field", "what it holds"], fields, 2),
        "",
    ]
    return "\n".join(lines).rstrip() + "\n"


# -- render, write, check ----------------------------------------------------------------------


#: Drafters whose acceptance headroom was measured (``benchmarks/acceptance_headroom.py``).
HEADROOM_KINDS = ("ar", "eagle3")


def bundled_heads() -> dict[str, dict[str, Any] | None]:
    """Each bundled drafter's acceptance head's ``config.json`` (``<bundle>/<kind>-drafter/acceptance-head/``,
    its ``calibration`` written by the head's training), parsed; None for a drafter without one."""
    from specpolicy.models.acceptance_head import CONFIG_FILE, HEAD_DIR
    from specpolicy.models.sources import bundled_dir

    paths = {kind: bundled_dir() / f"{kind}-drafter" / HEAD_DIR / CONFIG_FILE for kind in HEAD_KINDS}
    return {kind: json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None for kind, p in paths.items()}


def fill_readme(text: str, block: Sequence[str]) -> str | None:
    """``text`` with the lines between the headline markers replaced by ``block``; None without markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[: start + len(BEGIN)] + "\n" + "\n".join(block) + "\n" + text[end:]


def render(root: Path) -> tuple[dict[Path, str | bytes], list[str]]:
    """Every file the docs take from the results: ``{path relative to root: content}`` (text or
    PNG bytes), and notes on what was skipped."""
    out: dict[Path, str | bytes] = {}
    notes: list[str] = []
    peers_name = PEERS_NAME
    peers = load(root, peers_name)
    pages = {
        "peers.md": peers_page(peers, peers_name) if peers else None,
        "paper.md": paper_page(root),
        "batched.md": batched_page(root, "batched-gsm8k-30x128.json"),
        "drafters.md": drafters_page(root),
        "overhead.md": overhead_page(root),
        "family.md": family_page(root),
        "neighbours.md": neighbours_page(
            load(root, NEIGHBOURS_NAME),
            load(root, EASYSPEC_DEPTH_NAME),
            load(root, RUNTIME_CUDA_NAMES[1]),
            {kind: load(root, f"diagnostics-{kind}-gsm8k.json") for kind in DIAGNOSTICS_KINDS},
            bundled_heads(),
            {kind: load(root, f"acceptance-headroom-{kind}.json") for kind in HEADROOM_KINDS},
        ),
        "notes.md": notes_page(root),
        "runtime.md": runtime_page(
            load(root, RUNTIME_NAME),
            load(root, RUNTIME_PEERS_NAME),
            load(root, NEIGHBOURS_NAME),
            [load(root, name) for name in RUNTIME_CUDA_NAMES],
        ),
    }
    for page, text in pages.items():
        if text is None:
            notes.append(f"{PAGES / page}: no results to render")
        else:
            out[PAGES / page] = text
    headline = headline_markdown(peers, peers_name) if peers else None
    out[PAGES / "index.md"] = index_page([p for p, t in pages.items() if t], headline)
    out[METRICS_PAGE] = metrics_page()
    if peers:
        out[HEADLINE_PNG] = headline_png(peers)
        readme = root / README
        filled = fill_readme(readme.read_text(encoding="utf-8"), headline) if readme.is_file() else None
        if filled is None:
            notes.append(f"{README}: no {BEGIN} ... {END} markers; headline table not written")
        else:
            out[README] = filled
    fastest = fastest_block(root)
    site = root / SITE_INDEX
    filled = fill(site.read_text(encoding="utf-8"), fastest) if fastest and site.is_file() else None
    if filled is None:
        notes.append(
            f"{SITE_INDEX}: no results or no {SITE_BEGIN} ... {SITE_END} markers; its results block not written"
        )
    else:
        out[SITE_INDEX] = filled
    for src, dest in FIGURE_COPIES:
        if (root / RESULTS / src).is_file():
            out[ASSETS / "results" / dest] = (root / RESULTS / src).read_bytes()
    return out, notes


def unchanged(path: Path, content: str | bytes) -> bool:
    """Whether the committed ``path`` already holds ``content`` (the drawn PNG: the same data digest,
    so another matplotlib's pixels are not a change)."""
    if not path.is_file():
        return False
    if path.name == HEADLINE_PNG.name and isinstance(content, bytes):
        return png_digest(path.read_bytes()) == png_digest(content)
    if isinstance(content, bytes):
        return path.read_bytes() == content
    return path.read_text(encoding="utf-8") == content


def stale(root: Path, rendered: Mapping[Path, str | bytes]) -> list[Path]:
    """The rendered files whose committed copy differs."""
    return [rel for rel, content in rendered.items() if not unchanged(root / rel, content)]


def sync(root: Path, rendered: Mapping[Path, str | bytes], check: bool, command: str) -> int:
    """Write the rendered files that differ from the committed ones; with ``check``, write nothing and
    return 1 naming them (``command`` regenerates them). Shared by this module and
    ``specpolicy.run.reference``."""
    found = stale(root, rendered)
    if check:
        if found:
            print(f"stale: {', '.join(map(str, found))} -- run `{command}`", file=sys.stderr)
            return 1
        print(f"up to date: {', '.join(map(str, rendered))}")
        return 0
    for rel in found:
        path, content = root / rel, rendered[rel]
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    print(f"wrote {len(found)} of {len(rendered)} files under {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specpolicy.analysis.docs",
        description="Render the documentation's results pages, the README headline table "
        "and the headline figure from benchmarks/results/.",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="repository root holding benchmarks/results/, docs/ and README.md (default: .)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming the files that differ from what would be rendered",
    )
    args = p.parse_args(argv)
    root = args.root
    if not (root / RESULTS).is_dir():
        p.error(f"--root {root}: no {RESULTS}/ there (run from the repository root or pass --root)")
    try:
        rendered, notes = render(root)
    except MissingRow as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return sync(root, rendered, args.check, "python -m specpolicy.analysis.docs")


if __name__ == "__main__":
    raise SystemExit(main())
