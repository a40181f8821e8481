"""Speedups at real scale (issue 48 item 6): measured pass profiles and a replay of a run's rounds.

``profile``: randomly initialised models at the published shapes (``specpolicy.models.shapes``:
targets Qwen2.5-7B, Qwen3-8B, Llama-3.1-8B, Qwen2.5-32B; drafters Fast-dLLM v2 1.5B, a 5-layer
DFlash, an EAGLE-3 head, DART, Falcon, a 0.5B DEER), built one at a time on the device and freed,
each pass timed by width (new positions, tokens) and KV length (cached positions, tokens) on the
eager runtime and the compiled one (CUDA graphs on CUDA; ``real_scale_models``): the median ms of
``--repeats`` passes after ``--warmup``. Per target it writes ``<prefix>-<target>.json`` (the whole
table, ``"measured": true``, the command, device, torch version and date) and ``<prefix>-<target>.yaml``,
a latency profile (``conf/profile/`` schema, ``specpolicy.core.latency``) taken from the table at
KV 1,024: ``target_ms_per_token`` the 1-wide target pass, ``verify_ms_per_draft_token`` the slope
of the target pass over widths 1-16, each drafter's pass at the width it runs (EAGLE-3 1, Falcon 2,
DART 8, DFlash 16, Fast-dLLM and DEER 32). A model whose estimate (parameters x dtype bytes + the
KV cache) exceeds the device's free memory is skipped with one line, before it is built.

``replay``: the rounds of run directories (``results.jsonl`` + ``summary.json`` for the drafter)
turned into their passes in order (``specpolicy.analysis.pass_replay``), executed on the real-size
target and drafter (or looked up in a profile table with ``--from-profile``, interpolated linearly
in width and KV length), beside vanilla (one 1-wide target pass per token). REPLAYED speedup =
vanilla ms / (target + drafter ms) over the same tokens (model passes only: host work is not in
it), beside the MODELED speedup of ``--modeled-profile`` (``specpolicy.core.latency``) and its error
(modeled / replayed - 1), and the MODELED speedup on the measured table's own latency profile
(``--measured-table``, default the ``--from-profile`` table): the formula's error on the same device,
pass counts x per-pass constants against every pass at its width and KV length. ``--max-rounds`` /
``--deadline-s`` cap a method's rounds; what ran is written (``"partial": true`` when capped).

Usage::

    python benchmarks/real_scale.py profile --out $OUT/profile            # CUDA, bfloat16, every shape
    python benchmarks/real_scale.py replay RUN_DIR... --out $OUT/replay.json
    python benchmarks/real_scale.py profile --tiny --device cpu --out /tmp/rs   # CPU dry run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_scale_models as rsm  # noqa: E402

from specpolicy.analysis.pass_replay import KNOWN_DRAFTERS, Pass, drafter_of, round_passes, vanilla_passes  # noqa: E402
from specpolicy.analysis.results import read_results, read_summary  # noqa: E402
from specpolicy.core.latency import (  # noqa: E402
    BUILTIN_PROFILES,
    LatencyProfile,
    fit_affine,
    load_profile,
    modeled_speedup,
)
from specpolicy.models.memory import available_bytes, fits_line, parameter_count  # noqa: E402
from specpolicy.models.shapes import DRAFTERS, TARGETS, drafter_shapes, target_config  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
KV_LENGTHS = (256, 1024, 4096)
MODES = ("eager", "graphs")
#: The width each drafter's pass runs at (tokens) in the profile's ``drafter_pass_ms_by_drafter``.
DRAFTER_WIDTH = {"fastdllm": 32, "deer": 32, "dflash": 16, "dart": 8, "falcon": 2, "eagle3": 1}
#: The real-scale drafter that stands for a run's ``drafter.name``.
#: ``ar`` and ``easyspec``: the 1.5B shape run causally (the profiles' ``drafter_pass_ms``: the 1.5B
#: drafter's one-token pass, what FailFast's 6.1 ms is on the A6000).
REPLAY_MODEL = {"ar": "fastdllm", "easyspec": "fastdllm", **{d: d for d in DRAFTERS}}
PROFILE_KV = 1024


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (the flag, the value, what is accepted), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"real_scale.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _ints(flag: str, low: int = 1):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes comma-separated integers, got {text!r}") from None
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"{flag} takes integers >= {low}, got {text!r}")
        return values

    return parse


def _names(flag: str, known: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in known]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: unknown {bad or 'empty'}; known: {', '.join(known)}")
        return values

    return parse


def parser() -> OneLineParser:
    p = OneLineParser(prog="real_scale.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in ("profile", "replay"):
        s = sub.add_parser(name)
        s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        s.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None)
        s.add_argument("--tiny", action="store_true", help="2 layers, width 64, vocab 512 (CPU checks)")
        s.add_argument("--deadline-s", type=float, default=0.0, help="stop after this many seconds (0: none)")
        s.add_argument("--memory-gb", type=float, default=None, help="memory to plan with (default: the free memory)")
        s.add_argument("--warmup", type=_ints("--warmup", 0), default=(3,))
        s.add_argument("--repeats", type=_ints("--repeats"), default=(10,))
    prof = sub.choices["profile"]
    prof.add_argument("--targets", type=_names("--targets", tuple(TARGETS)), default=tuple(TARGETS))
    prof.add_argument("--drafters", type=_names("--drafters", DRAFTERS), default=DRAFTERS)
    prof.add_argument("--modes", type=_names("--modes", MODES), default=MODES)
    prof.add_argument("--widths", type=_ints("--widths"), default=WIDTHS)
    prof.add_argument("--kv", type=_ints("--kv"), default=KV_LENGTHS)
    prof.add_argument("--prefix", default=None, help="profile name prefix (default: h200 on an H200, else the device)")
    prof.add_argument("--out", required=True, help="directory for <prefix>-<target>.json / .yaml")
    rep = sub.choices["replay"]
    rep.add_argument("runs", nargs="+", help="run directories (results.jsonl, summary.json)")
    rep.add_argument("--target", type=_names("--target", tuple(TARGETS)), default=("qwen2.5-7b",))
    rep.add_argument("--drafter", type=_names("--drafter", KNOWN_DRAFTERS), default=None)
    rep.add_argument("--block-size", type=_ints("--block-size"), default=None)
    rep.add_argument("--mode", choices=MODES, default="eager")
    rep.add_argument("--from-profile", default=None, help="a profile table (.json) to look passes up in")
    rep.add_argument(
        "--measured-table",
        default=None,
        help="a profile table (.json) whose latency profile also models the rounds (default: --from-profile's)",
    )
    rep.add_argument("--modeled-profile", choices=BUILTIN_PROFILES[:-1], default="a6000-qwen7b")
    rep.add_argument(
        "--prompt-tokens", type=_ints("--prompt-tokens"), default=None, help="replay every prompt at this length"
    )
    rep.add_argument("--max-rounds", type=_ints("--max-rounds"), default=(64,), help="rounds per method")
    rep.add_argument("--out", required=True, help="the replay's JSON file (a .md table beside it)")
    return p


def check(args: argparse.Namespace) -> None:
    """One-line errors for what argparse does not check (before any model is built)."""
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser().error(f"--device={args.device!r}: expected cpu, cuda or cuda:N")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser().error(f"--device={args.device!r}: CUDA is not available here (use --device cpu)")
    if args.deadline_s < 0:
        parser().error(f"--deadline-s={args.deadline_s}: expected seconds >= 0")
    if args.command == "replay":
        for run in args.runs:
            if not (Path(run) / "results.jsonl").is_file():
                parser().error(f"runs: {run!r} holds no results.jsonl")
        for flag in ("from_profile", "measured_table"):
            value = getattr(args, flag)
            if value and not Path(value).is_file():
                parser().error(f"--{flag.replace('_', '-')}={value!r}: no such file")


def setting(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    device = torch.device(args.device)
    name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return device, getattr(torch, name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def provenance(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    import transformers

    return {
        "measured": True,
        "command": " ".join(["python", "benchmarks/real_scale.py", *args.argv]),
        "device": device_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dtype": str(dtype).removeprefix("torch."),
        "tiny": bool(args.tiny),
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def memory_line(key: str, value: str, fields: dict, dtype: torch.dtype, context: int, args, device) -> str | None:
    """One line when the model of ``fields`` does not fit (``specpolicy.models.memory.fits_line``)."""
    available = int(args.memory_gb * 2**30) if args.memory_gb is not None else available_bytes(device)
    return fits_line(key, value, fields, dtype, context, available)


def error_line(error: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def profile_model(model: rsm.ProxyPass, args, device, deadline: float) -> tuple[dict[str, Any], bool]:
    """``{mode: {kv: {width: ms}}}`` of one built model; True when the deadline cut it. A mode
    that fails (a kernel the device lacks, memory) leaves ``<mode>_error``, one line, and the
    other modes' cells."""
    out: dict[str, Any] = {}
    capacity = max(args.kv) + max(args.widths)
    for mode in args.modes:
        cells: dict[str, dict[str, float]] = {}
        try:
            if mode == "graphs":
                out["graphs_warmup_s"] = round(model.enable_graphs(capacity, tuple(sorted(set(args.widths)))), 2)
            for kv in args.kv:
                for width in args.widths:
                    if deadline and time.monotonic() > deadline:
                        out[mode] = cells
                        return out, True
                    ms = rsm.pass_ms(model, width, kv, mode, args.warmup[0], args.repeats[0], device)
                    cells.setdefault(str(kv), {})[str(width)] = round(ms, 4)
        except Exception as error:  # one device run: a failing mode must not end the others
            out[f"{mode}_error"] = error_line(error)
            print(f"{mode} failed: {out[f'{mode}_error']}", flush=True)
        out[mode] = cells
    return out, False


