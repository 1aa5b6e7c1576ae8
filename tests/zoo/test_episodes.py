"""A real episode on zoo members, through Esper's own run code: trained, decided, grown, recorded."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from esper_core._capabilities import one_thread
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import EpisodeResult, episode_config, run_episode
from esper_core.tamiyo.config import ScheduledGermination
from esper_core.zoo import FAMILIES, FAMILY_FACTS, Family, ZooMember, ZooTask, build_model

TASKS = {
    "mnist1d": ZooTask(name="mnist1d", seed=0, train=200),
    "digits": ZooTask(name="digits", seed=0),
    "chars": ZooTask(name="chars", seed=0, train=200),
    "gaussians": ZooTask(name="gaussians", seed=0, train=400, separation=3.0),
}


def member(family: Family, task: str | None = None) -> ZooMember:
    """A small width-only member: 5 epochs, so the heuristic germinates after epoch 1 and its seed
    trains, blends and is kept (merged) before the end."""
    return ZooMember(
        zoo_seed=0,
        index=0,
        family=family,
        task=TASKS[task or FAMILY_FACTS[family].tasks[0]],
        depth=1,
        width=4,
        epochs=5,
        batch_size=32,
        lr=1e-2,
    )


def episode(m: ZooMember, settings: EsperSettings, *, seed: int = 0, **overrides: Any) -> EpisodeResult:
    """A heuristic episode (or ``overrides`` of ``episode_config``) on one torch thread, as Simic's
    pool runs one (``esper_core.fanout``): on a busy machine two threads cost several times more."""
    config = episode_config(m.recipe(), seed=seed, **({"policy": "heuristic"} | overrides))
    with one_thread():
        return run_episode(config, settings=settings)


def assert_grew(m: ZooMember, result: EpisodeResult) -> None:
    start = sum(p.numel() for p in build_model(m).parameters())
    assert result.commands.get("germinate") == 1 and result.commands.get("fossilize") == 1
    # The kept width seed was merged after the last epoch: the network is larger than it started.
    assert result.total_params > start
    assert result.train_flops > 0


@pytest.mark.parametrize(("family", "task"), [("mlp", "gaussians"), ("cnn2d", "digits")])
def test_an_episode_on_a_member_is_an_ordinary_run_that_grows_and_is_recorded(
    esper_home: EsperSettings, family: Family, task: str
) -> None:
    m = member(family, task)
    result = episode(m, esper_home)
    assert result.recipe == m.name and 0.0 <= result.test_accuracy <= 1.0
    assert_grew(m, result)
    store = SimicStore.open(esper_home.home)
    try:
        decisions = store.decisions([result.run_id])
    finally:
        store.close()
    assert len(decisions) == m.epochs  # one recorded decision per epoch: what Simic learns from
    # The same member and run seed give the same numbers; another run seed does not.
    again = episode(m, esper_home)
    assert (again.test_loss, again.val_accuracy, again.total_params) == (
        result.test_loss,
        result.val_accuracy,
        result.total_params,
    )
    assert episode(m, esper_home, seed=1).test_loss != result.test_loss


# The cnn2d and resnet families widen a convolution followed by BatchNorm: a TINY seed there
# starts with the norm's new scale at 0 (``width/init.py``), or G2 culls it.
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_grows_each_width_slot_it_declares_in_a_real_episode(
    esper_home: EsperSettings, family: Family
) -> None:
    m = member(family)
    (layer,) = m.widen  # depth 1: one widenable layer
    # A fixed schedule, not the heuristic: what is tested is that the slot grows, not when to grow.
    schedule = (ScheduledGermination(epoch=0, slot=f"{layer}+width", blueprint="width-100"),)
    result = episode(m, esper_home, policy="scheduled", schedule=schedule)
    assert result.commands.get("germinate") == 1 and result.commands.get("fossilize") == 1
    assert result.host_params > sum(p.numel() for p in build_model(m).parameters())


def test_a_seed_counts_in_the_training_flops_from_its_first_epoch(esper_home: EsperSettings) -> None:
    # Germinated after epoch 0 of a 2-epoch run: the seed trains (isolated) in epoch 1 only, and
    # that epoch's forward runs it. A count taken before the epoch promoted it missed it entirely.
    m = dataclasses.replace(member("mlp", "gaussians"), epochs=2)
    (layer,) = m.widen
    schedule = (ScheduledGermination(epoch=0, slot=f"{layer}+width", blueprint="width-100"),)
    grown = episode(m, esper_home, policy="scheduled", schedule=schedule)
    static = episode(m, esper_home, policy="none")
    assert grown.commands.get("germinate") == 1 and grown.curve[0][0] == static.curve[0][0]
    # Epoch 1: the host's forward plus the seed's (a width seed: new units and their readers).
    assert grown.train_flops > static.train_flops
