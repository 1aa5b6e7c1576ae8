"""Tezzeret: ahead-of-time compilation of Karn blueprints into kernel artifacts.

``compile_blueprint`` builds a blueprint's neutral module deterministically, exports it with
``torch.export`` (dynamic batch dimension), reloads the serialised program, and with the
``aot_inductor`` backend also compiles its forward pass into an AOTInductor package (or, where
that does not work, compiles it with Inductor into persisted caches). It checks every compiled
form against eager numerically, pre-warms and times it on representative batch sizes, and
returns the blob plus its ``KernelArtifact`` descriptor, ready for Urza.

Verdicts: any failure to produce the trainable program yields an eager fallback artifact that
records why (a blueprint is always publishable); a kernel that compiles but misses the numeric
tolerance or the latency budget, or belongs to a high-risk blueprint, is marked QUARANTINED
with the reason. Nothing here touches the global RNG (it is forked) or writes the registry.

Why the artifact is what it is: seeds are *trained* after germination, and an AOTInductor
package is a forward-only library with no autograd, so it cannot be the seed Kasmina trains.
The exported program's ``.module()`` is a graph of ATen ops that trains as is and needs no
compilation, so it is what Kasmina loads in every backend. The AOTInductor package rides along
for inference on a frozen (FOSSILIZED) seed, with the trained weights swapped in.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from esper_core.contracts import (
    ArtifactKind,
    ArtifactStatus,
    GuardSchema,
    KernelArtifact,
    LatencyStats,
)
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.policy import publish_status
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret import inductor
from esper_core.tezzeret.build import build_deterministic, init_seed, probe_inputs
from esper_core.tezzeret.checks import NumericsMismatchError, budget_problem, numerics_problem
from esper_core.tezzeret.config import COMPILER_NAME, Backend, TezzeretConfig, environment_key
from esper_core.tezzeret.formats import BundlePayload, decode_exported, encode_bundle, encode_eager, encode_exported
from esper_core.tezzeret.timing import Kernel, time_kernel

__all__ = [
    "COMPILER_NAME",
    "AOTI_UNAVAILABLE_TAG",
    "Backend",
    "CompiledKernel",
    "ModeDependentModuleError",
    "NumericsMismatchError",
    "TezzeretConfig",
    "build_deterministic",
    "compile_blueprint",
    "environment_key",
    "init_seed",
    "probe_inputs",
]

logger = logging.getLogger(__name__)
# torch.export (and Inductor behind it) traces through process-global dispatcher state and is not
# thread-safe: two exports on concurrent threads (Prefect's default task runner) corrupt each
# other. Compiles in one process take turns; separate worker processes still compile in parallel.
_EXPORT_LOCK = threading.Lock()

AOTI_UNAVAILABLE_TAG = "aoti-unavailable"
"""Tag of an ``aot_inductor`` artifact whose AOTInductor package could not be built."""
_REASON_CHARS = 500
# Layers whose function differs between train and eval. An exported graph freezes the eval
# behaviour, so Kasmina training it would silently skip dropout / use running statistics.
_MODE_DEPENDENT: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
)


class ModeDependentModuleError(ValueError):
    """The module holds layers that behave differently in train and eval mode."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CompiledKernel:
    """A compiled (or fallback) kernel: the blob and its descriptor, not yet in Urza.

    Attributes:
        artifact: The descriptor (``artifact_id`` and ``version`` unset until published).
        blob: The bytes whose SHA-256 is ``artifact.sha256``.
        tags: Tags Tezzeret suggests for it (e.g. ``aoti-unavailable``).
    """

    artifact: KernelArtifact
    blob: bytes
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class _Built:
    """What the compile step produced, before timing."""

    blob: bytes
    kind: ArtifactKind
    kernel: Kernel
    inference: Kernel | None = None
    fallback_reason: str | None = None
    problems: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


