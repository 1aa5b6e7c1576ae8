"""Tezzeret's configuration and the environment key its artifacts are valid in."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

import torch

from esper_core.contracts import EnvironmentKey
from esper_core.karn.profiles import ShapeProfile


class Backend(StrEnum):
    """How Tezzeret compiles a blueprint; its compiler name is part of the environment key.

    EXPORT: ``torch.export`` with a dynamic batch dimension; the artifact is the exported program
        (a graph of ATen ops Kasmina trains directly, nothing to compile). About a second per
        kernel: the default, so a fresh ``make run`` stays fast.
    AOT_INDUCTOR: the exported program plus an AOTInductor package of its forward pass (a
        compiled shared library with swappable weights) for inference on a frozen seed; where
        AOTInductor does not work, the program plus persisted Inductor caches. 5-25 s per kernel
        on 2 CPU cores: opt-in (``--backend aot_inductor``), used by the compile benchmark.
    """

    EXPORT = "export"
    AOT_INDUCTOR = "aot_inductor"

    @property
    def compiler(self) -> str:
        """The ``EnvironmentKey.compiler`` of this backend's artifacts."""
        return _COMPILERS[self]


_COMPILERS = {Backend.EXPORT: "torch.export", Backend.AOT_INDUCTOR: "aot_inductor"}
BackendName = Literal["export", "aot_inductor"]
"""The values of ``Backend``, for flow parameters and CLI choices (a test keeps them equal)."""
COMPILER_NAME = Backend.EXPORT.compiler
"""Compiler name of the default backend (kept for callers that predate backends)."""


@dataclass(kw_only=True, slots=True)
class TezzeretConfig:
    """How Tezzeret compiles, checks, pre-warms and times a kernel.

    Attributes:
        prewarm_batches: Batch sizes to check numerics on, pre-warm and time; each is clipped
            to the profile's ``batch_max``.
        warmup_iters: Untimed calls per batch size before timing.
        timing_iters: Timed calls per batch size (p50/p95/max are over these).
        rtol: Relative tolerance of the compiled-vs-eager check.
        atol: Absolute tolerance of the compiled-vs-eager check.
        latency_budget_ms: Largest median latency of one call at any pre-warm batch size. The
            median, not p95, is budgeted: on a shared CPU a few preempted calls move p95 by tens
            of milliseconds, the median not. p95 is recorded for every batch size all the same.
        enforce_latency_budget: Publish an artifact over ``latency_budget_ms`` QUARANTINED. Off
            by default: a timing depends on the machine's load, and a kernel quarantined on a
            busy machine would change what every later run can germinate; the excess is logged
            as a WARNING and the timings stay on the artifact.
        backend: ``export`` (default) or ``aot_inductor`` (see ``Backend``).
        cache_dir: Inductor/Triton cache directory for the ``aot_inductor`` backend, normally
            ``<ESPER_HOME>/cache/inductor``; None uses Inductor's default (a temp directory).
    """

    prewarm_batches: tuple[int, ...] = (1, 8, 64)
    warmup_iters: int = 3
    timing_iters: int = 20
    rtol: float = 1e-4
    atol: float = 1e-5
    latency_budget_ms: float = 500.0
    enforce_latency_budget: bool = False
    backend: Backend = Backend.EXPORT
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.prewarm_batches or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.prewarm_batches
        ):
            raise ValueError(
                f"prewarm_batches must be a non-empty tuple of positive ints, got "
                f"{self.prewarm_batches!r}: pass e.g. (1, 8, 64)"
            )
        if self.warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.timing_iters < 1:
            raise ValueError(f"timing_iters must be >= 1, got {self.timing_iters}: latency percentiles need samples")
        if not (self.rtol >= 0.0 and self.atol >= 0.0):
            raise ValueError(
                f"rtol and atol must be >= 0, got rtol={self.rtol}, atol={self.atol}: "
                "use e.g. rtol=1e-4, atol=1e-5 for float32"
            )
        if not self.latency_budget_ms > 0.0:
            raise ValueError(f"latency_budget_ms must be > 0, got {self.latency_budget_ms}: e.g. 100.0")
        if self.backend not in tuple(Backend):
            raise ValueError(f"backend must be one of {[b.value for b in Backend]}, got {self.backend!r}")
        self.backend = Backend(self.backend)

    def batch_sizes(self, profile: ShapeProfile) -> tuple[int, ...]:
        """The distinct pre-warm batch sizes for ``profile``, ascending, clipped to its maximum."""
        return tuple(sorted({min(b, profile.batch_max) for b in self.prewarm_batches}))


def environment_key(device: torch.device | str, backend: Backend | str = Backend.EXPORT) -> EnvironmentKey:
    """Where an artifact compiled now, for ``device`` with ``backend``, is valid.

    Args:
        device: The target device (``"cpu"``, ``"cuda"``, ``"cuda:0"``...).
        backend: The Tezzeret backend (its compiler name goes into the key).

    Returns:
        The torch version (without a local build suffix such as ``+cpu``), the device kind and
        the compiler name.

    Raises:
        ValueError: The device is neither CPU nor CUDA, or the backend is unknown.
    """
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"Tezzeret compiles for 'cpu' or 'cuda' devices, got {str(device)!r}")
    if backend not in tuple(Backend):
        raise ValueError(f"backend must be one of {[b.value for b in Backend]}, got {backend!r}")
    return EnvironmentKey(
        torch_version=torch.__version__.split("+", 1)[0],
        device_kind=kind,
        compiler=Backend(backend).compiler,
    )
