"""The results pages are rendered from benchmarks/results/ by one script
(``python -m specpolicy.analysis.docs``): the committed pages equal its render, and ``--check``
names a page that was edited by hand or left behind by a new result."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from specpolicy.analysis import docs

ROOT = Path(__file__).resolve().parents[2]


def test_committed_pages_equal_the_render(capsys):
    rendered, _ = docs.render(ROOT)
    assert docs.PAGES / "peers.md" in rendered and docs.HEADLINE_PNG in rendered
    assert docs.stale(ROOT, rendered) == [], "run `python -m specpolicy.analysis.docs` and commit the pages"
    assert docs.main(["--root", str(ROOT), "--check"]) == 0


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    """The results, the pages, the assets, the README and the configs (the notes read two), copied:
    the tree is never written."""
    shutil.copytree(ROOT / docs.RESULTS, tmp_path / docs.RESULTS)
    shutil.copytree(ROOT / docs.PAGES, tmp_path / docs.PAGES)
    shutil.copytree(ROOT / docs.ASSETS, tmp_path / docs.ASSETS)
    shutil.copy(ROOT / docs.README, tmp_path / docs.README)
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    return tmp_path


def test_check_names_a_page_edited_by_hand(copy: Path, capsys):
    page = copy / docs.PAGES / "batched.md"
    page.write_text(page.read_text(encoding="utf-8").replace("(1.00x)", "(1.01x)", 1), encoding="utf-8")
    assert docs.main(["--root", str(copy), "--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/results/batched.md" in err and "peers.md" not in err
    assert docs.main(["--root", str(copy)]) == 0  # re-rendering restores it
    assert docs.main(["--root", str(copy), "--check"]) == 0
    assert page.read_text(encoding="utf-8") == (ROOT / docs.PAGES / "batched.md").read_text(encoding="utf-8")


def test_a_new_result_makes_its_page_and_the_headline_figure_stale(copy: Path, capsys):
    path = copy / docs.RESULTS / "peers-gsm8k-30x256.json"
    results = json.loads(path.read_text(encoding="utf-8"))
    results["methods"]["eagle3+static-best"]["speedup_vs_vanilla"] = 9.87
    path.write_text(json.dumps(results), encoding="utf-8")
    assert docs.main(["--root", str(copy), "--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/results/peers.md" in err and "docs/assets/headline.png" in err and "batched.md" not in err
    assert docs.main(["--root", str(copy)]) == 0
    tokens_per_s = results["methods"]["eagle3+static-best"]["tokens_per_s"]
    assert f"| eagle3+static-best | {tokens_per_s:.1f} | 9.87x |" in (copy / docs.PAGES / "peers.md").read_text(
        encoding="utf-8"
    )
    assert docs.main(["--root", str(copy), "--check"]) == 0


def test_readme_headline_block_is_filled_between_the_markers(copy: Path):
    readme = copy / docs.README
    readme.write_text(f"# specpolicy\n\nintro\n\n{docs.BEGIN}\nold table\n{docs.END}\n\nrest\n", encoding="utf-8")
    assert docs.main(["--root", str(copy), "--check"]) == 1
    assert docs.main(["--root", str(copy)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert "old table" not in text and text.startswith("# specpolicy\n\nintro\n\n") and text.endswith("\n\nrest\n")
    block = text[text.index(docs.BEGIN) : text.index(docs.END)]
    methods = json.loads((copy / docs.RESULTS / "peers-gsm8k-30x256.json").read_text(encoding="utf-8"))["methods"]
    name, row = max(
        ((n, r) for n, r in methods.items() if r.get("drafter") == "eagle3"), key=lambda x: x[1]["tokens_per_s"]
    )
    assert (
        f"| {name} | {row['tokens_per_s']:.1f} | {row['speedup_vs_vanilla']:.2f}x |" in block
    )  # EAGLE-3's fastest row
    assert "MODELED speedup, a6000-qwen7b" in block
    assert "| acceptance rate |" in block
    assert docs.main(["--root", str(copy), "--check"]) == 0


def test_pages_say_what_is_modeled_and_what_tree_rows_count():
    rendered, _ = docs.render(ROOT)
    peers = rendered[docs.PAGES / "peers.md"]
    assert "| eagle3+eagle2-tree-paper (tree) |" in peers and "count tree NODES" in peers
    assert "MODELED speedup, a6000-qwen32b" in peers and "python benchmarks/peers.py --num-prompts 30" in peers
    for page in ("batched.md", "drafters.md", "paper.md"):
        assert "MODELED" in rendered[docs.PAGES / page] and "```bash" in rendered[docs.PAGES / page]


def test_metric_glossary_is_rendered_from_the_figures_and_fields():
    from specpolicy.analysis.metrics import FIELDS
    from specpolicy.analysis.tables import FIGURES

    page = docs.render(ROOT)[0][docs.METRICS_PAGE]
    for key, figure in FIGURES.items():  # every column of the run's table, with its printed titles
        assert f"| `{key}` | {figure.label} | {figure.short} |" in page
    assert all(f"| `{key}` |" in page for key in FIELDS)
    assert "counts tree NODES" in page and "speculation length is the number of nodes verified" in page


def test_missing_results_directory_is_one_line(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exc:
        docs.main(["--root", str(tmp_path), "--check"])
    assert exc.value.code == 2
    assert "--root" in capsys.readouterr().err


def test_runtime_batched_section_compares_shared_caches_with_copies_and_marks_sampled_rows():
    """``benchmarks/runtime.py --batch-temperature 1 --batch-copies``: the section gives each row's
    shared-cache / eager-copies ratio from the same run and marks sampled rows as not compared."""
    from specpolicy.analysis.docs import batched_runtime_section

    def row(tps, identical):
        return {"tokens_per_s": tps, "speedup_vs_eager_batched_vanilla": tps / 200, "mean_accepted_length": 2.0,
                "identical": identical}  # fmt: skip

    batched = {
        "vanilla-batch4@eager": row(200.0, True),
        "eagle3+static-k4-batch4@eager": row(300.0, True),
        "eagle3+static-k4-batch4-t1@eager": row(240.0, None),
        "eagle3+static-k4-batch4@compiled": row(600.0, True),
        "eagle3+static-k4-batch4@compiled-copies": row(500.0, True),
        "eagle3+static-k4-batch4-t1@compiled": row(480.0, None),
        "eagle3+static-k4-batch4-t1@compiled-copies": row(400.0, None),
    }
    results = {
        "batched": batched,
        "settings": {"batch_size": 4, "prompts_timed": 3, "batch_repeats": 2},
        "warmup": {"batched_drafter_s": 5.0, "batched_verifier_s": 9.0},
    }
    text = "\n".join(batched_runtime_section(results))
    assert "`eagle3+static-k4-batch4` 1.20x, `eagle3+static-k4-batch4-t1` 1.20x" in text  # shared over copies
    assert "`eagle3+static-k4-batch4-t1` 2.00x" in text  # compiled over eager, sampled
    assert "temperature 1" in text
    assert "| `eagle3+static-k4-batch4-t1` | compiled-copies | 400.0 |" in text and text.count("| sampled |") == 3


@pytest.mark.parametrize(
    ("results_file", "row", "page"),
    [
        ("neighbours-gsm8k-30x256.json", "deer-k16", "docs/results/neighbours.md"),  # a section's row
        ("neighbours-gsm8k-30x256.json", "falcon+falcon-tree-paper", "docs/results/neighbours.md"),
        ("peers-gsm8k-30x256.json", "fastdllm+failfast", "the headline"),
    ],
)
def test_a_row_a_page_names_and_the_results_lack_is_a_one_line_error(copy: Path, capsys, results_file, row, page):
    """A renamed or dropped method never silently drops its section: the render stops with one line
    naming the page, the row and the results file, and writes nothing."""
    path = copy / docs.RESULTS / results_file
    results = json.loads(path.read_text(encoding="utf-8"))
    results["methods"][row + "-renamed"] = results["methods"].pop(row)
    path.write_text(json.dumps(results), encoding="utf-8")
    with pytest.raises(docs.MissingRow, match=re.escape(f"names the row {row!r}")):
        docs.render(copy)
    before = {p: p.read_bytes() for p in (copy / docs.PAGES).iterdir()}
    assert docs.main(["--root", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert page in err and repr(row) in err and f"benchmarks/results/{results_file}" in err
    assert {p: p.read_bytes() for p in (copy / docs.PAGES).iterdir()} == before


def test_the_notes_hold_no_hand_typed_figure():
    """Every figure of docs/results/notes.md is rendered (issue 46: one of 92 hand-typed figures was
    wrong): its template's prose, outside code and links, holds no decimal, percentage or ratio."""
    template = (Path(docs.__file__).parent / "templates" / "notes.md.j2").read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```|`[^`]*`|\{\{.*?\}\}|\{%.*?%\}|\]\([^)]*\)|MATH-500|AIME 2024", "", template, flags=re.S)
    found = [m.group(0) for m in re.finditer(r"\d+\.\d+|\d+\s?%|\d+(?:\.\d+)?x\b|\b\d{2,}\b", prose)]
    assert not found, found


