"""Safety rails: deadlines, conservative mode, escalation to a halt (the drills are in tests/studies/test_drills.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation
from esper_core.tolaria.checkpoint import CheckpointStore
from esper_core.tolaria.rails import SafetyRails
from esper_core.tolaria.rollback import RollbackTiers
from esper_core.tolaria.safety import EmergencyLevel, EmergencyState, SafetyConfig, epoch_failure


def test_escalation_to_halt_and_back_to_normal() -> None:
    state = EmergencyState(SafetyConfig(max_failed_epochs=2, conservative_epochs=1))
    assert state.on_epoch_failed() is EmergencyLevel.ROLLBACK
    state.on_epoch_ok()
    assert state.level is EmergencyLevel.NORMAL and state.failed_epochs == 0
    state.on_epoch_failed()
    assert state.on_epoch_failed() is EmergencyLevel.HALT


def test_conservative_mode_holds_back_growth_but_not_culls(tmp_path: Path) -> None:
    rails = SafetyRails(SafetyConfig(), RollbackTiers(CheckpointStore(tmp_path)))
    germinate = AdaptationCommand(
        run_id="r",
        epoch=1,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.GERMINATE,
        slot_id="slot1",
        blueprint_id="residual_mlp",
        issued_by="heuristic",
        reason="plateau",
    )
    cull = germinate.model_copy(update={"seed_operation": SeedOperation.CULL, "blueprint_id": None})
    assert rails.filter(germinate) is germinate  # normal mode: untouched
    waited = rails.tamiyo_missed(epoch=1, run_id="r", elapsed_ms=6_000.0, error=None)
    assert waited.action == "wait" and "deadline" in waited.reason
    held = rails.filter(germinate)
    assert held.action == "wait" and held.risk_rule == "tolaria.conservative_mode" and "germinate" in held.reason
    assert rails.filter(cull) is cull
    metrics, events = rails.drain()
    assert {m.name: m.value for m in metrics}["tolaria.timeout.tamiyo_total"] == 1.0
    assert [e.name for e in events] == ["tolaria.timeout"]


def test_epoch_failure_rules() -> None:
    assert epoch_failure(train_loss=float("nan"), val_loss=1.0, best_val_loss=None, ratio=4) is not None
    assert "exceeds 4" in (epoch_failure(train_loss=1.0, val_loss=5.0, best_val_loss=1.0, ratio=4) or "")
    assert epoch_failure(train_loss=1.0, val_loss=1.1, best_val_loss=1.0, ratio=4) is None


def test_safety_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="tamiyo_deadline_ms must be > 0"):
        SafetyConfig(tamiyo_deadline_ms=0)


def test_rails_state_checkpoints_the_escalation_and_forks_the_undrained_telemetry(tmp_path: Path) -> None:
    rails = SafetyRails(SafetyConfig(conservative_epochs=3), RollbackTiers(CheckpointStore(tmp_path)))
    rails.tamiyo_missed(epoch=1, run_id="r", elapsed_ms=6_000.0, error=None)
    checkpoint, live = rails.state_dict(), rails.state_dict(in_memory=True)
    assert checkpoint == {"level": int(EmergencyLevel.CONSERVATIVE), "failed_epochs": 0, "conservative_left": 3}
    other = SafetyRails(SafetyConfig(conservative_epochs=3), RollbackTiers(CheckpointStore(tmp_path)))
    other.note("tolaria.remediation", "its own undrained event")
    other.load_state_dict(checkpoint)  # a restore: escalation back, undrained telemetry kept
    assert other.emergency.conservative and [e.name for e in other.drain()[1]] == ["tolaria.remediation"]
    other.load_state_dict(live)  # a fork's put-back: the counters and events too
    assert other.drain() == rails.drain()
    assert other.state_dict(in_memory=True) == rails.state_dict(in_memory=True)


def test_an_observed_overrun_is_counted_and_reported_and_changes_nothing(tmp_path: Path) -> None:
    rails = SafetyRails(SafetyConfig(kasmina_deadline_ms=10.0), RollbackTiers(CheckpointStore(tmp_path)))
    rails.overran("kasmina", elapsed_ms=25.0, action="germinate")
    assert rails.emergency.level is EmergencyLevel.NORMAL and not rails.emergency.conservative
    metrics, events = rails.drain()
    counts = {m.name: m.value for m in metrics}
    assert counts["tolaria.deadline.kasmina_overrun_total"] == 1.0 and counts["tolaria.timeout.kasmina_total"] == 0.0
    (event,) = events
    assert event.name == "tolaria.deadline.overrun" and event.attributes["part"] == "kasmina"
    assert "25 ms to germinate (deadline 10 ms); observed only" in event.message


def test_deadlines_are_observed_only_unless_a_recipe_opts_in() -> None:
    assert not SafetyConfig().enforce_deadlines
