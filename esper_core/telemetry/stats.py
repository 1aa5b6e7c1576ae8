"""Latency statistics: percentiles and the p50/p95/max summary every benchmark reports.

Percentiles use linear interpolation between closest ranks, the method ``numpy.percentile`` uses
by default (Hyndman & Fan type 7), so numbers computed here match what people check with numpy.
With few samples (an epoch of 4 steps) this gives values between two observed samples; the
``max_ms`` field keeps the worst observed sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from esper_core.contracts import LatencyStats


def _sorted_finite(samples: Sequence[float]) -> list[float]:
    values = [float(x) for x in samples]
    if not values:
        raise ValueError("need at least one sample; time the workload before summarising it")
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise ValueError(f"sample {i} is {v}; latency samples must be finite numbers")
    values.sort()
    return values


def _percentile_sorted(values: list[float], q: float) -> float:
    rank = (len(values) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``samples``, by linear interpolation (numpy's default).

    Args:
        samples: The values, in any order.
        q: Percentile in ``[0, 100]``.

    Returns:
        The interpolated percentile; ``q=0`` is the minimum and ``q=100`` the maximum.

    Raises:
        ValueError: If ``samples`` is empty or holds a non-finite value, or ``q`` is out of range.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100] (a percentile, not a fraction), got {q}")
    return _percentile_sorted(_sorted_finite(samples), q)


def latency_stats(samples_ms: Sequence[float]) -> LatencyStats:
    """Summarise latency samples as p50 / p95 / max.

    Args:
        samples_ms: Latencies in milliseconds, one per timed call.

    Returns:
        ``LatencyStats`` with interpolated p50 and p95, the largest sample and the count.

    Raises:
        ValueError: If ``samples_ms`` is empty, holds a non-finite value, or (via the contract)
            a negative one.
    """
    values = _sorted_finite(samples_ms)
    return LatencyStats(
        p50_ms=_percentile_sorted(values, 50.0),
        p95_ms=_percentile_sorted(values, 95.0),
        max_ms=values[-1],
        samples=len(values),
    )
