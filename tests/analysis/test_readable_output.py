"""Output a person can read (issue 12): tables that fit the terminal and say their
denominators, sweep reports that mark partial runs and list dead jobs, oracle figures labelled
by what they are, and a figures page with a run summary, prompts and per-prompt tables."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from specpolicy.analysis import oracle, tables
from specpolicy.analysis.oracle import CostModel, compare
from specpolicy.analysis.report import collect, main as report_main, report_rows, to_markdown
from specpolicy.analysis.results import PromptResult
from specpolicy.analysis.tables import print_summary


def _method(tokens_per_s, rounds, drafted, acc=0.0, acc_len=0.0, spec_len=0.0, passes=0.0, max_a=0, max_k=0):
    return {
        "tokens_per_s": tokens_per_s,
        "rounds": rounds,
        "drafted_rounds": drafted,
        "acceptance_rate": acc,
        "mean_accepted_length": acc_len,
        "mean_speculation_length": spec_len,
        "tokens_per_round": 1.0,
        "max_accepted_length": max_a,
        "max_speculation_length": max_k,
        "drafter_passes_per_round": passes,
        "generated_tokens": 192,
        "wall_s": 1.2,
    }


def _summary(**extra):
    """A summary as ``experiment.build_summary`` writes it (the fields the printout reads): an
    AIMD-like method whose plain rounds pull the mean speculation length per round (0.46) below
    the mean accepted length per drafted round (2.11)."""
    summary = {
        "method": "fastdllm+aimd",
        "prompts": 3,
        "prompts_total": 3,
        "partial": False,
        "acceptance_rate": 0.617,
        "mean_accepted_length": 2.11,
        "mean_speculation_length": 0.46,
        "tokens_per_s": 188.2,
        "vanilla_tokens_per_s": 158.8,
        "speedup_vs_vanilla": 1.185,
        "lossless_fraction": 1.0,
        "not_lossless": {},
        "methods": {
            "fastdllm+aimd": _method(188.2, 120, 26, 0.617, 2.11, 0.46, 0.52, 10, 40),
            "vanilla": _method(158.8, 192, 0),
        },
        "modeled_speedup_vs_vanilla": 1.495,
        "modeled": {
            "speedup_vs_vanilla": 1.495,
            "profile": {"name": "a6000-qwen7b"},
            "speedup_by_profile": {"a6000-qwen7b": 1.495, "a6000-qwen14b": 1.95},
        },
        "oracle": {
            "source": "rounds (self-consistency, censored at fully accepted rounds)",
            "fraction_of_oracle": 0.611,
            "policy_speedup_modeled": 1.22,
            "oracle_speedup_modeled": 2.0,
            "censored_positions": 17,
        },
    }
    summary.update(extra)
    return summary


def _printed(summary, width=None, **kwargs) -> str:
    buf = io.StringIO()
    console = None if width is None else Console(width=width, file=buf)
    print_summary(summary, console=console, **kwargs)
    return buf.getvalue()


def _row_cells(text: str, label_start: str) -> list[str]:
    """The cells of the table line that starts with ``label_start`` (split at the │ borders)."""
    line = next(ln for ln in text.splitlines() if ln.startswith("│ " + label_start))
    return [c.strip() for c in line.strip("│").split("│")]


# -- the run summary table -------------------------------------------------------------------


def test_summary_table_fits_the_width_and_keeps_every_number_whole():
    summary = _summary()
    for width in (80, 60):
        text = _printed(summary, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        # every figure printed whole on one line (no wrapped or ellipsised number)
        for number in ("188.2", "158.8", "0.617", "2.11", "0.46", "0.52", "1.19x", "1.50x", "120", "192"):
            assert re.search(rf"(^|[\s│]){re.escape(number)}([\s│]|$)", text), (width, number)
        assert "…" not in text


def test_summary_default_width_when_stdout_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    print_summary(_summary())
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= tables.DEFAULT_WIDTH


def test_summary_wide_on_request_is_one_row_per_method():
    text = _printed(_summary(), width=300, wide=True)
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert rows[0].startswith("│ vanilla ") and rows[1].startswith("│ fastdllm+aimd ")
    assert len(rows) == 2  # every figure a column: nothing wraps at this width


def test_summary_shows_a_dash_where_nothing_applies_and_names_denominators():
    text = _printed(_summary(), width=120)
    header = next(ln for ln in text.splitlines() if "vanilla" in ln and "fastdllm+aimd" in ln)
    assert header.index("vanilla") < header.index("fastdllm+aimd")
    for label in (
        "acceptance rate (accepted / drafted tokens)",
        "accepted length per drafted round",
        "speculation length per round (mean over all rounds)",
        "drafter passes per round",
    ):
        vanilla, method = _row_cells(text, label)[1:]
        assert vanilla == "-", label
        assert method not in ("-", "0.000", "0.00")
    assert "0.000" not in text
    # the two lengths have different denominators, and say so: 2.11 per drafted round > 0.46 per round
    assert _row_cells(text, "accepted length per drafted round")[2] == "2.11"
    assert _row_cells(text, "speculation length per round (mean over all rounds)")[2] == "0.46"
    assert _row_cells(text, "drafted rounds (k > 0)")[1:] == ["-", "26"]
    assert _row_cells(text, "lossless")[1:] == ["reference", "3/3"]


def test_summary_with_sampling_reads_n_a_sampling():
    summary = _summary(lossless="n/a (sampling)", sampling={"mode": "sampling", "temperature": 0.7})
    del summary["lossless_fraction"]
    text = _printed(summary, width=100)
    assert _row_cells(text, "lossless")[1:] == ["reference", "n/a (sampling)"]


# -- the sweep report --------------------------------------------------------------------------


def _job(root: Path, name: str, overrides: list[str], summary: dict | None, rows: int = 0) -> None:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if rows:
        (job / "results.jsonl").write_text(
            "".join(
                json.dumps({"prompt_id": f"gsm8k/{i}", "output_ids": [], "wall_s": 0.0, "rounds": []}) + "\n"
                for i in range(rows)
            )
        )
    if summary is not None:
        (job / "summary.json").write_text(json.dumps(summary))


def _sweep_summary(speedup: float, van_tokens: int, van_wall: float, prompts: int = 4, **extra) -> dict:
    summary = {
        "method": "fastdllm+failfast",
        "prompts": prompts,
        "prompts_total": 4,
        "partial": False,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 3.0,
        "mean_speculation_length": 6.0,
        "tokens_per_s": 10.0 * speedup,
        "vanilla_tokens_per_s": 10.0,
        "speedup_vs_vanilla": speedup,
        "lossless_fraction": 1.0,
        "methods": {
            "fastdllm+failfast": {"drafter_passes_per_round": 1.5, "drafted_rounds": 9},
            "vanilla": {"generated_tokens": van_tokens, "wall_s": van_wall},
        },
    }
    summary.update(extra)
    return summary


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "multirun"
    _job(root, "0", ["policy.tau=0.1"], _sweep_summary(1.2, 100, 2.0), rows=4)
    _job(root, "1", ["policy.tau=0.3"], _sweep_summary(0.8, 100, 2.0), rows=4)
    # interrupted after 1 of 4 prompts, with the best speedup and a fast vanilla baseline
    _job(
        root,
        "2",
        ["policy.tau=0.45"],
        _sweep_summary(3.0, 1000, 1.0, prompts=1, partial=True, interrupted_by="SIGTERM"),
        rows=1,
    )
    _job(root, "3", ["policy.tau=0.6"], _sweep_summary(2.0, 100, 2.0, prompts=3), rows=3)  # 3 of 4, not flagged
    _job(root, "4", ["policy.tau=0.7"], None, rows=2)  # died: results but no summary
    _job(root, "5", ["policy.tau=0.9"], None)  # died before its first prompt (it had taken its run lock)
    (root / "5" / "run.lock").touch()
    return root


def test_sweep_report_does_not_rank_partial_runs_nor_pool_their_vanilla(sweep):
    rows = collect(sweep)
    assert [r["run"] for r in rows] == ["0", "1", "2", "3"]  # complete by speedup, then partial
    assert [r["partial"] for r in rows] == [False, False, True, True]
    assert rows[2]["prompts_cell"] == "1 of 4" and rows[3]["prompts_cell"] == "3 of 4"
    table, _ = report_rows(rows)
    vanilla = next(r for r in table if r["method"] == "vanilla")
    assert vanilla["tokens_per_s"] == pytest.approx(200 / 4.0)  # runs 0 and 1 only
    assert [r["run"] for r in table] == ["0", "-", "1", "2", "3"]
    md = to_markdown(table)
    ranked, rest = md.split("Partial runs", 1)
    assert "| 2 |" not in ranked and "| 2 |" in rest and "1 of 4" in rest


def test_sweep_report_lists_jobs_without_a_summary(sweep, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert report_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines() if not line.startswith("wrote ")) <= tables.DEFAULT_WIDTH
    assert "Partial runs" in out and "1 of 4" in out
    assert "2 jobs without a summary.json" in out
    assert "4 (policy.tau=0.7): results.jsonl holds 2 prompts" in out
    assert "5 (policy.tau=0.9): no results.jsonl" in out
    md = (sweep / "report.md").read_text()
    assert "- 4 (policy.tau=0.7): results.jsonl holds 2 prompts" in md and "- 5 (policy.tau=0.9)" in md
    assert report_main([str(sweep), "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "vanilla tokens/s" in wide and "left out" not in wide


def test_sweep_report_narrow_terminal_leaves_out_columns_not_digits(sweep, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    assert report_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(len(line) for line in table_lines) <= 70
    assert "1.200x" in out and "0.800x" in out and "left out to fit 70 characters" in out


def test_sweep_report_sampling_runs_read_n_a_sampling(tmp_path):
    root = tmp_path / "multirun"
    summary = _sweep_summary(1.1, 100, 2.0, lossless="n/a (sampling)", sampling={"mode": "sampling"})
    del summary["lossless_fraction"]
    _job(root, "0", ["generation.temperature=0.7"], summary)
    assert collect(root)[0]["lossless"] == "n/a (sampling)"


# -- the oracle: a ratio above 1 is never a fraction of an optimum --------------------------------


def _round(k, a, e, passes, draft_ms, verify_ms, finish=""):
    return {
        "speculation_length": k,
        "accepted_length": a,
        "emitted_tokens": e,
        "drafter_forward_passes": passes,
        "reused_tokens": 0,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "finish_reason": finish,
        "draft_stop_reason": "policy_bound",
        "confidences": [],
        "draft_token_ids": [],
        "target_token_ids": [],
    }


def _beats_its_oracle():
    """Rounds whose oracle, estimated from the rounds themselves, is slower than the policy:
    one short draft cost 3 passes and the long ones 1, so the fitted passes-per-length line has
    a negative slope, clamped to 0 at the intercept (3.7 passes per draft) -- every draft the
    oracle considers costs more than the policy's recorded ones did."""
    rounds = (
        [_round(4, 4, 5, 1, 2.0, 12.0)] * 3
        + [_round(1, 0, 1, 3, 6.0, 10.5)]
        + [_round(4, 4, 5, 1, 2.0, 12.0, "max_new_tokens")]
    )
    tokens = sum(r["emitted_tokens"] for r in rounds)
    return PromptResult.from_row(
        {
            "prompt_id": "gsm8k/0",
            "output_ids": list(range(tokens)),
            "wall_s": 0.1,
            "rounds": rounds,
            "lossless": True,
            "first_difference": None,
            "vanilla_generated_tokens": tokens,
            "vanilla_rounds": 20,
            "vanilla_wall_s": 0.2,
            "vanilla_draft_ms": 0.0,
            "vanilla_verify_ms": 200.0,
            "vanilla_finish_reason": "max_new_tokens",
        }
    )


