"""What a new user meets first (issue 46, "What a new user met"): the docs' home page answers
"which strategy is fastest here, and by how much?" before anything else, per runtime, naming the
neighbours and the results file of every figure; the neighbours page opens with results and folds
its commands at the end; code in table cells never breaks mid-word; Getting started lists every
drafter and policy of the plugin registry."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from specpolicy.analysis import docs, docs_site
from specpolicy.plugins.hookspecs import PluginEntry
from specpolicy.plugins.manager import PluginInfo
from specpolicy.run import plugin_docs, reference

ROOT = Path(__file__).resolve().parents[2]


def _sections(text: str, level: str = "## ") -> dict[str, str]:
    """Heading -> its text (up to the next heading of the same level)."""
    parts = re.split(rf"^{level}(.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_home_page_answers_which_strategy_is_fastest_first_per_runtime():
    rendered, _ = docs.render(ROOT)
    page = rendered[docs_site.SITE_INDEX]
    assert page == (ROOT / docs_site.SITE_INDEX).read_text(encoding="utf-8"), "run python -m specpolicy.analysis.docs"
    headings = re.findall(r"^#+ .+$", page, flags=re.M)
    assert headings[1] == "## Which strategy is fastest here, and by how much?"  # the first after the title
    block = page[page.index(docs_site.BEGIN) : page.index(docs_site.END)]
    for runtime in ("eager CPU", "compiled CPU", "GPU ("):
        row = next(line for line in block.splitlines() if line.startswith(f"| {runtime}"))
        assert re.search(r"\| `[^`]+` \| \d+\.\d\dx", row) and ".json](results/" in row  # method, how much, which run
    for neighbour in ("DiffuSpec", "DEER", "EasySpec", "DART", "Falcon", "EAGLE-3"):
        assert f"| {neighbour}" in block
    assert "benchmarks/results/neighbours-gsm8k-30x256.json" in block
    # the commands come after the results, folded
    fold = page.index('??? note "Run it yourself')
    assert fold > page.index(docs_site.END)
    assert page.index("pip install torch==2.13.0 -e . && python -m specpolicy") > fold


def test_the_home_page_figures_are_the_results_files():
    page = docs_site.fastest_block(ROOT)
    import json

    peers = json.loads((ROOT / docs.RESULTS / "peers-gsm8k-30x256.json").read_text())["methods"]
    name, best = max(((n, m) for n, m in peers.items() if n != "vanilla"), key=lambda x: x[1]["speedup_vs_vanilla"])
    assert (
        f"| eager CPU (2 cores) | `{name}` | {best['speedup_vs_vanilla']:.2f}x ({best['tokens_per_s']:.0f} tokens/s)"
        in page
    )


def test_the_neighbours_page_opens_with_results_and_folds_its_commands_at_the_end():
    page = (ROOT / docs.PAGES / "neighbours.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## .+$", page, flags=re.M)
    assert headings[0].startswith("## Measured here") and headings[-2:] == [
        "## The papers' claims",
        "## Regenerate the numbers",
    ]
    regenerate = page.index("## Regenerate the numbers")
    assert "python benchmarks/peers.py" not in page[:regenerate]  # no command before the results end
    tail = page[regenerate:]
    assert tail.count('??? note "') >= 1 and "    python benchmarks/peers.py --num-prompts" in tail
    # every line of the section is a note's title or indented under one (folded, not shown open)
    body = tail.splitlines()[1:]
    assert all(not line.strip() or line.startswith(('??? note "', "    ")) for line in body)


def test_code_in_table_cells_never_breaks_mid_word():
    """mkdocs-material breaks inline code anywhere (``policy=diffusp ec``); the site's stylesheet keeps
    code in a table cell whole (the page wraps between spans and scrolls a wide table)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nplugins:")[0])
    (css,) = config["extra_css"]
    rule = (ROOT / "docs" / css).read_text()
    block = rule[rule.index(".md-typeset table:not([class]) code") :]
    assert "white-space: nowrap" in block and "word-break: keep-all" in block
    page = (ROOT / docs.PAGES / "neighbours.md").read_text(encoding="utf-8")
    assert "`policy=diffuspec`" in page  # one code span, never split in the source either


def test_getting_started_lists_every_drafter_and_policy_of_the_registry():
    page = (ROOT / plugin_docs.GETTING_STARTED).read_text(encoding="utf-8")
    assert page == reference.render(ROOT, ("getting-started.md",))[plugin_docs.GETTING_STARTED], (
        "run python -m specpolicy.run.reference"
    )
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if line.startswith("| `")}
    drafters, policies = plugin_docs.registered("drafter"), plugin_docs.registered("policy")
    assert {"dart", "deer", "easyspec", "falcon"} <= set(drafters)
    assert {"adl", "dart-tree", "falcon-tree"} <= set(policies)
    assert all(f"`{d}`" in rows["`drafter`"] for d in drafters)
    assert all(f"`{p}`" in rows["`policy`"] for p in policies)
    assert "`diffuspec` (adl)" in rows["`policy`"]  # a preset: the plugin it configures


def test_a_newly_registered_drafter_appears_in_getting_started(monkeypatch):
    infos = plugin_docs.plugin_infos

    declared = PluginEntry(kind="drafter", name="declared-drafter", factory=lambda **_: None)

    def with_two_more(pm):
        return [
            *infos(pm),
            PluginInfo("specpolicy.drafters.my_drafter", "built-in", ("make_drafter",)),  # named by its module
            PluginInfo("specpolicy.drafters.other", "built-in", ("register",), (declared,)),  # by its entry
        ]

    monkeypatch.setattr(plugin_docs, "plugin_infos", with_two_more)
    assert "`my-drafter`" in plugin_docs.choices(ROOT, "drafter")
    assert "`declared-drafter`" in plugin_docs.choices(ROOT, "drafter")
    assert "`entropy`" not in plugin_docs.choices(ROOT, "policy")  # a third-party entry point is not the package's


def test_every_table_of_the_runtime_page_names_its_results_file():
    page = (ROOT / docs.PAGES / "runtime.md").read_text(encoding="utf-8")
    intro, *_ = page.split("\n## ", 1)
    assert "benchmarks/results/runtime-gsm8k-30x256.json" in intro
    for title, text in _sections(page).items():
        if "|---" in text and title != "The batched loop":  # the batched loop: "the same run" as the intro
            assert re.search(r"benchmarks/results/[\w.-]+\.json", text), title
