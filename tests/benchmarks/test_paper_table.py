"""``benchmarks/paper_table.py`` end to end on a tiny on-disk family (float64, CPU): calibration on a
separate slice, every paper method lossless, Table 1 / App. B in the paper's layout, run directories
for the figures, ``combine``, and one-line user errors before any model loads."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import load_benchmark
from tiny_other_drafters import save_tiny_other_drafters

METHODS = (
    "ar",
    "fast-dllm",
    "fast-dllm-plus",
    "failfast",
    "fail-fast-only",
    "win-big-only",
    "eagle3",
    "eagle3-tree",
    "dart-tree",
    "dart-failfast",
    "falcon-tree",
    "deer",
)


def _script():
    return load_benchmark("paper_table")


@pytest.fixture(scope="module")
def tiny_run(family, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper")
    fam = {**family, **save_tiny_other_drafters(family, tmp)}
    out = tmp / "gsm8k"
    result = _script().main(
        [
            "--dataset",
            "gsm8k",
            "--num-prompts",
            "2",
            "--calibration-prompts",
            "1",
            "--k-grid",
            "2,3",
            "--max-new-tokens",
            "16",
            "--warmup",
            "0",
            "--failfast-n",
            "4",
            "--failfast-n-max",
            "12",
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
            "--dart-drafter",
            str(fam["dart"]),
            "--falcon-drafter",
            str(fam["falcon"]),
            "--deer-drafter",
            str(fam["deer"]),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--out",
            str(out),
        ]
    )
    return result, out


@pytest.mark.slow  # a benchmark run
def test_every_paper_method_runs_lossless_after_calibration_on_other_prompts(tiny_run):
    result, out = tiny_run
    s, cal = result["settings"], result["calibration"]
    assert set(result["methods"]) == {"vanilla", *METHODS}
    assert not set(s["calibration_prompt_ids"]) & set(s["evaluation_prompt_ids"])
    assert s["calibration_offset"] == 2 and len(s["calibration_prompt_ids"]) == 1
    assert {cal["k_ar"], cal["k_dllm"]} <= {2, 3}
    assert set(cal["methods"]) == {
        "vanilla",
        "ar-k2",
        "ar-k3",
        "fast-dllm-k2",
        "fast-dllm-k3",
        "eagle3-k2",
        "eagle3-k3",
    }
    for prefix, chosen in (("ar", cal["k_ar"]), ("eagle3", cal["k_eagle3"])):
        assert chosen == max((2, 3), key=lambda k: cal["methods"][f"{prefix}-k{k}"]["speedup_vs_vanilla"])
    for name, m in result["methods"].items():
        assert m["lossless"] == "2/2", (name, m["not_lossless"])
        assert set(m["modeled_speedup"]) == {"project", "official"}
        assert set(m["modeled_speedup"]["official"]) == {"a6000-qwen32b", "a6000-qwen14b", "a6000-qwen7b"}
    m = result["methods"]
    assert m["vanilla"]["speedup_vs_vanilla"] == 1.0
    # The AR drafter's passes do not change with the accounting; the static k is the calibrated one.
    assert m["ar"]["drafter_passes_per_round_official"] == m["ar"]["drafter_passes_per_round"]
    assert m["ar"]["max_speculation_length"] == cal["k_ar"] == m["fast-dllm"]["max_speculation_length"]
    assert m["fail-fast-only"]["max_speculation_length"] == 4  # static k = N
    assert m["eagle3"]["max_speculation_length"] == cal["k_eagle3"]
    assert m["failfast"]["max_speculation_length"] <= 12
    assert result["skipped"] == {}  # --falcon-drafter given: falcon-tree runs
    # DEER's static k = 32 and DART + FailFast's chunks of 8 (one pass each) up to N_max = 12.
    assert m["deer"]["max_speculation_length"] <= 32 and m["dart-failfast"]["max_speculation_length"] <= 12
    assert m["dart-failfast"]["drafter_passes_per_round"] <= 2.0
    # MODELED with each drafter's own A6000 pass cost (the profiles' key is the drafter's name).
    kind = _script().drafter_kind
    assert [kind(d) for d in ("fastdllm-default", "fastdllm", "dart", "falcon", "deer", None)] == [
        "fastdllm",
        "fastdllm",
        "dart",
        "falcon",
        "deer",
        None,
    ]
    for key, name in (("dart-tree", "dart"), ("falcon-tree", "falcon"), ("deer", "deer")):
        assert json.loads((out / "runs" / key / "summary.json").read_text())["config"]["drafter"]["name"] == name
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(result))


@pytest.mark.slow  # a benchmark run
def test_tables_in_the_paper_layout(tiny_run):
    result, out = tiny_run
    table1 = (out / "table1.md").read_text()
    assert "trained on GSM8K only" in table1 and "MODELED, not measured" in table1
    assert "| **Measured on this machine** |" in table1
    assert "| **MODELED, A6000 profile, target Qwen2.5-32B-Instruct (official pass accounting)** |" in table1
    rows = list(csv.reader((out / "table1.csv").open()))
    assert rows[0] == ["section", "method", "GSM8K"]  # one data set: no Average column
    assert len(rows) == 1 + 7 * len(METHODS)
    measured = {r[1]: r[2] for r in rows[1:] if r[0] == "Measured on this machine"}
    assert measured["FailFast"] == f"{result['methods']['failfast']['speedup_vs_vanilla']:.2f}x"
    appendix = list(csv.reader((out / "appendix_b.csv").open()))
    assert appendix[0] == ["method", "metric", "GSM8K"] and len(appendix) == 1 + 7 * len(METHODS)
    cell = {(r[0], r[1]): r[2] for r in appendix[1:]}
    ff = result["methods"]["failfast"]
    assert cell[("FailFast", "Acceptance Rate")] == f"{100 * ff['acceptance_rate']:.1f}%"
    assert cell[("FailFast", "Max (Acc./Spec.) Len")] == f"{ff['max_accepted_length']} / {ff['max_speculation_length']}"
    assert cell[("FailFast", "Lossless prompts")] == "2/2"
    assert (out / "calibration.md").read_text().count("\n| ") >= 3
    skipped = {**result, "skipped": {"falcon-tree": "falcon-tree skipped: no weights"}}
    assert "falcon-tree skipped: no weights" in _script()._notes([skipped])  # the tables' notes say so


@pytest.mark.slow  # a benchmark run
def test_run_directories_for_the_figures(tiny_run):
    result, out = tiny_run
    runs = {p.name for p in (out / "runs").iterdir()}
    assert runs <= set(METHODS) and {"ar", "fast-dllm", "failfast", "fail-fast-only", "win-big-only"} <= runs
    summary = json.loads((out / "runs" / "fast-dllm" / "summary.json").read_text())
    assert summary["config"]["drafter"]["threshold"] == 0.9 and summary["config"]["policy"]["name"] == "static"
    assert (
        json.loads((out / "runs" / "failfast" / "summary.json").read_text())["config"]["drafter"]["threshold"] == 0.05
    )
    row = json.loads((out / "runs" / "failfast" / "results.jsonl").read_text().splitlines()[0])
    assert row["prompt_tokens"] > 0 and row["lossless"] is True
    assert len(list((out / "calibration-runs").iterdir())) == 6  # 2 k x (AR, Fast-dLLM, EAGLE-3)


@pytest.mark.slow  # a benchmark run
def test_combine_puts_data_sets_side_by_side(tiny_run, tmp_path):
    result, out = tiny_run
    other = tmp_path / "second"
    other.mkdir()
    second = json.loads(json.dumps(result))
    second["settings"]["dataset"] = "math500"
    (other / "results.json").write_text(json.dumps(second))
    _script().main(["combine", str(out), str(other), "--out", str(tmp_path / "both")])
    rows = list(csv.reader((tmp_path / "both" / "table1.csv").open()))
    assert rows[0] == ["section", "method", "GSM8K", "MATH-500", "average"]
    assert all(r[2] == r[3] == r[4] for r in rows[1:])  # the same figures: the average equals them


def test_falcon_tree_runs_on_the_bundled_drafter_or_is_skipped_with_a_note(monkeypatch, tmp_path):
    script = _script()
    args = script.parse_args(["--num-prompts", "2", "--calibration-prompts", "1"])
    assert args.falcon_skipped is None and args.falcon_drafter == "falcon-drafter"  # bundled
    from specpolicy.models.loading import bundled_dir

    for entry in bundled_dir().iterdir():  # a bundle without it (the other rows' files still there)
        if entry.name != "falcon-drafter":
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.setattr("specpolicy.models.loading.bundled_dir", lambda: tmp_path)
    args = script.parse_args(["--num-prompts", "2", "--calibration-prompts", "1"])
    assert args.falcon_skipped.startswith("falcon-tree skipped") and "--falcon-drafter" in args.falcon_skipped
    assert "\n" not in args.falcon_skipped
    args = script.parse_args(["--num-prompts", "2", "--calibration-prompts", "1", "--falcon-drafter", "x"])
    assert args.falcon_skipped is None and args.falcon_drafter == "x"  # given: as given


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--dataset", "aime24", "--num-prompts", "28", "--calibration-prompts", "5"],
            "must fit the 30 prompts of aime24",
        ),
        (["--num-prompts", "10", "--calibration-offset", "5"], "overlaps the evaluation slice"),
        (["--k-grid", "3,x"], "--k-grid must be comma-separated integers >= 1"),
        (["--failfast-n", "10", "--failfast-n-max", "5"], "--failfast-n-max must be >= --failfast-n (10), got 5"),
        (["--dataset", "mmlu"], "--dataset must be one of"),
    ],
)
def test_user_errors_are_one_line_before_models_load(argv, message, capsys):
    with pytest.raises(SystemExit):
        _script().parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err
