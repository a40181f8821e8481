"""The core: what runs inside a decoding round, and nothing else.

Types (``Draft``, ``Verification``, ``RoundRecord``), the three interfaces a plugin implements
(``Drafter``, ``Verifier``, ``LengthPolicy`` / ``TreePolicy``), the batch-1 loop (``decoding``)
and the batched loop (``batching``), speculative sampling, draft trees, KV-cache helpers, stop
strings, draft reuse, target features, the shared ``Runtime``, the in-loop cost models a policy
reads (``latency``, ``accounting``, ``calibration``, ``batch_context``) and the config checks a
plugin raises through (``checks``, ``errors``).

Imports nothing from ``specpolicy.models``, ``run``, ``analysis``, ``family`` or ``plugins``
(checked by ``lint-imports``; see ``[tool.importlinter]`` in ``pyproject.toml``).
"""
