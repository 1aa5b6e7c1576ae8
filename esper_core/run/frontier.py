"""The static frontier a grown network is judged against: what a network trained at a fixed size
from scratch reaches, per parameter count, as the growth benchmark measured it.

A run's summary sets its grown network beside the static host of the same parameter count
(interpolated as the growth benchmark interpolates: linearly in log(parameters) between the two
nearest frontier widths) and beside its own starting size, so a run shows what growth bought.
The tables are the committed baselines' means (a test keeps them equal to the files); a single
run is one draw against a mean over many seeds, so the summary gives the frontier's spread too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontierPoint:
    """The static host at one width: mean parameters and test accuracy (%) over the seeds."""

    width: float
    params: int
    test_accuracy: float
    test_accuracy_sd: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticFrontier:
    """The static frontier of one host, from one committed growth baseline.

    Attributes:
        source: The baseline file (relative to the repository) the points come from.
        seeds: Seeds each point averages.
        epochs: Epochs each static host trained (a run of another length is not compared).
        points: By width, ascending; the first is the host's starting size.
    """

    source: str
    seeds: int
    epochs: int
    points: tuple[FrontierPoint, ...]

    def __post_init__(self) -> None:
        sizes = [p.params for p in self.points]
        if len(sizes) < 2 or sizes != sorted(set(sizes)):
            raise ValueError("a static frontier needs at least two points with increasing parameters")

    def accuracy_at(self, params: int) -> float | None:
        """The frontier's test accuracy (%) at ``params``; None outside the measured sizes (no
        extrapolation: a frontier says nothing past its widest host)."""
        lo, hi = self.points[0].params, self.points[-1].params
        if not lo <= params <= hi:
            return None
        sizes = [math.log(p.params) for p in self.points]
        return float(np.interp(math.log(params), sizes, [p.test_accuracy for p in self.points]))

    def compare(self, *, params: int, test_accuracy: float) -> dict[str, Any]:
        """A grown network (``params``, test accuracy as a fraction) against the frontier: the
        static host at its size and at the starting size, in percent."""
        start = self.points[0]
        static = self.accuracy_at(params)
        grown = 100.0 * test_accuracy
        return {
            "source": self.source,
            "seeds": self.seeds,
            "grown_params": params,
            "grown_test_accuracy": round(grown, 2),
            "static_same_params": None if static is None else round(static, 2),
            "grown_minus_static": None if static is None else round(grown - static, 2),
            "start_params": start.params,
            "start_test_accuracy": start.test_accuracy,
            "start_test_accuracy_sd": round(start.test_accuracy_sd, 2),
            "widest_params": self.points[-1].params,
        }


MNIST1D_CNN = StaticFrontier(
    source="baselines/growth/width-learned-cnn/growth.json",
    seeds=20,
    epochs=60,
    points=(
        FrontierPoint(width=1.0, params=858, test_accuracy=77.4225, test_accuracy_sd=2.299837236803829),
        FrontierPoint(width=1.5, params=1570, test_accuracy=84.93, test_accuracy_sd=1.9050542194245728),
        FrontierPoint(width=2.0, params=2474, test_accuracy=88.15, test_accuracy_sd=1.4169797383686757),
    ),
)
"""The 8-channel MNIST-1D CNN at 1x, 1.5x and 2x its channels, 60 epochs, 10,000 test signals."""

FRONTIERS: dict[str, StaticFrontier] = {"mnist1d-cnn-width": MNIST1D_CNN, "mnist1d-cnn-grown": MNIST1D_CNN}
"""Built-in recipes with a committed static frontier, by name."""
