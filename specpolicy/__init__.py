"""specpolicy: drafting strategies for speculative decoding.

Interfaces: ``Drafter``, ``Verifier``, ``LengthPolicy``; the loop: ``generate``; the
plugin system: ``hookimpl`` and the ``specpolicy`` entry-point group.
"""

from specpolicy.drafter import Drafter
from specpolicy.hookspecs import hookimpl
from specpolicy.policy import LengthPolicy
from specpolicy.resume import register_resolver as _register_resolver  # hydra.run.dir's resolver
from specpolicy.runtime import Runtime
from specpolicy.types import Draft, GenerationResult, RoundRecord, Verification
from specpolicy.verifier import Verifier

__all__ = [
    "Draft",
    "Drafter",
    "GenerationResult",
    "LengthPolicy",
    "RoundRecord",
    "Runtime",
    "Verification",
    "Verifier",
    "hookimpl",
]
__version__ = "0.1.0"
