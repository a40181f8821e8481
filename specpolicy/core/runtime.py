"""The shared runtime handed to drafter and verifier: device, dtype, seed, timers."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


#: ``runtime.cuda_mode`` values (``CompileSettings.cuda_mode``).
CUDA_MODES = ("reduce-overhead", "default", "cudagraphs")
#: ``runtime.cpu_matmul`` values (``CompileSettings.cpu_matmul``).
CPU_MATMULS = ("reduction", "blas")


_F = TypeVar("_F", bound=Callable[..., Any])


def no_grad(method: _F) -> _F:
    """``@torch.no_grad()`` for the hot path: calls ``method`` directly when gradients are already
    off (the loop runs under ``torch.inference_mode``), else under ``torch.no_grad()``. The same
    results; about 0.1 us a call against the context manager's 4 us (measured on this project's
    2-core CPU), paid by every drafter step and verification of a round."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return method(*args, **kwargs)
        with torch.no_grad():
            return method(*args, **kwargs)

    return call  # type: ignore[return-value]


def inference_mode(method: _F) -> _F:
    """``@torch.inference_mode()`` for the hot path: calls ``method`` directly when inference mode is
    already on (the loop's passes), else inside it (see ``no_grad``)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.is_inference_mode_enabled():
            return method(*args, **kwargs)
        with torch.inference_mode():
            return method(*args, **kwargs)

    return call  # type: ignore[return-value]


def _widths(key: str, value: Any) -> tuple[int, ...]:
    """``value`` as a sorted tuple of distinct positive ints; ValueError naming ``runtime.<key>``."""
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        widths = tuple(sorted({int(v) for v in items if not isinstance(v, bool) and int(v) == v}))
        ok = bool(widths) and widths[0] >= 1 and len(widths) == len(list(items))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"runtime.{key}={value!r} must be a list of distinct positive integers, e.g. [1, 2, 4, 8]")
    return widths


@dataclass(frozen=True)
class CompileSettings:
    """How the compiled runtime (``runtime.compile=true``; ``specpolicy.runners``) builds and runs its
    static-cache passes: the ``runtime.*`` keys below (``conf/runtime/*.yaml``), read when a model
    is built. Every default is the measured setting documented in ``docs/how-to/compiled-runtime.md``.

    Args:
        buckets: ``runtime.buckets``, the padded widths (new positions) of a pass, each compiled
            once; more positions run in chunks of the largest. Default 1, 2, 4, ..., 64.
        pad_dynamic: ``runtime.pad_dynamic``: pad a pass to its bucket also where graphs take
            dynamic sizes (CPU) or nothing is compiled. Off: such a pass runs at its exact width
            (padding buys no graph there). CUDA's static graphs always pad.
        window: ``runtime.window``, on CPU attention reads the cache up to the next multiple of
            this many columns past the last slot written (a dynamic size), not the whole capacity.
        cuda_mode: ``runtime.cuda_mode``, how passes compile on CUDA: ``reduce-overhead``
            (inductor replayed as CUDA graphs, gpt-fast's setting), ``default`` (inductor, kernels
            launched one by one) or ``cudagraphs`` (dynamo's eager kernels as CUDA graphs). CPU ignores it.
        cpu_pack: ``runtime.cpu_pack``, on CPU run the target's projections from packed, fused copies
            of its weights (q/k/v and gate/up fused; one more copy of the weights in memory).
        cpu_matmul: ``runtime.cpu_matmul``, how the compiled CPU one-row pass multiplies by the
            weights: ``reduction`` (a sum over weight rows, inductor's own loops) or ``blas``.
        cpu_freeze: ``runtime.cpu_freeze``, compile the CPU passes with inductor's freezing (weights
            as graph constants, oneDNN products on weights packed at compile time).
        cpu_cpp_wrapper: ``runtime.cpu_cpp_wrapper``, compile the CPU passes with inductor's C++ wrapper.
        chain_steps: ``runtime.chain_steps``, greedy EAGLE-3 steps fused into one compiled graph
            each; a chain of ``m`` steps runs as the fewest of these, largest first.
    Raises:
        ValueError: one line naming the ``runtime.*`` key, its value and what it accepts.
    """

    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    pad_dynamic: bool = False
    window: int = 128
    cuda_mode: str = "reduce-overhead"
    cpu_pack: bool = True
    cpu_matmul: str = "reduction"
    cpu_freeze: bool = True
    cpu_cpp_wrapper: bool = True
    chain_steps: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", _widths("buckets", self.buckets))
        object.__setattr__(self, "chain_steps", _widths("chain_steps", self.chain_steps))
        for key in ("pad_dynamic", "cpu_pack", "cpu_freeze", "cpu_cpp_wrapper"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"runtime.{key} must be true or false, got {getattr(self, key)!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"runtime.window={self.window!r} must be an integer >= 1 (columns)")
        if self.cuda_mode not in CUDA_MODES:
            raise ValueError(f"runtime.cuda_mode={self.cuda_mode!r} is not one of {', '.join(CUDA_MODES)}")
        if self.cpu_matmul not in CPU_MATMULS:
            raise ValueError(f"runtime.cpu_matmul={self.cpu_matmul!r} is not one of {', '.join(CPU_MATMULS)}")

    @classmethod
    def from_config(cls, runtime: Mapping[str, Any]) -> CompileSettings:
        """The settings among a ``runtime`` config group's keys (the others ignored); lists as tuples."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {
            k: tuple(v) if k in ("buckets", "chain_steps") and not isinstance(v, int) else v
            for k, v in runtime.items()
            if k in names
        }
        return cls(**values)


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
            CUDA; ``specpolicy.runners``); greedy output token-identical to the eager
            runtime. Default False: on CPU compilation takes tens of seconds per model (the
            warm-up, ``warmup_s``), more than it saves on runs of a few thousand tokens, the test
            suite's and most exploratory runs (``docs/how-to/compiled-runtime.md``).
        threads: CPU threads torch's operators use (``torch.set_num_threads``, process-wide), an
            integer >= 1; None (``runtime.threads: null``, the default) keeps torch's choice (one per
            physical core). On a machine other work shares, fewer threads than cores keep a run's
            timings steadier.
        compiled: how the compiled runtime builds its passes (``CompileSettings``: the other
            ``runtime.*`` keys); default the measured settings.
        batch_invariant: ``runtime.batch_invariant``: verify a chain draft of k tokens as k + 1
            one-token target passes (the decoding step's shapes and kernels) instead of one pass of
            k + 1 tokens, and on CUDA turn off cuBLAS's reduced-precision reductions in bfloat16 /
            float16 matmuls (``torch.backends.cuda.matmul.allow_{bf16,fp16}_reduced_precision_reduction``).
            Guarantees greedy outputs bit-identical to vanilla decoding in any dtype, given kernels
            that are deterministic for a shape (the default on CPU and for cuBLAS's matmuls at batch
            1); does NOT make a k-token pass equal a one-token pass (torch offers no batch-invariant
            kernels for that): it avoids the k-token pass. Costs k + 1 target passes per round
            instead of one (the acceptance figures stay; the speedup is gone), so it is for checking
            bit-identity, not for timing. Chains at batch 1 on the ``hf`` verifier; default False.
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
    compiled: CompileSettings = field(default_factory=CompileSettings)
    batch_invariant: bool = False
    warmup_s: float = field(default=0.0, init=False)
    torch_device: torch.device = field(init=False)
    on_cuda: bool = field(init=False)  # ``torch_device`` is a CUDA device (read per round as a plain bool)
    torch_dtype: torch.dtype = field(init=False)
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.compile, bool):
            raise ValueError(f"runtime.compile must be true or false, got {self.compile!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"runtime.batch_invariant must be true or false, got {self.batch_invariant!r}")
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
        self.on_cuda = self.torch_device.type == "cuda"
        dt = self.dtype
        if dt == "auto":
            dt = "bfloat16" if self.torch_device.type == "cuda" else "float32"
        if dt not in _DTYPES:
            raise ValueError(f"runtime.dtype={self.dtype!r} is not one of auto, {', '.join(_DTYPES)}")
        self.torch_dtype = _DTYPES[dt]
        if self.batch_invariant and self.torch_device.type == "cuda":  # full-precision accumulation in matmuls
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self.seed_everything()

    @classmethod
    def from_config(cls, runtime: Mapping[str, Any], seed: int = 0) -> Runtime:
        """The runtime of a ``runtime`` config group (``conf/runtime/*.yaml``: ``device``, ``dtype``,
        ``compile``, ``threads``, ``batch_invariant`` and the ``CompileSettings`` keys) and the run's ``seed``.

        Raises:
            ValueError: one line naming the first bad ``runtime.*`` key.
        """
        return cls(
            device=str(runtime.get("device", "auto")),
            dtype=str(runtime.get("dtype", "auto")),
            seed=int(seed),
            compile=runtime.get("compile", False),
            threads=runtime.get("threads"),
            compiled=CompileSettings.from_config(runtime),
            batch_invariant=runtime.get("batch_invariant", False),
        )

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
        return Timer(self.on_cuda)

    def mark(self) -> Any:
        """A point on the run's timeline, for ``ms_between``: on CPU ``time.perf_counter()`` (s), on
        CUDA a recorded ``torch.cuda.Event`` (no sync). The loop's round takes marks instead of
        ``Timer`` objects: one call each, host work every round (a plain bool decides: reading
        ``torch_device.type`` after a model pass cost ~20 us a mark on the CPU, cold)."""
        if not self.on_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms_between(self, start: Any, end: Any) -> float:
        """Milliseconds from mark ``start`` to mark ``end`` (``mark``; on CUDA it waits for ``end``)."""
        if isinstance(start, float):
            return (end - start) * 1e3
        end.synchronize()
        return float(start.elapsed_time(end))

    def describe(self) -> dict:
        """Device, dtype and library versions, for summaries."""
        import transformers

        return {
            "device": str(self.torch_device),
            "dtype": str(self.torch_dtype).removeprefix("torch."),
            "seed": self.seed,
            "compile": self.compile,
            "batch_invariant": self.batch_invariant,
            "threads": torch.get_num_threads(),
            "warmup_s": round(self.warmup_s, 3),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
