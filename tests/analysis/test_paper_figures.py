"""``specpolicy.analysis.paper_figures``: the figures' data worked by hand on small round records, and every
subcommand writing its PNG from run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpolicy.analysis.paper_figures import (
    concavity_points,
    easy_run_fraction,
    load,
    main,
    reliability,
    sensitivity_points,
    token_classes,
)
from specpolicy.analysis.results import round_from_dict


def rnd(k: int, a: int, emitted: int | None = None, confs=None, passes: int | None = None, finish: str = "") -> dict:
    return {
        "speculation_length": k,
        "accepted_length": a,
        "emitted_tokens": a + 1 if emitted is None else emitted,
        "drafter_forward_passes": k if passes is None else passes,
        "reused_tokens": 0,
        "draft_ms": 1.0,
        "verify_ms": 1.0,
        "confidences": list(confs or [0.9] * k),
        "finish_reason": finish,
    }


def rec(*args, **kwargs):
    """``rnd`` as a ``RoundRecord``."""
    return round_from_dict(rnd(*args, **kwargs), 0)


def row(prompt_id: str, rounds: list[dict]) -> dict:
    """A ``results.jsonl`` row of ``rounds`` (round dicts)."""
    return {
        "prompt_id": prompt_id,
        "output_ids": list(range(sum(r["emitted_tokens"] for r in rounds))),
        "wall_s": 1.0,
        "rounds": rounds,
    }


def test_token_classes_and_easy_runs():
    rounds = [rec(3, 3), rec(3, 1), rec(0, 0), rec(4, 4, emitted=2, finish="eos")]
    # 3 accepted + bonus (easy x4) | 1 accepted (easy) + correction (hard) | plain token (hard) | cut at EOS: 2 easy
    assert token_classes(rounds) == [True] * 4 + [True, False] + [False] + [True, True]
    classes = [token_classes(rounds), [False, True, True, True]]
    # easy runs: 5, 2 (first prompt, 9 tokens), 3 (second, 4 tokens); 13 tokens in all
    assert easy_run_fraction(classes, [1, 3, 5, 6]) == pytest.approx([10 / 13, 8 / 13, 5 / 13, 0.0])
    assert easy_run_fraction([], [1]) == [0.0]


def test_reliability_counts_reached_positions_and_computes_ece():
    rounds = [
        rec(3, 1, confs=[0.95, 0.55, 0.9]),  # position 1 accepted, 2 rejected, 3 not reached
        rec(2, 2, confs=[0.95, 0.15]),  # both accepted
        rec(2, 0, confs=[0.35, 0.9]),  # position 1 rejected, 2 not reached
    ]
    groups = reliability(rounds, groups=((1, 1), (2, 2)), bins=10)
    first, second, pooled = groups
    assert [g["label"] for g in groups] == ["position 1", "position 2", "all positions"]
    assert (first["n"], second["n"], pooled["n"]) == (3, 2, 5)
    # position 1: bin 0.9 holds two accepted tokens at 0.95; bin 0.3 one rejected at 0.35
    assert first["bins"][9] == {"lo": 0.9, "hi": 1.0, "n": 2, "confidence": pytest.approx(0.95), "accuracy": 1.0}
    assert first["ece"] == pytest.approx(2 / 3 * 0.05 + 1 / 3 * 0.35)
    # position 2: 0.55 rejected, 0.15 accepted
    assert second["ece"] == pytest.approx(0.5 * 0.55 + 0.5 * 0.85)
    assert pooled["ece"] == pytest.approx((2 * 0.05 + 0.35 + 0.55 + 0.85) / 5)


def _write_run(d: Path, config: dict, rows: list[dict], summary: dict | None = None) -> Path:
    d.mkdir(parents=True)
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"config": config, **(summary or {})}))
    return d


def test_concavity_and_sensitivity_points(tmp_path):
    rows = [row("p", [rnd(4, 3, passes=2), rnd(4, 2, passes=2), rnd(4, 0, passes=2)])]
    _write_run(
        tmp_path / "s" / "0",
        {"drafter": {"name": "fastdllm", "threshold": 0.9}, "policy": {"name": "static", "k": 4}},
        rows,
    )
    _write_run(
        tmp_path / "s" / "1",
        {"drafter": {"name": "fastdllm"}, "policy": {"name": "failfast", "tau": 0.3}},
        rows,
        {"speedup_vs_vanilla": 1.2, "modeled_speedup_vs_vanilla": 1.5, "modeled_profile": "a6000-qwen7b"},
    )
    runs = load([tmp_path / "s"])
    (point,) = concavity_points(runs)  # the failfast run is not a static-length point
    assert point["k"] == 4 and point["threshold"] == 0.9 and point["passes_per_draft"] == 2.0
    assert point["acceptance_rate"] == pytest.approx(5 / 12)
    # modeled: 8 tokens x 13.5 ms over 3 rounds x (2 x 6.1 + 13.5) ms
    assert point["modeled_speedup"] == pytest.approx(8 * 13.5 / (3 * (2 * 6.1 + 13.5)))
    (sens,) = sensitivity_points(runs, "policy.tau")
    assert sens == {"x": 0.3, "measured": 1.2, "modeled": 1.5, "profile": "a6000-qwen7b", "trusted": True}


def test_every_subcommand_writes_its_png(tmp_path, capsys):
    rows = [
        row(f"p{i}", [rnd(4, 4), rnd(4, 1, confs=[0.9, 0.3, 0.8, 0.2]), rnd(4, 4, emitted=2, finish="eos")])
        for i in range(3)
    ]
    for k in (2, 4):
        _write_run(
            tmp_path / "ar" / f"k{k}",
            {"drafter": {"name": "ar"}, "policy": {"name": "static", "k": k}, "dataset": {"name": "gsm8k"}},
            rows,
        )
        for t in (0.05, 0.9):
            _write_run(
                tmp_path / "dl" / f"k{k}-t{t}",
                {"drafter": {"name": "fastdllm", "threshold": t}, "policy": {"name": "static", "k": k}},
                rows,
            )
    for tau in (0.3, 0.45):
        _write_run(
            tmp_path / "tau" / str(tau),
            {"policy": {"name": "failfast", "tau": tau, "n_max": 60}},
            rows,
            {"speedup_vs_vanilla": 1.0 + tau, "modeled_speedup_vs_vanilla": 1.5, "modeled_profile": "x"},
        )
    out = tmp_path / "figs"
    assert main(["concavity", str(tmp_path / "dl"), str(tmp_path / "ar"), "--out", str(out)]) == 0
    assert main(["easy-regions", str(tmp_path / "ar" / "k2"), str(tmp_path / "ar" / "k4"), "--out", str(out)]) == 0
    assert main(["reliability", str(tmp_path / "ar" / "k4"), "--out", str(out)]) == 0
    assert main(["sensitivity", "--tau", str(tmp_path / "tau"), "--out", str(out)]) == 0
    for name in ("concavity.png", "easy_regions.png", "reliability.png", "sensitivity.png"):
        assert (out / name).stat().st_size > 10_000, name
    assert len(json.loads((out / "concavity.json").read_text())) == 6
    assert main(["reliability", str(tmp_path / "missing")]) == 2
    assert "no results.jsonl" in capsys.readouterr().err


def test_sensitivity_marks_points_whose_timings_cannot_be_trusted(tmp_path, monkeypatch):
    """Issue 22: a job that recorded timing_trusted: false is plotted with its measured speedup: its
    point is marked, and the figure says why."""
    rows = [row("p", [rnd(4, 3), rnd(4, 2)])]
    for tau, trusted in ((0.3, False), (0.45, True), (0.6, None)):
        summary = {"speedup_vs_vanilla": 1.0 + tau, "modeled_speedup_vs_vanilla": 1.5, "modeled_profile": "x"}
        if trusted is not None:
            summary["timing_conditions"] = {"timing_trusted": trusted, "timing_warnings": [] if trusted else ["busy"]}
        _write_run(tmp_path / "tau" / str(tau), {"policy": {"name": "failfast", "tau": tau}}, rows, summary)
    points = sensitivity_points(load([tmp_path / "tau"]), "policy.tau")
    assert [p["trusted"] for p in points] == [False, True, True]  # no timing conditions recorded: not judged

    import matplotlib.figure

    drawn = {}
    real = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):  # the texts and legend labels of the figure as saved
        drawn["texts"] = [t.get_text() for t in fig.texts]
        drawn["labels"] = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    assert main(["sensitivity", "--tau", str(tmp_path / "tau"), "--out", str(tmp_path / "figs")]) == 0
    assert "* measured, timing cannot be trusted" in drawn["labels"]
    assert any(t.startswith("* 1 point: timing cannot be trusted") and "run.resume=false" in t for t in drawn["texts"])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["sensitivity", "sweeps/tau"],
            "error: python -m specpolicy.analysis.paper_figures sensitivity: the sweep directories are "
            "given as --tau DIR (a tau-sensitivity sweep) and/or --nmax DIR (an nmax-sensitivity sweep), got sweeps/tau "
            "without an option (e.g. sensitivity --tau sweeps/tau)",
        ),
        (
            ["sensitivity"],
            "error: python -m specpolicy.analysis.paper_figures sensitivity: needs --tau DIR (a tau-sensitivity "
            "sweep) and/or --nmax DIR (an nmax-sensitivity sweep)",
        ),
        (
            ["sensitivity", "--tau"],
            "error: python -m specpolicy.analysis.paper_figures sensitivity: argument --tau: expected one argument",
        ),
    ],
)
def test_command_line_errors_are_one_line_naming_the_option(argv, expected, capsys):
    """Issue 22: `paper_figures sensitivity DIR` without --tau gave argparse's bare usage error."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [expected]
