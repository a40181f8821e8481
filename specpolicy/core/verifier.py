"""The ``Verifier`` interface: the target model that checks drafts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from specpolicy.core.sampling import SamplingConfig
from specpolicy.core.types import Draft, Verification


class Verifier(ABC):
    """Base class of verifiers (``verifiers/``). Holds the target and its KV cache.

    The verifier keeps the committed sequence minus its last token in its KV cache; that
    last token is *pending* and is fed together with the next draft, so each round is one
    forward pass over ``[pending] + draft`` (k + 1 tokens). Vanilla decoding is the same
    call with an empty draft.
    """

    #: Name under which the verifier registers (the Hydra ``verifier=`` choice).
    name: str = ""
    #: The target's tokenizer (a ``transformers`` tokenizer: ``decode``, ``apply_chat_template``).
    #: The run encodes prompts and decodes outputs with it, and drafter factories check their
    #: vocabulary against it; None only for a verifier used without a run (e.g. in tests).
    tokenizer: Any = None
    #: Token ids that end generation (EOS / end-of-turn).
    eos_token_ids: frozenset[int] = frozenset()
    #: Maximum sequence length (prompt + generated + draft) the target supports, in tokens.
    max_context: int = 0
    #: Vocabulary size of the target (drafters must match it).
    vocab_size: int = 0
    #: After ``prefill``, when features were requested (``request_features``): ``(P - 1, F)`` float,
    #: the requested hidden states of the prompt's cached positions ``0 .. P-2`` (the pending last
    #: prompt token has none yet); None otherwise.
    prompt_features: torch.Tensor | None = None

    def request_features(self, layers: tuple[int, ...]) -> None:
        """Ask for the target's hidden states ``layers`` (indices into Hugging Face's
        ``output_hidden_states``: 0 = the embedding output, i = the output of decoder layer i - 1)
        from now on: ``prefill`` then sets ``prompt_features`` and every ``verify`` returns
        ``Verification.features``, both from passes it runs anyway (no extra target pass). An
        empty tuple stops it. Drafters that read the target (``Drafter.target_feature_layers``:
        DFlash, EAGLE-3) need it; the decoding loop calls it before each prompt.

        Raises:
            specpolicy.core.features.FeaturesUnsupported: (a ValueError) this verifier cannot return
                hidden states (the default), or a layer index is out of range.
        """
        if layers:
            from specpolicy.core.features import FeaturesUnsupported

            raise FeaturesUnsupported(
                f"verifier {self.name or type(self).__name__!r} cannot return the target's "
                f"hidden states (requested hidden_states {list(layers)}); use verifier=hf"
            )

    @abstractmethod
    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig | None = None) -> None:
        """Start a new prompt: cache ``prompt_ids[:-1]``, make ``prompt_ids[-1]`` pending.

        Args:
            prompt_ids: ``(P,) int64``, 1 <= P <= ``max_context``.
            sampling: the prompt's sampling settings; None (or greedy) = greedy verification.
                Non-greedy: speculative sampling (``specpolicy.core.sampling.speculative_verify``)
                with the draws from ``runtime.generator``.
        Raises:
            ValueError: naming ``prompt_ids`` if empty or longer than the context.
        """

    @abstractmethod
    def verify(self, draft: Draft) -> Verification:
        """Verify ``draft`` in ONE target forward pass and commit the result to the cache.

        Greedy: keeps the longest prefix of the draft equal to the target's greedy tokens, plus
        the correction (first mismatch) or bonus token (all accepted), which becomes the
        new pending token. Sampling: the prefix accepted by speculative sampling (``draft.probs``
        = q, None = point masses) plus a token drawn from the residual or the bonus distribution.
        The cache is cropped to the committed prefix, never recomputed. An empty draft is
        plain decoding (greedy: argmax; sampling: a draw from p).
        """
