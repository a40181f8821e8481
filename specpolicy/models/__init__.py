"""The drafters' networks (no ``trust_remote_code``), one per module, among them:

* ``dflash``: DFlash's block-diffusion draft model (Chen, Liang, Liu, arXiv 2602.06036);
* ``eagle3``: EAGLE-3's one-layer draft head (Li et al., arXiv 2503.01840);
* ``fastdllm``: Fast-dLLM v2's block-diffusion LM on a plain ``Qwen2ForCausalLM`` (Wu et al.,
  arXiv 2509.26328): its block-causal mask and passes.

Beneath them: ``sources`` (where a model comes from: bundled name, local directory, hub id),
``checkpoint`` (checkpoint directories' files) and ``loading`` (Hugging Face causal LMs and
tokenizers); the models modules import one another without cycles (``tests/test_house.py``).

The heads conditioned on the target read and write their checkpoints in the official directory
layout (``config.json`` + ``model.safetensors``), so official checkpoints load and ours load in the
official code. The
drafting logic lives in the drafter plugins (``specpolicy.drafters.dflash``, ``.eagle3``,
``.fastdllm``, ...), training in ``specpolicy.family``.
"""
