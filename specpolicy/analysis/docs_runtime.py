"""The compiled runtime's page (``docs/results/runtime.md``): eager against compiled in one
process (``benchmarks/runtime.py``), the batched loop on both, the peers table compiled
(``peers.py --runtime compiled``) and the runs on a lent GPU (``benchmarks/gpu_session.sh``). Prose:
``templates/runtime.md.j2``; tables built here, each section naming its results file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specpolicy.analysis.docs_tables import render_template

RUNTIME_NAME = "runtime-gsm8k-30x256.json"
RUNTIME_PEERS_NAME = "peers-compiled-gsm8k-30x256.json"
RUNTIME_CUDA_NAMES = ("runtime-cuda-graphs.json", "runtime-cuda-compiled.json")


def x_floor_cell(row: Mapping[str, Any]) -> str:
    """A row's 'x floor': at the best bandwidth probe, and ``slowest-best`` when the run kept the
    probes' spread (``x_floor_slowest_probe``: the floor read at the slowest probe's bandwidth)."""
    slow = row.get("x_floor_slowest_probe")
    return f"{row['x_floor']:.1f}" if slow is None else f"{slow:.1f}-{row['x_floor']:.1f}"


def probes_text(machine: Mapping[str, Any]) -> str:
    """How the floor's bandwidth was measured: the STREAM probes' count and spread
    (``specpolicy.analysis.bandwidth``), or that one probe ran (results from before the probes)."""
    probes = machine.get("bandwidth_probes")
    if not probes:
        return "one 256 MB reduction, a single probe whose spread was not recorded"
    spread = probes["spread"]
    return (
        f"the best of {spread['count']} STREAM probes (copy, scale, add, triad over {probes['array_bytes'] / 2**20:.0f} "
        f"MiB arrays, {probes['threads']} threads; min / median / max {spread['min']:.1f} / {spread['median']:.1f} / "
        f"{spread['max']:.1f} GB/s; 'x floor' reads slowest-best probe)"
    )


def runtime_row(name: str, row: Mapping[str, Any], with_floor: bool = True) -> list[str]:
    """One row of a ``benchmarks/runtime.py`` table: method, runtime (the part of ``name`` after
    ``@``; HF's rows have none), tokens/s, ms per token, x floor (``with_floor``), speedup over eager
    vanilla, mean accepted length, and whether the output equals eager vanilla's."""
    return [
        name.partition("@")[0],
        name.partition("@")[2] or "Hugging Face",
        f"{row['tokens_per_s']:.1f}",
        f"{row['ms_per_token']:.2f}",
        *([x_floor_cell(row)] if with_floor else []),
        f"{row['speedup_vs_eager_vanilla']:.2f}x",
        f"{row['mean_accepted_length']:.2f}" if row.get("mean_accepted_length") is not None else "-",
        "yes" if row["identical"] else "NO",
    ]


def compiled_peers_context(
    compiled: Mapping[str, Any] | None, eager: Mapping[str, Any] | None, eager_name: str
) -> dict[str, Any] | None:
    """The peers table's main methods on the compiled runtime (``peers.py --runtime compiled``),
    their rank beside the same methods' rank in the eager neighbours run (each run's ratios are its
    own: speedups over that run's vanilla)."""
    if not compiled:
        return None
    s, methods = compiled["settings"], compiled["methods"]
    eager_methods = (eager or {}).get("methods", {})
    ranked = sorted((n for n in methods if n != "vanilla"), key=lambda n: -methods[n]["speedup_vs_vanilla"])
    by_eager = sorted((n for n in ranked if n in eager_methods), key=lambda n: -eager_methods[n]["speedup_vs_vanilla"])
    eager_rank = {n: i + 1 for i, n in enumerate(by_eager)}
    rows = [
        [f"`{n}`", f"{methods[n]['speedup_vs_vanilla']:.2f}x", str(i + 1),
         f"{eager_methods[n]['speedup_vs_vanilla']:.2f}x" if n in eager_methods else "-",
         str(eager_rank.get(n, "-")), f"{methods[n]['mean_accepted_length']:.2f}",
         f"{methods[n]['lossless_fraction'] * methods[n]['prompts']:.0f}/{methods[n]['prompts']}"]
        for i, n in enumerate(ranked)
    ]  # fmt: skip
    drops = sorted(((i + 1) - eager_rank[n], n) for i, n in enumerate(ranked) if n in eager_rank)
    moved = "No method loses its place."
    if drops and drops[-1][0] > 0:
        mover = methods[drops[-1][1]]
        why = (  # a length policy that stopped drafting, or a draft whose verification costs more
            f"its length policy, calibrated on this runtime's pass costs, drafted almost nothing: "
            f"{mover['mean_speculation_length']:.2f} tokens and {mover['drafter_passes_per_round']:.2f} drafter "
            "passes a round"
            if mover["mean_speculation_length"] <= 1.5
            else "with dispatch gone, verifying its wide draft costs relatively more"
        )
        moved = (
            f"The largest move: `{drops[-1][1]}`, {eager_rank[drops[-1][1]]} eager -> "
            f"{ranked.index(drops[-1][1]) + 1} compiled ({why})."
        )
    command = [
        f"python benchmarks/peers.py --runtime compiled --num-prompts {s['num_prompts']} --offset {s.get('offset', 0)} "
        f"--max-new-tokens {s['max_new_tokens']} --no-oracle --out benchmarks/results/{RUNTIME_PEERS_NAME} \\",
        *[f"    --method {m} \\" for m in s.get("method") or []],
    ]
    command[-1] = command[-1].removesuffix(" \\")
    return {
        "name": RUNTIME_PEERS_NAME,
        "eager_name": eager_name,
        "command": command,
        "rows": rows,
        "vanilla": f"{methods['vanilla']['tokens_per_s']:.0f}",
        "moved": moved,
    }


def _gpu_run(r: Mapping[str, Any], name: str) -> dict[str, Any]:
    s, rows = r["settings"], r["rows"]
    sides = sorted({n.partition("@")[2] for n in rows if "@" in n} - {"eager"})
    tps = {n: x["tokens_per_s"] for n, x in rows.items()}
    eager_spec = max((v, n) for n, v in tps.items() if n.endswith("@eager") and not n.startswith("vanilla"))
    warm = {k.removesuffix("_runtime_s"): v for k, v in r["warmup"].items() if k.endswith("_runtime_s")}
    hf = [v for n, v in tps.items() if n.startswith("hf-assisted")]
    notes = []
    for side in sides:
        best = max((v, n) for n, v in tps.items() if n.endswith("@" + side) and not n.startswith("vanilla"))
        vs_hf = f" and {best[0] / max(hf):.2f}x HF assisted generation's best schedule" if hf else ""
        notes.append(
            f"`@{side}`: vanilla {tps['vanilla@' + side] / tps['vanilla@eager']:.2f}x eager vanilla; the fastest "
            f"speculative row, `{best[1]}`, {best[0] / eager_spec[0]:.2f}x the fastest eager one (`{eager_spec[1]}`)"
            f"{vs_hf}; its warm-up {warm.get(side, 0):.0f} s."
        )
    return {
        "name": name,
        "command": (
            f"python benchmarks/runtime.py --device cuda --dtype float32 --num-prompts {s['num_prompts']} "
            f"--max-new-tokens {s['max_new_tokens']} --buckets {','.join(str(b) for b in s['buckets'])} "
            f"--methods {','.join(s['methods'])} --cuda-modes {','.join(s['cuda_modes'])} --deadline-s "
            f"{s['deadline_s']:g}{' --no-hf' if s.get('no_hf') else ''}"
        ),
        "rows": [runtime_row(n, x, with_floor=False) for n, x in rows.items()],
        "note": f"{s['prompts_timed']} prompts timed (`--deadline-s`), torch {s['torch']}. " + " ".join(notes),
    }


def gpu_context(runs: Sequence[tuple[str, Mapping[str, Any] | None]]) -> dict[str, Any] | None:
    """The runtime measured on a lent GPU (``benchmarks/gpu_session.sh``): one table per process
    (each with its own eager baseline, its own results file), the card's name, and the floor."""
    present = [(n, r) for n, r in runs if r]
    if not present:
        return None
    first, last = present[0][1], present[-1][1]
    return {
        "device": first["settings"].get("device_name") or "CUDA device",
        "buckets": ", ".join(str(b) for b in first["settings"]["buckets"]),
        "runs": [_gpu_run(r, n) for n, r in present],
        "floor_us": f"{last['floor']['floor_ms'] * 1e3:.0f}",
        "bandwidth": f"{last['machine']['bandwidth_GBps']:.0f}",
    }


def batched_runtime_context(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The batched loop on both runtimes (``benchmarks/runtime.py --batch-size``), from the same run."""
    batched = results.get("batched") or {}
    if not batched:
        return None
    rows = [
        [f"`{name.partition('@')[0]}`", name.partition("@")[2], f"{r['tokens_per_s']:.1f}",
         f"{r['speedup_vs_eager_batched_vanilla']:.2f}x",
         "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}",
         "sampled" if r["identical"] is None else "yes" if r["identical"] else "NO"]
        for name, r in batched.items()
    ]  # fmt: skip
    tps = {name: r["tokens_per_s"] for name, r in batched.items()}
    ratios = [
        f"`{name.partition('@')[0]}` {tps[name] / tps[name.replace('@compiled', '@eager')]:.2f}x"
        for name in batched
        if name.endswith("@compiled") and name.replace("@compiled", "@eager") in tps
    ]
    shared = [  # the drafters' batched static caches against eager request copies, same compiled target
        f"`{name.partition('@')[0]}` {tps[name] / tps[name + '-copies']:.2f}x"
        for name in batched
        if name + "-copies" in tps
    ]
    copies = (
        " Drafting on the batched static caches against eager request copies of the drafter on the same "
        f"compiled target (`compiled-copies`, as before those caches): {', '.join(shared)}."
        if shared
        else ""
    )
    sampled_rows = [name for name, r in batched.items() if r["identical"] is None]  # not compared: they sample
    temperatures = sorted({name.partition("@")[0].rpartition("-t")[2] for name in sampled_rows})
    sampled = (
        f" Rows ending `-t{temperatures[0]}` sample at temperature {temperatures[0]} (seeded per run; lossless in "
        "distribution, so not compared token for token: `sampled`)."
        if temperatures
        else ""
    )
    verifier_s = results["warmup"].get("batched_verifier_s", 0)
    drafter_s = results["warmup"].get("batched_drafter_s")
    if drafter_s:  # a run with the drafters' batched static caches (Drafter.batched)
        with_dflash = any(name.startswith("dflash") for name in batched)
        dflash = (
            "; DFlash's on a static cache of the drafter with one sequence each, one block per request and pass "
            "(`StaticBatchDFlash`)"
        )
        drafting = (
            "EAGLE-3's requests draft on a static cache of the head with one sequence each, compiled "
            f"(`StaticBatchEagle3`: every drafting request one token per pass){dflash if with_dflash else ''}."
        )
        caches = "the drafters' batched caches" if with_dflash else "EAGLE-3's batched cache"
        compilation = f"the compilation of its verifier took {verifier_s:.0f} s, of {caches} {drafter_s:.0f} s"
    else:
        drafting = "the drafters draft eagerly there, each request's copy batched by `draft_many`."
        compilation = f"its verifier's compilation took {verifier_s:.0f} s"
    return {
        "s": results["settings"],
        "rows": rows,
        "drafting": drafting,
        "ratios": ", ".join(ratios),
        "compilation": compilation,
        "copies": copies,
        "sampled": sampled,
    }


def batched_runtime_section(results: Mapping[str, Any]) -> list[str]:
    """The batched loop's section alone, as Markdown lines (what ``runtime_page`` shows)."""
    context = batched_runtime_context(results)
    if context is None:
        return []
    page = render_template("runtime_batched", batched=context)
    return page.splitlines()


def _bars(results: Mapping[str, Any]) -> tuple[list[str], str]:
    rows = results["rows"]
    tps = {name: r["tokens_per_s"] for name, r in rows.items()}

    def spec(side: str) -> tuple[float, str]:
        return max((v, n) for n, v in tps.items() if n.endswith(side) and not n.startswith("vanilla"))

    fast_eager, fast_compiled = spec("@eager"), spec("@compiled")
    assisted = max((v, n) for n, v in tps.items() if n.startswith("hf-assisted"))
    w = results["warmup"]
    order = {
        side: [n.removesuffix(side) for _, n in sorted(((-v, n) for n, v in tps.items() if n.endswith(side)))]
        for side in ("@eager", "@compiled")
    }
    ranking = (
        f"The methods rank the same on both runtimes ({' > '.join(order['@compiled'])})."
        if order["@eager"] == order["@compiled"]
        else f"The ranking moves: eager {' > '.join(order['@eager'])}; compiled {' > '.join(order['@compiled'])}."
    )
    bars = [
        f"- compiled vanilla {tps['vanilla@compiled'] / tps['vanilla@eager']:.2f}x eager vanilla (bar: >= 3x) and "
        f"{x_floor_cell(rows['vanilla@compiled'])}x the floor per token (bar: within 4x);",
        f"- the fastest speculative method compiled, `{fast_compiled[1]}`, {fast_compiled[0] / fast_eager[0]:.2f}x the "
        f"fastest eager, `{fast_eager[1]}` (bar: >= 2x), and {fast_compiled[0] / assisted[0]:.2f}x HF assisted "
        f"generation's best schedule here, `{assisted[1]}` (bar: >= 3x);",
        f"- every row token-identical to eager vanilla: {'yes' if all(r['identical'] for r in rows.values()) else 'NO'};",
        f"- warm-up (compilation of the target and the AR, EAGLE-3 and DFlash drafters, inductor's on-disk cache as "
        f"this machine had it): {w['compiled_runtime_s']:.0f} s (bar: under 2 minutes); HF's static-cache compile "
        f"{w['hf_static_compile_s']:.0f} s.",
    ]
    return bars, ranking


def runtime_page(
    results: Mapping[str, Any] | None,
    compiled_peers: Mapping[str, Any] | None = None,
    eager_peers: Mapping[str, Any] | None = None,
    gpu_runs: Sequence[Mapping[str, Any] | None] = (),
    eager_name: str = "neighbours-gsm8k-30x256.json",
) -> str | None:
    """Eager vs compiled in one process, HF's own generation as peers, this machine's floor, and
    the issue's bars read off the same run; ``gpu_runs`` in the order of ``RUNTIME_CUDA_NAMES``."""
    if not results:
        return None
    s, rows, floor, machine = results["settings"], results["rows"], results["floor"], results["machine"]
    bars, ranking = _bars(results)
    command = (
        f"python benchmarks/runtime.py --num-prompts {s['num_prompts']} --max-new-tokens {s['max_new_tokens']} "
        + (f"--batch-temperature {s['batch_temperature']:g} " if s.get("batch_temperature") else "")
        + ("--batch-copies " if s.get("batch_copies") else "")
        + f"--out benchmarks/results/{RUNTIME_NAME}"
    )
    floor_line = (
        f"{floor['floor_ms']:.3f} ms a token -- the target's {floor['weights_bytes'] / 1e6:.1f} MB of weights at "
        f"the {machine['bandwidth_GBps']:.1f} GB/s measured here ({probes_text(machine)}; {floor['read_ms']:.3f} ms), its FLOPs at "
        f"{machine['matmul_GFLOPs']:.0f} GFLOP/s ({floor['flops_ms']:.3f} ms); {s['torch_threads']} torch "
        f"threads, {s['dtype']}, torch {s['torch']}."
    )
    saving = 1 - rows["vanilla@compiled"]["ms_per_token"] / rows["vanilla@eager"]["ms_per_token"]
    return render_template(
        "runtime",
        name=RUNTIME_NAME,
        command=command,
        rows=[runtime_row(name, r) for name, r in rows.items()],
        floor_line=floor_line,
        bars=bars,
        step_saving=f"{saving:.0%}",
        ranking=ranking,
        batched=batched_runtime_context(results),
        peers=compiled_peers_context(compiled_peers, eager_peers, eager_name),
        gpu=gpu_context(list(zip(RUNTIME_CUDA_NAMES, gpu_runs))),
    )
