"""A damaged checkpoint is never loaded into a run: a resume sets it aside and goes on from the
newest intact commit, reproducing the undamaged run; a rollback that meets one halts the run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import esper_core.tolaria.checkpoint as checkpoint
from esper_core.run import Run, RunSpec, finish_run, grow_epoch
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.session import CommitLost
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
from esper_core.tolaria.checkpoint import CheckpointCorruptError, CheckpointWriteError
from esper_core.tolaria.safety import EpochFailed
from tests.helpers.checkpoints import flip, open_on_a_full_disk

EPOCHS = 3


def _spec(run_id: str, epochs: int = EPOCHS) -> RunSpec:
    return RunSpec(recipe="seed-reference", epochs=epochs, device="cpu", seed=1, run_id=run_id)


def _finished(settings: EsperSettings, run_id: str) -> float:
    run = Run.start(_spec(run_id), settings=settings)
    try:
        for epoch in range(EPOCHS):
            grow_epoch(run, epoch)
        return finish_run(run).test_loss
    finally:
        run.close()


def _go_on(settings: EsperSettings, run_id: str) -> tuple[int, float]:
    """Resume the run, train what is left, finish: (the epoch it resumed at, test loss)."""
    run = Run.start(_spec(run_id), settings=settings)
    try:
        resumed_at = run.epoch
        for epoch in range(run.epoch, EPOCHS):
            grow_epoch(run, epoch)
        return resumed_at, finish_run(run).test_loss
    finally:
        run.close()


def test_a_flipped_byte_in_a_finished_runs_latest_checkpoint_falls_back_and_reproduces_the_run(
    compiled_home: EsperSettings, caplog: pytest.LogCaptureFixture
) -> None:
    loss = _finished(compiled_home, "flipped")
    checkpoints = compiled_home.runs_dir / "flipped" / "checkpoints"
    latest = checkpoints / f"{epoch_tag(EPOCHS - 1, 'applied')}.pt"
    flip(latest)
    with caplog.at_level(logging.WARNING, logger="esper_core.run.commits"):
        resumed_at, again = _go_on(compiled_home, "flipped")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and latest.name in warnings[0]
    assert f"going back to commit {epoch_tag(EPOCHS - 1, 'trained')}" in warnings[0].lower()
    assert "epoch 2 will be run again" in warnings[0]
    assert (checkpoints / "damaged" / latest.name).exists()  # kept aside, not deleted
    # And the operator's alert (CheckpointDamaged) has its event in the run's telemetry.
    events = [
        e
        for p in read_jsonl(checkpoints.parent / "telemetry.jsonl")
        for e in p.events
        if e.name == "tolaria.checkpoint.damaged"
    ]
    assert len(events) == 1 and events[0].attributes == {
        "damaged": epoch_tag(EPOCHS - 1, "applied"),
        "kept": epoch_tag(EPOCHS - 1, "trained"),
    }
    # The trained-not-applied commit it fell back to is rewound: epoch 2 is trained again, identically.
    assert resumed_at == EPOCHS - 1
    assert again == loss


def test_a_damaged_commit_the_rewind_needs_is_not_loaded_either(compiled_home: EsperSettings) -> None:
    _finished(compiled_home, "rewind")
    checkpoints = compiled_home.runs_dir / "rewind" / "checkpoints"
    # The last commit is damaged, and so is the one the rewind of the trained commit before it
    # wants; the commits older than both were pruned (three are kept), so nothing is left.
    flip(checkpoints / f"{epoch_tag(2, 'applied')}.pt")
    flip(checkpoints / f"{epoch_tag(1, 'applied')}.pt", n=256)
    with pytest.raises(CheckpointCorruptError, match=rf"'{epoch_tag(1, 'applied')}'.*no older commit left"):
        Run.start(_spec("rewind"), settings=compiled_home)
    assert sorted(p.name for p in (checkpoints / "damaged").glob("*.pt")) == [
        f"{epoch_tag(1, 'applied')}.pt",
        f"{epoch_tag(2, 'applied')}.pt",
    ]


def test_a_run_without_an_intact_commit_says_so(compiled_home: EsperSettings) -> None:
    run = Run.start(_spec("only-start"), settings=compiled_home)
    run.close()
    checkpoints = compiled_home.runs_dir / "only-start" / "checkpoints"
    flip(checkpoints / f"{START_TAG}.pt")
    with pytest.raises(CheckpointCorruptError, match="no older commit left to go back to: start the run again"):
        Run.start(_spec("only-start"), settings=compiled_home)
    assert (checkpoints / "damaged" / f"{START_TAG}.pt").exists()


def test_a_corrupted_weight_met_by_a_rollback_is_not_restored(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    loss = _finished(compiled_home, "clean")
    run = Run.start(_spec("rolled-back"), settings=compiled_home)
    try:
        grow_epoch(run, 0)
        # A resumed process holds no commit in memory: the rollback reads the disk.
        run.rails.tiers.drop_fast_tier()
        committed = Path(run.checkpoints.path(epoch_tag(0, "applied")))
        flip(committed, n=256)
        weights_before = [p.detach().clone() for p in run.trainer.model.parameters()]

        def fails(*args: object, **kwargs: object) -> None:
            raise EpochFailed("epoch 1: loss is nan")

        monkeypatch.setattr(run.trainer, "train_epoch", fails)
        with pytest.raises(CommitLost, match=rf"{epoch_tag(0, 'applied')} damaged; it was not restored"):
            grow_epoch(run, 1)
        # Nothing of the damaged file reached the model, and the run halted instead of blaming the LR.
        assert all((a == b).all() for a, b in zip(weights_before, run.trainer.model.parameters(), strict=True))
        assert run.checkpoints.latest() == epoch_tag(0, "trained")
        assert (committed.parent / "damaged" / committed.name).exists()
    finally:
        run.close()
    monkeypatch.undo()
    resumed_at, again = _go_on(compiled_home, "rolled-back")
    assert resumed_at == 0 and again == loss


def test_checkpoints_from_before_digests_still_resume(
    compiled_home: EsperSettings, caplog: pytest.LogCaptureFixture
) -> None:
    loss = _finished(compiled_home, "clean")
    run = Run.start(_spec("legacy"), settings=compiled_home)
    try:
        grow_epoch(run, 0)
    finally:
        run.close()
    checkpoints = compiled_home.runs_dir / "legacy" / "checkpoints"
    for digest in checkpoints.glob("*.json"):
        digest.unlink()  # as every checkpoint written before digests were recorded
    with caplog.at_level(logging.WARNING, logger="esper_core.tolaria.checkpoint"):
        resumed_at, again = _go_on(compiled_home, "legacy")
    assert resumed_at == 1 and again == loss
    assert any("unverified" in r.getMessage() for r in caplog.records)


def test_a_full_disk_fails_a_runs_commit_and_the_run_resumes_from_the_last_one(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    loss = _finished(compiled_home, "clean")
    run = Run.start(_spec("full"), settings=compiled_home)
    checkpoints = compiled_home.runs_dir / "full" / "checkpoints"
    try:
        grow_epoch(run, 0)
        stored = {p.name: p.read_bytes() for p in checkpoints.iterdir()}
        with monkeypatch.context() as patch:
            patch.setattr(checkpoint, "open", open_on_a_full_disk, raising=False)
            with pytest.raises(CheckpointWriteError, match="The disk is full"):
                grow_epoch(run, 1)
    finally:
        run.close()
    # Nothing stored was lost or changed, and nothing half-written is left.
    assert {p.name: p.read_bytes() for p in checkpoints.iterdir()} == stored
    resumed_at, again = _go_on(compiled_home, "full")
    assert resumed_at == 1 and again == loss
