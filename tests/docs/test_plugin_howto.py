"""The plugin how-to pages' packages work as written: "A complete package: my-policy"
(docs/how-to/write-a-policy.md) and "A complete drafter package: my-drafter"
(docs/how-to/write-a-drafter-or-verifier.md). Each package's files are taken from the section's
code blocks, made importable with the entry point its ``pyproject.toml`` declares (a ``*.dist-info``
next to the sources: what ``pip install`` records), and run through the command line -- listed with
its config file, selected by name, and (the policy) drafting ``k`` tokens per round and refusing a
bad value in one line, (the drafter) lossless with two length policies."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import overrides
from specpolicy.run.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "how-to"
POLICY_PAGE, POLICY_SECTION = DOCS / "write-a-policy.md", "## A complete package: my-policy"
DRAFTER_PAGE, DRAFTER_SECTION = DOCS / "write-a-drafter-or-verifier.md", "## A complete drafter package: my-drafter"


def page_package(page: Path, heading: str) -> dict[str, str]:
    """``path -> text`` of every python / yaml / toml code block of the page's section ``heading``
    (up to the next ``## `` heading), each of which must start with ``# <path>``."""
    text = page.read_text(encoding="utf-8")
    assert heading in text, f"{page.name}: no section {heading!r}"
    section = text[text.index(heading) :]
    end = section.find("\n## ", len(heading))
    section = section if end < 0 else section[:end]
    files = {}
    for block in re.findall(r"```(?:python|yaml|toml)\n(.*?)```", section, flags=re.S):
        first, _, _ = block.partition("\n")
        assert first.startswith("# "), (
            f"{page.name}: a code block of {heading!r} does not start with its path: {first!r}"
        )
        files[first[2:].strip()] = block
    return files


def install(page: Path, heading: str, package: str, root: Path, monkeypatch) -> Path:
    """The page's package under ``root`` on ``sys.path`` with its entry point declared."""
    files = page_package(page, heading)
    assert set(files) == {f"src/{package}/plugin.py", "pyproject.toml"} | {
        name for name in files if name.startswith(f"src/{package}/conf/") and name.endswith(".yaml")
    }
    assert any(name.endswith(".yaml") for name in files), "the package ships its config file"
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    for empty in (f"src/{package}/__init__.py", f"src/{package}/conf/__init__.py"):  # as the layout lists them
        (root / empty).write_text("")
    toml = files["pyproject.toml"]
    name = re.search(r'^name = "(.+)"$', toml, flags=re.M).group(1)
    version = re.search(r'^version = "(.+)"$', toml, flags=re.M).group(1)
    points = re.search(r"^\[project\.entry-points\.specpolicy\]\n((?:.+\n)+)", toml, flags=re.M).group(1)
    info = root / "src" / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[specpolicy]\n" + points.replace('"', ""))
    monkeypatch.syspath_prepend(str(root / "src"))
    monkeypatch.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    return root


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Both pages' packages installed (``my_policy``, ``my_drafter``); cwd a scratch directory."""
    roots = {
        "my_policy": install(POLICY_PAGE, POLICY_SECTION, "my_policy", tmp_path / "my-policy", monkeypatch),
        "my_drafter": install(DRAFTER_PAGE, DRAFTER_SECTION, "my_drafter", tmp_path / "my-drafter", monkeypatch),
    }
    monkeypatch.chdir(tmp_path)
    yield roots
    for module in [m for m in sys.modules if m.split(".")[0] in roots]:
        del sys.modules[module]


def cli(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    main()


def test_the_policy_page_plugin_is_listed_runs_k_tokens_per_round_and_refuses_bad_values(
    installed, family, monkeypatch, capsys, tmp_path
):
    cli(monkeypatch, "--list-plugins")
    out = capsys.readouterr().out
    assert re.search(r"^  mine +my-policy 0\.1\.0 \(entry point\) +config_searchpath, register$", out, flags=re.M)
    assert re.search(r"^  policy +mine +k draft tokens per round  \[mine\]$", out, flags=re.M), out
    assert "  mine: pkg://my_policy.conf  policy/mine" in out

    cli(monkeypatch, *overrides(family), "policy=mine", "policy.k=2", "hydra.run.dir=out")
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith(("warning: policy", "error"))]
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    lengths = {r["speculation_length"] for row in rows for r in row["rounds"]}
    assert lengths and max(lengths) <= 2  # k tokens per round, never the whole room

    with pytest.raises(SystemExit) as info:
        cli(monkeypatch, *overrides(family), "policy=mine", "policy.k=abc")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: policy.k must be an integer >= 0, got 'abc'"]


@pytest.mark.parametrize("policy", [["policy=static", "policy.k=4"], ["policy=failfast", "policy.n=2"]])
def test_the_drafter_page_plugin_is_listed_drafts_and_is_lossless(
    installed, family, monkeypatch, capsys, tmp_path, policy
):
    cli(monkeypatch, "--list-plugins")
    out = capsys.readouterr().out
    assert re.search(r"^  lookup +my-drafter 0\.1\.0 \(entry point\) +config_searchpath, register$", out, flags=re.M), (
        out
    )
    assert "  lookup: pkg://my_drafter.conf  drafter/lookup" in out

    tiny = [o for o in overrides(family) if not o.startswith(("drafter=", "drafter."))]
    cli(monkeypatch, *tiny, "drafter=lookup", *policy, "hydra.run.dir=out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["lossless_fraction"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    drafted = [r["speculation_length"] for row in rows for r in row["rounds"]]
    assert max(drafted) >= 1  # it proposed tokens, and the output stayed vanilla's
