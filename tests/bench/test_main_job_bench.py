"""bench.main_job: the main job's grown network against the static network of its own shape."""

from __future__ import annotations

import functools

import pytest

from bench import main_job
from esper_core.data import DataSpec
from esper_core.run.recipes import get_recipe, mnist1d_splits
from esper_core.tamiyo.heuristic import HeuristicConfig


def test_seeds_that_chose_the_schedule_are_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main_job.main(["--seeds", "4", "--first-seed", "3"])
    assert exit_.value.code == 2
    assert "seeds 0-19 chose the main job's schedule" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main_job.main(["--seeds", "1"])
    assert "at least 2" in capsys.readouterr().err


def test_a_subject_is_checked_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="no schedule to replay"):
        main_job.Subject(recipe="mnist1d-mlp-width", policy="scheduled")
    with pytest.raises(ValueError, match="add --policy heuristic"):
        main_job.Subject(default_heuristic=True)  # the main job replays a schedule: the rule never decides
    with pytest.raises(SystemExit):
        main_job.main(["--workers", "0"])
    assert "--workers 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main_job.main(["--recipe", "digits-mlp"])
    assert "invalid choice" in capsys.readouterr().err
    # The default controller on a recipe, with the rule HeuristicConfig() ships instead of the recipe's thresholds.
    config = main_job.Subject(recipe="mnist1d-mlp-width", default_heuristic=True).config(20, data_per_seed=False)
    assert config.tamiyo.policy == "heuristic" and config.tamiyo.heuristic == HeuristicConfig()
    assert config.tamiyo.schedule == ()
    own = main_job.Subject(recipe="mnist1d-mlp-width").config(20, data_per_seed=False)
    assert own.tamiyo.heuristic == get_recipe("mnist1d-mlp-width").tamiyo.heuristic != HeuristicConfig()


def test_a_seed_draws_its_own_data_only_when_asked() -> None:
    subject = main_job.Subject()
    own = subject.config(21, data_per_seed=True).data
    assert isinstance(own, DataSpec) and isinstance(own.load, functools.partial)
    assert own.load.func is mnist1d_splits and own.load.keywords == {"seed": main_job.DATA_SEED_OFFSET + 21}
    published = subject.config(21, data_per_seed=False).data
    assert isinstance(published, DataSpec) and published.load is mnist1d_splits


def _run(
    seed: int, widths: dict[str, int], grown: float, static: float, tuned: float, halted: str | None = None
) -> dict:
    def arm(acc: float) -> dict:
        return {"test_acc": acc, "val_acc": acc, "params": 1, "train_flops": 10, "halted": None}

    return {
        "seed": seed,
        "widths": widths,
        "grown": {**arm(grown), "halted": halted},
        "static": arm(static),
        "tuned": {**arm(tuned), "weight_decay": 1e-3},
        "tuned_early": {**arm(tuned - 0.5), "weight_decay": 1e-3, "epoch": 40},
    }


def test_the_summary_pairs_every_seed_and_means_the_static_arms_at_the_modal_shape() -> None:
    doubled, other = {"conv1": 16, "conv3": 16}, {"conv1": 16, "conv3": 8}
    runs = [
        _run(20, doubled, 88.0, 86.0, 87.0),
        _run(21, doubled, 90.0, 87.0, 89.0),
        _run(22, other, 80.0, 84.0, 85.0, halted="loss spiked"),
    ]
    out = main_job.summarise(runs, subject=main_job.Subject(), data_per_seed=False)
    assert out["grown_minus_static"]["n"] == 3
    assert out["grown_minus_static"]["mean"] == pytest.approx((2 + 3 - 4) / 3, abs=0.01)
    assert out["grown_minus_tuned"]["mean"] == pytest.approx((1 + 1 - 5) / 3, abs=0.01)
    assert out["grown_minus_tuned_early"]["mean"] == pytest.approx((1 + 1 - 5) / 3 + 0.5, abs=0.01)
    assert out["shape"] == {
        "widths": doubled,
        "seeds": 2,
        "static_test_accuracy_mean": 86.5,
        "tuned_test_accuracy_mean": 88.0,
        "tuned_early_test_accuracy_mean": 87.5,
        "grown_test_accuracy_mean": 89.0,
        "grown_test_accuracy_sd": pytest.approx(1.41, abs=0.01),
    }
    assert out["other_shapes"] == [{"seed": 22, "widths": other, "grown_minus_static": -4.0}]
    assert out["halted"] == {"grown": 1, "static": 0, "tuned": 0, "tuned_early": 0}


@pytest.mark.slow
def test_one_seed_trains_the_static_network_at_the_grown_widths() -> None:
    out = main_job.run_seed(20, subject=main_job.Subject(), data_per_seed=False, weight_decays=(0.0, 1e-3))
    # The scheduled seeds merged: conv1 and conv3 doubled; the static arms have that shape's parameters.
    assert out["widths"] == {"conv1": 16, "conv2": 8, "conv3": 16}
    assert out["static"]["params"] == out["grown"]["params"] == out["tuned"]["params"]
    assert set(out["grid"]) == {"0", "0.001"}
    # Tuned: the weight decay best on validation; tuned_early: the same after early-stopping each run.
    assert out["tuned"]["val_acc"] == max(r["val_acc"] for r in out["grid"].values())
    assert out["tuned_early"]["val_acc"] == max(r["val_acc"] for r in out["grid_early_stopped"].values())
    assert out["static"] == out["grid"]["0"]
    assert all(out["grid_early_stopped"][wd]["val_acc"] >= out["grid"][wd]["val_acc"] for wd in out["grid"])
    assert 0 <= out["tuned_early"]["epoch"] < 60
    # The grown network trained its first epochs at the start size: fewer FLOPs than the static one.
    assert out["static"]["train_flops"] > out["grown"]["train_flops"]
