"""Command line: ``python -m specpolicy [group=choice ...] [key=value ...]`` (Hydra).

``python -m specpolicy -m key=a,b ...`` sweeps (Hydra multirun; ``hydra/launcher=submitit_local``
or ``submitit_slurm``/``slurm`` fans the jobs out, ``hydra/sweeper=failfast_optuna`` searches).
``python -m specpolicy --list-plugins [plugins.block=[NAME,...]]`` prints the registered plugins,
where each came from, the hooks it implements and the config files plugins add.
``python -m specpolicy --version`` (or ``specpolicy --version``) prints ``specpolicy <version>``
and exits 0 before Hydra starts.

Config files shipped by plugins (hook ``specpolicy_config_searchpath``) join Hydra's search
path through the Hydra plugin ``specpolicy.run.hydra_searchpath``.

Errors (``specpolicy.core.errors``): a user error -- a config value out of range, a misspelled key or
choice, a bad prompt file, a run directory in use -- prints ONE line naming the key, the value
and the accepted range, and exits with status 2; an error raised inside a plugin prints one line
naming the plugin and the hook, status 1. ``--debug`` (or ``HYDRA_FULL_ERROR=1``) shows the full
traceback instead. After a run it prints where the results are and the next commands; after a
multirun, its sweep directory (``specpolicy.run.messages``).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hydra_plugins.specpolicy_launcher import register as register_launcher_plugin
from specpolicy.core.errors import EXIT_FAILURE, EXIT_USER, one_line
from specpolicy.run.experiment import run_experiment
from specpolicy.run.hydra_searchpath import register as register_searchpath_plugin

DEBUG_FLAG = "--debug"
VERSION_FLAG = "--version"
_debug = False  # set by main(): --debug or HYDRA_FULL_ERROR=1 keep tracebacks


def sweep_objective(summary: dict) -> float:
    """The value a Hydra sweeper maximises (Optuna, ``direction: maximize``): the measured
    speedup over vanilla decoding, or 0.0 -- below any real speedup -- when any prompt's
    output is NOT lossless against vanilla (losslessness is a hard constraint; a parting at a
    near-tie within the dtype's rounding, ``lossless_counts`` numerically_equivalent, is not
    one) or no vanilla baseline ran.
    Sampling runs (temperature > 0) are not compared token for token (lossless in distribution)."""
    sampled = summary.get("sampling", {}).get("mode") == "sampling"
    counts = summary.get("lossless_counts")
    if not sampled and counts is not None and (counts.get("not_lossless", 0) or not sum(counts.values())):
        return 0.0
    if not sampled and counts is None and summary.get("lossless_fraction", 0.0) < 1.0:
        return 0.0
    return float(summary.get("speedup_vs_vanilla", 0.0))


@hydra.main(config_path="pkg://specpolicy.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float:
    from hydra.types import RunMode

    from specpolicy.run.messages import run_done

    hc = HydraConfig.get()
    elsewhere: list[str] = []  # where plugins put the run outside its directory (e.g. the W&B run)
    try:
        summary = run_experiment(cfg, hc.runtime.output_dir, outputs=elsewhere)
    except Exception as error:  # noqa: BLE001
        if hc.mode != RunMode.MULTIRUN:  # failed before it started (validation): no empty run directory left
            from specpolicy.run.resume import discard_unstarted

            discard_unstarted(hc.runtime.output_dir)
        report = None if _debug else one_line(error)
        if report is None or hc.mode == RunMode.MULTIRUN:  # a sweep names the failed job first, then main()
            raise
        print(report[0], file=sys.stderr)  # a single run: exactly one line
        raise SystemExit(report[1]) from None
    print(
        "\n".join(run_done(hc.runtime.output_dir, in_sweep=hc.mode == RunMode.MULTIRUN, elsewhere=elsewhere)),
        flush=True,
    )
    return sweep_objective(summary)  # the value Hydra sweepers optimise


def _config_files(entry: str) -> list[str]:
    """``group/name`` of every YAML file under a search-path entry (pkg:// or file://)."""
    from importlib import resources

    if entry.startswith("pkg://"):
        root = resources.files(entry[len("pkg://") :].replace("/", "."))
    else:
        root = Path(entry[len("file://") :])
    out, stack = [], [(root, "")]
    while stack:
        node, prefix = stack.pop()
        for child in node.iterdir():
            if child.is_dir() and not child.name.startswith(("_", ".")):
                stack.append((child, f"{prefix}{child.name}/"))
            elif child.name.endswith((".yaml", ".yml")):
                out.append(prefix + child.name.rsplit(".", 1)[0])
    return sorted(out)


def list_plugins(argv: list[str] | None = None) -> None:
    """Print every registered plugin (name, origin, hooks), what they provide (each policy,
    drafter, verifier and logger with its one-line description and the plugin whose entry wins:
    ``specpolicy.plugins.manager.registry``) and the config files plugins add. ``argv`` may
    hold ``plugins.block=[NAME,...]`` to show the effect of blocking."""
    from omegaconf import OmegaConf

    from specpolicy.plugins.hookspecs import KINDS
    from specpolicy.plugins.manager import (
        AUTOLOAD_ENV,
        autoload_enabled,
        config_searchpath,
        get_plugin_manager,
        plugin_infos,
        registry,
    )

    dotlist = [a for a in (argv or []) if a.startswith("plugins.block=")]
    block = list(OmegaConf.from_dotlist(dotlist).get("plugins", {}).get("block", []) or [])
    pm = get_plugin_manager(block=block)
    infos = plugin_infos(pm)
    width = max((len(i.name) for i in infos), default=0) + 2
    origin_width = max((len(i.origin) for i in infos), default=0) + 2
    state = "on" if autoload_enabled() else f"off ({AUTOLOAD_ENV} is set)"
    print(f"plugins (entry-point group 'specpolicy', autoload {state}; block one with plugins.block=[NAME]):")
    for info in infos:
        print(f"  {info.name:{width}s}{info.origin:{origin_width}s}{', '.join(info.hooks)}")
    if block:
        print(f"blocked: {', '.join(block)}")
    provided = sorted(registry(pm).values(), key=lambda r: (KINDS.index(r.entry.kind), r.entry.name))
    print("provided (kind, name, description, plugin; choose one with <kind>=<name>):")
    name_width = max((len(r.entry.name) for r in provided), default=0) + 2
    for r in provided:
        print(f"  {r.entry.kind:10s}{r.entry.name:{name_width}s}{r.entry.description or '-'}  [{r.plugin}]")
    for info in infos:  # plugins of earlier versions: their factory hooks answer for names they know
        for kind in KINDS:
            if f"make_{kind}" in info.hooks:
                print(
                    f"  {kind:10s}{'?':{name_width}s}names of the deprecated hook specpolicy_make_{kind}  [{info.name}]"
                )
    entries = config_searchpath(pm)
    print("config files added by plugins:" if entries else "config files added by plugins: none")
    for plugin, entry in entries:
        print(f"  {plugin}: {entry}  {' '.join(_config_files(entry))}")


def version() -> str:
    """The installed distribution's version (``importlib.metadata``), else ``specpolicy.__version__``
    (a source tree on ``sys.path`` without an install). pyproject.toml reads the version from
    ``specpolicy.__version__``: one source of truth."""
    from importlib.metadata import PackageNotFoundError, version as distribution_version

    try:
        return distribution_version("specpolicy")
    except PackageNotFoundError:
        import specpolicy

        return specpolicy.__version__


def main() -> None:
    if not sys.warnoptions:  # a plugin on deprecated hooks: one line per plugin (python -W overrides)
        import warnings

        from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning

        warnings.simplefilter("default", SpecpolicyDeprecationWarning)
    if VERSION_FLAG in sys.argv[1:]:  # before Hydra, which has a --version of its own
        print(f"specpolicy {version()}")
        return
    global _debug
    debug = _debug = DEBUG_FLAG in sys.argv[1:] or os.environ.get("HYDRA_FULL_ERROR", "") == "1"
    sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != DEBUG_FLAG)]
    if "--list-plugins" in sys.argv[1:]:
        try:
            list_plugins([a for a in sys.argv[1:] if a != "--list-plugins"])
        except Exception as error:  # noqa: BLE001 - a broken plugin is named in one line
            report = None if debug else one_line(error)
            if report is None:
                raise
            print(report[0], file=sys.stderr)
            sys.exit(report[1])
        return
    register_searchpath_plugin()
    register_launcher_plugin()  # hydra/launcher=slurm, slurm_cpu (an editable install hides it from Hydra's scan)
    from specpolicy.run.preflight import SweepRejected
    from specpolicy.run.resume import RunInterrupted

    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises every error; reported below in one line
    try:
        _hydra_main()
    except SweepRejected as rejected:  # a sweep job's bad value, found before any job ran
        if debug:
            raise rejected.error from None
        print(one_line(rejected.error)[0], file=sys.stderr)
        sys.exit(rejected.code)
    except RunInterrupted as interrupted:  # SIGINT / SIGTERM: partial summary written; resume with the same command
        sys.exit(interrupted.exit_code)
    except Exception as error:  # noqa: BLE001 - every error is reported, the user's in one line
        if debug:
            raise
        from specpolicy.run.validation import composition_key_line

        plugin_line = composition_key_line(error, sys.argv[1:])  # a key the plugin does not take: its own line
        report = (f"error: {plugin_line}", EXIT_USER) if plugin_line else one_line(error)
        if report is None:  # neither the user's nor a plugin's: a bug, reported with its traceback
            traceback.print_exc()
            sys.exit(EXIT_FAILURE)
        print(report[0], file=sys.stderr)
        sys.exit(report[1])
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
