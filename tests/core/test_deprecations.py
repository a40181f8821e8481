"""A short run uses no deprecated transformers API: no ``FutureWarning`` or ``DeprecationWarning``
while the models load and decode, with each built-in drafter that has a model. transformers deprecates a keyword
(e.g. ``past_key_values=`` for ``cache=`` since 5.24, removed in 5.40) with a ``FutureWarning``
attributed to torch's ``Module.__call__``, not to transformers, so any such warning fails the
test. (pyproject.toml also turns transformers' "is deprecated and will be removed" warnings into
errors in every test.)"""

from __future__ import annotations

import warnings

import pytest
import torch
from hydra import compose, initialize_config_module

from conftest import overrides
from specpolicy.run.experiment import run_experiment


@pytest.mark.parametrize("drafter", ["ar", "fastdllm"])  # the drafters with a model
def test_a_short_run_emits_no_future_or_deprecation_warning(family, tmp_path, monkeypatch, drafter):
    monkeypatch.setenv("SPECPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    extra = [] if drafter == "ar" else ["drafter=fastdllm", f"drafter.model={family['drafter']}"]
    with initialize_config_module("specpolicy.conf", version_base="1.3"):
        cfg = compose(
            "config", overrides=[*overrides(family), *extra, "dataset.num_prompts=1", "generation.max_new_tokens=8"]
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_experiment(cfg, tmp_path)
    deprecated = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    assert deprecated == []


def test_the_check_sees_transformers_deprecations(family):
    """The test above can fail: the deprecated keyword, called as before 5.24, is caught."""
    from specpolicy.core.runtime import Runtime
    from specpolicy.models.loading import load_causal_lm

    model = load_causal_lm(str(family["target"]), Runtime("cpu", "float32"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = model(torch.tensor([[1, 2, 3]]), use_cache=True)
        model(torch.tensor([[4]]), past_key_values=first.cache, use_cache=True)
    assert any(issubclass(w.category, FutureWarning) and "past_key_values" in str(w.message) for w in caught)
