"""The capability protocols (``specpolicy.core.protocols``): a tree policy accepts exactly the
drafters that implement its protocol's members, whatever their class, and refuses the others in one
line naming the drafter; the helpers read a drafter's feature layers and device."""

from __future__ import annotations

import pytest
import torch

from specpolicy import (
    AlternativesDrafter,
    BlockDrafter,
    BlockTreeDrafter,
    FeatureDrafter,
    FeatureVerifier,
    NgramBlockDrafter,
    TreeDrafter,
)
from specpolicy.core.protocols import device_of, feature_layers
from specpolicy.core.runtime import Runtime
from specpolicy.policies.block_tree import BlockTreePolicy
from specpolicy.policies.dart_tree import DartTreePolicy
from specpolicy.policies.eagle2_tree import Eagle2TreePolicy
from specpolicy.policies.failfast_tree import FailFastTreePolicy
from specpolicy.policies.falcon_tree import FalconTreePolicy


class Plain:
    """A drafter-like object with no capability (and no ``name``)."""


class Tree:
    def tree_root(self, top_k):
        return torch.zeros(top_k, dtype=torch.long), torch.zeros(top_k)

    def tree_expand(self, tokens, parents, top_k):
        raise NotImplementedError


class BlockTree:
    k = 2

    def tree_block_root(self, top_k):
        raise NotImplementedError

    def tree_block_expand(self, tokens, parents, top_k):
        raise NotImplementedError


class Alternatives:
    def alternatives(self, k):
        return torch.zeros((0, k), dtype=torch.long), torch.zeros((0, k))


class Block(Alternatives):
    block_size = 4


class NgramBlock(Block):
    tokens_per_pass = 3
    ngram_context = torch.zeros(2, dtype=torch.long)


CASES = [  # policy, the drafter it accepts, the protocol
    (Eagle2TreePolicy(), Tree(), TreeDrafter),
    (FalconTreePolicy(), BlockTree(), BlockTreeDrafter),
    (FailFastTreePolicy(), Alternatives(), AlternativesDrafter),
    (BlockTreePolicy(), Block(), BlockDrafter),
    (DartTreePolicy(use_ngram=False), NgramBlock(), NgramBlockDrafter),
]


@pytest.mark.parametrize("policy, drafter, protocol", CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_a_tree_policy_accepts_the_drafters_of_its_protocol_and_names_the_others(policy, drafter, protocol):
    assert isinstance(drafter, protocol) and not isinstance(Plain(), protocol)
    policy.check_drafter(drafter)  # any class with the members
    with pytest.raises(ValueError, match=rf"^policy={policy.name} needs .* drafter 'Plain' (does not|is not one)"):
        policy.check_drafter(Plain())


def test_a_block_drafter_is_an_alternatives_drafter_with_a_block_size():
    assert isinstance(Block(), AlternativesDrafter) and not isinstance(Alternatives(), BlockDrafter)
    with pytest.raises(ValueError, match="drafter 'Alternatives' is not one"):
        BlockTreePolicy().check_drafter(Alternatives())


def test_feature_layers_and_device_of():
    reader = Plain()
    reader.target_feature_layers = (1, 3)
    assert isinstance(reader, FeatureDrafter) and feature_layers(reader) == (1, 3)
    assert feature_layers(Plain()) == () and feature_layers(None) == ()
    assert not isinstance(Plain(), FeatureVerifier)
    holder = Plain()
    holder.runtime = Runtime(device="cpu", dtype="float32", seed=0)
    assert device_of(holder) == torch.device("cpu") and device_of(Plain()) == "cpu"
    holder.runtime = None
    assert device_of(holder, "meta") == "meta"
