"""A run's results on disk: the ``results.jsonl`` row format and the one reader of run directories.

A run directory holds ``results.jsonl`` (one JSON line per finished prompt, written by the
``jsonl`` logger) and ``summary.json`` (``specpolicy.analysis.summary.summarize``). Every program that
reads them -- resume, the sweep report, the figures, the oracle, the W&B logger -- goes through
this module, and rows become objects here, once: a ``PromptResult`` holding the speculative
method's and the vanilla baseline's ``GenerationResult`` (``RoundRecord`` per round).

Row format (``PromptResult.to_row`` / ``PromptResult.from_row``)::

    prompt_id, prompt_tokens, prompt_text, output_ids, output_text, generated_tokens, finish_reason,
    wall_s (s), prefill_ms, rounds: [round dict, ...], config_hash,
    lossless, first_difference,                         # with a vanilla baseline
    vanilla_generated_tokens, vanilla_wall_s, vanilla_prefill_ms, vanilla_finish_reason,
    vanilla_rounds (count), vanilla_draft_ms, vanilla_verify_ms (sums over its rounds),
    vanilla_output_ids                                   # only when they differ from output_ids
                                                         # (an old row, with vanilla_stop_reason,
                                                         # never has them)
    parting                                              # greedy, when they differ: the measured
                                                         # parting (specpolicy.analysis.parting)
    skipped                                              # only for a prompt that was not decoded
                                                         # (longer than the context): the reason;
                                                         # empty output, no rounds

Vanilla decoding is kept compactly: its rounds are plain one-token rounds, so the row holds
their count and summed times, and they come back as rounds carrying the mean times (sums,
counts and least-squares fits over them are unchanged). Rows written before the
``stop_reason`` -> ``finish_reason`` rename are read too.

Corrupt lines: ``read_results`` keeps every valid row. A line that is not a complete row
(bad JSON, a half-written last line of a killed process, a row missing fields) is skipped
with one warning line; with ``repair=True`` (a resume, before appending) it is moved verbatim
into ``results.jsonl.corrupt`` with its line number, and ``results.jsonl`` is rewritten with the
valid lines only (byte for byte).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specpolicy.core.types import GenerationResult, RoundRecord

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
#: Suffix of the side file that keeps quarantined lines (``results.jsonl.corrupt``).
CORRUPT_SUFFIX = ".corrupt"
#: Directories under a run or sweep directory that never hold runs (W&B's files, Hydra's and
#: submitit's bookkeeping, the figures).
SKIP_DIRS = frozenset({"wandb", ".hydra", ".submitit", "plots"})
#: The ``lossless`` value of rows and summaries at temperature > 0 (token identity is not expected).
SAMPLING_LOSSLESS = "n/a (sampling)"

#: Keys every round dict must hold (``round_to_dict``).
_ROUND_KEYS = (
    "speculation_length",
    "accepted_length",
    "emitted_tokens",
    "drafter_forward_passes",
    "reused_tokens",
    "draft_ms",
    "verify_ms",
)


def first_difference(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first position where the two token sequences differ (a length mismatch
    counts at the shorter length), or None when identical."""
    for i, (x, y) in enumerate(zip(reference, candidate)):
        if x != y:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def round_to_dict(record: RoundRecord) -> dict[str, Any]:
    """A ``results.jsonl`` round dict (ms rounded to µs, confidences to 4 digits; ``index`` is the
    position in the list)."""
    return {
        "speculation_length": record.speculation_length,
        "accepted_length": record.accepted_length,
        "emitted_tokens": record.emitted_tokens,
        "drafter_forward_passes": record.drafter_forward_passes,
        "reused_tokens": record.reused_tokens,
        "draft_ms": round(record.draft_ms, 3),
        "verify_ms": round(record.verify_ms, 3),
        **({} if record.host_ms is None else {"host_ms": round(record.host_ms, 4)}),
        "confidences": [round(c, 4) for c in record.confidences],
        "draft_token_ids": list(record.draft_token_ids),
        "target_token_ids": list(record.target_token_ids),
        "draft_stop_reason": record.draft_stop_reason,
        "finish_reason": record.finish_reason,
        **(
            {"draft_parents": list(record.draft_parents), "accepted_path": list(record.accepted_path)}
            if record.is_tree
            else {}
        ),
    }


