"""The static-cache causal LM's former module: ``StaticQwen`` is ``specpolicy.runners.decoder.StaticDecoder``
(kept for imports written before it ran Llama and Mistral too)."""

from specpolicy.runners.decoder import SUPPORTED, StaticDecoder

StaticQwen = StaticDecoder

__all__ = ["SUPPORTED", "StaticDecoder", "StaticQwen"]