def test_oracle_ratio_above_one_is_labelled_not_a_fraction(tmp_path, capsys):
    result = _beats_its_oracle()
    res = compare({result.prompt_id: result.speculative}, CostModel.fit(result.speculative.rounds, [10.0] * 20), 60)
    assert res["fraction_of_oracle"] > 1.0  # the censored estimate bounds nothing here
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text(json.dumps(result.to_row()) + "\n")
    (run / "summary.json").write_text(json.dumps({"method": "ar+static", "methods": {}}))
    assert oracle.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for value in re.findall(r"(\d+\.\d+) of the oracle", out):
        assert float(value) <= 1.0, out
    assert "no fraction of the oracle" in out and "above 1" in out
    assert "no fraction of the oracle" in json.loads((run / "oracle.json").read_text())["reading"]
    text = oracle.describe_fraction(res)
    assert "no fraction of the oracle" in text and "censored" in text and "peers.py" in text
    # the run's own printout says the same
    printed = _printed(_summary(oracle={**res, "source": res["source"]}), width=100)
    assert "no fraction of the oracle" in printed
    for value in re.findall(r"(\d+\.\d+) of the oracle", printed):
        assert float(value) <= 1.0


def test_oracle_from_rounds_is_labelled_an_upper_bound():
    text = oracle.describe_fraction(
        {
            "source": "rounds (self-consistency, censored at fully accepted rounds)",
            "fraction_of_oracle": 0.7,
            "policy_speedup_modeled": 1.4,
            "oracle_speedup_modeled": 2.0,
            "censored_positions": 12,
        }
    )
    assert text.startswith("at most 0.700 of the oracle's speedup (an upper bound")
    assert "12 censored positions" in text
    exact = oracle.describe_fraction(
        {
            "source": "replay (exact)",
            "fraction_of_oracle": 0.7,
            "policy_speedup_modeled": 1.4,
            "oracle_speedup_modeled": 2.0,
        }
    )
    assert exact.startswith("0.700 of the oracle's speedup (exact")


