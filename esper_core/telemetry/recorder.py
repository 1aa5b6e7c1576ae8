"""TelemetryRecorder: collects the metrics, events and health of one unit of work into a packet.

A unit of work (an epoch, a compile job, a policy evaluation) creates one recorder, records into
it while it runs, and hands ``recorder.packet()`` to a sink at the end. The recorder does no I/O,
so it is as cheap in a test as in production; where telemetry goes is the sink's business.

Example::

    rec = TelemetryRecorder("tolaria", run_id=run_id, epoch=3)
    rec.metric("tolaria.training.latency_ms", 12.5, unit="ms")
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING, message=str(err))
    rec.degrade(HealthStatus.DEGRADED, "compiled step fell back to eager")
    sink.emit(rec.packet())
"""

from __future__ import annotations

from esper_core.contracts import (
    HealthStatus,
    MetricPoint,
    TelemetryEvent,
    TelemetryLevel,
    TelemetryPacket,
)
from esper_core.telemetry.names import check_label_key, check_name

Scalar = float | int | str | bool

# Worst-wins order for ``degrade``; health never improves within one unit of work.
HEALTH_SEVERITY: dict[HealthStatus, int] = {
    HealthStatus.HEALTHY: 0,
    HealthStatus.DEGRADED: 1,
    HealthStatus.UNHEALTHY: 2,
    HealthStatus.CRITICAL: 3,
}


class TelemetryRecorder:
    """Accumulates metrics, events and health for one ``TelemetryPacket``.

    Not thread-safe: one recorder belongs to one unit of work. ``packet()`` may be called more
    than once; each call returns a snapshot of everything recorded so far (with a fresh
    ``packet_id``), so emit each snapshot to a sink once.

    Args:
        source: Who emits the packet, e.g. ``"tolaria"`` or ``"tezzeret.compile"``.
        run_id: The training run this work belongs to, if any.
        epoch: The epoch this work belongs to, if any.

    Raises:
        ValueError: If ``source`` is empty or ``epoch`` is negative.
    """

    __slots__ = ("_events", "_health", "_metrics", "_reasons", "epoch", "run_id", "source")

    def __init__(self, source: str, *, run_id: str | None = None, epoch: int | None = None):
        if not source:
            raise ValueError("source must be a non-empty string naming the emitter, e.g. 'tolaria'")
        if epoch is not None and epoch < 0:
            raise ValueError(f"epoch must be >= 0 or None, got {epoch}")
        self.source = source
        self.run_id = run_id
        self.epoch = epoch
        self._metrics: list[MetricPoint] = []
        self._events: list[TelemetryEvent] = []
        self._health = HealthStatus.HEALTHY
        self._reasons: list[str] = []

    @property
    def health(self) -> HealthStatus:
        """The worst health status recorded so far."""
        return self._health

    def metric(self, name: str, value: float, *, unit: str = "", **labels: object) -> None:
        """Record one metric sample.

        Args:
            name: Dotted ``subsystem.area.name``, e.g. ``tolaria.training.latency_ms``. Names
                ending in ``_total`` are exported to Prometheus as counters incremented by
                ``value``; all others are gauges set to ``value``.
            value: The sample. Anything ``float()`` accepts; a 0-d CUDA tensor works but forces
                a device sync, so reduce on device and record once per epoch.
            unit: Free-form unit (``"ms"``, ``"bytes"``); informational.
            **labels: Label key/values; values are converted with ``str()``. Keep the same label
                keys for a given name every time (Prometheus needs one fixed label set).

        Raises:
            ValueError: If the name or a label key breaks the naming rules.
        """
        check_name(name, kind="metric")
        for key in labels:
            check_label_key(key, metric=name)
        self._metrics.append(
            MetricPoint(
                name=name,
                value=float(value),  # also accepts numpy scalars and 0-d tensors
                unit=unit,
                labels={k: str(v) for k, v in labels.items()},
            )
        )

    def event(
        self,
        name: str,
        *,
        level: TelemetryLevel = TelemetryLevel.INFO,
        message: str = "",
        **attributes: Scalar,
    ) -> None:
        """Record a discrete event (gate verdict, fallback, timeout, ...).

        Args:
            name: Dotted ``subsystem.area.name``, e.g. ``tolaria.compile_fallback``.
            level: Severity.
            message: Human-readable detail.
            **attributes: Scalar attributes (float, int, str or bool).

        Raises:
            ValueError: If the name breaks the naming rules.
        """
        check_name(name, kind="event")
        self._events.append(TelemetryEvent(name=name, level=level, message=message, attributes=attributes))

    def degrade(self, status: HealthStatus, reason: str) -> None:
        """Lower the packet's health; the worst status recorded wins.

        Every reason is kept (joined with ``"; "`` in the packet), including reasons given with a
        status milder than the current one, so the packet explains all of its problems.

        Args:
            status: ``DEGRADED``, ``UNHEALTHY`` or ``CRITICAL``.
            reason: Why, in words a person on call can act on.

        Raises:
            ValueError: If ``status`` is ``HEALTHY`` or ``reason`` is empty.
        """
        if status is HealthStatus.HEALTHY:
            raise ValueError("degrade() needs DEGRADED, UNHEALTHY or CRITICAL; health only worsens")
        if not reason:
            raise ValueError("degrade() needs a non-empty reason saying what went wrong")
        if HEALTH_SEVERITY[status] > HEALTH_SEVERITY[self._health]:
            self._health = status
        self._reasons.append(reason)

    def packet(self) -> TelemetryPacket:
        """Snapshot everything recorded so far as a ``TelemetryPacket``.

        Returns:
            A new packet (fresh ``packet_id`` and timestamp) with the metrics and events in the
            order they were recorded.
        """
        return TelemetryPacket(
            source=self.source,
            run_id=self.run_id,
            epoch=self.epoch,
            metrics=tuple(self._metrics),
            events=tuple(self._events),
            health=self._health,
            health_reason="; ".join(self._reasons),
        )
