"""compile_catalog: compile and publish every kernel a recipe may germinate."""

from __future__ import annotations

from prefect import flow, unmapped

from esper_core.contracts import KernelArtifact
from tasks.compile import compile_blueprint, publish_artifact
from tasks.plan import plan_compiles


@flow(name="compile_catalog", log_prints=True)
def compile_catalog(
    recipe: str = "digits-mlp", blueprints: list[str] | None = None, device: str = "auto"
) -> list[KernelArtifact]:
    """Compile (or reuse) and publish the kernels of ``recipe``'s slots.

    Args:
        recipe: Named recipe whose host slots decide the shape profiles.
        blueprints: Blueprint ids to compile; default: the recipe's own list.
        device: ``auto``, ``cpu`` or ``cuda``.
    """
    jobs = plan_compiles(recipe, blueprints)
    staged = compile_blueprint.map(jobs, device=unmapped(device))
    published = publish_artifact.map(staged)
    return [p.result() for p in published]
