"""Kasmina's artifact loader: guard checks and turning an Urza blob into a trainable module.

Kasmina never compiles (no ``torch.compile`` in this package; a test greps for it). What it
loads, by artifact:

- ``exported`` (``torch.export`` compiler): the exported program as a ``GraphModule`` of ATen
  ops. Autograd flows through it, so the seed trains, and nothing is compiled: its first call
  costs warm-up (allocator, dispatcher caches), which ``first_use_ms`` measures.
- ``exported`` (``aot_inductor`` compiler): the same trainable program from the bundle, plus the
  AOTInductor package as an ``InferenceKernel``: a compiled, forward-only library for a frozen
  seed (FOSSILIZED, or serving), into which the trained weights are swapped (``load_weights``).
  When AOTInductor was unavailable the bundle carries Inductor caches instead; they are loaded
  into this process's compiler caches (deserialisation, not compilation), so a later compile of
  the same kernels elsewhere in the process (Tolaria's compiled step) hits them.
- ``eager`` (Tezzeret's fallback): rebuilt from Karn and its weights loaded.

Compiled kernels may not check their own inputs (an AOTInductor package silently accepts a wrong
shape), so ``check_guard`` runs before any of them is used, and ``InferenceKernel`` checks every
call. ``load_for_slot`` is the whole path for one slot: tier policy, lookup, guards, load,
one pre-warm.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.export.passes import move_to_device_pass

from esper_core.contracts import ArtifactKind, BlueprintTier, GuardSchema, KernelArtifact
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.policy import require_approval
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.config import Backend, environment_key
from esper_core.tezzeret.formats import decode_bundle, decode_eager, decode_exported
from esper_core.tezzeret.inductor import load_aoti, load_cache_artifacts, swap_weights
from esper_core.urza.errors import ArtifactNotFoundError

if TYPE_CHECKING:
    # Only a type here: the registry's SQLAlchemy stays off the path of code that plans without it.
    from esper_core.urza.service import Urza


class GuardMismatchError(ValueError):
    """An artifact's guard schema does not accept the slot's tensors."""


class EnvironmentMismatchError(ValueError):
    """An exported artifact was compiled for another device kind."""


class QuarantineOnlyError(ValueError):
    """A high-risk blueprint's artifact was asked for a slot: it is quarantine-only."""


class InferenceKernel:
    """A forward-only AOTInductor kernel that checks its guard on every call.

    Args:
        compiled: The loaded ``AOTICompiledModel``.
        guard: The artifact's guard schema.
    """

    def __init__(self, compiled: Any, guard: GuardSchema) -> None:
        self._compiled = compiled
        self.guard = guard

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Run the kernel on (B, *feature_shape) activations (no autograd).

        Raises:
            GuardMismatchError: ``x`` does not fit the guard (the kernel itself would accept it).
        """
        dtype = str(x.dtype).removeprefix("torch.")
        check_guard(self.guard, feature_shape=tuple(x.shape[1:]), dtype=dtype, batch_size=x.shape[0])
        return self._compiled(x)

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Swap a (trained) ``state_dict`` of the seed into the kernel, without recompiling.

        Raises:
            ValueError: The kernel cannot take one of the weights (it was folded in).
        """
        swap_weights(self._compiled, state)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedKernel:
    """A seed module ready for a slot.

    Attributes:
        module: The trainable seed module, on the requested device.
        artifact: The artifact it came from.
        load_ms: Wall time of verifying, deserialising and moving it.
        fallback: True when this is an eager fallback (surface it in telemetry).
        inference: The AOTInductor forward kernel, for ``aot_inductor`` artifacts that have one.
        first_use_ms: Wall time of its first call, once pre-warmed (``load_for_slot``).
    """

    module: nn.Module
    artifact: KernelArtifact
    load_ms: float
    fallback: bool
    inference: InferenceKernel | None = None
    first_use_ms: float | None = None


