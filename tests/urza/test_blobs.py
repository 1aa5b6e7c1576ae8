"""BlobStore: content addressing, atomic idempotent writes, verification on every read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from esper_core.urza.blobs import BlobStore
from esper_core.urza.errors import CorruptBlobError, MissingBlobError


def test_put_get_round_trip_and_layout(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    data = b"kernel bytes" * 100
    sha = store.put(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.path(sha) == tmp_path / "blobs" / sha[:2] / sha
    assert store.exists(sha)
    assert store.get(sha) == data


def test_put_is_idempotent_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    sha = store.put(b"abc")
    mtime = store.path(sha).stat().st_mtime_ns
    assert store.put(b"abc") == sha
    assert store.path(sha).stat().st_mtime_ns == mtime
    assert [p.name for p in store.path(sha).parent.iterdir()] == [sha]


def test_corrupt_blob_is_detected_and_repaired_by_republishing(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    sha = store.put(b"original")
    store.path(sha).write_bytes(b"bit rot")
    with pytest.raises(CorruptBlobError) as info:
        store.get(sha)
    message = str(info.value)
    assert str(store.path(sha)) in message
    assert sha in message and hashlib.sha256(b"bit rot").hexdigest() in message
    assert "delete the file and re-publish" in message
    store.put(b"original")
    assert store.get(sha) == b"original"


def test_missing_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    sha = hashlib.sha256(b"never stored").hexdigest()
    assert not store.exists(sha)
    with pytest.raises(MissingBlobError, match=sha):
        store.get(sha)


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "../" + "0" * 61])
def test_rejects_malformed_hashes(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="not a sha256"):
        BlobStore(tmp_path).path(bad)


def test_rejects_empty_blobs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty blob"):
        BlobStore(tmp_path).put(b"")
