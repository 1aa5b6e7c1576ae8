"""The catalogue of every telemetry name Esper emits: metrics (gauges, counters) and events.

One entry per dotted name, with its kind, unit, label keys and help text. The Prometheus
exposition takes its help text from here, the alert rules and the Grafana dashboard under
``infra/`` may only name series listed here (a test checks both), and a test checks that every
name a real run writes to ``telemetry.jsonl`` is listed. Adding a metric or event therefore
means adding one line below.

Kinds follow ``PrometheusSink``: a name ending in ``_total`` is a counter incremented by each
value, any other metric a gauge set to the latest value (a ``*_ms`` gauge is also observed into
a histogram in seconds), and an event is counted in ``esper_events_total{name, level, source,
workload}``. Entries marked ``alerting`` exist at 0 from the sink's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from esper_core.contracts import GateId
from esper_core.telemetry.names import COUNTER_SUFFIX, check_label_key, check_name, histogram_name, prometheus_name


class Kind(StrEnum):
    """How a name is exported."""

    GAUGE = "gauge"
    COUNTER = "counter"
    EVENT = "event"


@dataclass(frozen=True, kw_only=True, slots=True)
class TelemetryName:
    """One metric or event name."""

    name: str
    """Dotted ``subsystem.area.name``."""
    kind: Kind
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    """Label keys of a metric (``source`` and ``workload`` are added by the exporter); attribute keys
    are free for events."""
    alerting: bool = False
    """An alert rule counts this event or counter with ``increase``: the Prometheus sink creates
    its series at 0 for every source (and event level) before the first packet, so the first
    occurrence is an increase and not the series' first sample."""

    def __post_init__(self) -> None:
        check_name(self.name, kind=self.kind.value)
        for key in self.labels:
            check_label_key(key, metric=self.name)
        is_counter_name = self.name.endswith(COUNTER_SUFFIX)
        if self.kind is not Kind.EVENT and is_counter_name != (self.kind is Kind.COUNTER):
            raise ValueError(
                f"{self.name}: a metric is a counter exactly when its name ends in '_total' "
                f"(PrometheusSink decides by the suffix); fix the kind ({self.kind}) or the name"
            )
        if self.alerting and (self.kind is Kind.GAUGE or self.labels):
            raise ValueError(
                f"{self.name}: only events and counters without labels can be alerting: their zero "
                "series are created in advance, which needs every label value known; drop "
                "alerting=True or the labels"
            )

    @property
    def subsystem(self) -> str:
        """The first part of the name (``tolaria``, ``kasmina``, ...)."""
        return self.name.split(".", 1)[0]

    @property
    def prometheus(self) -> str:
        """The exposed series: ``esper_<name>`` for metrics, ``esper_events_total`` for events."""
        return EVENTS_SERIES if self.kind is Kind.EVENT else prometheus_name(self.name)

    @property
    def histogram(self) -> str | None:
        """The seconds histogram a ``*_ms`` gauge is also observed into (``None`` for others)."""
        return histogram_name(self.name) if self.kind is Kind.GAUGE else None


EVENTS_SERIES = "esper_events_total"
SINK_SERIES: dict[str, str] = {
    EVENTS_SERIES: "Telemetry events by name, level and source",
    "esper_health_status": "Health of the latest packet per source: 0 healthy .. 3 critical",
    "esper_telemetry_packets_total": "Telemetry packets received per source",
    "esper_telemetry_last_packet_timestamp_seconds": "Unix time of the latest packet per source",
}
"""Series the Prometheus sink adds itself, whatever the packets contain."""

SOURCES = ("tolaria", "tamiyo", "kasmina", "tezzeret", "urza")
"""Values of the ``source`` label (the subsystem that emitted the packet)."""

_G, _C, _E = Kind.GAUGE, Kind.COUNTER, Kind.EVENT
_SLOT = ("slot",)


def _n(
    name: str, kind: Kind, help: str, unit: str = "", labels: tuple[str, ...] = (), *, alerting: bool = False
) -> TelemetryName:
    return TelemetryName(name=name, kind=kind, help=help, unit=unit, labels=labels, alerting=alerting)


