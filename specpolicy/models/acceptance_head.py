"""SpecDec++'s acceptance prediction head: a small residual MLP on the drafter's last hidden state.

Source: Huang, Guo & Wang 2024, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate
Lengths" (arXiv 2405.19715), §4: the head predicts, for each drafted token, the probability that the
target accepts it; drafting stops when the predicted probability that at least one drafted token is
rejected exceeds a threshold (``policies/specdecpp.py``). Reference code: Kaffaljidhmah2/SpecDec_pp,
``specdec_pp/wrap_model.py`` (``ResBlock``: ``x + SiLU(Linear(x))``; ``AcceptancePredictionHead``:
the blocks, then ``Linear(hidden, 2)``). One deliberate difference: the reference builds its blocks as
``[ResBlock(h)] * num_layers``, the SAME block repeated (shared weights); here each block has its own.

An addition of this testbed, off by default (``inputs="hidden"``, the paper's): ``inputs=
"hidden+confidence"`` appends the drafter's confidence of the token (its max probability) to the
hidden state as one more input column, so the head starts from the estimate the policies used before
(the bundled drafters' hidden-only heads lose to the raw confidence on held-out drafts where the
confidence is already well calibrated: the small MLP does not recover a softmax over the vocabulary).

On disk (a directory): ``model.safetensors`` (the weights) and ``config.json`` -- ``hidden_size``,
``num_layers``, ``inputs``, ``drafter`` (the drafter's name), ``drafter_hidden_size``, ``training`` (the settings)
and ``calibration`` (held-out metrics), written by ``save_head`` and read by ``load_head``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specpolicy.core.runtime import no_grad

#: Values of ``inputs``: what the head reads (module docstring).
INPUTS = ("hidden", "hidden+confidence")
#: Files of a saved head.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class ResidualBlock(nn.Module):
    """``x + SiLU(Linear(x))`` on ``(n, H)`` (SpecDec++ ``wrap_model.py``, ``ResBlock``)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class AcceptancePredictionHead(nn.Module):
    """``num_layers`` residual blocks, then ``Linear(hidden_size, 2)``: logits of (rejected, accepted).

    Args:
        hidden_size: H, the drafter's hidden size (>= 1).
        num_layers: residual blocks (>= 0; SpecDec++'s best: 3).
        metadata: what ``config.json`` records beside the shape (drafter, training, calibration).
        inputs: ``"hidden"`` (the paper's) or ``"hidden+confidence"`` (module docstring): the blocks
            are ``H`` or ``H + 1`` wide.
    Raises:
        ValueError: for a size out of range or unknown ``inputs``.
    """

    def __init__(
        self, hidden_size: int, num_layers: int = 3, metadata: dict[str, Any] | None = None, inputs: str = "hidden"
    ) -> None:
        super().__init__()
        if hidden_size < 1 or num_layers < 0 or inputs not in INPUTS:
            raise ValueError(
                f"hidden_size must be >= 1, num_layers >= 0 and inputs one of {INPUTS}, got {hidden_size}, {num_layers}, {inputs!r}"
            )
        self.hidden_size, self.num_layers, self.inputs = int(hidden_size), int(num_layers), inputs
        width = hidden_size + (inputs == "hidden+confidence")
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(num_layers)))
        self.out = nn.Linear(width, 2)
        self.metadata: dict[str, Any] = dict(metadata or {})

    @property
    def reads_confidence(self) -> bool:
        """True when the head takes the token's confidence beside its hidden state."""
        return self.inputs == "hidden+confidence"

    def forward(self, hidden: torch.Tensor, confidences: torch.Tensor | None = None) -> torch.Tensor:
        """``(n, H)`` float (and ``(n,)`` confidences when ``reads_confidence``) -> ``(n, 2)`` logits
        (index 1: accepted), in the head's dtype. Raises ValueError when confidences are missing."""
        x = hidden.to(self.out.weight.dtype)
        if self.reads_confidence:
            if confidences is None:
                raise ValueError("this acceptance head reads the confidences too (inputs='hidden+confidence')")
            conf = confidences.to(x.dtype).reshape(-1, 1).clamp(1e-6, 1 - 1e-6)
            x = torch.cat([x, torch.log(conf) - torch.log1p(-conf)], dim=-1)  # the confidence's logit
        return self.out(self.blocks(x))

    @no_grad
    def acceptance_probs(self, hidden: torch.Tensor, confidences: torch.Tensor | None = None) -> torch.Tensor:
        """``(n, H)`` float (and ``(n,)`` confidences when ``reads_confidence``) -> ``(n,) float32``:
        softmax(logits)[:, 1], each drafted token's predicted probability of acceptance, in [0, 1]."""
        return torch.softmax(self(hidden, confidences).float(), dim=-1)[:, 1]

    def fused(self) -> FusedAcceptanceHead:
        """This head's weights as ``FusedAcceptanceHead``, the per-decision path the policies run."""
        return FusedAcceptanceHead(self)


