"""The networks of drafters conditioned on the target (no ``trust_remote_code``), one per module:

* ``dflash``: DFlash's block-diffusion draft model (Chen, Liang, Liu, arXiv 2602.06036);
* ``eagle3``: EAGLE-3's one-layer draft head (Li et al., arXiv 2503.01840).

Each module reads and writes its checkpoints in the official directory layout (``config.json`` +
``model.safetensors``), so official checkpoints load and ours load in the official code. The
drafting logic lives in the drafter plugins (``specpolicy.drafters.dflash`` / ``.eagle3``),
training in ``specpolicy.family``.
"""
