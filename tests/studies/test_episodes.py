"""What an episode reports beyond its last epoch. A run that halts is an outcome: scored at its last
commit, never an exception that ends the study around it (real runs of the smallest recipe, made
to diverge deterministically). Early stopping reads the best validation epoch without changing the
training."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest

from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.simic.dataset import build_samples
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import count_halted, episode_config, run_episode
from esper_core.studies.simic_train import collect_episodes, get_plan
from esper_core.studies.yardstick import early_stopped
from esper_core.tolaria.safety import SafetyConfig


def _diverging(*, lr: float, spike_ratio: float = 4.0) -> RunConfig:
    """``seed-reference`` (Linear(16 -> 4), 4 steps an epoch) at a learning rate it cannot take.

    At lr 1e3 its validation loss doubles every epoch (finite): a spike ratio of 1.5 fails epoch 1
    and every retry of it (the rollback halves the rate; still too high), so it halts there. At
    1e38 the very first epoch overflows, and so does every retry.
    """
    config = get_recipe("seed-reference")
    safety = SafetyConfig(loss_spike_ratio=spike_ratio)
    config.trainer = dataclasses.replace(config.trainer, lr=lr, safety=safety)
    return config


def test_a_run_that_halts_is_scored_as_the_network_of_its_last_commit(
    esper_home: EsperSettings, caplog: pytest.LogCaptureFixture
) -> None:
    diverging = _diverging(lr=1e3, spike_ratio=1.5)
    with caplog.at_level(logging.WARNING, logger="esper_core.studies.episodes"):
        halted = run_episode(episode_config(diverging, seed=0, policy="none", epochs=4), settings=esper_home)
    # The same run stopped by its length where the other halted: after epoch 0's decision.
    stopped = run_episode(episode_config(diverging, seed=0, policy="none", epochs=1), settings=esper_home)
    assert halted.halted is not None and "epoch 1" in halted.halted and stopped.halted is None
    assert any("halted" in r.message and halted.run_id in r.message for r in caplog.records)
    # Scored as the network at its last commit stands, exactly as the run that finished there.
    for name in ("test_accuracy", "test_loss", "val_accuracy", "val_loss", "total_params", "host_params", "commands"):
        assert getattr(halted, name) == getattr(stopped, name), name
    assert math.isfinite(halted.test_loss) and math.isfinite(halted.val_loss)
    # It trained epoch 0 and started epoch 1: its FLOPs count both; its curve ends where it is scored.
    assert halted.train_flops == 2 * stopped.train_flops
    assert halted.curve == (stopped.curve[0], (halted.train_flops, halted.val_loss))
    assert count_halted([halted, stopped]) == 1


def test_a_run_that_halts_in_its_first_epoch_is_scored_as_its_initial_network(esper_home: EsperSettings) -> None:
    config = episode_config(_diverging(lr=1e38), seed=0, policy="none", epochs=3)
    result = run_episode(config, settings=esper_home, early_stopping=True)
    assert result.halted is not None and "non-finite loss" in result.halted
    # Back at the start commit: the untrained network, whose scores are defined.
    assert math.isfinite(result.test_loss) and math.isfinite(result.val_loss) and 0.0 <= result.test_accuracy <= 1.0
    assert result.commands == {} and result.curve == ((result.train_flops, result.val_loss),)
    # No epoch ended, so none was best: early stopping leaves it at the score it has.
    assert result.early_stop is None and early_stopped(result) is result


def test_simic_episodes_go_on_past_a_halted_one_and_learn_from_its_decisions(compiled_home: EsperSettings) -> None:
    plan = dataclasses.replace(get_plan("smoke"), epochs=4)
    diverging = _diverging(lr=1e3, spike_ratio=1.5)
    results = collect_episodes(compiled_home, recipe=diverging, seeds=[1000, 1001], policy="heuristic", plan=plan)
    assert [r.seed for r in results] == [1000, 1001] and count_halted(results) == 2
    store = SimicStore.open(compiled_home.home)
    try:
        records = store.decisions([r.run_id for r in results])
        reports = store.field_reports([r.run_id for r in results])
    finally:
        store.close()
    # Each run's decisions up to its last commit are recorded, and rewarded like any run's.
    assert sorted({r.command.run_id for r in records}) == sorted(r.run_id for r in results)
    samples, skipped = build_samples(records, reports, param_penalty=plan.simic.param_penalty)
    assert len(samples) + skipped == len(records) and all(math.isfinite(s.reward) for s in samples)


def test_early_stopping_reads_the_best_validation_epoch_and_trains_exactly_as_without(
    esper_home: EsperSettings,
) -> None:
    config = episode_config("seed-reference", seed=3, policy="none", epochs=6)
    plain = run_episode(config, settings=esper_home)
    watched = run_episode(config, settings=esper_home, early_stopping=True)
    assert plain.early_stop is None and watched.early_stop is not None
    # Evaluation only: the same training, to the bit.
    for name in ("test_accuracy", "test_loss", "val_accuracy", "val_loss", "train_flops", "curve"):
        assert getattr(watched, name) == getattr(plain, name), name
    early = watched.early_stop
    assert (early.train_flops, early.val_loss) == watched.curve[early.epoch]
    assert early.val_accuracy >= watched.val_accuracy
    if early.epoch == 5:  # the last epoch was the best: its test scores are the run's own
        assert (early.test_accuracy, early.test_loss) == (watched.test_accuracy, watched.test_loss)
    stopped = early_stopped(watched)
    assert (stopped.val_accuracy, stopped.test_accuracy, stopped.train_flops) == (
        early.val_accuracy,
        early.test_accuracy,
        early.train_flops,
    )
    with pytest.raises(ValueError, match="early_stopping=True"):
        early_stopped(plain)
