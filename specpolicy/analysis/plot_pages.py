"""The HTML pages of ``python -m specpolicy.analysis.plot``: one trajectory page per prompt in the
style of FailFast's Fig. 12 (``trajectory_html``: a round per line, accepted draft tokens plain,
rejected ones struck through, the target's token boxed, reused tokens underlined) and the
``index.html`` that links every figure and page (``index_html``: each run's header, its figures,
the serving table). Figure drawing: ``specpolicy.analysis.plot``."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, timing_trusted, untrusted_reasons
from specpolicy.analysis.metrics import prompt_values
from specpolicy.analysis.results import PromptResult, Run
from specpolicy.analysis.tables import FIGURES
from specpolicy.core.types import RoundRecord


def _slug(text: str, limit: int = 80) -> str:
    """``text`` as a file name: other characters than ``[A-Za-z0-9_.+-]`` made ``_``; past ``limit``
    characters cut, with 8 hex digits of ``text``'s hash (distinct names stay distinct files)."""
    slug = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_") or "run"
    if len(slug) <= limit:
        return slug
    import hashlib

    return f"{slug[: limit - 9]}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


def drafts(run: Run) -> bool:
    """Whether any round of ``run`` had a draft (k > 0); a method that never drafts (vanilla
    decoding, plain ``generate``) has no acceptance or length figure."""
    return any(r.speculation_length > 0 for r in run.rounds)


# -- Fig. 12: trajectory pages --------------------------------------------------------------------

_CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328;
       background: #fff; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 60px; }
