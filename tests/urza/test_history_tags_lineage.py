"""Statuses with history, tags, compile runs and lineage: the same suite on every store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, BlueprintTier, KernelArtifact
from esper_core.urza.base import RegistryStore
from esper_core.urza.errors import ArtifactNotFoundError, CompileRunNotFoundError, InvalidStatusTransitionError
from esper_core.urza.records import CompileRun

MakeArtifact = Callable[..., KernelArtifact]


def _run(run_id: str = "run-1") -> CompileRun:
    return CompileRun(
        run_id=run_id,
        compiler="torch.export",
        torch_version="2.13.0",
        device_kind="cpu",
        hostname="test-host",
        detail={"recipe": "digits-mlp"},
    )


def test_publication_starts_the_history(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    stored = registry_store.publish(make_artifact(), actor="tezzeret")
    record = registry_store.record(stored.artifact_id or 0)
    assert record.artifact == stored
    assert [(h.status, h.reason, h.actor) for h in record.history] == [
        (ArtifactStatus.ACTIVE, "published active", "tezzeret")
    ]
    assert record.tags == () and record.compile_run is None


def test_every_status_change_is_recorded_with_reason_and_actor(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    artifact_id = registry_store.publish(make_artifact()).artifact_id or 0
    registry_store.set_status(artifact_id, ArtifactStatus.QUARANTINED, "G4 regression in run r1", actor="cli:ops")
    registry_store.set_status(artifact_id, ArtifactStatus.ACTIVE, "false alarm", actor="cli:ops")
    registry_store.set_status(artifact_id, ArtifactStatus.RETIRED, "superseded by v2")
    history = registry_store.record(artifact_id).history
    assert [(h.status, h.reason) for h in history] == [
        (ArtifactStatus.ACTIVE, "published active"),
        (ArtifactStatus.QUARANTINED, "G4 regression in run r1"),
        (ArtifactStatus.ACTIVE, "false alarm"),
        (ArtifactStatus.RETIRED, "superseded by v2"),
    ]
    assert [h.actor for h in history][1:] == ["cli:ops", "cli:ops", "esper"]
    assert all(h.changed_at.tzinfo is not None for h in history)
    assert history == tuple(sorted(history, key=lambda h: h.changed_at))


def test_retired_is_final_and_no_op_changes_are_refused(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    artifact_id = registry_store.publish(make_artifact()).artifact_id or 0
    with pytest.raises(InvalidStatusTransitionError, match="already active"):
        registry_store.set_status(artifact_id, ArtifactStatus.ACTIVE, "again")
    registry_store.set_status(artifact_id, ArtifactStatus.RETIRED, "done")
    with pytest.raises(InvalidStatusTransitionError, match="retired, which is final"):
        registry_store.set_status(artifact_id, ArtifactStatus.ACTIVE, "undo")
    assert len(registry_store.record(artifact_id).history) == 2


def test_high_risk_artifacts_are_quarantine_only(
    registry_store: RegistryStore, make_artifact: MakeArtifact, descriptor: BlueprintDescriptor
) -> None:
    risky = descriptor.model_copy(update={"blueprint_id": "wide_mlp", "tier": BlueprintTier.HIGH_RISK, "risk": 0.8})
    registry_store.register_blueprint(risky)
    with pytest.raises(InvalidStatusTransitionError, match="quarantine-only"):
        registry_store.publish(make_artifact(blueprint_id="wide_mlp"))
    assert registry_store.list_artifacts(blueprint_id="wide_mlp") == []
    stored = registry_store.publish(
        make_artifact(blueprint_id="wide_mlp", status=ArtifactStatus.QUARANTINED, status_reason="high_risk tier")
    )
    assert registry_store.record(stored.artifact_id or 0).history[0].reason == "high_risk tier"
    with pytest.raises(InvalidStatusTransitionError, match="quarantine-only"):
        registry_store.set_status(stored.artifact_id or 0, ArtifactStatus.ACTIVE, "let it out")
    assert registry_store.get(stored.artifact_id or 0).status is ArtifactStatus.QUARANTINED


def test_cannot_publish_retired(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    with pytest.raises(InvalidStatusTransitionError, match="cannot be published retired"):
        registry_store.publish(make_artifact(status=ArtifactStatus.RETIRED))


def test_tags_are_validated_deduplicated_and_filterable(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    a = registry_store.publish(make_artifact("a"), tags=["approved", "approved"])
    b = registry_store.publish(make_artifact("b"))
    assert registry_store.add_tags(b.artifact_id or 0, ["baseline:2026-05", "approved"]) == (
        "approved",
        "baseline:2026-05",
    )
    assert registry_store.add_tags(b.artifact_id or 0, ["approved"]) == ("approved", "baseline:2026-05")
    # Re-publishing the same blob adds tags to the existing row.
    registry_store.publish(make_artifact("a"), tags=["golden"])
    assert registry_store.record(a.artifact_id or 0).tags == ("approved", "golden")
    assert [x.sha256 for x in registry_store.list_artifacts(tag="approved")] == [a.sha256, b.sha256]
    assert [x.sha256 for x in registry_store.list_artifacts(tag="golden")] == [a.sha256]
    with pytest.raises(ValueError, match="invalid tag"):
        registry_store.add_tags(a.artifact_id or 0, ["Has Spaces"])
    with pytest.raises(ValueError, match="invalid tag"):
        registry_store.publish(make_artifact("c"), tags=[""])
    with pytest.raises(ArtifactNotFoundError, match="999"):
        registry_store.add_tags(999, ["x"])


def test_lineage_names_the_compile_run(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    started = registry_store.start_compile_run(_run())
    assert started.state == "running" and started.started_at is not None
    assert registry_store.start_compile_run(_run()) == started  # a retried start is harmless
    stored = registry_store.publish(make_artifact(), compile_run_id="run-1")
    registry_store.start_compile_run(_run("run-2"))
    # The same blob again from a later run keeps its original lineage.
    registry_store.publish(make_artifact(), compile_run_id="run-2")
    finished = registry_store.finish_compile_run("run-1", state="finished", detail={"compiled": 1})
    assert finished.state == "finished" and finished.finished_at is not None
    assert finished.detail == {"recipe": "digits-mlp", "compiled": 1}
    run = registry_store.record(stored.artifact_id or 0).compile_run
    assert run is not None and run.run_id == "run-1" and run.state == "finished"
    assert run.to_dict()["detail"] == {"recipe": "digits-mlp", "compiled": 1}


def test_unknown_compile_runs_are_refused(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    with pytest.raises(CompileRunNotFoundError, match="no compile run 'nope'"):
        registry_store.publish(make_artifact(), compile_run_id="nope")
    assert registry_store.list_artifacts() == []
    with pytest.raises(CompileRunNotFoundError):
        registry_store.finish_compile_run("nope", state="failed", detail={})
    registry_store.start_compile_run(_run())
    with pytest.raises(ValueError, match="'finished' or 'failed'"):
        registry_store.finish_compile_run("run-1", state="running", detail={})


def test_find_by_status_and_compiled_only(
    registry_store: RegistryStore, make_artifact: MakeArtifact, env: object
) -> None:
    compiled = registry_store.publish(make_artifact("c"))
    registry_store.set_status(compiled.artifact_id or 0, ArtifactStatus.QUARANTINED, "latency budget")
    eager = make_artifact("e", kind="eager", fallback=True, fallback_reason="UserError: no export")
    fallback = registry_store.publish(eager)
    key = ("residual_mlp", "f16-b64", env)
    both = (ArtifactStatus.ACTIVE, ArtifactStatus.QUARANTINED)
    assert registry_store.find(*key, statuses=both) == fallback
    assert registry_store.find(*key, statuses=both, compiled_only=True) == registry_store.get(compiled.artifact_id or 0)
    assert registry_store.find(*key, compiled_only=True) is None
    assert registry_store.find(*key, {"expansion": 3.0}, statuses=both) is None


def test_referenced_sha256s(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    a = registry_store.publish(make_artifact("a"))
    b = registry_store.publish(make_artifact("b"))
    registry_store.set_status(b.artifact_id or 0, ArtifactStatus.RETIRED, "old")
    assert registry_store.referenced_sha256s() == {a.sha256, b.sha256}


def test_record_of_unknown_artifact(registry_store: RegistryStore) -> None:
    with pytest.raises(ArtifactNotFoundError, match="esper registry list"):
        registry_store.record(42)
