"""Paired bootstrap intervals and non-inferiority verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from esper_core.telemetry.paired import PairedDifference, paired_difference


def test_interval_covers_the_known_mean_difference_at_about_the_nominal_rate() -> None:
    # 200 synthetic benchmarks of 20 paired seeds: b carries a large per-seed effect shared with a
    # (what pairing removes), a = b + 0.5 + small noise. The 95 % interval should cover 0.5 in
    # about 95 % of them; BCa on 20 pairs lands a little under, never near 50 %.
    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(200):
        shared = rng.normal(95.0, 3.0, size=20)
        a = shared + 0.5 + rng.normal(0.0, 0.4, size=20)
        result = paired_difference(a, shared, resamples=2000, seed=trial)
        assert result.ci95_low <= result.mean <= result.ci95_high and result.n == 20
        covered += result.ci95_low <= 0.5 <= result.ci95_high
    assert 0.88 <= covered / 200 <= 0.99


def test_pairing_makes_the_interval_narrower_than_the_seed_spread() -> None:
    rng = np.random.default_rng(1)
    shared = rng.normal(95.0, 3.0, size=20)
    result = paired_difference(shared + 0.3, shared + rng.normal(0.0, 0.1, size=20))
    assert result.ci95_high - result.ci95_low < 0.2


def test_same_inputs_and_seed_give_the_same_interval() -> None:
    a, b = [96.1, 97.0, 95.5, 96.8, 97.3], [95.9, 96.2, 95.8, 96.0, 96.9]
    assert paired_difference(a, b, seed=3) == paired_difference(a, b, seed=3)
    assert paired_difference(a, b, seed=3) != paired_difference(a, b, seed=4)


def test_identical_differences_and_two_pairs_give_finite_intervals() -> None:
    same = paired_difference([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert (same.mean, same.ci95_low, same.ci95_high) == (0.5, 0.5, 0.5)
    two = paired_difference([1.0, 2.0], [0.0, 0.5])
    assert np.isfinite(two.ci95_low) and two.ci95_low <= two.mean <= two.ci95_high


def test_non_inferiority_verdicts() -> None:
    within = PairedDifference(mean=-0.1, ci95_low=-0.25, ci95_high=0.05, n=20)
    too_wide = PairedDifference(mean=-0.1, ci95_low=-0.35, ci95_high=0.15, n=20)
    better = PairedDifference(mean=0.4, ci95_low=0.2, ci95_high=0.6, n=20)
    on_the_margin = PairedDifference(mean=0.0, ci95_low=-0.3, ci95_high=0.3, n=20)
    assert within.non_inferior(0.3) and better.non_inferior(0.3)
    assert not too_wide.non_inferior(0.3) and not on_the_margin.non_inferior(0.3)
    with pytest.raises(ValueError, match="margin must be >= 0"):
        within.non_inferior(-0.3)


def test_bad_input_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least 2 paired seeds"):
        paired_difference([1.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1.0, float("nan")], [1.0, 2.0])


def test_a_lower_is_better_metric_reads_the_interval_the_other_way() -> None:
    # Bits per character: a - b < 0 is a improving on b.
    lower = paired_difference([1.50, 1.61, 1.55, 1.70], [1.60, 1.70, 1.66, 1.79], higher_is_better=False)
    assert lower.ci95_high < 0 and lower.better() and lower.non_inferior(0.02)
    worse = PairedDifference(mean=0.03, ci95_low=0.01, ci95_high=0.05, n=20, higher_is_better=False)
    slightly = PairedDifference(mean=0.005, ci95_low=-0.01, ci95_high=0.015, n=20, higher_is_better=False)
    assert not worse.better() and not worse.non_inferior(0.02)
    assert slightly.non_inferior(0.02) and not slightly.better()
    # The same numbers as accuracy: the worse end is the lower bound.
    assert PairedDifference(mean=0.03, ci95_low=0.01, ci95_high=0.05, n=20).better()
    assert lower.as_dict()["higher_is_better"] is False
