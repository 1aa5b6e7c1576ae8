"""The compile_catalog flow: approvals, lineage to the flow run, the registry as compile cache,
no retries for bad input, retries for transient failures. Real flows under the session harness."""

from __future__ import annotations

import pytest

from esper_core.contracts import ArtifactStatus
from esper_core.karn.policy import ApprovalRequiredError
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_approved_kernels_are_tagged_traced_to_the_run_and_not_rebuilt(esper_home: EsperSettings) -> None:
    from flows.compile_catalog import compile_catalog

    first = compile_catalog(
        recipe="seed-reference", blueprints=["lowrank_adapter", "glu_block"], device="cpu", approve=["glu_block"]
    )
    assert [(a.blueprint_id, a.status) for a in first] == [
        ("lowrank_adapter", ArtifactStatus.ACTIVE),
        ("glu_block", ArtifactStatus.ACTIVE),
    ]
    again = compile_catalog(
        recipe="seed-reference", blueprints=["lowrank_adapter", "glu_block"], device="cpu", approve=["glu_block"]
    )
    assert again == first
    urza = Urza.open(esper_home.home)
    try:
        assert len(urza.store.list_artifacts()) == 2, "the re-run compiled and published nothing new"
        glu = urza.store.record(first[1].artifact_id or 0)
        assert glu.tags == ("approved",)
        run = glu.compile_run
        assert run is not None and run.state == "finished" and run.compiler == "torch.export"
        assert run.detail["recipe"] == "seed-reference" and run.detail["published"] == 2
        lowrank_run = urza.store.record(first[0].artifact_id or 0).compile_run
        assert lowrank_run is not None and lowrank_run.run_id == run.run_id
    finally:
        urza.close()


def test_an_unapproved_experimental_blueprint_fails_at_once(esper_home: EsperSettings) -> None:
    from flows.compile_catalog import compile_catalog

    with pytest.raises(ApprovalRequiredError, match="--approve glu_block"):
        compile_catalog(recipe="seed-reference", blueprints=["glu_block"], device="cpu")
    urza = Urza.open(esper_home.home)
    try:
        assert urza.store.list_artifacts() == []
    finally:
        urza.close()


def test_transient_failures_are_retried(esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from esper_core.urza.errors import RegistryError
    from flows.compile_catalog import compile_catalog
    from tasks import compile as compile_tasks

    original = compile_tasks.publish_staged
    calls: list[str] = []

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append("call")
        if len(calls) == 1:
            raise RegistryError("database is locked (injected)")
        return original(*args, **kwargs)

    monkeypatch.setattr(compile_tasks, "publish_staged", flaky)
    [artifact] = compile_catalog(recipe="seed-reference", blueprints=["lowrank_adapter"], device="cpu")
    assert artifact.status is ArtifactStatus.ACTIVE and len(calls) == 2
