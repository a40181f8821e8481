"""The paper's figures for any run: ``python -m specpolicy.plot <run dir | multirun dir> [--out DIR]``.

Reads every run under the directory (a directory holding ``results.jsonl``, with its
``summary.json`` when present: a single run, each job of a Hydra multirun, or each method of
``benchmarks/peers.py --runs-dir``) and writes, into ``DIR`` (default ``<dir>/plots``):

* ``length_cdf.png`` -- CDF of accepted and of speculated lengths per round, one line per
  method (FailFast, arXiv 2512.20573, Fig. 8);
* ``latency_breakdown.png`` -- milliseconds per generated token split into drafting,
  verification and the rest (prefill, loop), per method, vanilla decoding first (Fig. 6);
* ``acceptance_<method>.png`` -- per round of the first prompts: speculated and accepted
  lengths (bars) and the acceptance rate of the round (line);
* ``trajectories/<method>/<prompt>.html`` -- one page per prompt in the style of Fig. 12: one
  round per line with its lengths, accepted draft tokens plain, rejected draft tokens struck
  through, the target's token (correction or bonus) boxed; reused draft tokens underlined;
* ``index.html`` -- links to all of the above.

Tokens are decoded with the target's tokenizer (``config.verifier.model`` of the run's
summary, or ``--tokenizer``); without one, token ids are shown. Uses matplotlib's Agg backend
(no display needed; ``pip install matplotlib``, part of ``specpolicy[test]``).
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SKIP_DIRS = {"wandb", ".hydra", ".submitit", "plots"}
#: Colors: verification (bottom), drafting, other -- as Fig. 6 stacks them.
COLORS = {"verify": "#4c72b0", "draft": "#dd8452", "other": "#b0b0b0"}


@dataclass
class Run:
    """One method's results: ``rows`` (``results.jsonl`` lines) and its ``summary`` (may be empty)."""

    name: str
    directory: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        return [r for row in self.rows for r in row.get("rounds", [])]


def _read_run(directory: Path) -> Run:
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    summary_file = directory / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.exists() else {}
    return Run(str(summary.get("method") or directory.name), directory, rows, summary)


def load_runs(path: str | Path) -> list[Run]:
    """Every run under ``path`` (itself, or its sub-directories holding ``results.jsonl``), in
    path order. Runs of the same method get their directory appended to the name.

    Raises:
        FileNotFoundError: when no ``results.jsonl`` is found.
    """
    root = Path(path)
    if (root / "results.jsonl").is_file():
        dirs = [root]
    else:
        dirs = sorted({f.parent for f in root.rglob("results.jsonl")
                       if not _SKIP_DIRS & set(f.relative_to(root).parts[:-1])})
    if not dirs:
        raise FileNotFoundError(f"no results.jsonl under {root}")
    runs = [_read_run(d) for d in dirs]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.name] = counts.get(r.name, 0) + 1
    for r in runs:
        if counts[r.name] > 1:
            r.name = f"{r.name} ({r.directory.relative_to(root)})"
    return runs


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_") or "run"


# -- Fig. 8: CDF of accepted / speculated lengths ---------------------------------------------


