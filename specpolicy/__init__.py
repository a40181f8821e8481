"""specpolicy: drafting strategies for speculative decoding.

The public API a plugin author needs, importable from here:

* the interfaces: ``Drafter``, ``Verifier``, ``LengthPolicy`` (and ``TreePolicy`` for tree drafts),
  and the capabilities a drafter or verifier may add, as ``typing.Protocol`` types
  (``specpolicy.core.protocols``: ``TreeDrafter``, ``BlockTreeDrafter``, ``AlternativesDrafter``,
  ``BlockDrafter``, ``NgramBlockDrafter``, ``FeatureDrafter``, ``FeatureVerifier``, ``BatchedVerifier``);
* the data they exchange: ``Draft``, ``Verification``, ``RoundRecord``, ``GenerationResult``;
* the loop: ``generate`` (batch 1; ``specpolicy.core.batching.generate_batch`` for many requests);
* the shared ``Runtime`` and ``SamplingConfig``;
* the plugin system: ``hookimpl``, ``PluginEntry`` (what a plugin's ``specpolicy_register`` hook
  returns) and the ``specpolicy`` entry-point group;
* the config checks a plugin's validate hook raises through: ``ConfigError``, ``check_init``,
  ``check_keys``, ``integer``, ``number``, ``choice``, ``boolean``.

The package's layers: ``core`` (the loop and its interfaces), ``models`` (networks and checkpoint
loading), ``data`` (prompt sets), ``plugins`` (hook specs and the plugin manager), ``analysis``
(results to numbers), ``run`` (the command line and a run's life cycle), ``family`` (the bundled
models and their training).
"""

from specpolicy.core.checks import boolean, check_init, check_keys, choice, integer, number
from specpolicy.core.decoding import generate
from specpolicy.core.drafter import Drafter
from specpolicy.core.errors import ConfigError
from specpolicy.core.policy import LengthPolicy, TreePolicy
from specpolicy.core.protocols import (
    AlternativesDrafter,
    BatchedVerifier,
    BlockDrafter,
    BlockTreeDrafter,
    FeatureDrafter,
    FeatureVerifier,
    NgramBlockDrafter,
    TreeDrafter,
)
from specpolicy.core.runtime import Runtime
from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, GenerationResult, RoundRecord, Verification
from specpolicy.core.verifier import Verifier
from specpolicy.plugins.hookspecs import PluginEntry, hookimpl

__all__ = [
    "AlternativesDrafter",
    "BatchedVerifier",
    "BlockDrafter",
    "BlockTreeDrafter",
    "ConfigError",
    "Draft",
    "Drafter",
    "FeatureDrafter",
    "FeatureVerifier",
    "GenerationResult",
    "LengthPolicy",
    "NgramBlockDrafter",
    "PluginEntry",
    "RoundRecord",
    "Runtime",
    "SamplingConfig",
    "TreeDrafter",
    "TreePolicy",
    "Verification",
    "Verifier",
    "boolean",
    "check_init",
    "check_keys",
    "choice",
    "generate",
    "hookimpl",
    "integer",
    "number",
]
__version__ = "0.1.0"
