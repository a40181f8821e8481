"""The configuration and command-line reference pages are generated
(``python -m specpolicy.run.reference``): the committed pages equal the render, ``--check`` names
a stale page, and each key's range is the validation rule's own words."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from specpolicy.core.errors import ConfigError
from specpolicy.run import reference

ROOT = Path(__file__).resolve().parents[2]


def _row(page: str, key: str) -> list[str]:
    line = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


@pytest.fixture(scope="module")
def config_page() -> str:
    return reference.render(ROOT, ("config.md",))[reference.REFERENCE / "config.md"]


def test_committed_config_page_equals_the_render(config_page: str):
    committed = (ROOT / reference.REFERENCE / "config.md").read_text(encoding="utf-8")
    assert committed == config_page, "run `python -m specpolicy.run.reference` and commit docs/reference/config.md"


def test_committed_cli_page_equals_the_render():
    committed = (ROOT / reference.REFERENCE / "cli.md").read_text(encoding="utf-8")
    python = f"Python {sys.version_info.major}.{sys.version_info.minor})"
    if python not in committed:
        pytest.skip(f"cli.md was generated under another Python than {python} (argparse's layout differs)")
    assert committed == reference.render(ROOT, ("cli.md",))[reference.REFERENCE / "cli.md"]


def test_every_key_of_every_config_file_has_a_row(config_page: str):
    for path in sorted((ROOT / "conf").glob("*/*.yaml")):
        group = path.parent.name
        if group in ("hydra", "method", "experiment"):
            continue
        assert f"### {group}/{path.stem}" in config_page
        for key in reference.read_config(path).keys:
            if key.path != "name" and key.path != "defaults" and (key.leaf or key.comment):
                assert f"| `{group}.{key.path}` |" in config_page, f"{group}.{key.path}"


def test_ranges_come_from_the_validation_rules(config_page: str):
    tau = _row(config_page, "policy.tau")
    assert tau[1] == "`0.45`" and "[0, 1]" in tau[2] and "(comment)" not in tau[2]
    assert tau[3].startswith("τ: confidence threshold")
    assert _row(config_page, "generation.max_new_tokens")[2] == "an integer >= 1"
    assert _row(config_page, "generation.arrival")[2] == "one of all_at_once, poisson"
    assert (
        "one of float32" in _row(config_page, "runtime.dtype")[2] or "float32" in _row(config_page, "runtime.dtype")[2]
    )
    # a continuation comment line belongs to its key
    assert "counted toward N_max" in _row(config_page, "policy.confidence_scope")[3]


def test_probe_reads_the_range_of_the_refusal_and_falls_back_to_none():
    def check(value):
        if value != 3:
            raise ConfigError(f"policy.k must be an integer >= 1, got {value!r}")

    assert reference.probe("policy.k", check) == "an integer >= 1"
    assert reference.probe("policy.k", lambda value: None) is None  # no rule refuses: no range invented

    def other_key(value):
        raise ConfigError(f"policy.n must be an integer >= 1, got {value!r}")

    assert reference.probe("policy.k", other_key) is None


def test_read_config_keeps_comments_nested_keys_and_continuations(tmp_path: Path):
    path = tmp_path / "x.yaml"
    path.write_text(
        "# What x is.\nname: x\nouter:\n  inner: 3        # three, >= 1\n"
        "                    # and more about it\n# a section\nplain: 'a # b'  # quoted hash kept\n",
        encoding="utf-8",
    )
    cf = reference.read_config(path)
    assert cf.header == ["What x is."]
    keys = {k.path: k for k in cf.keys}
    assert keys["outer.inner"].default == 3 and keys["outer.inner"].comment == ["three, >= 1", "and more about it"]
    assert not keys["outer"].leaf and keys["plain"].default == "a # b" and keys["plain"].comment == ["quoted hash kept"]
    assert reference.comment_range("three, >= 1") == ">= 1"


@pytest.mark.slow  # three renders of the configuration page
def test_check_names_a_stale_page_in_a_copy(tmp_path: Path, capsys, config_page: str):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    shutil.copytree(ROOT / reference.REFERENCE, tmp_path / reference.REFERENCE)
    # the copy's page is its conf's render (the module's render of the same conf): current before the edit
    assert (tmp_path / reference.REFERENCE / "config.md").read_text(encoding="utf-8") == config_page
    failfast = tmp_path / "conf/policy/failfast.yaml"
    failfast.write_text(
        failfast.read_text(encoding="utf-8").replace("τ: confidence threshold", "τ: the threshold"), encoding="utf-8"
    )
    assert reference.main(["--root", str(tmp_path), "--check", "--page", "config.md"]) == 1
    assert "docs/reference/config.md" in capsys.readouterr().err
    assert reference.main(["--root", str(tmp_path), "--page", "config.md"]) == 0
    assert "τ: the threshold" in (tmp_path / reference.REFERENCE / "config.md").read_text(encoding="utf-8")
    assert reference.main(["--root", str(tmp_path), "--check", "--page", "config.md"]) == 0
