"""PrometheusSink on a fresh registry: gauges, counters, events, health, conflicts, HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from esper_core.contracts import HealthStatus, TelemetryLevel, TelemetryPacket
from esper_core.telemetry import (
    PrometheusSink,
    TelemetryRecorder,
    exposition,
    prometheus_name,
    serve,
)


@pytest.fixture
def sink() -> PrometheusSink:
    return PrometheusSink(CollectorRegistry())


def _packet(source: str = "tolaria", **metrics: float) -> TelemetryPacket:
    rec = TelemetryRecorder(source)
    for name, value in metrics.items():
        rec.metric(name.replace("__", "."), value)
    return rec.packet()


def _value(sink: PrometheusSink, series: str, **labels: str) -> float | None:
    return sink.registry.get_sample_value(series, {"workload": "", **labels})


def test_prometheus_name_mapping() -> None:
    assert prometheus_name("tolaria.training.latency_ms") == "esper_tolaria_training_latency_ms"
    assert prometheus_name("tamiyo.gnn.compile_fallback_total") == "esper_tamiyo_gnn_compile_fallback_total"
    with pytest.raises(ValueError, match=r"subsystem\.area\.name"):
        prometheus_name("esper_tolaria_training_latency_ms")


def test_default_registry_is_fresh_not_global() -> None:
    from prometheus_client import REGISTRY

    first, second = PrometheusSink(), PrometheusSink()
    assert first.registry is not second.registry
    assert first.registry is not REGISTRY


def test_gauge_holds_latest_value(sink: PrometheusSink) -> None:
    sink.emit(_packet(tolaria__training__latency_ms=12.5))
    sink.emit(_packet(tolaria__training__latency_ms=11.0))

    assert _value(sink, "esper_tolaria_training_latency_ms", source="tolaria") == 11.0


def test_labels_and_sources_are_separate_series(sink: PrometheusSink) -> None:
    for slot, alpha in (("s1", 0.25), ("s2", 0.75)):
        rec = TelemetryRecorder("kasmina")
        rec.metric("kasmina.seed.alpha", alpha, slot=slot)
        sink.emit(rec.packet())
    sink.emit(_packet("tolaria", tolaria__training__latency_ms=1.0))
    sink.emit(_packet("bench", tolaria__training__latency_ms=2.0))

    assert _value(sink, "esper_kasmina_seed_alpha", slot="s1", source="kasmina") == 0.25
    assert _value(sink, "esper_kasmina_seed_alpha", slot="s2", source="kasmina") == 0.75
    assert _value(sink, "esper_tolaria_training_latency_ms", source="bench") == 2.0


def test_total_metrics_are_counters_with_exact_name(sink: PrometheusSink) -> None:
    sink.emit(_packet(tamiyo__gnn__compile_fallback_total=1))
    sink.emit(_packet(tamiyo__gnn__compile_fallback_total=2))

    assert _value(sink, "esper_tamiyo_gnn_compile_fallback_total", source="tolaria") == 3.0
    text = exposition(sink.registry)
    assert "# TYPE esper_tamiyo_gnn_compile_fallback_total counter" in text
    assert "_total_total" not in text


def test_counter_rejects_negative_and_nan(sink: PrometheusSink) -> None:
    with pytest.raises(ValueError, match=r"ends with '_total'.*got -1"):
        sink.emit(_packet(tolaria__timeout__count_total=-1))
    with pytest.raises(ValueError, match="got nan"):
        sink.emit(_packet(tolaria__timeout__count_total=float("nan")))


def test_events_and_health_and_packets(sink: PrometheusSink) -> None:
    rec = TelemetryRecorder("tolaria")
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING)
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING)
    rec.event("kasmina.gate.g1_gradient_health")
    rec.degrade(HealthStatus.UNHEALTHY, "timeout")
    sink.emit(rec.packet())
    sink.emit(_packet("tamiyo"))

    fallback = {"name": "tolaria.compile_fallback", "level": "warning", "source": "tolaria"}
    gate = {"name": "kasmina.gate.g1_gradient_health", "level": "info", "source": "tolaria"}
    assert _value(sink, "esper_events_total", **fallback) == 2.0
    assert _value(sink, "esper_events_total", **gate) == 1.0
    assert _value(sink, "esper_health_status", source="tolaria") == 2.0
    assert _value(sink, "esper_health_status", source="tamiyo") == 0.0
    assert _value(sink, "esper_telemetry_packets_total", source="tolaria") == 1.0
    last_seen = _value(sink, "esper_telemetry_last_packet_timestamp_seconds", source="tamiyo")
    assert last_seen is not None and last_seen > 0


def test_label_set_conflict_raises(sink: PrometheusSink) -> None:
    rec = TelemetryRecorder("kasmina")
    rec.metric("kasmina.seed.alpha", 0.5, slot="s1")
    sink.emit(rec.packet())

    rec = TelemetryRecorder("kasmina")
    rec.metric("kasmina.seed.alpha", 0.5, slot="s1", layer="fc1")
    expected = r"first emitted with labels \['slot'\] and now with \['layer', 'slot'\]"
    with pytest.raises(ValueError, match=expected):
        sink.emit(rec.packet())


def test_names_colliding_after_mapping_raise(sink: PrometheusSink) -> None:
    sink.emit(_packet(tolaria__grad_agg__ratio=1.0))
    with pytest.raises(ValueError, match="both map to the Prometheus name"):
        sink.emit(_packet(tolaria__grad__agg_ratio=1.0))
    with pytest.raises(ValueError, match="reserves"):
        sink.emit(_packet(health__status=1.0))


def test_second_sink_on_same_registry_raises(sink: PrometheusSink) -> None:
    with pytest.raises(ValueError, match="one PrometheusSink per registry"):
        PrometheusSink(sink.registry)


def test_cached_children_are_reused(sink: PrometheusSink) -> None:
    packet = _packet(tolaria__training__latency_ms=1.0)
    sink.emit(packet)
    families = dict(sink._families)
    updates = dict(sink._updates)
    for _ in range(3):
        sink.emit(packet)
    assert sink._families == families
    assert sink._updates == updates


def test_http_exposition_on_ephemeral_port(sink: PrometheusSink) -> None:
    sink.emit(_packet(tolaria__training__latency_ms=12.5))
    with serve(0, sink.registry, addr="127.0.0.1") as server:
        assert server.port > 0
        with urllib.request.urlopen(server.url, timeout=5) as response:
            body = response.read().decode()
        assert response.status == 200
        assert 'esper_tolaria_training_latency_ms{source="tolaria",workload=""} 12.5' in body
    assert not server.thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=1)


def test_serve_rejects_bad_port() -> None:
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        serve(70000, CollectorRegistry())


def test_alerting_series_exist_at_zero_before_the_first_event(sink: PrometheusSink) -> None:
    # increase() over a series first created at 1 is 0: the first fallback must be an increase.
    fallback = {"name": "tolaria.compile_fallback", "level": "warning", "source": "tolaria"}
    assert _value(sink, "esper_events_total", **fallback) == 0.0
    assert _value(sink, "esper_events_total", **{**fallback, "source": "kasmina", "level": "info"}) == 0.0
    for counter in ("esper_tolaria_timeout_tamiyo_total", "esper_tamiyo_gnn_compile_fallback_total"):
        assert _value(sink, counter, source="tamiyo") == 0.0
    assert _value(sink, "esper_events_total", name="tamiyo.command", level="info", source="tamiyo") is None

    sink.label_run("run-1", workload="seed-reference")
    assert _value(sink, "esper_events_total", **fallback, workload="seed-reference") == 0.0
    rec = TelemetryRecorder("tolaria", run_id="run-1")
    rec.event("tolaria.compile_fallback", level=TelemetryLevel.WARNING)
    sink.emit(rec.packet())
    assert _value(sink, "esper_events_total", **fallback, workload="seed-reference") == 1.0
    assert _value(sink, "esper_events_total", **fallback) == 0.0


def test_alerting_entries_must_be_pre_creatable() -> None:
    from esper_core.telemetry.catalog import lookup

    with pytest.raises(ValueError, match=r"only events and counters without labels"):
        PrometheusSink(alerting=[lookup("tolaria.training.latency_ms")])


def test_runs_are_labelled_with_their_workload(sink: PrometheusSink) -> None:
    sink.label_run("a", workload="seed-reference")
    sink.label_run("b", workload="digits-cnn")
    for run_id, ms in (("a", 5.0), ("b", 40.0), (None, 7.0)):
        rec = TelemetryRecorder("tolaria", run_id=run_id)
        rec.metric("tolaria.training.latency_ms", ms)
        sink.emit(rec.packet())

    assert _value(sink, "esper_tolaria_training_latency_ms", source="tolaria", workload="seed-reference") == 5.0
    assert _value(sink, "esper_tolaria_training_latency_ms", source="tolaria", workload="digits-cnn") == 40.0
    assert _value(sink, "esper_tolaria_training_latency_ms", source="tolaria") == 7.0  # no run: workload=""
    assert _value(sink, "esper_telemetry_packets_total", source="tolaria", workload="digits-cnn") == 1.0
    with pytest.raises(ValueError, match="the run's recipe"):
        sink.label_run("c", workload="")


def test_ms_metrics_are_also_histograms_in_seconds(sink: PrometheusSink) -> None:
    for ms in (12.0, 17.0, 30.0, float("nan")):
        sink.emit(_packet(tolaria__training__latency_ms=ms))

    name = "esper_tolaria_training_latency_seconds"
    assert _value(sink, f"{name}_count", source="tolaria") == 3.0  # NaN stays out of the histogram
    assert _value(sink, f"{name}_sum", source="tolaria") == pytest.approx(0.059)
    assert _value(sink, f"{name}_bucket", source="tolaria", le="0.018") == 2.0  # the budget is an edge
    assert _value(sink, f"{name}_bucket", source="tolaria", le="+Inf") == 3.0
    text = exposition(sink.registry)
    assert f"# TYPE {name} histogram" in text
    sink.emit(_packet(tolaria__training__loss=0.5))
    assert "esper_tolaria_training_loss_seconds" not in exposition(sink.registry)  # only *_ms metrics


def test_workload_is_a_reserved_label() -> None:
    rec = TelemetryRecorder("tolaria")
    with pytest.raises(ValueError, match="'workload' .* is reserved"):
        rec.metric("tolaria.training.loss", 1.0, workload="x")