def test_the_notes_give_the_tuned_preset_as_its_config_says(copy: Path):
    """``method=dflash-failfast-tuned``'s N and τ on the notes page are read from its config (the
    figure the hand-typed page had wrong), beside the retuning run's best point."""
    page = docs.render(copy)[0][docs.PAGES / "notes.md"]
    tune = json.loads((copy / docs.RESULTS / "tune-failfast-dflash.json").read_text())["best"]
    assert f"the N x τ grid was N = {tune['n']}, τ = {tune['tau']}" in page
    assert "`method=dflash-failfast-tuned` (`conf/method/dflash-failfast-tuned.yaml`) runs N = 5, τ = 0.7." in page
    preset = copy / "conf/method/dflash-failfast-tuned.yaml"
    preset.write_text(preset.read_text().replace("tau: 0.7", "tau: 0.6"))
    assert "runs N = 5, τ = 0.6." in docs.render(copy)[0][docs.PAGES / "notes.md"]


def test_the_heads_calibration_rows_come_from_each_bundled_heads_config():
    """The neighbours page's acceptance-head rows (head and confidence, ECE and Brier by draft position)
    are the bundled heads' ``config.json`` ``calibration``, not typed: a changed figure shows on the page."""
    from specpolicy.analysis.docs_neighbours import HEAD_KINDS, head_calibration_context

    heads = docs.bundled_heads()
    assert set(heads) == set(HEAD_KINDS) and all(heads.values())
    page = (ROOT / docs.PAGES / "neighbours.md").read_text(encoding="utf-8")
    context = head_calibration_context(heads)
    assert context is not None and len(context["rows"]) == 2 * len(HEAD_KINDS)
    eagle3 = heads["eagle3"]["calibration"]
    at1 = eagle3["by_distance"][0]
    row = f"| EAGLE-3 head | {eagle3['head']['ece']:.3f} | {at1['head_ece']:.3f}/"
    assert row in page
    changed = json.loads(json.dumps(heads))
    changed["eagle3"]["calibration"]["head"]["ece"] = 0.987
    changed["ar"] = None  # a drafter without a head: no row
    again = head_calibration_context(changed)
    assert again is not None and len(again["rows"]) == 2 * (len(HEAD_KINDS) - 1)
    assert ["EAGLE-3 head", "0.987"] == again["rows"][0][:2] and again["rows"][1][0] == "EAGLE-3 confidence"
    assert head_calibration_context({kind: None for kind in HEAD_KINDS}) is None


