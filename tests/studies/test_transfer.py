"""The transfer benchmark: held-out policies against static networks of their own grown shape."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from esper_core.run.config import ModelSpec
from esper_core.simic.learn import SimicConfig
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.simic_train import TrainingPlan
from esper_core.studies.transfer import ARMS, TransferConfig, format_table, run, transfer_png
from esper_core.studies.yardstick import best_on_validation, evaluated_members, static_shape
from esper_core.studies.zoo_train import ZooSeeds, ZooTraining
from esper_core.tamiyo.heuristic import DEFAULTS_SEARCH_ZOO_SEED
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.zoo import ZooMember, ZooSpec, draw_member

TINY_ZOO = ZooSpec(seed=0, families=("mlp", "cnn1d"), epochs=(4,), train_samples=(1000,), widths=(8,))
TINY_TRAINING = ZooTraining(
    zoo=TINY_ZOO,
    members=1,
    seeds=ZooSeeds(train=(1000, 1001), selection=(2000,), evaluation=(0, 1, 2)),
    plan=TrainingPlan(
        demonstrations=1,
        iterations=1,
        rollouts=1,
        gnn=TamiyoGNNConfig(hidden_dim=16, num_layers=2),
        simic=SimicConfig(flops_penalty=0.01, imitation_epochs=2, ppo_epochs=2, batch_size=8),
    ),
)


def test_a_benchmark_that_cannot_be_run_honestly_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="not in the zoo's families"):
        TransferConfig(families=("gru",), training=TINY_TRAINING)
    with pytest.raises(ValueError, match="leave it empty"):
        TransferConfig(families=("mlp",), training=dataclasses.replace(TINY_TRAINING, exclude_families=("cnn1d",)))
    with pytest.raises(ValueError, match=r"set ZooSpec\(kinds=\('width',\)\)"):
        TransferConfig(
            families=("mlp",),
            training=dataclasses.replace(TINY_TRAINING, zoo=dataclasses.replace(TINY_ZOO, kinds=("width", "branch"))),
        )
    with pytest.raises(ValueError, match=r"seeds must be 2\.\.3"):
        TransferConfig(families=("mlp",), training=TINY_TRAINING, seeds=4)
    with pytest.raises(ValueError, match="including 0.0"):
        TransferConfig(families=("mlp",), training=TINY_TRAINING, seeds=2, weight_decays=(1e-4, 1e-3))
    with pytest.raises(ValueError, match="is the zoo's own seed.*pick another seed"):
        TransferConfig(
            families=("mlp",),
            training=dataclasses.replace(TINY_TRAINING, zoo=dataclasses.replace(TINY_ZOO, seed=3)),
            eval_zoo_seed=3,
        )
    with pytest.raises(ValueError, match="the heuristic arm's rule .* was searched on"):
        TransferConfig(
            families=("mlp",),
            training=dataclasses.replace(TINY_TRAINING, zoo=dataclasses.replace(TINY_ZOO, seed=3)),
            eval_zoo_seed=DEFAULTS_SEARCH_ZOO_SEED,
        )


def test_the_static_arm_is_the_host_at_the_grown_widths_freshly_initialised() -> None:
    member = next(m for m in (draw_member(ZooSpec(), i) for i in range(40)) if m.family == "cnn2d" and m.depth >= 2)
    host = member.recipe().host
    assert isinstance(host, ModelSpec)
    grown = {"conv1": member.width + 3}
    model = static_shape(host.build, grown, (1, 8, 8), torch.float32)
    conv, norm = model.get_submodule("conv1"), model.get_submodule("bn1")
    assert isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)
    assert conv.out_channels == member.width + 3 and norm.num_features == member.width + 3
    # Every channel starts as PyTorch starts a BatchNorm, none zero-padded.
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.equal(
        norm.running_var, torch.ones(grown["conv1"])
    )
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_the_tuned_arm_is_chosen_on_validation_accuracy_or_a_language_models_loss() -> None:
    def run(accuracy: float, loss: float) -> EpisodeResult:
        return EpisodeResult(
            run_id="r", recipe="m", policy="none", seed=0, test_accuracy=0.0, val_accuracy=accuracy, val_loss=loss,
            host_params=1, total_params=1, forward_flops=1, train_flops=1, wall_s=0.0, commands={},
            policy_version=None,
        )  # fmt: skip

    grid = {0.0: run(0.0, 2.0), 1e-4: run(0.0, 1.8), 1e-3: run(0.0, 1.9)}
    assert best_on_validation(grid, language_model=True) == 1e-4
    assert best_on_validation(grid, language_model=False) == 0.0  # a tie: the grid's first
    assert best_on_validation({0.0: run(0.7, 1.0), 1e-4: run(0.8, 1.2)}, language_model=False) == 1e-4


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    config = TransferConfig(families=("cnn1d",), training=TINY_TRAINING, eval_members=1, seeds=2)
    return run(config)


def test_a_held_out_family_is_scored_on_evaluation_seeds_by_a_policy_that_never_saw_it(result: dict[str, Any]) -> None:
    family = result["results"]["cnn1d"]
    # The held-out training drew no member of the family it is scored on.
    assert set(family["held_out_training"]["members"].values()) == {"mlp"}
    assert result["evaluation_seeds"] == [0, 1] and {r["seed"] for r in family["runs"]} == {0, 1}
    # Its members are drawn under another zoo seed than the one the heuristic's rule is searched
    # on (``esper bench rules`` plays the zoo's own members).
    evaluated = evaluated_members(TINY_TRAINING, "cnn1d", eval_zoo_seed=1, eval_members=1)
    assert result["eval_zoo_seed"] == 1 and family["members"] == [m.name for m in evaluated]
    searched = evaluated_members(TINY_TRAINING, "cnn1d", eval_zoo_seed=DEFAULTS_SEARCH_ZOO_SEED, eval_members=1)
    # Compared as hosts (architecture, task and its data seed, budget), not by name, which
    # carries the zoo's seed and index.

    def host(member: ZooMember) -> tuple[object, ...]:
        return tuple(getattr(member, f.name) for f in dataclasses.fields(member) if f.name not in ("zoo_seed", "index"))

    assert not {host(m) for m in evaluated} & {host(m) for m in searched}
    assert set(family["arms"]) == set(ARMS) and family["pairs"] == 2
    for entry in family["runs"]:
        arms = entry["arms"]
        # The static arms have the held-out run's final shape, and the tuned arm's weight decay
        # is the grid's best on validation.
        assert arms["static"]["total_params"] == arms["tuned"]["total_params"]
        assert entry["tuned_weight_decay"] in result["weight_decays"]
        assert arms["tuned"]["val_accuracy"] >= arms["static"]["val_accuracy"]
    assert {"heldout_minus_tuned", "heuristic_minus_none"} <= set(family["paired"])
    assert transfer_png(result)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cnn1d held out" in format_table(result)
