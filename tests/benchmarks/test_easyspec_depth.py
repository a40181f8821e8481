"""benchmarks/easyspec_depth.py: the target as its own layer-parallel drafter."""

from __future__ import annotations

import json

import pytest

from conftest import load_benchmark


@pytest.mark.slow
def test_the_target_as_its_own_sequential_drafter_is_always_accepted(tmp_path):
    out = tmp_path / "depth.json"
    module = load_benchmark("easyspec_depth")
    argv = ["--num-prompts", "1", "--max-new-tokens", "12", "--groups", "1", "4", "--runs-dir", str(tmp_path)]
    assert module.main([*argv, "--out", str(out)]) == 0
    rows = {r["layer_parallel"]: r for r in json.loads(out.read_text())["rows"]}
    # layer_parallel 1 is the exact pass: every draft is the target's own greedy token
    assert rows[1]["acceptance_rate"] == 1.0
    # grouping is lossless whatever it costs in acceptance
    assert rows[4]["lossless_fraction"] == 1.0 and rows[4]["acceptance_rate"] <= 1.0