_ENTRIES: tuple[TelemetryName, ...] = (
    # ------------------------------------------------------------------ Tolaria (trainer)
    _n(
        "tolaria.training.latency_ms",
        _G,
        "Training part of the last epoch (steps, attribution, metrics); budget 18 ms",
        "ms",
    ),
    _n("tolaria.validation.latency_ms", _G, "Validation of the last epoch", "ms"),
    _n("tolaria.epoch.latency_ms", _G, "Whole last epoch: training, validation and gates", "ms"),
    _n("tolaria.training.loss", _G, "Mean training loss of the last epoch"),
    _n("tolaria.validation.loss", _G, "Validation loss after the last epoch"),
    _n("tolaria.validation.accuracy", _G, "Validation accuracy after the last epoch"),
    _n("tolaria.epochs_total", _C, "Epochs trained"),
    _n("tolaria.train.compile_enabled", _G, "1 when the training step runs compiled, 0 eager"),
    _n("tolaria.train.amp_enabled", _G, "1 when the step runs under autocast (AMP), 0 full precision"),
    _n("tolaria.train.graph_enabled", _G, "1 when steady-state steps replay a CUDA graph"),
    _n("tolaria.compile_warmup_remaining", _G, "Warm-up steps left before the step engine chooses its path"),
    _n("tolaria.compile.warmup_ms", _G, "Time spent warming up (and timing) the compiled step", "ms"),
    _n("tolaria.compile.epochs_total", _C, "Epochs trained on the compiled step"),
    _n("tolaria.graph.capture_ms", _G, "CUDA graph capture time", "ms"),
    _n("tolaria.graph.replay_ms", _G, "CUDA graph replay time per step", "ms"),
    _n("tolaria.graph.stage_copy_ms", _G, "Copy of a batch into the graph's static buffers", "ms"),
    _n("tolaria.graph.replays_total", _C, "CUDA graph replays"),
    _n(
        "tolaria.graph.captures_total",
        _C,
        "CUDA graph captures (the first, then one per change of the model's structure)",
    ),
    _n("tolaria.data.h2d_copy_ms", _G, "Host-to-device batch copies of the last epoch (GPU prefetch stream)", "ms"),
    _n(
        "tolaria.compile.traces",
        _G,
        "Graphs the compiled step traced in the last epoch (first compile, then growth events only)",
    ),
    _n("tolaria.parallel.processes", _G, "Data-parallel processes training the run (1: one process)"),
    _n(
        "tolaria.parallel.exchange_ms",
        _G,
        "Time the last epoch's training spent summing gradients over the processes (0 in one process)",
        "ms",
    ),
    _n("tolaria.grad_agg.conflict_ratio", _G, "Share of seed gradient pairs in conflict (PCGrad)"),
    _n("tolaria.grad_agg.teacher_share", _G, "Share of the aggregated gradient from the host (teacher)"),
    _n("tolaria.grad_agg.steps", _G, "Steps of the last epoch that aggregated seed gradients"),
    _n("tolaria.timeout.tamiyo_total", _C, "Tamiyo calls that missed their deadline", alerting=True),
    _n("tolaria.timeout.kasmina_total", _C, "Kasmina calls that missed their deadline", alerting=True),
    _n(
        "kasmina.growth.blocked_total",
        _C,
        "Growth commands rejected because the registry could not give a kernel (refused, corrupt, missing, down)",
        alerting=True,
    ),
    _n("tolaria.deadline.tamiyo_overrun_total", _C, "Tamiyo decisions past their deadline, observed only"),
    _n("tolaria.deadline.kasmina_overrun_total", _C, "Kasmina commands past their deadline, observed only"),
    _n("tolaria.rollback.restore_latency_ms", _G, "Time to restore the last good state", "ms"),
    _n("tolaria.rollback.deadline_exceeded_total", _C, "Rollbacks that missed their deadline", alerting=True),
    _n("tolaria.rollback.failures_total", _C, "Rollbacks that failed", alerting=True),
    _n("tolaria.emergency.level", _G, "Emergency level: 0 normal .. halt"),
    _n("tolaria.compile_enabled", _E, "The training step was compiled and chosen"),
    _n("tolaria.compile_disabled", _E, "The step engine chose eager (compiled was slower or unavailable)"),
    _n("tolaria.compile_fallback", _E, "Compilation failed hard; the step fell back to eager", alerting=True),
    _n("tolaria.graph_enabled", _E, "CUDA graph capture succeeded"),
    _n(
        "tolaria.graph_fallback",
        _E,
        "CUDA graph capture or replay fell back (the reason is in the message)",
        alerting=True,
    ),
    _n("tolaria.staging.fallback", _E, "GPU prefetch staging is off (no CUDA); batches copy on the step's stream"),
    _n("tolaria.timeout", _E, "A Tamiyo or Kasmina call missed its deadline (attribute 'part')"),
    _n("tolaria.deadline.overrun", _E, "A Tamiyo or Kasmina call overran its deadline, observed only ('part')"),
    _n("tolaria.epoch.failed", _E, "An epoch failed (non-finite loss or weights); the emergency level rose"),
    _n(
        "tolaria.checkpoint.damaged",
        _E,
        "A checkpoint failed its digest: set aside, the run went back to an older commit ('damaged', 'kept')",
        alerting=True,
    ),
    _n("tolaria.rollback", _E, "A rollback restored the last good state (attributes: tier, latency_ms)"),
    _n("tolaria.remediation", _E, "After a rollback: what was changed before retrying (cull, halve the lr)"),
    _n("tolaria.emergency.halt", _E, "Training halted after repeated failed epochs"),
    # ------------------------------------------------------------------ Kasmina (seed manager)
    _n("kasmina.seeds.active", _G, "Seeds past DORMANT and not culled"),
    _n("kasmina.seed.alpha", _G, "Blend weight of the seed in a slot", labels=_SLOT),
    _n("kasmina.seed.grad_norm", _G, "Gradient norm of the seed in a slot", labels=_SLOT),
    _n("kasmina.kernel.load_ms", _G, "Fetch from Urza and load of a seed's kernel", "ms", _SLOT),
    _n("kasmina.kernel.first_use_ms", _G, "First call of a loaded kernel (warm-up, never compilation)", "ms", _SLOT),
    _n("kasmina.seed.stage", _E, "A seed moved to another lifecycle stage"),
    _n("kasmina.seed.init", _E, "How a germinated seed was initialised (gradmax, or why its default was kept)"),
    *(_n(f"kasmina.gate.{gate.value}", _E, f"Verdict of gate {gate.value.upper()}") for gate in GateId),
    _n("kasmina.isolation.violation", _E, "The host received gradient from a seed before BLENDING (a G3 failure)"),
    _n("kasmina.kernel.fallback", _E, "A seed runs an eager fallback kernel (its compile failed)", alerting=True),
    _n("kasmina.command.rejected", _E, "A command could not be applied (the reason is in the message)"),
    # ------------------------------------------------------------------ Tamiyo (controller)
    _n("tamiyo.gnn.inference.latency_ms", _G, "Policy forward for one decision", "ms"),
    _n("tamiyo.decision.latency_ms", _G, "Whole decision: graph build, policy, risk engine", "ms"),
    _n("tamiyo.graph.coverage", _G, "Share of the state's features present in the graph"),
    _n("tamiyo.gnn.compile_enabled", _G, "1 when the policy runs compiled, 0 eager"),
    _n("tamiyo.gnn.compile_fallback_total", _C, "Policy compiles that fell back to eager", alerting=True),
    _n("tamiyo.command", _E, "The command Tamiyo issued, with its reason"),
    _n("tamiyo.error", _E, "A Tamiyo call raised; Tolaria went on with a conservative WAIT"),
    _n(
        "tamiyo.policy.fallback",
        _E,
        "The heuristic decided because the shipped policy could not serve (the run is degraded)",
        alerting=True,
    ),
    # ------------------------------------------------------------------ Tezzeret (compiler)
    _n("tezzeret.compile.duration_ms", _G, "Compile time of the last kernel of a blueprint", "ms", ("blueprint",)),
    _n("tezzeret.compile.fallback", _E, "A compile failed and an eager fallback artifact was stored", alerting=True),
    # ------------------------------------------------------------------ Urza (registry)
    _n(
        "urza.publish.duration_ms",
        _G,
        "Publish of the last artifact of a blueprint (blob and row)",
        "ms",
        ("blueprint",),
    ),
    _n("urza.artifacts.published_total", _C, "Artifacts published, by status", labels=("status",)),
    _n("urza.lookup.latency_ms", _G, "Registry lookup of an active artifact", "ms"),
    _n(
        "urza.signature.refused",
        _E,
        "An unsigned or mis-signed artifact was refused before loading (the message names the fix)",
        alerting=True,
    ),
    _n(
        "urza.outage.started",
        _E,
        "A run found the registry database unreachable; it trains on (WAIT, records queued)",
        alerting=True,
    ),
    _n(
        "urza.outage.ended",
        _E,
        "The registry database is reachable again; queued records are written",
        alerting=True,
    ),
    _n(
        "urza.outage.exceeded",
        _E,
        "A registry outage outlasted ESPER_REGISTRY_OUTAGE_LIMIT_S and failed the run",
        alerting=True,
    ),
)