# -- the figures page -------------------------------------------------------------------------------

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib missing")


def _rows(prompts=2, drafting=True):
    rows = []
    for i in range(prompts):
        rounds = (
            [_round(3, 2, 3, 3, 1.0, 2.0), _round(3, 3, 4, 3, 1.0, 2.0)]
            if drafting
            else [_round(0, 0, 1, 0, 0.0, 2.0)] * 7
        )
        for r in rounds:
            r.update(
                draft_token_ids=list(range(r["speculation_length"])),
                target_token_ids=list(range(r["speculation_length"] + 1)),
            )
        rows.append(
            {
                "prompt_id": f"gsm8k/{i}",
                "prompt_tokens": 11,
                "output_ids": list(range(7)),
                "wall_s": 0.01,
                "prompt_text": f"Question {i}: Janet's ducks lay 16 eggs per day.",
                "output_text": "#### 18",
                "stop_reason": "max_new_tokens",
                "lossless": True,
                "rounds": rounds,
                "vanilla_generated_tokens": 7,
                "vanilla_wall_s": 0.014,
                "vanilla_rounds": 7,
                "vanilla_draft_ms": 0.0,
                "vanilla_verify_ms": 14.0,
            }
        )
    return rows


def _plot_job(root: Path, name: str, method: str, overrides: list[str], rows: list[dict], **summary) -> None:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (job / "summary.json").write_text(
        json.dumps(
            {
                "method": method,
                "prompts": len(rows),
                "prompts_total": len(rows),
                "config": {},
                **summary,
                "methods": {
                    method: {"drafted_rounds": 2 * len(rows)},
                    "vanilla": {"generated_tokens": 14, "wall_s": 0.028, "verify_ms": 28.0},
                },
            }
        )
    )


