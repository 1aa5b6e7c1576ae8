"""compile_catalog: compile and publish every kernel a recipe may germinate."""

from __future__ import annotations

from prefect import flow, unmapped
from prefect.task_runners import ThreadPoolTaskRunner

from esper_core._capabilities import Device
from esper_core.contracts import KernelArtifact
from esper_core.pipeline import CompileJob
from esper_core.run.recipes import RecipeRef
from esper_core.tezzeret.config import Backend, BackendName
from tasks.compile import (
    COMPILE_CONCURRENCY,
    begin_compile_run,
    compile_blueprint,
    finish_compile_run,
    publish_artifact,
)
from tasks.plan import plan_compiles


@flow(name="compile_catalog", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=COMPILE_CONCURRENCY))
def compile_catalog(
    recipe: RecipeRef = "digits-mlp",
    blueprints: list[str] | None = None,
    device: Device = "auto",
    backend: BackendName = "export",
    approve: list[str] | None = None,
) -> list[KernelArtifact]:
    """Compile (or reuse) and publish the kernels of ``recipe``'s slots.

    Args:
        recipe: Named recipe (or ``package.module:function``) whose host slots decide the shape profiles.
        blueprints: Blueprint ids to compile; default: the recipe's own list.
        device: ``auto``, ``cpu`` or ``cuda``.
        backend: Tezzeret backend: ``export`` (fast, default) or ``aot_inductor``.
        approve: Experimental / high-risk blueprints explicitly approved for compiling.
    """
    jobs = plan_compiles(recipe, blueprints, backend, approve)
    return compile_and_publish(recipe, jobs, device, backend)


# The same flow name: in the UI and the registry's lineage a planned run's compile is a
# compile_catalog run like any other. Not deployed: a deployment asks for a recipe, not for jobs.
@flow(name="compile_catalog", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=COMPILE_CONCURRENCY))
def compile_planned(recipe: RecipeRef, jobs: list[CompileJob], device: Device = "auto") -> list[KernelArtifact]:
    """Compile (or reuse) and publish a planned run's kernels: its ``jobs``, planned once with it.

    Args:
        recipe: The run's recipe (the compile run's lineage names it).
        jobs: The run's jobs (``RunSpec.jobs``), approved ones included.
        device: ``auto``, ``cpu`` or ``cuda``.
    """
    # A run's plan builds export kernels (``plan_run``'s default backend).
    return compile_and_publish(recipe, jobs, device, Backend.EXPORT.value)


def compile_and_publish(recipe: str, jobs: list[CompileJob], device: str, backend: str) -> list[KernelArtifact]:
    """Compile (or reuse) and publish ``jobs`` as one compile run: the body of both flows above.

    Runs inside a flow run (its tasks are that flow's), which the compile run is named after.
    """
    run_id = begin_compile_run(recipe, jobs, device, backend)
    staged = compile_blueprint.map(jobs, device=unmapped(device))
    published = [p.result() for p in publish_artifact.map(staged, compile_run_id=unmapped(run_id))]
    finish_compile_run(run_id, published, sum(1 for s in staged if s.result().reused))
    return published