class FusedAcceptanceHead:
    """An ``AcceptancePredictionHead``'s forward as one chain of float32 NumPy products, for the few
    rows a policy decision reads (``specpolicy.core.acceptance.HeadAcceptance``).

    The head is tiny (3 blocks of ``H + 1`` wide on the bundled drafters) and a decision runs it on
    ONE row, so ``nn.Module`` dispatch (a call per block, linear and activation), torch's per-op
    overhead and its intra-op thread pool cost more than the products (measured on the bundled AR
    drafter's head on this CPU, interleaved: ~115 us per call through the module, ~45 us here). Here:
    the weights are copied once into contiguous float32 arrays; a call converts the rows once (one
    device-to-host copy on an accelerator), appends the confidence's logit column, runs the blocks
    (``x + SiLU(x W^T + b)``, SiLU written ``z * (1 + tanh(z / 2)) / 2``: no overflow) and returns
    ``sigmoid(l_accepted - l_rejected)``, which is ``softmax(logits)[:, 1]`` (equal up to float32
    rounding, ~1e-7; ``tests/core/test_acceptance_head.py``).

    Args:
        head: the trained head (its weights are copied: later training does not show here).
    """

    def __init__(self, head: AcceptancePredictionHead) -> None:
        self.hidden_size, self.reads_confidence = head.hidden_size, head.reads_confidence
        with torch.no_grad():
            linears = [block.linear for block in head.blocks if isinstance(block, ResidualBlock)]
            self._blocks = [
                (_array(lin.weight.t()), _array(lin.bias)) for lin in linears
            ]  # ((in, out), (out,)) float32
            weight, bias = head.out.weight, head.out.bias
            self._out_w = _array(weight[1] - weight[0])  # (width,): the accepted-minus-rejected logit
            self._out_b = float(bias[1] - bias[0])

    def acceptance_probs(self, hidden: torch.Tensor, confidences: torch.Tensor | None = None) -> np.ndarray:
        """``(n, H)`` float (and the tokens' ``(n,)`` confidences when ``reads_confidence``) ->
        ``(n,) float64`` acceptance probabilities in [0, 1], as ``AcceptancePredictionHead.acceptance_probs``.
        Raises ValueError when confidences are missing."""
        rows = hidden.detach().float().cpu().numpy()
        if self.reads_confidence:
            if confidences is None:
                raise ValueError("this acceptance head reads the confidences too (inputs='hidden+confidence')")
            conf = np.clip(confidences.detach().float().cpu().numpy().reshape(-1), 1e-6, 1 - 1e-6)
            x = np.empty((rows.shape[0], rows.shape[1] + 1), dtype=np.float32)
            x[:, :-1] = rows
            x[:, -1] = np.log(conf) - np.log1p(-conf)  # the confidence's logit, as the module's input
        else:
            x = rows
        for weight, bias in self._blocks:
            z = x @ weight + bias
            x = x + z * (1.0 + np.tanh(0.5 * z)) * 0.5  # x + SiLU(z)
        logit = (x @ self._out_w).astype(np.float64) + self._out_b
        return 0.5 * (1.0 + np.tanh(0.5 * logit))  # sigmoid, without overflow


