"""The signal-samples bench refuses a comparison it cannot make, before any run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.signal_samples import run


@pytest.mark.parametrize("samples", [[512], [512, 512], [256, 0]])
def test_needs_two_distinct_positive_counts(samples: list[int], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="two or more distinct sample counts"):
        run("mnist1d-mlp-width", home=tmp_path, version=1, samples=samples, seeds=2, workers=0)
