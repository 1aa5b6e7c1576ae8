"""Nissa: telemetry packets, sinks, Prometheus exposition, latency statistics and baselines.

Units of work collect a ``TelemetryPacket`` with a ``TelemetryRecorder`` and emit it to a
``TelemetrySink`` (JSONL file, Prometheus registry, memory, nowhere, or several of these through
``FanoutSink``). Benchmarks summarise latencies with ``latency_stats`` and store them, with the
environment and the run's packet, as baseline JSON files.
"""

from typing import TYPE_CHECKING

from esper_core._lazy import lazy_exports

if TYPE_CHECKING:
    from esper_core.telemetry.baseline import (
        compare_baselines,
        environment_diff,
        format_comparison,
        load_baseline,
        write_baseline,
    )
    from esper_core.telemetry.environment import capture_environment
    from esper_core.telemetry.names import check_label_key, check_name
    from esper_core.telemetry.prometheus import MetricsServer, PrometheusSink, exposition, prometheus_name, serve
    from esper_core.telemetry.recorder import TelemetryRecorder
    from esper_core.telemetry.sinks import (
        FanoutSink,
        JsonlSink,
        MemorySink,
        NullSink,
        TelemetrySink,
        packet_to_json,
        read_jsonl,
    )
    from esper_core.telemetry.stats import latency_stats, percentile

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "esper_core.telemetry.baseline": (
            "compare_baselines",
            "environment_diff",
            "format_comparison",
            "load_baseline",
            "write_baseline",
        ),
        "esper_core.telemetry.environment": ("capture_environment",),
        "esper_core.telemetry.names": ("check_label_key", "check_name"),
        "esper_core.telemetry.prometheus": (
            "MetricsServer",
            "PrometheusSink",
            "exposition",
            "prometheus_name",
            "serve",
        ),
        "esper_core.telemetry.recorder": ("TelemetryRecorder",),
        "esper_core.telemetry.sinks": (
            "FanoutSink",
            "JsonlSink",
            "MemorySink",
            "NullSink",
            "TelemetrySink",
            "packet_to_json",
            "read_jsonl",
        ),
        "esper_core.telemetry.stats": ("latency_stats", "percentile"),
    },
)

__all__ = [
    "FanoutSink",
    "JsonlSink",
    "MemorySink",
    "MetricsServer",
    "NullSink",
    "PrometheusSink",
    "TelemetryRecorder",
    "TelemetrySink",
    "capture_environment",
    "check_label_key",
    "check_name",
    "compare_baselines",
    "environment_diff",
    "exposition",
    "format_comparison",
    "latency_stats",
    "load_baseline",
    "packet_to_json",
    "percentile",
    "prometheus_name",
    "read_jsonl",
    "serve",
    "write_baseline",
]
