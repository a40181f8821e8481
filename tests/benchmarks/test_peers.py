"""``benchmarks/peers.py --quick`` on a tiny on-disk family (float64, CPU): every method runs, is
checked against vanilla greedy, and lands in the JSON, the table and the per-method run dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import load_benchmark
from specpolicy.analysis.docs_pages import peers_columns
from specpolicy.data.datasets import load_prompts

pytestmark = pytest.mark.slow  # a benchmark run: 22 methods, calibration sweeps, the oracle replay

FIGURES = (
    "tokens_per_s",
    "speedup_vs_vanilla",
    "speedup_vs_hf_assisted_best",
    "acceptance_rate",
    "mean_accepted_length",
    "mean_speculation_length",
    "rounds",
    "drafter_passes_per_round",
    "lossless",
    "modeled_speedup_vs_vanilla",
)


def _peers():
    return load_benchmark("peers")


def _with_random_heads(family: dict[str, Path], directory: Path) -> dict[str, Path]:
    """A copy of the tiny family whose AR, EAGLE-3 and DFlash drafters each hold a randomly initialised
    acceptance head (``<drafter>/acceptance-head``): the ``*-head`` presets of ``DEFAULT_METHODS`` run
    on them (lossless whatever the head predicts)."""
    import shutil

    from specpolicy.models.acceptance_head import AcceptancePredictionHead, save_head

    fam = dict(family)
    for key, name in (("drafter", "ar"), ("eagle3", "eagle3"), ("dflash", "dflash")):
        copy = directory / key
        shutil.copytree(family[key], copy, symlinks=True)
        hidden = json.loads((copy / "config.json").read_text())["hidden_size"]
        torch.manual_seed(0)
        head = AcceptancePredictionHead(hidden, 3, {"drafter": name, "drafter_hidden_size": hidden})
        save_head(head, copy / "acceptance-head")
        fam[key] = copy
    return fam


@pytest.fixture(scope="module")
def quick_run(family, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peers")
    fam = _with_random_heads(family, tmp / "family")
    out = tmp / "out" / "results.json"
    results = _peers().main(
        [
            "--quick",
            "--target",
            str(fam["target"]),
            "--ar-drafter",
            str(fam["drafter"]),
            "--dllm-drafter",
            str(fam["drafter"]),
            "--dflash-drafter",
            str(fam["dflash"]),
            "--eagle3-drafter",
            str(fam["eagle3"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--out",
            str(out),
        ]
    )
    return results, out


def test_every_method_is_measured_and_lossless(quick_run, capsys):
    results, out = quick_run
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    methods = results["methods"]
    expected = {
        "vanilla",
        "hf-greedy",
        "hf-assisted-heuristic",
        "hf-assisted-confidence",
        "hf-prompt-lookup",
        f"hf-assisted-k{results['calibration']['hf_assisted_k']}",
        *_peers().DEFAULT_METHODS,  # conf/method/ presets, each row named by its preset
    }
    assert set(methods) == expected
    for name, m in methods.items():
        assert all(k in m for k in FIGURES), name
        assert m["lossless"] == "2/2", (name, m.get("not_lossless"))  # float64: HF's paths agree with ours too
        assert m["tokens_per_s"] > 0
    assert methods["vanilla"]["speedup_vs_vanilla"] == 1.0
    best = results["hf_assisted_best"]
    assert best.startswith("hf-assisted") and methods[best]["speedup_vs_hf_assisted_best"] == pytest.approx(1.0)
    for name, m in methods.items():  # oracle: every method with a drafter, as a fraction in (0, 1]
        if m["drafter"]:
            assert 0.0 < m["oracle_fraction"] <= 1.0 + 1e-9, name
            assert len(m["oracle_fraction_by_prompt"]) == 2
            # MODELED under the tuned profile (a6000-qwen32b): speedup and the oracle with its costs
            assert 0.0 < m["oracle_fraction_tuned_profile"] <= 1.0 + 1e-9, name
            assert m["modeled_speedup_tuned_profile"] > 0.0, name
    assert results["tuned_profile"] == "a6000-qwen32b"
    assert "a6000-qwen32b" in methods["fastdllm+goodput-a6000-qwen32b"]["description"]
    assert methods["suffix+static-k5"]["drafter_passes_per_round"] == 0.0
    assert methods["fastdllm+goodput-a6000-qwen32b"]["cost_profile"] == "a6000-qwen32b"
    # FailFast retuned for DFlash: the (N, tau) of its preset's sweep (--quick: the first 2 entries)
    # that was fastest on the calibration prompts, the row named by its preset
    calibration = results["calibration"]
    sweep = ["policy.n=3,policy.tau=0.5", "policy.n=3,policy.tau=0.6"]
    fastest = max(sweep, key=lambda entry: calibration["tokens_per_s"][f"dflash+failfast-best[{entry}]"])
    assert calibration["dflash+failfast-best"] == fastest
    description = methods["dflash+failfast-best"]["description"]
    assert description.startswith("FailFast's rule retuned for DFlash") and f"; calibrated: {fastest} [" in description
    assert f"FailFastPolicy(n=3, tau={fastest[-3:]}, n_max=60" in description
    assert results["fast_dllm_plus"] == "fastdllm+static-best"
    # host work per round (outside the model passes): measured for ours, not for Hugging Face's rows
    for name, m in methods.items():
        if name.startswith("hf-"):
            assert m["host_ms_per_round"] is None, name
            continue
        assert 0.0 <= m["host_ms_per_round"] and m["host_step_profile"] == "a6000-qwen7b", name
        assert m["host_step_share"] == pytest.approx(m["host_ms_per_round"] / 13.5), name
    titles = [title for title, _, _ in _peers().COLUMNS]
    assert "host ms / round" in titles and "host / target step" in titles
    row = _peers().table_rows(results)[list(methods).index("fastdllm+failfast")]
    assert row[titles.index("host ms / round")] == f"{methods['fastdllm+failfast']['host_ms_per_round']:.3f}"
    # the results pages' table (peers, neighbours) shows the columns when the results measured them
    page_titles = [title for title, _ in peers_columns(results)]
    assert "host ms / round" in page_titles and "host / target step (a6000-qwen7b)" in page_titles
    old = {
        **results,
        "methods": {n: {k: v for k, v in m.items() if not k.startswith("host")} for n, m in methods.items()},
    }
    assert not any(t.startswith("host") for t, _ in peers_columns(old))  # results written before: no such columns


def test_hf_rounds_are_recorded_and_runs_are_plottable(quick_run):
    results, out = quick_run
    runs = out.parent / "results-runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted(n for n in results["methods"] if n != "vanilla")
    for name in ("hf-assisted-heuristic", "hf-prompt-lookup", "hf-greedy", "fastdllm+failfast+reuse"):
        rows = [json.loads(line) for line in (runs / name / "results.jsonl").read_text().splitlines()]
        for row in rows:
            assert sum(r["emitted_tokens"] for r in row["rounds"]) == row["generated_tokens"] == len(row["output_ids"])
            for r in row["rounds"]:
                assert len(r["draft_token_ids"]) == r["speculation_length"] >= r["accepted_length"]
    heur = [json.loads(line) for line in (runs / "hf-assisted-heuristic" / "results.jsonl").read_text().splitlines()]
    assert all(r["drafter_forward_passes"] >= 1 for row in heur for r in row["rounds"][:-1])
    from specpolicy.analysis.plot import main as plot_main

    assert plot_main([str(runs / "hf-assisted-heuristic"), "--max-pages", "1"]) == 0
    assert (runs / "hf-assisted-heuristic" / "plots" / "latency_breakdown.png").exists()


def test_a_busy_machine_marks_the_measured_speedups_untrusted(family, tmp_path, monkeypatch, capsys):
    """Issue 22 item 4 for the benchmark: the machine's load while the methods ran is recorded
    (``timing_conditions``), warned about, and carried into every written run's summary."""
    import specpolicy.analysis.machine as machine
    from specpolicy.analysis.machine import timing_trusted

    monkeypatch.setattr(machine, "load_average", lambda: [40.0, 40.0, 40.0])  # 40 runnable processes
    fam, out = family, tmp_path / "results.json"
    results = _peers().main(
        [
            "--quick",
            "--target",
            str(fam["target"]),
            "--ar-drafter",
            str(fam["drafter"]),
            "--dllm-drafter",
            str(fam["drafter"]),
            "--dflash-drafter",
            str(fam["dflash"]),
            "--eagle3-drafter",
            str(fam["eagle3"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--methods",
            r"^ar\+static-k5$",
            "--no-oracle",
            "--out",
            str(out),
        ]
    )
    assert results["timing_conditions"]["timing_trusted"] is False
    assert "load" in results["timing_conditions"]["timing_warnings"][0]
    printed = capsys.readouterr()
    assert "WARNING: the measured speedup cannot be trusted" in printed.out + printed.err
    summary = json.loads((tmp_path / "results-runs" / "ar+static-k5" / "summary.json").read_text())
    assert timing_trusted(summary) is False


def test_failfast_tuning_measures_the_grid_and_names_its_fastest_point(family, tmp_path, capsys):
    """``benchmarks/tune_failfast.py``: every (N, tau) of the grid, FailFast's defaults and static k
    run on the same prompts, each checked against vanilla; ``best`` is the fastest grid point;
    a grid N above ``--n-max`` is refused before any model loads."""
    tune = load_benchmark("tune_failfast")
    out = tmp_path / "tune.json"
    result = tune.main(
        [
            "--target",
            str(family["target"]),
            "--ar-drafter",
            str(family["drafter"]),
            "--dllm-drafter",
            str(family["drafter"]),
            "--dflash-drafter",
            str(family["dflash"]),
            "--eagle3-drafter",
            str(family["eagle3"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "12",
            "--warmup",
            "0",
            "--n-grid",
            "2,3",
            "--tau-grid",
            "0.5,0.9",
            "--static-k",
            "4",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {
        "vanilla",
        "dflash+failfast",
        "dflash+static-k4",
        "dflash+failfast-n2-t0.5",
        "dflash+failfast-n2-t0.9",
        "dflash+failfast-n3-t0.5",
        "dflash+failfast-n3-t0.9",
    }
    assert all(r["lossless"] == 2 and r["tokens_per_s"] > 0 for r in rows.values())
    grid = [r for name, r in rows.items() if name.startswith("dflash+failfast-n")]
    fastest = max(grid, key=lambda r: r["tokens_per_s"])
    assert (result["best"]["n"], result["best"]["tau"]) == tuple(fastest["n_tau"])
    assert rows["dflash+failfast-n3-t0.9"]["policy"].startswith("FailFastPolicy(n=3, tau=0.9, n_max=60")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        tune.main(["--n-grid", "70", "--num-prompts", "1"])
    assert "--n-max must be >= the largest N of --n-grid (70), got 60" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["peers", "tune_failfast"])
def test_a_prompt_slice_past_the_data_is_refused_before_any_model_loads(script, capsys, monkeypatch):
    """``--offset`` past the last prompt (or an unknown ``--dataset``) is one parser error line
    naming the option, raised before ``Bench`` loads a model."""
    module = load_benchmark(script)
    monkeypatch.setattr(module, "Bench", lambda *a, **k: pytest.fail("a model loaded"))
    rows = len(load_prompts("gsm8k"))
    with pytest.raises(SystemExit):
        module.main(["--offset", str(rows), "--num-prompts", "1"])
    assert (
        f"error: --offset={rows} is past the last prompt of --dataset='gsm8k' ({rows} rows; accepted 0..{rows - 1})"
    ) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["--dataset", "nope", "--num-prompts", "1"])
    assert "error: --dataset='nope' is not bundled" in capsys.readouterr().err