def _style(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """A distinct color per method (tab10, tab20 beyond 10) and dashed lines for draft-reuse variants."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(runs) <= 10 else "tab20"]
    return {r.name: {"color": cmap(i % cmap.N), "linestyle": "--" if "reuse" in r.name else "-"}
            for i, r in enumerate(runs)}


def plot_length_cdf(runs: Sequence[Run], path: str | Path) -> Path:
    """Empirical CDFs of the accepted length and of the speculation length per round (rounds
    with a draft), one line per method, two panels, legend on the right. Returns ``path``."""
    plt = _pyplot()
    style = _style(runs)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    for key, ax, title in (("accepted_length", axes[0], "accepted length per round"),
                           ("speculation_length", axes[1], "speculated length per round")):
        for run in runs:
            values = sorted(r[key] for r in run.rounds if r["speculation_length"] > 0)
            if not values:
                continue
            n = len(values)
            ax.step([values[0]] + values, [0.0] + [(i + 1) / n for i in range(n)], where="post", label=run.name,
                    lw=1.4, **style[run.name])
        ax.set_title(title)
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("CDF (fraction of rounds with a draft)")
    handles, labels = axes[1].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="center right", frameon=False)
    fig.suptitle("Accepted and speculated lengths per round (cf. FailFast Fig. 8)")
    fig.tight_layout(rect=(0, 0, 0.78 if handles else 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- Fig. 6: latency breakdown ----------------------------------------------------------------


def latency_breakdown(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per method (vanilla first, pooled over the runs that measured it): ms per generated token
    spent drafting, verifying, and elsewhere (prefill + loop), from the recorded rounds."""
    out = []
    van_tokens = van_wall = van_verify = 0.0
    for run in runs:
        van = (run.summary.get("methods") or {}).get("vanilla")
        if van and van.get("generated_tokens"):
            van_tokens += van["generated_tokens"]
            van_wall += van["wall_s"] * 1e3
            van_verify += van.get("verify_ms", 0.0)
    if van_tokens:
        out.append({"method": "vanilla", "draft": 0.0, "verify": van_verify / van_tokens,
                    "other": max(van_wall - van_verify, 0.0) / van_tokens})
    for run in runs:
        tokens = sum(row.get("generated_tokens", 0) for row in run.rows)
        if not tokens:
            continue
        draft = sum(r["draft_ms"] for r in run.rounds)
        verify = sum(r["verify_ms"] for r in run.rounds)
        wall = sum(row.get("wall_s", 0.0) for row in run.rows) * 1e3
        out.append({"method": run.name, "draft": draft / tokens, "verify": verify / tokens,
                    "other": max(wall - draft - verify, 0.0) / tokens})
    return out


def plot_latency_breakdown(runs: Sequence[Run], path: str | Path) -> Path:
    """Stacked horizontal bars, one per method (vanilla on top): verification, drafting and other
    time, in ms per generated token. Returns ``path``."""
    plt = _pyplot()
    data = latency_breakdown(runs)
    fig, ax = plt.subplots(figsize=(9, 1.9 + 0.38 * max(len(data), 1)))
    ys = list(range(len(data)))[::-1]  # first method at the top
    left = [0.0] * len(data)
    for part, label in (("verify", "verification"), ("draft", "drafting"), ("other", "other (prefill, loop)")):
        vals = [d[part] for d in data]
        ax.barh(ys, vals, left=left, color=COLORS[part], label=label, height=0.7)
        left = [a + v for a, v in zip(left, vals)]
    for y, total in zip(ys, left):
        ax.text(total, y, f" {total:.2f}", va="center", fontsize=8)
    ax.set_yticks(ys)
    ax.set_yticklabels([d["method"] for d in data], fontsize=8)
    ax.set_xlabel("ms per generated token (measured)")
    ax.set_xlim(0, max(left + [1e-9]) * 1.12)
    ax.set_title("Latency breakdown: drafting vs verification (cf. FailFast Fig. 6)", fontsize=10)
    # below the axes, so it never covers a bar or its total
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=3, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# -- acceptance over the rounds of a prompt -----------------------------------------------------


def plot_acceptance_over_rounds(run: Run, path: str | Path, max_prompts: int = 4) -> Path:
    """For the first ``max_prompts`` prompts of ``run``, one panel each: per round, the speculated
    and accepted lengths (bars, left axis) and the acceptance rate a/k (line, right axis; rounds
    without a draft are skipped). Returns ``path``."""
    plt = _pyplot()
    rows = run.rows[:max_prompts] or [{"prompt_id": "-", "rounds": []}]
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 2.4 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows):
        rounds = row.get("rounds", [])
        idx = list(range(len(rounds)))
        ax.bar(idx, [r["speculation_length"] for r in rounds], color="#c6dbef", label="speculated")
        ax.bar(idx, [r["accepted_length"] for r in rounds], color="#2171b5", label="accepted")
        ax.set_ylabel("tokens")
        ax.set_title(f"{run.name} - prompt {row.get('prompt_id')}", fontsize=9)
        ax2 = ax.twinx()
        pts = [(i, r["accepted_length"] / r["speculation_length"]) for i, r in enumerate(rounds)
               if r["speculation_length"] > 0]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], color="#e6550d", marker=".", lw=1,
                     label="acceptance rate")
        ax2.set_ylim(-0.05, 1.05)
        ax2.set_ylabel("acceptance rate")
        if ax is axes[0, 0]:
            handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
            ax.legend(handles=handles, fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


# -- Fig. 12: trajectory pages --------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; } .stats { color: #555; font-size: 0.9em; margin-bottom: 1em; }
.legend span { margin-right: 1.2em; }
.round { font-family: Menlo, Consolas, monospace; font-size: 13px; white-space: pre-wrap; line-height: 1.7;
         border-bottom: 1px solid #eee; padding: 2px 0; }
.meta { color: #888; display: inline-block; min-width: 19em; padding-right: 0.8em; }
.acc { }
.rej { text-decoration: line-through; text-decoration-color: #c0392b; color: #c0392b; }
.tgt { border: 1.5px solid #1e8449; border-radius: 3px; padding: 0 2px; background: #eafaf1; }
.reused { border-bottom: 2px dotted #7d3c98; }
.cut { color: #aaa; }
"""


def _decoder(tokenizer) -> Any:
    if tokenizer is None:
        return lambda t: f"[{t}]"
    cache: dict[int, str] = {}

    def decode(t: int) -> str:
        if t not in cache:
            cache[t] = tokenizer.decode([t], skip_special_tokens=False)
        return cache[t]

    return decode


def _tok(text: str, cls: str) -> str:
    shown = html.escape(text.replace("\n", "⏎"))  # one round per line: newlines shown, not broken
    return f'<span class="{cls}">{shown}</span>'


def trajectory_html(row: dict[str, Any], method: str, tokenizer=None) -> str:
    """The Fig. 12-style page of one prompt (``row`` = a ``results.jsonl`` line) as an HTML string."""
    decode = _decoder(tokenizer)
    rounds = row.get("rounds", [])
    lines = []
    plain: list[tuple[int, int]] = []  # consecutive rounds without a draft: (round index, token)

    def flush_plain() -> None:
        if plain:
            first, last = plain[0][0], plain[-1][0]
            meta = f"#{first}" + (f"-#{last}" if last != first else "") + f" k=0 ({len(plain)} plain decoding steps)"
            tokens = "".join(_tok(decode(t), "tgt") for _, t in plain)
            lines.append(f'<div class="round"><span class="meta">{html.escape(meta)}</span>{tokens}</div>')
            plain.clear()

    for i, r in enumerate(rounds):
        k, a, e = r["speculation_length"], r["accepted_length"], r["emitted_tokens"]
        if k == 0 and r.get("target_token_ids") and e > 0:
            plain.append((i, r["target_token_ids"][0]))
            continue
        flush_plain()
        draft, target = r.get("draft_token_ids", []), r.get("target_token_ids", [])
        reused_from = k - r.get("reused_tokens", 0)
        parts = []
        for j, t in enumerate(draft):
            cls = "acc" if j < a else "rej"
            if j < a and j >= e:
                cls = "cut"  # accepted but past EOS / max_new_tokens
            if j >= reused_from:
                cls += " reused"
            parts.append(_tok(decode(t), cls))
        if a < len(target) and e > a:
            parts.append(_tok(decode(target[a]), "tgt"))
        meta = (f"#{i:<3d} k={k:<3d} a={a:<3d} passes={r.get('drafter_forward_passes', 0):<3d}"
                + (f" reused={r['reused_tokens']}" if r.get("reused_tokens") else ""))
        lines.append(f'<div class="round"><span class="meta">{html.escape(meta)}</span>{"".join(parts)}</div>')
    flush_plain()
    drafted = [r for r in rounds if r["speculation_length"] > 0]
    spec = sum(r["speculation_length"] for r in drafted)
    acc = sum(r["accepted_length"] for r in drafted)
    lossless = row.get("lossless")
    stats = (f"{row.get('generated_tokens', 0)} tokens in {len(rounds)} rounds; acceptance rate "
             f"{acc / spec if spec else 0.0:.3f}; mean accepted {acc / len(drafted) if drafted else 0.0:.2f} of "
             f"{spec / len(drafted) if drafted else 0.0:.2f} speculated; stop: {row.get('stop_reason', '-')}; "
             f"lossless: {'-' if lossless is None else lossless}")
    title = f"{method} - prompt {row.get('prompt_id', '')}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<div class='stats'>{html.escape(stats)}</div><div class='legend stats'>"
            f"<span>accepted draft token: {_tok('plain', 'acc')}</span>"
            f"<span>rejected draft token: {_tok('struck', 'rej')}</span>"
            f"<span>target's token (correction / bonus): {_tok('boxed', 'tgt')}</span>"
            f"<span>reused draft token: {_tok('dotted', 'acc reused')}</span></div>"
            + "\n".join(lines) + "</body></html>")


def tokenizer_for(runs: Sequence[Run], name: str | None = None):
    """The tokenizer named ``name``, else the first run's target (``config.verifier.model``); None if none loads."""
    from specpolicy.models import load_tokenizer

    candidates = [name] if name else [((r.summary.get("config") or {}).get("verifier") or {}).get("model")
                                      for r in runs]
    for cand in candidates:
        if not cand:
            continue
        try:
            return load_tokenizer(str(cand))
        except Exception:  # noqa: BLE001 - fall back to token ids
            continue
    return None


def plot_runs(runs: Sequence[Run], out: str | Path, tokenizer=None, max_prompts: int = 4,
              max_pages: int | None = None) -> list[Path]:
    """Write every figure and page for ``runs`` into ``out``; returns the written files
    (``index.html`` last). ``max_pages`` limits the trajectory pages per method (None: all)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [plot_length_cdf(runs, out / "length_cdf.png"), plot_latency_breakdown(runs, out / "latency_breakdown.png")]
    pages: dict[str, list[Path]] = {}
    for run in runs:
        files.append(plot_acceptance_over_rounds(run, out / f"acceptance_{_slug(run.name)}.png", max_prompts))
        folder = out / "trajectories" / _slug(run.name)
        folder.mkdir(parents=True, exist_ok=True)
        for row in run.rows[:max_pages]:
            page = folder / f"{_slug(str(row.get('prompt_id', 'prompt')))}.html"
            page.write_text(trajectory_html(row, run.name, tokenizer), encoding="utf-8")
            pages.setdefault(run.name, []).append(page)
            files.append(page)
    index = out / "index.html"
    items = "".join(f'<h2>{html.escape(p.stem)}</h2><img src="{p.name}" style="max-width:100%">'
                    for p in files if p.suffix == ".png")
    links = "".join(f"<h3>{html.escape(m)}</h3>" + " ".join(
        f'<a href="{p.relative_to(out).as_posix()}">{html.escape(p.stem)}</a>' for p in ps) for m, ps in pages.items())
    index.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>specpolicy plots</title></head>"
                     f"<body><h1>specpolicy plots</h1>{items}<h2>trajectories</h2>{links}</body></html>",
                     encoding="utf-8")
    files.append(index)
    return files


def main(argv: list[str] | None = None) -> int:
    """``python -m specpolicy.plot DIR [--out OUT] [--tokenizer MODEL] [--max-prompts N] [--max-pages N]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specpolicy.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a run directory, a multirun directory or a peers --runs-dir")
    parser.add_argument("--out", help="output directory (default: DIRECTORY/plots)")
    parser.add_argument("--tokenizer", help="tokenizer for the trajectory pages (default: the run's target)")
    parser.add_argument("--max-prompts", type=int, default=4, help="prompts in the acceptance-over-rounds figures")
    parser.add_argument("--max-pages", type=int, default=None, help="trajectory pages per method (default: all)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.directory)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files = plot_runs(runs, args.out or Path(args.directory) / "plots", tokenizer_for(runs, args.tokenizer),
                      args.max_prompts, args.max_pages)
    print(f"wrote {len(files)} files for {len(runs)} run(s); open {files[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
