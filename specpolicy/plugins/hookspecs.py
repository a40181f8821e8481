"""Hook specifications of specpolicy's plugin system (pluggy), and ``PluginEntry``.

Built-in policies, drafters, verifiers and loggers implement these hooks exactly as
third-party plugins do. A third-party package exposes a module in the entry-point group
``specpolicy`` (``[project.entry-points.specpolicy] my_policy = "my_pkg.plugin"``) whose
functions carry ``@specpolicy.hookimpl``.

What a plugin provides it declares once, in ``specpolicy_register``: a list of
``PluginEntry`` (kind, name, factory, optional config validator, one-line description). The
plugin manager (``specpolicy.plugins.manager``) builds the registry ``(kind, name) -> entry``
from every plugin's answer, in registration order: built-ins first, then entry-point plugins,
so an entry-point plugin declaring a built-in's name takes precedence over the built-in.
An entry's validator is called for its config group before any model is loaded
(``specpolicy.run.validation``); its factory builds the run's instance.

The hooks of earlier versions -- ``specpolicy_make_policy``, ``specpolicy_make_drafter``,
``specpolicy_make_verifier``, ``specpolicy_make_logger`` (``firstresult`` factories answering
None for names not their own) and ``specpolicy_validate_config`` -- keep working, deprecated:
a plugin implementing one gets one ``SpecpolicyDeprecationWarning`` line per process.

Lifecycle hooks are called by the run driver (``specpolicy.run.experiment.run_experiment``) on
every registered plugin, including the run's loggers (objects built by a ``logger`` entry's
factory, registered for the duration of one run)::

    run_start -> (round_end* -> prompt_end) per computed prompt -> run_end -> run_outputs
                                                  (or run_abort when the run raises)

Hook implementations may accept any subset of a hook's parameters (pluggy passes them by
name), so a parameter added to a hook later does not break existing implementations; entry
factories and validators are called the same way (see ``PluginEntry``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

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

#: The kinds of entries a plugin registers: the config groups whose choices plugins provide.
KINDS = ("policy", "drafter", "verifier", "logger")
Kind = Literal["policy", "drafter", "verifier", "logger"]

#: The keyword arguments an entry's factory may take, per kind (it takes any subset, by name).
FACTORY_ARGUMENTS = {
    "policy": ("config", "name"),
    "drafter": ("config", "runtime", "verifier", "name"),
    "verifier": ("config", "runtime", "name"),
    "logger": ("config", "run_dir", "name"),
}
#: The keyword arguments an entry's validator may take (any subset, by name).
VALIDATOR_ARGUMENTS = ("config", "run_config", "name")


class SpecpolicyDeprecationWarning(DeprecationWarning):
    """A plugin uses a hook that a later version removes (the ``specpolicy_make_*`` factories and
    ``specpolicy_validate_config``: declare ``PluginEntry`` objects in ``specpolicy_register``)."""


@dataclass(frozen=True)
class PluginEntry:
    """One thing a plugin provides: a choice of the ``policy``, ``drafter``, ``verifier`` or
    ``logger`` config group, as ``specpolicy_register`` returns it.

    Attributes:
        kind: ``"policy"``, ``"drafter"``, ``"verifier"`` or ``"logger"`` (``KINDS``).
        name: the choice's name: ``policy.name`` (``policy=<name>`` selects its config file),
            ``drafter.name``, ``verifier.name``, or a logger's key under ``logger``.
        factory: builds the instance, called with keyword arguments -- any subset of, per kind,
            ``policy``: ``config`` (the ``policy`` node without ``name``, a plain dict) -> a
            ``LengthPolicy``; ``drafter``: ``config``, ``runtime`` (``Runtime``: device, dtype,
            timers), ``verifier`` (the run's target; check the vocabulary against it) -> a
            ``Drafter``; ``verifier``: ``config``, ``runtime`` -> a ``Verifier`` with its
            ``tokenizer`` set; ``logger``: ``config`` (the ``logger.<name>`` node), ``run_dir``
            (str) -> an object whose ``@hookimpl`` methods implement lifecycle hooks. Every kind
            may also take ``name`` (the entry's name). Raises ``ValueError`` naming the key as
            the user writes it (``policy.tau``), the value and the accepted range.
        validate: checks ``config`` BEFORE anything loads, called with keyword arguments --
            any subset of ``config`` (as the factory gets it), ``run_config`` (the whole
            resolved run config, plain dicts, read only; empty when the group is checked alone)
            and ``name``. Returns nothing; raises ``specpolicy.core.errors.ConfigError`` (a
            ``ValueError``) naming the key, the value and the accepted range -- the CLI prints
            that one line, exit status 2. Check every key, unknown ones included (helpers:
            ``specpolicy.core.checks``), and what is cheap about files the config names; never
            load a model. None: a policy is checked by building it (policies are cheap); a
            drafter, verifier or logger only when it is built.
        description: one line saying what it is (``--list-plugins`` prints it).

    Raises:
        ValueError: (when constructed) a kind not in ``KINDS``, an empty name, a factory or
            validator that is not callable, or a description that is not one line.
    """

    kind: Kind
    name: str
    factory: Callable[..., Any]
    validate: Callable[..., None] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"PluginEntry kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"PluginEntry name must be a non-empty string, got {self.name!r}")
        if not callable(self.factory):
            raise ValueError(f"PluginEntry {self.kind} {self.name!r}: factory {self.factory!r} is not callable")
        if self.validate is not None and not callable(self.validate):
            raise ValueError(f"PluginEntry {self.kind} {self.name!r}: validate {self.validate!r} is not callable")
        if not isinstance(self.description, str) or "\n" in self.description.strip():
            raise ValueError(f"PluginEntry {self.kind} {self.name!r}: description must be one line of text")

    @classmethod
    def from_class(cls, kind: Kind, name: str, built: type, description: str = "") -> PluginEntry:
        """The entry of a class built from its config node alone (a policy: ``built(**config)``),
        validated by checking the node's keys against ``built.__init__``'s keyword parameters and
        building it (``specpolicy.core.checks.check_init``; classes that check their own arguments
        and are cheap to build)."""
        label = f"logger.{name}" if kind == "logger" else kind

        def factory(config: dict[str, Any]) -> Any:
            return built(**config)

        def validate(config: dict[str, Any]) -> None:
            from specpolicy.core.checks import check_init

            check_init(label, built, config)

        return cls(kind, name, factory, validate, description)


# -- what a plugin provides ---------------------------------------------------------------------


@hookspec
def specpolicy_register() -> list[PluginEntry]:
    """Declare what this plugin provides.

    :return: the plugin's entries (``PluginEntry``: kind, name, factory, optional validator,
        one-line description), e.g.
        ``[PluginEntry("policy", "entropy", lambda config: EntropyPolicy(**config),
        description="stop drafting once the drafter grows uncertain")]``. Called once per
        registry build (cheap: no model, no I/O); one plugin may declare several entries, each
        (kind, name) once.
    :raises: nothing; an answer that is not a list of ``PluginEntry``, or that declares one
        (kind, name) twice, is a ``specpolicy.core.errors.PluginError`` naming the plugin (one
        line on every command).

    Precedence: a plugin registered later (an entry-point plugin) that declares a (kind, name)
    an earlier one (a built-in) declares takes its place.
    """


# -- deprecated: checks before anything loads (firstresult) ------------------------------------


@hookspec(firstresult=True)
def specpolicy_validate_config(
    group: str, name: str, config: dict[str, Any], run_config: dict[str, Any]
) -> bool | None:
    """Deprecated: give the ``PluginEntry`` a ``validate`` instead. Check the config of a
    plugin's choice BEFORE anything is loaded.

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


# -- deprecated factories (firstresult): declare a PluginEntry instead ---------------------------


@hookspec(firstresult=True)
def specpolicy_make_policy(name: str, config: dict[str, Any]) -> LengthPolicy | None:
    """Deprecated: declare a ``PluginEntry("policy", name, factory)`` in ``specpolicy_register``.
    Build the length policy selected with ``policy=<name>``.

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
    """Deprecated: declare a ``PluginEntry("drafter", name, factory)`` in ``specpolicy_register``.
    Build the drafter selected with ``drafter=<name>``.

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
    """Deprecated: declare a ``PluginEntry("verifier", name, factory)`` in ``specpolicy_register``.
    Build the verifier (the target) selected with ``verifier=<name>``.

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
    """Deprecated: declare a ``PluginEntry("logger", name, factory)`` in ``specpolicy_register``.
    Build a run logger selected by the ``logger`` config group (several may be active).

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
