"""Paired comparisons of two arms over the same seeds: bootstrap confidence intervals, non-inferiority.

Two arms run on the same seeds (same initialisation, data order and test set) differ per seed by
``a[i] - b[i]``; the seed-to-seed spread common to both cancels in that difference. The interval
resamples *seeds* (whole pairs) with replacement, the paired bootstrap, through
``scipy.stats.bootstrap`` with the bias-corrected and accelerated (BCa) method, which covers
better than the plain percentile interval at the 10-30 seeds a benchmark affords. When every
difference is the same there is nothing to resample; the interval is that one value.

Non-inferiority ("``a`` is at most ``margin`` worse than ``b``") is the one-sided test read off
the two-sided 95 % interval: it holds when the interval's lower bound lies above ``-margin``
(a one-sided test at the 2.5 % level). For a lower-is-better metric (a loss, bits per
character) "worse" is the other direction: the upper bound must lie below ``+margin``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats


@dataclass(frozen=True, kw_only=True, slots=True)
class PairedDifference:
    """Mean of the paired differences ``a - b`` and its bootstrap confidence interval.

    Attributes:
        mean: Mean over pairs of ``a[i] - b[i]``.
        ci95_low: Lower bound of the 95 % interval (``confidence`` of ``paired_difference``).
        ci95_high: Upper bound.
        n: Number of pairs (seeds).
        higher_is_better: The metric's direction: accuracy (True) or a loss (False).
    """

    mean: float
    ci95_low: float
    ci95_high: float
    n: int
    higher_is_better: bool = True

    def non_inferior(self, margin: float) -> bool:
        """Whether ``a`` is at most ``margin`` worse than ``b``: the interval's worse end (its lower
        bound, or its upper bound for a lower-is-better metric) stays within ``margin``."""
        if margin < 0:
            raise ValueError(f"margin must be >= 0 (how much worse a may be), got {margin}")
        return self.ci95_low > -margin if self.higher_is_better else self.ci95_high < margin

    def better(self) -> bool:
        """Whether ``a`` beats ``b`` beyond the interval (it excludes 0 on the better side)."""
        return self.ci95_low > 0 if self.higher_is_better else self.ci95_high < 0

    def as_dict(self) -> dict[str, Any]:
        """``{"mean", "ci95_low", "ci95_high", "n"}``, for JSON."""
        return asdict(self)


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    higher_is_better: bool = True,
) -> PairedDifference:
    """Mean of ``a - b`` over pairs with its paired-bootstrap (BCa) confidence interval.

    Args:
        a: One value per seed for the first arm.
        b: The second arm's values, in the same seed order.
        confidence: Two-sided level of the interval.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling (the same inputs and seed give the same interval).
        higher_is_better: The metric's direction (False for a loss): it decides what
            ``non_inferior`` and ``better`` read off the interval, not the interval itself.

    Returns:
        The mean difference, the interval and the number of pairs.

    Raises:
        ValueError: Fewer than 2 pairs, lengths that differ, a non-finite value, or a bad
            ``confidence`` / ``resamples``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples need one value per seed in each arm: got {len(a)} and {len(b)}")
    if len(a) < 2:
        raise ValueError(f"a confidence interval needs at least 2 paired seeds, got {len(a)}; run more seeds")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95, got {confidence}")
    if resamples < 100:
        raise ValueError(f"resamples must be >= 100 for a stable interval, got {resamples}")
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if not np.all(np.isfinite(diff)):
        raise ValueError("paired values must be finite numbers; a run that diverged has no accuracy to compare")
    mean = float(diff.mean())
    if np.ptp(diff) == 0.0:
        return PairedDifference(
            mean=mean, ci95_low=mean, ci95_high=mean, n=len(diff), higher_is_better=higher_is_better
        )
    low, high = _interval(diff, confidence=confidence, resamples=resamples, seed=seed, method="BCa")
    if not (math.isfinite(low) and math.isfinite(high)):
        # BCa's acceleration is undefined for some tiny samples (e.g. 2 seeds): percentile instead.
        low, high = _interval(diff, confidence=confidence, resamples=resamples, seed=seed, method="percentile")
    return PairedDifference(mean=mean, ci95_low=low, ci95_high=high, n=len(diff), higher_is_better=higher_is_better)


def _interval(diff: np.ndarray, *, confidence: float, resamples: int, seed: int, method: str) -> tuple[float, float]:
    with warnings.catch_warnings():
        # A degenerate resample distribution is handled by the caller (nan -> percentile).
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(
            (diff,),
            np.mean,
            confidence_level=confidence,
            n_resamples=resamples,
            method=method,
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
