"""PNG plots for artifacts: curves with seed marks, latency box plots."""

from __future__ import annotations

import pytest

from esper_core.telemetry.plots import EpochPoint, SeedMark, data_uri, latency_png, run_curves_png

PNG = b"\x89PNG\r\n\x1a\n"


def test_run_curves_png() -> None:
    points = [
        EpochPoint(epoch=e, train_loss=2.0 / (e + 1), val_loss=2.1 / (e + 1), val_accuracy=0.1 * e) for e in range(5)
    ]
    png = run_curves_png(points, [SeedMark(epoch=2, label="germinate slot1 lowrank_adapter")], title="run")
    assert png.startswith(PNG) and len(png) > 5_000
    assert data_uri(png).startswith("data:image/png;base64,iVBOR")
    with pytest.raises(ValueError, match="at least one epoch"):
        run_curves_png([])


def test_latency_png() -> None:
    assert latency_png({"a chosen": [1.0, 1.2, 1.1], "a bare": [0.5, 0.6, 0.55]}).startswith(PNG)
    with pytest.raises(ValueError, match="without samples"):
        latency_png({"a": []})
