"""Planning tasks: a run's plan (once, first) and the kernels a recipe needs."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.pipeline import CompileJob
from esper_core.run.spec import RunSpec, compile_jobs, plan_spec


# NO_CACHE: the plan's configuration and data stay in the process that made it, where the session
# takes them (esper_core.run.spec); a spec cached from another process would leave it nothing to
# take. No retries: a recipe refused once is refused again. No tags (see tasks.compile).
@task(name="plan-run", cache_policy=NO_CACHE)
def plan_run_spec(
    recipe: str, epochs: int | None, device: str, seed: int | None, run_id: str | None, nproc: int
) -> RunSpec:
    """Resolve and plan the run once: the spec every later task of the morphogenesis flow receives.

    Raises:
        ValueError, ApprovalRequiredError: a bad recipe or override, or a run ``nproc`` processes
            cannot share (``esper_core.run.spec.plan_spec``), before any work starts.
    """
    return plan_spec(recipe, epochs=epochs, device=device, seed=seed, run_id=run_id, nproc=nproc)


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
    Inside a morphogenesis flow run these are the jobs its ``plan-run`` task planned.
    """
    return compile_jobs(recipe, blueprints=blueprints, backend=backend, approved=tuple(approve or ()))
