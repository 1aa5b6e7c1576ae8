"""Prometheus exposition of telemetry packets (Nissa's scrape endpoint).

Mapping (DESIGN.md "Telemetry names"); every series also carries ``source`` (the packet's) and
``workload`` (the recipe of the packet's run, see ``PrometheusSink.label_run``; ``""`` for work
outside a run):

- metric ``tolaria.training.latency_ms`` -> gauge ``esper_tolaria_training_latency_ms`` set to the
  latest value, labelled with the metric's labels; a metric whose name ends in ``_ms`` is also
  observed, divided by 1000, into the histogram ``esper_tolaria_training_latency_seconds`` (the
  packets and baselines keep the seeds' millisecond names; rules and dashboards use quantiles);
- metric ``tamiyo.gnn.compile_fallback_total`` (name ends in ``_total``) -> counter
  ``esper_tamiyo_gnn_compile_fallback_total`` incremented by each packet's value;
- event -> ``esper_events_total{name, level}`` += 1;
- health -> ``esper_health_status`` (0 healthy, 1 degraded, 2 unhealthy, 3 critical);
- every packet -> ``esper_telemetry_packets_total`` += 1 and
  ``esper_telemetry_last_packet_timestamp_seconds`` (for "source went silent" alerts).

The counters and events that alert rules watch with ``increase(...) > 0`` (``alerting`` in the
catalogue) are created at 0 for every source and level when the sink starts and when a run is
labelled: a series first created by its first event would start at 1, and ``increase`` never
sees that first (usually only) occurrence.

Metric families and label children are created once and cached: a packet on the hot path costs
one dict lookup plus one ``set``/``inc`` per metric (~0.3 us each on a cached child), and a
``*_ms`` metric one histogram ``observe`` more. Packets come once per epoch or decision, never
per step.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar, cast
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from esper_core.contracts import TelemetryLevel, TelemetryPacket
from esper_core.telemetry.catalog import SOURCES, Kind, TelemetryName
from esper_core.telemetry.catalog import alerting as catalog_alerting
from esper_core.telemetry.names import (
    COUNTER_SUFFIX,
    PREFIX,
    check_label_key,
    histogram_name,
    prometheus_name,
)
from esper_core.telemetry.recorder import HEALTH_SEVERITY

__all__ = [
    "COUNTER_SUFFIX",
    "LATENCY_BUCKETS_S",
    "PREFIX",
    "MetricsServer",
    "PrometheusSink",
    "exposition",
    "prometheus_name",
    "serve",
]

LATENCY_BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.018,  # the seeds' epoch budget: a bucket edge, so the budget's quantile is not interpolated
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
"""Histogram buckets (seconds) for every ``*_ms`` metric: 50 us lookups up to 2 min compiles."""

_Update = Callable[[float], None]
_LabelItems = tuple[tuple[str, str], ...]
_MetricKey = tuple[str, str, str, _LabelItems]  # (dotted name, source, workload, sorted labels)
_MetricT = TypeVar("_MetricT", bound=Gauge | Counter | Histogram)
_OWN_LABELS = ("source", "workload")


def exposition(registry: CollectorRegistry) -> str:
    """The registry's metrics in the Prometheus text format (what ``/metrics`` serves)."""
    return generate_latest(registry).decode("utf-8")


@dataclass(frozen=True, slots=True)
class _Family:
    """One registered metric family and the dotted name and label keys it was created for."""

    dotted_name: str
    label_keys: tuple[str, ...]  # sorted metric label keys; source and workload come after them
    metric: Gauge | Counter | Histogram
    reserved: bool  # one of the sink's own families (events, health, packets)


