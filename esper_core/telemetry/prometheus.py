"""Prometheus exposition of telemetry packets (Nissa's scrape endpoint).

Mapping (DESIGN.md "Telemetry names"):

- metric ``tolaria.training.latency_ms`` -> gauge ``esper_tolaria_training_latency_ms`` set to the
  latest value, labelled with the metric's labels plus ``source``;
- metric ``tamiyo.gnn.compile_fallback_total`` (name ends in ``_total``) -> counter
  ``esper_tamiyo_gnn_compile_fallback_total`` incremented by each packet's value;
- event -> ``esper_events_total{name, level, source}`` += 1;
- health -> ``esper_health_status{source}`` (0 healthy, 1 degraded, 2 unhealthy, 3 critical);
- every packet -> ``esper_telemetry_packets_total{source}`` += 1 and
  ``esper_telemetry_last_packet_timestamp_seconds{source}`` (for "source went silent" alerts).

Metric families and label children are created once and cached: a packet on the hot path costs
one dict lookup plus one ``set``/``inc`` per metric (~0.3 us each on a cached child).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from esper_core.contracts import MetricPoint, TelemetryPacket
from esper_core.telemetry.names import check_label_key, check_name
from esper_core.telemetry.recorder import HEALTH_SEVERITY

PREFIX = "esper_"
COUNTER_SUFFIX = "_total"

_Update = Callable[[float], None]
_LabelItems = tuple[tuple[str, str], ...]
_MetricT = TypeVar("_MetricT", Gauge, Counter)


def prometheus_name(name: str) -> str:
    """Map a dotted telemetry name to its Prometheus name.

    Args:
        name: E.g. ``tolaria.training.latency_ms``.

    Returns:
        E.g. ``esper_tolaria_training_latency_ms``: dots become underscores under ``esper_``.

    Raises:
        ValueError: If ``name`` does not follow ``subsystem.area.name``.
    """
    return PREFIX + check_name(name).replace(".", "_")


def exposition(registry: CollectorRegistry) -> str:
    """The registry's metrics in the Prometheus text format (what ``/metrics`` serves)."""
    return generate_latest(registry).decode("utf-8")


@dataclass(frozen=True, slots=True)
class _Family:
    """One registered metric family and the dotted name and label keys it was created for."""

    dotted_name: str
    label_keys: tuple[str, ...]  # sorted metric label keys; "source" is appended after them
    metric: Gauge | Counter
    reserved: bool  # one of the sink's own families (events, health, packets)


class PrometheusSink:
    """Exports packets to a ``prometheus_client`` registry.

    Use one sink per registry: the sink registers its own families (events, health, packets)
    when it is built. Emitting is thread-safe; creating a family or child takes a lock, updating
    a cached child does not.

    Args:
        registry: Where the metrics live. Defaults to a fresh ``CollectorRegistry`` (not the
            process-global ``REGISTRY``), so tests and concurrent runs stay isolated; pass the
            registry that ``serve`` exposes.
        describe: Help text of a dotted metric name, or ``None`` to use a generic one (pass
            ``esper_core.telemetry.catalog.help_text`` to expose the catalogue's descriptions).

    Raises:
        ValueError: If the registry already holds the sink's own families (a second sink on the
            same registry).
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, describe: Callable[[str], str | None] | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._describe = describe
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}  # keyed by Prometheus base name
        self._updates: dict[tuple[str, str, _LabelItems], _Update] = {}
        self._sources: dict[str, tuple[_Update, _Update, _Update]] = {}
        self._events: dict[tuple[str, str, str], Callable[[], None]] = {}

        self._health = self._register(
            "health.status",
            Gauge,
            "esper_health_status",
            "Health of the latest packet per source: 0 healthy, 1 degraded, 2 unhealthy, 3 critical",
            ("source",),
            reserved=True,
        )
        self._event_counter = self._register(
            "events.total",
            Counter,
            "esper_events",
            "Telemetry events by name, level and source",
            ("name", "level", "source"),
            reserved=True,
        )
        self._packets = self._register(
            "telemetry.packets_total",
            Counter,
            "esper_telemetry_packets",
            "Telemetry packets received per source",
            ("source",),
            reserved=True,
        )
        self._last_seen = self._register(
            "telemetry.last_packet_timestamp_seconds",
            Gauge,
            "esper_telemetry_last_packet_timestamp_seconds",
            "Unix time of the latest packet per source",
            ("source",),
            reserved=True,
        )

    def emit(self, packet: TelemetryPacket) -> None:
        """Update the registry from one packet.

        Raises:
            ValueError: If a metric's label keys differ from those its name was first seen
                with, two names map to the same Prometheus name, or a counter (``*_total``)
                gets a negative or non-finite increment.
        """
        source = packet.source
        for point in packet.metrics:
            key = (point.name, source, tuple(sorted(point.labels.items())))
            update = self._updates.get(key)
            if update is None:
                update = self._new_update(point, source, key)
            update(point.value)
        for event in packet.events:
            event_key = (event.name, event.level.value, source)
            inc = self._events.get(event_key)
            if inc is None:
                with self._lock:
                    inc = self._event_counter.labels(*event_key).inc
                    self._events[event_key] = inc
            inc()
        per_source = self._sources.get(source)
        if per_source is None:
            with self._lock:
                per_source = (
                    self._health.labels(source).set,
                    self._packets.labels(source).inc,
                    self._last_seen.labels(source).set,
                )
                self._sources[source] = per_source
        set_health, inc_packets, set_last_seen = per_source
        set_health(HEALTH_SEVERITY[packet.health])
        inc_packets(1)
        set_last_seen(packet.timestamp)

    def close(self) -> None:
        """Nothing to release: the registry keeps serving the last values."""

    # ------------------------------------------------------------------ slow path (first sight)

    def _new_update(self, point: MetricPoint, source: str, key: tuple[str, str, _LabelItems]) -> _Update:
        """Create (or find) the family and child for a metric seen for the first time."""
        label_keys = tuple(sorted(point.labels))
        for label in label_keys:
            check_label_key(label, metric=point.name)
        is_counter = point.name.endswith(COUNTER_SUFFIX)
        full_name = prometheus_name(point.name)
        # prometheus-client appends "_total" to counters itself; strip it so the exposed name is
        # exactly esper_<name>_total rather than ..._total_total.
        base_name = full_name.removesuffix(COUNTER_SUFFIX) if is_counter else full_name
        with self._lock:
            family = self._families.get(base_name)
            if family is None:
                unit = f" ({point.unit})" if point.unit else ""
                described = self._describe(point.name) if self._describe is not None else None
                help_text = f"{described or 'Esper metric ' + point.name}{unit}"
                labels = (*label_keys, "source")
                if is_counter:
                    self._register(point.name, Counter, base_name, help_text, labels)
                else:
                    self._register(point.name, Gauge, base_name, help_text, labels)
                family = self._families[base_name]
            self._check_family(family, point.name, label_keys)
            child = family.metric.labels(*(v for _, v in key[2]), source)
            update: _Update
            if isinstance(child, Counter):
                update = _counter_update(point.name, child.inc)
            else:
                update = child.set
            self._updates[key] = update
        return update

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
        try:
            metric = metric_type(base_name, help_text, label_names, registry=self.registry)
        except ValueError as e:
            raise ValueError(
                f"cannot register {dotted_name} as {base_name} in the Prometheus registry: {e}. "
                "Another collector already exposes that name: rename the metric, or use one "
                "PrometheusSink per registry"
            ) from e
        self._families[base_name] = _Family(dotted_name, tuple(label_names[:-1]), metric, reserved=reserved)
        return metric

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
