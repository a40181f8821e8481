"""After every run the CLI says where the results are and what to run next; after a multirun it
prints the sweep directory (Hydra callback)."""

from __future__ import annotations

import sys

from conftest import overrides
from specpolicy.run.cli import main


def test_a_run_prints_its_directory_and_the_next_commands(family, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(sys, "argv", ["specpolicy", *overrides(family), "hydra.run.dir=outputs/mine"])
    main()
    out = capsys.readouterr().out.splitlines()
    start = out.index("results: outputs/mine/ (summary.json, results.jsonl)")
    assert out[start + 1 : start + 4] == [
        "next:    python -m specpolicy.analysis.report outputs/mine",
        "         python -m specpolicy.analysis.plot outputs/mine",
        "         python -m specpolicy.analysis.oracle outputs/mine",
    ]
    assert (tmp_path / "outputs" / "mine" / "summary.json").is_file()


def test_a_multirun_prints_its_sweep_directory(family, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "specpolicy",
            "-m",
            *overrides(family),
            "dataset.num_prompts=1",
            "policy=static",
            "policy.k=2,3",
            "hydra.sweep.dir=sweeps/k",
        ],
    )
    main()
    out = capsys.readouterr().out.splitlines()
    assert out.count("results: sweeps/k/0/ (summary.json, results.jsonl)") == 1  # each job: where, no commands
    assert "results: sweeps/k/1/ (summary.json, results.jsonl)" in out
    start = out.index("sweep results: sweeps/k/ (2 jobs, one directory per job)")
    assert out[start + 1 :] == [
        "next:    python -m specpolicy.analysis.report sweeps/k",
        "         python -m specpolicy.analysis.plot sweeps/k",
        "         python -m specpolicy.analysis.oracle sweeps/k",
    ]


def test_help_says_what_specpolicy_is_and_names_its_flags_and_commands(monkeypatch, capsys):
    """Issue 22: --help began "cli is powered by Hydra." and named neither --list-plugins, --debug
    nor the report / plot / oracle / paper_figures commands."""
    import pytest

    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setattr(sys, "argv", ["specpolicy", "--help"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("specpolicy: drafting strategies for speculative decoding.")
    assert "powered by Hydra" not in out
    for needle in (
        "--list-plugins",
        "--debug",
        "HYDRA_FULL_ERROR=1",
        "-m key=a,b",
        "--cfg job",
        "python -m specpolicy.analysis.report DIR",
        "python -m specpolicy.analysis.plot DIR",
        "python -m specpolicy.analysis.oracle DIR",
        "python -m specpolicy.analysis.paper_figures FIGURE DIR",
        "policy: adl, aimd, batch-schedule, block-tree, dart-tree, diffuspec, eagle2-tree",
        "docs/reference/config.md",
        "--hydra-help",
    ):
        assert needle in out, needle