def compile_blueprint(
    catalog: KarnCatalog,
    blueprint_id: str,
    profile: ShapeProfile,
    params: Mapping[str, float] | None = None,
    *,
    config: TezzeretConfig | None = None,
    device: torch.device | str = "cpu",
) -> CompiledKernel:
    """Compile one blueprint for one shape profile.

    Args:
        catalog: The Karn catalogue holding the blueprint.
        blueprint_id: The blueprint to compile.
        profile: The slot shape the kernel will serve.
        params: Parameter overrides (validated; defaults fill the rest).
        config: Backend, checking and timing settings; ``TezzeretConfig()`` when omitted.
        device: The device to compile, check and time on.

    Returns:
        The blob, its ``KernelArtifact`` (kind ``exported``, or ``eager`` with ``fallback=True``
        and the reason when the exported path failed; status QUARANTINED with the reason when a
        check failed) and suggested tags.

    Raises:
        UnknownBlueprintError: The catalogue does not hold ``blueprint_id``.
        InvalidBlueprintParamsError: ``params`` are invalid.
        UnsupportedProfileError: The blueprint does not support ``profile``.
        ValueError: The device is not CPU or CUDA.
    """
    config = config or TezzeretConfig()
    start = time.perf_counter()
    target = torch.device(device)
    environment = environment_key(target, config.backend)
    resolved = catalog.resolve_params(blueprint_id, params)
    module = build_deterministic(catalog, blueprint_id, profile, resolved).to(target).eval()
    inputs = probe_inputs(profile, config.batch_sizes(profile), target)

    with _EXPORT_LOCK:
        built = _build(module, blueprint_id, profile, resolved, inputs, config)

    latency: dict[str, LatencyStats] = time_kernel(
        built.kernel, inputs, warmup_iters=config.warmup_iters, timing_iters=config.timing_iters
    )
    if built.inference is not None:
        latency |= time_kernel(
            built.inference, inputs, warmup_iters=config.warmup_iters, timing_iters=config.timing_iters, prefix="aoti-"
        )
    with torch.inference_mode():
        output_shape = tuple(built.kernel(inputs[0]).shape[1:])
    problems = list(built.problems)
    over_budget = budget_problem(latency, config.latency_budget_ms)
    if over_budget is not None and config.enforce_latency_budget:
        problems.append(over_budget)
    elif over_budget is not None:
        logger.warning(
            "tezzeret: %s for %s: %s; published all the same (TezzeretConfig.enforce_latency_budget quarantines it)",
            blueprint_id,
            profile.name,
            over_budget,
        )
    # The tier policy is one more reason: a high-risk blueprint is quarantine-only.
    tier_status, tier_reason = publish_status(catalog.get(blueprint_id).descriptor)
    if tier_status is ArtifactStatus.QUARANTINED and tier_reason is not None:
        problems.append(tier_reason)
    status = ArtifactStatus.QUARANTINED if problems else ArtifactStatus.ACTIVE
    if problems:
        logger.warning("tezzeret: %s for %s is quarantined: %s", blueprint_id, profile.name, "; ".join(problems))
    artifact = KernelArtifact(
        blueprint_id=blueprint_id,
        shape_profile=profile.name,
        params=resolved,
        environment=environment,
        kind=built.kind,
        sha256=hashlib.sha256(built.blob).hexdigest(),
        size_bytes=len(built.blob),
        guard=GuardSchema(
            feature_shape=profile.feature_shape,
            output_feature_shape=output_shape,
            dtype=profile.dtype,
            batch_min=1,
            batch_max=profile.batch_max,
            length_min=1 if dynamic_length(profile) else None,
        ),
        latency=latency,
        fallback=built.kind is ArtifactKind.EAGER,
        fallback_reason=built.fallback_reason,
        status=status,
        status_reason="; ".join(problems)[: 4 * _REASON_CHARS] if problems else None,
        compile_ms=(time.perf_counter() - start) * 1e3,
    )
    return CompiledKernel(artifact=artifact, blob=built.blob, tags=built.tags)


