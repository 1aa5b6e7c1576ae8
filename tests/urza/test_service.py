"""Urza facade: publish a real compiled kernel, fetch it back, and fail clearly on damage."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from esper_core.contracts import ArtifactStatus
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.compiler import CompiledKernel, TezzeretConfig, compile_blueprint
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    CorruptBlobError,
    MissingBlobError,
    UnknownBlueprintInRegistryError,
)
from esper_core.urza.service import Urza

PROFILE = ShapeProfile(feature_shape=(8,), batch_max=16)


@pytest.fixture(scope="module")
def kernel() -> CompiledKernel:
    config = TezzeretConfig(timing_iters=3, warmup_iters=1)
    return compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, config=config)


@pytest.fixture
def urza(tmp_path: Path) -> Iterator[Urza]:
    registry = Urza.open(tmp_path / "home")
    registry.register_blueprints(default_catalog().list())
    yield registry
    registry.close()


def test_open_creates_the_layout(tmp_path: Path) -> None:
    registry = Urza.open(tmp_path / "new-home")
    assert (tmp_path / "new-home" / "registry.db").is_file()
    assert (tmp_path / "new-home" / "artifacts").is_dir()
    registry.close()


def test_publish_then_fetch_round_trip(urza: Urza, kernel: CompiledKernel) -> None:
    stored = urza.publish(kernel)
    assert stored.version == 1 and stored.artifact_id is not None
    assert urza.publish(kernel) == stored
    assert urza.fetch_blob(stored) == kernel.blob
    artifact, blob = urza.require_active("lowrank_adapter", PROFILE.name, stored.environment)
    assert artifact == stored and blob == kernel.blob


def test_corrupt_blob_raises_and_changes_nothing(urza: Urza, kernel: CompiledKernel) -> None:
    stored = urza.publish(kernel)
    path = urza.blobs.path(stored.sha256)
    path.write_bytes(b"garbage")
    with pytest.raises(CorruptBlobError, match="delete the file and re-publish"):
        urza.fetch_blob(stored)
    assert path.read_bytes() == b"garbage"
    assert urza.store.get(stored.artifact_id or 0) == stored
    assert urza.store.get(stored.artifact_id or 0).status is ArtifactStatus.ACTIVE
    # Re-publishing repairs the blob and returns the same row.
    assert urza.publish(kernel) == stored
    assert urza.fetch_blob(stored) == kernel.blob


def test_missing_blob(urza: Urza, kernel: CompiledKernel) -> None:
    stored = urza.publish(kernel)
    urza.blobs.path(stored.sha256).unlink()
    with pytest.raises(MissingBlobError, match=stored.sha256):
        urza.fetch_blob(stored)


def test_tampered_kernel_is_rejected_before_anything_is_written(urza: Urza, kernel: CompiledKernel) -> None:
    tampered = dataclasses.replace(kernel, blob=kernel.blob + b"x")
    with pytest.raises(ValueError, match="recompile"):
        urza.publish(tampered)
    assert urza.store.list_artifacts() == []
    assert not urza.blobs.exists(kernel.artifact.sha256)


def test_unregistered_blueprint(tmp_path: Path, kernel: CompiledKernel) -> None:
    registry = Urza.open(tmp_path / "empty")
    with pytest.raises(UnknownBlueprintInRegistryError, match="lowrank_adapter"):
        registry.publish(kernel)
    registry.close()


def test_require_active_names_the_fix(urza: Urza, kernel: CompiledKernel) -> None:
    with pytest.raises(ArtifactNotFoundError, match="esper catalog compile residual_mlp"):
        urza.require_active("residual_mlp", PROFILE.name, kernel.artifact.environment)
