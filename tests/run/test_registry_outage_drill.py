"""Outage drill: a real PostgreSQL registry goes down for 30 s in the middle of a run.

The run trains on (Tamiyo waits: nothing germinates without a kernel; the seed loaded before the
outage keeps serving), queues its field reports and decisions, and when the database returns it
catches up: every row is there exactly once, and the outage is in the run's telemetry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from esper_core.contracts import SeedOperation, TelemetryEvent
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, publish_kernel
from esper_core.run.commits import epoch_tag
from esper_core.run.outage import RegistryOutageError, open_registry
from esper_core.run.plan import plan_compile_jobs
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza
from tests.helpers.waiting import wait_for
from tests.urza import postgres

OUTAGE_S = 30.0
EPOCHS = 24
STOP_AFTER = 3  # epochs applied before the database goes down (the probe germinates at epoch 1)

pytestmark = pytest.mark.skipif(postgres.unavailable_reason() is not None, reason=postgres.unavailable_reason() or "")


@pytest.fixture
def server() -> Iterator[postgres.LocalServer]:
    with postgres.controllable_server() as server:
        yield server


def _events(path: Path) -> list[tuple[int, dict]]:
    """(line number, event) of every event in a run's telemetry.jsonl."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [(i, e) for i, line in enumerate(lines) if line.endswith("}") for e in json.loads(line)["events"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_survives_a_30_s_registry_outage(server: postgres.LocalServer, tmp_path: Path) -> None:
    settings = EsperSettings(home=tmp_path / "esper", registry_url=server.url, registry_outage_limit_s=300)
    catalog = default_catalog()
    config = get_recipe("digits-mlp")
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        for job in plan_compile_jobs(config, feature_shape=load_dataset(config.data).feature_shape, catalog=catalog):
            publish_kernel(urza, catalog, compile_job(catalog, job, "cpu"))
    finally:
        urza.close()
    session = Run.start(RunSpec(recipe="digits-mlp", epochs=EPOCHS, device="cpu", run_id="drill"), settings=settings)
    outcomes: dict[int, tuple[str, str]] = {}
    failure: list[BaseException] = []

    def train() -> None:
        try:
            for epoch in range(EPOCHS):
                session.train_epoch()
                session.commit(epoch_tag(epoch, "trained"))
                command = session.decide()
                outcomes[epoch] = (command.action, session.apply(command))
                session.commit(epoch_tag(epoch, "applied"))
        except BaseException as e:  # handed to the test thread
            failure.append(e)

    trainer = threading.Thread(target=train, name="drill-run")
    trainer.start()
    telemetry = settings.runs_dir / "drill" / "telemetry.jsonl"
    try:
        wait_for(
            lambda: len(outcomes) >= STOP_AFTER or failure,
            what=f"{STOP_AFTER} epochs before the outage",
            timeout_s=120.0,
        )
        server.stop()
        stopped = time.monotonic()
        wait_for(
            lambda: any(e["name"] == "urza.outage.started" for _, e in _events(telemetry)) or failure,
            what="the run to notice the outage",
            timeout_s=120.0,
        )
        noticed = time.monotonic()
        # The drill's outage lasts OUTAGE_S; meanwhile the run trains its remaining epochs.
        wait_for(
            lambda: (time.monotonic() - stopped >= OUTAGE_S and len(outcomes) == EPOCHS) or failure,
            what="the outage to last its time",
            timeout_s=OUTAGE_S + 120,
        )
        assert session.committed_tag != epoch_tag(EPOCHS - 1, "applied"), "the last commit must wait for the DB"
        server.start()
    finally:
        trainer.join(timeout=180)
    assert not trainer.is_alive() and not failure, failure
    assert session.committed_tag == epoch_tag(EPOCHS - 1, "applied")

    events = _events(telemetry)
    [(start_line, started)] = [(i, e) for i, e in events if e["name"] == "urza.outage.started"]
    [(end_line, ended)] = [(i, e) for i, e in events if e["name"] == "urza.outage.ended"]
    # The run's outage began at its first failed call, between the stop and the test noticing it.
    assert started["level"] == "warning" and ended["attributes"]["outage_s"] >= OUTAGE_S - (noticed - stopped)
    # Training went on during the outage: epochs were committed between the two events.
    lines = telemetry.read_text().splitlines()
    trained = {json.loads(line)["epoch"] for line in lines[start_line:end_line] if '"source":"tolaria"' in line}
    assert len(trained) >= 5, trained
    # No germination without the registry; the seed germinated before the outage kept serving.
    during = [outcomes[epoch] for epoch in sorted(trained) if epoch in outcomes]
    assert not [o for o in during if o[0].startswith(SeedOperation.GERMINATE.value) and o[1] == "applied"], during
    assert [a for a, o in outcomes.values() if a.startswith("germinate") and o == "applied"], outcomes
    last = session.history[-1]
    assert any(s.blueprint_id is not None and s.stage.is_active for s in last.seeds), last.seeds

    # Caught up: every decision and report of the run is in the database exactly once.
    engine = create_engine(server.url)
    try:
        with engine.connect() as conn:
            decisions = conn.execute(text("SELECT epoch FROM simic_decisions WHERE run_id = 'drill'")).scalars().all()
            reports = conn.execute(text("SELECT report_id FROM simic_field_reports")).scalars().all()
    finally:
        engine.dispose()
    assert sorted(decisions) == list(range(EPOCHS))
    assert sorted(reports) == sorted(r.report_id for r in session.reports) and session.reports
    session.close()