def _build(
    module: nn.Module,
    blueprint_id: str,
    profile: ShapeProfile,
    params: Mapping[str, float],
    inputs: Sequence[torch.Tensor],
    config: TezzeretConfig,
) -> _Built:
    """Export (and with ``aot_inductor`` compile) ``module``, or fall back to eager on failure."""
    try:
        program_bytes = _export(module, profile, inputs[0].device)
        kernel = decode_exported(program_bytes).module()
    except Exception as e:  # noqa: BLE001 - by design, any failure of the export path falls back
        reason = f"{type(e).__name__}: {e}"[:_REASON_CHARS]
        logger.warning(
            "tezzeret: export of %s for %s failed, publishing an eager fallback: %s", blueprint_id, profile.name, reason
        )
        blob = encode_eager(
            blueprint_id=blueprint_id, params=params, profile=profile.name, state_dict=module.state_dict()
        )
        return _Built(blob=blob, kind=ArtifactKind.EAGER, kernel=module, fallback_reason=reason)

    def program_with(state: dict[str, torch.Tensor] | None) -> Kernel:
        fresh = decode_exported(program_bytes).module()
        if state is not None:
            fresh.load_state_dict(state)
        return fresh

    tol = {"rtol": config.rtol, "atol": config.atol}
    problems = [numerics_problem(module, program_with, inputs, **tol, what="exported program")]
    if config.backend is Backend.EXPORT:
        return _Built(
            blob=program_bytes, kind=ArtifactKind.EXPORTED, kernel=kernel, problems=tuple(p for p in problems if p)
        )

    payload, inference, aoti_problem = _aot_compile(module, program_bytes, inputs, config, tol)
    problems.append(aoti_problem)
    if payload.aoti_error is not None:
        logger.warning(
            "tezzeret: AOTInductor is unavailable for %s on %s (%s); the artifact keeps the exported "
            "program and persisted Inductor caches",
            blueprint_id,
            inputs[0].device.type,
            payload.aoti_error,
        )
    return _Built(
        blob=encode_bundle(payload),
        kind=ArtifactKind.EXPORTED,
        kernel=kernel,
        inference=inference,
        problems=tuple(p for p in problems if p),
        tags=(AOTI_UNAVAILABLE_TAG,) if payload.aoti_error is not None else (),
    )


def _aot_compile(
    module: nn.Module,
    program_bytes: bytes,
    inputs: Sequence[torch.Tensor],
    config: TezzeretConfig,
    tol: Mapping[str, float],
) -> tuple[BundlePayload, Kernel | None, str | None]:
    """AOTInductor package of the forward pass, checked; else Inductor caches of the program."""
    with inductor.inductor_cache(config.cache_dir):
        try:
            package = inductor.compile_aoti(decode_exported(program_bytes))
            inference = inductor.load_aoti(package)
        except Exception as e:  # noqa: BLE001 - AOTInductor is best effort: the program still serves
            error = f"{type(e).__name__}: {e}"[:_REASON_CHARS]
            caches = _compile_caches(program_bytes, inputs)
            return BundlePayload(program=program_bytes, inductor_cache=caches, aoti_error=error), None, None

    def aoti_with(state: dict[str, torch.Tensor] | None) -> Kernel:
        fresh = inductor.load_aoti(package)
        if state is not None:
            inductor.swap_weights(fresh, state)
        return fresh

    problem = numerics_problem(module, aoti_with, inputs, rtol=tol["rtol"], atol=tol["atol"], what="AOTInductor kernel")
    return BundlePayload(program=program_bytes, aoti=package), inference, problem


def _compile_caches(program_bytes: bytes, inputs: Sequence[torch.Tensor]) -> bytes | None:
    try:
        return inductor.compile_with_caches(decode_exported(program_bytes).module(), inputs)
    except Exception as e:  # noqa: BLE001 - caches are an optimisation; the program still serves
        logger.warning("tezzeret: Inductor could not compile the program either, no caches kept: %s", e)
        return None


def _export(module: nn.Module, profile: ShapeProfile, device: torch.device) -> bytes:
    offending = sorted({type(m).__name__ for m in module.modules() if isinstance(m, _MODE_DEPENDENT)})
    if offending:
        raise ModeDependentModuleError(
            f"module holds train/eval-dependent layers {offending}; an exported graph freezes eval "
            "behaviour, so train it eagerly (fallback) or remove those layers from the blueprint"
        )
    # An example batch >= 2 keeps torch.export from specialising the batch dim to 0/1.
    example = torch.zeros(
        (min(8, profile.batch_max), *profile.feature_shape),
        dtype=profile.torch_dtype,
        device=device,
    )
    dims = {0: torch.export.Dim("batch", min=1, max=profile.batch_max)}
    if dynamic_length(profile):
        # A token kernel serves any sequence up to the profile's L (a shorter prompt, a last batch
        # of a shorter context); the example's L >= 2 keeps export from specialising it.
        dims[1] = torch.export.Dim("length", min=1, max=profile.feature_shape[0])
    program = torch.export.export(module, (example,), dynamic_shapes=(dims,))
    return encode_exported(program)


def dynamic_length(profile: ShapeProfile) -> bool:
    """Whether a kernel for ``profile`` is exported with a dynamic sequence length (tokens, L >= 2)."""
    return profile.tokens and profile.feature_shape[0] >= 2
