"""The morphogenesis flow's planning: its readiness check asks for exactly the session's kernels,
and the session is built on the plan the flow's first task made."""

from __future__ import annotations

import pytest

from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, publish_kernel
from esper_core.run.spec import plan_spec, resolve
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza
from tasks._runtime import forget, session_for
from tasks.train import kernels_ready, start_run

APPROVING = "tests.helpers.recipes:seed_reference_approving"


@pytest.mark.slow
def test_kernels_ready_checks_the_approved_blueprints_the_session_germinates(compiled_home: EsperSettings) -> None:
    # The registry holds seed-reference's lowrank_adapter kernel, not the approved norm_gate one.
    # The readiness check once planned without the recipe's approvals: it never asked for it.
    planned = plan_spec(APPROVING, device="cpu")
    spec = planned.spec
    assert planned.plan.jobs == resolve(spec).plan.jobs == spec.jobs
    assert not kernels_ready.fn(spec)
    [missing] = [job for job in spec.jobs if job.blueprint_id == "norm_gate"]
    assert missing.approved
    urza = Urza.open(compiled_home.home, compiled_home.registry_db_url)
    try:
        publish_kernel(urza, default_catalog(), compile_job(default_catalog(), missing, "cpu"))
    finally:
        urza.close()
    assert kernels_ready.fn(spec)


@pytest.mark.slow
def test_start_run_builds_the_session_on_the_plan_it_is_given(compiled_home: EsperSettings) -> None:
    planned = plan_spec("seed-reference", epochs=2, device="cpu", run_id="handed")
    start = start_run.fn(planned)  # a new run: it logs nothing, so no run logger is needed
    session = session_for(start.handle)
    try:
        assert (start.next_epoch, start.epochs) == (0, 2)
        assert session.plan is planned.plan and session.config is planned.config
    finally:
        forget(start.handle)
