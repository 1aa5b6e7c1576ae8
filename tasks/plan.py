"""Planning task: which kernels a recipe needs."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.karn.catalog import default_catalog
from esper_core.pipeline import CompileJob
from esper_core.run.plan import plan_compile_jobs, recipe_feature_shape
from esper_core.run.recipes import get_recipe


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
    """
    config = get_recipe(recipe)
    if blueprints:
        config.blueprints = tuple(blueprints)
    return plan_compile_jobs(
        config,
        feature_shape=recipe_feature_shape(recipe),
        catalog=default_catalog(),
        backend=backend,
        approved=tuple(approve or ()),
    )
