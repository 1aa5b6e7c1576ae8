"""Simic fixtures: a real registry (SQLite file + blob store) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from esper_core.simic.records import SimicStore
from esper_core.urza.service import Urza


@pytest.fixture
def urza(tmp_path: Path) -> Iterator[Urza]:
    registry = Urza.open(tmp_path / "home")
    yield registry
    registry.close()


@pytest.fixture
def store(urza: Urza) -> SimicStore:
    store = SimicStore.for_urza(urza)
    assert store is not None
    return store