class PrometheusSink:
    """Exports packets to a ``prometheus_client`` registry.

    Use one sink per registry: the sink registers its own families (events, health, packets)
    and the zero series of ``alerting`` when it is built. Emitting is thread-safe; creating a
    family or child takes a lock, updating a cached child does not.

    Args:
        registry: Where the metrics live. Defaults to a fresh ``CollectorRegistry`` (not the
            process-global ``REGISTRY``), so tests and concurrent runs stay isolated; pass the
            registry that ``serve`` exposes.
        describe: Help text of a dotted metric name, or ``None`` to use a generic one (pass
            ``esper_core.telemetry.catalog.help_text`` to expose the catalogue's descriptions).
        alerting: Events and counters to create at 0 for every source (and event level) of
            ``esper_core.telemetry.catalog.SOURCES``; default: the catalogue's alerting entries.

    Raises:
        ValueError: If the registry already holds the sink's own families (a second sink on the
            same registry), or an ``alerting`` entry is a gauge or has labels.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        describe: Callable[[str], str | None] | None = None,
        alerting: Iterable[TelemetryName] | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._describe = describe
        self._alerting = tuple(catalog_alerting() if alerting is None else alerting)
        for entry in self._alerting:
            if entry.kind is Kind.GAUGE or entry.labels:
                raise ValueError(
                    f"{entry.name} cannot be pre-created at 0: only events and counters without "
                    "labels can (mark it alerting=False in the catalogue)"
                )
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}  # keyed by Prometheus base name
        self._updates: dict[_MetricKey, _Update] = {}
        self._sources: dict[tuple[str, str], tuple[_Update, _Update, _Update]] = {}
        self._events: dict[tuple[str, str, str, str], Callable[[], None]] = {}
        self._workloads: dict[str, str] = {}  # run id -> workload (the run's recipe)
        self._zeroed: set[str] = set()  # workloads whose alerting series exist

        self._health = self._register(
            "health.status",
            Gauge,
            "esper_health_status",
            "Health of the latest packet per source: 0 healthy, 1 degraded, 2 unhealthy, 3 critical",
            _OWN_LABELS,
            reserved=True,
        )
        self._event_counter = self._register(
            "events.total",
            Counter,
            "esper_events",
            "Telemetry events by name, level and source",
            ("name", "level", *_OWN_LABELS),
            reserved=True,
        )
        self._packets = self._register(
            "telemetry.packets_total",
            Counter,
            "esper_telemetry_packets",
            "Telemetry packets received per source",
            _OWN_LABELS,
            reserved=True,
        )
        self._last_seen = self._register(
            "telemetry.last_packet_timestamp_seconds",
            Gauge,
            "esper_telemetry_last_packet_timestamp_seconds",
            "Unix time of the latest packet per source",
            _OWN_LABELS,
            reserved=True,
        )
        self._create_zero_series("")

    def label_run(self, run_id: str, *, workload: str) -> None:
        """Label the series of run ``run_id``'s packets with ``workload`` (the run's recipe).

        Alert rules scoped to one workload (the 18 ms epoch budget belongs to
        ``seed-reference``) select on this label. The alerting series of ``workload`` are
        created at 0 here, before the run's first packet. Packets of runs never labelled (and
        packets without a run, e.g. compiles) carry ``workload=""``.

        Args:
            run_id: The run, as in its packets' ``run_id``.
            workload: The run's recipe name, e.g. ``seed-reference``.

        Raises:
            ValueError: If ``run_id`` or ``workload`` is empty.
        """
        if not run_id or not workload:
            raise ValueError(
                f"label_run needs a run id and a workload (the run's recipe), got {run_id!r} and {workload!r}"
            )
        with self._lock:
            self._workloads[run_id] = workload
        self._create_zero_series(workload)

    def emit(self, packet: TelemetryPacket) -> None:
        """Update the registry from one packet.

        Raises:
            ValueError: If a metric's label keys differ from those its name was first seen
                with, two names map to the same Prometheus name, or a counter (``*_total``)
                gets a negative or non-finite increment.
        """
        source = packet.source
        workload = self._workloads.get(packet.run_id, "") if packet.run_id is not None else ""
        for point in packet.metrics:
            key = (point.name, source, workload, tuple(sorted(point.labels.items())))
            update = self._updates.get(key)
            if update is None:
                update = self._new_update(key, unit=point.unit)
            update(point.value)
        for event in packet.events:
            inc = self._events.get((event.name, event.level.value, source, workload))
            if inc is None:
                inc = self._new_event((event.name, event.level.value, source, workload))
            inc()
        per_source = self._sources.get((source, workload))
        if per_source is None:
            with self._lock:
                per_source = (
                    self._health.labels(source, workload).set,
                    self._packets.labels(source, workload).inc,
                    self._last_seen.labels(source, workload).set,
                )
                self._sources[(source, workload)] = per_source
        set_health, inc_packets, set_last_seen = per_source
        set_health(HEALTH_SEVERITY[packet.health])
        inc_packets(1)
        set_last_seen(packet.timestamp)

    def close(self) -> None:
        """Nothing to release: the registry keeps serving the last values."""

    # ------------------------------------------------------------------ slow path (first sight)

    def _create_zero_series(self, workload: str) -> None:
        """Create the alerting events and counters of ``workload`` at 0, for every source."""
        if workload in self._zeroed:
            return
        for entry in self._alerting:
            for source in SOURCES:
                if entry.kind is Kind.EVENT:
                    for level in TelemetryLevel:
                        if (entry.name, level.value, source, workload) not in self._events:
                            self._new_event((entry.name, level.value, source, workload))
                elif (key := (entry.name, source, workload, ())) not in self._updates:
                    self._new_update(key, unit=entry.unit)
        self._zeroed.add(workload)

    def _new_event(self, event_key: tuple[str, str, str, str]) -> Callable[[], None]:
        with self._lock:
            inc = self._event_counter.labels(*event_key).inc
            self._events[event_key] = inc
        return inc

    def _new_update(self, key: _MetricKey, *, unit: str) -> _Update:
        """Create (or find) the family and child for a metric seen for the first time."""
        name, source, workload, label_items = key
        label_keys = tuple(k for k, _ in label_items)
        for label in label_keys:
            check_label_key(label, metric=name)
        is_counter = name.endswith(COUNTER_SUFFIX)
        full_name = prometheus_name(name)
        # prometheus-client appends "_total" to counters itself; strip it so the exposed name is
        # exactly esper_<name>_total rather than ..._total_total.
        base_name = full_name.removesuffix(COUNTER_SUFFIX) if is_counter else full_name
        label_values = (*(v for _, v in label_items), source, workload)
        with self._lock:
            update: _Update
            if is_counter:
                counter = self._family(name, base_name, Counter, label_keys, unit=unit)
                update = _counter_update(name, counter.labels(*label_values).inc)
            else:
                update = self._family(name, base_name, Gauge, label_keys, unit=unit).labels(*label_values).set
            if not is_counter and (seconds_name := histogram_name(name)) is not None:
                hist = self._family(name, seconds_name, Histogram, label_keys, unit="s")
                update = _with_histogram(update, hist.labels(*label_values).observe)
            self._updates[key] = update
        return update

    def _family(
        self,
        name: str,
        base_name: str,
        metric_type: type[_MetricT],
        label_keys: tuple[str, ...],
        *,
        unit: str,
    ) -> _MetricT:
        """The metric of family ``base_name``, registered on first use; the caller holds the lock."""
        family = self._families.get(base_name)
        if family is None:
            suffix = f" ({unit})" if unit else ""
            described = self._describe(name) if self._describe is not None else None
            help_text = f"{described or 'Esper metric ' + name}{suffix}"
            labels = (*label_keys, *_OWN_LABELS)
            self._register(name, metric_type, base_name, help_text, labels)
            family = self._families[base_name]
        self._check_family(family, name, label_keys)
        # Of ``metric_type``: the check pins the family to one dotted name, whose type never changes.
        return cast(_MetricT, family.metric)

    def _register(
        self,
        dotted_name: str,
        metric_type: type[_MetricT],
        base_name: str,
        help_text: str,
        label_names: Sequence[str],
        *,
        reserved: bool = False,
    ) -> _MetricT:
        """Register a family in the registry and the cache, translating name collisions."""
        metric: Gauge | Counter | Histogram
        try:
            if metric_type is Histogram:
                metric = Histogram(base_name, help_text, label_names, registry=self.registry, buckets=LATENCY_BUCKETS_S)
            else:
                metric = metric_type(base_name, help_text, label_names, registry=self.registry)
        except ValueError as e:
            raise ValueError(
                f"cannot register {dotted_name} as {base_name} in the Prometheus registry: {e}. "
                "Another collector already exposes that name: rename the metric, or use one "
                "PrometheusSink per registry"
            ) from e
        keys = tuple(label_names[: -len(_OWN_LABELS)])
        self._families[base_name] = _Family(dotted_name, keys, metric, reserved=reserved)
        return cast(_MetricT, metric)  # metric_type's instance: a Histogram only when it is Histogram

    @staticmethod
    def _check_family(family: _Family, name: str, label_keys: tuple[str, ...]) -> None:
        if family.reserved:
            raise ValueError(
                f"metric {name} maps to {prometheus_name(name)}, a name PrometheusSink reserves "
                "for its own series (events, health, packets); rename the metric"
            )
        if family.dotted_name != name:
            raise ValueError(
                f"metrics {family.dotted_name} and {name} both map to the Prometheus name "
                f"{prometheus_name(family.dotted_name)}; rename one of them"
            )
        if family.label_keys != label_keys:
            raise ValueError(
                f"metric {name} was first emitted with labels {list(family.label_keys)} and now "
                f"with {list(label_keys)}; Prometheus needs one fixed label set per metric: emit "
                "the same label keys every time (use '' for a missing value) or use another name"
            )


def _with_histogram(set_gauge: _Update, observe: _Update) -> _Update:
    """Set the ``*_ms`` gauge and observe the value, in seconds, into its histogram."""

    def update(value_ms: float) -> None:
        set_gauge(value_ms)
        # A NaN would land in no bucket but poison _sum for good; the gauge still shows it.
        if math.isfinite(value_ms):
            observe(value_ms / 1000.0)

    return update


def _counter_update(name: str, inc: Callable[[float], None]) -> _Update:
    """Wrap a counter child's ``inc`` with a check that names the offending metric."""

    def update(value: float) -> None:
        # ``not (0 <= value < inf)`` also rejects NaN, which would poison the counter for good.
        if not 0.0 <= value < math.inf:
            raise ValueError(
                f"metric {name} ends with '_total', so it is a counter incremented by each "
                f"packet's value, which must be finite and >= 0 (got {value}); emit a "
                "non-negative increment, or drop the '_total' suffix to export a gauge"
            )
        inc(value)

    return update


@dataclass(slots=True)
class MetricsServer:
    """A running ``/metrics`` HTTP endpoint; ``close()`` stops it."""

    server: WSGIServer
    thread: threading.Thread
    port: int
    addr: str

    @property
    def url(self) -> str:
        """The scrape URL, e.g. ``http://127.0.0.1:9464/metrics``."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving, close the socket and join the server thread."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5.0)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve(port: int, registry: CollectorRegistry, *, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve ``registry`` at ``http://<addr>:<port>/metrics`` from a daemon thread.

    A thin wrapper over ``prometheus_client.start_http_server`` that returns a handle able to
    stop the server again.

    Args:
        port: TCP port; ``0`` picks a free one (read it back from ``.port``).
        registry: The registry to expose (the one given to ``PrometheusSink``).
        addr: Bind address. The default (all interfaces) matches prometheus-client and lets a
            Prometheus server on another machine scrape; use ``"127.0.0.1"`` for local only.

    Returns:
        The running server's handle.

    Raises:
        ValueError: If ``port`` is outside 0..65535.
        OSError: If the port cannot be bound (e.g. already in use).
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535 (0 picks a free port), got {port}")
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server=server, thread=thread, port=server.server_port, addr=addr)
