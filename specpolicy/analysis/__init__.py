"""From results to numbers: reading a run's ``results.jsonl`` (``results``), its summary and
metrics, the tables and figures, the oracle and modeled latencies, profiling, batch and GPU
pass models, and the machine conditions a timing was taken under. Never imports ``run``."""
