"""Kasmina's artifact loader: guard checks and turning an Urza blob into a trainable module.

Kasmina never compiles. An ``exported`` artifact is a ``torch.export`` program, loaded as a
``GraphModule`` (autograd flows through it, so the seed trains); an ``eager`` artifact (Tezzeret's
fallback) is rebuilt from Karn and its weights loaded. Compiled kernels may not check their own
inputs (an AOTInductor package silently accepts a wrong shape), so ``check_guard`` runs first.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.export.passes import move_to_device_pass

from esper_core.contracts import ArtifactKind, GuardSchema, KernelArtifact
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.formats import decode_eager, decode_exported


class GuardMismatchError(ValueError):
    """An artifact's guard schema does not accept the slot's tensors."""


class EnvironmentMismatchError(ValueError):
    """An exported artifact was compiled for another device kind."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedKernel:
    """A seed module ready for a slot.

    Attributes:
        module: The trainable seed module, on the requested device.
        artifact: The artifact it came from.
        load_ms: Wall time of deserialising and moving it.
        fallback: True when this is an eager fallback (surface it in telemetry).
    """

    module: nn.Module
    artifact: KernelArtifact
    load_ms: float
    fallback: bool


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
    if tuple(feature_shape) != guard.feature_shape:
        problems.append(f"feature shape {tuple(feature_shape)} != {guard.feature_shape}")
    if dtype != guard.dtype:
        problems.append(f"dtype {dtype} != {guard.dtype}")
    if batch_size is not None and not guard.batch_min <= batch_size <= guard.batch_max:
        problems.append(f"batch {batch_size} outside [{guard.batch_min}, {guard.batch_max}]")
    if guard.output_feature_shape != guard.feature_shape:
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
        The module, its artifact, the load time and whether it is a fallback.

    Raises:
        ValueError: The blob does not match the artifact's sha256, or an eager blob is of an
            unknown format or describes another blueprint/profile.
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
    if artifact.kind is ArtifactKind.EXPORTED:
        module = _load_exported(artifact, blob, target)
    else:
        module = _load_eager(artifact, blob, catalog).to(target)
    return LoadedKernel(
        module=module,
        artifact=artifact,
        load_ms=(time.perf_counter() - start) * 1e3,
        fallback=artifact.fallback,
    )


def _load_exported(artifact: KernelArtifact, blob: bytes, device: torch.device) -> nn.Module:
    if artifact.environment.device_kind != device.type:
        raise EnvironmentMismatchError(
            f"artifact {artifact.artifact_id} of {artifact.blueprint_id} was exported for "
            f"{artifact.environment.device_kind}, the slot is on {device.type}: compile the "
            f"blueprint for {device.type} (`esper catalog compile {artifact.blueprint_id}`)"
        )
    program = move_to_device_pass(decode_exported(blob), device)
    module = program.module()
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
