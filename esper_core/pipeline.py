"""Compile planning: which (blueprint, shape profile) kernels a run needs, and whether Urza
already holds them. The registry is the compile cache: a job whose artifact is published for
this environment is never compiled again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esper_core.contracts import KernelArtifact
from esper_core.hosts import build_host
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.recipes import RunConfig
from esper_core.tezzeret.compiler import CompiledKernel, compile_blueprint, environment_key
from esper_core.urza.errors import MissingBlobError
from esper_core.urza.service import Urza


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileJob:
    """One kernel to build: a blueprint for a shape profile (Karn default parameters)."""

    blueprint_id: str
    profile: str
    """``ShapeProfile.name``, e.g. ``f64-b512``."""

    def __post_init__(self) -> None:
        ShapeProfile.parse(self.profile)  # raises ValueError naming a malformed profile


def slot_profiles(config: RunConfig, feature_shape: tuple[int, ...]) -> list[str]:
    """Distinct shape profiles of the seed slots of the run's host, in slot order."""
    # Built on the meta device: only the slots' shapes are needed, not weights.
    with torch.device("meta"):
        host = build_host(config.host, feature_shape=feature_shape, num_classes=2)
    return list(dict.fromkeys(slot.profile.name for slot in host.slots().values()))


def plan_compile_jobs(config: RunConfig, *, feature_shape: tuple[int, ...], catalog: KarnCatalog) -> list[CompileJob]:
    """Every (blueprint, slot profile) kernel the run may germinate: each recipe blueprint for
    each distinct slot profile whose activation kind (vector / feature map) it transforms.

    Raises:
        ValueError: when the recipe names a blueprint Karn does not know, or one that fits none
            of the host's slots (the message names it and the fix).
    """
    profiles = [ShapeProfile.parse(p) for p in slot_profiles(config, feature_shape)]
    jobs = []
    for blueprint_id in config.blueprints:
        descriptor = catalog.get(blueprint_id).descriptor
        fitting = [p for p in profiles if p.kind in descriptor.host_kinds]
        if not fitting:
            raise ValueError(
                f"recipe {config.recipe} lists {blueprint_id}, which transforms {descriptor.host_kinds} "
                f"activations, but its slots are {[p.name for p in profiles]}: remove it from the recipe"
            )
        jobs.extend(CompileJob(blueprint_id=blueprint_id, profile=p.name) for p in fitting)
    return jobs


def find_published(urza: Urza, job: CompileJob, device: torch.device | str) -> KernelArtifact | None:
    """The active compiled artifact for ``job`` in this environment, if Urza holds one.

    An eager fallback does not count: its failure may have been transient, so the job is
    compiled again (a repeat failure yields the same blob, which publishing deduplicates).
    """
    artifact = urza.store.find_active(job.blueprint_id, job.profile, environment_key(device))
    return None if artifact is None or artifact.fallback else artifact


def compile_job(catalog: KarnCatalog, job: CompileJob, device: torch.device | str) -> CompiledKernel:
    """Compile ``job`` with Tezzeret (export, check numerics, time, or eager fallback)."""
    return compile_blueprint(catalog, job.blueprint_id, ShapeProfile.parse(job.profile), device=device)


def publish_staged(urza: Urza, catalog: KarnCatalog, artifact: KernelArtifact) -> KernelArtifact:
    """Publish an artifact whose blob is already in the blob store (idempotent).

    The blueprint's Karn descriptor is registered first (Urza keys artifacts to it).

    Raises:
        MissingBlobError: the blob was never staged (or was removed since): nothing is written.
    """
    if not urza.blobs.exists(artifact.sha256):
        raise MissingBlobError(artifact.sha256, urza.blobs.path(artifact.sha256))
    urza.register_blueprint(catalog.get(artifact.blueprint_id).descriptor)
    return urza.store.publish(artifact)


def publish_kernel(urza: Urza, catalog: KarnCatalog, kernel: CompiledKernel) -> KernelArtifact:
    """Stage a freshly compiled kernel's blob, then publish it (blob first, row second)."""
    urza.blobs.put(kernel.blob)
    return publish_staged(urza, catalog, kernel.artifact)
