"""What a drafter or verifier can do beyond its base class, as ``typing.Protocol`` types.

A tree policy, the decoding loop or the batched loop asks for a capability with
``isinstance(obj, Protocol)`` (every protocol here is ``runtime_checkable``: the check is that the
methods and attributes exist, as the ``hasattr`` probes it replaces did; signatures are the
documented contract, checked by type checkers, not at run time). A drafter gets a capability by
implementing the members -- no registration, no base class beyond ``Drafter``:

* ``TreeDrafter`` -- expands a draft tree node by node (``policy=eagle2-tree``: ``eagle3``, ``ar``);
* ``BlockTreeDrafter`` -- expands a tree block by block, ``k`` tokens per pass (``policy=falcon-tree``:
  ``falcon``);
* ``AlternativesDrafter`` -- reports each drafted position's top-k tokens from the passes that drafted
  them (``policy=failfast-tree``: ``dflash``, ``eagle3``, ``dart``, ``falcon``);
* ``BlockDrafter`` -- an ``AlternativesDrafter`` that predicts a block's positions in parallel
  (``policy=block-tree``: ``dflash``);
* ``NgramBlockDrafter`` -- a ``BlockDrafter``-like drafter that states its tokens per pass and the
  n-gram context of its tree search (``policy=dart-tree``: ``dart``, ``dflash``);
* ``FeatureDrafter`` -- states the target hidden states it reads (``Drafter.target_feature_layers``;
  it reads them when non-empty: ``dflash``, ``eagle3``, ``dart``, ``falcon``); ``feature_layers``
  gives them for any drafter;
* ``FeatureVerifier`` -- a verifier that takes requests for the target's hidden states
  (``Verifier.request_features``; ``hf``);
* ``BatchedVerifier`` -- a verifier with a batched form for the batched loop (``Verifier.batched``;
  ``hf``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class TreeDrafter(Protocol):
    """A drafter that expands a draft tree node by node (EAGLE-2's dynamic tree, Li et al. 2024;
    ``specpolicy.policies.eagle2_tree``). Node numbers: 0 = the root (the pending token), others
    as ``tree_expand`` returns them; the tree lives for the round (``commit`` ends it)."""

    def tree_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The root's ``top_k`` children: ids ``(top_k,) int64`` and log-probabilities
        ``(top_k,) float32``, best first (one drafter pass)."""
        ...

    def tree_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` nodes (``tokens (m,) int64`` under ``parents (m,)``) in one pass; return their
        node numbers ``(m,) int64``, child ids ``(m, top_k) int64`` and child log-probabilities
        ``(m, top_k) float32``."""
        ...


@runtime_checkable
class BlockTreeDrafter(Protocol):
    """A drafter that expands a tree block by block, ``k`` tokens per pass (Falcon's static tree,
    Gao et al. 2024; ``specpolicy.policies.falcon_tree``)."""

    #: tokens one pass drafts (the depth of one block).
    k: int

    def tree_block_root(self, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The root block: ids ``(k, top_k) int64`` and log-probabilities ``(k, top_k) float32``."""
        ...

    def tree_block_expand(
        self, tokens: torch.Tensor, parents: torch.Tensor | list[int], top_k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``m`` blocks (``tokens (m, k) int64`` under block numbers ``parents (m,)``) in one
        pass; return their block numbers ``(m,) int64``, ids ``(m, k, top_k) int64`` and
        log-probabilities ``(m, k, top_k) float32``."""
        ...


@runtime_checkable
class AlternativesDrafter(Protocol):
    """A drafter that reports, for each position of the round's draft so far, its most likely
    tokens from the passes that drafted it (no extra pass; ``specpolicy.policies.failfast_tree``)."""

    def alternatives(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids ``(n, k) int64`` and probabilities ``(n, k) float32``, best first, for the ``n``
        drafted positions."""
        ...


@runtime_checkable
class BlockDrafter(AlternativesDrafter, Protocol):
    """An ``AlternativesDrafter`` that predicts a block's positions in parallel, so a position's
    top-k does not depend on the token chosen before it (``specpolicy.policies.block_tree``)."""

    #: positions of one block (B; a pass drafts B - 1 tokens past the pending one).
    block_size: int


@runtime_checkable
class NgramBlockDrafter(AlternativesDrafter, Protocol):
    """A drafter that drafts a block in one pass and gives a tree search its tokens per pass and
    its n-gram context (DART, Liang et al. 2026; ``specpolicy.policies.dart_tree``)."""

    @property
    def tokens_per_pass(self) -> int:
        """Draft tokens one pass gives."""
        ...

    @property
    def ngram_context(self) -> torch.Tensor:
        """The last committed tokens, the pending one last: ``(<= 8,) int64``."""
        ...


@runtime_checkable
class FeatureDrafter(Protocol):
    """A drafter that states the target hidden states it reads (``Drafter.target_feature_layers``:
    indices into Hugging Face's ``output_hidden_states``; empty = none). Every ``Drafter`` has the
    attribute; one reads the target when it is non-empty, and then takes ``features=`` in
    ``prefill`` and reads ``Verification.features`` in ``commit``."""

    target_feature_layers: tuple[int, ...]


@runtime_checkable
class FeatureVerifier(Protocol):
    """A verifier that takes requests for the target's hidden states (``Verifier.request_features``:
    ``prompt_features`` after ``prefill``, ``Verification.features`` from ``verify``)."""

    prompt_features: torch.Tensor | None

    def request_features(self, layers: tuple[int, ...]) -> None:
        """Return hidden states ``layers`` from now on (``()``: stop). Raises ``FeaturesUnsupported``."""
        ...


@runtime_checkable
class BatchedVerifier(Protocol):
    """A verifier with a batched form for the batched loop (``specpolicy.core.batching``)."""

    def batched(self, *args: Any, **kwargs: Any) -> Any:
        """The batched target (``Verifier.batched(slots=)``; ``hf``: ``HFBatchVerifier``)."""
        ...


def feature_layers(drafter: object | None) -> tuple[int, ...]:
    """The target hidden states ``drafter`` reads (``FeatureDrafter``); ``()`` for None or a
    drafter that reads none."""
    return tuple(drafter.target_feature_layers or ()) if isinstance(drafter, FeatureDrafter) else ()


@runtime_checkable
class RuntimeHolder(Protocol):
    """A drafter (or verifier) that holds the run's ``specpolicy.core.runtime.Runtime`` as
    ``runtime`` (every built-in one does)."""

    runtime: Any


def device_of(drafter: object, default: str = "cpu") -> torch.device | str:
    """The device ``drafter`` drafts on: its ``runtime.torch_device`` (``RuntimeHolder``), else
    ``default`` (a drafter without a runtime, or with ``runtime`` None)."""
    # getattr, not isinstance against the runtime-checkable Protocol: the same answer, without the
    # Protocol's attribute walk each round (a tree policy asks every round)
    runtime = getattr(drafter, "runtime", None)
    return default if runtime is None else runtime.torch_device
