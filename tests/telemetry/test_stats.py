"""Latency statistics: interpolated percentiles on known lists (numpy's default method)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esper_core.contracts import LatencyStats
from esper_core.telemetry import latency_stats, percentile


def test_latency_stats_on_a_known_list() -> None:
    stats = latency_stats([5.0, 1.0, 3.0, 2.0, 4.0])

    assert stats == LatencyStats(p50_ms=3.0, p95_ms=4.8, max_ms=5.0, samples=5)


def test_percentile_interpolates_like_numpy() -> None:
    samples = [float(x) for x in range(1, 11)]
    assert percentile(samples, 50) == pytest.approx(5.5)
    assert percentile(samples, 95) == pytest.approx(9.55)
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 100) == 10.0
    rng = np.random.default_rng(0)
    values = rng.exponential(2.0, size=37).tolist()
    for q in (0, 10, 50, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_single_sample() -> None:
    assert latency_stats([0.42]) == LatencyStats(p50_ms=0.42, p95_ms=0.42, max_ms=0.42, samples=1)


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        latency_stats([])
    with pytest.raises(ValueError, match="sample 1 is nan"):
        latency_stats([1.0, math.nan])
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\]"):
        percentile([1.0], 150)
