"""The shared runtime handed to drafter and verifier: device, dtype, seed, timers."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Timer:
    """Wall-clock timer of one region. On CUDA it records events and only synchronises when
    ``ms`` is read (so timing adds no device sync to the hot loop); on CPU it uses
    ``time.perf_counter``."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._start: Any = None  # torch.cuda.Event on CUDA, else time.perf_counter() s
        self._end: Any = None

    def __enter__(self) -> Timer:
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._cuda:
            self._end.record()
        else:
            self._end = time.perf_counter()

    @property
    def ms(self) -> float:
        """Elapsed milliseconds (synchronises the CUDA event on first read)."""
        if self._end is None:
            raise RuntimeError("Timer.ms read before the timed region ended")
        if self._cuda:
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        return (self._end - self._start) * 1e3


@dataclass
class Runtime:
    """Device, dtype and seed shared by every model of a run.

    Args:
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"auto"`` (bfloat16 on CUDA, float32 on CPU) or one of float32, float64,
            bfloat16, float16.
        seed: seeds Python, and torch (CPU and CUDA), and ``generator``.
        compile: the compiled runtime (``runtime.compile=true``): the hf target and the ar, eagle3
            and dflash drafters run static KV caches compiled with ``torch.compile`` (CUDA graphs on
            CUDA; ``specpolicy.models.static_qwen``); greedy output token-identical to the eager
            runtime. Default False: on CPU compilation takes tens of seconds per model (the
            warm-up, ``warmup_s``), more than it saves on runs of a few thousand tokens, the test
            suite's and most exploratory runs (``docs/how-to/compiled-runtime.md``).
        threads: CPU threads torch's operators use (``torch.set_num_threads``, process-wide), an
            integer >= 1; None (``runtime.threads: null``, the default) keeps torch's choice (one per
            physical core). On a machine other work shares, fewer threads than cores keep a run's
            timings steadier.
    Attributes:
        generator: the ``torch.Generator`` on ``torch_device`` that every sampling draw of the
            run uses (drafters' samples, speculative sampling's acceptance and residual draws;
            ``specpolicy.core.sampling``), reseeded by ``seed_everything``: same seed, same output.
        warmup_s: seconds the models of the run spent compiling (0 on the eager runtime), added by
            each compiled model when it is built; reported apart from tokens/s (``describe``).
    Raises:
        ValueError: for an unknown ``dtype``, a ``device`` torch does not know, or a CUDA ``device`` on
            a machine without CUDA.
    """

    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    compile: bool = False
    threads: int | None = None
    warmup_s: float = field(default=0.0, init=False)
    torch_device: torch.device = field(init=False)
    torch_dtype: torch.dtype = field(init=False)
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.compile, bool):
            raise ValueError(f"runtime.compile must be true or false, got {self.compile!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"runtime.threads must be an integer >= 1 or null (torch's choice), got {self.threads!r}")
        dev = self.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"runtime.device={self.device!r} but CUDA is not available; use 'auto' or 'cpu'")
        try:
            self.torch_device = torch.device(dev)
        except RuntimeError:  # torch's own message lists every device type it knows
            raise ValueError(f"runtime.device={self.device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
        dt = self.dtype
        if dt == "auto":
            dt = "bfloat16" if self.torch_device.type == "cuda" else "float32"
        if dt not in _DTYPES:
            raise ValueError(f"runtime.dtype={self.dtype!r} is not one of auto, {', '.join(_DTYPES)}")
        self.torch_dtype = _DTYPES[dt]
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self.seed_everything()

    def seed_everything(self, seed: int | None = None) -> None:
        """Seed Python's and torch's generators and ``self.generator`` with ``seed`` (default:
        ``self.seed``)."""
        s = self.seed if seed is None else seed
        random.seed(s)
        torch.manual_seed(s)
        self.generator = torch.Generator(device=self.torch_device)
        self.generator.manual_seed(s)

    def timer(self) -> Timer:
        """A new ``Timer`` (CUDA events on CUDA, perf_counter on CPU)."""
        return Timer(self.torch_device.type == "cuda")

    def describe(self) -> dict:
        """Device, dtype and library versions, for summaries."""
        import transformers

        return {
            "device": str(self.torch_device),
            "dtype": str(self.torch_dtype).removeprefix("torch."),
            "seed": self.seed,
            "compile": self.compile,
            "threads": torch.get_num_threads(),
            "warmup_s": round(self.warmup_s, 3),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
