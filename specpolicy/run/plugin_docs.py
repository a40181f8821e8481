"""Getting started's table of config groups, generated from the plugin registry: the built-in
policies, drafters, verifiers and loggers ``specpolicy.plugins.manager`` registers (its public
``get_plugin_manager`` and ``plugin_infos``), with the presets of ``conf/<group>/`` that configure
one of them. Written between ``<!-- plugins:groups -->`` and ``<!-- /plugins:groups -->`` of
``docs/getting-started.md`` by ``python -m specpolicy.run.reference`` (this lives in ``run``, not
``analysis``: it reads the plugin layer)."""

from __future__ import annotations

from pathlib import Path

import yaml

from specpolicy.analysis.docs_tables import render_template
from specpolicy.plugins.manager import get_plugin_manager, plugin_infos

GETTING_STARTED = Path("docs/getting-started.md")
BEGIN, END = "<!-- plugins:groups -->", "<!-- /plugins:groups -->"
CONF = Path("conf")
#: The module folder of each kind of built-in plugin (``specpolicy.<folder>.<name>``), by config group.
KINDS = {"policy": "policies", "drafter": "drafters", "verifier": "verifiers", "logger": "run.loggers"}


def registered(kind: str) -> list[str]:
    """The built-in plugins of one config group (``policy``, ``drafter``, ``verifier``, ``logger``),
    in registration order, by the name a config selects them with: the names of the entries a
    plugin declares (``PluginInfo.entries``), else its module's (``goodput_batch`` ->
    ``goodput-batch``). Third-party plugins (entry points) are left out: the page documents the
    package."""
    prefix, names = f"specpolicy.{KINDS[kind]}.", []
    for info in plugin_infos(get_plugin_manager(autoload=False)):
        if info.origin != "built-in":
            continue
        entries = getattr(info, "entries", None)
        if entries:
            names += [e.name for e in entries if e.kind == kind and e.name not in names]
        elif info.name.startswith(prefix):
            names.append(info.name.removeprefix(prefix).replace("_", "-"))
    return names


def _base(path: Path, group: str) -> str | None:
    """The preset that ``conf/<group>/<name>.yaml`` builds on (its first defaults entry), if any."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for entry in data.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            return entry.partition("@")[0].removeprefix(f"/{group}/")
    return None


def choices(root: Path, group: str) -> str:
    """One table cell: the group's registered plugins (the default first, marked), then the presets
    of ``conf/<group>/`` that configure one of them (its plugin in brackets); draft trees and
    batch-aware policies named as such."""
    conf = root / CONF
    default = next(
        (
            e[group]
            for e in yaml.safe_load((conf / "config.yaml").read_text())["defaults"]
            if isinstance(e, dict) and group in e
        ),
        None,
    )
    default = default[0] if isinstance(default, list) else default
    names = registered(group)
    presets = {p.stem: _base(p, group) for p in sorted((conf / group).glob("*.yaml")) if p.stem not in names}
    label = {n: f"`{n}`" + (" (default)" if n == default else "") for n in names}
    label.update({n: f"`{n}` ({base})" for n, base in presets.items() if base})
    order = sorted(label, key=lambda n: (n != default, n.endswith("-tree"), "batch" in n))
    plain = [label[n] for n in order if not n.endswith("-tree") and "batch" not in n]
    parts = [", ".join(plain)]
    if trees := [label[n] for n in order if n.endswith("-tree")]:
        parts.append("draft trees: " + ", ".join(trees))
    if batch := [label[n] for n in order if "batch" in n]:
        parts.append("batch-aware: " + ", ".join(batch))
    return "; ".join(parts)


def groups_table(root: Path) -> str:
    """The config groups table of Getting started (the template ``site_groups.md.j2``)."""
    cells = {g: choices(root, g) for g in KINDS}
    return render_template(
        "site_groups", policies=cells["policy"], drafters=cells["drafter"], verifiers=cells["verifier"],
        loggers=cells["logger"],
    )  # fmt: skip


def getting_started(root: Path) -> str:
    """``docs/getting-started.md`` with its groups table regenerated between the markers.

    Raises:
        ValueError: when the page lacks the markers (naming them and the page).
    """
    text = (root / GETTING_STARTED).read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{GETTING_STARTED}: no {BEGIN} ... {END} markers around the config groups table")
    return text[: start + len(BEGIN)] + "\n" + groups_table(root) + text[end:]
