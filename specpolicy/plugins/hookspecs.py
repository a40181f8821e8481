"""Hook specifications of specpolicy's plugin system (pluggy).

Built-in policies, drafters, verifiers and loggers implement these hooks exactly as
third-party plugins do. A third-party package exposes a module in the entry-point group
``specpolicy`` (``[project.entry-points.specpolicy] my_policy = "my_pkg.plugin"``) whose
functions carry ``@specpolicy.hookimpl``.

``specpolicy_validate_config`` is called for every plugin-owned config group before any model
is loaded (``specpolicy.run.validation``). Factory hooks are ``firstresult``: each implementation
returns an instance when ``name`` is its own and ``None`` otherwise. Implementations are called last-registered first, so an
entry-point plugin providing a built-in's name takes precedence over the built-in.

Lifecycle hooks are called by the run driver (``specpolicy.run.experiment.run_experiment``) on
every registered plugin, including the run's loggers (objects returned by
``specpolicy_make_logger``, registered for the duration of one run)::

    run_start -> (round_end* -> prompt_end) per computed prompt -> run_end -> run_outputs
                                                  (or run_abort when the run raises)

Hook implementations may accept any subset of a hook's parameters (pluggy passes them by
name), so a parameter added to a hook later does not break existing implementations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from specpolicy.analysis.results import PromptResult
    from specpolicy.core.drafter import Drafter
    from specpolicy.core.policy import LengthPolicy
    from specpolicy.core.runtime import Runtime
    from specpolicy.core.types import RoundRecord
    from specpolicy.core.verifier import Verifier

PROJECT_NAME = "specpolicy"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -- checks before anything loads (firstresult) -----------------------------------------------


@hookspec(firstresult=True)
def specpolicy_validate_config(
    group: str, name: str, config: dict[str, Any], run_config: dict[str, Any]
) -> bool | None:
    """Check the config of a plugin's choice BEFORE anything is loaded.

    :param group: ``policy``, ``drafter``, ``verifier`` or ``logger``.
    :param name: the choice (``policy.name``; for a logger, its key under ``logger``).
    :param config: the group's resolved node without ``name`` (for a logger, ``logger.<name>``).
    :param run_config: the whole resolved run config (plain dicts; read only), for checks across
        groups -- e.g. a drafter that reads the target's hidden states checks its checkpoint
        against the target's ``config.json`` (``specpolicy.models.checkpoint.target_config_of``). Empty
        when a group is checked alone.
    :return: True when ``name`` is this plugin's (after checking), None otherwise.
    :raises ValueError: (``specpolicy.core.errors.ConfigError``) naming the key as the user writes it
        (``policy.tau``), the value and the accepted range -- the CLI prints that one line, no
        traceback, exit status 2.

    Check every key, unknown ones included (``specpolicy.run.validation`` has helpers), and anything
    cheap about files the config names (a model directory's weights:
    ``specpolicy.models.loading.check_model_source``); never load a model here. A plugin without this
    hook still works: its policies are checked by building them, its drafters, verifiers and
    loggers only when they are built. Stops at the first non-None result.
    """


# -- factories (firstresult): one instance per run ---------------------------------------------


@hookspec(firstresult=True)
def specpolicy_make_policy(name: str, config: dict[str, Any]) -> LengthPolicy | None:
    """Build the length policy selected with ``policy=<name>``.

    :param name: the policy's name (the ``policy.name`` config key).
    :param config: the resolved ``policy`` config node without its ``name`` key, e.g.
        ``{"n": 10, "tau": 0.45, "n_max": 60}``.
    :return: a ``LengthPolicy``, or ``None`` when ``name`` is not this plugin's. Its
        ``next_length(draft)`` is asked again after every extension of the draft, until it
        answers 0 (k tokens per round: ``max(k - draft.length, 0)``; docs/how-to/write-a-policy.md).
    :raises ValueError: naming ``policy.<key>``, the value and the accepted range for a bad value
        (one that names no key is reported with the key whose value it quotes and the plugin).

    Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def specpolicy_make_drafter(name: str, config: dict[str, Any], runtime: Runtime, verifier: Verifier) -> Drafter | None:
    """Build the drafter selected with ``drafter=<name>``.

    :param name: the drafter's name (the ``drafter.name`` config key).
    :param config: the resolved ``drafter`` config node without its ``name`` key (e.g.
        ``{"model": "dllm-drafter", "block_size": 32, ...}``).
    :param runtime: the run's device, dtype and timers; the drafter's model goes on
        ``runtime.torch_device`` in ``runtime.torch_dtype``.
    :param verifier: the run's target; a drafter with a model checks that its vocabulary matches
        ``verifier.tokenizer`` / ``verifier.vocab_size``.
    :return: a ``Drafter``, or ``None`` when ``name`` is not this plugin's.
    :raises ValueError: naming ``drafter.<key>`` for a bad value or a vocabulary mismatch.

    Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def specpolicy_make_verifier(name: str, config: dict[str, Any], runtime: Runtime) -> Verifier | None:
    """Build the verifier (the target) selected with ``verifier=<name>``.

    :param name: the verifier's name (the ``verifier.name`` config key).
    :param config: the resolved ``verifier`` config node without its ``name`` key (e.g.
        ``{"model": "target", "attn_implementation": "sdpa", "max_context": 0}``).
    :param runtime: the run's device, dtype and timers.
    :return: a ``Verifier`` whose ``tokenizer`` is set (the run encodes prompts with it), or
        ``None`` when ``name`` is not this plugin's.

    Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def specpolicy_make_logger(name: str, config: dict[str, Any], run_dir: str) -> object | None:
    """Build a run logger selected by the ``logger`` config group (several may be active).

    :param name: the logger's name (a key of the ``logger`` config node, e.g. ``jsonl``).
    :param config: the ``logger.<name>`` config node (e.g. ``{"file": "results.jsonl"}``).
    :param run_dir: the run directory (absolute or relative to the working directory).
    :return: an object whose methods carry ``@hookimpl`` and implement lifecycle hooks below
        (registered as a plugin for one run, unregistered after ``run_end`` / ``run_abort``),
        or ``None`` when ``name`` is not this plugin's.
    :raises ValueError: naming ``logger.<name>.<key>`` for a bad value.

    Stops at the first non-None result.
    """