def test_the_headroom_rows_come_from_the_headroom_results():
    """The neighbours page's headroom rows (``benchmarks/acceptance_headroom.py``) show each result's
    confidence AUC and its best fitted set, found in the results, not typed."""
    from specpolicy.analysis.docs_neighbours import headroom_context

    results = {kind: docs.load(ROOT, f"acceptance-headroom-{kind}.json") for kind in docs.HEADROOM_KINDS}
    assert all(results.values())
    page = (ROOT / docs.PAGES / "neighbours.md").read_text(encoding="utf-8")
    context = headroom_context(results)
    assert context is not None and len(context["rows"]) == len(docs.HEADROOM_KINDS)
    for row in context["rows"]:
        assert "| " + " | ".join(row) + " |" in page
    changed = json.loads(json.dumps(results))
    changed["ar"]["sets"]["+entropy"]["mlp16"]["auc"] = 0.99  # a better set: it becomes the best
    row = headroom_context({"ar": changed["ar"], "eagle3": None})["rows"][0]  # type: ignore[index]
    assert row[0] == "AR" and row[3].startswith("0.9900 (+entropy; +")
    assert headroom_context({"ar": None}) is None


def test_the_host_work_rows_come_from_the_host_work_results():
    """The overhead page's host-work table: every method of ``benchmarks/host_work.py``'s results,
    least host ms first, the count within the goal computed from them."""
    from specpolicy.analysis.docs_pages import HOST_WORK_NAME, host_work_context

    results = docs.load(ROOT, HOST_WORK_NAME)
    assert results is not None
    context = host_work_context(results)
    assert context is not None and len(context["rows"]) == len(results["methods"])
    ms = [float(row[1]) for row in context["rows"]]
    assert ms == sorted(ms)
    page = (ROOT / docs.PAGES / "overhead.md").read_text(encoding="utf-8")
    assert "| " + " | ".join(context["rows"][0]) + " |" in page
    changed = json.loads(json.dumps(results))
    name = next(iter(changed["methods"]))
    changed["methods"][name]["host_ms_per_round"] = 0.01  # now within the goal, and first
    again = host_work_context(changed)
    assert again is not None and again["rows"][0][0] == f"`{name}`"
    assert again["within_goal"] == sum(m["host_ms_per_round"] <= 0.4 for m in changed["methods"].values())
    changed["methods"][name]["in_neighbours_table"] = True  # the bar's rows: counted apart
    marked = [m for m in changed["methods"].values() if m.get("in_neighbours_table")]
    again = host_work_context(changed)
    assert again is not None and again["neighbours"] == len(marked)
    assert again["neighbours_within_goal"] == sum(m["host_ms_per_round"] <= 0.4 for m in marked) >= 1
    assert host_work_context(None) is None
    # the host probe's median and range reach the page's prose; a result from before the probe has none
    changed["host_probe_us"] = {"median": 163.4, "min": 150.2, "max": 412.9}
    changed["settings"]["interleaved"] = True
    context_with = host_work_context(changed)
    assert context_with is not None and context_with["probe"] == changed["host_probe_us"]
    from specpolicy.analysis.docs_tables import render_template

    def page(host):
        return render_template("overhead", overhead=None, packing=None, host=host, paired=None)

    prose = page(context_with)
    assert "read 163 µs (median; 150-413)" in prose and "interleaved" in prose
    del changed["host_probe_us"]
    assert "host_probe_us" not in page(host_work_context(changed)) and "interleaved" in prose
    changed["settings"]["interleaved"] = False  # a result read method after method says nothing of it
    assert (
        "interleaved"
        not in page(host_work_context(changed)).split("## Host work with")[0].split("Host work per round")[1]
    )
    # the after-pass probe reaches the prose with its two readings and their ratio; absent, nothing is said
    changed["after_pass_probe"] = {"after_pass_us": 151.6, "warm_us": 11.4, "factor": 151.6 / 11.4, "samples": 9}
    assert "took 152 µs right after a pass of the target" in page(host_work_context(changed))
    assert "and 11 µs warm, back to back (medians of 9 each; 13x)" in page(host_work_context(changed))
    assert "slept as long as that pass took" not in page(host_work_context(changed))  # a probe without the wait
    changed["after_pass_probe"].update(after_wait_us=61.2, wait_factor=61.2 / 11.4, pass_ms=8.04)
    assert (
        "right after the host then slept as long as that pass took (a median 8.0 ms, no pass; the two "
        "alternating) the same work took 61 µs (5x warm)" in page(host_work_context(changed))
    )
    assert "The difference, 90 µs, is what the pass adds to time alone." in page(host_work_context(changed))
    del changed["after_pass_probe"]
    assert "after_pass_probe" not in page(host_work_context(changed))


