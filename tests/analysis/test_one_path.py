"""One path from rounds to numbers: the same method on the same prompts gives the same summary
numbers in the run's summary.json, in the sweep report, and in the peer benchmark's table (and
its per-method run directories), because all of them are ``specpolicy.analysis.summary.summarize``."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from conftest import load_benchmark
from specpolicy.analysis.report import collect
from specpolicy.analysis.results import read_run
from specpolicy.run.experiment import run_experiment

#: Figures that do not depend on timings: they must be equal, not close.
COUNTED = (
    "acceptance_rate",
    "mean_accepted_length",
    "mean_accepted_length_with_bonus",
    "mean_speculation_length",
    "mean_speculation_length_drafted",
    "max_accepted_length",
    "max_speculation_length",
    "rounds",
    "drafter_passes_per_round",
    "lossless",
    "lossless_fraction",
    "prompts",
    "modeled_speedup_vs_vanilla",
)
PROMPTS, TOKENS, K = 2, 256, 5  # GSM8K 1 ends with EOS on a draft of 5 that accepted 4


def _peers():
    return load_benchmark("peers")


@pytest.mark.slow  # the bundled family, 256 tokens, a run and a peer benchmark
def test_run_report_and_peer_table_give_the_same_numbers(tmp_path, capsys):
    # The bundled family writes GSM8K answers that end with EOS inside a round: draft positions
    # past the stop are unobserved (metrics.observed), the case where counting differs.
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "drafter=ar",
                "policy=static",
                f"policy.k={K}",
                "runtime=cpu",
                f"dataset.num_prompts={PROMPTS}",
                f"generation.max_new_tokens={TOKENS}",
                "run.warmup_prompts=0",
            ],
        )
    run = run_experiment(cfg, tmp_path / "run")
    peers = _peers().main(
        [
            "--num-prompts",
            str(PROMPTS),
            "--max-new-tokens",
            str(TOKENS),
            "--method",
            f"ar+static-k{K}",  # the conf/method/ preset
            "--sweep-prompts",
            "1",
            "--warmup",
            "0",
            "--no-oracle",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "peers" / "results.json"),
        ]
    )
    table = capsys.readouterr().out

    (reported,) = collect(tmp_path / "run")
    (peer_reported,) = collect(tmp_path / "peers" / "results-runs")
    peer = peers["methods"][f"ar+static-k{K}"]
    spec = run["methods"]["ar+static"]
    for key in COUNTED:
        value = run.get(key, spec.get(key))
        if key == "lossless":
            value = f"{PROMPTS}/{PROMPTS}"
        assert value is not None, key
        assert reported[key] == value, key
        assert peer[key] == value, key
        assert peer_reported[key] == value, key
    assert run["finish_reasons"] == {"eos": PROMPTS}
    assert f"{run['acceptance_rate']:.3f}" in table and f"{spec['drafter_passes_per_round']:.2f}" in table

    # the case that makes this test bite: counting every drafted position would give another rate
    rounds = read_run(tmp_path / "run").rounds
    drafted = [r for r in rounds if r.speculation_length > 0]
    naive = sum(r.accepted_length for r in drafted) / sum(r.speculation_length for r in drafted)
    assert naive != run["acceptance_rate"]
