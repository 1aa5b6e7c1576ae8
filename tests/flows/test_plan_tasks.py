"""The morphogenesis flow's planning: its readiness check asks for exactly the session's kernels."""

from __future__ import annotations

import pytest

import esper_core.run.spec as spec_module
from esper_core.karn.catalog import default_catalog
from esper_core.pipeline import compile_job, publish_kernel
from esper_core.run.spec import plan_spec, resolve, take_plan
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza
from tasks.train import kernels_ready

APPROVING = "tests.helpers.recipes:seed_reference_approving"


@pytest.fixture(autouse=True)
def own_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "_plans", {})


@pytest.mark.slow
def test_kernels_ready_checks_the_approved_blueprints_the_session_germinates(compiled_home: EsperSettings) -> None:
    # The registry holds seed-reference's lowrank_adapter kernel, not the approved norm_gate one.
    # The readiness check once planned without the recipe's approvals: it never asked for it.
    spec = plan_spec(APPROVING, device="cpu")
    session_jobs = take_plan(spec).plan.jobs  # type: ignore[union-attr]
    assert session_jobs == resolve(spec).plan.jobs == spec.jobs
    assert not kernels_ready.fn(spec)
    [missing] = [job for job in spec.jobs if job.blueprint_id == "norm_gate"]
    assert missing.approved
    urza = Urza.open(compiled_home.home, compiled_home.registry_db_url)
    try:
        publish_kernel(urza, default_catalog(), compile_job(default_catalog(), missing, "cpu"))
    finally:
        urza.close()
    assert kernels_ready.fn(spec)