@hookspec
def specpolicy_config_searchpath() -> list[str]:
    """Extra Hydra config search-path entries, so a plugin can ship its own config files
    (``policy/<name>.yaml``, ``logger/<name>.yaml``, ...) and be selected with ``policy=<name>``.

    :return: a LIST of entries -- ``pkg://my_pkg.conf`` (a package holding the files),
        ``file:///abs/dir`` or a plain directory path -- appended after specpolicy's own configs;
        ``["pkg://my_pkg.conf"]``, not ``"pkg://my_pkg.conf"``.
    :raises: nothing; an answer that is not a list of existing packages or directories is a
        ``specpolicy.core.errors.PluginError`` naming the plugin (one line on every command).
    """


# -- lifecycle hooks, called by the run driver ---------------------------------------------


@hookspec
def specpolicy_run_start(config: dict[str, Any], run_dir: str) -> None:
    """Before the first prompt (after the untimed warm-up).

    :param config: the resolved run configuration (plain dicts and lists, as in
        ``summary.json``'s ``config``).
    :param run_dir: the run directory, where ``results.jsonl`` and ``summary.json`` go.
    """


@hookspec
def specpolicy_round_end(method: str, prompt_id: str, record: RoundRecord) -> None:
    """After every verified round of the speculative method. Called inside the timed decoding
    loop: an implementation should only store ``record`` (time spent here counts as the
    method's wall-clock time).

    :param method: the speculative method's name (``<drafter>+<policy>[-<mode>][+reuse]``).
    :param prompt_id: the prompt being decoded.
    :param record: the round (``specpolicy.core.types.RoundRecord``: lengths, drafter passes, ms,
        token ids, ``draft_stop_reason``, ``finish_reason``).
    """


@hookspec
def specpolicy_prompt_end(method: str, prompt_id: str, row: dict[str, Any], result: PromptResult) -> None:
    """After each prompt computed in this invocation (prompts read back on resume are not
    announced again), outside the timed region.

    :param method: the speculative method's name.
    :param prompt_id: the prompt that finished.
    :param row: its ``results.jsonl`` line (``result.to_row()``, JSON-serialisable).
    :param result: the same as objects (``specpolicy.analysis.results.PromptResult``: the speculative and
        vanilla ``GenerationResult``, losslessness, config hash).
    """


@hookspec
def specpolicy_run_end(summary: dict[str, Any], run_dir: str) -> None:
    """After the last prompt, once ``summary.json`` is written.

    :param summary: the summary written to ``<run_dir>/summary.json``
        (``specpolicy.analysis.summary.summarize``; its ``fields`` describe every key).
    :param run_dir: the run directory.
    """


@hookspec
def specpolicy_run_outputs(run_dir: str) -> list[str] | None:
    """After ``run_end``: where this plugin put the run's outputs that are not files of the run
    directory itself, in lines printed under the CLI's ``results:`` line (``specpolicy.run.messages``),
    e.g. the W&B run: its offline directory and the ``wandb sync`` command that uploads it, or its
    URL. The first line starts with a short label and a colon (``"W&B: ..."``).

    :param run_dir: the run directory.
    :return: the lines, or None when the plugin wrote nothing elsewhere.
    """


@hookspec
def specpolicy_run_abort(error: BaseException, run_dir: str) -> None:
    """When the run raises after ``run_start`` (instead of ``run_end``); ``error`` is re-raised
    after the hook. Loggers close their files/runs here.

    :param error: the exception that ends the run (``specpolicy.run.resume.RunInterrupted`` for
        SIGINT / SIGTERM, after a partial ``summary.json`` was written).
    :param run_dir: the run directory.
    """
