"""Make sure a registry holds the kernels some runs may germinate: compile and publish the missing ones."""

from __future__ import annotations

from collections.abc import Sequence

from esper_core._capabilities import resolve_device
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, find_published, publish_kernel
from esper_core.run.config import RunConfig
from esper_core.run.plan import plan_compile_jobs, recipe_feature_shape
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza


def publish_missing_kernels(settings: EsperSettings, configs: Sequence[RunConfig], *, device: str) -> None:
    """Compile and publish every kernel ``configs``' slots may germinate that the registry lacks.

    Kernels already published for the device are left alone, so a second call compiles nothing.
    About 1 s a kernel on a CPU core.
    """
    if not configs:
        return
    catalog, target = default_catalog(), resolve_device(device)
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        for config in configs:
            shape = recipe_feature_shape(config.recipe)
            for job in plan_compile_jobs(
                config, feature_shape=shape, catalog=catalog, approved=config.approved_blueprints
            ):
                if find_published(urza, job, target) is None:
                    publish_kernel(urza, catalog, compile_job(catalog, job, target))
    finally:
        urza.close()
