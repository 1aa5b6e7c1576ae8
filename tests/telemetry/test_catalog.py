"""The telemetry catalogue: consistent entries, help in the exposition, and every name a real run emits."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from esper_core.contracts import AdaptationCommand, CommandType, MetricPoint, SeedOperation, TelemetryPacket
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.run.plan import plan_compile_jobs
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.telemetry import PrometheusSink, exposition, read_jsonl
from esper_core.telemetry.catalog import CATALOG, Kind, TelemetryName, exposed_series, help_text, lookup


def test_entries_follow_the_exporters_rules() -> None:
    for entry in CATALOG.values():
        assert entry.help and entry.subsystem in {"tolaria", "kasmina", "tamiyo", "tezzeret", "urza"}
        if entry.kind is not Kind.EVENT:
            assert entry.prometheus.startswith("esper_") and entry.prometheus in exposed_series()
    with pytest.raises(ValueError, match="counter exactly when"):
        TelemetryName(name="tolaria.epochs_total", kind=Kind.GAUGE, help="x")
    with pytest.raises(ValueError, match="not in the catalogue"):
        lookup("tolaria.nope")
    with pytest.raises(ValueError, match="only events and counters without labels can be alerting"):
        TelemetryName(name="tolaria.training.loss", kind=Kind.GAUGE, help="x", alerting=True)
    assert all(entry.kind is not Kind.GAUGE and not entry.labels for entry in CATALOG.values() if entry.alerting)


def test_exposition_carries_the_catalogue_help() -> None:
    sink = PrometheusSink(CollectorRegistry(), describe=help_text)
    sink.emit(TelemetryPacket(source="tolaria", metrics=(MetricPoint(name="tolaria.training.latency_ms", value=3.0),)))
    text = exposition(sink.registry)
    assert f"# HELP esper_tolaria_training_latency_ms {help_text('tolaria.training.latency_ms')}" in text


def _assert_catalogued(packets: list[TelemetryPacket]) -> set[str]:
    seen = set()
    for packet in packets:
        for point in packet.metrics:
            entry = lookup(point.name)
            assert entry.kind is not Kind.EVENT, f"{point.name} is emitted as a metric but catalogued as an event"
            assert set(point.labels) == set(entry.labels), f"{point.name}: labels {sorted(point.labels)}"
            seen.add(point.name)
        for event in packet.events:
            assert lookup(event.name).kind is Kind.EVENT, f"{event.name} is emitted as an event"
            seen.add(event.name)
    return seen


@pytest.mark.slow
def test_every_name_a_real_run_emits_is_catalogued(compiled_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe="seed-reference", epochs=5, device="cpu", seed=0), settings=compiled_home)
    for epoch in range(5):
        session.train_epoch()
        session.commit(f"epoch-{epoch:04d}-trained")
        command = session.decide()
        if epoch == 1:
            # Grow whatever Tamiyo decides, so seed, gate and kernel names are part of the run.
            slot = next(iter(session.manager.slots))
            command = AdaptationCommand(
                run_id=session.run_id,
                epoch=epoch,
                command_type=CommandType.SEED,
                seed_operation=SeedOperation.GERMINATE,
                slot_id=slot,
                blueprint_id="lowrank_adapter",
                blend_epochs=1,
                issued_by="test",
                reason="exercise the seed lifecycle's telemetry",
            )
        session.apply(command)
        session.commit(f"epoch-{epoch:04d}-applied")
    session.close()
    packets = read_jsonl(compiled_home.runs_dir / session.run_id / "telemetry.jsonl")
    seen = _assert_catalogued(packets)
    # The run did grow: seed, gate and command names were part of what was checked.
    assert {"tolaria.training.latency_ms", "tamiyo.command", "kasmina.seed.stage"} <= seen, sorted(seen)

    # Through the Prometheus sink the run's series carry its recipe, and every exposed series
    # is one the catalogue (and so the rules and the dashboard) knows.
    sink = PrometheusSink(CollectorRegistry(), describe=help_text)
    sink.label_run(session.run_id, workload="seed-reference")
    for packet in packets:
        sink.emit(packet)
    exposed = {
        sample.name
        for family in sink.registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")  # prometheus-client's creation times
    }
    assert exposed <= set(exposed_series()), sorted(exposed - set(exposed_series()))
    epochs = sink.registry.get_sample_value(
        "esper_tolaria_training_latency_seconds_count", {"source": "tolaria", "workload": "seed-reference"}
    )
    assert epochs == 5.0


@pytest.mark.slow
def test_compile_telemetry_is_catalogued(esper_home: EsperSettings) -> None:
    from tasks.compile import compile_blueprint

    config = get_recipe("seed-reference")
    data = load_dataset(config.data)
    job = plan_compile_jobs(config, feature_shape=data.feature_shape, catalog=default_catalog())[0]
    compile_blueprint.fn(job, "cpu")
    seen = _assert_catalogued(read_jsonl(esper_home.home / "telemetry.jsonl"))
    assert "tezzeret.compile.duration_ms" in seen
