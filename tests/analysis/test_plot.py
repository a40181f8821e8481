"""``python -m specpolicy.analysis.plot``: figures and trajectory pages from run directories."""

from __future__ import annotations

import json
import re

import matplotlib.image
import pytest

from conftest import random_prompts, sharpen, tiny_lm
from specpolicy.analysis.plot import latency_breakdown, load_runs, main, trajectory_html
from specpolicy.analysis.results import PromptResult
from specpolicy.core.decoding import generate
from specpolicy.core.reuse import DraftReuse
from specpolicy.drafters.ar import ARDrafter
from specpolicy.drafters.suffix import SuffixDrafter
from specpolicy.policies.static import StaticPolicy
from specpolicy.verifiers.hf import HFVerifier


class _Words:
    """A stand-in tokenizer: token t decodes to ``w<t> ``."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"w{i} " for i in ids)


def _round(k, a, e, draft, target, reused=0, passes=None, draft_ms=1.0, verify_ms=2.0):
    return {
        "speculation_length": k,
        "accepted_length": a,
        "emitted_tokens": e,
        "reused_tokens": reused,
        "drafter_forward_passes": k if passes is None else passes,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "confidences": [],
        "draft_token_ids": draft,
        "target_token_ids": target,
    }


def test_trajectory_page_marks_accepted_rejected_target_reused_and_cut_tokens():
    rounds = [
        _round(0, 0, 1, [], [7]),
        _round(0, 0, 1, [], [8]),  # two plain decoding steps: one line
        _round(3, 1, 2, [1, 2, 3], [1, 5, 9, 9]),  # accepts 1, rejects 2 3, corrects to 5
        _round(2, 2, 3, [4, 6], [4, 6, 11], reused=1),  # all accepted (6 reused), bonus 11
        _round(3, 3, 2, [12, 13, 14], [12, 13, 14, 15]),  # cut after 2 tokens (max_new_tokens)
    ]
    row = PromptResult.from_row(
        {
            "prompt_id": "gsm8k/3",
            "output_ids": list(range(10)),
            "wall_s": 0.1,
            "rounds": rounds,
            "finish_reason": "max_new_tokens",
            "lossless": True,
        }
    )
    page = trajectory_html(row, "ar+static", _Words())
    lines = re.findall(r'<div class="round">(.*?)</div>', page)
    assert len(lines) == 4
    assert "#0-#1 k=0 (2 plain decoding steps)" in lines[0]
    assert '<span class="tgt">w7 </span><span class="tgt">w8 </span>' in lines[0]
    assert (
        '<span class="acc">w1 </span><span class="rej">w2 </span><span class="rej">w3 </span>'
        '<span class="tgt">w5 </span>'
    ) in lines[1]
    assert "k=3" in lines[1] and "a=1" in lines[1] and "passes=3" in lines[1]
    assert '<span class="acc">w4 </span><span class="acc reused">w6 </span><span class="tgt">w11 </span>' in lines[2]
    assert "reused=1" in lines[2]
    assert '<span class="acc">w12 </span><span class="acc">w13 </span><span class="cut">w14 </span>' in lines[3]
    assert "w15" not in lines[3]  # the bonus token was never emitted
    assert '<td class="num">0.750</td>' in page  # acceptance rate (1 + 2 + 3) / (3 + 2 + 3), in the figures table
    ids_only = trajectory_html(row, "ar+static", None)  # no tokenizer: token ids
    assert '<span class="rej">[2]</span>' in ids_only


def test_html_is_escaped():
    class Tags:
        def decode(self, ids, skip_special_tokens=False):
            return "<b>&\n"

    row = PromptResult.from_row(
        {"prompt_id": "<p>", "output_ids": [2], "wall_s": 0.1, "rounds": [_round(1, 0, 1, [1], [2, 3])]}
    )
    page = trajectory_html(row, "m", Tags())
    assert "<b>" not in page.split("</style>")[1] and "&lt;b&gt;&amp;⏎</span>" in page


def _run_dir(path, method, rows):
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"method": method, "methods": {}, "config": {}}))


def test_latency_breakdown_per_generated_token(tmp_path):
    rows = [
        {
            "prompt_id": "a",
            "output_ids": [1, 2, 3, 4],
            "wall_s": 0.010,
            "rounds": [_round(3, 3, 4, [1, 2, 3], [1, 2, 3, 4], draft_ms=3.0, verify_ms=5.0)],
            "lossless": True,
            "first_difference": None,
            "vanilla_generated_tokens": 4,
            "vanilla_wall_s": 0.012,
            "vanilla_rounds": 4,
            "vanilla_verify_ms": 8.0,
            "vanilla_draft_ms": 0.0,
            "vanilla_finish_reason": "",
        }
    ]
    _run_dir(tmp_path / "one", "ar+static", rows)
    data = latency_breakdown(load_runs(tmp_path / "one"))
    assert data[0] == {"method": "vanilla", "draft": 0.0, "verify": 2.0, "other": 1.0, "trusted": True}
    assert data[1]["method"] == "ar+static"
    assert data[1]["draft"] == pytest.approx(0.75) and data[1]["verify"] == pytest.approx(1.25)
    assert data[1]["other"] == pytest.approx(0.5)


def _real_results(runtime, drafter, reuse=None):
    target = sharpen(tiny_lm(seed=0, layers=2), 4.0)
    verifier = HFVerifier(target, runtime, frozenset())
    results = []
    for i, prompt in enumerate(random_prompts(3)):
        out = generate(
            prompt, verifier, runtime, max_new_tokens=30, drafter=drafter(target), policy=StaticPolicy(4), reuse=reuse
        )
        van = generate(prompt, verifier, runtime, max_new_tokens=30)
        results.append(PromptResult.of(f"gsm8k/{i}", len(prompt), out, van))
    return results


def _real_rows(runtime, drafter, reuse=None):
    return [r.to_row() for r in _real_results(runtime, drafter, reuse)]


def _nonblank_png(path):
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    assert float(img[..., :3].std()) > 0.01  # something was drawn


def test_cli_on_a_multirun_directory(tmp_path, runtime, capsys):
    sweep = tmp_path / "multirun"
    _run_dir(sweep / "0", "ar+static", _real_rows(runtime, lambda t: ARDrafter(t, runtime)))
    _run_dir(sweep / "1", "suffix+static+reuse", _real_rows(runtime, lambda t: SuffixDrafter(runtime), DraftReuse(1)))
    _run_dir(sweep / "2", "ar+static", _real_rows(runtime, lambda t: ARDrafter(t, runtime)))
    runs = load_runs(sweep)
    assert [r.name for r in runs] == ["ar+static (0)", "suffix+static+reuse", "ar+static (2)"]
    assert main([str(sweep), "--max-pages", "2"]) == 0
    out = sweep / "plots"
    for name in (
        "length_cdf.png",
        "latency_breakdown.png",
        "acceptance_ar+static_0.png",
        "acceptance_suffix+static+reuse.png",
    ):
        _nonblank_png(out / name)
    pages = sorted(p.relative_to(out).as_posix() for p in out.glob("trajectories/*/*.html"))
    assert pages == [
        f"trajectories/{m}/gsm8k_{i}.html"
        for m in ("ar+static_0", "ar+static_2", "suffix+static+reuse")
        for i in (0, 1)
    ]
    index = (out / "index.html").read_text()
    assert 'src="length_cdf.png"' in index and 'href="trajectories/ar+static_0/gsm8k_0.html"' in index
    assert "wrote" in capsys.readouterr().out
    assert main([str(tmp_path / "empty")]) == 1


@pytest.mark.slow  # python -m specpolicy.analysis.plot in a child process
def test_wandb_logger_logs_the_figures(tmp_path, runtime, monkeypatch):
    from specpolicy.run.loggers.wandb import WandbLogger

    logged = {}

    class FakeRun:
        def log(self, data):
            logged.update(data)

    logger = WandbLogger(mode="disabled")
    logger._results = _real_results(runtime, lambda t: ARDrafter(t, runtime))
    logger.run = run = FakeRun()
    logger._log_plots(run, {"method": "ar+static", "methods": {}}, str(tmp_path))
    assert {"plots/length_cdf", "plots/latency_breakdown", "plots/acceptance_ar+static"} <= set(logged)
    assert {"trajectories/gsm8k_0", "trajectories/gsm8k_2"} <= set(logged)
    assert (tmp_path / "plots" / "index.html").exists() and not logger.warnings
