"""A checkpoint is loaded only if its bytes are those its commit wrote; a commit that cannot be
written (a full disk) leaves nothing half-done and the previous commit intact."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import esper_core.tolaria.checkpoint as checkpoint
from esper_core.tolaria.checkpoint import CheckpointCorruptError, CheckpointStore, CheckpointWriteError
from esper_core.tolaria.rollback import RollbackTiers
from tests.helpers.checkpoints import flip, open_on_a_full_disk


def _state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {"model": {"weight": torch.randn(64, 64), "bias": torch.randn(64)}, "epoch": seed}


def test_a_commit_records_its_digest_and_loads_back_verified(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    data = store.save("a", _state(1))
    assert store.verify("a").status == "intact"
    assert store.digest_path("a").exists() and len(data) == store.path("a").stat().st_size
    assert torch.equal(store.load("a")["model"]["weight"], _state(1)["model"]["weight"])


def test_a_flipped_weight_is_refused_naming_the_file_and_both_digests(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    # The weights sit in the middle of the file: torch.load itself would read them without a word.
    flip(store.path("a"))
    assert torch.load(store.path("a"), weights_only=True)["epoch"] == 1
    with pytest.raises(CheckpointCorruptError, match=r"checkpoint 'a' at .*a\.pt is damaged: SHA-256 \w+, its commit"):
        store.load("a")
    assert store.verify("a").status == "damaged"


def test_a_truncated_checkpoint_is_refused_by_its_size(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    store.path("a").write_bytes(store.path("a").read_bytes()[:-100])
    with pytest.raises(CheckpointCorruptError, match="bytes, its commit wrote"):
        store.load("a")


def test_set_aside_keeps_the_damaged_file_and_its_digest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    flip(store.path("a"))
    first = store.set_aside("a")
    store.save("a", _state(2))
    flip(store.path("a"))
    second = store.set_aside("a")
    assert first != second and first.exists() and second.exists()
    assert first.parent == tmp_path / "damaged" and (tmp_path / "damaged" / "a.json").exists()
    assert store.tags() == []


def test_a_checkpoint_from_before_digests_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    store.digest_path("a").unlink()  # as Esper wrote checkpoints before this change
    with caplog.at_level(logging.WARNING, logger="esper_core.tolaria.checkpoint"):
        assert store.load("a")["epoch"] == 1
    assert store.verify("a").status == "unverified"
    assert any("unverified" in r.message and "no SHA-256 recorded" in r.message for r in caplog.records)


def test_a_damaged_checkpoint_from_before_digests_is_refused_by_its_zip_crc(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    store.digest_path("a").unlink()
    flip(store.path("a"))
    with pytest.raises(CheckpointCorruptError, match="CRC-32 of its entry"):
        store.load("a")


def test_a_crash_between_the_renames_never_pairs_new_bytes_with_an_old_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    replace = checkpoint.os.replace
    calls: list[Path] = []

    def dies_after_the_checkpoint(src: Any, dst: Any) -> None:  # noqa: ANN401
        replace(src, dst)
        calls.append(Path(dst))
        if Path(dst).suffix == ".pt":
            raise KeyboardInterrupt  # the process dies before the digest is renamed into place

    monkeypatch.setattr(checkpoint.os, "replace", dies_after_the_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        store.save("a", _state(2))
    monkeypatch.undo()
    # The new file stands without a digest: checked as an old checkpoint, not refused as damaged.
    assert store.verify("a").status == "unverified" and store.load("a")["epoch"] == 2


def test_a_full_disk_fails_the_commit_cleanly_and_keeps_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.save("a", _state(1))
    store.save("b", _state(2))
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(checkpoint, "open", open_on_a_full_disk, raising=False)
    with pytest.raises(CheckpointWriteError, match="The disk is full.*last commit \\('b'\\) is intact.*Free space"):
        store.save("c", _state(3))
    with pytest.raises(CheckpointWriteError) as failed:
        store.save("b", _state(4))  # a tag committed again: its old file must survive too
    monkeypatch.undo()
    assert failed.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left, nothing new
    assert store.latest() == "b" and store.load("b")["epoch"] == 2 and store.load("a")["epoch"] == 1
    assert store.verify("b").status == "intact"


def test_a_rollback_from_memory_replaces_a_damaged_disk_copy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    tiers = RollbackTiers(store)
    tiers.commit("a", _state(1))
    flip(store.path("a"))
    with caplog.at_level(logging.WARNING, logger="esper_core.tolaria.rollback"):
        state, report = tiers.restore("a", deadline_ms=1e6)
    assert report.tier == "memory" and state["epoch"] == 1
    assert store.verify("a").status == "intact" and (tmp_path / "damaged" / "a.pt").exists()
    assert any("damaged on disk" in r.message for r in caplog.records)


def test_a_rollback_from_disk_refuses_a_damaged_copy(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    tiers = RollbackTiers(store)
    tiers.commit("a", _state(1))
    tiers.drop_fast_tier()
    flip(store.path("a"), n=256)
    with pytest.raises(CheckpointCorruptError):
        tiers.restore("a", deadline_ms=1e6)