def round_from_dict(data: Mapping[str, Any], index: int) -> RoundRecord:
    """The ``RoundRecord`` of a round dict (``round_to_dict``; the reasons default to ``""``).

    Raises:
        KeyError / TypeError / ValueError: for a dict that is not a round.
    """
    return RoundRecord(
        index=index,
        speculation_length=int(data["speculation_length"]),
        accepted_length=int(data["accepted_length"]),
        emitted_tokens=int(data["emitted_tokens"]),
        drafter_forward_passes=int(data["drafter_forward_passes"]),
        reused_tokens=int(data["reused_tokens"]),
        draft_ms=float(data["draft_ms"]),
        verify_ms=float(data["verify_ms"]),
        confidences=tuple(float(c) for c in data.get("confidences") or ()),
        draft_token_ids=tuple(int(t) for t in data.get("draft_token_ids") or ()),
        target_token_ids=tuple(int(t) for t in data.get("target_token_ids") or ()),
        draft_stop_reason=str(data.get("draft_stop_reason") or ""),
        finish_reason=str(data.get("finish_reason") or ""),
        draft_parents=tuple(int(p) for p in data.get("draft_parents") or ()),
        accepted_path=tuple(int(p) for p in data.get("accepted_path") or ()),
        host_ms=None if data.get("host_ms") is None else float(data["host_ms"]),
    )