h1 { font-size: 1.45em; margin: 0 0 2px; }
h2 { font-size: 1.2em; margin: 34px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #d8dee4; }
h3 { font-size: 1.03em; margin: 22px 0 6px; }
p { margin: 6px 0; }
.muted { color: #59636e; font-size: 0.9em; }
nav { font-size: 0.9em; margin-bottom: 10px; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.88em; background: #f6f8fa;
       padding: 1px 4px; border-radius: 4px; }
table { border-collapse: collapse; font-size: 0.88em; margin: 6px 0 14px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e4e7eb; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; vertical-align: bottom; }
th.num { text-align: right; max-width: 10.5em; }
h3 .muted { font-weight: normal; margin-left: 0.6em; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
tr:hover td { background: #fafbfc; }
.partial { color: #9a6700; font-weight: 600; }
.nowrap { white-space: nowrap; }
.bad { color: #cf222e; font-weight: 600; }
figure { margin: 14px 0 26px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e4e7eb; border-radius: 4px; }
figcaption { color: #59636e; font-size: 0.88em; margin-top: 4px; max-width: 900px; }
.prompt { white-space: pre-wrap; background: #f6f8fa; border: 1px solid #e4e7eb; border-radius: 6px;
          padding: 10px 14px; margin: 6px 0 14px; font-family: ui-monospace, Menlo, Consolas, monospace;
          font-size: 13px; max-height: 18em; overflow: auto; }
.legend { color: #59636e; font-size: 0.88em; margin: 8px 0 12px; }
.legend span { margin-right: 1.4em; }
.round { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 13px; white-space: pre-wrap;
         line-height: 1.7; border-bottom: 1px solid #eef0f2; padding: 2px 0; }
.meta { color: #6e7781; display: inline-block; min-width: 19em; padding-right: 0.8em; }
.acc { }
.rej { text-decoration: line-through; text-decoration-color: #c0392b; color: #c0392b; }
.tgt { border: 1.5px solid #1e8449; border-radius: 3px; padding: 0 2px; background: #eafaf1; }
.reused { border-bottom: 2px dotted #7d3c98; }
.cut { color: #aaa; }
"""


def _page(title: str, body: str) -> str:
    """A complete HTML page: ``title`` (escaped) and ``body`` (HTML), the stylesheet inline --
    no external resource."""
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>"
    )


def _html_table(header: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table: ``header`` = (title, numeric) per column; ``rows`` of cells that are
    already HTML (escape text first). Numeric columns are right-aligned."""
    head = "".join(
        f'<th class="num">{html.escape(t)}</th>' if num else f"<th>{html.escape(t)}</th>" for t, num in header
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, (_, num) in zip(row, header))
        + "</tr>"
        for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


#: Per-prompt figures beside each trajectory link and on its page: (title, key of
#: ``metrics.prompt_values``, format, applies only when the prompt drafted).
PROMPT_COLUMNS = tuple(
    (FIGURES[k].short, k, FIGURES[k].fmt, FIGURES[k].drafting)
    for k in (
        "generated_tokens",
        "rounds",
        "acceptance_rate",
        "mean_accepted_length",
        "mean_speculation_length",
        "tokens_per_s",
        "speedup_vs_vanilla",
    )
)


def prompt_cells(result: PromptResult) -> list[str]:
    """One prompt's figures as text cells (``PROMPT_COLUMNS``, then why generation ended and
    lossless): ``metrics.prompt_values`` of its result -- the function the summary's
    ``per_prompt`` comes from -- with ``-`` where a figure does not apply."""
    values = prompt_values(result.speculative, result.vanilla)
    drafted = any(r.speculation_length > 0 for r in result.speculative.rounds)
    cells = [
        "-" if values.get(key) is None or (only_drafting and not drafted) else fmt.format(values[key])
        for _, key, fmt, only_drafting in PROMPT_COLUMNS
    ]
    lossless = result.lossless
    cells += [
        result.speculative.finish_reason or "-",
        "-" if lossless is None else ("yes" if lossless is True else ("NO" if lossless is False else str(lossless))),
    ]
    return cells


_PROMPT_HEADER = [(t, True) for t, _, _, _ in PROMPT_COLUMNS] + [("finished by", False), ("lossless", False)]


def prompt_texts(run: Run) -> dict[str, str]:
    """``prompt id -> prompt text`` for ``run``: the results' ``prompt_text``, else read from the
    run's configured dataset (``config.dataset`` of its summary); prompts found in neither are
    missing from the result."""
    texts = {res.prompt_id: res.prompt_text for res in run.results if res.prompt_text}
    if len(texts) == len(run.results):
        return texts
    dataset = (run.summary.get("config") or {}).get("dataset") or {}
    if dataset.get("name"):
        try:
            from specpolicy.data.datasets import load_prompts

            known = {p.prompt_id: p.text for p in load_prompts(str(dataset["name"]), dataset.get("path"), None, 0)}
        except Exception:  # noqa: BLE001 - the page then says the text is not available
            known = {}
        for res in run.results:
            texts.setdefault(res.prompt_id, known.get(res.prompt_id, ""))
    return {k: v for k, v in texts.items() if v}


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


def trajectory_html(
    result: PromptResult, method: str, tokenizer=None, prompt_text: str | None = None, index_href: str | None = None
) -> str:
    """The Fig. 12-style page of one prompt as an HTML string: the prompt (``prompt_text``, else
    the result's ``prompt_text``), the prompt's figures (``prompt_cells``), a legend, then one
    line per round of the speculative method. ``index_href``: a link back to the figures page."""
    decode = _decoder(tokenizer)
    rounds: Sequence[RoundRecord] = result.speculative.rounds
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
        k, a, e = r.speculation_length, r.accepted_length, r.emitted_tokens
        if k == 0 and r.target_token_ids and e > 0:
            plain.append((i, r.target_token_ids[0]))
            continue
        flush_plain()
        draft, target = r.draft_token_ids, r.target_token_ids
        reused_from = k - r.reused_tokens
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
        meta = f"#{i:<3d} k={k:<3d} a={a:<3d} passes={r.drafter_forward_passes:<3d}" + (
            f" reused={r.reused_tokens}" if r.reused_tokens else ""
        )
        lines.append(f'<div class="round"><span class="meta">{html.escape(meta)}</span>{"".join(parts)}</div>')
    flush_plain()
    title = f"{method} - prompt {result.prompt_id}"
    text = prompt_text if prompt_text is not None else result.prompt_text
    nav = f'<nav><a href="{html.escape(index_href)}">&larr; all figures</a></nav>' if index_href else ""
    prompt = (
        f"<div class='prompt'>{html.escape(text)}</div>"
        if text
        else "<p class='muted'>The prompt text is not recorded in this run's results.jsonl and its dataset "
        "could not be read.</p>"
    )
    return _page(
        title,
        f"{nav}<h1>{html.escape(method)}</h1><p class='muted'>prompt "
        f"<code>{html.escape(result.prompt_id)}</code>"
        + (f", {result.prompt_tokens} prompt tokens" if result.prompt_tokens else "")
        + f"</p><h2>Prompt</h2>{prompt}"
        f"<h2>Figures</h2>{_html_table(_PROMPT_HEADER, [[html.escape(c) for c in prompt_cells(result)]])}"
        + (f"<h2>Output</h2><div class='prompt'>{html.escape(result.output_text)}</div>" if result.output_text else "")
        + f"<h2>Rounds</h2><div class='legend'>"
        f"<span>accepted draft token: {_tok('plain', 'acc')}</span>"
        f"<span>rejected draft token: {_tok('struck', 'rej')}</span>"
        f"<span>target's token (correction / bonus): {_tok('boxed', 'tgt')}</span>"
        f"<span>reused draft token: {_tok('dotted', 'acc reused')}</span>"
        f"<span>past the stop: {_tok('grey', 'cut')}</span></div>" + "\n".join(lines),
    )


def tokenizer_for(runs: Sequence[Run], name: str | None = None):
    """The tokenizer named ``name``, else the first run's target (``config.verifier.model``); None if none loads."""
    from specpolicy.models.loading import load_tokenizer

    candidates = (
        [name] if name else [((r.summary.get("config") or {}).get("verifier") or {}).get("model") for r in runs]
    )
    for cand in candidates:
        if not cand:
            continue
        try:
            return load_tokenizer(str(cand))
        except Exception:  # noqa: BLE001 - fall back to token ids
            continue
    return None


#: Titles and captions of the figures on the index page (file name -> (title, caption)).
FIGURE_TEXT = {
    "length_cdf.png": (
        "Accepted and speculated lengths per round",
        "Empirical CDF over the rounds with a draft (k > 0), one line per method that drafts (cf. FailFast Fig. 8).",
    ),
    "latency_breakdown.png": (
        "Where the time goes",
        "Milliseconds per generated token spent verifying, drafting and elsewhere (prefill, "
        "the loop), measured; vanilla decoding pooled over the runs that measured it "
        "(cf. FailFast Fig. 6).",
    ),
    "serving.png": (
        "Throughput and p99 latency against batch size",
        "Runs of a generation.batch_size sweep: generated tokens/s over all requests and p99 latency "
        "(arrival to last token), measured, one line per method; vanilla decoding (black) from the "
        "runs that measured it at each batch size (tokens/s pooled, p99 their mean). Hollow markers: "
        "batch size 1 by the batch-1 loop, its requests replayed one after another from their measured "
        "times. The numbers: the serving table above (python -m specpolicy.analysis.report).",
    ),
}


def _excerpt(text: str, limit: int = 60) -> str:
    """The start of ``text`` on one line, at most ``limit`` characters (an ellipsis when cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _figure(summary: dict[str, Any], method: str, key: str) -> Any:
    """A headline figure of a summary: top level, else under ``methods[method]`` (peers runs)."""
    if summary.get(key) is not None:
        return summary[key]
    return ((summary.get("methods") or {}).get(method) or {}).get(key)


def run_header(run: Run, root: Path, common: Sequence[str] = ()) -> list[str]:
    """The cells (HTML) of ``run``'s line in the index's summary table: run directory, method,
    overrides, prompts ("1 of 4" for a partial run; the run marked under its name, as is a job
    without a summary), measured and MODELED speedup, acceptance rate, accepted
    length per drafted round, speculation length per round, lossless. ``common``: overrides
    shared by every run (shown once above the table, not per run)."""
    from specpolicy.analysis.report_serving import is_partial
    from specpolicy.analysis.results import job_overrides
    from specpolicy.analysis.tables import lossless_text

    summary, method = run.summary, str(run.summary.get("method") or run.name)
    drafted = drafts(run)

    def num(key: str, fmt: str, only_drafting: bool = False) -> str:
        value = _figure(summary, method, key)
        return "-" if value is None or (only_drafting and not drafted) else fmt.format(value)

    prompts = html.escape(str(summary.get("prompts", len(run.results))))
    name = html.escape(method)  # the run's own method: the overrides have their column
    if not summary:
        name += "<br><span class='partial'>no summary.json: the job died or is still running</span>"
    elif is_partial(summary):
        prompts = f"<span class='partial'>{prompts} of {html.escape(str(summary.get('prompts_total', '?')))}</span>"
        why = f", {summary['interrupted_by']}" if summary.get("interrupted_by") else ""
        name += f"<br><span class='partial'>partial run{html.escape(why)}</span>"
    lossless = html.escape(lossless_text(summary)) if summary else "-"
    counts = summary.get("lossless_counts")  # partings at near-ties (numerically equivalent) are not bad
    fraction = summary.get("lossless_fraction")
    if fraction is not None and (counts["not_lossless"] > 0 if counts else fraction < 1):
        lossless = f"<span class='bad'>{lossless}</span>"
    overrides = " ".join(
        f"<code class='nowrap'>{html.escape(o)}</code>" for o in job_overrides(run.directory) if o not in common
    )
    where = run.directory.relative_to(root).as_posix() if run.directory != root else run.directory.resolve().name
    speedup = num("speedup_vs_vanilla", "{:.2f}x")
    if speedup != "-" and timing_trusted(summary) is False:
        why = html.escape("timing cannot be trusted: " + "; ".join(untrusted_reasons(summary)), quote=True)
        speedup = f"<span class='partial' title=\"{why}\">{speedup}{UNTRUSTED_MARK}</span>"
    return [
        html.escape(where),
        name,
        overrides or "-",
        prompts,
        speedup,
        num("modeled_speedup_vs_vanilla", "{:.2f}x"),
        num("acceptance_rate", "{:.3f}", True),
        num("mean_accepted_length", "{:.2f}", True),
        num("mean_speculation_length", "{:.2f}", True),
        lossless,
    ]


_RUN_HEADER = [("run", False), ("method", False), ("overrides", False), ("prompts", True)] + [
    (FIGURES[k].short, True)
    for k in (
        "speedup_vs_vanilla",
        "modeled_speedup_vs_vanilla",
        "acceptance_rate",
        "mean_accepted_length",
        "mean_speculation_length",
        "lossless",
    )
]


def _per_run_figures(
    paths: list[Path], prefix: str, runs: list[Run], common: Sequence[str], heading: str, intro: str, alt: str
) -> list[str]:
    """HTML of one figure per run (files ``<prefix><run slug>.png``) under ``heading``; nothing when no file."""
    if not paths:
        return []
    out = [f"<h2>{html.escape(heading)}</h2><p class='muted'>{intro}</p>"]
    by_slug = {f"{prefix}{_slug(run.name)}.png": run for run in runs}
    for p in paths:
        run = by_slug.get(p.name)
        name = run.name if run else p.stem
        note = _run_note(run, common) if run else ""
        out.append(
            f'<figure><h3>{html.escape(name)}{note}</h3><img src="{html.escape(p.name)}" '
            f'alt="{alt}: {html.escape(name)}"></figure>'
        )
    return out


def _run_note(run: Run, common: Sequence[str]) -> str:
    """HTML after a run's name in headings: its overrides that differ, and whether it is partial
    or has no summary."""
    from specpolicy.analysis.report_serving import is_partial
    from specpolicy.analysis.results import job_overrides

    notes = [o for o in job_overrides(run.directory) if o not in common and o not in run.name]  # not twice
    if timing_trusted(run.summary) is False:
        notes.append(f"timing cannot be trusted {UNTRUSTED_MARK}")
    if not run.summary:
        notes.append("no summary.json")
    elif is_partial(run.summary):
        notes.append(
            f"partial: {run.summary.get('prompts', len(run.results))} of "
            f"{run.summary.get('prompts_total', '?')} prompts"
        )
    return f"<span class='muted'>{html.escape(' · '.join(notes))}</span>" if notes else ""


def serving_html(rows: Sequence[dict[str, Any]]) -> str:
    """The serving table of the figures page (HTML): ``specpolicy.analysis.report_serving.SERVING_COLUMNS`` of
    ``rows`` (``serving_rows``), cells as the report prints them (``serving_cell``), with the note
    on the batch-1 loop and on tokens/s marked ``UNTRUSTED_MARK``; empty without rows."""
    from specpolicy.analysis.report_serving import (
        _SERVING_TEXT_KEYS,
        BATCH1_LOOP,
        SERVING_COLUMNS,
        SERVING_DETAIL,
        SERVING_HEADING,
        SERVING_NOTE,
        serving_cell,
    )

    if not rows:
        return ""
    header = [(title, key not in _SERVING_TEXT_KEYS) for title, key, _, _ in SERVING_COLUMNS]
    cells = [
        [
            f"<span class='nowrap'>{html.escape(serving_cell(r, key, fmt))}</span>"
            if key == "series"
            else html.escape(serving_cell(r, key, fmt))
            for _, key, fmt, _ in SERVING_COLUMNS
        ]
        for r in rows
    ]
    out = f"<h2>{html.escape(SERVING_HEADING)}</h2><p class='muted'>{html.escape(SERVING_DETAIL)}.</p>" + _html_table(
        header, cells
    )
    if any(r["loop"] == BATCH1_LOOP for r in rows):
        out += f"<p class='muted'>{html.escape(SERVING_NOTE)}</p>"
    marked = [r for r in rows if r.get("timing_trusted") is False]
    if marked:
        out += (
            f"<p class='partial'>{UNTRUSTED_MARK} {html.escape(UNTRUSTED_NOTE)}; measured tokens/s of:</p><ul>"
            + "".join(
                f"<li><code>{html.escape(r['run'])}</code>: "
                f"{html.escape('; '.join(r.get('timing_warnings') or []))}</li>"
                for r in marked
            )
            + "</ul>"
        )
    return out


def index_html(
    runs: Sequence[Run],
    root: Path,
    figures: Sequence[Path],
    pages: dict[str, list[tuple[PromptResult, Path]]],
    out: Path,
    serving: Sequence[dict[str, Any]] = (),
) -> str:
    """The figures page: a summary of every run, the serving table when runs are batched
    (``serving``: ``specpolicy.analysis.report_serving.serving_rows``), the figures with titles and captions, and
    per method a table of its prompts (figures beside each trajectory link)."""
    body = [
        f"<h1>specpolicy figures</h1><p class='muted'>{len(runs)} run{'s' if len(runs) != 1 else ''} in "
        f"<code>{html.escape(str(root))}</code>. Speedups are measured against vanilla decoding in the "
        f"same run; MODELED ones come from pass counts and a latency profile.</p>",
        "<h2>Runs</h2>",
    ]
    from specpolicy.analysis.results import job_overrides

    overrides = [job_overrides(run.directory) for run in runs]
    common = [o for o in overrides[0] if all(o in other for other in overrides[1:])] if len(runs) > 1 else []
    if common:
        body.append(f"<p>Common to every run: <code>{html.escape(' '.join(common))}</code></p>")
    body.append(_html_table(_RUN_HEADER, [run_header(run, root, common) for run in runs]))
    marked = [run for run in runs if timing_trusted(run.summary) is False]
    if marked:
        body.append(
            f"<p class='partial'>{UNTRUSTED_MARK} {html.escape(UNTRUSTED_NOTE)}; measured figures of:</p><ul>"
            + "".join(
                f"<li><code>{html.escape(run.name)}</code>: "
                f"{html.escape('; '.join(untrusted_reasons(run.summary)))}</li>"
                for run in marked
            )
            + "</ul>"
        )
    body.append(serving_html(serving))
    commons = [p for p in figures if p.name in FIGURE_TEXT]
    acceptance = [p for p in figures if p.name.startswith("acceptance_")]
    body.append("<h2>Figures</h2>")
    for p in commons:
        title, caption = FIGURE_TEXT[p.name]
        body.append(
            f'<figure><h3>{html.escape(title)}</h3><img src="{html.escape(p.name)}" alt="{html.escape(title)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    body += _per_run_figures(
        acceptance,
        "acceptance_",
        runs,
        common,
        "Acceptance over the rounds of the first prompts",
        "Per round: speculated length k (light bars), accepted length a (dark bars) and the acceptance rate "
        "a / k (line, right axis). Methods that never draft have no such figure.",
        "acceptance over rounds",
    )
    calibration = [p for p in figures if p.name.startswith("calibration_")]
    body += _per_run_figures(
        calibration,
        "calibration_",
        runs,
        common,
        "Acceptance calibration",
        "Left: how well the drafter's confidence and the online calibration of <code>policy=goodput</code> "
        "(binned confidence x position, made from the earlier rounds only) predict P(accepted | earlier tokens "
        "accepted), with the expected calibration error. Right: the curve learned from every round against the "
        "observed acceptance per confidence bin.",
        "acceptance calibration",
    )
    if pages:
        body.append(
            "<h2>Trajectories</h2><p class='muted'>One page per prompt: every round's draft, accepted "
            "tokens plain, rejected ones struck through, the target's token boxed (cf. FailFast Fig. 12).</p>"
        )
        header = [("prompt", False), ("prompt text", False)] + _PROMPT_HEADER
        for run in runs:
            entries = pages.get(run.name, [])
            if not entries:
                continue
            texts = prompt_texts(run)
            rows = [
                [
                    f'<a href="{html.escape(page.relative_to(out).as_posix())}">{html.escape(res.prompt_id)}</a>',
                    f"<span class='muted'>{html.escape(_excerpt(texts.get(res.prompt_id, '')))}</span>",
                ]
                + [html.escape(c) for c in prompt_cells(res)]
                for res, page in entries
            ]
            body.append(f"<h3>{html.escape(run.name)}{_run_note(run, common)}</h3>" + _html_table(header, rows))
    return _page("specpolicy figures", "".join(body))
