"""Built-in run loggers (one module each), registered through the plugin hooks like any
third-party logger: ``jsonl`` (results.jsonl, the default) and ``wandb`` (Weights & Biases).
Select them with the ``logger`` config group; several can be active (``logger=[jsonl,wandb]``)."""