def check_guard(
    guard: GuardSchema,
    *,
    feature_shape: tuple[int, ...],
    dtype: str,
    batch_size: int | None = None,
) -> None:
    """Check that an artifact accepts a slot's activations.

    Args:
        guard: The artifact's guard schema.
        feature_shape: The slot's per-sample shape.
        dtype: The slot's dtype name.
        batch_size: A concrete batch size to check too, if known.

    Raises:
        GuardMismatchError: Shape, dtype, batch or output shape does not fit; the message gives
            both the slot's and the artifact's shapes and how to fix it.
    """
    batch = "*" if batch_size is None else str(batch_size)
    slot = f"(batch {batch}, {', '.join(map(str, feature_shape))}) {dtype}"
    problems: list[str] = []
    if not guard.accepts_features(tuple(feature_shape)):
        problems.append(f"feature shape {tuple(feature_shape)} != {guard.feature_shape}")
    if dtype != guard.dtype:
        problems.append(f"dtype {dtype} != {guard.dtype}")
    if batch_size is not None and not guard.batch_min <= batch_size <= guard.batch_max:
        problems.append(f"batch {batch_size} outside [{guard.batch_min}, {guard.batch_max}]")
    if guard.output_feature_shape != guard.feature_shape:  # at the longest length, for tokens
        problems.append(
            f"artifact outputs {guard.output_feature_shape} per sample, a residual seed must "
            f"return its input shape {guard.feature_shape}"
        )
    if problems:
        raise GuardMismatchError(
            f"artifact guard does not fit the slot: slot is {slot}, artifact accepts "
            f"{guard.describe()} ({'; '.join(problems)}); compile the blueprint for the slot's "
            "shape profile (`esper catalog compile <blueprint> --recipe <recipe>`) or attach the "
            "seed to a slot of the artifact's shape"
        )


def load_kernel(
    artifact: KernelArtifact,
    blob: bytes,
    *,
    catalog: KarnCatalog,
    device: torch.device | str = "cpu",
) -> LoadedKernel:
    """Turn an artifact's blob into a trainable seed module (no compilation).

    Args:
        artifact: The artifact descriptor (from Urza).
        blob: Its blob (from ``Urza.fetch_blob``, already verified there; checked again here).
        catalog: The Karn catalogue, to rebuild eager fallbacks.
        device: Where the module should live.

    Returns:
        The module, its artifact, the load time, whether it is a fallback, and the inference
        kernel of an ``aot_inductor`` artifact.

    Raises:
        ValueError: The blob does not match the artifact's sha256, or is of an unknown format
            or describes another blueprint/profile.
        EnvironmentMismatchError: An exported artifact built for another device kind.
    """
    start = time.perf_counter()
    target = torch.device(device)
    actual = hashlib.sha256(blob).hexdigest()
    if actual != artifact.sha256:
        raise ValueError(
            f"blob hashes to {actual}, artifact {artifact.artifact_id} expects {artifact.sha256}: "
            "fetch the blob with Urza.fetch_blob for this artifact"
        )
    inference = None
    if artifact.kind is ArtifactKind.EAGER:
        module = _load_eager(artifact, blob, catalog).to(target)
    elif artifact.environment.compiler == Backend.AOT_INDUCTOR.compiler:
        _check_device(artifact, target)
        bundle = decode_bundle(blob)
        module = _trainable(decode_exported(bundle.program), target)
        if bundle.aoti is not None:
            inference = InferenceKernel(load_aoti(bundle.aoti), artifact.guard)
        elif bundle.inductor_cache is not None:
            load_cache_artifacts(bundle.inductor_cache)
    else:
        _check_device(artifact, target)
        module = _trainable(decode_exported(blob), target)
    return LoadedKernel(
        module=module,
        artifact=artifact,
        load_ms=(time.perf_counter() - start) * 1e3,
        fallback=artifact.fallback,
        inference=inference,
    )


