"""What a grown network is judged against, for a run's summary.

- ``ShapeYardstick``: the static network **of the grown network's own final shape**, trained from
  scratch, plain and with its weight decay tuned on validation, paired seed by seed with the grown
  network on seeds nothing was chosen on (``bench/main_job.py``). This is the yardstick: it says
  whether growing beat simply training the network it grew into.
- ``StaticFrontier``: the host scaled uniformly (every layer by the same factor), per parameter
  count, as the growth benchmark measured it, read at the grown network's parameter count
  (linearly in log(parameters) between the two nearest widths). Context only: a uniformly scaled
  network is not the grown shape, and it was not tuned.

The tables are the committed baselines' numbers (tests keep them equal to the files); a single
run is one draw against means over many seeds, so the summary gives the spread too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


@dataclass(frozen=True, kw_only=True, slots=True)
class PairedGap:
    """A paired mean difference in points with its bootstrap 95 % interval."""

    mean: float
    ci95_low: float
    ci95_high: float

    def __str__(self) -> str:
        return f"{self.mean:+.2f} [{self.ci95_low:+.2f}, {self.ci95_high:+.2f}]"


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeYardstick:
    """The static network of a grown network's own shape, from one committed ``bench.main_job`` run.

    Attributes:
        source: The baseline file (relative to the repository).
        seeds: Paired seeds the gaps are over (none of them chose anything the run does).
        epochs: Epochs every arm trained (a run of another length is not compared).
        widths: The shape (layer -> output units) most seeds grew to; the static means are at it.
        static_test_accuracy: That shape trained from scratch, weight decay 0: mean test accuracy (%).
        tuned_test_accuracy: The same with weight decay chosen on validation: mean test accuracy (%).
        grown_test_accuracy_sd: One grown run's spread (standard deviation over the seeds, points).
        grown_minus_static: Grown minus ``static``, paired by seed.
        grown_minus_tuned: Grown minus ``tuned``, paired by seed.
    """

    source: str
    seeds: int
    epochs: int
    widths: tuple[tuple[str, int], ...]
    static_test_accuracy: float
    tuned_test_accuracy: float
    grown_test_accuracy_sd: float
    grown_minus_static: PairedGap
    grown_minus_tuned: PairedGap

    def compare(self, *, widths: Mapping[str, int], test_accuracy: float) -> dict[str, Any]:
        """A grown network (its final ``widths``, test accuracy as a fraction) against the yardstick:
        the static means apply only to a network of the measured shape (``same_shape``)."""
        return {
            "source": self.source,
            "seeds": self.seeds,
            "widths": dict(self.widths),
            "grown_widths": dict(widths),
            "same_shape": dict(widths) == dict(self.widths),
            "grown_test_accuracy": round(100.0 * test_accuracy, 2),
            "static_test_accuracy": self.static_test_accuracy,
            "tuned_test_accuracy": self.tuned_test_accuracy,
            "grown_test_accuracy_sd": self.grown_test_accuracy_sd,
            "grown_minus_static": str(self.grown_minus_static),
            "grown_minus_tuned": str(self.grown_minus_tuned),
        }


MNIST1D_CNN_GROWN = ShapeYardstick(
    source="baselines/main-job/mnist1d-cnn-grown.json",
    seeds=40,
    epochs=60,
    widths=(("conv1", 16), ("conv2", 8), ("conv3", 16)),
    static_test_accuracy=86.02,
    tuned_test_accuracy=86.85,
    grown_test_accuracy_sd=1.73,
    grown_minus_static=PairedGap(mean=1.56, ci95_low=0.9, ci95_high=2.24),
    grown_minus_tuned=PairedGap(mean=0.73, ci95_low=0.06, ci95_high=1.33),
)
"""``make run``'s recipe on seeds 20-59 and the published MNIST-1D (10,000 test signals)."""

SHAPE_YARDSTICKS: dict[str, ShapeYardstick] = {"mnist1d-cnn-grown": MNIST1D_CNN_GROWN}
"""Built-in recipes with a committed shape-matched yardstick, by name."""
