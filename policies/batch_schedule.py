"""``batch-schedule`` policy: the speculation length set by the batch size (vLLM's schedule).

As the batch grows the target turns compute-bound and each verified draft token costs real
time, so the best fixed length falls with the batch size (vllm-project/vllm#32374 schedules the
number of speculative tokens by batch size; SPEED-Bench, arXiv 2604.09557, finds the best draft
length depends on it). A table maps batch sizes to lengths: a round with ``B`` requests in flight
(``LengthPolicy.batch``; 1 in the batch-1 loop) drafts the length of the largest listed batch
size <= ``B``; 0 switches speculation off. The defaults are the best fixed K per batch size that
a preliminary batched run of the bundled family's EAGLE-3 drafter found on this CPU (16 GSM8K
prompts; ``benchmarks/batched.py``); other drafters and machines want their own table.
"""

from __future__ import annotations

import bisect

from specpolicy.core.policy import LengthPolicy
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

NAME = "batch-schedule"


class BatchSchedulePolicy(LengthPolicy):
    """Draft ``lengths[i]`` tokens when ``batch_sizes[i] <= B < batch_sizes[i + 1]`` (B: requests in
    flight). Stateless.

    Args:
        batch_sizes: increasing integers >= 1, the first 1 (tokens per draft for each band of batch sizes).
        lengths: one integer >= 0 per batch size (speculation length in tokens; 0 = plain decoding).
    Raises:
        ValueError: naming ``policy.batch_sizes`` / ``policy.lengths`` and what is wrong.
    """

    name = NAME

    def __init__(self, batch_sizes: list[int] = (1, 2, 4, 8, 16), lengths: list[int] = (6, 5, 4, 4, 3)) -> None:
        sizes, lengths = list(batch_sizes), list(lengths)
        if (
            not sizes
            or any(isinstance(b, bool) or not isinstance(b, int) for b in sizes)
            or sizes[0] != 1
            or any(b >= c for b, c in zip(sizes, sizes[1:]))
        ):
            raise ValueError(f"policy.batch_sizes must be increasing integers starting at 1, got {sizes!r}")
        if len(lengths) != len(sizes) or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in lengths):
            raise ValueError(f"policy.lengths must be one integer >= 0 per batch size ({len(sizes)}), got {lengths!r}")
        self.batch_sizes, self.lengths = sizes, lengths

    def length_for(self, requests: int) -> int:
        """The speculation length (tokens) for ``requests`` in flight."""
        return self.lengths[bisect.bisect_right(self.batch_sizes, max(requests, 1)) - 1]

    def next_length(self, draft: Draft) -> int:
        requests = self.batch.requests if self.batch is not None else 1
        return max(self.length_for(requests) - draft.length, 0)

    def __repr__(self) -> str:
        return f"BatchSchedulePolicy(batch_sizes={self.batch_sizes}, lengths={self.lengths})"


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``BatchSchedulePolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy", NAME, BatchSchedulePolicy, "the speculation length set by the batch size (vLLM's schedule)"
        )
    ]
