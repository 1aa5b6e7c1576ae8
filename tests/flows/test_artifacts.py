"""What the run artifacts show: seed events on the curves and each slot's stage history."""

from __future__ import annotations

import contextvars
import threading

import pytest

from esper_core.run.reports import RunSummary
from tasks.artifacts import _uploads, seed_marks, seed_table

_RUN = contextvars.ContextVar("_RUN", default="none")


def _row(epoch: int, action: str = "wait", slot: str = "", blueprint: str = "", **seeds: str) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 1.0,
        "val_loss": 1.0,
        "val_accuracy": 0.5,
        "action": action,
        "slot": slot,
        "blueprint": blueprint,
        "seeds": seeds,
    }


HISTORY = [
    _row(0, slot1="dormant", slot2="dormant"),
    _row(1, "germinate", "slot1", "lowrank_adapter", slot1="dormant", slot2="dormant"),
    _row(2, slot1="training", slot2="dormant"),
    _row(3, "advance", "slot1", slot1="blending", slot2="dormant"),
]


def test_seed_events_are_marked_where_they_happen() -> None:
    marks = seed_marks(HISTORY)
    assert [(m.epoch, m.label) for m in marks] == [
        (1, "germinate slot1 lowrank_adapter"),
        (2, "slot1->training"),
        (3, "advance slot1; slot1->blending"),
    ]


def test_seed_table_has_each_slots_stage_history() -> None:
    summary = RunSummary(
        run_id="r",
        recipe="digits-mlp",
        epochs=4,
        device="cpu",
        val_accuracy=0.5,
        test_accuracy=0.5,
        test_loss=1.0,
        val_loss=1.0,
        host_params=1,
        total_params=2,
        seeds={"slot1": "blending (lowrank_adapter)", "slot2": "dormant"},
        commands={},
        field_reports={},
        run_dir="/tmp/r",
        checkpoints={"files": 3, "bytes": 1000},
    )
    rows = {r["slot"]: r for r in seed_table(summary, HISTORY)}
    assert rows["slot1"]["stages"] == "germinated@1 -> training@2 -> blending@3"
    assert rows["slot1"]["first active epoch"] == 1
    assert rows["slot2"]["stages"] == "dormant throughout" and rows["slot2"]["first active epoch"] == ""


def test_uploads_run_in_order_off_the_task_thread_in_its_context() -> None:
    calls: list[tuple[str, str, bool]] = []

    def create(*, key: str) -> None:
        calls.append((key, _RUN.get(), threading.current_thread() is threading.main_thread()))

    token = _RUN.set("task-run-7")  # as Prefect's run context is set in the task's thread
    try:
        with _uploads() as upload:
            upload(create, key="a")
            upload(create, key="b")
    finally:
        _RUN.reset(token)
    assert calls == [("a", "task-run-7", False), ("b", "task-run-7", False)]


def test_a_failed_upload_fails_the_task() -> None:
    def refused(**_: object) -> None:
        raise RuntimeError("422 from the API")

    with pytest.raises(RuntimeError, match="422 from the API"), _uploads() as upload:
        upload(refused, key="a")
