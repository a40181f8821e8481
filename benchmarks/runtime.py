#!/usr/bin/env python
"""Eager vs compiled runtime, side by side in one process, beside Hugging Face's own fastest plain
generation and its assisted generation, and this machine's floor.

    python benchmarks/runtime.py --num-prompts 30 --max-new-tokens 256 \
        --out benchmarks/results/runtime-gsm8k-30x256.json
    python benchmarks/runtime.py --quick --out /tmp/runtime.json        # a smoke run (2 prompts)

Rows (the bundled family; every greedy row's output checked against eager vanilla's):

* ``<method>@eager`` / ``<method>@compiled`` for ``vanilla`` and each method: ``conf/method/``
  presets by name (``--method NAME``, repeated, or a one-off ``--method NAME=OVERRIDES`` as
  ``benchmarks/peers.py`` takes them; default ``DEFAULT_METHODS``: ``ar+static-k5`` (the AR drafter,
  compiled too), ``eagle3+static-k4`` / ``-k7`` / ``-k9`` (EAGLE-3 chains) and ``dflash+failfast``),
  on the AR, EAGLE-3 or DFlash drafter (``--methods``: those drafters only): the same verifier code on ``Runtime(compile=False)`` and ``Runtime(compile=True)``
  (``runtime.compile``: the target and the AR, EAGLE-3 and DFlash drafters on static KV caches
  compiled per shape bucket, ``specpolicy.runners``);
* ``hf-greedy`` -- ``generate(do_sample=False)`` (DynamicCache, eager); ``hf-static-compiled`` --
  ``generate(cache_implementation="static")`` with transformers' own compilation of the decoding
  forward (``CompileConfig(fullgraph=True)``, on every device); ``hf-assisted-k<K>`` (constant
  schedule) and ``hf-assisted-heuristic`` with the AR drafter.

With ``--batch-size`` B > 1 (default 4) the batched loop runs too, after the per-prompt rows:
``vanilla-batch<B>`` and ``<method>-batch<B>`` for the first method on each of the EAGLE-3 and
DFlash drafters (default ``eagle3+static-k4`` and ``dflash+failfast``) on each runtime (the compiled side's target a static cache of B sequences,
``StaticBatchedHFVerifier``), over the same prompts, ``--batch-repeats`` interleaved runs (the drafters'
requests draft on their batched static caches there, ``StaticEagle3`` and ``StaticDFlash`` of several sequences);
``--batch-temperature`` T > 0 adds each speculative batched row sampling at T (``<row>-t<T>``, seeded
per run, not compared token for token), ``--batch-copies`` the compiled side's speculative rows with
eager request copies of the drafter (``@compiled-copies``: what those caches replace);
the compilation of its verifier and of those caches is reported apart (``warmup.batched_verifier_s``,
``warmup.batched_drafter_s``).

Reported per row: tokens/s (generated tokens / wall seconds, prefill included, summed over the
prompts), ms per token, the ratio to the floor, speedup over eager vanilla, mean accepted length,
and whether every output equals eager vanilla's. Warm-up is reported apart: the compiled runtime's
compilation (``Runtime.warmup_s``: the target's and the drafters' graphs) and each row's first
(untimed) prompt. Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the
system's temp directory) makes a second process's warm-up much shorter: both are worth quoting.

The floor of one decoding step on this machine: max(the target's weight bytes / the measured
memory bandwidth, 2 x its parameters / the measured float matmul rate), measured here: the
bandwidth is the best of repeated STREAM probes (copy, scale, add, triad over arrays far larger
than the last-level cache, the run's torch threads; ``specpolicy.analysis.bandwidth``), every probe
and their spread stored under ``machine.bandwidth_probes`` and each row's ``x_floor_slowest_probe``
beside ``x_floor``; the matmul rate from 512 x 512 matmuls. Methods run interleaved per prompt
(rotating order).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import MethodSpec, _conf, add_method_argument, parse_method  # noqa: E402

from specpolicy.analysis.bandwidth import stream_probes, x_floor_range  # noqa: E402
from specpolicy.core.decoding import generate  # noqa: E402
from specpolicy.core.reuse import DraftReuse  # noqa: E402
from specpolicy.core.runtime import Runtime  # noqa: E402
from specpolicy.data.datasets import load_prompts  # noqa: E402
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy, make_verifier  # noqa: E402


def measure_floor(device: torch.device, dtype: torch.dtype, reps: int = 5, probes: int = 10) -> dict[str, Any]:
    """This machine's memory bandwidth (GB/s: the best of STREAM's copy / scale / add / triad over
    arrays far larger than the last-level cache, ``probes`` runs each, with the run's torch threads;
    every probe and their spread kept under ``bandwidth_probes``: ``specpolicy.analysis.bandwidth``)
    and matmul rate (GFLOP/s: 512 x 512 in ``dtype``, best of ``reps`` runs of 20)."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    stream = stream_probes(device, threads=torch.get_num_threads(), repeats=probes)
    a = torch.randn(512, 512, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        for _ in range(20):
            a @ a
        sync()
        best = min(best, time.perf_counter() - t)
    return {
        "bandwidth_GBps": stream["bandwidth_GBps"],
        "matmul_GFLOPs": 20 * 2 * 512**3 / best / 1e9,
        "bandwidth_probes": stream,
    }


def step_floor_ms(model: torch.nn.Module, machine: dict[str, float]) -> dict[str, float]:
    """The floor of one decoding step of ``model`` (ms): its weights read once, its 2 x parameters
    FLOPs done once; the larger of the two."""
    params = {id(p): p for p in model.parameters()}.values()  # tied embeddings counted once
    numel = sum(p.numel() for p in params)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    read_ms = nbytes / (machine["bandwidth_GBps"] * 1e9) * 1e3
    flops_ms = 2 * numel / (machine["matmul_GFLOPs"] * 1e9) * 1e3
    return {"weights_bytes": nbytes, "read_ms": read_ms, "flops_ms": flops_ms, "floor_ms": max(read_ms, flops_ms)}


class Side:
    """One runtime's verifier and drafters (eager or compiled), built once; the compiled side's
    build time is its warm-up."""

    def __init__(self, args: argparse.Namespace, compile: bool, cuda_mode: str = "reduce-overhead") -> None:
        from specpolicy.core.runtime import CompileSettings

        # runtime.cuda_mode (CUDA only) and runtime.buckets, read as each model is built
        settings = CompileSettings(cuda_mode=cuda_mode, **({"buckets": args.buckets} if args.buckets else {}))
        self.runtime = Runtime(device=args.device, dtype=args.dtype, seed=0, compile=compile, compiled=settings)
        self.pm = get_plugin_manager(autoload=False)
        start = time.perf_counter()
        self.verifier = make_verifier(self.pm, {**_conf("verifier", "hf"), "model": args.target}, self.runtime)
        wanted = {s.drafter for s in args.specs} | ({"ar"} if not compile else set())  # HF's assisted rows: eager AR
        self.drafters = {
            name: make_drafter(self.pm, {**_conf("drafter", name), "model": model}, self.runtime, self.verifier)
            for name, model in (
                ("ar", args.ar_drafter),
                ("eagle3", args.eagle3_drafter),
                ("dflash", args.dflash_drafter),
            )
            if name in wanted
        }
        self.build_s = time.perf_counter() - start


#: The methods a run without ``--method`` measures on each runtime (``conf/method/`` presets, by name).
DEFAULT_METHODS = ("ar+static-k5", "eagle3+static-k4", "eagle3+static-k7", "eagle3+static-k9", "dflash+failfast")
#: The drafters with a compiled runtime here (``runtime.compile``: static KV caches).
RUNTIME_DRAFTERS = ("ar", "eagle3", "dflash")


def batched_specs(specs: list[MethodSpec]) -> list[MethodSpec]:
    """The methods the batched loop runs: the first one on each of the EAGLE-3 and DFlash drafters."""
    first: dict[str, MethodSpec] = {}
    for s in specs:
        if s.drafter in ("eagle3", "dflash"):
            first.setdefault(s.drafter, s)
    return list(first.values())


#: Row labels of each compiled side (``--cuda-modes``): ``@compiled`` is ``runtime.compile=true``.
SIDE_LABELS = {"reduce-overhead": "compiled", "default": "inductor", "cudagraphs": "cudagraphs"}


def our_rows(side: Side, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """``name -> run(ids)`` for our methods on one side."""
    rows = {
        f"vanilla@{label}": lambda ids: generate(ids, side.verifier, side.runtime, max_new_tokens=args.max_new_tokens)
    }
    for spec in args.specs:  # conf/method/ presets (or --method one-offs), by name
        policy = make_policy(get_plugin_manager(block=spec.block), spec.policy)
        rows[f"{spec.name}@{label}"] = lambda ids, _d=side.drafters[spec.drafter], _p=policy, _r=spec.reuse: generate(
            ids,
            side.verifier,
            side.runtime,
            max_new_tokens=args.max_new_tokens,
            drafter=_d,
            policy=_p,
            reuse=DraftReuse(2) if _r else None,
        )
    return rows


def hf_rows(side: Side, args: argparse.Namespace, longest: int) -> tuple[dict[str, Any], float]:
    """HF's rows on the eager side's models, and the seconds HF's static-cache compilation took
    (a first call with the longest prompt, so the static cache is never rebuilt)."""
    from transformers import CompileConfig

    target, assistant = side.verifier.model, side.drafters["ar"].model
    eos = sorted(side.verifier.eos_token_ids)
    device = side.runtime.torch_device
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    compile_config = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless asked
    gc = assistant.generation_config

    def call(ids, **extra):
        kwargs: dict[str, Any] = dict(
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=eos[0],
            attention_mask=torch.ones(1, ids.shape[0], dtype=torch.long, device=device),
        )
        kwargs.update(extra)
        start = time.perf_counter()
        out = target.generate(ids.to(device)[None], **kwargs)
        return out[0, ids.shape[0] :].cpu(), time.perf_counter() - start

    def assisted(schedule: str, tokens: int):
        def run(ids):
            gc.num_assistant_tokens_schedule, gc.num_assistant_tokens = schedule, tokens
            gc.assistant_confidence_threshold = 0.0
            return call(ids, assistant_model=assistant)

        return run

    static = dict(cache_implementation="static", compile_config=compile_config)
    start = time.perf_counter()
    call(torch.full((longest,), 5, dtype=torch.long), **static)  # compile, and size the static cache once
    warm = time.perf_counter() - start
    rows = {
        "hf-greedy": lambda ids: call(ids),
        "hf-static-compiled": lambda ids: call(ids, **static),
        f"hf-assisted-k{args.static_k}": assisted("constant", args.static_k),
        "hf-assisted-heuristic": assisted("heuristic", 20),
    }
    return rows, warm


def batched_rows(
    args: argparse.Namespace,
    eager: Side,
    compiled_sides: dict[str, Side],
    ids: list[torch.Tensor],
    reference: list[list[int]],
    errors: dict[str, str],
) -> dict[str, Any]:
    """The batched loop (``generate_batch``, ``--batch-size`` requests in flight, all arriving at
    once) over the timed prompts: vanilla and the first method on each of the EAGLE-3 and DFlash
    drafters (``batched_specs``) on each runtime, ``--batch-repeats`` runs each, interleaved; tokens/s
    over the run's wall seconds (the compiled side's batched verifier built, and compiled, before its
    first run, untimed). With ``--batch-temperature`` T > 0 each speculative row also samples at T
    (``<row>-t<T>``, seeded per run; ``identical`` None: not compared); with ``--batch-copies`` the
    compiled side's speculative rows also run with eager request copies of the drafter
    (``@compiled-copies``: the target compiled, the drafting as before its batched static caches)."""
    from specpolicy.core.batching import generate_batch
    from specpolicy.core.sampling import SamplingConfig

    sides = {"eager": eager, **compiled_sides}
    rows: dict[str, Any] = {}
    runners = {}
    samplings: list[tuple[str, SamplingConfig | None]] = [("", None)]
    if args.batch_temperature > 0:
        samplings.append((f"-t{args.batch_temperature:g}", SamplingConfig(temperature=args.batch_temperature)))
    for label, side in sides.items():
        runners[f"vanilla-batch{args.batch_size}@{label}"] = (side, None, None, None)
        speculative = [
            (s.name, s.drafter, make_policy(get_plugin_manager(block=s.block), s.policy))
            for s in batched_specs(args.specs)
        ]
        labels = [label] + ([f"{label}-copies"] if args.batch_copies and side is not eager else [])
        for method, drafter_name, policy in speculative:
            for tag, sampling in samplings:
                for where in labels:
                    drafter = side.drafters[drafter_name]
                    if where.endswith("-copies"):
                        drafter = _eager_copies(drafter)
                    runners[f"{method}-batch{args.batch_size}{tag}@{where}"] = (side, drafter, policy, sampling)
    for name, (side, drafter, policy, sampling) in runners.items():  # untimed: the batched verifier compiled
        generate_batch(
            ids[: args.batch_size],
            side.verifier,
            side.runtime,
            max_new_tokens=8,
            batch_size=args.batch_size,
            drafter=drafter,
            policy=policy,
            sampling=sampling,
        )
        rows[name] = {
            "tokens": 0,
            "wall_s": 0.0,
            "rounds": 0,
            "accepted": 0,
            "identical": True if sampling is None else None,
        }
    for repeat in range(args.batch_repeats):
        for name, (side, drafter, policy, sampling) in runners.items():
            side.runtime.generator.manual_seed(repeat)
            try:
                out = generate_batch(
                    ids,
                    side.verifier,
                    side.runtime,
                    max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size,
                    drafter=drafter,
                    policy=policy,
                    sampling=sampling,
                )
            except Exception as e:  # noqa: BLE001 -- a row that fails is reported, the others run
                errors[name] = f"{type(e).__name__}: {e}"[:2000]
                continue
            r = rows[name]
            r["tokens"] += sum(int(g.output_ids.shape[0]) for g in out.results.values())
            r["wall_s"] += out.wall_s
            r["rounds"] += sum(len(g.rounds) for g in out.results.values())
            r["accepted"] += sum(x.accepted_length for g in out.results.values() for x in g.rounds)
            if sampling is None:
                r["identical"] &= [out.results[i].output_ids.tolist() for i in range(len(ids))] == reference
    base = rows[f"vanilla-batch{args.batch_size}@eager"]
    for r in rows.values():
        r["tokens_per_s"] = r["tokens"] / r["wall_s"] if r["wall_s"] else 0.0
        r["speedup_vs_eager_batched_vanilla"] = r["tokens_per_s"] / (base["tokens"] / base["wall_s"])
        r["mean_accepted_length"] = r["accepted"] / r["rounds"] if r["rounds"] else None
    return rows


def _eager_copies(drafter):
    """``drafter`` as the batched loop copied it before the batched static caches: every request
    a copy without the static cache (``Drafter.__copy__``), drafting eagerly, batched by ``draft_many``."""
    plain = copy.copy(drafter)
    plain.batched = lambda slots: plain
    return plain


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    # args.buckets (runtime.buckets, each Side's runtime): fewer buckets, a shorter warm-up, more
    # padding on CUDA (on CPU they set the chunks)
    prompts = load_prompts(args.dataset, None, args.num_prompts)
    eager = Side(args, compile=False)
    cuda = eager.runtime.torch_device.type == "cuda"
    compiled_sides: dict[str, Side] = {}
    errors: dict[str, str] = {}
    for mode in args.cuda_modes if cuda else ["reduce-overhead"]:  # CPU: one compiled side
        label = SIDE_LABELS[mode]
        try:
            side = Side(args, compile=True, cuda_mode=mode)
        except Exception as e:  # noqa: BLE001 -- a mode that fails to build is reported, the others run
            errors[label] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{label} runtime failed to build: {errors[label]}", file=sys.stderr, flush=True)
            continue
        compiled_sides[label] = side
        print(
            f"{label} runtime built in {side.build_s:.1f} s (compilation {side.runtime.warmup_s:.1f} s); "
            f"eager in {eager.build_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    ids = [p.token_ids(eager.verifier.tokenizer) for p in prompts]
    runners = our_rows(eager, "eager", args)
    for label, side in compiled_sides.items():
        runners.update(our_rows(side, label, args))
    hf_warm = None
    if not args.no_hf:
        try:
            hf, hf_warm = hf_rows(eager, args, max(int(x.shape[0]) for x in ids))
            runners.update(hf)
        except Exception as e:  # noqa: BLE001 -- HF's compiled generation failing leaves our rows
            errors["hf"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"HF rows failed: {errors['hf']}", file=sys.stderr, flush=True)
    first_s: dict[str, float] = {}
    for name, fn in list(runners.items()):  # untimed first prompt: first-call costs (and any late compilation)
        t = time.perf_counter()
        try:
            fn(ids[0])
        except Exception as e:  # noqa: BLE001 -- a row that fails is reported, the others run
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{name} failed: {errors[name]}", file=sys.stderr, flush=True)
            del runners[name]
            continue
        first_s[name] = time.perf_counter() - t
    stats = {name: {"tokens": 0, "wall_s": 0.0, "rounds": 0, "accepted": 0, "identical": True} for name in runners}
    reference: list[list[int]] = []
    names = list(runners)
    loop_start = time.perf_counter()
    prompts_done = 0
    for i, prompt in enumerate(ids):
        if args.deadline_s and time.perf_counter() - loop_start > args.deadline_s:
            print(f"--deadline-s {args.deadline_s} reached after {i} prompts", file=sys.stderr, flush=True)
            break
        prompts_done = i + 1
        order = names[i % len(names) :] + names[: i % len(names)]
        outputs = {}
        for name in order:
            if name in errors:
                continue
            try:
                result = runners[name](prompt)
            except Exception as e:  # noqa: BLE001 -- the row is dropped and reported, the others go on
                errors[name] = f"prompt {i + 1}: {type(e).__name__}: {e}"[:2000]
                print(f"{name} failed: {errors[name]}", file=sys.stderr, flush=True)
                continue
            s = stats[name]
            if isinstance(result, tuple):  # HF: (new tokens, wall s)
                out, wall = result
            else:
                out, wall = result.output_ids, result.wall_s
                s["rounds"] += len(result.rounds)
                s["accepted"] += sum(r.accepted_length for r in result.rounds)
            s["tokens"] += int(out.shape[0])
            s["wall_s"] += wall
            outputs[name] = out.tolist()
        reference.append(outputs["vanilla@eager"])
        for name in outputs:
            stats[name]["identical"] &= outputs[name] == reference[-1]
        print(f"prompt {i + 1}/{len(ids)}", file=sys.stderr, flush=True)
    if not compiled_sides:
        raise RuntimeError(f"no compiled runtime could be built: {errors}")
    warm = {label: side.runtime.warmup_s for label, side in compiled_sides.items()}  # before the batched verifiers
    batched = (
        batched_rows(args, eager, compiled_sides, ids[:prompts_done], reference, errors) if args.batch_size > 1 else {}
    )
    compiled = next(iter(compiled_sides.values()))
    machine = measure_floor(eager.runtime.torch_device, eager.runtime.torch_dtype)
    floor = step_floor_ms(eager.verifier.model, machine)
    base = stats["vanilla@eager"]["tokens"] / stats["vanilla@eager"]["wall_s"]
    rows = {}
    for name, s in stats.items():
        if name in errors:
            continue
        tps = s["tokens"] / s["wall_s"] if s["wall_s"] else 0.0
        rows[name] = {
            **s,
            "tokens_per_s": tps,
            "ms_per_token": 1e3 / tps if tps else None,
            "x_floor": (1e3 / tps) / floor["floor_ms"] if tps else None,
            "x_floor_slowest_probe": x_floor_range(1e3 / tps, floor, machine["bandwidth_probes"])[1] if tps else None,
            "speedup_vs_eager_vanilla": tps / base if base else None,
            "mean_accepted_length": s["accepted"] / s["rounds"] if s["rounds"] else None,
            "first_prompt_s": first_s[name],
        }
    # the drafters' batched static caches (Drafter.batched: their runners' ``batched``), compiled for the
    # batch size with the batched rows
    runners = [getattr(compiled.drafters.get(d), "runner", None) for d in {s.drafter for s in args.specs}]
    batched_caches = [r.batched_cache(args.batch_size) for r in runners if hasattr(r, "batched_cache")]
    batched_drafter_s = sum(c.warmup_s for c in batched_caches if c is not None)
    return {
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("method", "specs")},
            "method": [s.given for s in args.specs],
            # device, dtype, versions (each side's compilation is in "warmup", not the eager side's 0)
            **{k: v for k, v in eager.runtime.describe().items() if k not in ("compile", "warmup_s")},
            "torch_threads": torch.get_num_threads(),
            "buckets": compiled.verifier.static.buckets,
            "busy_machine_note": args.note,
            "device_name": torch.cuda.get_device_name() if cuda else None,
            "prompts_timed": prompts_done,
        },
        "warmup": {
            "compiled_runtime_s": warm[next(iter(compiled_sides))],
            "batched_verifier_s": compiled.runtime.warmup_s - warm[next(iter(compiled_sides))] - batched_drafter_s,
            "batched_drafter_s": batched_drafter_s,
            "compiled_side_build_s": compiled.build_s,
            "eager_side_build_s": eager.build_s,
            "hf_static_compile_s": hf_warm,
            **{f"{label}_runtime_s": warm[label] for label in compiled_sides},
        },
        "errors": errors,
        "batched": batched,
        "machine": machine,
        "floor": floor,
        "rows": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    f, w = result["floor"], result["warmup"]
    print(
        f"floor: {f['floor_ms']:.3f} ms/token (weights {f['weights_bytes'] / 1e6:.1f} MB read: {f['read_ms']:.3f} ms at "
        f"{result['machine']['bandwidth_GBps']:.1f} GB/s; FLOPs {f['flops_ms']:.3f} ms at "
        f"{result['machine']['matmul_GFLOPs']:.0f} GFLOP/s)"
    )
    spread = result["machine"]["bandwidth_probes"]["spread"]
    print(
        f"bandwidth: best of {spread['count']} STREAM probes; min / median / max {spread['min']:.1f} / "
        f"{spread['median']:.1f} / {spread['max']:.1f} GB/s"
    )
    print(
        f"warm-up: compiled runtime {w['compiled_runtime_s']:.1f} s (its models built in "
        f"{w['compiled_side_build_s']:.1f} s), HF static-cache compile "
        + ("not run" if w["hf_static_compile_s"] is None else f"{w['hf_static_compile_s']:.1f} s")
    )
    print(
        f"{'method':34s} {'tok/s':>8s} {'ms/tok':>8s} {'x floor':>8s} {'speedup':>8s} {'acc len':>8s} {'first s':>8s}  lossless"
    )
    for name, r in result["rows"].items():
        acc = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] is not None else "-"
        print(
            f"{name:34s} {r['tokens_per_s']:8.1f} {r['ms_per_token']:8.2f} {r['x_floor']:8.1f} "
            f"{r['speedup_vs_eager_vanilla']:8.2f} {acc:>8s} {r['first_prompt_s']:8.1f}  {r['identical']}"
        )
    if result.get("batched"):
        print(
            f"batched loop (its verifier's compilation {w.get('batched_verifier_s', 0):.1f} s, "
            f"the drafters' batched caches {w.get('batched_drafter_s', 0):.1f} s):"
        )
        print(f"{'method':44s} {'tok/s':>8s} {'vs eager':>8s} {'acc len':>8s}  lossless")
        for name, r in result["batched"].items():
            acc = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] is not None else "-"
            lossless = "sampled" if r["identical"] is None else r["identical"]
            print(
                f"{name:44s} {r['tokens_per_s']:8.1f} {r['speedup_vs_eager_batched_vanilla']:8.2f} {acc:>8s}  "
                f"{lossless}"
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/runtime.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--static-k", type=int, default=5, help="k of HF's constant assisted schedule")
    add_method_argument(
        p,
        "a method by its conf/method/ preset's name, or a one-off NAME=drafter=D,policy=P,... (as "
        "benchmarks/peers.py takes them), on the ar, eagle3 or dflash drafter; repeat for several (default: "
        + ", ".join(DEFAULT_METHODS)
        + ")",
    )
    p.add_argument("--target", default="target")
    p.add_argument("--ar-drafter", default="ar-drafter")
    p.add_argument("--eagle3-drafter", default="eagle3-drafter")
    p.add_argument("--dflash-drafter", default="dflash-drafter")
    p.add_argument("--dllm-drafter", default="dllm-drafter", help="accepted like the other benchmarks; unused here")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--buckets",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=None,
        help="the compiled runtime's pass widths, e.g. 1,8 (default: runtime.buckets)",
    )
    p.add_argument(
        "--cuda-modes",
        type=lambda text: text.split(","),
        default=["reduce-overhead"],
        help="on CUDA, one compiled side per runtime.cuda_mode, comma-separated: reduce-overhead "
        "(rows @compiled: inductor + CUDA graphs), default (@inductor: no CUDA graphs), cudagraphs "
        "(@cudagraphs: eager kernels as CUDA graphs, no inductor); CPU builds one compiled side",
    )
    p.add_argument(
        "--methods",
        type=lambda text: text.split(","),
        default=["ar", "eagle3", "dflash"],
        help="of the methods (--method), run those on these drafters (comma-separated subset of ar,eagle3,dflash); "
        "vanilla's rows always run, HF's unless --no-hf",
    )
    p.add_argument(
        "--deadline-s", type=float, default=0.0, help="stop timing new prompts after this many seconds (0: never)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="also the batched loop with this many requests in flight, on each runtime (default 4; 0 or 1: "
        "not run; --quick's 2 prompts put at most 2 in flight)",
    )
    p.add_argument("--batch-repeats", type=int, default=2, help="interleaved runs of every batched row")
    p.add_argument(
        "--batch-temperature",
        type=float,
        default=0.0,
        help="also run every speculative batched row sampling at this temperature (0: greedy only)",
    )
    p.add_argument(
        "--batch-copies",
        action="store_true",
        help="also run the compiled side's speculative batched rows with eager request copies of the drafter",
    )
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face's rows (and their compilation)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, 24 tokens")
    p.add_argument("--out", default=None, help="JSON output")
    p.add_argument("--note", default="", help="a note stored with the results (e.g. how busy the machine was)")
    args = p.parse_args(argv)
    bad_methods = [m for m in args.methods if m not in RUNTIME_DRAFTERS]
    if bad_methods:
        p.error(f"--methods={','.join(args.methods)}: {bad_methods[0]!r} is not one of {', '.join(RUNTIME_DRAFTERS)}")
    bad = [m for m in args.cuda_modes if m not in SIDE_LABELS]
    if bad:
        p.error(f"--cuda-modes={','.join(args.cuda_modes)}: {bad[0]!r} is not one of {', '.join(SIDE_LABELS)}")
    if args.quick:
        args.num_prompts, args.max_new_tokens = 2, 24
    for s in args.method:
        if s.drafter not in RUNTIME_DRAFTERS or s.drafter_settings:
            p.error(
                f"--method {s.given}: runs drafter={s.drafter}"
                + (f" with its own drafter.{next(iter(s.drafter_settings))}" if s.drafter_settings else "")
                + f"; this benchmark runs the drafters {', '.join(RUNTIME_DRAFTERS)} at their configs' settings"
            )
    args.specs = [s for s in args.method or [parse_method(n) for n in DEFAULT_METHODS] if s.drafter in args.methods]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
