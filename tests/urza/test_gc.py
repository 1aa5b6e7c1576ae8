"""Garbage collection of the blob store: unreferenced and old only, dry run first."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from esper_core.contracts import ArtifactStatus, KernelArtifact
from esper_core.urza.blobs import sha256_hex
from esper_core.urza.service import Urza
from tests.urza.conftest import DESCRIPTOR

MakeArtifact = Callable[..., KernelArtifact]
HOUR = 3600.0


@pytest.fixture
def urza(tmp_path: Path) -> Iterator[Urza]:
    registry = Urza.open(tmp_path / "home")
    registry.register_blueprint(DESCRIPTOR)
    yield registry
    registry.close()


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def _publish(urza: Urza, make_artifact: MakeArtifact, content: bytes) -> KernelArtifact:
    artifact = make_artifact(sha256=sha256_hex(content), size_bytes=len(content))
    return urza.publish(SimpleNamespace(artifact=artifact, blob=content))  # type: ignore[arg-type]


def test_gc_removes_only_old_unreferenced_blobs_and_temp_files(urza: Urza, make_artifact: MakeArtifact) -> None:
    kept = _publish(urza, make_artifact, b"published kernel")
    retired = _publish(urza, make_artifact, b"retired kernel")
    urza.store.set_status(retired.artifact_id or 0, ArtifactStatus.RETIRED, "superseded")
    orphan = urza.blobs.put(b"orphan from an interrupted compile")
    young = urza.blobs.put(b"staged a moment ago, row not committed yet")
    tmp = urza.blobs.path(orphan).parent / f".{orphan[:12]}.abcd.tmp"
    tmp.write_bytes(b"half a blob")
    foreign = urza.blobs.root / "README"
    foreign.write_text("not ours")
    for path in (urza.blobs.path(kept.sha256), urza.blobs.path(retired.sha256), urza.blobs.path(orphan), tmp):
        _age(path, 2 * HOUR)

    dry = urza.gc(dry_run=True)
    assert dry.dry_run
    assert sorted(f.path for f in dry.removed) == sorted([urza.blobs.path(orphan), tmp])
    assert (dry.referenced, dry.too_young) == (2, 1)
    assert dry.removed_bytes == len(b"orphan from an interrupted compile") + len(b"half a blob")
    assert urza.blobs.exists(orphan) and tmp.exists(), "a dry run deletes nothing"

    done = urza.gc(dry_run=False)
    assert [f.path for f in done.removed] == [f.path for f in dry.removed]
    assert not urza.blobs.exists(orphan) and not tmp.exists()
    assert urza.blobs.exists(young) and foreign.exists()
    # Referenced blobs (retired ones too: their rows still point at them) still load.
    assert urza.fetch_blob(kept) and urza.fetch_blob(retired)
    assert urza.gc(dry_run=False).removed == ()
    assert done.to_dict()["removed_bytes"] == dry.removed_bytes


def test_gc_grace_period_zero_and_validation(urza: Urza) -> None:
    orphan = urza.blobs.put(b"orphan")
    assert [f.sha256 for f in urza.gc(dry_run=False, min_age_s=0).removed] == [orphan]
    with pytest.raises(ValueError, match="grace period"):
        urza.gc(dry_run=True, min_age_s=-1)