def _array(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a contiguous float32 NumPy array on the host (a copy)."""
    return np.ascontiguousarray(tensor.detach().float().cpu().numpy(), dtype=np.float32).copy()


def save_head(head: AcceptancePredictionHead, directory: str | Path) -> Path:
    """Write ``head`` to ``directory`` (created): ``model.safetensors`` and ``config.json``. Returns the directory."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    config = {"hidden_size": head.hidden_size, "num_layers": head.num_layers, "inputs": head.inputs, **head.metadata}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_head_config(directory: str | Path, key: str = "policy.acceptance_head") -> dict[str, Any]:
    """The ``config.json`` of the head in ``directory`` (nothing loaded).

    Raises:
        ValueError: one line naming ``key`` when the directory holds no head.
    """
    path = Path(directory)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise ValueError(f"{key}={str(directory)!r} holds no acceptance head ({CONFIG_FILE} and {WEIGHTS_FILE})")
    config = json.loads((path / CONFIG_FILE).read_text())
    for name in ("hidden_size", "num_layers"):
        if not isinstance(config.get(name), int):
            raise ValueError(f"{key}={str(directory)!r}: its {CONFIG_FILE} has no integer {name!r}")
    return config


def check_head_fits(config: dict[str, Any], drafter_hidden_size: int | None, key: str, where: str) -> None:
    """Raise one line naming ``key`` when a head's ``hidden_size`` is not the drafter's (None: unknown, not checked)."""
    if drafter_hidden_size is not None and int(config["hidden_size"]) != int(drafter_hidden_size):
        raise ValueError(
            f"{key}={where!r} is a head for hidden size {config['hidden_size']}, but the drafter's hidden size "
            f"is {drafter_hidden_size} (train one for this drafter: python -m specpolicy.family.train_drafter "
            f"acceptance-head --drafter NAME --out DIR)"
        )


def load_head(
    directory: str | Path,
    drafter_hidden_size: int | None = None,
    key: str = "policy.acceptance_head",
    device: torch.device | str = "cpu",
) -> AcceptancePredictionHead:
    """The head saved in ``directory``, in float32 on ``device``, in eval mode.

    Args:
        drafter_hidden_size: the drafter's H, checked against the head's (None: not checked).
        key: the config key named by errors.
    Raises:
        ValueError: one line naming ``key``: no head there, or a hidden size that is not the drafter's.
    """
    from safetensors.torch import load_file

    config = read_head_config(directory, key)
    check_head_fits(config, drafter_hidden_size, key, str(directory))
    metadata = {k: v for k, v in config.items() if k not in ("hidden_size", "num_layers", "inputs")}
    head = AcceptancePredictionHead(
        config["hidden_size"], config["num_layers"], metadata, config.get("inputs", "hidden")
    )
    head.load_state_dict(load_file(str(Path(directory) / WEIGHTS_FILE)))
    return head.to(device).eval()


#: Subdirectory of a drafter's weights directory holding its head (the bundled drafters' heads).
HEAD_DIR = "acceptance-head"
#: The config key that points a run at a head of the user's own.
HEAD_KEY = "policy.acceptance_head"


def default_head_dir(drafter_config: dict[str, Any]) -> Path | None:
    """``<drafter.model's directory>/acceptance-head`` (the bundled drafters' heads), or None when
    the drafter has no local model directory (a model-free drafter, a hub id)."""
    model = drafter_config.get("model")
    if not isinstance(model, str):
        return None
    from specpolicy.models.sources import resolve_model_path

    try:
        path = Path(resolve_model_path(model))
    except FileNotFoundError:
        return None
    return path / HEAD_DIR if path.is_dir() else None


def _drafter_hidden_size(drafter_config: dict[str, Any]) -> int | None:
    """The drafter's ``hidden_size`` from its ``config.json`` (nothing loaded), None when unknown."""
    head_dir = default_head_dir(drafter_config)
    config = head_dir.parent / "config.json" if head_dir is not None else None
    if config is None or not config.is_file():
        return None
    size = json.loads(config.read_text()).get("hidden_size")
    return int(size) if isinstance(size, int) else None


def check_acceptance_config(config: dict[str, Any]) -> None:
    """The run's ``policy.acceptance=head`` settings checked before any model loads: not on the
    compiled runtime (its runners do not report hidden states) nor the batched loop, a head found
    (``policy.acceptance_head`` or the drafter's bundled one), made for this drafter's hidden size.

    Raises:
        ValueError: one line naming the key, the value and what it takes.
    """
    policy = config.get("policy") or {}
    if policy.get("acceptance", "confidence") != "head":
        return
    if (config.get("runtime") or {}).get("compile", False):
        raise ValueError(
            "policy.acceptance=head reads the drafter's hidden states, which the compiled runtime does not "
            "report: use runtime.compile=false or policy.acceptance=confidence"
        )
    if int((config.get("generation") or {}).get("batch_size", 1)) != 1:
        raise ValueError(
            "policy.acceptance=head runs with generation.batch_size=1 (the batched loop reports no hidden states)"
        )
    drafter = config.get("drafter") or {}
    path = policy.get("acceptance_head")
    where = Path(str(path)).expanduser() if path is not None else default_head_dir(drafter)
    if where is None or not (where / CONFIG_FILE).is_file():
        raise ValueError(
            f"policy.acceptance=head: drafter {drafter.get('name')!r} (drafter.model={drafter.get('model')!r}) has no "
            f"acceptance head{'' if path is None else f' at {HEAD_KEY}={path!r}'}; train one (python -m "
            f"specpolicy.family.train_drafter acceptance-head --drafter {drafter.get('name')} --out DIR) and set "
            f"{HEAD_KEY}=DIR"
        )
    head = read_head_config(where, HEAD_KEY)
    check_head_fits(head, _drafter_hidden_size(drafter), HEAD_KEY, str(where))
    made_for = head.get("drafter")
    if made_for is not None and made_for != drafter.get("name"):
        raise ValueError(
            f"{HEAD_KEY}={str(where)!r} is a head for drafter {made_for!r}, but the run's drafter is {drafter.get('name')!r}"
        )


def wire_acceptance(policy: Any, drafter: Any, drafter_config: dict[str, Any]) -> bool:
    """Load the head a policy with ``acceptance="head"`` reads (``policy.acceptance_choice``) and have
    the drafter report its hidden states (``Drafter.report_hidden``). Returns True when wired; False
    (nothing done) for a policy that reads confidences.

    Raises:
        ValueError: one line naming ``policy.acceptance_head`` when no fitting head is found.
    """
    choice = getattr(policy, "acceptance_choice", None)
    if choice is None or not choice.wants_head:
        return False
    where = choice.head_path if choice.head_path is not None else default_head_dir(drafter_config)
    if where is None:
        raise ValueError(
            f"policy.acceptance=head: drafter {drafter_config.get('name')!r} has no acceptance head; set {HEAD_KEY}=DIR"
        )
    size = getattr(getattr(getattr(drafter, "model", None), "config", None), "hidden_size", None)
    device = getattr(getattr(drafter, "runtime", None), "torch_device", "cpu")
    choice.use_head(load_head(where, size if isinstance(size, int) else None, HEAD_KEY, device))
    drafter.report_hidden = True
    return True
