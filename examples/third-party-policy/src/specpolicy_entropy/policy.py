"""``entropy`` policy: stop drafting once the drafter grows uncertain.

The drafter reports each token's top-1 probability c; -log2(c) (min-entropy, in bits) is a
lower bound of the entropy of the drafter's distribution. Draft ``n`` tokens; extend by ``n``
while the newest chunk's mean -log2(c) <= ``max_bits``, up to ``n_max`` tokens.
Raises ValueError naming the key for n < 1, n > n_max or max_bits < 0.
"""

import torch

from specpolicy import LengthPolicy, hookimpl


class EntropyPolicy(LengthPolicy):
    name = "entropy"

    def __init__(self, n: int = 4, max_bits: float = 1.0, n_max: int = 32) -> None:
        if not 1 <= n <= n_max:
            raise ValueError(f"policy.n must be in [1, policy.n_max={n_max}], got {n}")
        if max_bits < 0:
            raise ValueError(f"policy.max_bits must be >= 0, got {max_bits}")
        self.n, self.max_bits, self.n_max = int(n), float(max_bits), int(n_max)

    def next_length(self, draft) -> int:
        k = draft.length
        if k == 0:
            return self.n
        chunk = draft.confidences[-min(self.n, k) :].double().clamp_min(1e-12)
        bits = float(-torch.log2(chunk).mean())  # one host sync per extension decision
        return min(self.n, self.n_max - k) if bits <= self.max_bits and k < self.n_max else 0


@hookimpl
def specpolicy_make_policy(name, config):
    return EntropyPolicy(**config) if name == EntropyPolicy.name else None


@hookimpl
def specpolicy_config_searchpath():
    return ["pkg://specpolicy_entropy.conf"]  # ships conf/policy/entropy.yaml: policy=entropy