def load_for_slot(
    urza: Urza,
    blueprint_id: str,
    profile: ShapeProfile,
    *,
    catalog: KarnCatalog,
    device: torch.device | str = "cpu",
    params: Mapping[str, float] | None = None,
    approved: Collection[str] = (),
    backend: Backend | str = Backend.EXPORT,
    prewarm: bool = True,
) -> LoadedKernel:
    """Load the active artifact of ``blueprint_id`` for a slot of shape ``profile``, ready to use.

    In order: tier policy (high-risk refused, experimental only if ``approved`` names it), the
    newest ACTIVE artifact for this environment, its guards against the slot's shapes (before
    any bytes are loaded), the blob (SHA-256 verified), the module, and one pre-warm call.

    Args:
        urza: The registry.
        blueprint_id: The blueprint to germinate.
        profile: The slot's shape profile.
        catalog: The Karn catalogue.
        device: The slot's device.
        params: Parameters the artifact must have been compiled with (None: any).
        approved: Blueprint ids explicitly approved for germination (experimental tier).
        backend: Which Tezzeret backend's artifacts to use.
        prewarm: Call the module once and record ``first_use_ms``.

    Returns:
        The loaded kernel, with ``load_ms`` covering lookup, fetch and load.

    Raises:
        QuarantineOnlyError: A high-risk blueprint.
        ApprovalRequiredError: An experimental blueprint not in ``approved``.
        ArtifactNotFoundError: No active artifact (the message says how to compile one).
        GuardMismatchError: The artifact's guard does not fit the slot (both shapes named).
    """
    start = time.perf_counter()
    descriptor = catalog.get(blueprint_id).descriptor
    if descriptor.tier is BlueprintTier.HIGH_RISK:
        raise QuarantineOnlyError(
            f"blueprint {blueprint_id!r} is high_risk, which is quarantine-only: its artifacts are "
            "for offline evaluation and are never germinated; pick a safe or experimental blueprint"
        )
    require_approval(descriptor, approved, action="germinate")
    target = torch.device(device)
    env = environment_key(target, backend)
    artifact = urza.store.find_active(blueprint_id, profile.name, env, params)
    if artifact is None:
        where = f"{env.device_kind}/torch {env.torch_version}/{env.compiler}"
        raise ArtifactNotFoundError.for_key(blueprint_id, profile.name, where, repr(urza.store))
    check_guard(artifact.guard, feature_shape=profile.feature_shape, dtype=profile.dtype, batch_size=profile.batch_max)
    loaded = load_kernel(artifact, urza.fetch_blob(artifact), catalog=catalog, device=target)
    loaded = replace(loaded, load_ms=(time.perf_counter() - start) * 1e3)
    if not prewarm:
        return loaded
    return replace(loaded, first_use_ms=first_use(loaded.module, profile, target))


def first_use(module: nn.Module, profile: ShapeProfile, device: torch.device) -> float:
    """Time the first call of a freshly loaded seed on a representative batch, in ms.

    This is the pre-warm: one forward call under ``inference_mode`` (allocator, dispatcher and
    kernel caches warm up here, so the first training step does not pay for them).
    """
    x = torch.zeros((2, *profile.feature_shape), dtype=profile.torch_dtype, device=device)
    start = time.perf_counter()
    with torch.inference_mode():
        module(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _check_device(artifact: KernelArtifact, device: torch.device) -> None:
    if artifact.environment.device_kind != device.type:
        raise EnvironmentMismatchError(
            f"artifact {artifact.artifact_id} of {artifact.blueprint_id} was exported for "
            f"{artifact.environment.device_kind}, the slot is on {device.type}: compile the "
            f"blueprint for {device.type} (`esper catalog compile {artifact.blueprint_id}`)"
        )


def _trainable(program: torch.export.ExportedProgram, device: torch.device) -> nn.Module:
    module = move_to_device_pass(program, device).module()
    # ``ExportedProgram.module()`` makes train()/eval() raise, which would break host.train()
    # recursing into the slot. The graph was captured in eval mode and Tezzeret refuses to export
    # mode-dependent layers (dropout, batch norm), so the flag changes nothing: restore the
    # plain nn.Module methods.
    module.__dict__.pop("train", None)
    module.__dict__.pop("eval", None)
    return module


def _load_eager(artifact: KernelArtifact, blob: bytes, catalog: KarnCatalog) -> nn.Module:
    payload = decode_eager(blob)
    if payload.blueprint_id != artifact.blueprint_id or payload.profile != artifact.shape_profile:
        raise ValueError(
            f"eager blob holds {payload.blueprint_id}@{payload.profile} but artifact "
            f"{artifact.artifact_id} is {artifact.blueprint_id}@{artifact.shape_profile}: the "
            "registry row points at the wrong blob; re-publish the artifact"
        )
    profile = ShapeProfile.parse(payload.profile)
    # Building draws initial weights from the RNG; fork it so loading a seed does not change
    # the training run's random stream (retries must reproduce it exactly).
    with torch.random.fork_rng(devices=[]):
        module = catalog.build(payload.blueprint_id, profile, payload.params)
    module.load_state_dict(payload.state_dict, strict=True)
    return module
