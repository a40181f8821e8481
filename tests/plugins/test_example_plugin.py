"""The example third-party plugin (examples/third-party-policy), installed by pip as CI does:
its policy runs from the command line with its own config, losslessly -- through the deprecated
``specpolicy_make_policy`` hook it implements, with one deprecation line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import overrides

if os.environ.get("CI"):  # .ci/run installs it: missing means a broken install step, not a skip
    import specpolicy_entropy  # noqa: F401
else:
    pytest.importorskip("specpolicy_entropy", reason="pip install examples/third-party-policy (done by .ci/run)")


@pytest.mark.slow  # a subprocess
def test_installed_example_policy_runs_from_the_command_line_losslessly(family, tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specpolicy",
            *overrides(family, drafter="drafter"),
            "policy=entropy",
            "policy.max_bits=12",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one deprecation line for the whole run, however many plugin managers the run builds
    assert proc.stderr.count("SpecpolicyDeprecationWarning: plugin entropy (specpolicy_entropy.policy)") == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "ar+entropy"
    assert summary["config"]["policy"] == {"name": "entropy", "n": 4, "max_bits": 12.0, "n_max": 32}  # its own yaml
    assert summary["lossless_fraction"] == 1.0 and summary["not_lossless"] == {}
    rounds = [r for line in (run_dir / "results.jsonl").read_text().splitlines() for r in json.loads(line)["rounds"]]
    # a random tiny drafter is uncertain (~8 bits/token): with max_bits=12 the draft extends past one chunk
    assert max(r["speculation_length"] for r in rounds) > 4


def test_list_plugins_shows_the_example_and_its_distribution(capsys, monkeypatch):
    monkeypatch.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    from specpolicy.run.cli import list_plugins

    list_plugins([])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("entropy "))
    assert "specpolicy-entropy 0.1.0 (entry point)" in line and "make_policy" in line
    assert "entropy: pkg://specpolicy_entropy.conf  policy/entropy" in out


def test_the_example_on_the_deprecated_hook_builds_with_one_deprecation_warning(monkeypatch):
    from specpolicy.plugins import manager
    from specpolicy.plugins.hookspecs import SpecpolicyDeprecationWarning

    monkeypatch.delenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(manager, "_WARNED", set())
    with pytest.warns(SpecpolicyDeprecationWarning, match=r"^plugin entropy \(specpolicy_entropy.policy\) implements "):
        pm = manager.get_plugin_manager()
    policy = manager.make_policy(pm, {"name": "entropy", "n": 2, "max_bits": 3.0})
    assert (policy.n, policy.max_bits, policy.n_max) == (2, 3.0, 32)
    assert manager.provider(policy).name == "entropy"
    from specpolicy.run.validation import ConfigError, validate_plugin_config

    with pytest.raises(ConfigError, match=r"^policy.max_bits must be >= 0, got -1"):  # checked by building it
        validate_plugin_config(pm, "policy", "entropy", {"max_bits": -1})
