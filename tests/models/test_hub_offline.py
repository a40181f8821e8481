"""Hub ids without a network (issue 48, item 4): ``verifier.model=org/name`` and
``drafter.model=org/name`` load from a local Hugging Face cache with ``HF_HUB_OFFLINE=1`` -- a cache
the test builds as the hub lays it out (``models--org--name/refs/main``, ``snapshots/<sha>/`` of
links into ``blobs/``), found through ``HF_HUB_CACHE`` -- and a hub id the cache lacks is one line
naming the key, the id and where it looked, before any model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import overrides
from hub_cache import COMMIT, put_in_hub_cache
from specpolicy.core.errors import ConfigError
from specpolicy.models.sources import cached_snapshot, check_model_source, local_config_path, resolve_model_path
from specpolicy.run.cli import main


@pytest.fixture
def hub(family, tmp_path, monkeypatch) -> Path:
    """A hub cache holding ``org/target`` and ``org/drafter`` (the tiny family), ``HF_HUB_CACHE``
    pointing at it and the hub off limits."""
    cache = tmp_path / "hub"
    for name in ("target", "drafter"):
        put_in_hub_cache(cache, f"org/{name}", family[name])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    return cache


def test_a_hub_id_resolves_to_its_snapshot_in_the_offline_cache(hub, monkeypatch):
    snapshot = hub / "models--org--target" / "snapshots" / COMMIT
    assert cached_snapshot("org/target") == str(snapshot)
    assert resolve_model_path("org/target") == str(snapshot)
    check_model_source("verifier.model", "org/target")  # config.json and the weights' headers, through the links
    assert json.loads(local_config_path("org/target").read_text())["model_type"] == "qwen2"
    assert cached_snapshot("org/absent") is None
    monkeypatch.setenv("HF_HUB_CACHE", str(hub.parent / "elsewhere"))  # read when asked, not at import
    assert cached_snapshot("org/target") is None


@pytest.mark.slow  # a whole run (two models loaded, vanilla and speculative decoding)
def test_hub_ids_run_offline_from_the_cache_and_stay_lossless(hub, family, monkeypatch, capsys):
    """``verifier.model=org/target drafter.model=org/drafter`` with ``HF_HUB_OFFLINE=1``: the run
    loads both from the cache and is lossless."""
    args = [a for a in overrides(family) if not a.startswith(("verifier.model=", "drafter.model="))]
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args, "verifier.model=org/target", "drafter.model=org/drafter"])
    assert main() in (0, None)
    (summary,) = Path.cwd().glob("outputs/**/summary.json")
    records = json.loads(summary.read_text())
    assert records["lossless_fraction"] == 1.0 and records["not_lossless"] == {}
    assert "2/2" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["verifier.model", "drafter.model"])
def test_a_hub_id_absent_from_the_offline_cache_is_one_line_before_any_model_loads(
    hub, family, key, monkeypatch, capsys
):
    monkeypatch.setattr("specpolicy.models.loading.load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    args = [a for a in overrides(family) if not a.startswith(f"{key}=")]
    monkeypatch.setattr(sys, "argv", ["specpolicy", *args, f"{key}=org/absent"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {key}='org/absent': hub id not in the local Hugging Face cache {hub} and HF_HUB_OFFLINE=1 forbids "
        "downloading it (download it first, or set HF_HUB_CACHE / HF_HOME to the cache that holds it)"
    ]


def test_hf_home_places_the_cache_when_hf_hub_cache_is_unset(hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hub.parent))  # $HF_HOME/hub
    assert resolve_model_path("org/drafter").endswith(f"models--org--drafter/snapshots/{COMMIT}")
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online: the id is left to transformers (it may fetch a newer revision)
    assert resolve_model_path("org/drafter") == "org/drafter"
    with pytest.raises(ConfigError):
        check_model_source("drafter.model", "not a hub id")
