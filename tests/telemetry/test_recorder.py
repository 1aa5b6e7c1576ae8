"""TelemetryRecorder: packets with metrics, events and health; naming errors explain the rule."""

from __future__ import annotations

import pytest

from esper_core.contracts import (
    HealthStatus,
    MetricPoint,
    TelemetryEvent,
    TelemetryLevel,
    TelemetryPacket,
)
from esper_core.telemetry import TelemetryRecorder
from esper_core.telemetry.names import NAME_PATTERN


def test_packet_carries_metrics_events_and_identity() -> None:
    rec = TelemetryRecorder("tolaria", run_id="run-1", epoch=3)
    rec.metric("tolaria.training.latency_ms", 12.5, unit="ms")
    rec.metric("kasmina.seed.alpha", 0.25, slot="s1", layer=2)
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING, message="boom", attempt=1)

    packet = rec.packet()

    assert isinstance(packet, TelemetryPacket)
    assert (packet.source, packet.run_id, packet.epoch) == ("tolaria", "run-1", 3)
    assert packet.metric("tolaria.training.latency_ms") == 12.5
    assert packet.metrics[0].unit == "ms"
    # Label values are stringified so Prometheus can use them.
    assert packet.metric("kasmina.seed.alpha", slot="s1", layer="2") == 0.25
    (event,) = packet.events
    assert (event.name, event.level, event.message) == (
        "tolaria.compile_fallback",
        TelemetryLevel.WARNING,
        "boom",
    )
    assert event.attributes == {"attempt": 1}
    assert packet.health is HealthStatus.HEALTHY
    assert packet.health_reason == ""


def test_degrade_keeps_worst_status_and_all_reasons() -> None:
    rec = TelemetryRecorder("tezzeret")
    rec.degrade(HealthStatus.DEGRADED, "compile fell back to eager")
    rec.degrade(HealthStatus.CRITICAL, "artifact guards mismatch")
    rec.degrade(HealthStatus.UNHEALTHY, "latency budget exceeded")

    packet = rec.packet()

    assert rec.health is HealthStatus.CRITICAL
    assert packet.health is HealthStatus.CRITICAL
    assert packet.health_reason == ("compile fell back to eager; artifact guards mismatch; latency budget exceeded")


def test_degrade_rejects_healthy_and_empty_reason() -> None:
    rec = TelemetryRecorder("tezzeret")
    with pytest.raises(ValueError, match="health only worsens"):
        rec.degrade(HealthStatus.HEALTHY, "fine")
    with pytest.raises(ValueError, match="non-empty reason"):
        rec.degrade(HealthStatus.DEGRADED, "")


def test_packet_is_a_snapshot() -> None:
    rec = TelemetryRecorder("tamiyo")
    rec.metric("tamiyo.gnn.inference.latency_ms", 1.0)
    first = rec.packet()
    rec.metric("tamiyo.gnn.inference.latency_ms", 2.0)
    second = rec.packet()

    assert len(first.metrics) == 1
    assert len(second.metrics) == 2
    assert first.packet_id != second.packet_id


@pytest.mark.parametrize("bad", ["Tolaria.training.latency_ms", "latency_ms", "tolaria..x", "tolaria.x-y", "1a.b"])
def test_bad_metric_name_names_the_rule(bad: str) -> None:
    rec = TelemetryRecorder("tolaria")
    with pytest.raises(ValueError, match=r"invalid metric name .*subsystem\.area\.name"):
        rec.metric(bad, 1.0)


def test_bad_event_name_names_the_rule() -> None:
    rec = TelemetryRecorder("tolaria")
    with pytest.raises(ValueError, match=r"invalid event name 'Fallback'.*subsystem\.area\.name"):
        rec.event("Fallback")


def test_bad_and_reserved_label_keys() -> None:
    rec = TelemetryRecorder("kasmina")
    with pytest.raises(ValueError, match="may not start with '__'"):
        rec.metric("kasmina.seed.alpha", 1.0, __slot="s1")
    with pytest.raises(ValueError, match=r"'source' .* is reserved"):
        rec.metric("kasmina.seed.alpha", 1.0, source="elsewhere")


def test_recorder_rejects_empty_source_and_negative_epoch() -> None:
    with pytest.raises(ValueError, match="source"):
        TelemetryRecorder("")
    with pytest.raises(ValueError, match="epoch"):
        TelemetryRecorder("tolaria", epoch=-1)


def test_name_rule_matches_the_contracts() -> None:
    # The recorder checks names before pydantic does, to give a readable error; both must agree.
    for model in (MetricPoint, TelemetryEvent):
        assert model.model_json_schema()["properties"]["name"]["pattern"] == NAME_PATTERN