@needs_matplotlib
def test_figures_page_has_a_run_summary_prompt_text_and_per_prompt_tables(tmp_path):
    from specpolicy.analysis.plot import main as plot_main

    root = tmp_path / "multirun"
    _plot_job(
        root,
        "0",
        "ar+static",
        ["method=ar+static-k5", "dataset.num_prompts=2"],
        _rows(),
        speedup_vs_vanilla=1.234,
        modeled_speedup_vs_vanilla=1.5,
        acceptance_rate=0.833,
        mean_accepted_length=2.5,
        mean_speculation_length=3.0,
        lossless_fraction=1.0,
    )
    _plot_job(
        root,
        "1",
        "fastdllm+failfast",
        ["method=fastdllm+failfast", "dataset.num_prompts=2"],
        _rows()[:1],
        speedup_vs_vanilla=0.987,
        acceptance_rate=0.4,
        mean_accepted_length=1.2,
        mean_speculation_length=3.0,
        lossless_fraction=1.0,
        partial=True,
        prompts_total=2,
        interrupted_by="SIGINT",
    )
    assert plot_main([str(root)]) == 0
    out = root / "plots"
    index = (out / "index.html").read_text()
    # the summary header: one line per run with method, overrides, speedup, acceptance, lossless
    runs_table = index.split("<h2>Runs</h2>", 1)[1].split("</table>", 1)[0]
    assert "Common to every run: <code>dataset.num_prompts=2</code>" in index.split("<h2>Runs</h2>", 1)[1]
    for cell in (
        "ar+static",
        "<code class='nowrap'>method=ar+static-k5</code>",
        "1.23x",
        "1.50x",
        "0.833",
        "2.50",
        "2/2",
        "fastdllm+failfast",
        "0.99x",
        "1 of 2</span>",
        "partial run, SIGINT",
    ):
        assert cell in runs_table, cell
    # readable titles, not file names
    assert "<h3>Accepted and speculated lengths per round</h3>" in index and "<h2>length_cdf" not in index
    # per-prompt figures beside each trajectory link, in a table
    link = '<a href="trajectories/ar+static/gsm8k_1.html">gsm8k/1</a>'
    line = next(tr for tr in index.split("<tr>") if link in tr)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", line)
    assert "Question 1: Janet" in cells[1] and cells[2:5] == ["7", "2", "0.833"]
    assert "<td" in line and "max_new_tokens" in line
    # the prompt on its trajectory page, with a way back
    page = (out / "trajectories" / "ar+static" / "gsm8k_1.html").read_text()
    assert "Question 1: Janet&#x27;s ducks lay 16 eggs per day." in page
    assert 'href="../../index.html"' in page and "#### 18" in page
    # self-contained: no external resource
    for html_file in [out / "index.html", *out.glob("trajectories/*/*.html")]:
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html_file.read_text()), html_file


