"""Sinks: JSONL round trip and error reporting, fan-out, memory and null sinks."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from esper_core.contracts import HealthStatus, TelemetryLevel, TelemetryPacket
from esper_core.telemetry import (
    FanoutSink,
    JsonlSink,
    MemorySink,
    NullSink,
    PrometheusSink,
    TelemetryRecorder,
    TelemetrySink,
    read_jsonl,
)


def _packet(epoch: int, loss: float = 0.5) -> TelemetryPacket:
    rec = TelemetryRecorder("tolaria", run_id="run-1", epoch=epoch)
    rec.metric("tolaria.training.latency_ms", 10.0 + epoch, unit="ms")
    rec.metric("tolaria.train.loss", loss)
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING, message="eager")
    rec.degrade(HealthStatus.DEGRADED, "fallback")
    return rec.packet()


def test_jsonl_round_trip_creates_parents_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "run-1" / "telemetry.jsonl"
    packets = [_packet(0), _packet(1)]
    with JsonlSink(path) as sink:
        for p in packets:
            sink.emit(p)
    # A second sink on the same file appends (a retried task must not erase history).
    with JsonlSink(path) as sink:
        sink.emit(_packet(2))

    read = read_jsonl(path)

    assert read[:2] == packets
    assert [p.epoch for p in read] == [0, 1, 2]
    assert path.read_text().count("\n") == 3


def test_jsonl_keeps_non_finite_values(tmp_path: Path) -> None:
    # TelemetryPacket.to_json would turn NaN into null and then fail to read it back.
    path = tmp_path / "t.jsonl"
    with JsonlSink(path) as sink:
        sink.emit(_packet(0, loss=math.nan))
        sink.emit(_packet(1, loss=math.inf))

    nan_packet, inf_packet = read_jsonl(path)

    assert math.isnan(nan_packet.metric("tolaria.train.loss"))
    assert inf_packet.metric("tolaria.train.loss") == math.inf


def test_each_packet_is_on_disk_after_emit(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path)
    sink.emit(_packet(0))
    # Read before close: nothing may be waiting in a user-space buffer.
    assert len(read_jsonl(path)) == 1
    sink.close()


def test_corrupt_line_is_reported_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlSink(path) as sink:
        sink.emit(_packet(0))
    with open(path, "a") as f:
        f.write('{"source": "x", "oops": 1}\n')
    with JsonlSink(path) as sink:
        sink.emit(_packet(1))

    with pytest.raises(ValueError, match=r"t\.jsonl:2: not a valid telemetry packet"):
        read_jsonl(path)


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.jsonl"
    with JsonlSink(path) as sink:
        sink.emit(_packet(0))
    with open(path, "a") as f:
        f.write(_packet(1).to_json()[:40])  # a crash in the middle of a write

    with caplog.at_level(logging.WARNING, logger="esper_core.telemetry.sinks"):
        packets = read_jsonl(path)

    assert [p.epoch for p in packets] == [0]
    assert "t.jsonl:2: skipping a truncated last line" in caplog.text


def test_read_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "absent.jsonl")


def test_fanout_emits_to_all_and_closes_all_even_on_error() -> None:
    class FailingClose(MemorySink):
        def close(self) -> None:
            super().close()
            raise OSError("disk gone")

    first, failing, last = MemorySink(), FailingClose(), MemorySink()
    fanout = FanoutSink(first, failing, last)
    packet = _packet(0)
    fanout.emit(packet)

    assert first.packets == failing.packets == last.packets == [packet]
    with pytest.raises(OSError, match="disk gone"):
        fanout.close()
    assert first.closed and failing.closed and last.closed


def test_every_sink_satisfies_the_protocol(tmp_path: Path) -> None:
    sinks = [
        NullSink(),
        MemorySink(),
        FanoutSink(),
        JsonlSink(tmp_path / "t.jsonl"),
        PrometheusSink(),
    ]
    for sink in sinks:
        assert isinstance(sink, TelemetrySink)
        sink.emit(_packet(0))
        sink.close()
