"""Make sure a registry holds the kernels some runs may germinate: compile and publish the missing ones."""

from __future__ import annotations

from collections.abc import Sequence

from esper_core._capabilities import resolve_device
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, find_published, publish_kernel
from esper_core.run.config import RunConfig
from esper_core.run.plan import plan_compile_jobs, recipe_feature_shape
from esper_core.run.recipes import RECIPES, is_import_path
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza


def publish_missing_kernels(settings: EsperSettings, configs: Sequence[RunConfig], *, device: str) -> None:
    """Compile and publish every kernel ``configs``' slots may germinate that the registry lacks.

    Kernels already published for the device are left alone, so a second call compiles nothing.
    About 1 s a kernel on a CPU core. ``configs`` may be recipes by name or configurations built
    in code (a zoo member's), whose data is loaded for its shape.
    """
    if not configs:
        return
    catalog, target = default_catalog(), resolve_device(device)
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        for config in configs:
            shape = _feature_shape(config)
            for job in plan_compile_jobs(
                config, feature_shape=shape, catalog=catalog, approved=config.approved_blueprints
            ):
                if find_published(urza, job, target) is None:
                    publish_kernel(urza, catalog, compile_job(catalog, job, target))
    finally:
        urza.close()


def _feature_shape(config: RunConfig) -> tuple[int, ...]:
    # A registered or importable recipe's shape is loaded once per process by name; a
    # configuration built in code (a zoo member's) has a name no recipe answers to, so its own
    # data gives the shape.
    if config.recipe in RECIPES or is_import_path(config.recipe):
        return recipe_feature_shape(config.recipe)
    return load_dataset(config.data).feature_shape