def test_the_paired_host_work_ratio_is_taken_within_each_repeat_over_the_methods_that_decode_alike():
    """The overhead page's second host table: a method's ratio is the median of its repeats' own
    ratios (each repeat's two readings back to back), not the ratio of the two least readings; the
    methods whose readings decoded different rounds are marked and left out of the median and range."""
    from specpolicy.analysis.docs_pages import host_work_paired_context

    def method(off, on, same=True):
        return {
            "host_ms_per_round": min(off),
            "host_ms_per_round_repeats": off,
            "host_ms_per_round_control": min(on),
            "control_repeats": on,
            "same_rounds": same,
        }

    results = {
        "settings": {"goal_ms": 0.4},
        "methods": {
            # least readings 0.3 and 0.3 (a ratio of 1.0), but the repeats' own ratios are 0.5, 0.6, 3.0
            "a": method([0.3, 0.6, 0.9], [0.6, 1.0, 0.3]),
            "b": method([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
            "c": method([0.2, 0.2, 0.2], [1.0, 1.0, 1.0], same=False),  # different rounds: not compared
        },
    }
    context = host_work_paired_context(results)
    assert context is not None
    assert [row[0] for row in context["rows"]] == ["`c`", "`a`", "`b`"]  # least host ms first
    ratios = {row[0]: row[3] for row in context["rows"]}
    assert ratios == {"`a`": "0.60", "`b`": "1.00", "`c`": "0.20 *"}
    assert context["compared"] == 2 and context["median_ratio"] == pytest.approx(0.8)
    assert context["ratio_range"] == pytest.approx((0.6, 1.0))
    assert context["pair_range"] == pytest.approx((0.5, 3.0))  # the compared methods' single repeats
    assert (context["within_goal"], context["within_goal_control"]) == (2, 1)
    assert host_work_paired_context(None) is None


def test_the_warm_split_table_states_each_call_in_the_run_and_warm_per_call_and_per_round():
    """The overhead page's third host table (``host_work.py --warm-split``): a row per method and
    call it made, its µs a call in the run and warm, their ratio, and both times the calls per round
    in ms; a call not replayed shows "-" and its reason, one whose decodes differed a ``*``; the
    command names the run's methods and functions; no results, no section."""
    from specpolicy.analysis.docs_pages import host_work_split_context
    from specpolicy.analysis.docs_tables import render_template

    def row(in_run, warm, **more):
        return {"calls": 40, "calls_per_round": 1.0, "in_run_us": in_run, "warm_us": warm,
                "own_share": None if warm is None else warm / in_run, "same_rounds": True, **more}  # fmt: skip

    results = {
        "settings": {
            "num_prompts": 3, "dataset": "gsm8k", "max_new_tokens": 64, "replays": 20,
            "method": ["dart+dart-tree"], "warm_split": ["specpolicy.policies.dart_tree:_run"],
        },
        "warm_split": {"dart+dart-tree": {"specpolicy.policies.dart_tree:_run": row(240.0, 150.0), "m:f": {"calls": 0}}},
    }  # fmt: skip
    context = host_work_split_context(results)
    assert context is not None and context["share_range"] == "62%" and not context["differed"]
    assert context["rows"] == [["`dart+dart-tree`", "`dart_tree:_run`", "1.00", "240", "150", "62%", "0.24", "0.15"]]

    def page(split):
        return render_template("overhead", overhead=None, packing=None, host=None, paired=None, split=split)

    text = page(context)
    assert "| `dart+dart-tree` | `dart_tree:_run` | 1.00 | 240 | 150 | 62% | 0.24 | 0.15 |" in text
    assert "|---|---|---:|---:|---:|---:|---:|---:|" in text  # the method and the call left-aligned
    assert (
        "python benchmarks/host_work.py --num-prompts 3 --max-new-tokens 64 --method dart+dart-tree "
        "--warm-split specpolicy.policies.dart_tree:_run --out benchmarks/results/host-work-warm-split.json"
    ) in text
    assert "replayed 20 times" in text and "warm readings are 62% of the in-run ones" in text
    assert "Not replayed" not in text and "`*`" not in text
    # a second call: not replayed, its decodes' rounds differing
    results["warm_split"]["dart+dart-tree"]["m.k:g"] = row(
        30.0, None, not_replayed="an input is a dict", same_rounds=False
    )
    results["warm_split"]["dart+dart-tree"]["m.k:h"] = row(30.0, 3.0)
    context = host_work_split_context(results)
    assert context is not None and context["share_range"] == "10-62%" and context["differed"]
    assert context["rows"][1] == ["`dart+dart-tree`", "`k:g` *", "1.00", "30", "-", "-", "0.03", "-"]
    text = page(context)
    assert "Not replayed (`-`): `dart+dart-tree` / `m.k:g`: an input is a dict." in text and "`*`: the decode" in text
    assert host_work_split_context(None) is None
    assert "heaviest host calls" not in page(None)
