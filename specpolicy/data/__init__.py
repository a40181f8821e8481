"""The bundled prompt sets (GSM8K, MATH-500, AIME 2024, HumanEval; see ``README.md`` here) and
their loader (``specpolicy.data.datasets``). A layer of its own, below ``run`` and ``analysis``,
since both read prompts (a run, and the figures that show them)."""
