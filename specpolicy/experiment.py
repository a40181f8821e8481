"""One experiment: a drafter + policy (and the vanilla baseline) over a prompt set.

Writes ``summary.json`` in the run directory and prints a table per method; the run's
loggers (plugins selected by the ``logger`` config group) receive the lifecycle hooks: the
default ``jsonl`` logger writes ``results.jsonl`` (one line per prompt, appended as each
prompt finishes), ``wandb`` tracks the run in Weights & Biases.

Runs are resumable (``specpolicy.resume``): with ``run.resume: true`` (default) the prompts
already in the run directory's ``results.jsonl`` are read back instead of recomputed, and the
summary is always built from the rows (``summary_from_rows``), so a resumed run's summary
equals an uninterrupted run's except for timings. SIGINT / SIGTERM write a partial summary
(``"partial": true``) and raise ``RunInterrupted``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specpolicy.analysis import extend_summary, profile_from
from specpolicy.datasets import load_prompts
from specpolicy.decoding import generate
from specpolicy.metrics import (aggregate, describe_fields, first_difference, prompt_values, round_to_dict,
                                vanilla_from_row, weighted_aggregates)
from specpolicy.models import load_tokenizer
from specpolicy.plugins import get_plugin_manager, make_drafter, make_loggers, make_policy, make_verifier, registered
from specpolicy.report import print_summary
from specpolicy.resume import RunInterrupted, config_fingerprint, interruptible, load_finished, results_path, shielded
from specpolicy.reuse import DraftReuse
from specpolicy.runtime import Runtime
from specpolicy.sampling import SamplingConfig, prompt_seed
from specpolicy.stopping import StopStrings
from specpolicy.types import GenerationResult


#: The ``lossless`` value of rows and summaries at temperature > 0 (token identity is not expected).
SAMPLING_LOSSLESS = "n/a (sampling)"


def method_name(cfg: DictConfig) -> str:
    """``<drafter>+<policy>[-<mode>][+reuse]``, the label of the speculative method in tables
    (a policy ``mode`` other than the policy's name is shown, e.g. ``ar+aimd-heuristic``)."""
    mode = cfg.policy.get("mode")
    policy = cfg.policy.name + (f"-{mode}" if mode and mode != cfg.policy.name else "")
    return f"{cfg.drafter.name}+{policy}" + ("+reuse" if cfg.reuse.enabled else "")


def _check(cfg: DictConfig) -> None:
    """Validate run-level keys before any model is loaded (ValueError naming the key)."""
    if int(cfg.generation.max_new_tokens) < 1:
        raise ValueError(f"generation.max_new_tokens must be >= 1, got {cfg.generation.max_new_tokens}")
    if int(cfg.run.warmup_prompts) < 0:
        raise ValueError(f"run.warmup_prompts must be >= 0, got {cfg.run.warmup_prompts}")
    profile_from(OmegaConf.to_container(cfg, resolve=True))  # a bad `profile` fails now, not after the run
    SamplingConfig.from_config(cfg.generation)  # generation.temperature / top_k / top_p
    stop = cfg.generation.get("stop")
    if stop is not None and (isinstance(stop, str) or len(stop)):
        StopStrings(None, stop if isinstance(stop, str) else list(stop))  # generation.stop: non-empty strings


def run_experiment(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """Run the configured method (and vanilla) on the configured prompts; return the summary.

    Lifecycle hooks (every plugin and the run's loggers): ``specpolicy_run_start`` after the
    warm-up, ``specpolicy_round_end`` per verified round and ``specpolicy_prompt_end`` per
    prompt of the speculative method, ``specpolicy_run_end`` after ``summary.json`` is written,
    or ``specpolicy_run_abort`` when the run raises (the error is re-raised).

    Raises:
        ValueError: for invalid configuration values (unknown policy/drafter/verifier/logger
            names included), before any decoding starts.
    """
    _check(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    container = OmegaConf.to_container(cfg, resolve=True)
    runtime = Runtime(device=cfg.runtime.device, dtype=cfg.runtime.dtype, seed=int(cfg.seed))
    pm = get_plugin_manager(block=list(cfg.plugins.block))
    policy = make_policy(pm, container["policy"])  # cheap, validates its keys first
    loggers = make_loggers(pm, container.get("logger"), run_dir)  # validated now, registered for the run below
    reuse = DraftReuse(int(cfg.reuse.min_match)) if cfg.reuse.enabled else None
    verifier = make_verifier(pm, container["verifier"], runtime)
    drafter = make_drafter(pm, container["drafter"], runtime, verifier)
    tokenizer = load_tokenizer(cfg.verifier.model)
    d = cfg.dataset
    prompts = load_prompts(d.name, d.get("path"), int(d.num_prompts), int(d.get("offset", 0)))
    max_new = int(cfg.generation.max_new_tokens)
    method = method_name(cfg)
    baseline = bool(cfg.run.vanilla_baseline)
    sampling = SamplingConfig.from_config(container.get("generation"))
    seed = int(cfg.seed)
    stop = StopStrings.from_config(tokenizer, cfg.generation.get("stop") and list(cfg.generation.stop))
    fingerprint = config_fingerprint(container)  # recorded in each row: resume only what these settings made
    finished = load_finished(results_path(container, run_dir), fingerprint, {p.prompt_id for p in prompts}) \
        if bool(cfg.run.get("resume", False)) else {}
    if finished:
        print(f"resuming {run_dir}: {len(finished)} of {len(prompts)} prompts finished earlier (results.jsonl)")

    # Each call is seeded from (seed, prompt id): sampled outputs do not depend on the prompt
    # order, on which method ran first, or on resuming (specpolicy.sampling.prompt_seed).
    def speculative(ids, on_round=None, prompt_id="") -> GenerationResult:
        runtime.seed_everything(prompt_seed(seed, prompt_id))
        return generate(ids, verifier, runtime, max_new_tokens=max_new, drafter=drafter, policy=policy,
                        reuse=reuse, on_round=on_round, sampling=sampling, stop=stop)

    def vanilla(ids, prompt_id="") -> GenerationResult:
        runtime.seed_everything(prompt_seed(seed, prompt_id))
        return generate(ids, verifier, runtime, max_new_tokens=max_new, sampling=sampling, stop=stop)

    warmup = prompts[: int(cfg.run.warmup_prompts)] if len(finished) < len(prompts) else []
    for prompt in warmup:  # untimed: first-call overheads
        ids = prompt.token_ids(tokenizer)
        speculative(ids)
        if baseline:
            vanilla(ids)

    rows: list[dict[str, Any]] = []  # results.jsonl rows in prompt order (the summary is built from them)
    with interruptible(), registered(pm, loggers):
        try:
            pm.hook.specpolicy_run_start(config=container, run_dir=str(run_dir))
            for i, prompt in enumerate(tqdm(prompts, desc=method, unit="prompt")):
                if prompt.prompt_id in finished:  # resumed: read back, not recomputed
                    rows.append(finished[prompt.prompt_id])
                    continue
                ids = prompt.token_ids(tokenizer)

                def on_round(record, _pid=prompt.prompt_id):
                    pm.hook.specpolicy_round_end(method=method, prompt_id=_pid, record=record)

                van = None
                if baseline and i % 2 == 1:  # alternate the order so drift affects both methods alike
                    van = vanilla(ids, prompt_id=prompt.prompt_id)
                spec = speculative(ids, on_round, prompt_id=prompt.prompt_id)
                if baseline and van is None:
                    van = vanilla(ids, prompt_id=prompt.prompt_id)
                row = _row(prompt.prompt_id, ids.shape[0], spec, van, tokenizer, sampled=not sampling.is_greedy,
                           prompt_text=prompt.text)
                row["config_hash"] = fingerprint
                pm.hook.specpolicy_prompt_end(method=method, prompt_id=prompt.prompt_id, row=row)
                rows.append(row)

            summary = summary_from_rows(method, rows, container, runtime, prompts_total=len(prompts))
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):  # SIGINT / SIGTERM: a summary of the finished prompts
                _write_partial_summary(method, rows, container, runtime, len(prompts), run_dir, error)
            pm.hook.specpolicy_run_abort(error=error, run_dir=str(run_dir))
            raise
        pm.hook.specpolicy_run_end(summary=summary, run_dir=str(run_dir))
    print_summary(summary, wide=bool(cfg.run.get("wide_tables", False)))
    return summary


def _row(prompt_id: str, prompt_tokens: int, spec: GenerationResult, van: GenerationResult | None, tokenizer,
         sampled: bool = False, prompt_text: str | None = None) -> dict:
    """One ``results.jsonl`` line. ``lossless``: output equal to vanilla greedy decoding's; with
    ``sampled`` (temperature > 0) the string ``"n/a (sampling)"`` -- two samples differ legitimately,
    losslessness in distribution is what ``tests/test_sampling.py`` checks. ``prompt_text``: the
    prompt's user message (shown on the trajectory pages of ``specpolicy.plot``)."""
    out_ids = spec.output_ids.tolist()
    row = {
        "prompt_id": prompt_id,
        "prompt_tokens": int(prompt_tokens),
        **({"prompt_text": prompt_text} if prompt_text is not None else {}),
        "output_ids": out_ids,
        "output_text": tokenizer.decode(out_ids, skip_special_tokens=True),
        "generated_tokens": len(out_ids),
        "stop_reason": spec.stop_reason,
        "wall_s": spec.wall_s,
        "prefill_ms": spec.prefill_ms,
        "rounds": [round_to_dict(r) for r in spec.rounds],
    }
    if van is not None:
        diff = None if sampled else first_difference(van.output_ids.tolist(), out_ids)
        row.update(lossless=SAMPLING_LOSSLESS if sampled else diff is None, first_difference=diff,
                   vanilla_wall_s=van.wall_s, vanilla_generated_tokens=int(van.output_ids.shape[0]))
        # vanilla's rounds, compactly (metrics.vanilla_from_row rebuilds them for summaries)
        row.update(vanilla_rounds=len(van.rounds), vanilla_draft_ms=sum(r.draft_ms for r in van.rounds),
                   vanilla_verify_ms=sum(r.verify_ms for r in van.rounds), vanilla_stop_reason=van.stop_reason)
    return row


def summary_from_rows(method: str, rows: list[dict[str, Any]], config: dict[str, Any], runtime: Runtime,
                      prompts_total: int | None = None, interrupted_by: str | None = None) -> dict[str, Any]:
    """``build_summary`` from ``results.jsonl`` rows alone (the speculative method's rounds, and the
    vanilla baseline's compact figures), so a resumed run -- rows read back from disk plus new
    ones -- gets the same summary as an uninterrupted run, timings aside. ``interrupted_by``
    (a signal name) marks the summary ``"partial": true``."""
    vanilla = [v for v in (vanilla_from_row(r) for r in rows) if v is not None]
    summary = build_summary(method, rows, vanilla, rows, config, runtime)
    summary["prompts_total"] = len(rows) if prompts_total is None else prompts_total
    summary["partial"] = interrupted_by is not None
    if interrupted_by is not None:
        summary["interrupted_by"] = interrupted_by
    summary["fields"] = describe_fields(summary)
    return summary


def _write_partial_summary(method, rows, config, runtime, prompts_total, run_dir: Path, error: BaseException) -> None:
    """On SIGINT / SIGTERM: ``summary.json`` of the finished prompts, ``"partial": true``."""
    signame = error.signame if isinstance(error, RunInterrupted) else "SIGINT"
    try:
        with shielded():  # a second Ctrl-C does not cut the summary short
            summary = summary_from_rows(method, list(rows), config, runtime, prompts_total, interrupted_by=signame)
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"\n{signame}: wrote a partial summary of {len(rows)} of {prompts_total} prompts to "
              f"{run_dir / 'summary.json'}; run the same command again to resume")
    except Exception as exc:  # never hide the interrupt behind a summary error
        print(f"\n{signame}: could not write a partial summary: {exc!r}")


def build_summary(method, spec_results, vanilla_results, rows, config, runtime) -> dict[str, Any]:
    """The ``summary.json`` content: headline figures, per-method aggregates, config, runtime, and
    ``sampling`` (the settings; when sampling, ``lossless`` is ``"n/a (sampling)"`` and there is
    no ``lossless_fraction``: token identity with vanilla is not expected); the metric glossary's
    figures (per prompt, token- and prompt-weighted, per position, stop reasons) and ``fields``
    (a description of every field, ``metrics.FIELDS``).

    ``spec_results`` / ``vanilla_results`` are ``GenerationResult`` objects or result dicts
    (``results.jsonl`` rows, ``metrics.vanilla_from_row``), in the order of ``rows``."""
    sampling = SamplingConfig.from_config((config or {}).get("generation"))
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
        summary.update(
            vanilla_tokens_per_s=van["tokens_per_s"],
            speedup_vs_vanilla=spec["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] else 0.0,
        )
        if sampling.is_greedy:
            lossless = [r["lossless"] for r in rows]
            summary.update(
                lossless_fraction=sum(lossless) / len(lossless) if lossless else 1.0,
                not_lossless={r["prompt_id"]: r["first_difference"] for r in rows if not r["lossless"]},
            )
        else:
            summary["lossless"] = SAMPLING_LOSSLESS
    summary["sampling"] = sampling.describe()
    per_prompt = _per_prompt(spec_results, vanilla_results, rows)
    summary.update(
        generated_tokens=spec["generated_tokens"],
        tokens_per_round=spec["tokens_per_round"],
        draft_stop_reasons=spec["draft_stop_reasons"],
        finish_reasons=spec["finish_reasons"],
        acceptance_by_position=spec["acceptance_by_position"],
        aggregates=weighted_aggregates(spec, per_prompt, summary.get("speedup_vs_vanilla")),
        per_prompt=per_prompt,
    )
    extend_summary(summary, spec_results, vanilla_results, rows, config)  # modeled latency (labelled), oracle
    summary["methods"] = methods
    summary["runtime"] = runtime.describe()
    summary["config"] = config
    summary["fields"] = describe_fields(summary)  # the metric glossary, per field
    return summary


def _per_prompt(spec_results, vanilla_results, rows) -> dict[str, dict[str, Any]]:
    """``prompt id -> metrics.prompt_values`` (+ ``stop_reason`` and ``lossless`` from the row);
    vanilla results pair with prompts by position when every prompt has one."""
    vanilla = list(vanilla_results) if len(vanilla_results) == len(spec_results) else [None] * len(spec_results)
    out: dict[str, dict[str, Any]] = {}
    for i, (res, van) in enumerate(zip(spec_results, vanilla)):
        row = rows[i] if i < len(rows) else {}
        values = prompt_values(res, van)
        values["stop_reason"] = row.get("stop_reason", getattr(res, "stop_reason", None))
        if "lossless" in row:
            values["lossless"] = row["lossless"]
        out[str(row.get("prompt_id", i))] = values
    return out