@pytest.mark.timeout(120)
def test_a_run_opened_during_an_outage_waits_for_the_registry(server: postgres.LocalServer, tmp_path: Path) -> None:
    settings = EsperSettings(home=tmp_path / "esper", registry_url=server.url, registry_outage_limit_s=60)
    open_registry(settings).close()
    server.stop()
    events: list[TelemetryEvent] = []
    starting: list[threading.Thread] = []

    def emit(event: TelemetryEvent) -> None:
        events.append(event)
        if event.name == "urza.outage.started":  # the worker is waiting: bring the database back
            starting.append(threading.Thread(target=server.start))
            starting[0].start()

    urza = open_registry(settings, emit=emit)
    urza.close()
    starting[0].join()
    assert [e.name for e in events] == ["urza.outage.started", "urza.outage.ended"]


@pytest.mark.timeout(120)
def test_an_outage_past_the_limit_fails_naming_the_setting(server: postgres.LocalServer, tmp_path: Path) -> None:
    settings = EsperSettings(home=tmp_path / "esper", registry_url=server.url, registry_outage_limit_s=1)
    open_registry(settings).close()
    server.stop()
    with pytest.raises(RegistryOutageError, match="longer than the run's limit of 1 s .ESPER_REGISTRY_OUTAGE_LIMIT_S"):
        open_registry(settings)


@pytest.mark.timeout(120)
def test_records_queued_by_a_process_that_died_mid_outage_are_written_by_the_next(
    server: postgres.LocalServer, tmp_path: Path
) -> None:
    from esper_core.run.outage import PendingRecords, RegistryLink
    from esper_core.simic.records import SimicStore
    from tests.simic.test_records import _command, _decision, _report

    settings = EsperSettings(home=tmp_path / "esper", registry_url=server.url)
    urza = open_registry(settings)
    store = SimicStore.for_urza(urza)
    assert store is not None
    queue_file = tmp_path / "run" / "unrecorded.json"
    command = _command()
    report, decision = _report(command), _decision(command)
    server.stop()
    queue = PendingRecords(store, RegistryLink(limit_s=60, emit=lambda e: None), queue_file)
    queue.add([report], [decision])
    assert not queue.flush(wait=False) and queue_file.exists()
    # That process dies here; the database returns and the next process opens the run.
    server.start()
    resumed = PendingRecords(store, RegistryLink(limit_s=60, emit=lambda e: None), queue_file)
    assert len(resumed) == 2 and resumed.flush(wait=True) and not queue_file.exists()
    assert store.field_reports() == [report] and store.decisions() == [decision]
    urza.close()
