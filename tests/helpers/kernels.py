"""Load real compiled kernels from a test's registry."""

from __future__ import annotations

from esper_core.contracts import BlendSchedule, GateVerdict
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.kinds import KernelSource
from esper_core.kasmina.loader import LoadedKernel, load_kernel
from esper_core.kasmina.manager import SeedManager
from esper_core.settings import EsperSettings
from esper_core.tezzeret.compiler import environment_key
from esper_core.urza.service import Urza


def kernel_from_registry(settings: EsperSettings, blueprint_id: str, profile: str) -> LoadedKernel:
    """The active CPU kernel of ``blueprint_id`` for ``profile`` in ``settings.home``'s registry."""
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        artifact, blob = urza.require_active(blueprint_id, profile, environment_key("cpu"))
    finally:
        urza.close()
    return load_kernel(artifact, blob, catalog=default_catalog(), device="cpu")


def given(kernel: LoadedKernel) -> KernelSource:
    """A kernel source that hands over ``kernel`` whatever it is asked for (``SeedManager.germinate``'s
    ``kernels``): a test that fetched its kernel itself germinates exactly that one."""
    return lambda _blueprint_id, _profile: kernel


def germinate_kernel(
    manager: SeedManager, slot_id: str, kernel: LoadedKernel, *, blend_epochs: int = 1, lr_scale: float = 1.0
) -> GateVerdict:
    """Germinate exactly ``kernel`` in ``slot_id`` with its default parameters and a linear blend."""
    return manager.germinate(
        slot_id,
        kernel.artifact.blueprint_id,
        kernels=given(kernel),
        params={},
        blend_schedule=BlendSchedule.LINEAR,
        blend_epochs=blend_epochs,
        lr_scale=lr_scale,
    )
