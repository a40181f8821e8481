"""Runners: HOW a model runs, apart from WHAT a drafter or verifier computes with it.

A drafter states its algorithm once, as one pass over ``(R, n)`` positions of ``R`` requests; a
runner executes that pass eagerly (the Hugging Face modules, a dynamic cache per request), on the
compiled runtime's static KV cache (``runtime.compile=true``: ``torch.compile``, CUDA graphs on
CUDA) and on the batched loop's shared static cache of one sequence per request -- batch 1 being
``R`` = 1 of the same forward. The compile settings are ``runtime.*`` config keys
(``specpolicy.core.runtime.CompileSettings``). A runner builds its static caches (its constructor on
the compiled runtime, ``batched(slots)`` for a batched run); a drafter's ``__init__`` only wires its
models and its runner.

- ``static``: the static KV cache every compiled model shares (``StaticPasses``): buckets,
  padding, chunks, masks, compilation.
- ``decoder``, ``eagle3``, ``dflash``: one forward per model (``StaticDecoder``: Llama, Mistral, Qwen2, Qwen3; ``StaticEagle3``,
  ``StaticDFlash``), and the runners the EAGLE-3 and DFlash drafters state their pass against
  (``Eagle3Runner``, ``DFlashRunner``: eager alone, eager padded over several requests, static;
  EAGLE-3's tree passes and fused greedy chain too).
- ``fastdllm``: ``FastDLLMRunner``, Fast-dLLM v2's block passes (unmasking, boundary, committed
  blocks) for the Fast-dLLM and DEER drafters: eager (one request; several padded into one pass) or
  on ``StaticQwen`` under a block-wise causal mask (one sequence, or one per request of a batched run).
- ``sequences``: a static cache's sequences shared by a run's requests (``SharedSequences``), the
  static-cache side of the EAGLE-3 and DFlash runners (``SequencesRunner``: the batch-1 cache its
  constructor builds on the compiled runtime, ``batched(slots)``'s, ``eager()``) and their
  drafters' side of it (``SharedSequencesDrafter``).
- ``causal``: ``CausalRunner``, a causal LM's passes over ``(R, n)`` positions, eager or compiled,
  one request or many (eager padded steps, draft-tree passes too): the runner the AR drafter and a
  third-party drafter code against (``docs/how-to/write-a-drafter-or-verifier.md``).

Plugins (``drafters/``, ``verifiers/``) import this package as public API.
"""
