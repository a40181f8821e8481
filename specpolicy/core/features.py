"""Target features: the target's hidden states that drafters conditioned on the target read.

DFlash (Chen, Liang, Liu, arXiv 2602.06036) and EAGLE-3 (Li et al., arXiv 2503.01840, §3) draft
from the target's own representation: the hidden states of a few target layers at every committed
position, concatenated (shallow to deep). A drafter names them as indices into Hugging Face's
``output_hidden_states`` tuple (``Drafter.target_feature_layers``), where index 0 is the embedding
output and index i the output of decoder layer i - 1 (the last entry is the final norm's output);
each checkpoint format maps its own convention onto it (DFlash's layer id i is the OUTPUT of
layer i: index i + 1; EAGLE-3's is the INPUT of layer i: index i).

The verifier returns them from passes it runs anyway: the prompt's from the prefill
(``Verifier.prompt_features``), and each round's from the verification pass
(``Verification.features``), for exactly the positions it commits to its KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specpolicy.core.errors import ConfigError


class FeaturesUnsupported(ConfigError):
    """A drafter asked for target features the verifier cannot return (a verifier without hidden
    states, or a layer the target does not have). One line, before decoding starts."""


def check_feature_layers(layers: Sequence[int], num_hidden_states: int, who: str = "the drafter") -> tuple[int, ...]:
    """Check feature indices against a target with ``num_hidden_states`` entries in
    ``output_hidden_states`` (its decoder layers + 1).

    Returns:
        ``tuple(layers)``.
    Raises:
        FeaturesUnsupported: naming ``who``, the bad index and the range, for an index outside
            ``[0, num_hidden_states)`` or a non-integer.
    """
    out = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_hidden_states:
            raise FeaturesUnsupported(
                f"{who} reads the target's hidden_states[{i!r}], but the target has {num_hidden_states - 1} decoder "
                f"layers (hidden_states indices 0..{num_hidden_states - 1})"
            )
        out.append(int(i))
    return tuple(out)


def check_prompt_features(prompt_ids: torch.Tensor, features: torch.Tensor | None, who: str) -> None:
    """Check what a feature-reading drafter's ``prefill`` got: a prompt ``(P,) int64`` of at least one
    token and ``features`` whose first dimension is ``P - 1`` (the target's features of the prompt
    but its last token, ``Verifier.prompt_features``).

    Raises:
        ValueError: naming ``who`` (``"the eagle3 drafter"``) for an empty prompt or missing /
            mis-shaped features.
    """
    n = int(prompt_ids.shape[0])
    if n < 1:
        raise ValueError(f"prompt_ids is empty; {who} needs at least one token")
    if features is None or tuple(features.shape[:1]) != (n - 1,):
        raise ValueError(
            f"{who} needs the target's features of the prompt's first {n - 1} positions "
            f"(got {None if features is None else tuple(features.shape)}); run it through "
            "specpolicy.core.decoding.generate, which asks the verifier for them"
        )


def select_features(
    hidden_states: Sequence[torch.Tensor], layers: Sequence[int], rows: slice | torch.Tensor = slice(None)
) -> torch.Tensor:
    """The requested hidden states of batch row 0, concatenated along the feature axis.

    Args:
        hidden_states: Hugging Face's ``output_hidden_states``: L + 1 tensors ``(1, n, H)``.
        layers: indices into it, in the drafter's order.
        rows: the positions to keep: a slice (default all) or an ``(m,) int64`` index.
    Returns:
        ``(m, len(layers) * H)`` in the model's dtype (m = positions kept).

    The layers are joined first, then the rows taken: two tensor ops whatever the layer count
    (the same values as taking each layer's rows and joining them; host work per round).
    """
    return torch.cat([hidden_states[i] for i in layers], dim=-1)[0, rows]


def select_features_batch(hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """The requested hidden states of every batch row, concatenated along the feature axis:
    ``(b, n, len(layers) * H)`` from L + 1 tensors ``(b, n, H)`` (the batched verifier's rows)."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def target_parts(verifier, who: str) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """The target's input embeddings, LM head and config, which DFlash and EAGLE-3 drafters share
    with it (they store neither).

    Args:
        verifier: the run's verifier; it must hold a Hugging Face model as ``verifier.model``.
        who: the drafter, for messages.
    Returns:
        ``(embed_tokens, lm_head, config)``.
    Raises:
        FeaturesUnsupported: when the verifier holds no Hugging Face model.
    """
    model = getattr(verifier, "model", None)
    if model is None or not hasattr(model, "get_input_embeddings"):
        raise FeaturesUnsupported(
            f"drafter {who!r} uses the target's embeddings and LM head, but verifier "
            f"{getattr(verifier, 'name', '') or type(verifier).__name__!r} holds no Hugging Face "
            "model (verifier.model); use verifier=hf"
        )
    return model.get_input_embeddings(), model.get_output_embeddings(), model.config


def probe_verifier(verifier, layers: Sequence[int], num_hidden_states: int, who: str) -> None:
    """Check, when a drafter is built, that ``verifier`` can return ``layers`` (one line now rather
    than at the first prompt), then switch the request off again (the loop asks before each prompt).

    Raises:
        FeaturesUnsupported: a layer the target does not have, or a verifier without hidden states.
    """
    check_feature_layers(layers, num_hidden_states, who)
    verifier.request_features(tuple(layers))
    verifier.request_features(())
