"""The zoo policy bench: its seed arguments and its projection of a default zoo training."""

from __future__ import annotations

import argparse

import pytest

from bench.zoo_policy import _config, _reference_seconds, per_family_seconds, projection
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.zoo_train import ZooTraining, ZooTrainingResult


def _episode(recipe: str, policy: str, wall_s: float) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"{recipe}-{policy}", recipe=recipe, policy=policy, seed=1000, test_accuracy=0.5, val_accuracy=0.5,
        host_params=1, total_params=1, forward_flops=1, wall_s=wall_s, commands={}, policy_version=None,
    )  # fmt: skip


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "zoo_seed": 0, "families": "mlp,cnn1d", "exclude": "", "members": 2, "demonstrations": 1,
        "iterations": 1, "rollouts": 1, "train_seeds": "1000-1009", "selection_seeds": "2000,2001", "kinds": "width",
    }  # fmt: skip
    return argparse.Namespace(**(values | overrides))


def test_the_command_line_builds_a_zoo_training_and_refuses_shared_seeds() -> None:
    config = _config(_args(exclude="cnn1d"))
    assert config.zoo.families == ("mlp", "cnn1d") and config.exclude_families == ("cnn1d",)
    assert config.seeds.train == tuple(range(1000, 1010)) and config.seeds.selection == (2000, 2001)
    with pytest.raises(ValueError, match="train and selection seeds overlap on \\[1005\\]"):
        _config(_args(selection_seeds="1005"))


def test_the_projection_counts_the_default_trainings_episodes_at_the_measured_speeds() -> None:
    config = _config(_args())
    result = ZooTrainingResult(
        members={"m0": "mlp", "m1": "cnn1d"},
        versions=[1, 2],
        chosen=1,
        scores=[],
        episodes={"demonstrations": [_episode("m0", "heuristic", 1.0), _episode("m1", "heuristic", 3.0)]},
        update_s=[2.0, 1.0],
        phase_s={},
    )
    assert per_family_seconds(result)["cnn1d"]["mean_s_heuristic"] == 3.0
    out = projection(result, config)
    target = ZooTraining()
    # Per member: 2 demonstrations, 3 x 2 rollouts, 2 selection seeds x (none, heuristic, 4 versions).
    assert out["episodes"] == target.members * (2 + 3 * 2 + 2 * 6) == 280
    assert out["episode_s_by_family"]["mlp"] == 1.0 and out["episode_s_by_family"]["cnn1d"] == 3.0
    reference = _reference_seconds()
    if reference:  # families not measured here: bench.zoo's medians, scaled by this run's speed
        assert out["episode_s_by_family"]["gru"] == pytest.approx(
            reference["gru"] * out["gnn_scale_vs_bench_zoo"], abs=1e-3
        )
    assert out["total_h"] > out["episodes_h"] > 0


def test_the_command_line_offers_branch_slots_and_refuses_an_unknown_kind() -> None:
    assert _config(_args(kinds="width,branch")).zoo.kinds == ("width", "branch")
    with pytest.raises(SystemExit, match="unknown seed kinds"):
        _config(_args(kinds="lstm"))