@needs_matplotlib
def test_prompt_text_falls_back_to_the_runs_dataset(tmp_path):
    from specpolicy.analysis.plot import Run, prompt_texts
    from specpolicy.data.datasets import load_prompts

    rows = [{k: v for k, v in row.items() if k != "prompt_text"} for row in _rows()]
    run = Run(
        "ar+static",
        tmp_path,
        [PromptResult.from_row(r) for r in rows],
        {"config": {"dataset": {"name": "gsm8k", "path": None}}},
    )
    expected = {p.prompt_id: p.text for p in load_prompts("gsm8k", None, 2)}
    assert prompt_texts(run) == expected


@needs_matplotlib
def test_styles_stay_distinct_beyond_ten_methods():
    from specpolicy.analysis.plot import Run, _style

    runs = [Run(f"method-{i}", Path("."), []) for i in range(23)]
    styles = _style(runs)
    pairs = {(tuple(s["color"]), s["linestyle"]) for s in styles.values()}
    assert len(pairs) == 23
    assert len({tuple(styles[f"method-{i}"]["color"]) for i in range(20)}) == 20  # 20 distinct colours
    for i in range(10, 20):  # the second ten differ from the first in line style too
        assert styles[f"method-{i}"]["linestyle"] != styles[f"method-{i - 10}"]["linestyle"]


