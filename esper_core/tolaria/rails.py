"""The safety rails of one run as a component: deadline outcomes, failed epochs, rollbacks,
conservative mode, and the telemetry they produce (``tolaria.timeout.*``, ``tolaria.rollback.*``,
``tolaria.emergency.level``)."""

from __future__ import annotations

from typing import Any

from esper_core.contracts import (
    AdaptationCommand,
    CommandType,
    MetricPoint,
    SeedOperation,
    TelemetryEvent,
    TelemetryLevel,
)
from esper_core.tolaria.rollback import RestoreReport, RollbackTiers
from esper_core.tolaria.safety import EmergencyLevel, EmergencyState, SafetyConfig

# Commands carried out in conservative mode: nothing that grows or reshapes the network.
_SAFE_OPERATIONS = frozenset({SeedOperation.CULL, SeedOperation.FOSSILIZE})


class SafetyRails:
    """Escalation state plus counters, reported once per epoch."""

    def __init__(self, config: SafetyConfig, tiers: RollbackTiers) -> None:
        self.config = config
        self.tiers = tiers
        self.emergency = EmergencyState(config)
        self._counts = {
            "tamiyo": 0,
            "kasmina": 0,
            "deadline": 0,
            "failures": 0,
            "tamiyo_overrun": 0,
            "kasmina_overrun": 0,
        }
        self._restore_ms: list[float] = []
        self._events: list[TelemetryEvent] = []

    # ------------------------------------------------------------------ outcomes

    def tamiyo_missed(
        self, *, epoch: int, run_id: str, elapsed_ms: float, error: BaseException | None
    ) -> AdaptationCommand:
        """Record a decision that timed out or failed; returns the conservative WAIT to use."""
        self.emergency.on_timeout()
        if error is None:
            self._counts["tamiyo"] += 1
            reason = f"Tamiyo missed its {self.config.tamiyo_deadline_ms:.0f} ms deadline ({elapsed_ms:.0f} ms)"
            self._event("tolaria.timeout", TelemetryLevel.WARNING, reason, part="tamiyo", elapsed_ms=elapsed_ms)
        else:
            reason = f"Tamiyo failed: {type(error).__name__}: {error}"[:500]
            self._event("tamiyo.error", TelemetryLevel.ERROR, reason)
        return AdaptationCommand(
            run_id=run_id,
            epoch=epoch,
            command_type=CommandType.WAIT,
            issued_by="tolaria.safety",
            reason=f"{reason}; conservative mode for {self.config.conservative_epochs} epochs",
        )

    def kasmina_missed(self, *, elapsed_ms: float, action: str) -> str:
        """Record a command whose application overran its deadline (the caller rolls it back)."""
        self._counts["kasmina"] += 1
        self.emergency.on_timeout()
        reason = (
            f"Kasmina took {elapsed_ms:.0f} ms to {action} (deadline {self.config.kasmina_deadline_ms:.0f} ms); undone"
        )
        self._event("tolaria.timeout", TelemetryLevel.WARNING, reason, part="kasmina", elapsed_ms=elapsed_ms)
        return reason

    def overran(self, part: str, *, elapsed_ms: float, action: str) -> None:
        """Record a deadline overrun that is observed only (``SafetyConfig.enforce_deadlines`` off):
        counted and reported, and the run goes on as if it had been on time."""
        deadline = self.config.tamiyo_deadline_ms if part == "tamiyo" else self.config.kasmina_deadline_ms
        self._counts[f"{part}_overrun"] += 1
        self._event(
            "tolaria.deadline.overrun",
            TelemetryLevel.WARNING,
            f"{part.capitalize()} took {elapsed_ms:.0f} ms to {action} (deadline {deadline:.0f} ms); observed only, "
            "so the run stays reproducible (SafetyConfig.enforce_deadlines acts on it)",
            part=part,
            elapsed_ms=elapsed_ms,
        )

    def filter(self, command: AdaptationCommand) -> AdaptationCommand:
        """In conservative mode, downgrade growth and reshaping commands to WAIT (says why)."""
        if not self.emergency.conservative or command.command_type is CommandType.WAIT:
            return command
        if command.seed_operation in _SAFE_OPERATIONS:
            return command
        return command.model_copy(
            update={
                "command_type": CommandType.WAIT,
                "seed_operation": None,
                "risk_rule": "tolaria.conservative_mode",
                "reason": f"conservative mode ({self.emergency.level.name.lower()}): held back {command.action}: {command.reason}",
            }
        )

    def epoch_failed(self, reason: str) -> EmergencyLevel:
        """Record a failed epoch; returns the new level (HALT means stop)."""
        level = self.emergency.on_epoch_failed()
        self._event("tolaria.epoch.failed", TelemetryLevel.ERROR, reason, emergency_level=level.name.lower())
        return level

    def epoch_ok(self) -> None:
        """A healthy epoch."""
        self.emergency.on_epoch_ok()

    def restored(self, report: RestoreReport, *, why: str) -> None:
        """Record one rollback restore."""
        self._restore_ms.append(report.latency_ms)
        self._counts["failures"] += report.failures
        if report.deadline_exceeded:
            self._counts["deadline"] += 1
        self._event(
            "tolaria.rollback",
            TelemetryLevel.WARNING if report.deadline_exceeded else TelemetryLevel.INFO,
            f"restored {report.tag} from {report.tier} in {report.latency_ms:.1f} ms: {why}",
            tier=report.tier,
            latency_ms=report.latency_ms,
            deadline_exceeded=report.deadline_exceeded,
        )

    def note(self, name: str, message: str, **attributes: str | float | bool) -> None:
        """Any other rails event (remediation, halt)."""
        self._event(name, TelemetryLevel.WARNING, message, **attributes)

    # ------------------------------------------------------------------ state

    def state_dict(self, *, in_memory: bool = False) -> dict[str, Any]:
        """The escalation state (checkpointed with the run); with ``in_memory`` also the counters
        and events not drained yet, which only a fork of the live run puts back."""
        state: dict[str, Any] = dict(self.emergency.state_dict())
        if in_memory:
            state.update(counts=dict(self._counts), restore_ms=list(self._restore_ms), events=list(self._events))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of ``state_dict``; from a checkpoint the undrained counters and events stay."""
        self.emergency.load_state_dict(state)
        if "counts" in state:
            self._counts = dict(state["counts"])
            self._restore_ms = list(state["restore_ms"])
            self._events = list(state["events"])

    # ------------------------------------------------------------------ telemetry

    def drain(self) -> tuple[list[MetricPoint], list[TelemetryEvent]]:
        """Counters since the last drain (as increments), the level, and pending events."""
        metrics = [
            MetricPoint(name="tolaria.timeout.tamiyo_total", value=float(self._counts["tamiyo"])),
            MetricPoint(name="tolaria.timeout.kasmina_total", value=float(self._counts["kasmina"])),
            MetricPoint(name="tolaria.deadline.tamiyo_overrun_total", value=float(self._counts["tamiyo_overrun"])),
            MetricPoint(name="tolaria.deadline.kasmina_overrun_total", value=float(self._counts["kasmina_overrun"])),
            MetricPoint(name="tolaria.rollback.deadline_exceeded_total", value=float(self._counts["deadline"])),
            MetricPoint(name="tolaria.rollback.failures_total", value=float(self._counts["failures"])),
            MetricPoint(name="tolaria.emergency.level", value=float(self.emergency.level)),
        ]
        metrics += [
            MetricPoint(name="tolaria.rollback.restore_latency_ms", value=ms, unit="ms") for ms in self._restore_ms
        ]
        self._counts = dict.fromkeys(self._counts, 0)
        self._restore_ms = []
        events, self._events = self._events, []
        return metrics, events

    def _event(self, name: str, level: TelemetryLevel, message: str, **attributes: str | float | bool) -> None:
        self._events.append(TelemetryEvent(name=name, level=level, message=message, attributes=attributes))
