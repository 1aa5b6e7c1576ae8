"""Planning tasks: a run's plan (once, first) and the kernels a recipe needs."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.pipeline import CompileJob
from esper_core.run.preflight import preflight
from esper_core.run.spec import PlannedRun, compile_jobs, plan_spec
from tasks._runtime import settings


# NO_CACHE: the planned run holds the resolved configuration and data, which cannot be persisted;
# without a cache (and with results not persisted, the default) Prefect hands the value itself to
# the tasks that take it in this flow run, and a flow run executed again plans again.
# No retries: a recipe refused once is refused again. No tags (see tasks.compile).
@task(name="plan-run", cache_policy=NO_CACHE)
def plan_run_spec(
    recipe: str,
    epochs: int | None,
    device: str,
    seed: int | None,
    run_id: str | None,
    nproc: int,
    policy: str | None = None,
    max_params: int | None = None,
    max_flops: int | None = None,
    grow_until: float | None = None,
) -> PlannedRun:
    """Resolve and plan the run once: what every later task of the morphogenesis flow receives
    (its ``spec``, or the whole planned run where the session is built).

    Raises:
        ValueError, ApprovalRequiredError: a bad recipe or override, or a run ``nproc`` processes
            cannot share (``esper_core.run.spec.plan_spec``), before any work starts.
        PreflightError: the home, the registry or one batch through the model and loss fails
            (``esper_core.run.preflight``): a deployment has no ``esper run`` in front of it.
    """
    planned = plan_spec(
        recipe,
        epochs=epochs,
        device=device,
        seed=seed,
        run_id=run_id,
        nproc=nproc,
        policy=policy,
        max_params=max_params,
        max_flops=max_flops,
        grow_until=grow_until,
    )
    preflight(planned.config, planned.data, settings=settings())
    return planned


# NO_CACHE: planning is cheap and must see the current catalogue. No tags (see tasks.compile).
@task(name="plan-compiles", cache_policy=NO_CACHE)
def plan_compiles(
    recipe: str,
    blueprints: list[str] | None = None,
    backend: str = "export",
    approve: list[str] | None = None,
) -> list[CompileJob]:
    """The compile jobs of ``recipe`` (optionally narrowed to ``blueprints``).

    ``approve`` names the experimental / high-risk blueprints explicitly approved for compiling.
    (A morphogenesis flow run compiles the jobs its ``plan-run`` task planned instead.)
    """
    return compile_jobs(recipe, blueprints=blueprints, backend=backend, approved=tuple(approve or ()))
