"""One experiment: a drafter + policy (and the vanilla baseline) over a prompt set.

Writes ``results.jsonl`` (one line per prompt, appended as each prompt finishes) and
``summary.json`` in the run directory, and prints a table per method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specpolicy.datasets import load_prompts
from specpolicy.decoding import generate
from specpolicy.metrics import aggregate, first_difference, round_to_dict
from specpolicy.models import load_tokenizer
from specpolicy.plugins import get_plugin_manager, make_drafter, make_policy, make_verifier
from specpolicy.report import print_summary
from specpolicy.reuse import DraftReuse
from specpolicy.runtime import Runtime
from specpolicy.types import GenerationResult


def method_name(cfg: DictConfig) -> str:
    """``<drafter>+<policy>[+reuse]``, the label of the speculative method in tables."""
    return f"{cfg.drafter.name}+{cfg.policy.name}" + ("+reuse" if cfg.reuse.enabled else "")


def _check(cfg: DictConfig) -> None:
    """Validate run-level keys before any model is loaded (ValueError naming the key)."""
    if int(cfg.generation.max_new_tokens) < 1:
        raise ValueError(f"generation.max_new_tokens must be >= 1, got {cfg.generation.max_new_tokens}")
    if int(cfg.run.warmup_prompts) < 0:
        raise ValueError(f"run.warmup_prompts must be >= 0, got {cfg.run.warmup_prompts}")


def run_experiment(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Run the configured method (and vanilla) on the configured prompts; return the summary.

    Raises:
        ValueError: for invalid configuration values, before any decoding starts.
    """
    _check(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    container = OmegaConf.to_container(cfg, resolve=True)
    runtime = Runtime(device=cfg.runtime.device, dtype=cfg.runtime.dtype, seed=int(cfg.seed))
    pm = get_plugin_manager(block=list(cfg.plugins.block))
    policy = make_policy(pm, container["policy"])  # cheap, validates its keys first
    reuse = DraftReuse(int(cfg.reuse.min_match)) if cfg.reuse.enabled else None
    verifier = make_verifier(pm, container["verifier"], runtime)
    drafter = make_drafter(pm, container["drafter"], runtime, verifier)
    tokenizer = load_tokenizer(cfg.verifier.model)
    d = cfg.dataset
    prompts = load_prompts(d.name, d.get("path"), int(d.num_prompts), int(d.get("offset", 0)))
    max_new = int(cfg.generation.max_new_tokens)
    method = method_name(cfg)
    baseline = bool(cfg.run.vanilla_baseline)

    def speculative(ids, on_round=None) -> GenerationResult:
        return generate(ids, verifier, runtime, max_new_tokens=max_new, drafter=drafter, policy=policy,
                        reuse=reuse, on_round=on_round)

    def vanilla(ids) -> GenerationResult:
        return generate(ids, verifier, runtime, max_new_tokens=max_new)

    for prompt in prompts[: int(cfg.run.warmup_prompts)]:  # untimed: first-call overheads
        ids = prompt.token_ids(tokenizer)
        speculative(ids)
        if baseline:
            vanilla(ids)

    pm.hook.specpolicy_run_start(config=container, run_dir=str(run_dir))
    spec_results: list[GenerationResult] = []
    vanilla_results: list[GenerationResult] = []
    rows = []
    with open(run_dir / "results.jsonl", "w", encoding="utf-8") as out:
        for i, prompt in enumerate(tqdm(prompts, desc=method, unit="prompt")):
            ids = prompt.token_ids(tokenizer)

            def on_round(record, _pid=prompt.prompt_id):
                pm.hook.specpolicy_round_end(method=method, prompt_id=_pid, record=record)

            van = None
            if baseline and i % 2 == 1:  # alternate the order so drift affects both methods alike
                van = vanilla(ids)
            spec = speculative(ids, on_round)
            if baseline and van is None:
                van = vanilla(ids)
            row = _row(prompt.prompt_id, ids.shape[0], spec, van, tokenizer)
            out.write(json.dumps(row) + "\n")
            out.flush()
            pm.hook.specpolicy_prompt_end(method=method, prompt_id=prompt.prompt_id, row=row)
            rows.append(row)
            spec_results.append(spec)
            if van is not None:
                vanilla_results.append(van)

    summary = build_summary(method, spec_results, vanilla_results, rows, container, runtime)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    pm.hook.specpolicy_run_end(summary=summary, run_dir=str(run_dir))
    print_summary(summary)
    return summary


def _row(prompt_id: str, prompt_tokens: int, spec: GenerationResult, van: GenerationResult | None, tokenizer) -> dict:
    out_ids = spec.output_ids.tolist()
    row = {
        "prompt_id": prompt_id,
        "prompt_tokens": int(prompt_tokens),
        "output_ids": out_ids,
        "output_text": tokenizer.decode(out_ids, skip_special_tokens=True),
        "generated_tokens": len(out_ids),
        "stop_reason": spec.stop_reason,
        "wall_s": spec.wall_s,
        "prefill_ms": spec.prefill_ms,
        "rounds": [round_to_dict(r) for r in spec.rounds],
    }
    if van is not None:
        diff = first_difference(van.output_ids.tolist(), out_ids)
        row.update(lossless=diff is None, first_difference=diff, vanilla_wall_s=van.wall_s,
                   vanilla_generated_tokens=int(van.output_ids.shape[0]))
    return row


def build_summary(method, spec_results, vanilla_results, rows, config, runtime) -> dict[str, Any]:
    """The ``summary.json`` content: headline figures, per-method aggregates, config, runtime."""
    spec = aggregate(spec_results)
    summary: dict[str, Any] = {
        "method": method,
        "prompts": len(rows),
        "acceptance_rate": spec["acceptance_rate"],
        "mean_accepted_length": spec["mean_accepted_length"],
        "mean_accepted_length_with_bonus": spec["mean_accepted_length_with_bonus"],
        "mean_speculation_length": spec["mean_speculation_length"],
        "rounds": spec["rounds"],
        "drafter_forward_passes": spec["drafter_forward_passes"],
        "tokens_per_s": spec["tokens_per_s"],
    }
    methods = {method: spec}
    if vanilla_results:
        van = aggregate(vanilla_results)
        methods["vanilla"] = van
        lossless = [r["lossless"] for r in rows]
        summary.update(
            vanilla_tokens_per_s=van["tokens_per_s"],
            speedup_vs_vanilla=spec["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] else 0.0,
            lossless_fraction=sum(lossless) / len(lossless) if lossless else 1.0,
            not_lossless={r["prompt_id"]: r["first_difference"] for r in rows if not r["lossless"]},
        )
    summary["methods"] = methods
    summary["runtime"] = runtime.describe()
    summary["config"] = config
    return summary
