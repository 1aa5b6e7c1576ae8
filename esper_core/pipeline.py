"""Compile planning and publishing: which kernels a run needs, whether Urza already holds them,
and how a compiled kernel reaches the registry.

The registry is the compile cache, keyed by (blueprint, parameters, shape profile, environment
key): a job whose compiled artifact is published for this environment is never compiled again,
so a re-run after an interruption compiles only what is missing. Publishing writes the blob
first (atomic, content-addressed), then the row with its history, tags and lineage in one
transaction, so an interrupted publish leaves at most an orphan blob (``Urza.gc`` removes it).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from esper_core._capabilities import resolve_device
from esper_core.contracts import ArtifactStatus, KernelArtifact
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import approval_tags, require_approval
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.compiler import CompiledKernel, compile_blueprint
from esper_core.tezzeret.config import Backend, TezzeretConfig, environment_key
from esper_core.urza.errors import MissingBlobError
from esper_core.urza.records import CompileRun

if TYPE_CHECKING:
    from esper_core.urza.service import Urza

INDUCTOR_CACHE_DIR = Path("cache") / "inductor"
"""Inductor/Triton cache directory of the ``aot_inductor`` backend, relative to ``ESPER_HOME``."""

# A quarantined artifact is a verdict (failed check, high-risk tier, or an operator's decision):
# compiling the job again must not publish a fresh ACTIVE version over it.
_DONE = (ArtifactStatus.ACTIVE, ArtifactStatus.QUARANTINED)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileJob:
    """One kernel to build: a blueprint with resolved parameters for a shape profile and backend.

    Attributes:
        blueprint_id: The Karn blueprint.
        profile: ``ShapeProfile.name``, e.g. ``f64-b512``.
        params: Resolved parameters as sorted ``(name, value)`` pairs (hashable, JSON-friendly);
            empty means Karn's defaults.
        backend: Tezzeret backend (``export`` or ``aot_inductor``).
        approved: The plan approved this (experimental or high-risk) blueprint explicitly.
    """

    blueprint_id: str
    profile: str
    params: tuple[tuple[str, float], ...] = ()
    backend: str = Backend.EXPORT.value
    approved: bool = False

    def __post_init__(self) -> None:
        ShapeProfile.parse(self.profile)  # raises ValueError naming a malformed profile
        if self.backend not in tuple(Backend):
            raise ValueError(f"backend must be one of {[b.value for b in Backend]}, got {self.backend!r}")

    @property
    def params_dict(self) -> dict[str, float]:
        """``params`` as a dict."""
        return dict(self.params)


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishPlan:
    """How published kernels are attributed: lineage and the actor in their status history."""

    compile_run_id: str | None = None
    actor: str = "tezzeret"
    extra_tags: tuple[str, ...] = field(default_factory=tuple)


def job_for(
    catalog: KarnCatalog,
    blueprint_id: str,
    profile: str,
    *,
    params: Mapping[str, float] | None = None,
    backend: Backend | str = Backend.EXPORT,
    approved: Collection[str] = (),
) -> CompileJob:
    """A single validated job (for the CLI and benchmarks), parameters resolved.

    Raises:
        ValueError: Unknown blueprint, invalid parameters, unsupported profile or no approval.
    """
    entry = catalog.get(blueprint_id)
    require_approval(entry.descriptor, approved, action="compile")
    catalog.check_profile(blueprint_id, ShapeProfile.parse(profile))
    resolved = catalog.resolve_params(blueprint_id, params)
    return CompileJob(
        blueprint_id=blueprint_id,
        profile=profile,
        params=tuple(sorted(resolved.items())),
        backend=Backend(backend).value,
        approved=blueprint_id in approved,
    )


def find_published(urza: Urza, job: CompileJob, device: torch.device | str) -> KernelArtifact | None:
    """The compiled artifact Urza already holds for ``job`` here (the compile cache), if any.

    Matches blueprint, parameters, profile and environment (torch version, device kind,
    compiler). Active and quarantined artifacts count: both are verdicts. An eager fallback does
    not: its failure may have been transient, so the job is compiled again (a repeat failure
    yields the same blob, which publishing deduplicates). A retired artifact does not either.
    """
    env = environment_key(device, job.backend)
    params = job.params_dict if job.params else None
    return urza.store.find(job.blueprint_id, job.profile, env, params, statuses=_DONE, compiled_only=True)


def tezzeret_config(home: Path | None, backend: Backend | str) -> TezzeretConfig:
    """Tezzeret's configuration for a backend, with Inductor's caches under ``home`` if given."""
    cache_dir = None if home is None else Path(home) / INDUCTOR_CACHE_DIR
    return TezzeretConfig(backend=Backend(backend), cache_dir=cache_dir)


def compile_job(
    catalog: KarnCatalog,
    job: CompileJob,
    device: torch.device | str,
    *,
    config: TezzeretConfig | None = None,
) -> CompiledKernel:
    """Compile ``job`` with Tezzeret (export, compile, check numerics, time, or eager fallback).

    Raises:
        ApprovalRequiredError: A non-safe blueprint in a job that was not approved.
    """
    descriptor = catalog.get(job.blueprint_id).descriptor
    require_approval(descriptor, [job.blueprint_id] if job.approved else [], action="compile")
    config = config or TezzeretConfig(backend=Backend(job.backend))
    if config.backend is not Backend(job.backend):
        raise ValueError(f"job is for backend {job.backend!r} but the config compiles with {config.backend.value!r}")
    return compile_blueprint(
        catalog,
        job.blueprint_id,
        ShapeProfile.parse(job.profile),
        job.params_dict or None,
        config=config,
        device=device,
    )


def new_compile_run(
    device: torch.device | str,
    backend: Backend | str,
    *,
    run_id: str | None = None,
    detail: Mapping[str, object] | None = None,
) -> CompileRun:
    """A compile run record for lineage (``Urza.store.start_compile_run`` stores it)."""
    env = environment_key(device, backend)
    return CompileRun(
        run_id=run_id or uuid.uuid4().hex,
        compiler=env.compiler,
        torch_version=env.torch_version,
        device_kind=env.device_kind,
        hostname=socket.gethostname(),
        detail=dict(detail or {}),
    )


def publish_staged(
    urza: Urza,
    catalog: KarnCatalog,
    artifact: KernelArtifact,
    *,
    tags: Sequence[str] = (),
    plan: PublishPlan | None = None,
) -> KernelArtifact:
    """Publish an artifact whose blob is already in the blob store (idempotent, one transaction).

    The blueprint's Karn descriptor is registered first (Urza keys artifacts to it); artifacts of
    non-safe blueprints get the ``approved`` tag (they were only compiled with an approval).

    Raises:
        MissingBlobError: the blob was never staged (or was removed since): nothing is written.
    """
    plan = plan or PublishPlan()
    if not urza.blobs.exists(artifact.sha256):
        raise MissingBlobError(artifact.sha256, urza.blobs.path(artifact.sha256))
    descriptor = catalog.get(artifact.blueprint_id).descriptor
    urza.register_blueprint(descriptor)
    all_tags = (*tags, *plan.extra_tags, *approval_tags(descriptor))
    return urza.publish_artifact(artifact, compile_run_id=plan.compile_run_id, tags=all_tags, actor=plan.actor)


def publish_kernel(
    urza: Urza, catalog: KarnCatalog, kernel: CompiledKernel, *, plan: PublishPlan | None = None
) -> KernelArtifact:
    """Stage a freshly compiled kernel's blob, then publish it (blob first, row second)."""
    urza.blobs.put(kernel.blob)
    return publish_staged(urza, catalog, kernel.artifact, tags=kernel.tags, plan=plan)


