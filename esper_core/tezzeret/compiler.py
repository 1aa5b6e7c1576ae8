"""Tezzeret: ahead-of-time compilation of Karn blueprints into kernel artifacts.

``compile_blueprint`` builds a blueprint's neutral module deterministically, exports it with
``torch.export`` (dynamic batch dimension), reloads the serialised program and checks it against
eager numerics, pre-warms and times it, and returns the blob plus its ``KernelArtifact``
descriptor, ready for Urza. Any failure of the exported path yields an eager fallback artifact
that records why, so a blueprint is always publishable. Nothing here touches global state: the
global RNG is forked, and no cache or registry is written.
"""

from __future__ import annotations

import copy
import hashlib
import json
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
    EnvironmentKey,
    GuardSchema,
    KernelArtifact,
)
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.formats import decode_exported, encode_eager, encode_exported
from esper_core.tezzeret.timing import Kernel, time_kernel

logger = logging.getLogger(__name__)
# torch.export traces through process-global dispatcher state and is not thread-safe: two
# exports on concurrent threads (Prefect's default task runner) corrupt each other. Exports in one
# process take turns; separate worker processes still compile in parallel.
_EXPORT_LOCK = threading.Lock()

COMPILER_NAME = "torch.export"
_FALLBACK_REASON_CHARS = 500
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


class NumericsMismatchError(RuntimeError):
    """The reloaded exported program does not reproduce the eager module's outputs."""


class ModeDependentModuleError(ValueError):
    """The module holds layers that behave differently in train and eval mode."""


@dataclass(kw_only=True, slots=True)
class TezzeretConfig:
    """How Tezzeret checks, pre-warms and times a kernel.

    Attributes:
        prewarm_batches: Batch sizes to check numerics on, pre-warm and time; each is clipped
            to the profile's ``batch_max``.
        warmup_iters: Untimed calls per batch size before timing.
        timing_iters: Timed calls per batch size (p50/p95/max are over these).
        rtol: Relative tolerance of the exported-vs-eager check.
        atol: Absolute tolerance of the exported-vs-eager check.
    """

    prewarm_batches: tuple[int, ...] = (1, 8, 64)
    warmup_iters: int = 3
    timing_iters: int = 20
    rtol: float = 1e-4
    atol: float = 1e-5

    def __post_init__(self) -> None:
        if not self.prewarm_batches or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.prewarm_batches
        ):
            raise ValueError(
                f"prewarm_batches must be a non-empty tuple of positive ints, got "
                f"{self.prewarm_batches!r}: pass e.g. (1, 8, 64)"
            )
        if self.warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.timing_iters < 1:
            raise ValueError(f"timing_iters must be >= 1, got {self.timing_iters}: latency percentiles need samples")
        if not (self.rtol >= 0.0 and self.atol >= 0.0):
            raise ValueError(
                f"rtol and atol must be >= 0, got rtol={self.rtol}, atol={self.atol}: "
                "use e.g. rtol=1e-4, atol=1e-5 for float32"
            )

    def batch_sizes(self, profile: ShapeProfile) -> tuple[int, ...]:
        """The distinct pre-warm batch sizes for ``profile``, ascending, clipped to its maximum."""
        return tuple(sorted({min(b, profile.batch_max) for b in self.prewarm_batches}))


@dataclass(frozen=True, kw_only=True, slots=True)
class CompiledKernel:
    """A compiled (or fallback) kernel: the blob and its descriptor, not yet in Urza.

    Attributes:
        artifact: The descriptor (``artifact_id`` and ``version`` unset until published).
        blob: The bytes whose SHA-256 is ``artifact.sha256``.
    """

    artifact: KernelArtifact
    blob: bytes


def environment_key(device: torch.device | str) -> EnvironmentKey:
    """Where an artifact compiled now, for ``device``, is valid.

    Args:
        device: The target device (``"cpu"``, ``"cuda"``, ``"cuda:0"``...).

    Returns:
        The torch version (without a local build suffix such as ``+cpu``), the device kind and
        the compiler name.

    Raises:
        ValueError: The device is neither CPU nor CUDA.
    """
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"Tezzeret compiles for 'cpu' or 'cuda' devices, got {str(device)!r}")
    return EnvironmentKey(
        torch_version=torch.__version__.split("+", 1)[0],
        device_kind=kind,
        compiler=COMPILER_NAME,
    )