CATALOG: dict[str, TelemetryName] = {}
for _entry in _ENTRIES:
    if _entry.name in CATALOG:
        raise ValueError(f"telemetry name {_entry.name} is catalogued twice")
    CATALOG[_entry.name] = _entry


def lookup(name: str) -> TelemetryName:
    """The catalogue entry of ``name``.

    Raises:
        ValueError: If ``name`` is not catalogued (add it to ``esper_core/telemetry/catalog.py``).
    """
    entry = CATALOG.get(name)
    if entry is None:
        raise ValueError(
            f"telemetry name {name!r} is not in the catalogue; add it to esper_core/telemetry/catalog.py "
            "with its kind and help text"
        )
    return entry


def help_text(name: str) -> str | None:
    """Help text of a catalogued metric, ``None`` for an unknown name."""
    entry = CATALOG.get(name)
    return None if entry is None else entry.help


def exposed_series() -> dict[str, str]:
    """Every Prometheus series Esper exposes: name -> help text (metrics and the sink's own).

    A ``*_ms`` gauge adds its seconds histogram's ``_bucket``, ``_sum`` and ``_count`` series.
    """
    series = dict(SINK_SERIES)
    for entry in CATALOG.values():
        if entry.kind is not Kind.EVENT:
            series[entry.prometheus] = entry.help
        if entry.histogram is not None:
            for suffix in ("_bucket", "_sum", "_count"):
                series[entry.histogram + suffix] = f"{entry.help} (histogram, seconds)"
    return series


def alerting() -> tuple[TelemetryName, ...]:
    """Catalogued events and counters that alert rules watch (their zero series are pre-created)."""
    return tuple(e for e in CATALOG.values() if e.alerting)


def event_names() -> frozenset[str]:
    """Dotted names of every catalogued event (the ``name`` label of ``esper_events_total``)."""
    return frozenset(e.name for e in CATALOG.values() if e.kind is Kind.EVENT)
