"""The README's "Write a policy plugin" section is a package that works as written: its files are
taken from the README's code blocks, made importable with the entry point its ``pyproject.toml``
declares (a ``*.dist-info`` next to the sources: what ``pip install`` records), and run through
the command line -- listed with its config file, selected with ``policy=mine``, drafting ``k``
tokens per round, refusing a bad value in one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import overrides
from specpolicy.run.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_package() -> dict[str, str]:
    """``path -> text`` of every code block of the section whose first line is ``# <path>``."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Write a policy plugin"):]
    section = section[: section.index("\n## ")]
    files = {}
    for block in re.findall(r"```(?:python|yaml|toml)\n(.*?)```", section, flags=re.S):
        first, _, rest = block.partition("\n")
        assert first.startswith("# "), f"a code block of the section does not start with its path: {first!r}"
        files[first[2:].strip()] = block
    return files


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The README's package on ``sys.path`` with its entry point declared."""
    root = tmp_path / "my-policy"
    files = readme_package()
    assert set(files) == {"src/my_policy/plugin.py", "src/my_policy/conf/policy/mine.yaml", "pyproject.toml"}
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    for empty in ("src/my_policy/__init__.py", "src/my_policy/conf/__init__.py"):  # as the layout lists them
        (root / empty).write_text("")
    toml = files["pyproject.toml"]  # read with re: tomllib is Python 3.11+
    name = re.search(r'^name = "(.+)"$', toml, flags=re.M).group(1)
    version = re.search(r'^version = "(.+)"$', toml, flags=re.M).group(1)
    points = re.search(r"^\[project\.entry-points\.specpolicy\]\n((?:.+\n)+)", toml, flags=re.M).group(1)
    info = root / "src" / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[specpolicy]\n" + points.replace('"', ""))
    monkeypatch.syspath_prepend(str(root / "src"))
    monkeypatch.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.chdir(tmp_path)
    yield root
    for module in [m for m in sys.modules if m == "my_policy" or m.startswith("my_policy.")]:
        del sys.modules[module]


def cli(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args])
    main()


def test_the_readme_plugin_is_listed_runs_k_tokens_per_round_and_refuses_bad_values(installed, family, monkeypatch,
                                                                                   capsys):
    cli(monkeypatch, "--list-plugins")
    out = capsys.readouterr().out
    assert re.search(r"^  mine +my-policy 0\.1\.0 \(entry point\) +config_searchpath, make_policy$", out, flags=re.M)
    assert "  mine: pkg://my_policy.conf  policy/mine" in out

    cli(monkeypatch, *overrides(family), "policy=mine", "policy.k=2", "hydra.run.dir=out")
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith(("warning: policy", "error"))]
    rows = [json.loads(line) for line in (installed.parent / "out" / "results.jsonl").read_text().splitlines()]
    lengths = {r["speculation_length"] for row in rows for r in row["rounds"]}
    assert lengths and max(lengths) <= 2  # k tokens per round, never the whole room

    with pytest.raises(SystemExit) as info:
        cli(monkeypatch, *overrides(family), "policy=mine", "policy.k=abc")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: policy.k must be an integer >= 0, got 'abc'"]