def _ids(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor([int(t) for t in values], dtype=torch.long)


def _plain_rounds(
    output_ids: Sequence[int], draft_ms: float, verify_ms: float, count: int, finish_reason: str
) -> tuple[RoundRecord, ...]:
    """``count`` plain one-token rounds carrying the mean times (the compact vanilla baseline)."""
    mean_draft = draft_ms / count if count else 0.0
    mean_verify = verify_ms / count if count else 0.0
    rounds = []
    for i in range(count):
        token = (int(output_ids[i]),) if i < len(output_ids) else ()
        rounds.append(
            RoundRecord(
                index=i,
                speculation_length=0,
                accepted_length=0,
                emitted_tokens=1,
                drafter_forward_passes=0,
                reused_tokens=0,
                draft_ms=mean_draft,
                verify_ms=mean_verify,
                target_token_ids=token,
                draft_stop_reason="vanilla",
                finish_reason=finish_reason if i == count - 1 else "",
            )
        )
    return tuple(rounds)


@dataclass(frozen=True)
class PromptResult:
    """One prompt of a run: the speculative method's output and rounds, and the vanilla baseline's.

    Attributes:
        prompt_id: stable id of the prompt (``<dataset>/<index>``).
        prompt_tokens: prompt length in tokens (chat template applied).
        speculative: the method's ``GenerationResult``.
        vanilla: vanilla decoding of the same prompt in the same run, or None (no baseline).
            Read back from a row, its rounds carry the mean per-round times (see the module doc).
        output_text: the decoded output (special tokens skipped).
        lossless: True / False (output equal to vanilla greedy decoding's), ``"n/a (sampling)"``
            at temperature > 0, None without a baseline.
        first_difference: first output position that differs from vanilla's (greedy), else None.
        config_hash: fingerprint of the settings that produced it (``specpolicy.run.resume``).
        prompt_text: the prompt's user message (shown on the trajectory pages), None when unknown.
        skipped: why the prompt was not decoded (a prompt longer than the context,
            ``specpolicy.run.skips``), else None; a skipped result has an empty output and no rounds,
            is read back by a resume like any finished prompt, and counts in no figure.
        parting: greedy, not identical: the measured parting at ``first_difference``
            (``specpolicy.analysis.parting.Parting.to_dict``: position, margins, class), None when
            identical or not measured (then the prompt is NOT lossless).
    """

    prompt_id: str
    prompt_tokens: int
    speculative: GenerationResult
    vanilla: GenerationResult | None = None
    output_text: str = ""
    lossless: bool | str | None = None
    first_difference: int | None = None
    config_hash: str = ""
    prompt_text: str | None = None
    skipped: str | None = None
    parting: dict[str, Any] | None = None

    @property
    def lossless_class(self) -> str | None:
        """Greedy with a baseline: ``"identical"``, ``"numerically equivalent"`` (the parting is a
        near-tie within the dtype's rounding, ``specpolicy.analysis.parting``) or ``"NOT lossless"``;
        None when sampling or without a baseline."""
        if self.lossless is True:
            return "identical"
        if self.lossless is False:
            equivalent = self.parting is not None and self.parting.get("lossless") == "numerically equivalent"
            return "numerically equivalent" if equivalent else "NOT lossless"
        return None

    @staticmethod
    def skip(
        prompt_id: str, prompt_tokens: int, reason: str, config_hash: str = "", prompt_text: str | None = None
    ) -> PromptResult:
        """The result of a prompt that was not decoded, with the ``reason`` (empty output, no rounds,
        ``finish_reason`` ``"skipped"``)."""
        nothing = GenerationResult(output_ids=_ids([]), rounds=(), finish_reason="skipped", wall_s=0.0, prefill_ms=0.0)
        return PromptResult(
            prompt_id, int(prompt_tokens), nothing, config_hash=config_hash, prompt_text=prompt_text, skipped=reason
        )

    @staticmethod
    def of(
        prompt_id: str,
        prompt_tokens: int,
        speculative: GenerationResult,
        vanilla: GenerationResult | None,
        output_text: str = "",
        sampled: bool = False,
        config_hash: str = "",
        prompt_text: str | None = None,
    ) -> PromptResult:
        """A prompt's result with ``lossless`` / ``first_difference`` computed against ``vanilla``.
        With ``sampled`` (temperature > 0) ``lossless`` is ``"n/a (sampling)"``: two samples differ
        legitimately; losslessness in distribution is what ``tests/core/test_sampling.py`` checks."""
        lossless, diff = None, None
        if vanilla is not None:
            if sampled:
                lossless = SAMPLING_LOSSLESS
            else:
                diff = first_difference(vanilla.output_ids.tolist(), speculative.output_ids.tolist())
                lossless = diff is None
        return PromptResult(
            prompt_id, int(prompt_tokens), speculative, vanilla, output_text, lossless, diff, config_hash, prompt_text
        )

    @property
    def generated_tokens(self) -> int:
        """Tokens the speculative method generated."""
        return self.speculative.generated_tokens

    def to_row(self) -> dict[str, Any]:
        """The ``results.jsonl`` line of this prompt (see the module docstring)."""
        spec = self.speculative
        out_ids = spec.output_ids.tolist()
        row: dict[str, Any] = {
            "prompt_id": self.prompt_id,
            "prompt_tokens": self.prompt_tokens,
            **({"prompt_text": self.prompt_text} if self.prompt_text is not None else {}),
            "output_ids": out_ids,
            "output_text": self.output_text,
            "generated_tokens": len(out_ids),
            "finish_reason": spec.finish_reason,
            "wall_s": spec.wall_s,
            "prefill_ms": spec.prefill_ms,
            "rounds": [round_to_dict(r) for r in spec.rounds],
        }
        van = self.vanilla
        if van is not None:
            row.update(
                lossless=self.lossless,
                first_difference=self.first_difference,
                vanilla_generated_tokens=van.generated_tokens,
                vanilla_wall_s=van.wall_s,
                vanilla_prefill_ms=van.prefill_ms,
                vanilla_finish_reason=van.finish_reason,
                vanilla_rounds=len(van.rounds),
                vanilla_draft_ms=sum(r.draft_ms for r in van.rounds),
                vanilla_verify_ms=sum(r.verify_ms for r in van.rounds),
            )
            van_ids = van.output_ids.tolist()
            if van_ids != out_ids:
                row["vanilla_output_ids"] = van_ids
            if self.parting is not None:
                row["parting"] = self.parting
        if self.config_hash:
            row["config_hash"] = self.config_hash
        if self.skipped:
            row["skipped"] = self.skipped
        return row

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> PromptResult:
        """The object of a ``results.jsonl`` row (also rows written before the ``finish_reason``
        rename, whose field was ``stop_reason``). The vanilla output of an old row that kept no
        ``vanilla_output_ids`` is the method's output when the row is lossless, else unknown
        (ids -1; counts and times are exact).

        Raises:
            ValueError: naming the first missing or malformed field.
        """
        if not isinstance(row, Mapping):
            raise ValueError(f"a row is a JSON object, got {type(row).__name__}")
        for key in ("prompt_id", "output_ids", "rounds", "wall_s"):
            if key not in row:
                raise ValueError(f"row has no {key!r}")
        try:
            out_ids = [int(t) for t in row["output_ids"]]
            rounds = tuple(round_from_dict(r, i) for i, r in enumerate(row["rounds"]))
            spec = GenerationResult(
                output_ids=_ids(out_ids),
                rounds=rounds,
                finish_reason=str(row.get("finish_reason", row.get("stop_reason")) or ""),
                wall_s=float(row["wall_s"]),
                prefill_ms=float(row.get("prefill_ms", 0.0)),
            )
            vanilla = None
            lossless = row.get("lossless")
            if "vanilla_generated_tokens" in row:
                n = int(row["vanilla_generated_tokens"])
                if "vanilla_output_ids" in row:
                    van_ids = [int(t) for t in row["vanilla_output_ids"]]
                elif lossless is True or "vanilla_finish_reason" in row:  # written only when they differ
                    van_ids = out_ids
                else:
                    van_ids = [-1] * n
                count = int(row.get("vanilla_rounds", n))
                finish = str(row.get("vanilla_finish_reason", row.get("vanilla_stop_reason")) or "")
                vanilla = GenerationResult(
                    output_ids=_ids(van_ids),
                    rounds=_plain_rounds(
                        van_ids,
                        float(row.get("vanilla_draft_ms", 0.0)),
                        float(row.get("vanilla_verify_ms", 0.0)),
                        count,
                        finish,
                    ),
                    finish_reason=finish,
                    wall_s=float(row.get("vanilla_wall_s", 0.0)),
                    prefill_ms=float(row.get("vanilla_prefill_ms", 0.0)),
                )
            diff = row.get("first_difference")
            return PromptResult(
                prompt_id=str(row["prompt_id"]),
                prompt_tokens=int(row.get("prompt_tokens", 0)),
                speculative=spec,
                vanilla=vanilla,
                output_text=str(row.get("output_text") or ""),
                lossless=lossless,
                first_difference=None if diff is None else int(diff),
                config_hash=str(row.get("config_hash") or ""),
                prompt_text=None if row.get("prompt_text") is None else str(row["prompt_text"]),
                skipped=str(row["skipped"]) if row.get("skipped") else None,
                parting=dict(row["parting"]) if isinstance(row.get("parting"), Mapping) else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed row: {exc!r}") from exc


# -- reading results.jsonl -----------------------------------------------------------------------


@dataclass(frozen=True)
class CorruptLine:
    """A line of ``results.jsonl`` that is not a complete row: its 1-based ``number``, why, and
    its bytes verbatim (without the newline)."""

    number: int
    reason: str
    text: bytes


def scan_results(path: str | Path) -> tuple[list[tuple[bytes, PromptResult]], list[CorruptLine]]:
    """Every line of ``path`` (read-only): ``([(line bytes, result) of valid rows], [corrupt lines])``;
    ``([], [])`` when the file does not exist. A last line without its newline (a process killed
    while writing it) is corrupt even when it parses."""
    path = Path(path)
    if not path.exists():
        return [], []
    data = path.read_bytes()
    good: list[tuple[bytes, PromptResult]] = []
    bad: list[CorruptLine] = []
    lines = data.split(b"\n")
    complete = len(lines) - 1  # the piece after the last newline is a line only if not empty
    for number, line in enumerate(lines, start=1):
        if number > complete:
            if line.strip():
                bad.append(CorruptLine(number, "half-written last line (no newline)", line))
            break
        if not line.strip():
            continue
        try:
            good.append((line, PromptResult.from_row(json.loads(line))))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            bad.append(CorruptLine(number, f"not JSON ({exc.__class__.__name__})", line))
        except ValueError as exc:
            bad.append(CorruptLine(number, str(exc), line))
    return good, bad


def _report(path: Path, bad: Sequence[CorruptLine], kept: int, where: str) -> None:
    numbers = ", ".join(str(c.number) for c in bad[:10]) + (", ..." if len(bad) > 10 else "")
    log.warning("%s: %d corrupt line(s) (line %s) %s; %d valid row(s) kept", path, len(bad), numbers, where, kept)


def read_results(path: str | Path, repair: bool = False) -> list[PromptResult]:
    """The valid rows of a ``results.jsonl`` file as ``PromptResult`` objects, in file order
    (``[]`` when it does not exist). Corrupt lines (``scan_results``) are reported in one warning
    line and skipped; every valid row is kept, wherever the corrupt lines are.

    Args:
        path: the file.
        repair: also quarantine the corrupt lines: append them verbatim, each under a header line
            ``# line N: <reason>``, to ``<path>.corrupt`` (written first), then rewrite ``path``
            with the valid lines only (atomically, byte for byte), so appending continues a clean
            file. For the process that owns the run directory (a resume), not for readers.
    """
    path = Path(path)
    good, bad = scan_results(path)
    if bad:
        side = path.with_name(path.name + CORRUPT_SUFFIX)
        if repair:
            with open(side, "ab") as f:
                for c in bad:
                    f.write(f"# line {c.number}: {c.reason}\n".encode() + c.text + b"\n")
                f.flush()
                os.fsync(f.fileno())
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"".join(line + b"\n" for line, _ in good))
            os.replace(tmp, path)
            _report(path, bad, len(good), f"moved to {side}")
        else:
            _report(path, bad, len(good), "skipped")
    return [result for _, result in good]


# -- run directories -----------------------------------------------------------------------------


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """A ``summary.json`` as a dict, or None when it is missing, unreadable or not a JSON object."""
    try:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def find_runs(root: str | Path, marker: str = RESULTS_FILE) -> list[Path]:
    """Run directories under ``root`` (``root`` itself included): those holding a file named
    ``marker`` (``results.jsonl`` or ``summary.json``), outside ``SKIP_DIRS``, in path order with
    numbered parts in numeric order (a multirun's jobs 0, 1, 2, ..., 10, not 0, 1, 10, ...)."""
    root = Path(root)
    return sorted(
        {f.parent for f in root.rglob(marker) if f.is_file() and not SKIP_DIRS & set(f.relative_to(root).parts[:-1])},
        key=lambda d: [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in d.relative_to(root).parts],
    )


@dataclass
class Run:
    """One run directory read back: its ``results`` (``results.jsonl``, valid rows) and its
    ``summary`` (``summary.json``, ``{}`` when missing); ``name`` is the summary's method."""

    name: str
    directory: Path
    results: list[PromptResult]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> list[RoundRecord]:
        """Every round of the speculative method, all prompts in order."""
        return [r for res in self.results for r in res.speculative.rounds]

    @property
    def config(self) -> dict[str, Any]:
        """The run's resolved configuration (``summary.json``'s ``config``; ``{}`` without one)."""
        return self.summary.get("config") or {}

    def setting(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (``"drafter.threshold"``), ``default`` when absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node


def read_run(directory: str | Path) -> Run:
    """``directory``'s results and summary (corrupt lines skipped with a warning, see ``read_results``;
    prompts that were not decoded, ``PromptResult.skipped``, left out: they are in no figure)."""
    directory = Path(directory)
    summary = read_summary(directory / SUMMARY_FILE) or {}
    results = [r for r in read_results(directory / RESULTS_FILE) if not r.skipped]
    return Run(str(summary.get("method") or directory.name), directory, results, summary)


def job_overrides(job_dir: str | Path) -> list[str]:
    """The job's command-line / sweep overrides, from Hydra's ``.hydra/overrides.yaml`` (the full
    overrides, whatever the run directory's name kept of them); empty without that file."""
    file = Path(job_dir) / ".hydra" / "overrides.yaml"
    if not file.exists():
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(file)]


def differing(overrides: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per list of ``overrides``, the overrides that not every list has (what sets the runs apart)."""
    common = set(overrides[0]).intersection(*map(set, overrides[1:])) if overrides else set()
    return [[o for o in job if o not in common] for job in overrides]


def load_runs(root: str | Path) -> list[Run]:
    """Every run under ``root`` holding ``results.jsonl`` (``find_runs``), in path order. Runs of the
    same method are told apart in their names (legends, headings) by the overrides that differ
    between them (``"fastdllm+failfast (policy.tau=0.3)"``, from ``job_overrides``), or by their
    directory where the overrides do not tell them apart.

    Raises:
        FileNotFoundError: when no ``results.jsonl`` is found.
    """
    root = Path(root)
    dirs = find_runs(root)
    if not dirs:
        raise FileNotFoundError(f"no {RESULTS_FILE} under {root}")
    runs = [read_run(d) for d in dirs]
    for run, name in zip(runs, told_apart([r.name for r in runs], runs, root)):
        run.name = name
    return runs


def told_apart(labels: Sequence[str], runs: Sequence[Run], root: str | Path | None = None) -> list[str]:
    """``labels`` (one per run) made distinct: runs that share a label get, in parentheses, the
    overrides that differ between them (``job_overrides``), or their directory (relative to
    ``root``, default: the runs' common parent) where the overrides do not tell them apart."""
    out = list(labels)
    if root is None:
        root = Path(os.path.commonpath([str(r.directory) for r in runs])) if runs else Path(".")
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    for label, members in groups.items():
        if len(members) < 2:
            continue
        extra = [" ".join(d) for d in differing([job_overrides(runs[i].directory) for i in members])]
        if not all(extra) or len(set(extra)) < len(extra):  # the overrides do not tell them apart
            extra = [_relative_or_name(runs[i].directory, Path(root)) for i in members]
        for i, e in zip(members, extra):
            out[i] = f"{label} ({e})"
    return out


def _relative_or_name(directory: Path, root: Path) -> str:
    try:
        return directory.relative_to(root).as_posix() or directory.resolve().name
    except ValueError:
        return directory.as_posix()