def profile_yaml(table: dict[str, Any]) -> str:
    """The latency profile (``conf/profile/`` schema) of a target's table, at KV ``PROFILE_KV``
    (the nearest measured KV), the graphs runtime when measured, else eager."""
    models = table["models"]
    info = {k: table.get(k, "?") for k in ("device", "torch", "date", "dtype", "graphs", "command", "target")}
    name = table.get("name") or "measured-table"

    def cells(name: str) -> tuple[str, dict[str, float]] | None:
        entry = models.get(name) or {}
        for mode in ("graphs", "eager"):
            grid = entry.get(mode) or {}
            if grid:
                kv = min(grid, key=lambda k: abs(int(k) - PROFILE_KV))
                if grid[kv]:
                    return f"{mode}, KV {kv}", grid[kv]
        return None

    def at(row: dict[str, float], width: int) -> float:
        near = min(row, key=lambda w: abs(int(w) - width))
        return float(row[near])

    target = cells("target")
    if target is None:
        return ""
    mode, row = target
    widths = sorted((int(w) for w in row if int(w) <= 17), key=int)
    _, slope = fit_affine([w - 1 for w in widths], [row[str(w)] for w in widths])
    by_drafter = {d: round(at(c[1], DRAFTER_WIDTH[d]), 3) for d in DRAFTERS if (c := cells(d))}
    one_token = cells("fastdllm")  # the 1.5B drafter's one-token pass: AR drafters' (FailFast's 6.1 ms)
    lines = [
        f"# MEASURED ({info['device']}, torch {info['torch']}, {info['date']}): random-init models at the published",
        f"# shapes, {info['dtype']}, {mode} ({info['graphs']}); the full table: {name}.json",
        "# measured: true",
        *[f"# command: {c}" for c in (table.get("commands") or [info["command"]])],
        f"name: {name}",
        f"description: MEASURED {info['device']}, {info['target']} target ({info['dtype']}, {mode})",
        f"drafter_pass_ms: {at(one_token[1] if one_token else row, 1):.3f}  # the 1.5B drafter, one token",
        "drafter_pass_ms_by_drafter:",
        *[f"  {d}: {ms:.3f}  # width {DRAFTER_WIDTH[d]}" for d, ms in by_drafter.items()],
        f"target_ms_per_token: {at(row, 1):.3f}",
        f"verify_ms_per_draft_token: {max(slope, 0.0):.4f}",
        "pass_accounting: project",
        *([f"target_params: {float(table['target_params']):.4g}"] if table.get("target_params") else []),
    ]
    return "\n".join(lines) + "\n"


