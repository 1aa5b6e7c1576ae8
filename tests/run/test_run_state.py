"""The run's one state object: every field of the record travels with commits and forks, the
checkpoint keeps the layout earlier versions wrote, and a real session's commit, restore and
rollback all go through it."""

from __future__ import annotations

import copy
import dataclasses
import io
from typing import Any

import pytest
import torch

from esper_core.contracts import (
    AdaptationCommand,
    CommandType,
    FieldReport,
    MetricPoint,
    Outcome,
    SeedOperation,
    SystemStatePacket,
    TelemetryPacket,
)
from esper_core.run import state as run_state
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.session import Run
from esper_core.run.state import CHECKPOINT_KEYS, IN_MEMORY, RunRecord
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config
from esper_core.urza.service import Urza
from tests.helpers.state import assert_same_state

_COMMAND = AdaptationCommand(
    run_id="r",
    epoch=1,
    command_type=CommandType.SEED,
    seed_operation=SeedOperation.GERMINATE,
    slot_id="slot0",
    blueprint_id="residual_mlp",
    issued_by="heuristic",
    reason="plateau",
)
_PACKET = SystemStatePacket(
    run_id="r",
    epoch=1,
    train_loss=0.5,
    val_loss=0.25,
    val_accuracy=0.75,
    learning_rate=0.01,
    epoch_latency_ms=1.0,
    latency_budget_ms=18.0,
    host_params=68,
)
_REPORT = FieldReport(
    report_id="rep", run_id="r", command=_COMMAND, outcome=Outcome.SUCCESS, observation_epochs=2, metric_deltas={}
)


class _Opaque:
    """Stands for a live value the record only copies (a decision record, a candidate)."""


# One value, different from the default, for every field of the record. A field added to
# RunRecord needs one here, which is the point: the tests below then carry it through every path.
SAMPLES: dict[str, Any] = {
    "history": [_PACKET],
    "commands": [_COMMAND],
    "reports": [_REPORT],
    "pending": [(_COMMAND, 0.25, 0.75)],
    "timings": {"train_ms": [1.5], "epoch_ms": [2.5], "decide_ms": [0.5], "gnn_ms": []},
    "outbox": [
        TelemetryPacket(
            source="tolaria", run_id="r", epoch=1, metrics=(MetricPoint(name="tolaria.test.metric", value=1.0),)
        )
    ],
    "report_outbox": [_REPORT],
    "decision_records": {_COMMAND.command_id: _Opaque()},
    "candidates": [_Opaque()],
    "lookup_ms": 0.125,
    "committed_tag": "epoch-0001-applied",
    "dirty": True,
}


def _sampled() -> RunRecord:
    return RunRecord(**SAMPLES)


def _checkpointed(state: dict[str, Any]) -> dict[str, Any]:
    """What a commit writes and a restore reads back (``CheckpointStore``'s torch.save/load)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def test_every_record_field_has_a_sample_that_differs_from_its_default() -> None:
    fields = {f.name for f in dataclasses.fields(RunRecord)}
    assert set(SAMPLES) == fields, "give SAMPLES a value for each field of RunRecord"
    fresh = RunRecord()
    assert all(getattr(fresh, name) != value for name, value in SAMPLES.items())


def test_a_checkpoint_carries_the_kept_fields_and_leaves_the_live_ones() -> None:
    loaded = RunRecord(**{**SAMPLES, "outbox": [], "lookup_ms": 9.0})
    live_before = {f.name: getattr(loaded, f.name) for f in run_state._LIVE}
    loaded.load_state_dict(_checkpointed(_sampled().state_dict()))
    for f in run_state._KEPT:
        assert getattr(loaded, f.name) == SAMPLES[f.name], f.name
    for name, value in live_before.items():
        assert getattr(loaded, name) is value, f"a checkpoint must not touch the live field {name}"
    assert IN_MEMORY not in _sampled().state_dict()


def test_an_in_memory_state_carries_every_field_and_shares_no_container() -> None:
    source = _sampled()
    state = source.state_dict(in_memory=True)
    copy_ = RunRecord()
    copy_.load_state_dict(state)
    for name, value in SAMPLES.items():
        assert getattr(copy_, name) == value, name
    copy_.history.append(_PACKET)
    copy_.outbox.clear()
    copy_.decision_records.clear()
    copy_.timings["gnn_ms"].append(1.0)
    assert source.history == SAMPLES["history"] and source.outbox and source.decision_records
    assert source.timings["gnn_ms"] == []


def test_a_record_field_must_say_whether_a_checkpoint_stores_it() -> None:
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Grown:
        history: list[SystemStatePacket] = run_state._kept(run_state._json_list(SystemStatePacket))
        forgotten: int = 0

    with pytest.raises(TypeError, match=r"\['forgotten'\].*_kept\(codec\) or _live\(\)"):
        run_state._split(Grown)


def _session(settings: EsperSettings, run_id: str) -> Run:
    config = episode_config("seed-reference", seed=0, policy="heuristic", epochs=3)
    (settings.runs_dir / run_id).mkdir(parents=True)
    return Run(config=config, settings=settings, run_id=run_id, urza=Urza.open(settings.home))


def test_a_sessions_checkpoint_has_the_layout_earlier_versions_wrote(compiled_home: EsperSettings) -> None:
    # Checkpoints of runs started before the run state existed load as they are: same keys, and
    # nothing only a live process holds (events, counters, outboxes) ever reaches the disk.
    assert {"trainer", "history", "commands", "reports", "pending", "timings", "emergency", "unsent"} == CHECKPOINT_KEYS
    session = _session(compiled_home, "layout")
    try:
        session.commit(START_TAG)
        session.train_epoch()
        session.rails.note("tolaria.remediation", "an undrained rails event")
        session.commit(epoch_tag(0, "trained"))
        saved = session.checkpoints.load(epoch_tag(0, "trained"))
        assert saved.keys() == CHECKPOINT_KEYS
        assert saved["emergency"].keys() == {"level", "failed_epochs", "conservative_left"}
        assert "events" not in saved["trainer"]["manager"]
    finally:
        session.close()


def test_restore_and_rollback_return_to_the_commit_through_the_state(compiled_home: EsperSettings) -> None:
    session = _session(compiled_home, "restore")
    try:
        session.commit(START_TAG)
        committed = copy.deepcopy(session.state.state_dict())
        session.train_epoch()
        session.apply(session.decide())
        assert session.record.dirty and session.record.outbox and session.epoch == 1
        session.state.rails.emergency.on_timeout()  # a live escalation a rollback keeps
        session.state.rollback(deadline_ms=1e6, why="test")
        assert_same_state({**committed, "emergency": None}, {**session.state.state_dict(), "emergency": None})
        assert session.rails.emergency.conservative and session.record.outbox and session.record.dirty
        session.restore(START_TAG)
        assert_same_state(committed, session.state.state_dict())
        assert not session.record.outbox and not session.record.dirty and session.committed_tag == START_TAG
    finally:
        session.close()
