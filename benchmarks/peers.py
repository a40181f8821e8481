#!/usr/bin/env python
"""Peer benchmark: specpolicy's methods against Hugging Face generation, in one process, on the
same target, drafters and prompts.

    python benchmarks/peers.py --num-prompts 30 --max-new-tokens 256 --out results.json
    python benchmarks/peers.py --quick --out /tmp/peers.json          # a smoke run (2 prompts)
    python -m specpolicy.analysis.plot peers-runs                              # the paper's figures for it

Methods are ``conf/method/`` presets, by name: the one list of named methods (each preset's
settings, one-line ``method.description`` and calibration ``method.sweep``); the row's name is the
preset's name, as ``python -m specpolicy method=<name>`` prints it. Without ``--method`` the run
measures ``DEFAULT_METHODS`` (the bundled family ``target`` / ``ar-drafter`` / ``dllm-drafter`` ...
by default) beside two kinds of reference rows:

* ``vanilla`` -- our greedy decoding (the reference: speedups and losslessness are against it);
  ``hf-greedy`` -- ``model.generate(do_sample=False)``;
* Hugging Face assisted generation with the AR drafter (``assistant_model=``, settings on the
  assistant's ``generation_config``): ``hf-assisted-k<K>`` (``num_assistant_tokens_schedule=
  "constant"``, no confidence stop; K = the best of ``--hf-k-sweep`` on the calibration
  prompts), ``hf-assisted-heuristic`` (schedule ``"heuristic"``, starting at HF's default 20),
  ``hf-assisted-confidence`` (HF's defaults: 20 tokens, constant, ``assistant_confidence_threshold``
  0.4, adapted by HF's ROC rule when scikit-learn is installed); the persistent schedule state
  is kept per method across prompts, as HF keeps it per assistant model; ``hf-prompt-lookup`` --
  prompt lookup decoding (``prompt_lookup_num_tokens``).

A method whose preset has a ``method.sweep`` (``fastdllm+static-best``: the paper's "Fast-dLLM+",
``dflash+static-best``, ``dflash+failfast-best``, ``eagle3+static-best``, ``eagle3+eagle2-tree-best``,
``dflash+block-tree-best``) runs at the sweep entry with the most tokens/s on the first
``--sweep-prompts`` prompts (the pick: ``calibration`` in the JSON, the row's description). The
``<drafter>+goodput-<profile>`` rows are the cost-aware policy given a hardware profile's costs
(``policy.cost_profile``), compared with every method MODELED under ``--tuned-profile``.

``--method NAME`` (repeated) runs presets by name; ``--method NAME=OVERRIDES`` a one-off: any
installed policy -- a plugin's included -- on one of the bench's drafters, composed and validated
as ``python -m specpolicy`` composes them (``method=<preset>``, ``drafter=<d>``, ``drafter.<key>=``,
``policy=<p>``, ``policy.<key>=<value>``, ``reuse.enabled=true``; the models, prompts and
generation settings are the benchmark's own), e.g.

    python benchmarks/peers.py --method dflash+failfast --method eagle3+eagle2-tree-paper \
        --method mine=drafter=dflash,policy=entropy,policy.n=4 --out compare.json

With ``--method``, only vanilla and those methods run; ``--builtins`` adds the default methods and
Hugging Face's rows. A name that is no preset is one parser error line naming the accepted names,
before any model loads.

Every method runs on every prompt; the order of the methods rotates from prompt to prompt so
machine drift affects all alike (calibration sweeps likewise). Each output is checked against
vanilla greedy. Every method's figures are ``specpolicy.analysis.summary.summarize`` of its results
against vanilla's (the numbers ``summary.json`` and the sweep report give for the same runs):
tokens/s (generated tokens / wall-clock seconds, prefill included, summed over prompts),
speedup over vanilla, acceptance rate, mean accepted / speculated length, rounds, drafter
passes per round, lossless prompts, the MODELED speedup on a GPU profile (``--profile``;
labelled modeled, not measured); plus, here only, the speedup over HF assisted generation's
best and, for methods with a drafter, the fraction of the oracle length policy's speedup
(``specpolicy.analysis.oracle``, exact replay of the drafter, costs fitted on this run); and a second
table, MODELED under ``--tuned-profile``: each drafter method's modeled speedup (the summary's
``modeled.speedup_by_profile``) and its fraction of the oracle whose costs are that profile's
(same replayed match lengths). HF rounds are
recorded by wrapping the candidate generators' ``get_candidates`` /
``update_candidate_strategy`` and hooking the models' forward passes (passes, ms).

Output: ``--out`` JSON (one entry per method, plus calibration, oracle costs and settings),
a printed table, and ``--runs-dir`` (default ``<out stem>-runs``): one directory per method
with ``results.jsonl`` + ``summary.json``, readable by ``python -m specpolicy.analysis.plot`` and
``python -m specpolicy.analysis.report``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from specpolicy.analysis.machine import UNTRUSTED_MARK, UNTRUSTED_NOTE, MachineWatch, warning_line
from specpolicy.analysis.metrics import aggregate
from specpolicy.analysis.oracle import CostModel, compare, oracle_max_length, replay_match_lengths
from specpolicy.analysis.profiling import ForwardTimer
from specpolicy.analysis.results import RESULTS_FILE, SUMMARY_FILE, PromptResult
from specpolicy.analysis.summary import headline, summarize
from specpolicy.analysis.tables import FIGURES, TREE_NOTE, Column, figure_columns, layout, print_table as print_rows
from specpolicy.core.decoding import generate
from specpolicy.core.latency import LatencyProfile, load_profile
from specpolicy.core.reuse import DraftReuse
from specpolicy.core.runtime import Runtime
from specpolicy.core.types import GenerationResult, RoundRecord
from specpolicy.data.datasets import load_prompts
from specpolicy.models.acceptance_head import wire_acceptance
from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning
from specpolicy.plugins.manager import get_plugin_manager, make_drafter, make_policy, make_verifier

warnings.simplefilter("default", SpecpolicyDeprecationWarning)  # shown, as the CLI shows them (one line each)

HF_DEFAULT_ASSISTANT_TOKENS = 20  # transformers GenerationConfig default num_assistant_tokens
HF_DEFAULT_CONFIDENCE = 0.4  # transformers GenerationConfig default assistant_confidence_threshold


@dataclass
class Method:
    """A benchmarked method: ``run(prompt_ids) -> GenerationResult`` (output ids on the CPU);
    ``outcomes`` holds one per prompt, in prompt order."""

    name: str
    family: str  # "ours" | "hf"
    drafter: str | None  # "ar" | "fastdllm" | "suffix" | "dflash" | "eagle3" | None (no drafter / prompt lookup)
    description: str
    run: Callable[[torch.Tensor], GenerationResult]
    outcomes: list[GenerationResult] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # its policy's config node (ours; {} for HF's)


# -- models and our methods ------------------------------------------------------------------


def _conf(group: str, choice: str, drafter: str | None = None) -> dict[str, Any]:
    """The ``group/choice`` config node as the CLI composes it; ``${drafter.name}`` resolves to
    ``drafter`` (e.g. goodput's ``cost_drafter``)."""
    from omegaconf import OmegaConf

    text = (resources.files("specpolicy.conf") / group / f"{choice}.yaml").read_text()
    root = OmegaConf.create(
        {group: OmegaConf.create(text), "drafter": {"name": drafter}}
        if group != "drafter"
        else {group: OmegaConf.create(text)}
    )
    return OmegaConf.to_container(root[group], resolve=True)


#: The drafters a method may run on (the bench's models: ``--ar-drafter`` ...).
BENCH_DRAFTERS = ("ar", "fastdllm", "suffix", "dflash", "eagle3", "easyspec", "dart", "falcon", "deer")

#: The methods a run without ``--method`` measures, in table order: ``conf/method/`` presets, by
#: name (their settings, one-line descriptions and calibration sweeps live there); vanilla and
#: Hugging Face's rows run beside them.
DEFAULT_METHODS = (
    "ar+static-k5",
    "ar+static-k5+reuse",
    "fastdllm+static-k5",
    "fastdllm+static-k5+reuse",
    "fastdllm+static-best",
    "fastdllm+static-best+reuse",
    "fastdllm+failfast",
    "fastdllm+failfast+reuse",
    "fastdllm+specdecpp",
    "fastdllm+specdecpp+reuse",
    "fastdllm+aimd",
    "fastdllm+aimd+reuse",
    "ar+failfast",
    "ar+failfast+reuse",
    "fastdllm+goodput",
    "fastdllm+goodput+reuse",
    "ar+goodput",
    "ar+goodput+reuse",
    "ar+goodput-head",
    "ar+specdecpp",
    "ar+specdecpp-head",
    "ar+specdecpp-tuned",
    "ar+specdecpp-head-tuned",
    "suffix+static-k5",
    "suffix+failfast",
    "suffix+goodput",
    "dflash+static-best",
    "dflash+failfast",
    "dflash+failfast-b15",
    "dflash+failfast-best",
    "dflash+specdecpp",
    "dflash+specdecpp-head",
    "dflash+specdecpp-head-tuned",
    "dflash+failfast-head",
    "dflash+goodput",
    "eagle3+static-best",
    "eagle3+goodput",
    "eagle3+goodput-head",
    "eagle3+specdecpp",
    "eagle3+specdecpp-head",
    "eagle3+specdecpp-tuned",
    "eagle3+specdecpp-head-tuned",
    "eagle3+eagle2-tree-paper",
    "eagle3+eagle2-tree-best",
    "dflash+failfast-tree",
    "dflash+block-tree",
    "dflash+block-tree-best",
    "fastdllm+goodput-a6000-qwen32b",
    "ar+goodput-a6000-qwen32b",
    "dflash+goodput-a6000-qwen32b",
    "eagle3+goodput-a6000-qwen32b",
    "ar+goodput-head-a6000-qwen7b",
    "eagle3+specdecpp-head-a6000-qwen7b",
    "dflash+goodput-head-a6000-qwen7b",
)


def preset_names() -> list[str]:
    """The method presets this install ships (``conf/method/*.yaml``), sorted: the accepted names
    of ``--method NAME``."""
    return sorted(p.name.removesuffix(".yaml") for p in (resources.files("specpolicy.conf") / "method").iterdir())


def preset_aliases() -> dict[str, str]:
    """The deprecated preset names of this install and the preset each names (``method.alias_of``:
    the same configuration under a second name; loadable, one deprecation line each)."""
    folder = resources.files("specpolicy.conf") / "method"
    found = {
        p.name.removesuffix(".yaml"): re.search(r"^  alias_of: (\S+)", p.read_text(), re.M) for p in folder.iterdir()
    }
    return {name: match.group(1) for name, match in sorted(found.items()) if match}


@dataclass
class MethodSpec:
    """A method: a ``conf/method/`` preset (``--method NAME``) or a one-off (``--method
    NAME=OVERRIDES``): its ``name``, the bench ``drafter`` it runs on, its composed ``policy`` node
    (``name`` included, as ``make_policy`` takes it), whether draft ``reuse`` is on, the
    ``overrides`` it was composed from, the ``plugins.block`` list, the ``drafter.KEY=`` settings
    that differ from the drafter's config (``drafter_settings``: the method runs a drafter of its
    own with them, e.g. ``drafter.path_search=cps``, or ``drafter.model=PATH``: another checkpoint
    than the bench's ``--<drafter>-drafter``), the preset's one-line ``description`` (None for a
    one-off) and its calibration ``sweep`` (``method.sweep``: override lists, comma-joined, of
    which a benchmark keeps the fastest on its calibration prompts; empty: none)."""

    name: str
    drafter: str
    policy: dict[str, Any]
    reuse: bool
    overrides: list[str]
    block: list[str] = field(default_factory=list)
    drafter_settings: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    sweep: list[str] = field(default_factory=list)

    @property
    def given(self) -> str:
        """The ``--method`` value that gives this method: its name for a preset, else ``NAME=OVERRIDES``."""
        return self.name if self.overrides == [f"method={self.name}"] else f"{self.name}={','.join(self.overrides)}"

    def variant(self, entry: str, note: str = "calibrated") -> MethodSpec:
        """This method with ``entry`` (``policy.k=8``, comma-joined overrides: a sweep entry) applied,
        under the same name, composed and validated as ``--method`` is; its description says so
        (``<description>; <note>: <entry>``)."""
        spec = parse_method(f"{self.name}={','.join([*self.overrides, entry])}", one_off=False)
        spec.description = f"{(self.description or self.name).rstrip('.')}; {note}: {entry}"
        return spec


def _compose(overrides: list[str]) -> dict[str, Any]:
    """The run config ``python -m specpolicy <overrides>`` composes (plugins' config directories
    included), resolved; Hydra's errors as they come. Composed once per process for the same
    overrides (a Hydra composition takes a fraction of a second)."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict[str, Any]:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from specpolicy.run.hydra_searchpath import register

    register()  # plugins' config directories (policy=<a plugin's policy>)
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def parse_method(text: str, one_off: bool = True) -> MethodSpec:
    """``NAME`` (a ``conf/method/`` preset) or ``NAME=drafter=D[,drafter.KEY=VALUE ...],policy=P[,
    policy.KEY=VALUE ...][,reuse.enabled=true]`` (a one-off; ``method=PRESET`` among the overrides
    starts it from a preset) as a ``MethodSpec``: composed with the run's configs (Hydra, plugin
    config directories included) and the policy validated by its plugin
    (``specpolicy.run.validation``), before any model loads. ``one_off=False``: the overrides may
    be a sweep entry's (``MethodSpec.variant``), no check of their keys.

    Raises:
        argparse.ArgumentTypeError: one line naming what is wrong (a name that is no preset, with
            the accepted names; a bad override, a key or value the policy refuses, a drafter the
            benchmark does not load).
    """
    from specpolicy.core.errors import one_line
    from specpolicy.run.resume import split_overrides
    from specpolicy.run.validation import composition_key_line

    name, sep, rest = text.partition("=")
    overrides = [o.strip() for o in split_overrides(rest) if o.strip()] if sep else [f"method={name}"]
    if not name or name == "vanilla" or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name) or not overrides:
        raise argparse.ArgumentTypeError(
            f"takes NAME (a method preset) or NAME=drafter=D,policy=P[,policy.KEY=VALUE ...] (NAME: letters, "
            f"digits, _ . + -, not vanilla), got {text!r}"
        )
    allowed = re.compile(r"^(drafter|policy|method|\+?\+?(policy|drafter)\.[\w.]+|reuse\.enabled|plugins\.block)=")
    for override in overrides if sep and one_off else []:
        if not allowed.match(override):
            raise argparse.ArgumentTypeError(
                f"{name}: {override!r}: a method sets method=, drafter=, drafter.KEY=, policy=, policy.KEY= and "
                f"reuse.enabled= only (the models, prompts and generation settings are the benchmark's options)"
            )
    try:
        config = _compose(overrides)
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors, in one line
        if not sep and type(exc).__name__ == "MissingConfigException":
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a method preset (conf/method/); accepted: "
                f"{', '.join(n for n in preset_names() if n not in preset_aliases())}; "
                "or a one-off NAME=drafter=D,policy=P[,policy.KEY=VALUE ...]"
            ) from None
        line = composition_key_line(exc, overrides) or (one_line(exc) or (str(exc), 2))[0].removeprefix("error: ")
        raise argparse.ArgumentTypeError(f"{name}: {line}") from None
    return _method_spec(name, config, overrides)


def _method_spec(name: str, config: dict[str, Any], overrides: list[str]) -> MethodSpec:
    """The ``MethodSpec`` of a composed run ``config``, its policy (and drafter settings, if any)
    validated by their plugins."""
    from specpolicy.run.validation import validate_plugin_config, warn_method_alias

    warn_method_alias(config)  # a deprecated preset name: one line naming the one to use
    drafter = str(config["drafter"]["name"])
    if drafter not in BENCH_DRAFTERS:
        raise argparse.ArgumentTypeError(
            f"{name}: drafter={drafter}: the benchmark runs drafters {', '.join(BENCH_DRAFTERS)}"
        )
    policy = dict(config["policy"])
    block = list((config.get("plugins") or {}).get("block") or [])
    try:
        validate_plugin_config(
            get_plugin_manager(block=block),
            "policy",
            str(policy["name"]),
            {k: v for k, v in policy.items() if k != "name"},
            config,
        )
        settings = {k: v for k, v in config["drafter"].items() if _conf("drafter", drafter).get(k) != v}
        if settings:  # the drafter's own check (its n-gram file, ...), before any model loads
            validate_plugin_config(
                get_plugin_manager(block=block),
                "drafter",
                drafter,
                {k: v for k, v in config["drafter"].items() if k != "name"},
                config,
            )
    except ValueError as exc:  # ConfigError: the key, the value, the accepted range
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None
    preset = config.get("method") or {}
    return MethodSpec(
        name,
        drafter,
        policy,
        bool(config["reuse"]["enabled"]),
        overrides,
        block,
        settings,
        preset.get("description") if preset.get("name") == name else None,
        [str(s) for s in preset.get("sweep") or []],
    )


class LazyDrafters(dict):
    """Drafters built on first use (``bench.drafters[name]``), so a benchmark loads only the
    drafters its methods use."""

    def __init__(self, factories: dict[str, Callable[[], Any]]) -> None:
        super().__init__()
        self._factories = factories

    def __missing__(self, name: str):
        self[name] = drafter = self._factories[name]()
        return drafter

    def register(self, name: str, factory: Callable[[], Any]) -> None:
        """Add a drafter under ``name``, built on first use (kept if ``name`` is already known)."""
        self._factories.setdefault(name, factory)


class Bench:
    """Models shared by every method: the target (our verifier and HF's model), the AR drafter
    (ours and HF's assistant), the Fast-dLLM, suffix, DFlash and EAGLE-3 drafters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        compiled = getattr(args, "runtime", "eager") == "compiled"  # runtime.compile (benchmarks/runtime.py)
        self.runtime = Runtime(device=args.device, dtype=args.dtype, seed=0, compile=compiled)
        self.pm = get_plugin_manager(autoload=False)
        self.verifier = make_verifier(self.pm, {**_conf("verifier", "hf"), "model": args.target}, self.runtime)
        self.target = self.verifier.model
        models = {
            "ar": args.ar_drafter,
            "fastdllm": args.dllm_drafter,
            "dflash": getattr(args, "dflash_drafter", "dflash-drafter"),
            "eagle3": getattr(args, "eagle3_drafter", "eagle3-drafter"),
            "easyspec": args.ar_drafter,  # EasySpec's layer-parallel drafting runs the AR drafter
            "dart": getattr(args, "dart_drafter", "dart-drafter"),
            "falcon": getattr(args, "falcon_drafter", "falcon-drafter"),
            "deer": getattr(args, "deer_drafter", "deer-drafter"),
        }

        def factory(name: str, settings: dict[str, Any] | None = None) -> Callable[[], Any]:
            extra = {"model": models[name]} if name in models else {}  # a method's drafter.model wins
            config = {**_conf("drafter", name), **extra, **(settings or {})}
            return lambda: make_drafter(self.pm, config, self.runtime, self.verifier)

        self._drafter_factory = factory
        self.drafters = LazyDrafters({name: factory(name) for name in BENCH_DRAFTERS})
        self.assistant = self.drafters["ar"].model
        self.tokenizer = self.verifier.tokenizer
        self.eos = sorted(self.verifier.eos_token_ids)

    def policy(self, choice: str, drafter: str | None = None, **overrides):
        """Policy ``choice`` as ``policy=<choice>`` composes it with ``drafter=<drafter>``."""
        return make_policy(self.pm, {**_conf("policy", choice, drafter), **overrides})

    def parts(self, spec: MethodSpec, **policy_overrides) -> tuple[Any, Any]:
        """``(drafter, policy)`` of a method (``parse_method``): the bench's drafter (one of its own
        where the method sets ``drafter.KEY``s, shared by the methods with the same ones), loaded now,
        outside any timed call, and a new policy built by the plugin manager as the CLI builds it
        (entry-point plugins included), ``policy_overrides`` set on its config node."""
        policy = make_policy(get_plugin_manager(block=spec.block), {**spec.policy, **policy_overrides})
        key = spec.drafter
        if spec.drafter_settings:  # a drafter of its own settings, shared by the methods with the same ones
            key = spec.drafter + "[" + ",".join(f"{k}={v}" for k, v in sorted(spec.drafter_settings.items())) + "]"
            self.drafters.register(key, self._drafter_factory(spec.drafter, spec.drafter_settings))
        return self.drafters[key], policy

    def wire(self, spec: MethodSpec, policy: Any, model: Any) -> bool:
        """``policy.acceptance=head``: the policy's head loaded for this drafter
        (``wire_acceptance``). Returns whether the drafter must report its hidden states: the shared
        drafter reports them only for the methods that read them (set ``report_hidden`` per run)."""
        settings = dict(_conf("drafter", spec.drafter))
        if getattr(self.args, f"{spec.drafter}_drafter", None):  # the bench's own model of that drafter
            settings["model"] = getattr(self.args, f"{spec.drafter}_drafter")
        return wire_acceptance(policy, model, {**settings, **(spec.drafter_settings or {})})

    def decoder(
        self, spec: MethodSpec, model: Any, policy: Any, hidden: bool
    ) -> Callable[[torch.Tensor], GenerationResult]:
        """A method's decoding of one prompt (``(P,) int64`` ids -> ``GenerationResult``) on the bench's
        target, with ``model`` and ``policy`` (``parts``), the drafter reporting its hidden states when
        ``hidden`` (``wire``), and a new draft reuse per prompt when the method has it."""
        min_match = self.args.reuse_min_match

        def run(ids: torch.Tensor) -> GenerationResult:
            model.report_hidden = hidden
            return generate(
                ids,
                self.verifier,
                self.runtime,
                max_new_tokens=self.args.max_new_tokens,
                drafter=model,
                policy=policy,
                reuse=DraftReuse(min_match) if spec.reuse else None,
            )

        return run

    def added(self, spec: MethodSpec) -> Method:
        """The method ``--method`` configured (``parse_method``): its policy built by the plugin
        manager as the CLI builds it (entry-point plugins included), on the bench's drafter."""
        model, policy = self.parts(spec)
        run = self.decoder(spec, model, policy, self.wire(spec, policy, model))
        shown = (
            repr(policy)
            if type(policy).__repr__ is not object.__repr__
            else "{}({})".format(
                type(policy).__name__, ", ".join(f"{k}={v!r}" for k, v in spec.policy.items() if k != "name")
            )
        ) + (" + draft reuse" if spec.reuse else "")
        description = (
            f"{spec.description} [{shown}]" if spec.description else f"{shown} (--method {','.join(spec.overrides)})"
        )
        return Method(spec.name, "ours", spec.drafter, description, run, policy=dict(spec.policy))

    def vanilla(self) -> Method:
        def run(ids):
            return generate(ids, self.verifier, self.runtime, max_new_tokens=self.args.max_new_tokens)

        return Method("vanilla", "ours", None, "our greedy decoding (reference)", run)

    # -- Hugging Face methods ----------------------------------------------------------------

    def hf(self, name: str, kind: str, description: str, **settings) -> Method:
        """``kind``: ``greedy`` | ``assisted`` (settings: schedule, tokens, threshold) | ``lookup`` (tokens)."""
        state = {"tokens": settings.get("tokens"), "threshold": settings.get("threshold", 0.0)}
        gc = self.assistant.generation_config

        def run(ids):
            kwargs: dict[str, Any] = dict(
                max_new_tokens=self.args.max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                eos_token_id=self.eos,
                pad_token_id=self.eos[0],
                attention_mask=torch.ones(1, ids.shape[0], dtype=torch.long, device=self.runtime.torch_device),
            )
            if kind == "assisted":
                gc.num_assistant_tokens_schedule = settings["schedule"]
                gc.num_assistant_tokens = state["tokens"]
                gc.assistant_confidence_threshold = state["threshold"]
                kwargs["assistant_model"] = self.assistant
            elif kind == "lookup":
                kwargs["prompt_lookup_num_tokens"] = settings["tokens"]
            inputs = ids.to(self.runtime.torch_device)[None]
            with HFRecorder(self.target, self.assistant if kind == "assisted" else None, kind) as rec:
                start = time.perf_counter()
                out = self.target.generate(inputs, **kwargs)
                wall = time.perf_counter() - start
            if kind == "assisted":  # HF keeps these per assistant model across calls; we keep them per method
                state["tokens"], state["threshold"] = gc.num_assistant_tokens, gc.assistant_confidence_threshold
            new = out[0, ids.shape[0] :].cpu()
            finish = "eos" if len(new) and int(new[-1]) in self.eos else "max_new_tokens"
            return GenerationResult(
                output_ids=new, rounds=rec.rounds(len(new), finish), finish_reason=finish, wall_s=wall, prefill_ms=0.0
            )

        return Method(name, "hf", {"assisted": "ar", "lookup": None, "greedy": None}[kind], description, run)


class HFRecorder:
    """Per-round records of one Hugging Face ``generate`` call (batch 1).

    Assisted generation / prompt lookup: ``get_candidates`` gives the round's candidate tokens,
    ``update_candidate_strategy(input_ids, new_logits, n_matches)`` closes the round (target
    tokens = ``new_logits`` argmax, accepted = ``n_matches`` after HF's EOS/length crop);
    drafter passes and ms = assistant forward calls and time in the round, verify ms = target
    forward time. Greedy: one round per target forward call.
    """

    def __init__(self, target, assistant, kind: str) -> None:
        from transformers.generation import candidate_generator as cg

        self.kind = kind
        self.classes = [cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator]
        self.timer = ForwardTimer(on_call=self._on_call, target=target, assistant=assistant)
        self._rounds: list[RoundRecord] = []
        self._candidates: list[int] = []
        self._mark = (0, 0.0, 0.0)  # assistant calls, assistant ms, target ms at the round start
        self._saved: list[tuple[type, str, Any]] = []

    def _close(self, candidates: list[int], target_ids: list[int], accepted: int) -> None:
        calls = self.timer.calls.get("assistant", 0)
        a_ms = self.timer.ms.get("assistant", 0.0)
        t_ms = self.timer.ms["target"]
        self._rounds.append(
            RoundRecord(
                index=len(self._rounds),
                speculation_length=len(candidates),
                accepted_length=accepted,
                emitted_tokens=accepted + 1,
                drafter_forward_passes=calls - self._mark[0],
                reused_tokens=0,
                draft_ms=a_ms - self._mark[1],
                verify_ms=t_ms - self._mark[2],
                draft_token_ids=tuple(candidates),
                target_token_ids=tuple(target_ids),
                draft_stop_reason="vanilla" if self.kind == "greedy" else "",
            )
        )
        self._mark = (calls, a_ms, t_ms)

    def _on_call(self, name: str) -> None:
        if self.kind == "greedy" and name == "target":
            self._close([], [], 0)

    def __enter__(self) -> HFRecorder:
        rec = self
        for cls in self.classes:
            get, upd = cls.get_candidates, cls.update_candidate_strategy

            def get_candidates(gen, input_ids, *args, _get=get, **kwargs):
                out = _get(gen, input_ids, *args, **kwargs)
                rec._candidates = out[0][0, input_ids.shape[1] :].tolist()
                return out

            def update(gen, input_ids, scores, num_matches, _upd=upd):
                n = int(num_matches)
                k = int(scores.shape[1]) - 1
                rec._close(rec._candidates[:k], scores[0].argmax(dim=-1).tolist(), n)
                return _upd(gen, input_ids, scores, num_matches)

            self._saved += [(cls, "get_candidates", get), (cls, "update_candidate_strategy", upd)]
            cls.get_candidates, cls.update_candidate_strategy = get_candidates, update
        self.timer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.__exit__(*exc)
        for cls, attr, fn in self._saved:
            setattr(cls, attr, fn)
        self._saved.clear()

    def rounds(self, generated: int, finish_reason: str) -> tuple[RoundRecord, ...]:
        """The rounds, the last one cut so that the rounds emit exactly ``generated`` tokens and
        marked with why generation ended (``finish_reason``)."""
        rounds, total = [], 0
        for r in self._rounds:
            if total >= generated:
                break
            r = replace(r, emitted_tokens=min(r.emitted_tokens, generated - total))
            total += r.emitted_tokens
            rounds.append(r)
        if rounds:
            rounds[-1] = replace(rounds[-1], finish_reason=finish_reason)
        return tuple(rounds)


# -- running -----------------------------------------------------------------------------------


def run_interleaved(methods: list[Method], prompt_ids: list[torch.Tensor], warmup: int, log=print) -> None:
    """Every method on every prompt; the method order rotates by one per prompt. ``warmup``
    prompts run first through every method, untimed and discarded."""
    for i in range(warmup):
        for m in methods:
            m.run(prompt_ids[i % len(prompt_ids)])
    for i, ids in enumerate(prompt_ids):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for m in order:
            m.outcomes.append(m.run(ids))
        log(f"  prompt {i + 1}/{len(prompt_ids)} done ({len(methods)} methods)")


def summarize_method(
    bench: Bench,
    m: Method,
    vanilla: Method,
    prompts,
    prompt_ids: list[torch.Tensor],
    config: dict[str, Any] | None = None,
    profile: str | None = None,
) -> tuple[list[PromptResult], dict[str, Any]]:
    """Method ``m``'s results (its outcomes paired with vanilla's on the same prompts: speedup,
    losslessness) and their ``summary.json`` (``specpolicy.analysis.summary.summarize``, MODELED with
    ``profile``, default ``--profile``). ``config`` (e.g. drafter / policy / dataset nodes) joins
    the summary's ``config``."""
    results = [
        PromptResult.of(
            p.prompt_id,
            len(ids),
            out,
            van,
            bench.tokenizer.decode(out.output_ids.tolist(), skip_special_tokens=True),
            prompt_text=p.text,
        )
        for p, ids, out, van in zip(prompts, prompt_ids, m.outcomes, vanilla.outcomes)
    ]
    base = {
        "verifier": {"model": bench.args.target},
        "drafter": {"name": m.drafter},  # for_drafter's pass cost
        "benchmark": "benchmarks/peers.py",
        "method": m.name,
        "description": m.description,
        "generation": {"max_new_tokens": bench.args.max_new_tokens},
        "profile": asdict(load_profile(profile or bench.args.profile)),
    }
    return results, summarize(m.name, results, {**base, **(config or {})}, bench.runtime.describe())


def mark_timing(
    summaries: dict[str, tuple[list[PromptResult], dict[str, Any]]], watch: MachineWatch, log=print
) -> dict[str, Any]:
    """The machine's conditions over the interleaved run (``MachineWatch.stop`` on vanilla's
    rows), recorded in every method's summary (``timing_conditions``: the report and figures of
    the written runs mark untrusted timings) and warned about in one line when the measured
    speedups cannot be trusted."""
    conditions = watch.stop(summaries["vanilla"][0])
    for _, summary in summaries.values():
        summary["timing_conditions"] = conditions
    line = warning_line(conditions)
    if line:
        log(line)
    return conditions


def calibrate(bench: Bench, specs: list[MethodSpec], prompt_ids: list[torch.Tensor], hf: bool, log=print):
    """Calibration on ``prompt_ids``, every candidate interleaved: the best constant
    ``num_assistant_tokens`` of HF assisted generation (``--hf-k-sweep``; ``hf`` False: none) and,
    for each method with a ``method.sweep``, the sweep entry with the most tokens/s. Returns the
    calibration record (``prompts``, ``tokens_per_s`` by candidate, ``hf_assisted_k``, and each
    swept method's pick by its name) and ``specs`` with each swept method at its pick."""
    a = bench.args
    hf_runs = {
        k: bench.hf(f"hf-assisted-k{k}", "assisted", "", schedule="constant", tokens=k, threshold=0.0)
        for k in (a.hf_k_sweep if hf else [])
    }
    variants = {s.name: {entry: s.variant(entry) for entry in s.sweep} for s in specs if s.sweep}
    candidates = {
        (name, entry): replace(bench.added(v), name=f"{name}[{entry}]")
        for name, sweep in variants.items()
        for entry, v in sweep.items()
    }
    everything = list(hf_runs.values()) + list(candidates.values())
    run_interleaved(everything, prompt_ids, 0, log)
    tps = {m.name: aggregate(m.outcomes)["tokens_per_s"] for m in everything}
    picks = {name: max(sweep, key=lambda entry, name=name: tps[f"{name}[{entry}]"]) for name, sweep in variants.items()}
    record = {
        "prompts": len(prompt_ids),
        "tokens_per_s": tps,
        "hf_assisted_k": max(hf_runs, key=lambda k: tps[hf_runs[k].name]) if hf_runs else None,
        **picks,
    }
    return record, [variants[s.name][picks[s.name]] if s.name in picks else s for s in specs]


def hf_methods(bench: Bench, best_k: int | None) -> list[Method]:
    """Hugging Face's rows, the references beside ours (not ``conf/method/`` presets: HF's own
    generation, run by its settings): greedy, assisted generation at the calibrated constant
    ``best_k`` (None: not run), with the heuristic schedule and with HF's defaults, prompt lookup."""
    a = bench.args
    rows = [bench.hf("hf-greedy", "greedy", "HF generate, do_sample=False")]
    if best_k is not None:
        rows.append(
            bench.hf(
                f"hf-assisted-k{best_k}",
                "assisted",
                f"HF assisted, constant {best_k} tokens (best of sweep)",
                schedule="constant",
                tokens=best_k,
                threshold=0.0,
            )
        )
    return rows + [
        bench.hf(
            "hf-assisted-heuristic",
            "assisted",
            "HF assisted, heuristic schedule from 20",
            schedule="heuristic",
            tokens=HF_DEFAULT_ASSISTANT_TOKENS,
            threshold=0.0,
        ),
        bench.hf(
            "hf-assisted-confidence",
            "assisted",
            "HF assisted defaults: 20 tokens, confidence stop 0.4",
            schedule="constant",
            tokens=HF_DEFAULT_ASSISTANT_TOKENS,
            threshold=HF_DEFAULT_CONFIDENCE,
        ),
        bench.hf(
            "hf-prompt-lookup", "lookup", f"HF prompt lookup decoding, {a.lookup_tokens} tokens", tokens=a.lookup_tokens
        ),
    ]


def failfast_label(pair) -> str:
    """The method label of FailFast's ``(N, τ)`` (``benchmarks/tune_failfast.py``'s grid)."""
    return "failfast-n{}-t{:g}".format(*pair)


def profile_cost_model(profile: LatencyProfile, fitted: CostModel) -> CostModel:
    """The oracle's cost model with ``profile``'s latencies (as ``specpolicy.core.latency`` models a round:
    passes x ``drafter_pass_ms`` + ``target_ms_per_token`` + ``verify_ms_per_draft_token`` x length)
    and ``fitted``'s passes per drafted token (used only where exact replay passes are missing)."""
    return CostModel(
        draft_ms_per_pass=profile.drafter_pass_ms,
        draft_ms_per_token=0.0,
        passes_base=fitted.passes_base,
        passes_per_token=fitted.passes_per_token,
        verify_ms_base=profile.target_ms_per_token,
        verify_ms_per_token=profile.verify_ms_per_draft_token,
    )


def oracle_fractions(
    bench: Bench,
    methods: list[Method],
    prompts,
    prompt_ids: list[torch.Tensor],
    log=print,
    profile: LatencyProfile | None = None,
) -> dict[str, Any]:
    """Per drafter: exact replay match lengths on the vanilla outputs, a cost model fitted on this
    run's rounds of that drafter (ours) + vanilla steps, and each method's fraction of the oracle
    (``specpolicy.analysis.oracle.compare`` on the prompts where the method is lossless); with ``profile``
    (complete), also each method's fraction of the oracle under that profile's costs
    (``methods_profile``, MODELED)."""
    vanilla = next(m for m in methods if m.name == "vanilla")
    reference = [o.output_ids for o in vanilla.outcomes]
    van_verify = [r.verify_ms for o in vanilla.outcomes for r in o.rounds]
    out: dict[str, Any] = {}
    for drafter in ("ar", "fastdllm", "suffix", "dflash", "eagle3"):
        users = [m for m in methods if m.drafter == drafter]
        if not users:
            continue
        ours = [r for m in users if m.family == "ours" for o in m.outcomes for r in o.rounds]
        cost = CostModel.fit(ours, van_verify)
        max_length = oracle_max_length(r for m in users for o in m.outcomes for r in o.rounds)
        start = time.perf_counter()
        match = [
            replay_match_lengths(bench.drafters[drafter], ids, ref, max_length, bench.verifier)
            for ids, ref in zip(prompt_ids, reference)
        ]
        log(f"  oracle replay of {drafter}: {time.perf_counter() - start:.1f} s")
        out[drafter] = {"cost_model": cost.__dict__, "max_length": max_length, "methods": {}, "methods_profile": {}}
        pcost = profile_cost_model(profile.for_drafter(drafter), cost) if profile is not None else None
        for m in users:
            keep = [i for i, (o, ref) in enumerate(zip(m.outcomes, reference)) if torch.equal(o.output_ids, ref)]
            if not keep:
                continue
            outcomes = {prompts[i].prompt_id: m.outcomes[i] for i in keep}
            res = compare(outcomes, cost, max_length, match=[match[i] for i in keep])
            out[drafter]["methods"][m.name] = res
            out[drafter]["oracle_speedup_modeled"] = res["oracle_speedup_modeled"]
            if pcost is not None:
                res = compare(outcomes, pcost, max_length, match=[match[i] for i in keep])
                out[drafter]["methods_profile"][m.name] = res
                out[drafter]["oracle_speedup_profile"] = res["oracle_speedup_modeled"]
    return out


# -- output ----------------------------------------------------------------------------------

#: The table: the shared figures (``specpolicy.analysis.tables.FIGURES``) and this benchmark's own.
COLUMNS = (
    ("method", "method", "{}"),
    *figure_columns(("tokens_per_s", "speedup_vs_vanilla")),
    ("x HF best", "speedup_vs_hf_assisted_best", "{:.2f}x"),
    *figure_columns(("acceptance_rate",)),
    (f"{FIGURES['mean_accepted_length'].short} / {FIGURES['mean_speculation_length_drafted'].short}", "_lengths", "{}"),
    *figure_columns(("rounds", "drafter_passes_per_round", "lossless")),
    ("oracle fraction (exact replay)", "oracle_fraction", "{:.3f}"),
    *figure_columns(("modeled_speedup_vs_vanilla", "host_ms_per_round", "host_step_share")),
)


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in results["methods"].items():
        m = {
            **m,
            "method": name,
            "_lengths": f"{m['mean_accepted_length']:.2f} / {m['mean_speculation_length_drafted']:.2f}",
        }
        rows.append(["-" if m.get(k) is None else f.format(m[k]) for _, k, f in COLUMNS])
    return rows


def _print_columns(columns, rows: list[list[str]], title: str):
    """Print ``rows`` (formatted cells, one list per method) under ``columns`` ((title, key, format)
    triples; the ``method`` column left-aligned), every column kept; returns the rich console."""
    cols = [Column(head, [r[i] for r in rows], text=key == "method") for i, (head, key, _) in enumerate(columns)]
    kept, widths, _ = layout(cols, None, wide=True)
    return print_rows(kept, widths, title=title)


def print_table(results: dict[str, Any]) -> None:
    """Print the table (every column, ``specpolicy.analysis.tables`` layout) and what its columns mean."""
    s = results["settings"]
    rows = table_rows(results)
    trusted = (results.get("timing_conditions") or {}).get("timing_trusted", True)
    console = _print_columns(
        COLUMNS,
        rows,
        f"peers: {s['num_prompts']} prompts x {s['max_new_tokens']} new "
        f"tokens, {s['device']} {s['dtype']}" + ("" if trusted else f" {UNTRUSTED_MARK} ({UNTRUSTED_NOTE})"),
    )
    hf_best = f"over {results['hf_assisted_best']}" if results.get("hf_assisted_best") else "- (no HF method ran)"
    console.print(
        f"x HF best: {hf_best}; oracle fraction: modeled speedup / the exact "
        f"oracle's (drafter replayed, same drafter, measured costs); MODELED: profile "
        f"{results['modeled_profile']}, not measured",
        markup=False,
    )
    if any(m.get("tree_rounds") for m in results["methods"].values()):  # their figures count tree nodes
        console.print(TREE_NOTE, markup=False)


#: The second table: MODELED under ``--tuned-profile``.
TUNED_COLUMNS = (
    ("method", "method", "{}"),
    ("MODELED speedup (profile)", "modeled_speedup_tuned_profile", "{:.2f}x"),
    ("oracle fraction (profile costs)", "oracle_fraction_tuned_profile", "{:.3f}"),
    *figure_columns(("acceptance_rate",)),
    (f"{FIGURES['mean_accepted_length'].short} / {FIGURES['mean_speculation_length_drafted'].short}", "_lengths", "{}"),
    *figure_columns(("drafter_passes_per_round",)),
)


def tuned_rows(results: dict[str, Any]) -> list[list[str]]:
    """Rows of the MODELED table under the tuned profile: methods with a drafter, best first."""
    rows = []
    for name, m in results["methods"].items():
        if not m.get("drafter"):
            continue
        m = {
            **m,
            "method": name,
            "_lengths": f"{m['mean_accepted_length']:.2f} / {m['mean_speculation_length_drafted']:.2f}",
        }
        rows.append(
            (
                m.get("modeled_speedup_tuned_profile") or 0.0,
                ["-" if m.get(k) is None else f.format(m[k]) for _, k, f in TUNED_COLUMNS],
            )
        )
    return [row for _, row in sorted(rows, key=lambda r: -r[0])]


def print_tuned_table(results: dict[str, Any]) -> None:
    """Print the MODELED table under the tuned profile and what its columns mean."""
    profile = results["tuned_profile"]
    rows = tuned_rows(results)
    console = _print_columns(
        TUNED_COLUMNS, rows, f"MODELED under {profile} (pass counts x the profile's latencies, not measured)"
    )
    given = [n for n, m in results["methods"].items() if m.get("cost_profile") == profile]
    console.print(
        (f"{', '.join(given)}: given that profile's costs; " if given else "")
        + "oracle fraction: the oracle length policy's modeled time / the method's, both with the profile's "
        "costs (same drafter, exact replay)",
        markup=False,
    )


def write_runs(runs_dir: Path, summaries: dict[str, tuple[list[PromptResult], dict[str, Any]]]) -> None:
    """One directory per method but vanilla (``results.jsonl`` + ``summary.json``, as a run of
    ``python -m specpolicy`` writes them) for ``specpolicy.analysis.plot`` and ``specpolicy.analysis.report``."""
    for name, (results, summary) in summaries.items():
        if name == "vanilla":
            continue
        d = runs_dir / re.sub(r"[^A-Za-z0-9_.+-]+", "_", name)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / RESULTS_FILE, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r.to_row()) + "\n" for r in results)
        (d / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/peers.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=30)
    p.add_argument(
        "--offset", type=int, default=0, help="first prompt of the set (skip the rows a calibration or tuning used)"
    )
    p.add_argument("--dataset", default="gsm8k", help="bundled prompt set (gsm8k, math500, aime24, humaneval)")
    p.add_argument("--dataset-path", default=None, help="a JSONL file of prompts instead of the bundled set")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", default="results.json", help="JSON output, one entry per method")
    p.add_argument(
        "--runs-dir", default=None, help="per-method run dirs for specpolicy.analysis.plot (default: <out stem>-runs)"
    )
    add_model_arguments(p)
    p.add_argument("--hf-k-sweep", type=lambda s: [int(x) for x in s.split(",")], default=[3, 5, 8, 12])
    p.add_argument("--sweep-prompts", type=int, default=5, help="calibration prompts for the sweeps")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--reuse-min-match", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per method")
    p.add_argument("--profile", default="a6000-qwen7b", help="latency profile of the MODELED column")
    p.add_argument(
        "--tuned-profile",
        default="a6000-qwen32b",
        help="hardware profile given to goodput-<profile> and of the second, MODELED table",
    )
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle replay")
    p.add_argument("--methods", default=None, help="regex: run only matching methods (vanilla always runs)")
    add_method_argument(
        p,
        "a method by its conf/method/ preset's name (e.g. dflash+failfast), or a one-off "
        "NAME=drafter=D,policy=P,policy.KEY=VALUE,... (any installed policy; method=PRESET starts from a preset); "
        "repeat to compare several; with it only vanilla and these run unless --builtins",
    )
    p.add_argument(
        "--builtins",
        action="store_true",
        help="with --method: run the default methods (DEFAULT_METHODS) and Hugging Face's rows too",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, 24 tokens, sweeps of 2")
    args = p.parse_args(argv)
    if args.quick:  # the methods' sweeps keep their first 2 entries (main)
        args.num_prompts, args.max_new_tokens = min(args.num_prompts, 2), min(args.max_new_tokens, 24)
        args.hf_k_sweep, args.sweep_prompts, args.warmup = [2, 4], 1, 0
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        p.error("--num-prompts and --max-new-tokens must be >= 1")
    try:
        args.pattern = re.compile(args.methods) if args.methods else None
    except re.error as exc:
        p.error(f"--methods={args.methods!r} is not a regular expression: {exc}")
    check_prompt_slice(p, args)  # --offset >= 0 and before the last prompt, a known --dataset
    names = [spec.name for spec in args.method]
    if len(set(names)) < len(names):
        p.error(f"--method: each method needs its own NAME, got {', '.join(names)}")
    try:
        complete = load_profile(args.tuned_profile).complete
    except FileNotFoundError as exc:
        p.error(f"--tuned-profile: {exc}")
    if not complete:
        p.error(f"--tuned-profile must set every latency (not {args.tuned_profile!r}, measured in the run)")
    return args


#: The run's dataset keys as a benchmark's options name them.
OPTION_NAMES = {
    "dataset.offset": "--offset",
    "dataset.num_prompts": "--num-prompts",
    "dataset.path": "--dataset-path",
    "dataset.name": "--dataset",
}


def check_prompt_slice(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Read the prompt slice (``--dataset`` / ``--dataset-path``, ``--num-prompts`` from
    ``--offset``) before any model loads; a bad one ends the program with one parser error line
    naming the option (an unknown set, a missing file, an offset past the last prompt)."""
    try:
        load_prompts(args.dataset, args.dataset_path, args.num_prompts, args.offset)
    except ValueError as exc:
        message = str(exc)
        for key, option in OPTION_NAMES.items():
            message = message.replace(key, option)
        p.error(message)


def add_method_argument(p: argparse.ArgumentParser, help: str) -> None:
    """``--method NAME[=OVERRIDES]``, repeatable, parsed by ``parse_method`` (a preset by name or a
    one-off) into ``args.method`` (a list, empty by default); ``help`` says what the benchmark does
    with the methods."""
    p.add_argument("--method", action="append", type=parse_method, default=[], metavar="NAME[=OVERRIDES]", help=help)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The models and runtime of a benchmark: ``--target``, ``--ar-drafter``, ``--dllm-drafter``,
    ``--dflash-drafter``, ``--eagle3-drafter`` (bundled names or local directories), ``--device``,
    ``--dtype`` and ``--threads`` (torch threads, 0 = torch's default)."""
    p.add_argument("--target", default="target")
    p.add_argument("--ar-drafter", default="ar-drafter")
    p.add_argument("--dllm-drafter", default="dllm-drafter")
    p.add_argument("--dflash-drafter", default="dflash-drafter")
    p.add_argument("--eagle3-drafter", default="eagle3-drafter")
    p.add_argument("--dart-drafter", default="dart-drafter", help="the DART drafter (bundled or a local directory)")
    p.add_argument("--falcon-drafter", default="falcon-drafter", help="the Falcon drafter (bundled or local)")
    p.add_argument("--deer-drafter", default="deer-drafter", help="the DEER drafter (bundled or a checkpoint dir)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--runtime",
        choices=("eager", "compiled"),
        default="eager",
        help="compiled: runtime.compile=true (static KV caches compiled per shape bucket; warm-up before timing)",
    )


def start_benchmark(threads: int) -> Callable[[str], None]:
    """Set torch's thread count (``threads`` > 0; 0 keeps torch's default), silence transformers'
    info logging, and return the progress logger (one line to stderr, flushed)."""
    if threads:
        torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return lambda msg: print(msg, file=sys.stderr, flush=True)


def select_methods(args: argparse.Namespace, log=print) -> list[MethodSpec]:
    """The methods to run, composed and validated before any model loads: ``DEFAULT_METHODS`` (with
    ``--method`` only if ``--builtins``) then the ``--method`` ones, those ``--methods`` matches;
    with ``--quick`` each sweep keeps its first 2 entries.

    Raises:
        SystemExit: a default name that is not a preset of this install (one line).
    """
    builtins = args.builtins or not args.method
    names = [n for n in DEFAULT_METHODS if builtins and (args.pattern is None or args.pattern.search(n))]
    try:
        specs = [parse_method(n) for n in names]
    except argparse.ArgumentTypeError as exc:
        sys.exit(f"benchmarks/peers.py: error: DEFAULT_METHODS: {exc}")
    specs += [s for s in args.method if args.pattern is None or args.pattern.search(s.name)]
    twice = sorted({s.name for s in specs if [x.name for x in specs].count(s.name) > 1})
    if twice:
        sys.exit(f"benchmarks/peers.py: error: --method {twice[0]}: already among the methods (--builtins runs it)")
    for s in specs if args.quick else []:
        s.sweep = s.sweep[:2]
    log(f"{len(specs)} methods composed from conf/method/ and --method")
    return specs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    log = start_benchmark(args.threads)
    specs = select_methods(args, log)
    bench = Bench(args)
    prompts = load_prompts(args.dataset, args.dataset_path, args.num_prompts, args.offset)
    prompt_ids = [p.token_ids(bench.tokenizer) for p in prompts]
    cal: dict[str, Any] | None = None
    hf = args.builtins or not args.method  # Hugging Face's rows beside the default methods
    hf_best = hf and any(args.pattern is None or args.pattern.search(f"hf-assisted-k{k}") for k in args.hf_k_sweep)
    if hf_best or any(s.sweep for s in specs):
        log(f"calibration on {min(args.sweep_prompts, len(prompt_ids))} prompts ...")
        cal, specs = calibrate(bench, specs, prompt_ids[: args.sweep_prompts], hf_best, log)
        picks = {k: v for k, v in cal.items() if k not in ("prompts", "tokens_per_s") and v is not None}
        log("  picked: " + "; ".join(f"{k}: {v}" for k, v in picks.items()))
    methods = [bench.vanilla()]
    if hf:
        rows = hf_methods(bench, cal["hf_assisted_k"] if cal else None)
        methods += [m for m in rows if args.pattern is None or args.pattern.search(m.name)]
    methods += [bench.added(spec) for spec in specs]
    log(f"{len(methods)} methods x {len(prompt_ids)} prompts ...")
    start = time.perf_counter()
    watch = MachineWatch()  # was the machine busy while it measured? (specpolicy.analysis.machine)
    watch.start()
    run_interleaved(methods, prompt_ids, args.warmup, log)
    elapsed = time.perf_counter() - start
    vanilla = next(m for m in methods if m.name == "vanilla")
    summaries = {m.name: summarize_method(bench, m, vanilla, prompts, prompt_ids) for m in methods}
    conditions = mark_timing(summaries, watch, log)
    profile = load_profile(args.profile)
    tuned = load_profile(args.tuned_profile)  # MODELED comparison under the hardware goodput-<profile> was given
    stats = {}
    for m in methods:
        summary = summaries[m.name][1]
        own = summary["methods"][m.name]
        stats[m.name] = {
            "family": m.family,
            "drafter": m.drafter,
            "description": m.description,
            **({"cost_profile": m.policy["cost_profile"]} if m.policy.get("cost_profile") else {}),
            **headline(summary),
            **{k: own[k] for k in ("generated_tokens", "wall_s", "drafter_forward_passes", "draft_ms", "verify_ms")},
            "host_ms": own.get("host_ms"),  # outside the model passes (RoundRecord.host_ms), summed; None: HF's rows
            "host_step_profile": summary.get("host_step_profile"),
            "not_lossless": summary.get("not_lossless", {}),
            "modeled_speedup_tuned_profile": (summary.get("modeled") or {})
            .get("speedup_by_profile", {})
            .get(tuned.name),
        }
    hf_assisted = {n: s["tokens_per_s"] for n, s in stats.items() if n.startswith("hf-assisted")}
    hf_best = max(hf_assisted, key=hf_assisted.get) if hf_assisted else None
    for s in stats.values():
        s["speedup_vs_hf_assisted_best"] = s["tokens_per_s"] / hf_assisted[hf_best] if hf_best else None
    oracle = {}
    if not args.no_oracle:
        log("oracle ...")
        oracle = oracle_fractions(bench, methods, prompts, prompt_ids, log, tuned)
        for block in oracle.values():
            for name, res in block["methods"].items():
                stats[name]["oracle_fraction"] = res["fraction_of_oracle"]
                stats[name]["oracle_fraction_by_prompt"] = {
                    p["prompt_id"]: p["fraction_of_oracle"] for p in res["per_prompt"]
                }
                stats[name]["oracle_speedup_modeled"] = res["oracle_speedup_modeled"]
            for name, res in block.pop("methods_profile", {}).items():
                stats[name]["oracle_fraction_tuned_profile"] = res["fraction_of_oracle"]
    results = {
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("method", "pattern")},
            **({"method": [m.given for m in args.method]} if args.method else {}),
            "device": str(bench.runtime.torch_device),
            "dtype": str(bench.runtime.torch_dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "benchmark_s": elapsed,
            "prompt_ids": [p.prompt_id for p in prompts],
        },
        "timing_conditions": conditions,
        "calibration": cal,
        "hf_assisted_best": hf_best,
        "fast_dllm_plus": "fastdllm+static-best" if "fastdllm+static-best" in stats else None,
        "modeled_profile": profile.name,
        "tuned_profile": tuned.name,
        "modeled_label": "MODELED (forward-pass counts x profile latencies), not measured",
        "methods": stats,
        "oracle": {d: {k: v for k, v in b.items() if k != "methods"} for d, b in oracle.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    runs_dir = Path(args.runs_dir) if args.runs_dir else out.with_name(out.stem + "-runs")
    write_runs(runs_dir, summaries)
    print_table(results)
    print_tuned_table(results)
    log(f"wrote {out} and {runs_dir}/ (python -m specpolicy.analysis.plot {runs_dir})")
    return results


if __name__ == "__main__":
    main()
