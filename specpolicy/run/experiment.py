"""One experiment: a drafter + policy (and the vanilla baseline) over a prompt set.

Writes ``summary.json`` in the run directory and prints a table per method; the run's
loggers (plugins selected by the ``logger`` config group) receive the lifecycle hooks: the
default ``jsonl`` logger writes ``results.jsonl`` (one line per prompt, appended as each
prompt finishes), ``wandb`` tracks the run in Weights & Biases.

Each prompt's outcome is a ``specpolicy.analysis.results.PromptResult`` (speculative and vanilla
``GenerationResult``); its row goes to the loggers, and the summary is computed from the
results by ``specpolicy.analysis.summary.summarize`` (the one place every summary number comes from).
Runs are resumable (``specpolicy.run.resume``): with ``run.resume: true`` (default) the prompts
already in the run directory's ``results.jsonl`` are read back instead of recomputed, so a
resumed run's summary equals an uninterrupted run's except for timings; a run with nothing left to
compute loads no model (``specpolicy.run.resume.complete_summary``: it says so and returns the stored
summary). SIGINT / SIGTERM write a partial summary (``"partial": true``) and raise ``RunInterrupted``.

Safety: every config value is checked before any model is loaded (``specpolicy.run.validation``);
one process per run directory (``specpolicy.run.runlock``); a prompt too long for the context is
skipped and recorded, never decoded (``specpolicy.run.skips``); the summary records what the machine
was doing (``timing_conditions``, ``specpolicy.analysis.machine``) and warns when the speedup cannot be
trusted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specpolicy.analysis.machine import MachineWatch, warning_line
from specpolicy.analysis.results import SUMMARY_FILE, PromptResult
from specpolicy.analysis.summary import summarize
from specpolicy.analysis.tables import print_summary
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.stopping import StopStrings, config_strings, never_matching
from specpolicy.models.acceptance_head import wire_acceptance
from specpolicy.models.memory import peak_memory
from specpolicy.plugins.manager import (
    blame,
    call_each,
    get_plugin_manager,
    make_drafter,
    make_loggers,
    make_policy,
    make_verifier,
    registered,
)
from specpolicy.run.messages import shown
from specpolicy.run.resume import (
    RunInterrupted,
    complete_line,
    complete_summary,
    config_fingerprint,
    interruptible,
    load_finished,
    results_path,
    shielded,
)
from specpolicy.run.runlock import RunLock
from specpolicy.run.setup import PromptPlan, RunSetup
from specpolicy.run.skips import max_new_tokens_line, over_context, skipped_line
from specpolicy.run.validation import validate_config


def method_name(cfg: DictConfig) -> str:
    """The label of the speculative method in tables and ``summary.json``: the ``method=`` preset's
    name (``method.name``, the file ``conf/method/<name>.yaml``; overrides given beside it keep the
    name, the run directory names them); without a preset ``<drafter>+<policy>[-<mode>][+reuse]``
    (a policy ``mode`` other than the policy's name is shown, e.g. ``ar+aimd-heuristic``)."""
    preset = cfg.get("method")
    name = preset.get("name") if hasattr(preset, "get") else preset  # a preset's node, or a bare name
    if name:
        return str(name)
    mode = cfg.policy.get("mode")
    policy = cfg.policy.name + (f"-{mode}" if mode and mode != cfg.policy.name else "")
    return f"{cfg.drafter.name}+{policy}" + ("+reuse" if cfg.reuse.enabled else "")


def run_experiment(cfg: DictConfig, run_dir: str | Path, outputs: list[str] | None = None) -> dict[str, Any]:
    """Run the configured method (and vanilla) on the configured prompts; return the summary. With
    ``run.resume`` on and every prompt already in the run directory's ``results.jsonl``, nothing
    is loaded or timed: one line says the run is complete and its summary is returned
    (``specpolicy.run.resume.complete_summary``).

    Lifecycle hooks (every plugin and the run's loggers): ``specpolicy_run_start`` after the
    warm-up, ``specpolicy_round_end`` per verified round and ``specpolicy_prompt_end`` per
    prompt of the speculative method, ``specpolicy_run_end`` after ``summary.json`` is written,
    then ``specpolicy_run_outputs`` (its lines are appended to ``outputs`` when given: where a
    logger put the run outside its directory, e.g. the W&B run), or ``specpolicy_run_abort`` when
    the run raises (every plugin's abort hook is called; one that fails is reported in one line
    and the run's own error is re-raised).

    Raises:
        ConfigError (a ValueError): for any invalid configuration value (unknown
            policy/drafter/verifier/logger names and bad prompt files included), before any
            model is loaded.
        RunLocked: when another live process runs in ``run_dir``.
    An error raised inside a plugin carries a ``PluginBlame`` naming it (``plugins.blame``).
    """
    container = OmegaConf.to_container(cfg, resolve=True)
    pm = get_plugin_manager(block=list(cfg.plugins.block))
    prompts = validate_config(container, pm)  # every value, before any model is loaded (ConfigError)
    generation = container.get("generation") or {}
    if generation.get("stop"):  # escapes decoded: what is matched, recorded and hashed (\n typed is a newline)
        generation["stop"] = config_strings(list(generation["stop"]))
    run_dir = Path(run_dir)
    with RunLock(run_dir) as lock:  # one process per run directory (RunLocked names the holder)
        if lock.taken_over:
            print(lock.taken_over)
        try:
            done = complete_summary(
                container,
                [p.prompt_id for p in prompts],
                method_name(cfg),
                run_dir,
                lambda: Runtime.from_config(container.get("runtime") or {}, seed=int(cfg.seed)).describe(),
            )
            if done is not None:  # resumed with nothing left to compute: no model is loaded
                print(complete_line(done, shown(run_dir)))
                print_results(done, run_dir, wide=bool(cfg.run.get("wide_tables", False)), warn=False)  # as stored
                return done
            return _run(cfg, container, pm, prompts, run_dir, outputs)
        except BaseException as error:
            blame(error, pm)  # an error raised in a plugin names it (the CLI prints one line)
            raise


def _load(cfg: DictConfig, container: dict[str, Any], pm, run_dir: Path) -> tuple[RunSetup, dict[str, Any]]:
    """The runtime, the method's models and settings (``RunSetup``), and the run's loggers (made
    before any model loads, registered for the run by the caller)."""
    runtime = Runtime.from_config(container.get("runtime") or {}, seed=int(cfg.seed))  # compile settings too
    policy = make_policy(pm, container["policy"])
    loggers = make_loggers(pm, container.get("logger"), run_dir)
    reuse = DraftReuse(int(cfg.reuse.min_match)) if cfg.reuse.enabled else None
    verifier = make_verifier(pm, container["verifier"], runtime)
    drafter = make_drafter(pm, container["drafter"], runtime, verifier)
    wire_acceptance(
        policy, drafter, container["drafter"]
    )  # policy.acceptance=head: its head, the drafter's hidden states
    if runtime.compile:  # compilation happened while the models were built: reported apart from tokens/s
        print(
            f"compiled runtime: warm-up {runtime.warmup_s:.1f} s (the models' compilation; summary.json runtime.warmup_s)"
        )
    tokenizer = verifier.tokenizer  # the target's: prompts are encoded and outputs decoded with it
    if tokenizer is None:
        raise ValueError(
            f"verifier {container['verifier'].get('name')!r} has no tokenizer: a run needs "
            f"verifier.tokenizer to encode the prompts"
        )
    stop_strings = (container.get("generation") or {}).get("stop")  # escapes decoded in run_experiment
    for line in never_matching(tokenizer, stop_strings or []):
        print(f"warning: {line}", file=sys.stderr)
    setup = RunSetup(
        method=method_name(cfg),
        runtime=runtime,
        verifier=verifier,
        drafter=drafter,
        policy=policy,
        reuse=reuse,
        stop=StopStrings(tokenizer, stop_strings) if stop_strings else None,
        sampling=SamplingConfig.from_config(container.get("generation")),
        max_new_tokens=int(cfg.generation.max_new_tokens),
        seed=int(cfg.seed),
        tokenizer=tokenizer,
        fingerprint=config_fingerprint(container),
    )
    return setup, loggers


def _plan(cfg: DictConfig, container: dict[str, Any], setup: RunSetup, prompts: list, run_dir: Path) -> PromptPlan:
    """Encode the prompts; which are too long (skipped, reported before decoding), which an earlier
    run finished (``run.resume``), how many warm up."""
    token_ids = {p.prompt_id: p.token_ids(setup.tokenizer) for p in prompts}
    too_long = over_context(prompts, token_ids, setup.verifier, setup.drafter)
    too_many = max_new_tokens_line(
        setup.max_new_tokens,
        [int(token_ids[p.prompt_id].shape[0]) for p in prompts if p.prompt_id not in too_long],
        setup.verifier,
        setup.drafter,
    )
    if too_many:  # generation ends at the context instead: a warning, nothing is lost
        print(f"warning: {too_many}", file=sys.stderr)
    finished = (
        load_finished(results_path(container, run_dir), setup.fingerprint, {p.prompt_id for p in prompts})
        if bool(cfg.run.get("resume", False))
        else {}
    )
    if finished:
        print(f"resuming {run_dir}: {len(finished)} of {len(prompts)} prompts finished earlier (results.jsonl)")
    warmup = int(cfg.run.warmup_prompts) if len(finished) < len(prompts) else 0
    return PromptPlan(prompts, token_ids, finished, too_long, warmup)


def _progress(method: str, done: int, total: int, result: PromptResult) -> None:
    """One line per prompt on stderr, whatever the terminal: a long run shows it is alive."""
    spec = result.speculative
    line = f"[{method}] prompt {done}/{total} {result.prompt_id}: "
    if result.skipped:
        line += f"skipped ({result.skipped})"
    else:
        tokens = int(spec.output_ids.shape[0])
        line += f"{tokens} tokens in {spec.wall_s:.2f} s, {len(spec.rounds)} rounds"
        if result.vanilla is not None and spec.wall_s > 0:
            line += f", {result.vanilla.wall_s / spec.wall_s:.2f}x vanilla"
    print(line, file=sys.stderr, flush=True)


def _decode_one_by_one(setup: RunSetup, plan: PromptPlan, pm, baseline: bool, results: list[PromptResult]) -> None:
    """Every prompt at batch 1 (speculative and, with ``baseline``, vanilla, alternating which goes
    first so drift affects both alike), each appended to ``results`` as it finishes (an interrupt
    leaves the finished ones there for the partial summary); a finished prompt is read back, a too
    long one recorded."""
    method = setup.method
    for i, prompt in enumerate(plan.prompts):
        pid = prompt.prompt_id
        if pid in plan.finished:  # resumed: read back, not recomputed
            results.append(plan.finished[pid])
            continue
        ids = plan.token_ids[pid]
        if pid in plan.too_long:  # recorded, never decoded (a resume reads it back)
            result = PromptResult.skip(
                pid, ids.shape[0], plan.too_long[pid], config_hash=setup.fingerprint, prompt_text=prompt.text
            )
        else:

            def on_round(record, _pid=pid):
                pm.hook.specpolicy_round_end(method=method, prompt_id=_pid, record=record)

            van = setup.decode(ids, False, pid) if baseline and i % 2 == 1 else None
            spec = setup.decode(ids, True, pid, on_round)
            if baseline and van is None:
                van = setup.decode(ids, False, pid)
            result = PromptResult.of(
                pid,
                ids.shape[0],
                spec,
                van,
                setup.tokenizer.decode(spec.output_ids.tolist(), skip_special_tokens=True),
                sampled=not setup.sampling.is_greedy,
                config_hash=setup.fingerprint,
                prompt_text=prompt.text,
            )
            result = setup.with_parting(result, ids)  # after decoding: a parting's margins, untimed
        pm.hook.specpolicy_prompt_end(method=method, prompt_id=pid, row=result.to_row(), result=result)
        results.append(result)
        _progress(method, i + 1, len(plan.prompts), result)


def _run(
    cfg: DictConfig, container: dict[str, Any], pm, prompts: list, run_dir: Path, outputs: list[str] | None = None
) -> dict[str, Any]:
    setup, loggers = _load(cfg, container, pm, run_dir)
    plan = _plan(cfg, container, setup, prompts, run_dir)
    baseline = bool(cfg.run.vanilla_baseline)
    batch_size = int(container["generation"].get("batch_size", 1))
    if batch_size == 1:
        decodable = [p for p in prompts if p.prompt_id not in plan.too_long]
        for prompt in decodable[: plan.warmup]:  # untimed: first-call overheads
            setup.decode(plan.token_ids[prompt.prompt_id], True)
            if baseline:
                setup.decode(plan.token_ids[prompt.prompt_id], False)
    serving: dict[str, Any] | None = None  # the batched loop's throughput and latency (batch_size > 1)
    results: list[PromptResult] = []  # in prompt order (the summary is computed from them)
    watch = MachineWatch()  # load and CPU time around the timed prompts (timing_conditions)
    runtime = setup.runtime
    with interruptible(), registered(pm, loggers):
        try:
            pm.hook.specpolicy_run_start(config=container, run_dir=str(run_dir))
            watch.start()
            if batch_size > 1:  # many requests at once (the batched loop warms up its own way)
                from specpolicy.run.batch_experiment import run_batched

                results, serving = run_batched(setup, plan, container, pm)
            else:
                _decode_one_by_one(setup, plan, pm, baseline, results)
            summary = summarize(
                setup.method,
                results,
                container,
                runtime.describe(),
                prompts_total=len(prompts),
                timing_conditions=watch.stop(results),
                peak_memory=peak_memory(runtime.torch_device),  # CPU peak RSS, CUDA max allocated
            )
            if serving is not None:
                summary["serving"] = serving
            (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt):  # SIGINT / SIGTERM: a summary of the finished prompts
                _write_partial_summary(setup.method, results, container, runtime, len(prompts), run_dir, error, watch)
            # Every plugin's abort hook runs; one that fails (e.g. disk full) is reported in one line and
            # never replaces the run's own error, which is re-raised.
            for plugin, hook_error in call_each(pm, "specpolicy_run_abort", error=error, run_dir=str(run_dir)):
                print(
                    f"warning: {plugin} failed while the run was aborting: {type(hook_error).__name__}: {hook_error}",
                    file=sys.stderr,
                )
            raise
        pm.hook.specpolicy_run_end(summary=summary, run_dir=str(run_dir))
        elsewhere = [
            line for lines in reversed(pm.hook.specpolicy_run_outputs(run_dir=str(run_dir))) for line in lines or ()
        ]  # pluggy calls the last registered first: back to run order
        if outputs is not None:
            outputs.extend(elsewhere)
    print_results(summary, run_dir, wide=bool(cfg.run.get("wide_tables", False)))
    return summary


def print_results(summary: dict[str, Any], run_dir: str | Path, wide: bool = False, warn: bool = True) -> None:
    """What a run prints at its end, from its summary: the summary table
    (``specpolicy.analysis.tables.print_summary``), the serving table of a batched run, the
    skipped prompts and (``warn``) a warning when its timings cannot be trusted. A run with
    nothing left to compute prints the same from the summary it stored (its ``complete_line``
    already says whether its timings could be trusted)."""
    print_summary(summary, wide=wide, run_dir=shown(run_dir))
    if summary.get("serving") is not None:
        from specpolicy.run.batch_experiment import print_serving

        print_serving(summary["serving"])
    for line in (skipped_line(summary), warning_line(summary.get("timing_conditions")) if warn else None):
        if line:
            print(line)


def _write_partial_summary(
    method: str,
    results: list[PromptResult],
    config: dict[str, Any],
    runtime: Runtime,
    prompts_total: int,
    run_dir: Path,
    error: BaseException,
    watch: MachineWatch | None = None,
) -> None:
    """On SIGINT / SIGTERM: ``summary.json`` of the finished prompts, ``"partial": true``, with the
    ``timing_conditions`` of the span they were timed in (when ``watch`` was started)."""
    signame = error.signame if isinstance(error, RunInterrupted) else "SIGINT"
    try:
        with shielded():  # a second Ctrl-C does not cut the summary short
            conditions = watch.stop(results) if watch is not None and watch.started else None
            summary = summarize(
                method,
                list(results),
                config,
                runtime.describe(),
                prompts_total,
                interrupted_by=signame,
                timing_conditions=conditions,
                peak_memory=peak_memory(runtime.torch_device),
            )
            (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        print(
            f"\n{signame}: wrote a partial summary of {len(results)} of {prompts_total} prompts to "
            f"{run_dir / 'summary.json'}; run the same command again to resume"
        )
    except Exception as exc:  # never hide the interrupt behind a summary error
        print(f"\n{signame}: could not write a partial summary: {exc!r}")
