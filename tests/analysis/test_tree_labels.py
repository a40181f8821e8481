"""Tree rows say they count nodes (issue 30, 6e): where a run drafted trees, its acceptance rate is
accepted tokens / drafted tree NODES and its speculation length is tree NODES per round -- the run
summary's labels and the sweep report's footnote say so; chain runs keep their labels."""

from __future__ import annotations

import io
import json

from rich.console import Console

from specpolicy.analysis.report import collect, main as report_main, report_rows, to_markdown
from specpolicy.analysis.tables import TREE_NOTE, print_summary


def _method(tree_rounds: int, drafted: int = 40):
    return {
        "tokens_per_s": 120.0,
        "rounds": 50,
        "drafted_rounds": drafted,
        "acceptance_rate": 0.094,
        "mean_accepted_length": 5.6,
        "mean_speculation_length": 60.0,
        "tokens_per_round": 6.6,
        "max_accepted_length": 9,
        "max_speculation_length": 60,
        "drafter_passes_per_round": 6.0,
        "generated_tokens": 330,
        "tree_rounds": tree_rounds,
        "mean_draft_depth": 6.0,
    }


def _summary(tree_rounds: int) -> dict:
    method = "eagle3+eagle2-tree" if tree_rounds else "eagle3+static"
    vanilla = {**_method(0, 0), "tree_rounds": 0, "drafted_rounds": 0}
    return {
        "method": method,
        "prompts": 2,
        "prompts_total": 2,
        "partial": False,
        "lossless_fraction": 1.0,
        "speedup_vs_vanilla": 1.3,
        "tokens_per_s": 120.0,
        "acceptance_rate": 0.094,
        "mean_accepted_length": 5.6,
        "mean_speculation_length": 60.0,
        "rounds": 50,
        "methods": {method: _method(tree_rounds), "vanilla": vanilla},
    }


def _rows(summary: dict) -> dict[str, list[str]]:
    buf = io.StringIO()
    print_summary(summary, console=Console(width=160, file=buf))
    out = {}
    for line in buf.getvalue().splitlines():
        if line.startswith("│ "):
            cells = [c.strip() for c in line.strip("│").split("│")]
            out[cells[0]] = cells[1:]
    return out


def test_a_tree_runs_summary_says_its_figures_count_tree_nodes():
    rows = _rows(_summary(tree_rounds=40))
    assert rows["acceptance rate (accepted tokens / drafted tree NODES)"] == ["-", "0.094"]
    assert rows["speculation length per round (tree NODES drafted; mean over all rounds)"] == ["-", "60.00"]
    assert rows["longest speculation length in a round (tree NODES)"] == ["-", "60"]
    assert "acceptance rate (accepted / drafted tokens)" not in rows


def test_a_chain_runs_summary_keeps_its_labels():
    rows = _rows(_summary(tree_rounds=0))
    assert rows["acceptance rate (accepted / drafted tokens)"] == ["-", "0.094"]
    assert rows["speculation length per round (mean over all rounds)"] == ["-", "60.00"]
    assert not any("NODES" in label for label in rows)


def test_the_sweep_report_footnotes_tree_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for name, trees in (("0", 40), ("1", 0)):
        job = tmp_path / name
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- policy={'eagle2-tree' if trees else 'static'}\n")
        (job / "summary.json").write_text(json.dumps(_summary(trees)))
    assert report_main([str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert TREE_NOTE in out and "acceptance rate = accepted tokens / drafted tree NODES" in TREE_NOTE
    assert "speculation length = tree NODES drafted per round" in TREE_NOTE
    assert "accepted tokens / drafted tree NODES" in (tmp_path / "report.md").read_text()
    # chains only: no footnote
    table, common = report_rows([r for r in collect(tmp_path) if r["run"] == "1"])
    assert "NODES" not in to_markdown(table, common)
