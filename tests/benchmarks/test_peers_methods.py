"""``benchmarks/peers.py --method NAME=OVERRIDES`` (issue 30, 6f): methods added by config -- any
installed policy, a plugin's included, resolved through the plugin manager as the CLI does -- run
beside vanilla on the same prompts, checked against it, in the JSON, the table and the run dirs;
a bad method is one parser error line before any model loads."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import load_benchmark

needs_entropy = pytest.mark.skipif(
    importlib.util.find_spec("specpolicy_entropy") is None,
    reason="the example plugin is not installed (pip install ./examples/third-party-policy)",
)


def _models(family) -> list[str]:
    return [
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
    ]


@needs_entropy
@pytest.mark.slow  # a benchmark run (3 methods x 2 prompts, the oracle replay)
def test_a_plugin_policy_and_a_builtin_one_are_compared_by_config(family, tmp_path, capsys):
    out = tmp_path / "compare.json"
    results = load_benchmark("peers").main(
        [
            *_models(family),
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--warmup",
            "0",
            "--out",
            str(out),
            "--method",
            "entropy-n2=drafter=ar,policy=entropy,policy.n=2,policy.n_max=6",
            "--method",
            "static-k3=drafter=ar,policy=static,policy.k=3",
        ]
    )
    methods = results["methods"]
    assert set(methods) == {"vanilla", "entropy-n2", "static-k3"}  # only vanilla and the added methods
    assert results["calibration"] is None
    for name in ("entropy-n2", "static-k3"):
        assert methods[name]["lossless"] == "2/2", methods[name].get("not_lossless")
        assert methods[name]["drafter"] == "ar" and 0.0 < methods[name]["oracle_fraction"] <= 1.0 + 1e-9
    assert methods["entropy-n2"]["description"].startswith("EntropyPolicy(n=2, max_bits=1.0, n_max=6)")
    assert methods["static-k3"]["description"].startswith("StaticPolicy(k=3)")
    runs = tmp_path / "compare-runs"
    assert sorted(p.name for p in runs.iterdir()) == ["entropy-n2", "static-k3"]
    for name, longest in (("entropy-n2", 6), ("static-k3", 3)):  # each ran with its own settings
        rows = [json.loads(line) for line in (runs / name / "results.jsonl").read_text().splitlines()]
        lengths = {r["speculation_length"] for row in rows for r in row["rounds"]}
        assert max(lengths) <= longest and lengths - {0}, (name, lengths)
        if name == "entropy-n2":  # drafted in chunks of n = 2 (or cut short by the tokens left to generate)
            assert {k for k in lengths if k % 2} <= {1}, lengths
        else:
            assert 3 in lengths
    assert json.loads(out.read_text())["settings"]["method"] == [
        "entropy-n2=drafter=ar,policy=entropy,policy.n=2,policy.n_max=6",
        "static-k3=drafter=ar,policy=static,policy.k=3",
    ]
    printed = capsys.readouterr().out
    assert "entropy-n2" in printed and "static-k3" in printed and "x HF best: - (no HF method ran)" in printed


@pytest.mark.parametrize(
    "method, error",
    [
        ("x=drafter=ar,policy=static,policy.tau=0.3", "x: unknown key policy.tau; policy has keys k"),
        ("x=drafter=ar,policy=static,policy.k=0", "x: policy.k must be an integer >= 1, got 0"),
        ("x=drafter=ar,policy=nosuch", "x: no config 'nosuch' in group policy; choices: "),
        (
            "x=drafter=ar,generation.max_new_tokens=3",
            "x: 'generation.max_new_tokens=3': a method sets method=, drafter=, drafter.KEY=, policy=, policy.KEY= "
            "and reuse.enabled= only",
        ),
        (
            "x=drafter=dflash,drafter.path_search=cps,drafter.cps_lambda=2,policy=static",
            "x: drafter.cps_lambda must be a number in [0, 1], got 2",
        ),
        ("vanilla=drafter=ar,policy=static", "takes NAME (a method preset) or NAME=drafter=D,policy=P"),
        ("nosuch", "'nosuch' is not a method preset (conf/method/); accepted: ar+failfast, ar+failfast+reuse, "),
        ("x=method=nosuch", "x: no config 'nosuch' in group method; choices: "),
    ],
)
def test_a_bad_method_is_one_parser_line_before_any_model_loads(method, error, capsys, monkeypatch):
    peers = load_benchmark("peers")
    monkeypatch.setattr(peers, "Bench", lambda args: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as info:
        peers.main(["--method", method, "--num-prompts", "1"])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"benchmarks/peers.py: error: argument --method: {error}"), last


@needs_entropy
def test_a_plugin_policy_is_found_and_validated_like_the_cli_finds_it():
    peers = load_benchmark("peers")
    spec = peers.parse_method("mine=drafter=dflash,policy=entropy,policy.max_bits=0.5,reuse.enabled=true")
    assert (spec.name, spec.drafter, spec.reuse) == ("mine", "dflash", True)
    assert spec.policy == {"name": "entropy", "n": 4, "max_bits": 0.5, "n_max": 32}  # the plugin's own config file
    with pytest.raises(Exception, match=r"policy.n must be in \[1, policy.n_max=32\], got 0"):
        peers.parse_method("mine=drafter=dflash,policy=entropy,policy.n=0")


def test_a_method_sets_the_drafter_s_own_settings():
    """``drafter.KEY=`` runs a drafter of its own (e.g. DiffuSpec's path search); the settings that
    equal the drafter's config are not its own."""
    peers = load_benchmark("peers")
    spec = peers.parse_method("cps=drafter=dflash,drafter.path_search=cps,drafter.extension=given,policy=adl")
    assert spec.drafter_settings == {"path_search": "cps"} and spec.policy["name"] == "adl"
    assert peers.parse_method("plain=drafter=dflash,policy=static").drafter_settings == {}


def test_a_method_s_drafter_model_wins_over_the_bench_s_checkpoint(family):
    """``drafter.model=PATH`` in a method compares another checkpoint of the same drafter kind in
    the same run (e.g. a retrained drafter beside the bundled one); the bench's ``--ar-drafter``
    stays the other methods' checkpoint."""
    peers = load_benchmark("peers")
    bench = peers.Bench(peers.parse_args(_models(family)))
    spec = peers.parse_method(f"own=drafter=ar,drafter.model={family['target']},policy=static,policy.k=2")
    assert spec.drafter_settings == {"model": str(family["target"])}
    bench.added(spec)
    own = bench.drafters[f"ar[model={family['target']}]"].model
    weights = {name: m.lm_head.weight for name, m in [("own", own), ("bench", bench.drafters["ar"].model)]}
    assert weights["own"].equal(bench.target.lm_head.weight)  # the method's checkpoint: the target's
    assert not weights["bench"].equal(bench.target.lm_head.weight)
