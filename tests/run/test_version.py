"""``specpolicy --version`` / ``python -m specpolicy --version``: ``specpolicy <version>``, exit 0,
before Hydra starts; the version has one source (``specpolicy.__version__``, which pyproject.toml reads)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys

import pytest

import specpolicy
from specpolicy.run import cli


def _no_hydra(*args, **kwargs):
    raise AssertionError("Hydra started for --version")


@pytest.mark.parametrize("argv", [["--version"], ["--version", "policy=static"], ["--debug", "--version"]])
def test_version_prints_the_version_and_returns_before_hydra(argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["specpolicy", *argv])
    monkeypatch.setattr(cli, "_hydra_main", _no_hydra)
    cli.main()  # returns: exit status 0
    out, err = capsys.readouterr()
    assert out == f"specpolicy {specpolicy.__version__}\n"
    assert err == ""


def test_the_installed_version_is_specpolicy_version():
    # pyproject.toml: dynamic version from specpolicy.__version__; a stale install would differ
    assert importlib.metadata.version("specpolicy") == specpolicy.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)*", specpolicy.__version__)


def test_version_falls_back_to_the_package_attribute_without_an_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(specpolicy, "__version__", "9.8.7")
    assert cli.version() == "9.8.7"


@pytest.mark.slow
@pytest.mark.parametrize("command", [[sys.executable, "-m", "specpolicy"], ["specpolicy"]])
def test_version_commands_exit_0(command, tmp_path):
    if command == ["specpolicy"] and shutil.which("specpolicy") is None:
        pytest.fail("the specpolicy console script is not on PATH (pip install -e . installs it)")
    done = subprocess.run([*command, "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"specpolicy {specpolicy.__version__}\n"
    assert not any(tmp_path.iterdir())  # no run directory, no Hydra output
