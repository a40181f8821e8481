"""``benchmarks/real_scale.py`` (issue 48 item 6) at tiny shapes on CPU: the passes derived from a
run's rounds (a worked example per drafter kind), the profile table and its latency profile, the
replay's speedups from its own timings, the memory refusal and one-line argument errors. No
timing is asserted: only what the figures are computed from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import load_benchmark
from specpolicy.analysis.pass_replay import Pass, drafter_passes, round_passes, vanilla_passes
from specpolicy.analysis.results import round_to_dict
from specpolicy.core.latency import LatencyProfile, load_profile, modeled_speedup
from specpolicy.core.types import RoundRecord


def rnd(k: int, accepted: int, emitted: int, passes: int, parents: tuple[int, ...] = ()) -> RoundRecord:
    return RoundRecord(
        index=0,
        speculation_length=k,
        accepted_length=accepted,
        emitted_tokens=emitted,
        drafter_forward_passes=passes,
        reused_tokens=0,
        draft_ms=0.0,
        verify_ms=0.0,
        draft_parents=parents,
        accepted_path=(0,) if parents else (),
    )


# P = 10: round 0 verifies 3 drafts and commits 3 tokens (C = 10 -> 13), round 1 commits 1.
ROUNDS = [rnd(3, 2, 3, 3), rnd(3, 0, 1, 3)]


def drafts(rounds_passes: list[list[Pass]]) -> list[list[tuple[int, int]]]:
    return [[(p.width, p.kv) for p in passes if p.model == "drafter"] for passes in rounds_passes]


def test_target_verifies_k_plus_one_after_the_cached_prefix_and_vanilla_one_a_token():
    passes = round_passes("ar", ROUNDS, 10)
    assert [(p.width, p.kv) for r in passes for p in r if p.model == "target"] == [(4, 9), (4, 12)]
    assert all(r[-1].model == "target" for r in passes)  # drafting precedes its verification
    assert [(p.width, p.kv) for p in vanilla_passes(10, 3)] == [(1, 9), (1, 10), (1, 11)]


@pytest.mark.parametrize("drafter", ["ar", "eagle3", "easyspec"])
def test_chain_drafters_feed_the_new_tokens_then_one_a_pass(drafter):
    # round 0: the pending token (f = 1) after 9 cached, then 1-wide; round 1: the 3 new tokens after 10
    assert drafts(round_passes(drafter, ROUNDS, 10)) == [[(1, 9), (1, 10), (1, 11)], [(3, 10), (1, 13), (1, 14)]]


def test_eagle3_tree_passes_feed_the_expanded_nodes_of_each_depth():
    # nodes 0, 1 at depth 1; 2, 3 (children of 0) and 4 (of 1) at depth 2; 5 (of 2) at depth 3
    tree = rnd(6, 2, 3, 3, parents=(-1, -1, 0, 0, 1, 2))
    assert drafts(round_passes("eagle3", [tree], 10)) == [[(1, 9), (2, 10), (1, 12)]]


def test_dart_one_pass_of_the_new_pairs_and_seven_masks_and_its_extension():
    assert drafts(round_passes("dart", [rnd(8, 2, 3, 1), rnd(8, 0, 1, 1)], 10)) == [[(8, 9)], [(10, 10)]]
    assert [(p.width, p.kv) for p in drafter_passes("dart", rnd(16, 0, 1, 2), 10, 1)] == [(8, 9), (15, 10)]


def test_dflash_block_and_extension_passes():
    assert [(p.width, p.kv) for p in drafter_passes("dflash", rnd(15, 0, 1, 1), 10, 1)] == [(16, 9)]
    assert [(p.width, p.kv) for p in drafter_passes("dflash", rnd(30, 0, 1, 2), 10, 1, 16)] == [(16, 9), (31, 9)]


@pytest.mark.parametrize("drafter", ["fastdllm", "deer"])
def test_block_diffusion_passes_run_the_current_block_after_the_complete_blocks(drafter):
    # B = 4, C = 10: complete blocks 8; the second pass comes after 6 / 2 = 3 drafted tokens: 13 -> 12
    assert [(p.width, p.kv) for p in drafter_passes(drafter, rnd(6, 0, 1, 2), 10, 1, 4)] == [(4, 8), (4, 12)]


def test_falcon_first_pass_reruns_the_held_back_pair_then_blocks_of_two():
    assert [(p.width, p.kv) for p in drafter_passes("falcon", rnd(6, 0, 1, 3), 10, 3)] == [(4, 6), (2, 10), (2, 12)]


def test_model_free_drafters_have_no_pass_and_unknown_ones_raise():
    assert drafter_passes("suffix", rnd(4, 1, 2, 0), 10, 1) == []
    with pytest.raises(ValueError, match="no pass derivation"):
        drafter_passes("medusa", rnd(4, 1, 2, 1), 10, 1)


TINY = ["--tiny", "--device", "cpu", "--warmup", "0", "--repeats", "1"]


def test_profile_writes_every_cell_with_the_measured_marker_and_a_loadable_profile(tmp_path, capsys):
    rs = load_benchmark("real_scale")
    assert rs.main(["profile", *TINY, "--targets", "qwen2.5-7b", "--drafters", "eagle3,dflash", "--modes", "eager,graphs",
                    "--widths", "1,4", "--kv", "16,64", "--out", str(tmp_path)]) == 0  # fmt: skip
    import torch

    assert torch.is_grad_enabled()  # main ran without gradients and gave the caller's mode back
    table = json.loads((tmp_path / "cpu-tiny-qwen2.5-7b.json").read_text())
    assert table["measured"] is True and table["device"] and table["torch"] and table["command"].startswith("python")
    assert not table["partial"] and not table["skipped"]
    for model in ("target", "eagle3", "dflash"):
        for mode in ("eager", "graphs"):
            grid = table["models"][model][mode]
            assert sorted(grid) == ["16", "64"] and all(sorted(row) == ["1", "4"] for row in grid.values())
            assert all(ms > 0 for row in grid.values() for ms in row.values())
    text = (tmp_path / "cpu-tiny-qwen2.5-7b.yaml").read_text()
    assert "# measured: true" in text
    profile = LatencyProfile.from_config(yaml.safe_load(text))
    row = table["models"]["target"]["graphs"]["64"]  # the KV nearest 1,024, the graphs runtime
    assert profile.target_ms_per_token == pytest.approx(row["1"], abs=1e-3)
    assert profile.drafter_pass_ms_by_drafter["eagle3"] == pytest.approx(
        table["models"]["eagle3"]["graphs"]["64"]["1"], abs=1e-3
    )
    assert profile.drafter_pass_ms_by_drafter["dflash"] == pytest.approx(
        table["models"]["dflash"]["graphs"]["64"]["4"], abs=1e-3
    )


def test_a_model_too_large_is_skipped_in_one_line_before_it_is_built(tmp_path, capsys, monkeypatch):
    rs = load_benchmark("real_scale")
    monkeypatch.setattr(rs.rsm, "build_pass", lambda *a: pytest.fail("built a model that does not fit"))
    rs.main(["profile", *TINY, "--targets", "qwen2.5-32b", "--drafters", "eagle3", "--widths", "1", "--kv", "16",
             "--memory-gb", "0.00001", "--out", str(tmp_path)])  # fmt: skip
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("skipped")]
    assert len(lines) == 2 and all("does not fit" in line and "parameters x 4 bytes" in line for line in lines)
    table = json.loads((tmp_path / "cpu-tiny-qwen2.5-32b.json").read_text())
    assert sorted(table["skipped"]) == ["eagle3", "target"] and not table["models"]


def write_run(directory: Path, drafter: str, rounds: list[RoundRecord], prompt_tokens: int = 10) -> Path:
    directory.mkdir(parents=True)
    emitted = sum(r.emitted_tokens for r in rounds)
    row = {"prompt_id": "t/0", "prompt_tokens": prompt_tokens, "output_ids": [1] * emitted, "wall_s": 0.0,
           "rounds": [round_to_dict(r) for r in rounds]}  # fmt: skip
    (directory / "results.jsonl").write_text(json.dumps(row) + "\n")
    summary = {"method": f"{drafter}+static", "config": {"drafter": {"name": drafter}}}
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def test_replay_from_a_profile_table_computes_speedup_from_the_same_pass_costs(tmp_path):
    rs = load_benchmark("real_scale")
    # target: 2 ms + 0.5 ms per position, any KV; drafter (EAGLE-3): 1 ms a pass
    table = {"models": {
        "target": {"eager": {str(kv): {str(w): 2 + 0.5 * w for w in (1, 8)} for kv in (16, 64)}},
        "eagle3": {"eager": {str(kv): {str(w): 1.0 for w in (1, 8)} for kv in (16, 64)}},
    }}  # fmt: skip
    (tmp_path / "table.json").write_text(json.dumps(table))
    run = write_run(tmp_path / "run", "eagle3", ROUNDS)
    out = tmp_path / "replay.json"
    rs.main(["replay", str(run), "--tiny", "--device", "cpu", "--from-profile", str(tmp_path / "table.json"),
             "--out", str(out)])  # fmt: skip
    row = json.loads(out.read_text())["rows"][0]
    target_ms, drafter_ms, vanilla_ms = 2 * (2 + 0.5 * 4), 6 * 1.0, 4 * (2 + 0.5 * 1)  # 2 rounds, 6 passes, 4 tokens
    assert row["replayed_ms"] == {"target": target_ms, "drafter": drafter_ms, "total": target_ms + drafter_ms}
    assert row["vanilla_ms"] == vanilla_ms and row["tokens"] == 4 and row["passes"] == 8
    assert row["replayed_speedup"] == pytest.approx(vanilla_ms / (target_ms + drafter_ms), abs=1e-4)
    profile = load_profile("a6000-qwen7b").for_drafter("eagle3")
    assert row["modeled_speedup"] == pytest.approx(modeled_speedup(ROUNDS, 4, profile), abs=1e-4)
    assert row["modeled_error"] == pytest.approx(row["modeled_speedup"] / row["replayed_speedup"] - 1, abs=1e-3)
    assert not row["partial"]
    assert "REPLAYED speedup" in out.with_suffix(".md").read_text()
    # the table's own profile (target 2.5 ms + 0.5 ms a drafted token, EAGLE-3 1 ms a pass) models
    # these costs exactly (affine in width, flat in KV): the formula's error is 0 here
    assert row["modeled_measured_speedup"] == pytest.approx(10 / 14, abs=1e-4) and row["modeled_measured_error"] == 0


def test_replay_executes_the_passes_and_caps_the_rounds(tmp_path):
    rs = load_benchmark("real_scale")
    run = write_run(tmp_path / "run", "dflash", [rnd(5, 2, 3, 1), rnd(5, 5, 6, 1), rnd(5, 0, 1, 1)])
    out = tmp_path / "replay.json"
    rs.main(["replay", str(run), *TINY[:3], "--max-rounds", "2", "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert row["rounds"] == 2 and row["tokens"] == 9 and row["passes"] == 4 and row["partial"]
    ms = row["replayed_ms"]
    assert (
        ms["target"] > 0 and ms["drafter"] > 0 and ms["total"] == pytest.approx(ms["target"] + ms["drafter"], abs=2e-3)
    )
    assert row["replayed_speedup"] == pytest.approx(row["vanilla_ms"] / ms["total"], rel=1e-3)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["profile", "--widths", "0,4", "--out", "x"], "--widths"),
        (["profile", "--targets", "gpt2", "--out", "x"], "--targets"),
        (["profile", "--device", "tpu", "--out", "x"], "--device"),
        (["replay", "nowhere", "--device", "cpu", "--out", "x"], "nowhere"),
        (["replay", "nowhere", "--max-rounds", "many", "--out", "x"], "--max-rounds"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_flag(argv, flag, capsys):
    rs = load_benchmark("real_scale")
    with pytest.raises(SystemExit) as exit_:
        rs.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and flag in err


def test_a_second_profile_run_adds_its_mode_and_a_failing_mode_leaves_one_line(tmp_path, monkeypatch):
    rs = load_benchmark("real_scale")
    common = [
        *TINY,
        "--targets",
        "qwen2.5-7b",
        "--drafters",
        "eagle3",
        "--widths",
        "1",
        "--kv",
        "16",
        "--out",
        str(tmp_path),
    ]
    rs.main(["profile", *common, "--modes", "eager"])
    measured = rs.rsm.pass_ms

    def graphs_fail(model, width, kv, mode, *rest):
        if mode == "graphs" and model.fc is not None:  # the EAGLE-3 head's graphs fail, the target's run
            raise RuntimeError("no kernel for this\nsecond line")
        return measured(model, width, kv, mode, *rest)

    monkeypatch.setattr(rs.rsm, "pass_ms", graphs_fail)
    rs.main(["profile", *common, "--modes", "graphs"])
    table = json.loads((tmp_path / "cpu-tiny-qwen2.5-7b.json").read_text())
    assert len(table["commands"]) == 2 and "--modes eager" in table["commands"][0]
    assert table["models"]["target"]["eager"]["16"]["1"] > 0 and table["models"]["target"]["graphs"]["16"]["1"] > 0
    eagle3 = table["models"]["eagle3"]
    assert eagle3["eager"]["16"]["1"] > 0 and eagle3["graphs"] == {}
    assert eagle3["graphs_error"] == "RuntimeError: no kernel for this"


@pytest.mark.slow  # the device script's CPU dry run: every part, tiny shapes (about 30 s here)
def test_the_device_script_dry_run_brings_the_profiles_and_the_replays_back(tmp_path):
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    run = write_run(tmp_path / "runs" / "eagle3", "eagle3", ROUNDS)
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "TINY": "1", "NO_WHEELS": "1", "OUT": str(out), "RUNS": str(run),
           "TARGETS": "qwen2.5-7b", "GRAPH_TARGETS": "qwen2.5-7b", "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run(["bash", "benchmarks/gpu_real_scale.sh", "0", "200", "100", "120", "90"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = json.loads((out / "profile" / "cpu-tiny-qwen2.5-7b.json").read_text())
    assert {"eager", "graphs"} <= set(table["models"]["target"]) and not table["partial"]
    assert sorted(table["models"]) == ["dart", "deer", "dflash", "eagle3", "falcon", "fastdllm", "target"]
    assert (out / "profile" / "cpu-tiny-qwen2.5-7b.yaml").is_file()
    for name in ("replay-executed", "replay-profile"):
        rows = json.loads((out / f"{name}.json").read_text())["rows"]
        assert rows[0]["rounds"] == 2 and rows[0]["replayed_speedup"] > 0
        assert (out / f"{name}.md").is_file()
    host = json.loads((out / "host-work-cpu.json").read_text())  # part 4: the host work on this device
    assert list(host["methods"]) == ["ar-k5"] and host["methods"]["ar-k5"]["rounds"] >= 1
    assert host["settings"]["device"] == "cpu" and host["after_pass_probe"]["warm_us"] > 0
    # part 4's warm split: DART's search in the run and warm, the other calls' rows present
    split = json.loads((out / "host-work-warm-split-cpu.json").read_text())["warm_split"]["dart+dart-tree"]
    assert split["specpolicy.policies.dart_tree:_run"]["calls"] >= 1
    assert split["specpolicy.policies.dart_tree:_run"]["warm_us"] > 0 and len(split) == 5