def init_seed(blueprint_id: str, params: Mapping[str, float], profile: ShapeProfile) -> int:
    """Stable 63-bit RNG seed for a blueprint's weights, so recompiling gives the same blob."""
    key = json.dumps(
        [blueprint_id, {k: float(v) for k, v in sorted(params.items())}, profile.name],
        separators=(",", ":"),
    )
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


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
        config: Checking and timing settings; ``TezzeretConfig()`` when omitted.
        device: The device to compile, check and time on.

    Returns:
        The blob and its ``KernelArtifact`` (kind ``exported``, or ``eager`` with
        ``fallback=True`` and the reason when the exported path failed).

    Raises:
        UnknownBlueprintError: The catalogue does not hold ``blueprint_id``.
        InvalidBlueprintParamsError: ``params`` are invalid.
        ValueError: The device is not CPU or CUDA, or the blueprint does not fit ``profile``.
    """
    config = config or TezzeretConfig()
    start = time.perf_counter()
    target = torch.device(device)
    environment = environment_key(target)
    resolved = catalog.resolve_params(blueprint_id, params)
    module = build_deterministic(catalog, blueprint_id, profile, resolved).to(target).eval()
    inputs = probe_inputs(profile, config.batch_sizes(profile), target)

    kernel: Kernel
    try:
        with _EXPORT_LOCK:
            blob = _export(module, profile, inputs[0].device)
            kernel = _reload_and_check(blob, module, inputs, config)
        kind, reason = ArtifactKind.EXPORTED, None
    except Exception as e:  # noqa: BLE001 - by design, any failure of the export path falls back
        reason = f"{type(e).__name__}: {e}"[:_FALLBACK_REASON_CHARS]
        logger.warning(
            "tezzeret: export of %s for %s failed, publishing an eager fallback: %s",
            blueprint_id,
            profile.name,
            reason,
        )
        blob = encode_eager(
            blueprint_id=blueprint_id,
            params=resolved,
            profile=profile.name,
            state_dict=module.state_dict(),
        )
        kernel, kind = module, ArtifactKind.EAGER

    latency = time_kernel(kernel, inputs, warmup_iters=config.warmup_iters, timing_iters=config.timing_iters)
    with torch.inference_mode():
        output_shape = tuple(kernel(inputs[0]).shape[1:])
    guard = GuardSchema(
        feature_shape=profile.feature_shape,
        output_feature_shape=output_shape,
        dtype=profile.dtype,
        batch_min=1,
        batch_max=profile.batch_max,
    )
    artifact = KernelArtifact(
        blueprint_id=blueprint_id,
        shape_profile=profile.name,
        params=resolved,
        environment=environment,
        kind=kind,
        sha256=hashlib.sha256(blob).hexdigest(),
        size_bytes=len(blob),
        guard=guard,
        latency=latency,
        fallback=kind is ArtifactKind.EAGER,
        fallback_reason=reason,
        status=ArtifactStatus.ACTIVE,
        compile_ms=(time.perf_counter() - start) * 1e3,
    )
    return CompiledKernel(artifact=artifact, blob=blob)


def build_deterministic(
    catalog: KarnCatalog, blueprint_id: str, profile: ShapeProfile, params: Mapping[str, float]
) -> nn.Module:
    """Build the blueprint with weights seeded from its identity, leaving the global RNG alone.

    Args:
        catalog: The catalogue.
        blueprint_id: The blueprint.
        profile: The shape profile.
        params: Resolved parameters.

    Returns:
        The module on CPU (initialisation happens on CPU so every device gets the same weights).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed(blueprint_id, params, profile))
        return catalog.build(blueprint_id, profile, params)


def probe_inputs(profile: ShapeProfile, batches: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """Deterministic random inputs, one per batch size, of the profile's shape and dtype."""
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn((b, *profile.feature_shape), generator=generator).to(dtype=profile.torch_dtype, device=device)
        for b in batches
    ]


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
    batch = torch.export.Dim("batch", min=1, max=profile.batch_max)
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    return encode_exported(program)


def _reload_and_check(
    blob: bytes, module: nn.Module, inputs: Sequence[torch.Tensor], config: TezzeretConfig
) -> nn.Module:
    """Reload the blob and compare it with eager, on the real and on random weights.

    A neutral seed outputs zeros whatever its graph computes, so matching on the real weights
    alone would prove little: the second comparison loads the same random weights into a copy of
    each and compares again.
    """
    kernel = decode_exported(blob).module()
    _assert_close(module, kernel, inputs, config, "initial weights")

    generator = torch.Generator().manual_seed(1)
    random_state = {
        name: (
            torch.randn(value.shape, generator=generator).to(dtype=value.dtype, device=value.device)
            if value.is_floating_point()
            else value
        )
        for name, value in module.state_dict().items()
    }
    probe_eager = copy.deepcopy(module)
    probe_eager.load_state_dict(random_state)
    probe_kernel = decode_exported(blob).module()
    probe_kernel.load_state_dict(random_state)
    _assert_close(probe_eager, probe_kernel, inputs, config, "random weights")
    return kernel


def _assert_close(
    eager: nn.Module,
    kernel: nn.Module,
    inputs: Sequence[torch.Tensor],
    config: TezzeretConfig,
    what: str,
) -> None:
    with torch.inference_mode():
        for x in inputs:
            expected, actual = eager(x), kernel(x)
            if expected.shape != actual.shape:
                raise NumericsMismatchError(
                    f"exported kernel returns shape {tuple(actual.shape)} at batch {x.shape[0]}, "
                    f"eager returns {tuple(expected.shape)} ({what})"
                )
            if not torch.allclose(actual, expected, rtol=config.rtol, atol=config.atol):
                diff = (actual.float() - expected.float()).abs().max().item()
                raise NumericsMismatchError(
                    f"exported kernel differs from eager at batch {x.shape[0]} ({what}): max abs "
                    f"diff {diff:.3g} exceeds rtol={config.rtol:g}, atol={config.atol:g}; loosen "
                    "TezzeretConfig tolerances for low-precision dtypes"
                )
