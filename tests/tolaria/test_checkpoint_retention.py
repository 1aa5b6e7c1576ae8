"""Only the last few commits and the best one stay on disk; LATEST is never deleted."""

from __future__ import annotations

import pytest

from esper_core.run.commits import START_TAG, epoch_tag, epochs_applied, tag_order
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.tolaria.checkpoint import CheckpointConfig, CheckpointStore, retained


def test_retained_keeps_the_newest_latest_and_best() -> None:
    tags = [START_TAG, *(epoch_tag(e, p) for e in range(5) for p in ("trained", "applied"))]
    keep = retained(tags, latest=epoch_tag(4, "applied"), best=epoch_tag(1, "applied"), keep_last=3, order=tag_order)
    assert keep == {epoch_tag(3, "applied"), epoch_tag(4, "trained"), epoch_tag(4, "applied"), epoch_tag(1, "applied")}


def test_commit_order_and_applied_epochs() -> None:
    assert tag_order(START_TAG) < tag_order(epoch_tag(0, "trained")) < tag_order(epoch_tag(0, "applied"))
    assert tag_order(epoch_tag(9, "applied")) < tag_order(epoch_tag(10, "trained"))
    assert [epochs_applied(t) for t in (None, START_TAG, epoch_tag(3, "trained"), epoch_tag(3, "applied"))] == [
        0,
        0,
        3,
        4,
    ]


def test_keep_last_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="keep_last must be >= 2"):
        CheckpointConfig(keep_last=1)


def test_prune_never_touches_a_file_being_written(tmp_path) -> None:  # noqa: ANN001
    store = CheckpointStore(tmp_path, retention=CheckpointConfig(keep_last=2, keep_best=False))
    for e in range(4):
        store.save(epoch_tag(e, "applied"), {"e": e})
    partial = tmp_path / f".{epoch_tag(9, 'applied')}.pt.123.tmp"
    partial.write_bytes(b"half")
    dropped = store.prune(best=None, order=tag_order)
    assert dropped == [epoch_tag(0, "applied"), epoch_tag(1, "applied")]
    assert sorted(store.tags()) == [epoch_tag(2, "applied"), epoch_tag(3, "applied")] and partial.exists()


def test_a_40_epoch_run_keeps_at_most_the_configured_files_and_resumes(compiled_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe="seed-reference", epochs=40, device=None, run_id="long"), settings=compiled_home)
    for epoch in range(40):
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        session.apply(session.decide())
        session.commit(epoch_tag(epoch, "applied"))
    files = sorted(p.name for p in session.checkpoints.root.glob("*.pt"))
    keep = session.config.checkpoints.keep_last
    assert len(files) <= keep + 1, files  # the last `keep_last` and the best
    assert f"{session.checkpoints.latest()}.pt" in files
    best = min(session.history, key=lambda p: p.val_loss).epoch
    assert f"{epoch_tag(best, 'applied')}.pt" in files
    history = [p.val_loss for p in session.history]
    session.close()
    again = Run.resume(settings=compiled_home, run_id="long")  # a new process resumes at LATEST
    assert again.epoch == 40 and [p.val_loss for p in again.history] == history
    again.close()
