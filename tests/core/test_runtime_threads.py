"""``runtime.threads``: the CPU threads a run's torch operators use, recorded in the summary's runtime."""

from __future__ import annotations

import pytest
import torch

from specpolicy.core.runtime import Runtime


def test_threads_sets_torchs_cpu_threads_and_is_recorded():
    before = torch.get_num_threads()
    try:
        runtime = Runtime(device="cpu", threads=1)
        assert torch.get_num_threads() == 1 and runtime.describe()["threads"] == 1
        Runtime(device="cpu")  # None: torch's choice is left as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_threads_is_one_line_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"^runtime.threads must be an integer >= 1 or null"):
        Runtime(device="cpu", threads=bad)
