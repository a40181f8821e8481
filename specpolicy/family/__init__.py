"""The bundled small model family, trained on GSM8K.

* ``target``: 12-layer Qwen2 (~10.5M params), the model being accelerated;
* ``ar-drafter``: 4-layer Qwen2 (~2.4M params) distilled from the target's greedy outputs;
* ``dllm-drafter``: the AR drafter adapted into a block-diffusion drafter (Fast-dLLM v2
  recipe; conventions in :mod:`specpolicy.family.block_diffusion`), then trained further with
  an objective matched to one-pass drafting (suffix masks, the target's soft targets) and
  given a calibrated confidence temperature.

Modules: ``tokenizer`` (BPE + chat template), ``data`` (examples, batches), ``models``
(sizes, save/load), ``trainer`` (shared loop), ``train_ar``, ``distill``,
``block_diffusion``, ``train_dllm``, ``calibrate``, ``evaluate``, ``diagnostics`` (CLI:
``python -m specpolicy.family.diagnostics``), ``training_log``, ``pipeline`` (CLI:
``python -m specpolicy.family``).
"""

from specpolicy.family.block_diffusion import BLOCK_SIZE

DEFAULT_DIR = "specpolicy/family/bundle"
MODEL_NAMES = ("target", "ar-drafter", "dllm-drafter")

__all__ = ["BLOCK_SIZE", "DEFAULT_DIR", "MODEL_NAMES"]