@needs_matplotlib
def test_a_method_that_never_drafts_gets_no_acceptance_plot(tmp_path):
    from specpolicy.analysis.plot import main as plot_main

    root = tmp_path / "runs"
    _plot_job(root, "ar+static", "ar+static", [], _rows(), speedup_vs_vanilla=1.2)
    _plot_job(root, "hf-greedy", "hf-greedy", [], _rows(drafting=False), speedup_vs_vanilla=1.0)
    assert plot_main([str(root)]) == 0
    out = root / "plots"
    assert (out / "acceptance_ar+static.png").exists()
    assert not (out / "acceptance_hf-greedy.png").exists()
    index = (out / "index.html").read_text()
    assert "acceptance_hf-greedy" not in index
    assert (out / "trajectories" / "hf-greedy" / "gsm8k_0.html").exists()  # its pages are still there
    hf_line = next(tr for tr in index.split("<h2>Runs</h2>", 1)[1].split("<tr>") if "hf-greedy" in tr)
    assert re.findall(r"<td[^>]*>(.*?)</td>", hf_line)[6:9] == ["-", "-", "-"]  # nothing drafted: no acceptance
    # only drafting runs: nothing to plot at all -> no length CDF either
    solo = tmp_path / "solo"
    _plot_job(solo, "hf-greedy", "hf-greedy", [], _rows(drafting=False))
    assert plot_main([str(solo)]) == 0
    assert not (solo / "plots" / "length_cdf.png").exists()
    assert (solo / "plots" / "latency_breakdown.png").exists()


# -- progress bars only on a terminal ----------------------------------------------------------------


def test_model_loading_draws_progress_bars_only_on_a_terminal(family, capsys, monkeypatch):
    """transformers' "Loading weights" bar (on stderr) is drawn on a terminal and nowhere else."""
    from transformers.utils import logging as hf_logging

    from specpolicy.core.runtime import Runtime
    from specpolicy.models.loading import load_causal_lm, load_tokenizer

    runtime = Runtime("cpu", "float32")
    load_causal_lm(str(family["target"]), runtime)
    load_tokenizer(str(family["target"]))
    assert capsys.readouterr().err == ""  # stderr captured: not a terminal
    assert hf_logging.is_progress_bar_enabled()  # transformers' own setting is left as it was
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the same load, on a terminal
    load_causal_lm(str(family["target"]), runtime)
    assert "Loading weights" in capsys.readouterr().err


def test_a_run_into_a_file_has_no_progress_bars(family, tmp_path, monkeypatch, capsys):
    """``python -m specpolicy > run.log 2>&1``: neither the models' loading bars nor the run's
    per-prompt bar reach the file (stderr is not a terminal)."""
    from conftest import overrides
    from specpolicy.run.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(sys, "argv", ["specpolicy", *overrides(family), "dataset.num_prompts=1"])
    main()
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "prompt/s" not in err and "%|" not in err


BUSY = "other processes kept up to 2.0 of 2 CPUs busy (1-min load average 3.10 at the start; this process used 1.0)"