def merged(path: Path, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` extending the table an earlier run wrote at ``path`` for the same target, device,
    dtype and size: its cells kept (a run of another mode or drafter adds its own), both commands
    listed (``commands``); ``table`` itself when there is none."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return table
    if any(old.get(k) != table[k] for k in ("target", "device", "dtype", "tiny")):
        return table
    table["models"], table["skipped"] = old.get("models") or {}, old.get("skipped") or {}
    table["commands"] = [*(old.get("commands") or [old.get("command")]), table["command"]]
    return table


def run_profile(args: argparse.Namespace) -> int:
    device, dtype = setting(args)
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else 0.0
    prefix = args.prefix or ("h200" if "H200" in device_name(device) else ("cpu-tiny" if args.tiny else device.type))
    context = max(args.kv) + max(args.widths)
    shared: dict[str, dict[str, Any]] = {}  # drafters whose shape does not depend on the target
    out = Path(args.out)
    for target in args.targets:
        fields = target_config(target, args.tiny)
        name = f"{prefix}-{target}"
        table: dict[str, Any] = {
            "name": name,
            "target": target,
            **provenance(args, device, dtype),
            "widths": list(args.widths),
            "kv": list(args.kv),
            "warmup": args.warmup[0],
            "repeats": args.repeats[0],
            "target_params": parameter_count(fields),
            "models": {},
            "skipped": {},
            "partial": False,
            "graphs": "graphs: the static cache compiled per bucket as CUDA graphs"
            if device.type == "cuda"
            else "graphs: the static cache, uncompiled (CPU: the path, not its speed)",
        }
        table = merged(out / f"{name}.json", table)
        shapes = drafter_shapes(target, args.tiny)
        for model_name in ("target", *args.drafters):
            shape = None if model_name == "target" else shapes[model_name]
            config = fields if shape is None else shape.config
            if shape is not None and shape.name in ("fastdllm", "deer") and shape.name in shared:
                table["models"][model_name] = {**table["models"].get(model_name, {}), **shared[shape.name]}
                continue
            line = memory_line("model", f"{target}/{model_name}", config, dtype, context, args, device)
            if line:
                print(f"skipped: {line}", flush=True)
                table["skipped"][model_name] = line
                continue
            t0 = time.perf_counter()
            try:
                model = rsm.build_pass(shape, fields, dtype, device)
            except Exception as error:  # one device run: the next model still runs
                table.setdefault("errors", {})[model_name] = error_line(error)
                print(f"{name} {model_name}: not built: {error_line(error)}", flush=True)
                rsm.free(device)
                continue
            built = time.perf_counter() - t0
            grid, cut = profile_model(model, args, device, deadline)
            entry = {
                "params": parameter_count(config),
                "source": shape.source if shape else "published config.json",
                "build_s": round(built, 2),
                **grid,
            }
            if shape is not None and shape.notes:
                entry["notes"] = list(shape.notes)
            entry = table["models"][model_name] = {**table["models"].get(model_name, {}), **entry}
            table["skipped"].pop(model_name, None)
            if shape is not None and shape.name in ("fastdllm", "deer") and not cut:
                shared[shape.name] = entry
            del model
            rsm.free(device)
            cells = sum(len(row) for m in args.modes for row in grid.get(m, {}).values())
            print(f"{name} {model_name}: built in {built:.1f} s, {cells} cells", flush=True)
            table["partial"] = table["partial"] or cut
            write_json(out / f"{name}.json", table)
            if cut:
                break
        write_json(out / f"{name}.json", table)
        text = profile_yaml(table)
        if text:
            (out / f"{name}.yaml").write_text(text)
        what = f"{out / name}.json" + (" and .yaml" if text else "")
        print(f"wrote {what}{' (partial: deadline)' if table['partial'] else ''}", flush=True)
        if table["partial"]:
            break
    return 0


def lookup(table: dict[str, Any], model: str, mode: str, width: int, kv: int) -> float:
    """ms of a pass of ``width`` after ``kv`` from a profile table: linear interpolation (and
    extrapolation from the two nearest points) in width, then in KV length, on ``mode``'s cells
    (the other mode's where the table has none of ``mode`` for ``model``).

    Raises:
        KeyError: when the table has no cell of ``model``.
    """
    entry = table["models"].get(model) or {}
    grid = entry.get(mode) or entry.get(next(m for m in MODES if m != mode)) or {}
    if not grid:
        raise KeyError(f"the profile table has no cells for {model!r}")

    def line(points: list[tuple[int, float]], x: int) -> float:
        points.sort()
        if len(points) == 1:
            return points[0][1]
        i = next((j for j in range(1, len(points)) if points[j][0] >= x), len(points) - 1)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    per_kv = [(int(k), line([(int(w), float(v)) for w, v in row.items()], width)) for k, row in grid.items() if row]
    return max(line(per_kv, kv), 0.0)


def replay_run(run: Path, args, costs, drafter_model: str | None, deadline: float) -> dict[str, Any]:
    """One run's REPLAYED and MODELED figures (``costs(model, passes) -> ms``)."""
    summary = read_summary(run / "summary.json") or {}
    name, block = drafter_of(summary.get("config") or {})
    if args.drafter:
        name = args.drafter[0]
    block = args.block_size[0] if args.block_size else block
    results = [r for r in read_results(run / "results.jsonl") if not r.skipped]
    budget, partial = args.max_rounds[0], False
    kept, ms, van_ms, tokens, count = [], {"target": 0.0, "drafter": 0.0}, 0.0, 0, 0
    for result in results:
        room = budget - len(kept)
        rounds = list(result.speculative.rounds)
        if len(rounds) > room:
            rounds, partial = rounds[:room], True
        done, prompt = 0, args.prompt_tokens[0] if args.prompt_tokens else result.prompt_tokens
        for passes in round_passes(name, rounds, prompt, block):
            if deadline and time.monotonic() > deadline:
                partial = True
                break
            for model in ("drafter", "target"):
                todo = [p for p in passes if p.model == model]
                if todo:
                    ms[model] += costs(drafter_model if model == "drafter" else "target", todo)
                    count += len(todo)
            done += 1
        kept += rounds[:done]
        emitted = sum(r.emitted_tokens for r in rounds[:done])
        tokens += emitted
        van_ms += costs("target", vanilla_passes(prompt, emitted)) if emitted else 0.0
        if partial or len(kept) >= budget:
            break
    partial = partial or len(kept) < sum(len(r.speculative.rounds) for r in results)
    total = ms["target"] + ms["drafter"]
    profile = load_profile(args.modeled_profile).for_drafter(name)
    modeled = modeled_speedup(kept, tokens, profile) if kept else None
    replayed = van_ms / total if total > 0 else None
    measured = None
    if args.measured_profile is not None and kept:
        measured = modeled_speedup(kept, tokens, args.measured_profile.for_drafter(name))
    return {
        "run": str(run),
        "method": str(summary.get("method") or run.name),
        "drafter": name,
        "drafter_model": drafter_model,
        "rounds": len(kept),
        "tokens": tokens,
        "passes": count,
        "replayed_ms": {"target": round(ms["target"], 3), "drafter": round(ms["drafter"], 3), "total": round(total, 3)},
        "vanilla_ms": round(van_ms, 3),
        "replayed_speedup": None if replayed is None else round(replayed, 4),
        "modeled_profile": args.modeled_profile,
        "modeled_speedup": None if modeled is None else round(modeled, 4),
        "modeled_error": None if not (modeled and replayed) else round(modeled / replayed - 1, 4),
        "modeled_measured_profile": None if args.measured_profile is None else args.measured_profile.name,
        "modeled_measured_speedup": None if measured is None else round(measured, 4),
        "modeled_measured_error": None if not (measured and replayed) else round(measured / replayed - 1, 4),
        "partial": partial,
    }


def run_replay(args: argparse.Namespace) -> int:
    device, dtype = setting(args)
    deadline = time.monotonic() + args.deadline_s if args.deadline_s else 0.0
    target = args.target[0]
    fields = target_config(target, args.tiny)
    shapes = drafter_shapes(target, args.tiny)
    table = json.loads(Path(args.from_profile).read_text()) if args.from_profile else None
    args.measured_profile = None  # the measured table's latency profile (profile_yaml): MODELED on this device
    measured_table = args.measured_table or args.from_profile
    if measured_table:
        text = profile_yaml(json.loads(Path(measured_table).read_text()))
        args.measured_profile = LatencyProfile.from_config(yaml.safe_load(text)) if text else None
    built: dict[str, rsm.ProxyPass] = {}
    timed = rsm.timer(device)

    def costs(model: str, passes: list[Pass]) -> float:
        if table is not None:
            return sum(lookup(table, model, args.mode, p.width, p.kv) for p in passes)
        runner = built[model]
        total = 0.0
        for p in passes:
            runner.set_kv(p.kv, args.mode)
            total += timed(lambda: runner.run(p.width, p.kv, args.mode))
        return total

    def ensure(model: str) -> None:
        if table is not None or model in built:
            return
        for other in [m for m in built if m != "target"]:
            del built[other]
        rsm.free(device, compiled=False)  # the target's compiled passes stay
        shape = None if model == "target" else shapes[model]
        config = fields if shape is None else shape.config
        line = memory_line("model", f"{target}/{model}", config, dtype, 8192, args, device)
        if line:
            raise SystemExit(f"real_scale.py: {line}")
        built[model] = rsm.build_pass(shape, fields, dtype, device)
        if args.mode == "graphs":
            built[model].enable_graphs(8192, WIDTHS)
        if args.warmup[0]:  # kernels chosen and loaded before the first timed pass
            rsm.pass_ms(built[model], 1, 64, args.mode, args.warmup[0] - 1, 1, device)

    rows = []
    ensure("target")
    for run in args.runs:
        summary = read_summary(Path(run) / "summary.json") or {}
        name = args.drafter[0] if args.drafter else drafter_of(summary.get("config") or {})[0]
        model = REPLAY_MODEL.get(name)
        try:
            if model:
                ensure(model)
            rows.append(replay_run(Path(run), args, costs, model, deadline))
        except (Exception, SystemExit) as error:  # the other runs still replay
            rows.append({"run": str(run), "drafter": name, "error": error_line(error)})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        **provenance(args, device, dtype),
        "target": target,
        "mode": args.mode,
        "from_profile": args.from_profile,
        "label": "REPLAYED: the run's model passes executed (or looked up) at real scale; host work excluded",
        "rows": rows,
    }
    write_json(Path(args.out), result)
    Path(args.out).with_suffix(".md").write_text(replay_markdown(result))
    print(f"wrote {args.out}")
    return 0


def replay_markdown(result: dict[str, Any]) -> str:
    """The replay as a Markdown table (REPLAYED beside MODELED)."""
    how = f"looked up in {result['from_profile']}" if result["from_profile"] else "executed"
    lines = [
        f"REPLAYED ({how}) on {result['device']} ({result['dtype']}, {result['mode']}, target {result['target']}); "
        f"command: `{result['command']}`",
        "",
        "| method | drafter | rounds | tokens | REPLAYED speedup | MODELED speedup | MODELED error "
        "| MODELED on the measured profile | its error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['drafter']} | failed: {r['error']} | | | | | | |")
            continue

        def f(v: Any, fmt: str) -> str:
            return "n/a" if v is None else format(v, fmt)

        lines.append(
            f"| {r['method']} | {r['drafter']} | {r['rounds']}{' (partial)' if r['partial'] else ''} | {r['tokens']} "
            f"| {f(r['replayed_speedup'], '.2f')}x | {f(r['modeled_speedup'], '.2f')}x | {f(r['modeled_error'], '+.1%')} "
            f"| {f(r['modeled_measured_speedup'], '.2f')}x | {f(r['modeled_measured_error'], '+.1%')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as the tables record it
    check(args)
    with torch.no_grad(), warnings.catch_warnings():  # both undone on return (tests call main in-process)
        warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed forward arguments
        return run_profile(args) if args.command == "profile" else run_replay(args)


if __name__ == "__main__":
    raise SystemExit(main())
