"""The zoo bench's row of one episode: its cost apart from its data's, and a language model's score
as a loss only."""

from __future__ import annotations

import pytest

from bench.zoo import episode
from esper_core.settings import EsperSettings
from esper_core.zoo import ZooMember, ZooTask


def test_a_row_times_the_episode_apart_from_its_data_and_a_decoder_has_no_accuracy(
    esper_home: EsperSettings,
) -> None:
    member = ZooMember(
        zoo_seed=0,
        index=0,
        family="decoder",
        task=ZooTask(name="chars", seed=0, train=64),
        depth=1,
        width=4,
        epochs=2,
        batch_size=32,
        lr=1e-2,
    )
    row = episode(member, esper_home, seed=0)
    assert row["member"] == member.name and row["widen"] == ["blocks.0.fc"]
    assert row["episode_s"] > 0 and row["data_s"] >= 0
    assert row["episode_s_per_epoch"] == pytest.approx(row["episode_s"] / 2, abs=1e-3)
    assert row["test_accuracy"] is None and row["test_loss"] > 0