@needs_matplotlib
def test_figures_mark_runs_whose_timings_cannot_be_trusted(tmp_path):
    """Issue 22: plots/index.html and the figures never said that a run's timings cannot be trusted."""
    from specpolicy.analysis.plot import latency_breakdown, main as plot_main
    from specpolicy.analysis.results import load_runs

    root = tmp_path / "multirun"
    _plot_job(
        root,
        "0",
        "ar+static",
        ["policy.k=3"],
        _rows(),
        speedup_vs_vanilla=1.234,
        timing_conditions={"timing_trusted": False, "timing_warnings": [BUSY]},
    )
    _plot_job(
        root,
        "1",
        "ar+static",
        ["policy.k=5"],
        _rows(),
        speedup_vs_vanilla=1.111,
        timing_conditions={"timing_trusted": True, "timing_warnings": []},
    )
    assert plot_main([str(root)]) == 0
    index = (root / "plots" / "index.html").read_text()
    runs_table = index.split("<h2>Runs</h2>", 1)[1].split("</table>", 1)[0]
    assert re.search(
        r"<span class='partial' title=\"timing cannot be trusted: other processes[^\"]*\">1\.23x\*</span>", runs_table
    )
    assert "1.11x*" not in runs_table and ">1.11x<" in runs_table
    after = index.split("</table>", 1)[1]
    assert "* timing cannot be trusted" in after and f"<code>ar+static (policy.k=3)</code>: {BUSY}" in after
    assert "timing cannot be trusted *" in index.split("<h2>Trajectories</h2>", 1)[1]  # beside the run's heading
    # the measured figure: the bar's label marked, vanilla too (pooled over a run that cannot be trusted)
    data = {d["method"]: d["trusted"] for d in latency_breakdown(load_runs(root))}
    assert data == {"vanilla": False, "ar+static (policy.k=3)": False, "ar+static (policy.k=5)": True}


def _oracle_run(root: Path, prompts: int, **summary) -> Path:
    """A run directory of ``prompts`` prompts of k = 4 rounds accepting 0..4 tokens (different per
    prompt: distinct fractions of the oracle, all below 1) for ``python -m specpolicy.analysis.oracle``."""
    root.mkdir(parents=True)
    rows = []
    for i in range(prompts):
        accepted = [(i + j) % 5 for j in range(4)]
        rounds = [_round(4, a, a + 1, 4, 4.0, 12.0, "max_new_tokens" if j == 3 else "") for j, a in enumerate(accepted)]
        tokens = sum(r["emitted_tokens"] for r in rounds)
        rows.append(
            {
                "prompt_id": f"gsm8k/{i}",
                "output_ids": list(range(tokens)),
                "wall_s": 0.1,
                "rounds": rounds,
                "lossless": True,
                "vanilla_generated_tokens": tokens,
                "vanilla_rounds": tokens,
                "vanilla_wall_s": 0.2,
                "vanilla_draft_ms": 0.0,
                "vanilla_verify_ms": 10.0 * tokens,
            }
        )
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "summary.json").write_text(json.dumps({"method": "ar+static", "methods": {}, **summary}))
    return root


def test_oracle_per_prompt_lists_the_values_for_few_prompts_and_says_n(tmp_path, capsys):
    """Issue 22: "min 0.418 median 0.439 max 0.439" for 2 prompts."""
    assert oracle.main([str(_oracle_run(tmp_path / "two", 2))]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "per prompt" in x)
    values = re.search(r"policy / oracle per prompt \(n = 2\): (\d\.\d{3}), (\d\.\d{3})$", line)
    assert values and "min" not in line and "median" not in line
    assert float(values[1]) < float(values[2])
    assert oracle.main([str(_oracle_run(tmp_path / "seven", 7))]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "per prompt" in x)
    assert re.search(r"per prompt \(n = 7\): min \d\.\d{3} median \d\.\d{3} max \d\.\d{3}$", line)


