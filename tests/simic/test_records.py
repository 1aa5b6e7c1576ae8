"""SimicStore on a real SQLite registry: idempotent, transactional records; policy versions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, inspect, select

from esper_core.contracts import AdaptationCommand, CommandType, FieldReport, Outcome, SeedOperation
from esper_core.simic.models import DecisionRow, FieldReportRow
from esper_core.simic.records import (
    CounterfactualOutcome,
    DecisionRecord,
    DecisionState,
    SimicStore,
    report_id_for,
)
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from esper_core.urza import schema
from esper_core.urza.blobs import BlobStore
from esper_core.urza.errors import RegistryError
from esper_core.urza.memory import InMemoryRegistry
from esper_core.urza.service import Urza
from esper_core.urza.sql_engine import create_registry_engine

SMALL = TamiyoGNNConfig(hidden_dim=8, num_layers=1)


def _command(epoch: int = 1) -> AdaptationCommand:
    return AdaptationCommand(
        run_id="run-a",
        epoch=epoch,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.GERMINATE,
        slot_id="slot0",
        blueprint_id="bp0",
        issued_by="heuristic",
        reason="probe",
    )


def _report(command: AdaptationCommand, outcome: Outcome = Outcome.SUCCESS) -> FieldReport:
    return FieldReport(
        report_id=report_id_for(command),
        run_id=command.run_id,
        command=command,
        outcome=outcome,
        observation_epochs=2,
        metric_deltas={"val_loss": -0.1, "val_accuracy": 0.02, "params": 576.0},
    )


def _decision(command: AdaptationCommand) -> DecisionRecord:
    history = synthetic_history(num_epochs=command.epoch + 1, num_slots=1)
    return DecisionRecord(
        command=command,
        proposal=command,
        policy="heuristic",
        policy_version=None,
        state=DecisionState(history=tuple(history), candidates=tuple(synthetic_candidates(2)), total_epochs=10),
    )


def _count(store: SimicStore, table: type) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_tables_live_in_the_registry_database(urza: Urza, store: SimicStore) -> None:
    names = set(inspect(store.engine).get_table_names())
    assert {"blueprints", "artifacts", "simic_field_reports", "simic_decisions", "simic_policies"} <= names
    assert SimicStore.for_urza(Urza(InMemoryRegistry(), urza.blobs)) is None  # no SQL, no records


def test_records_round_trip_and_rewriting_them_is_idempotent(store: SimicStore) -> None:
    command = _command()
    report, decision = _report(command), _decision(command)
    store.record(reports=[report], decisions=[decision])
    store.record(reports=[report], decisions=[decision])  # a retried step
    assert _count(store, FieldReportRow) == 1 and _count(store, DecisionRow) == 1
    assert store.field_reports(["run-a"]) == [report]
    (stored,) = store.decisions(["run-a"])
    assert stored.command == command and stored.state == decision.state
    # Re-judged after a rollback: the same report id now holds the committed outcome.
    store.record(reports=[_report(command, Outcome.REGRESSION)])
    assert store.field_reports()[0].outcome is Outcome.REGRESSION and _count(store, FieldReportRow) == 1
    assert store.field_reports(["another-run"]) == []


def test_a_failed_write_stores_nothing(store: SimicStore) -> None:
    good, bad = _command(1), _command(2)

    class Exploding(DecisionRecord):
        @property
        def state(self) -> DecisionState:  # type: ignore[override]
            raise RuntimeError("disk full")

    broken = _decision(bad)
    exploding = object.__new__(Exploding)
    for name in ("command", "proposal", "policy", "policy_version", "log_prob", "value"):
        object.__setattr__(exploding, name, getattr(broken, name))
    with pytest.raises(RuntimeError, match="disk full"):
        store.record(reports=[_report(good)], decisions=[_decision(good), exploding])
    assert _count(store, FieldReportRow) == 0 and _count(store, DecisionRow) == 0


def test_report_ids_are_derived_from_the_command() -> None:
    a, b = _command(), _command()
    assert report_id_for(a) == report_id_for(a) != report_id_for(b)


def test_policy_versions_store_weights_and_provenance(store: SimicStore) -> None:
    torch.manual_seed(0)
    model = TamiyoGNN(SMALL)
    v1 = store.publish_policy(model.state_dict(), gnn=SMALL, method="imitation", provenance={"runs": ["a"]})
    again = store.publish_policy(model.state_dict(), gnn=SMALL, method="imitation", provenance={"runs": ["a"]})
    assert v1.version == again.version == 1 and v1.label == "v1"  # a retried task: same version
    weights = store.load_weights(v1)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    torch.manual_seed(1)
    v2 = store.publish_policy(TamiyoGNN(SMALL).state_dict(), gnn=SMALL, method="ppo", provenance={}, parent_version=1)
    assert (v2.version, v2.parent_version, v2.method, v2.gnn) == (2, 1, "ppo", SMALL)
    assert store.latest_policy() == v2 and [p.version for p in store.policies()] == [1, 2]
    assert v1.provenance["runs"] == ["a"] and v1.feature_dims == FEATURE_DIMS
    assert v1.provenance["graph_features"]["slot"] == list(FEATURE_NAMES["slot"])
    with pytest.raises(ValueError, match=r"stored versions: \[1, 2\]"):
        store.get_policy(9)


def test_open_prepares_a_fresh_database_through_urza(tmp_path: Path) -> None:
    store = SimicStore.open(tmp_path / "home")  # no Urza.open before: the store opens it alike
    try:
        with store.engine.connect() as conn:
            assert schema.read_revision(conn) == schema.head_revision()
        command = _command()
        report = _report(command)
        store.record(reports=[report], decisions=[_decision(command)])
        assert store.field_reports() == [report]
    finally:
        store.close()


def test_a_database_urza_never_opened_is_refused(tmp_path: Path) -> None:
    engine = create_registry_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        with pytest.raises(RegistryError, match=r"schema revision none .* open it with Urza.open"):
            SimicStore(engine, BlobStore(tmp_path / "blobs"), url="sqlite:///registry.db")
    finally:
        engine.dispose()


def test_an_unreachable_database_raises_a_registry_error(tmp_path: Path) -> None:
    engine = create_registry_engine(f"sqlite:///{tmp_path / 'missing-dir' / 'registry.db'}")
    try:
        with pytest.raises(RegistryError, match="could not check the registry's schema revision"):
            SimicStore(engine, BlobStore(tmp_path / "blobs"), url="sqlite:///missing")
    finally:
        engine.dispose()


def test_a_decision_keeps_its_counterfactual_outcome_and_older_ones_have_none(store: SimicStore) -> None:
    outcome = CounterfactualOutcome(
        baseline="wait",
        baseline_action="wait",
        horizon=3,
        val_accuracy=0.75,
        baseline_val_accuracy=0.5,
        val_loss=0.4,
        baseline_val_loss=0.6,
        params=1200,
        baseline_params=1000,
        host_params=1000,
        fork_ms=12.5,
    )
    forked = dataclasses.replace(_decision(_command(epoch=1)), counterfactual=outcome)
    plain = _decision(_command(epoch=2))
    store.record(decisions=[forked, plain])
    assert store.decisions() == [forked, plain]
    assert outcome.reward(param_penalty=0.1) == pytest.approx(0.25 - 0.1 * 0.2)
