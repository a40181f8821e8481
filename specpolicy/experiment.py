"""One experiment: a drafter + policy (and the vanilla baseline) over a prompt set.

Writes ``summary.json`` in the run directory and prints a table per method; the run's
loggers (plugins selected by the ``logger`` config group) receive the lifecycle hooks: the
default ``jsonl`` logger writes ``results.jsonl`` (one line per prompt, appended as each
prompt finishes), ``wandb`` tracks the run in Weights & Biases.

Each prompt's outcome is a ``specpolicy.results.PromptResult`` (speculative and vanilla
``GenerationResult``); its row goes to the loggers, and the summary is computed from the
results by ``specpolicy.summary.summarize`` (the one place every summary number comes from).
Runs are resumable (``specpolicy.resume``): with ``run.resume: true`` (default) the prompts
already in the run directory's ``results.jsonl`` are read back instead of recomputed, so a
resumed run's summary equals an uninterrupted run's except for timings. SIGINT / SIGTERM write
a partial summary (``"partial": true``) and raise ``RunInterrupted``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specpolicy.datasets import load_prompts
from specpolicy.decoding import generate
from specpolicy.plugins import get_plugin_manager, make_drafter, make_loggers, make_policy, make_verifier, registered
from specpolicy.results import SUMMARY_FILE, PromptResult
from specpolicy.resume import RunInterrupted, config_fingerprint, interruptible, load_finished, results_path, shielded
from specpolicy.reuse import DraftReuse
from specpolicy.runtime import Runtime
from specpolicy.sampling import SamplingConfig, prompt_seed
from specpolicy.stopping import StopStrings
from specpolicy.summary import profile_from, summarize
from specpolicy.tables import print_summary
from specpolicy.types import GenerationResult


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
    tokenizer = verifier.tokenizer  # the target's: prompts are encoded and outputs decoded with it
    if tokenizer is None:
        raise ValueError(f"verifier {container['verifier'].get('name')!r} has no tokenizer: a run needs "
                         f"verifier.tokenizer to encode the prompts")
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

    results: list[PromptResult] = []  # in prompt order (the summary is computed from them)
    with interruptible(), registered(pm, loggers):
        try:
            pm.hook.specpolicy_run_start(config=container, run_dir=str(run_dir))
            for i, prompt in enumerate(tqdm(prompts, desc=method, unit="prompt")):
                if prompt.prompt_id in finished:  # resumed: read back, not recomputed
                    results.append(finished[prompt.prompt_id])
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
                result = PromptResult.of(prompt.prompt_id, ids.shape[0], spec, van,
                                         tokenizer.decode(spec.output_ids.tolist(), skip_special_tokens=True),
                                         sampled=not sampling.is_greedy, config_hash=fingerprint,
                                         prompt_text=prompt.text)
                pm.hook.specpolicy_prompt_end(method=method, prompt_id=prompt.prompt_id, row=result.to_row(),
                                              result=result)
                results.append(result)

            summary = summarize(method, results, container, runtime.describe(), prompts_total=len(prompts))
            (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):  # SIGINT / SIGTERM: a summary of the finished prompts
                _write_partial_summary(method, results, container, runtime, len(prompts), run_dir, error)
            pm.hook.specpolicy_run_abort(error=error, run_dir=str(run_dir))
            raise
        pm.hook.specpolicy_run_end(summary=summary, run_dir=str(run_dir))
    print_summary(summary, wide=bool(cfg.run.get("wide_tables", False)))
    return summary


def _write_partial_summary(method: str, results: list[PromptResult], config: dict[str, Any], runtime: Runtime,
                           prompts_total: int, run_dir: Path, error: BaseException) -> None:
    """On SIGINT / SIGTERM: ``summary.json`` of the finished prompts, ``"partial": true``."""
    signame = error.signame if isinstance(error, RunInterrupted) else "SIGINT"
    try:
        with shielded():  # a second Ctrl-C does not cut the summary short
            summary = summarize(method, list(results), config, runtime.describe(), prompts_total,
                                interrupted_by=signame)
            (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        print(f"\n{signame}: wrote a partial summary of {len(results)} of {prompts_total} prompts to "
              f"{run_dir / 'summary.json'}; run the same command again to resume")
    except Exception as exc:  # never hide the interrupt behind a summary error
        print(f"\n{signame}: could not write a partial summary: {exc!r}")


