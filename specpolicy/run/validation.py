"""Validate before loading: every config value is checked before any model is loaded.

``validate_config(cfg, pm)`` runs first in ``specpolicy.run.experiment.run_experiment``:

* the groups that plugins own -- ``policy``, ``drafter``, ``verifier`` and each ``logger`` --
  through the validator of the plugin entry that provides the choice (``PluginEntry.validate``,
  ``specpolicy.plugins.manager.validate``; built-ins declare theirs like any third-party
  plugin). A policy whose entry has no validator is checked by building it (policies are cheap);
  a name no plugin declares is an error (unless a plugin with a deprecated factory hook and no
  validate hook might build it);
* the groups the core owns: ``generation``, ``run``, ``reuse``, ``runtime``, ``seed``,
  ``profile`` and ``dataset`` (the prompt file is read here: every bad row is reported with
  ``file:line``, ``specpolicy.data.datasets``).

``specpolicy.run.preflight`` runs ``validate_config`` on every job of a sweep before the first is launched.

Every failure is a ``ConfigError`` whose message names the key, the value and the accepted
range. The small checkers (``integer``, ``number``, ``choice``, ``boolean``, ``check_keys``,
``check_init``) that plugins use in their own validate hooks live in ``specpolicy.core.checks``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from specpolicy.core.errors import ConfigError

#: Groups whose choices plugins provide (the kinds of ``specpolicy.PluginEntry``).
PLUGIN_GROUPS = ("policy", "drafter", "verifier", "logger")


# the checkers plugins use (re-exported here for the core's own groups)
from specpolicy.core.checks import boolean, check_init, check_keys, choice, integer, number  # noqa: E402,F401

# -- the whole config --------------------------------------------------------------------------


def validate_config(config: Mapping[str, Any], pm) -> list:
    """Check every value of the resolved ``config`` (a plain dict) before anything is loaded;
    return the prompts (``specpolicy.data.datasets.Prompt``), read while checking ``dataset``.

    Raises:
        ConfigError: naming the first bad key, its value and the accepted range.
    """
    warn_method_alias(config)
    _check_core(config)
    for group in ("policy", "drafter", "verifier"):
        node = dict(config.get(group) or {})
        if "name" not in node:
            raise ConfigError(f"{group}.name is missing: choose one with {group}=NAME")
        validate_plugin_config(pm, group, str(node.pop("name")), node, config)
    for name, node in (config.get("logger") or {}).items():
        validate_plugin_config(pm, "logger", str(name), dict(node or {}), config)
    _check_acceptance(config)
    prompts = _check_dataset(config.get("dataset") or {})
    _check_memory(config, prompts)
    return prompts


#: The deprecated method presets already warned about in this process (one line each).
_WARNED_ALIASES: set[str] = set()


def warn_method_alias(config: Mapping[str, Any]) -> None:
    """One ``SpecpolicyDeprecationWarning`` per process when ``config``'s method preset is a
    deprecated name of another (``method.alias_of`` in ``conf/method/<name>.yaml``: the same
    configuration under a second name), naming the preset to use instead."""
    import warnings

    from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning

    method = config.get("method")
    target = method.get("alias_of") if isinstance(method, Mapping) else None
    name = str(method.get("name")) if isinstance(method, Mapping) else ""
    if not target or name in _WARNED_ALIASES:
        return
    _WARNED_ALIASES.add(name)
    warnings.warn_explicit(  # lineno 0: the warning is this one line, no source line under it
        f"method={name} is a deprecated name of method={target} (the same configuration): use method={target}",
        SpecpolicyDeprecationWarning,
        filename=f"conf/method/{name}.yaml",
        lineno=0,
        module="specpolicy.conf.method",
    )


def validate_plugin_config(
    pm, group: str, name: str, config: dict[str, Any], run_config: Mapping[str, Any] | None = None
) -> None:
    """Have the plugin that owns ``group`` choice ``name`` check ``config`` (see module docstring);
    ``run_config``: the whole run config, for checks across groups (None: the group alone).

    Raises:
        ConfigError: for a bad value, or a name no registered plugin provides.
    """
    from specpolicy.plugins.manager import validate

    try:
        known = validate(pm, group, name, dict(config), dict(run_config or {}))
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # a plugin's own range check, or its factory failing on a value
        raise ConfigError(refusal_message(pm, group, name, config, exc)) from exc
    if not known:  # no plugin declares it, and none that might build it without declaring it
        raise ConfigError(f"no registered plugin provides {group} {name!r}; see `python -m specpolicy --list-plugins`")


def composition_key_line(error: BaseException, argv: list[str]) -> str | None:
    """The one line for Hydra's "key not in the config" error when the key belongs to a plugin's
    group (``policy.tau=0.3`` with ``policy=static``): the plugin's own validation message for the
    group with that key set (``unknown key policy.tau; policy has keys k``) -- exactly what
    ``+policy.tau=0.3`` would print -- so the hint never suggests adding a key no plugin accepts.
    None when the error is not such an error, the key is not in a plugin's group, or the plugin
    accepts the key (then adding it with ``+`` is the way, as Hydra says). ``argv``: the command's
    arguments (the override's value and ``plugins.block`` are read from them)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = error.__cause__ if isinstance(error, HydraException) else error
    full_key = str(getattr(cause, "full_key", "") or "")
    parent = getattr(cause, "parent_node", None)
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or not full_key or parent is None:
        return None
    parts = full_key.split(".")
    group = parts[0]
    if group not in PLUGIN_GROUPS or len(parts) < (3 if group == "logger" else 2):
        return None
    try:
        node = OmegaConf.to_container(parent, resolve=True)
        overrides = _parsed_overrides(argv)
        name = parts[1] if group == "logger" else str(node.pop("name", ""))
        if not name:
            return None
        key = parts[2] if group == "logger" else parts[1]
        value: Any = None
        for dotted, given in overrides.items():
            if dotted == full_key:
                value = given
            elif dotted.startswith(full_key + "."):  # policy.foo.bar=1 with no policy.foo: {bar: 1}
                value = given
                for part in reversed(dotted[len(full_key) + 1 :].split(".")):
                    value = {part: value}
        node[key] = value
        from specpolicy.plugins.manager import get_plugin_manager

        block = overrides.get("plugins.block") or []
        validate_plugin_config(get_plugin_manager(block=list(block)), group, name, node)
    except ConfigError as refused:
        return str(refused) if full_key in str(refused) else None
    except Exception:  # noqa: BLE001 - anything else: Hydra's own line is reported instead
        return None
    return None


def _parsed_overrides(argv: list[str]) -> dict[str, Any]:
    """``key -> value`` of the command's ``key=value`` overrides (``+`` / ``++`` prefixes dropped),
    parsed as Hydra parses them; arguments Hydra cannot parse are left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), {}
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        try:
            override = parser.parse_overrides([arg])[0]
            out[override.key_or_group] = override.value()
        except Exception:  # noqa: BLE001
            continue
    return out


def refusal_message(pm, group: str, name: str, config: Mapping[str, Any], error: BaseException) -> str:
    """The one line for a plugin's ``ValueError`` / ``TypeError`` about ``group`` choice ``name``:
    its own message when it names a key of the group (``policy.n must be ...``,
    ``logger.wandb.mode ...``); otherwise the key whose value
    (or name) the message quotes -- ``policy.k='abc'`` for ``invalid literal for int() with base
    10: 'abc'`` -- or, when none can be told, every setting, then the plugin and hook that raised
    it (``specpolicy.plugins.manager.blame``) and the plugin's own words."""
    from specpolicy.plugins.manager import blame

    text = str(error)
    prefix = f"logger.{name}." if group == "logger" else f"{group}."  # how the user writes the group's keys
    if prefix in text:  # the plugin's own message names its key
        return text
    where = blame(error, pm)
    by = f" by {where}" if where is not None else f" by the plugin providing {group} {name!r}"
    quoted = [key for key, value in config.items() if re.search(rf"(?<![\w.]){re.escape(repr(value))}(?![\w.])", text)]
    if len(quoted) != 1:
        quoted = [key for key in config if re.search(rf"['\"]{re.escape(str(key))}['\"]", text)]
    if len(quoted) == 1:
        key = quoted[0]
        subject = f"{prefix}{key}={config[key]!r} was refused"
    else:
        settings = ", ".join(f"{prefix}{key}={value!r}" for key, value in config.items()) or "no settings"
        subject = f"{group} {name!r} refused its settings ({settings})"
    return f"{subject}{by}: {type(error).__name__}: {text}"


def _check_core(config: Mapping[str, Any]) -> None:
    """The keys the core owns (``generation``, ``run``, ``reuse``, ``runtime``, ``seed``, ``profile``)."""
    from specpolicy.analysis.summary import profile_from
    from specpolicy.core.runtime import Runtime
    from specpolicy.core.sampling import SamplingConfig
    from specpolicy.core.stopping import StopStrings, config_strings

    integer("seed", config.get("seed", 0))
    generation = config.get("generation") or {}
    integer("generation.max_new_tokens", generation.get("max_new_tokens"), 1)
    try:
        SamplingConfig.from_config(generation)  # temperature, top_k, top_p
        stop = generation.get("stop")
        if stop is not None and (isinstance(stop, str) or len(stop)):
            StopStrings(None, config_strings(stop if isinstance(stop, str) else list(stop)))  # non-empty strings
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    _check_batch(config)
    run = config.get("run") or {}
    boolean("run.vanilla_baseline", run.get("vanilla_baseline", True))
    integer("run.warmup_prompts", run.get("warmup_prompts", 0), 0)
    boolean("run.resume", run.get("resume", False))
    reuse = config.get("reuse") or {}
    boolean("reuse.enabled", reuse.get("enabled", False))
    integer("reuse.min_match", reuse.get("min_match", 2), 1)
    runtime = config.get("runtime") or {}
    if boolean("runtime.compile", runtime.get("compile", False)):
        _check_compiled_target(config.get("verifier") or {}, config.get("drafter") or {})
    if boolean("runtime.batch_invariant", runtime.get("batch_invariant", False)):
        _check_batch_invariant(config)
    try:
        threads = runtime.get("threads")
        if threads is not None:
            integer("runtime.threads", threads, 1)
        # device, dtype, compile and the compiled runtime's runtime.* keys (threads: checked above, not
        # set here -- torch.set_num_threads is process-wide)
        Runtime.from_config({k: v for k, v in runtime.items() if k != "threads"})
        profile_from(dict(config))  # a bad `profile` fails now, not after the run
    except (ValueError, TypeError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str is a repr
        raise ConfigError(str(message)) from exc


#: Tokens a prompt's chat template may add (the memory estimate's context bound).
_TEMPLATE_TOKENS = 64


def _check_memory(config: Mapping[str, Any], prompts: list) -> None:
    """Refuse, before loading, models that cannot fit the memory the runtime has
    (``specpolicy.models.memory``): the target's and the drafter's weights in the run's dtype plus the
    target's KV cache for the longest context the run can reach (the longest prompt's characters
    plus its chat template, a bound on its tokens, plus ``generation.max_new_tokens``, at most the
    model's ``max_position_embeddings`` or ``verifier.max_context``). Models whose ``config.json``
    is not on disk (a hub id not cached yet) are left to the loader."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.models.memory import available_bytes, estimate_bytes, fits_line

    runtime = config.get("runtime") or {}
    try:
        rt = Runtime.from_config({k: v for k, v in runtime.items() if k not in ("threads", "compile")})
    except ValueError:
        return  # _check_core names the bad runtime key
    longest = max((len(getattr(p, "text", "") or "") for p in prompts), default=0) + _TEMPLATE_TOKENS
    new_tokens = int((config.get("generation") or {}).get("max_new_tokens") or 0)
    nodes = [("verifier", config.get("verifier") or {}), ("drafter", config.get("drafter") or {})]
    shapes = [
        (f"{group}.model", node["model"], _config_json(node["model"]))
        for group, node in nodes
        if isinstance(node.get("model"), str)
    ]
    shapes = [(key, value, shape) for key, value, shape in shapes if shape is not None and "hidden_size" in shape]
    if not shapes:
        return
    available = available_bytes(rt.torch_device)
    if available is None:
        return
    need = 0
    for i, (key, value, shape) in enumerate(shapes):
        limit = int((config.get("verifier") or {}).get("max_context") or 0) if i == 0 else 0
        context = min(longest + new_tokens, limit or int(shape.get("max_position_embeddings") or 1 << 30))
        try:
            line = fits_line(key, value, shape, rt.torch_dtype, context, available - need)
            need += estimate_bytes(shape, rt.torch_dtype, context)
        except (KeyError, TypeError, ValueError):
            continue  # a config.json without the usual shape keys: the loader decides
        if line:
            raise ConfigError(line)


def _config_json(model: str) -> dict[str, Any] | None:
    """A bundled, local or hub-cached model's ``config.json`` as a dict (read, nothing loaded, no
    network: ``specpolicy.models.sources.local_config_path``), else None."""
    from specpolicy.models.sources import local_config_path

    try:
        path = local_config_path(model)
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _check_acceptance(config: Mapping[str, Any]) -> None:
    """``policy.acceptance=head``: a head for the drafter, runnable here (nothing loaded;
    ``specpolicy.models.acceptance_head.check_acceptance_config``)."""
    from specpolicy.models.acceptance_head import check_acceptance_config

    try:
        check_acceptance_config(dict(config))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _check_compiled_target(verifier: Mapping[str, Any], drafter: Mapping[str, Any]) -> None:
    """``runtime.compile=true`` runs the ``hf`` target's forward (and ``drafter=ar``'s) on the
    static cache (``specpolicy.runners.decoder``): a model it does not reproduce -- a model type
    other than Llama, Mistral, Qwen2, Qwen3, a RoPE type whose frequencies change with the length,
    a sliding window narrower than the context -- is refused here, from its config.json (bundled,
    local, or a hub id in the local hub cache; one not there is checked when it loads)."""
    from specpolicy.runners.decoder import unsupported

    models = []
    if verifier.get("name", "hf") == "hf":
        models.append(("verifier.model", verifier.get("model"), verifier.get("max_context")))
    if drafter.get("name") == "ar":
        models.append(("drafter.model", drafter.get("model"), None))
    for key, model, max_context in models:
        config = _config_json(model) if isinstance(model, str) else None
        if config is None:
            continue  # the model's own check names what is wrong with it
        context = int(max_context or config.get("max_position_embeddings") or 0) or None
        why = unsupported(config, context)
        if why is not None:
            raise ConfigError(
                f"runtime.compile=true cannot run {key}={model!r}: it {why}; or use runtime.compile=false"
            )


def _check_batch_invariant(config: Mapping[str, Any]) -> None:
    """``runtime.batch_invariant=true`` verifies chains at batch 1 with the ``hf`` target, one
    one-token pass per position (``specpolicy.core.runtime.Runtime``)."""
    why = "runtime.batch_invariant=true verifies chains at batch 1 with verifier=hf as one-token passes, but "
    policy = (config.get("policy") or {}).get("name")
    if policy in ("eagle2-tree", "block-tree", "failfast-tree"):
        raise ConfigError(why + f"policy={policy} drafts trees (use a chain policy or runtime.batch_invariant=false)")
    if int((config.get("generation") or {}).get("batch_size", 1) or 1) != 1:
        raise ConfigError(why + f"generation.batch_size={config['generation']['batch_size']} (use 1)")
    if (config.get("verifier") or {}).get("name", "hf") != "hf":
        raise ConfigError(why + f"verifier={config['verifier']['name']}")


def _check_batch(config: Mapping[str, Any]) -> None:
    """``generation.batch_size`` / ``arrival`` / ``arrival_rate``, and what the batched loop cannot
    run yet (draft trees, another verifier than ``hf``)."""
    from specpolicy.core.serving import ARRIVALS

    generation = config.get("generation") or {}
    batch = integer("generation.batch_size", generation.get("batch_size", 1), 1)
    arrival = choice("generation.arrival", generation.get("arrival", "all_at_once"), ARRIVALS)
    rate = generation.get("arrival_rate", 0.0)
    if arrival == "poisson":
        number("generation.arrival_rate", rate, 0.0, low_open=True)
    if batch == 1:
        return
    why = f"generation.batch_size={batch} runs the batched loop, which "
    if (config.get("policy") or {}).get("name") in ("eagle2-tree", "block-tree", "failfast-tree"):
        raise ConfigError(
            why + f"verifies chains: policy={config['policy']['name']} drafts trees (use generation.batch_size=1)"
        )
    if (config.get("verifier") or {}).get("name", "hf") != "hf":
        raise ConfigError(why + f"verifies with the hf target: verifier={config['verifier']['name']} is not batched")


def _check_dataset(dataset: Mapping[str, Any]) -> list:
    from specpolicy.data.datasets import load_prompts, num_prompts_value

    offset = integer("dataset.offset", dataset.get("offset", 0), 0)
    count = num_prompts_value(dataset.get("num_prompts"))
    name = dataset.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"dataset.name must be a name, got {name!r}")
    return load_prompts(name, dataset.get("path"), count, offset)