def stage_job(job: CompileJob, device: str, home: Path, registry_url: str | None) -> tuple[str, tuple[str, ...], bool]:
    """Compile ``job`` unless Urza already holds its artifact here, and store the blob.

    What the ``compile-blueprint`` task runs in a child process (``esper_core.child``), so that
    its time limit can stop a compile; publishing the row is left to the caller.

    Args:
        job: The compile job.
        device: ``auto``, ``cpu`` or ``cuda``.
        home: ``ESPER_HOME`` (blob store and compiler caches).
        registry_url: Urza's database URL, ``None`` for the SQLite file under ``home``.

    Returns:
        The artifact's JSON, its tags and whether Urza already had it (nothing compiled).
    """
    # Imported here: planning a run (which reads CompileJob) needs no database, so SQLAlchemy stays
    # off the path of `esper recipes show` and the plan.
    from esper_core.urza.service import Urza

    target = resolve_device(device)
    urza = Urza.open(home, registry_url)
    try:
        existing = find_published(urza, job, target)
        if existing is not None:
            return existing.to_json(), (), True
        kernel = compile_job(default_catalog(), job, target, config=tezzeret_config(home, job.backend))
        # Blob first: content-addressed and atomic, so a crash here leaves at most an orphan blob.
        urza.blobs.put(kernel.blob)
    finally:
        urza.close()
    return kernel.artifact.to_json(), tuple(kernel.tags), False
