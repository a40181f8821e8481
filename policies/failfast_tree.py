"""``failfast-tree`` policy: FailFast with draft trees -- extend depth while confident, branch where not.

The FailFast paper leaves "FailFast's one-step generation with token trees, via a custom attention
mask" as future work (arXiv 2512.20573, App. D.3). This policy drafts the main chain exactly as
``failfast`` does (chunks of N while every confidence >= τ, up to N_max: "win big" in easy
regions), then spends a small budget where the chain is unsure: at every drafted position whose
confidence is below ``branch_tau``, the drafter's next most likely tokens at that position
(``Drafter.alternatives``: free, the pass that drafted the position computed them) hang as sibling
leaves beside it, up to ``branch_k - 1`` per position and ``max_nodes`` in all. The target verifies
chain and leaves in one pass (``specpolicy.core.tree``): where the chain's token is wrong, a sibling may
still be right, and the round emits one token more. Drafter passes: the chain's, nothing more.
Works with drafters that report ``alternatives`` (``dflash``, ``eagle3``).
"""

from __future__ import annotations

from typing import Any

import torch

from specpolicy.core.policy import TreePolicy
from specpolicy.core.protocols import AlternativesDrafter, device_of
from specpolicy.core.sampling import point_mass
from specpolicy.core.tree import compile_kernels
from specpolicy.core.types import Draft
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl
from specpolicy.policies.failfast import FailFastPolicy

NAME = "failfast-tree"


class FailFastTreePolicy(TreePolicy):
    """FailFast's chain plus sibling leaves at its unsure positions.

    Args:
        n, tau, n_max: the chain's FailFast rule (``failfast``; defaults 10, 0.45, 60).
        branch_tau: positions with confidence below it get siblings, in [0, 1] (default: ``tau``).
        branch_k: tokens considered per unsure position (the chain's + ``branch_k - 1`` siblings),
            an integer in [1, 4] (default 2; 1 = no branching: exactly ``failfast``).
        max_nodes: nodes verified per round at most (chain + siblings), an integer >= 1 (default 64).
    Raises:
        ValueError: naming ``policy.<key>`` for a value out of range.
    """

    name = NAME

    def __init__(
        self,
        n: int = 10,
        tau: float = 0.45,
        n_max: int = 60,
        branch_tau: float | None = None,
        branch_k: int = 2,
        max_nodes: int = 64,
    ) -> None:
        self.chain = FailFastPolicy(n=n, tau=tau, n_max=n_max)
        branch_tau = tau if branch_tau is None else branch_tau
        if isinstance(branch_tau, bool) or not isinstance(branch_tau, (int, float)) or not 0.0 <= branch_tau <= 1.0:
            raise ValueError(f"policy.branch_tau must be in [0, 1], got {branch_tau!r}")
        if isinstance(branch_k, bool) or not isinstance(branch_k, int) or not 1 <= branch_k <= 4:
            raise ValueError(f"policy.branch_k must be an integer in [1, 4], got {branch_k!r}")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"policy.max_nodes must be an integer >= 1, got {max_nodes!r}")
        self.branch_tau, self.branch_k, self.max_nodes = float(branch_tau), branch_k, max_nodes
        compile_kernels()  # the verifier's tree kernels, compiled (or loaded) now, not in a round

    def check_drafter(self, drafter: Any) -> None:
        if not isinstance(drafter, AlternativesDrafter):
            raise ValueError(
                f"policy=failfast-tree needs a drafter that reports alternatives (dflash, eagle3); "
                f"drafter {getattr(drafter, 'name', type(drafter).__name__)!r} does not"
            )

    def draft_tree(self, drafter: AlternativesDrafter, room: int, node_room: int) -> tuple[Draft, str]:
        from specpolicy.core.decoding import draft_round

        device = device_of(drafter)
        nodes = min(self.max_nodes, node_room)
        chain, reason = draft_round(drafter, self.chain, min(room, nodes), device)
        k = chain.length
        if k == 0 or self.branch_k == 1:
            return chain, reason
        ids, probs = drafter.alternatives(self.branch_k)  # (k, branch_k) best first
        ids, probs = ids[:k, 1:], probs[:k, 1:]  # the alternatives to each chain token
        keep = (chain.confidences[:k, None] < self.branch_tau) & (ids != chain.token_ids[:, None])
        position = torch.arange(k, device=ids.device)[:, None].expand_as(ids)
        where = keep.nonzero(as_tuple=True)  # one sync: position-major order
        sib_ids, sib_probs, sib_pos = ids[where], probs[where], position[where]
        budget = nodes - k
        sib_ids, sib_probs, sib_pos = sib_ids[:budget], sib_probs[:budget], sib_pos[:budget]
        parents = torch.cat([torch.arange(-1, k - 1, device=ids.device), sib_pos - 1])
        probs_rows = None
        if chain.probs is not None:  # sampling: siblings are point masses
            probs_rows = torch.cat([chain.probs, point_mass(sib_ids, chain.probs.shape[1]).to(chain.probs.dtype)])
        return Draft(
            token_ids=torch.cat([chain.token_ids, sib_ids]),
            confidences=torch.cat([chain.confidences, sib_probs.to(chain.confidences.dtype)]),
            forward_passes=chain.forward_passes,
            probs=probs_rows,
            parents=parents,
            ends_at_stop_token=chain.ends_at_stop_token,
        ), reason

    def __repr__(self) -> str:
        c = self.chain
        return (
            f"FailFastTreePolicy(n={c.n}, tau={c.tau}, n_max={c.n_max}, branch_tau={self.branch_tau}, "
            f"branch_k={self.branch_k}, max_nodes={self.max_nodes})"
        )


@hookimpl
def specpolicy_register() -> list[PluginEntry]:
    """This module's entry: the policy ``FailFastTreePolicy``, built from its config node and checked by building it."""
    return [
        PluginEntry.from_class(
            "policy",
            NAME,
            FailFastTreePolicy,
            "FailFast with draft trees: extend depth while confident, branch where not",
        )
    ]
