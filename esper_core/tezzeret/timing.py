"""Latency measurement of a kernel on representative batch sizes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from esper_core.contracts import LatencyStats

Kernel = Callable[[torch.Tensor], torch.Tensor]


def percentile(sorted_ms: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of an ascending sequence.

    Args:
        sorted_ms: Samples in ascending order (at least one).
        q: Quantile in [0, 1].

    Returns:
        The interpolated value.
    """
    assert sorted_ms and 0.0 <= q <= 1.0
    pos = q * (len(sorted_ms) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def latency_key(batch: int, prefix: str = "") -> str:
    """Key of a batch size in ``KernelArtifact.latency``, e.g. ``b64`` or ``aoti-b64``."""
    return f"{prefix}b{batch}"


def time_kernel(
    kernel: Kernel,
    inputs: Sequence[torch.Tensor],
    *,
    warmup_iters: int,
    timing_iters: int,
    prefix: str = "",
) -> dict[str, LatencyStats]:
    """Pre-warm ``kernel`` on each input, then time single calls.

    Args:
        kernel: The callable under test.
        inputs: One input per batch size, already on the kernel's device.
        warmup_iters: Untimed calls per input (fills allocator and kernel caches).
        timing_iters: Timed calls per input.
        prefix: Prepended to each key (``aoti-`` for the inference kernel).

    Returns:
        ``{"b<batch>": LatencyStats}`` per input.
    """
    stats: dict[str, LatencyStats] = {}
    with torch.inference_mode():
        for x in inputs:
            on_cuda = x.device.type == "cuda"
            for _ in range(warmup_iters):
                kernel(x)
            samples: list[float] = []
            for _ in range(timing_iters):
                if on_cuda:
                    torch.cuda.synchronize(x.device)
                start = time.perf_counter()
                kernel(x)
                if on_cuda:
                    # Kernels launch asynchronously: wait for them before stopping the clock.
                    torch.cuda.synchronize(x.device)
                samples.append((time.perf_counter() - start) * 1e3)
            samples.sort()
            stats[latency_key(x.shape[0], prefix)] = LatencyStats(
                p50_ms=percentile(samples, 0.5),
                p95_ms=percentile(samples, 0.95),
                max_ms=samples[-1],
                samples=len(samples),
            )
    return stats
