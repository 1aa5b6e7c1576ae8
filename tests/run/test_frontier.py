"""The static frontier a run's summary compares a grown network with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_core.run.frontier import FRONTIERS, MNIST1D_CNN, FrontierPoint, StaticFrontier
from esper_core.run.recipes import get_recipe
from esper_core.run.reports import finish_run, frontier_lines
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.run.steps import grow_epoch
from esper_core.settings import EsperSettings

REPO = Path(__file__).resolve().parents[2]


def test_the_table_is_the_committed_baseline() -> None:
    baseline = json.loads((REPO / MNIST1D_CNN.source).read_text())
    result = baseline["results"]["mnist1d-cnn-width"]
    points = [
        FrontierPoint(width=f["width"], params=int(f["params_mean"]), test_accuracy=f["test_acc_mean"],
                      test_accuracy_sd=f["test_acc_std"])
        for f in result["frontier"]
    ]  # fmt: skip
    assert MNIST1D_CNN.points == tuple(points)
    assert MNIST1D_CNN.seeds == len(result["seeds"])
    assert MNIST1D_CNN.epochs == get_recipe("mnist1d-cnn-width").epochs  # the baseline ran the recipe's length
    for recipe in FRONTIERS:
        assert get_recipe(recipe).host.build().__class__.__name__ == "MNIST1DCNN"


def test_the_frontier_is_read_between_its_points_and_never_past_them() -> None:
    assert MNIST1D_CNN.accuracy_at(858) == pytest.approx(77.4225)
    assert MNIST1D_CNN.accuracy_at(2474) == pytest.approx(88.15)
    middle = MNIST1D_CNN.accuracy_at(1722)
    assert middle is not None and 84.93 < middle < 88.15
    assert MNIST1D_CNN.accuracy_at(857) is None and MNIST1D_CNN.accuracy_at(2475) is None
    compared = MNIST1D_CNN.compare(params=1722, test_accuracy=0.8757)
    assert compared["grown_minus_static"] == pytest.approx(87.57 - middle, abs=0.01)
    assert compared["start_params"] == 858
    lines = frontier_lines(compared)
    assert "a static network of the same size trained from scratch reaches" in lines[1]
    assert "beyond the committed frontier" in frontier_lines(MNIST1D_CNN.compare(params=5000, test_accuracy=0.9))[1]
    with pytest.raises(ValueError, match="increasing parameters"):
        StaticFrontier(source="x", seeds=1, epochs=1, points=(MNIST1D_CNN.points[1], MNIST1D_CNN.points[0]))


@pytest.mark.slow
def test_the_main_job_grows_and_sets_the_network_beside_the_frontier(esper_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe="mnist1d-cnn-grown", device="cpu", run_id="main"), settings=esper_home)
    while session.epoch < session.config.epochs:
        grow_epoch(session, session.epoch)
    summary = finish_run(session)
    # Both scheduled seeds merged: conv1 and conv3 doubled, conv2 as it was.
    assert summary.seeds == {"conv1+width": "dormant", "conv2+width": "dormant", "conv3+width": "dormant"}
    assert session.trainer.model.layer_widths[:3] == (16, 8, 16)
    f = summary.frontier
    assert f is not None and f["grown_params"] == summary.total_params and 858 < f["grown_params"] < 2474
    assert f["static_same_params"] is not None and f["grown_test_accuracy"] == round(100 * summary.test_accuracy, 2)
    report = (session.run_dir / "report.md").read_text()
    assert "## Against the static frontier" in report and "its starting size, 858 parameters" in report
    session.close()
    # A run of another length is not compared with a frontier trained for 60 epochs.
    short = Run.start(RunSpec(recipe="mnist1d-cnn-grown", epochs=4, device="cpu", run_id="short"), settings=esper_home)
    while short.epoch < short.config.epochs:
        grow_epoch(short, short.epoch)
    assert finish_run(short).frontier is None
    short.close()