def test_oracle_marks_a_run_whose_timings_cannot_be_trusted(tmp_path, capsys):
    run = _oracle_run(tmp_path / "busy", 2, timing_conditions={"timing_trusted": False, "timing_warnings": [BUSY]})
    assert oracle.main([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert next(x for x in out if "per prompt" in x).endswith(" *")
    assert any(x.startswith("* timing cannot be trusted") for x in out)
    assert f"* {run}: costs measured while {BUSY}" in out


def test_runs_of_one_method_are_named_by_the_overrides_that_differ(tmp_path):
    """Issue 22: sweep legends read "fastdllm+failfast (0)...(3)" instead of the overrides."""
    from specpolicy.analysis.results import load_runs

    root = tmp_path / "multirun"
    for num, tau in enumerate((0.3, 0.6)):
        _plot_job(root, str(num), "fastdllm+failfast", ["policy=failfast", f"policy.tau={tau}"], _rows())
    _plot_job(root, "2", "ar+static", ["policy=static"], _rows())
    _plot_job(root, "3", "ar+goodput", [], _rows())
    _plot_job(root, "4", "ar+goodput", [], _rows())  # the overrides do not tell these two apart
    assert [r.name for r in load_runs(root)] == [
        "fastdllm+failfast (policy.tau=0.3)",
        "fastdllm+failfast (policy.tau=0.6)",
        "ar+static",
        "ar+goodput (3)",
        "ar+goodput (4)",
    ]


@needs_matplotlib
def test_figures_of_many_long_named_runs_keep_their_panels(tmp_path, monkeypatch):
    """Issue 22: a folder of 27 runs squeezed the subplots (and their titles) into each other: the
    legend / tick labels of long names took the width of the panels. The panels keep their size,
    the figure grows, and matplotlib's layout never gives up."""
    import warnings

    import matplotlib.figure

    from specpolicy.analysis.paper_figures import plot_easy_regions
    from specpolicy.analysis.plot import plot_latency_breakdown, plot_length_cdf
    from specpolicy.analysis.results import load_runs

    root = tmp_path / "multirun"
    models = (
        "/models/Fast_dLLM_v2_1.5B-instruct-matched-phase-2000",
        "/models/dllm-drafter-capacity-probe-12x256",
        "/models/dllm-drafter",
    )
    for num in range(27):
        _plot_job(
            root,
            str(num),
            "fastdllm+failfast",
            [
                "policy=failfast",
                f"policy.tau={0.1 * (1 + num // 9)}",
                f"drafter.model={models[num // 3 % 3]}",
                f"policy.n_max={(30, 60, 70)[num % 3]}",
            ],
            _rows(),
        )
    runs = load_runs(root)
    assert len({r.name for r in runs}) == 27 and runs[10].name.startswith("fastdllm+failfast (policy.tau=0.2")  # 0..26
    drawn = {}
    real = matplotlib.figure.Figure.savefig

    def measure(fig, path, *args, **kwargs):  # the figure as saved: panels and titles in inches
        fig.canvas.draw()
        dpi = fig.dpi
        data_axes = [ax for ax in fig.axes if ax.get_title()]
        drawn[Path(path).name] = {
            "widths": [ax.get_window_extent().width / dpi for ax in data_axes],
            "heights": [ax.get_window_extent().height / dpi for ax in data_axes],
            "titles": [ax.title.get_window_extent() for ax in data_axes],
            "size": tuple(fig.get_size_inches()),
        }
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", measure)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied ..." and kin fail the test
        plot_length_cdf(runs, tmp_path / "length_cdf.png")
        plot_latency_breakdown(runs, tmp_path / "latency_breakdown.png")
        plot_easy_regions(runs, tmp_path / "easy_regions.png")
    cdf = drawn["length_cdf.png"]
    assert min(cdf["widths"]) > 4.0 and min(cdf["heights"]) > 2.5  # two panels of 13 inches less the legend
    left, right = cdf["titles"]
    assert left.x1 < right.x0  # the panels' titles side by side, apart
    latency = drawn["latency_breakdown.png"]
    assert latency["widths"][0] > 5.5 and latency["size"][0] > 10  # the bars keep their width, the figure grows
    easy = drawn["easy_regions.png"]
    assert min(easy["heights"]) > 2.2 and easy["titles"][0].y0 > easy["titles"][1].y1
