"""What a run's summary compares a grown network with: the static network of its own shape
(plain and tuned), and the uniformly scaled static frontier as context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_core.run.frontier import FRONTIERS, MNIST1D_CNN, SHAPE_YARDSTICKS, FrontierPoint, PairedGap, StaticFrontier
from esper_core.run.recipes import get_recipe
from esper_core.run.reports import finish_run, frontier_lines, yardstick_lines
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
    assert "the host scaled uniformly to the same size reaches" in lines[0]
    assert "beyond the committed frontier" in frontier_lines(MNIST1D_CNN.compare(params=5000, test_accuracy=0.9))[0]
    with pytest.raises(ValueError, match="increasing parameters"):
        StaticFrontier(source="x", seeds=1, epochs=1, points=(MNIST1D_CNN.points[1], MNIST1D_CNN.points[0]))


def test_the_shape_yardstick_is_the_committed_main_job_baseline() -> None:
    y = SHAPE_YARDSTICKS["mnist1d-cnn-grown"]
    baseline = json.loads((REPO / y.source).read_text())
    assert baseline["recipe"] == "mnist1d-cnn-grown" and not baseline["data_per_seed"]
    assert min(baseline["seeds"]) >= 20  # seeds 0-19 chose the schedule: none of them is scored
    assert (
        y.seeds == len(baseline["seeds"]) and y.epochs == baseline["epochs"] == get_recipe("mnist1d-cnn-grown").epochs
    )
    shape = baseline["shape"]
    # The static means are over the seeds at the measured shape: every seed, or the summary's count is wrong.
    assert shape["seeds"] == y.seeds and not baseline["other_shapes"]
    assert dict(y.widths) == shape["widths"]
    assert (y.static_test_accuracy, y.tuned_test_accuracy, y.grown_test_accuracy_sd) == (
        shape["static_test_accuracy_mean"],
        shape["tuned_test_accuracy_mean"],
        shape["grown_test_accuracy_sd"],
    )
    for gap, key in ((y.grown_minus_static, "grown_minus_static"), (y.grown_minus_tuned, "grown_minus_tuned")):
        d = baseline[key]
        assert gap == PairedGap(mean=d["mean"], ci95_low=d["ci95_low"], ci95_high=d["ci95_high"])
    assert set(SHAPE_YARDSTICKS) <= set(FRONTIERS)


def test_the_yardstick_applies_only_to_a_network_of_the_measured_shape() -> None:
    y = SHAPE_YARDSTICKS["mnist1d-cnn-grown"]
    same = y.compare(widths=dict(y.widths), test_accuracy=0.87)
    assert same["same_shape"] and same["grown_test_accuracy"] == 87.0
    lines = yardstick_lines(same)
    assert "shape conv1 16, conv2 8, conv3 16" in lines[0]
    assert f"{y.tuned_test_accuracy:.2f} % with its weight decay tuned on validation" in lines[1]
    assert str(y.grown_minus_tuned) in lines[2]
    other = y.compare(widths={"conv1": 16, "conv2": 8, "conv3": 8}, test_accuracy=0.8)
    assert not other["same_shape"]
    assert "not the shape measured" in yardstick_lines(other)[0]
    assert str(PairedGap(mean=0.41, ci95_low=-0.3, ci95_high=1.09)) == "+0.41 [-0.30, +1.09]"


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
    y = summary.yardstick
    assert y is not None and y["same_shape"] and y["grown_widths"] == {"conv1": 16, "conv2": 8, "conv3": 16}
    report = (session.run_dir / "report.md").read_text()
    assert "## Against the static network of its shape" in report and "minus tuned" in report
    assert "## Against the uniformly scaled static frontier (context)" in report
    assert "its starting size, 858 parameters" in report
    session.close()
    # A run of another length is not compared with a frontier trained for 60 epochs.
    short = Run.start(RunSpec(recipe="mnist1d-cnn-grown", epochs=4, device="cpu", run_id="short"), settings=esper_home)
    while short.epoch < short.config.epochs:
        grow_epoch(short, short.epoch)
    summary = finish_run(short)
    assert summary.frontier is None and summary.yardstick is None
    short.close()
