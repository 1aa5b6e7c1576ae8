"""Lifecycle gates G0-G5: each checks real quantities and returns a ``GateVerdict``.

Gates are pure functions of what they are shown; the seed manager gathers the quantities (grad
norms, probe losses, isolation probe) and records every verdict as a telemetry event.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from esper_core.contracts import GateId, GateVerdict, GuardSchema
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import GuardMismatchError, check_guard


@dataclass(kw_only=True, slots=True)
class GateConfig:
    """Thresholds of the gates."""

    min_grad_norm: float = 1e-10
    """G1: a TRAINING seed whose summed gradient norm is at or below this is not learning."""
    max_loss_rise: float = 0.10
    """G2: the with-seed validation loss may rise at most this fraction above its best."""
    max_loss_ratio: float = 2.0
    """G2: the with-seed validation loss may be at most this multiple of the host's. The with-seed
    loss is probed at the alpha the seed's blend would start at (``SeedManager.probe_plan``)."""
    isolation_rtol: float = 1e-5
    """G3: largest host-gradient difference tolerated between seed present and absent, relative
    to the largest host gradient. Not zero: on CUDA two identical backward passes differ in the
    last bits (atomic accumulation order), and on the 2026-11-28 H200 lease an exact test culled
    every width seed at ~1e-7 relative (3e-8 absolute); a seed that leaks into the host's
    gradients moves them by orders of magnitude more. On a CPU both passes agree to the bit.
    Relative to the largest gradient of the whole host, not per tensor: a layer whose gradients
    are tiny would turn CUDA's last-bit noise into a large per-tensor ratio."""
    impact_tolerance: float = 0.0
    """G4: with the seed, validation loss may exceed the loss without it by this fraction."""

    def __post_init__(self) -> None:
        for name in ("min_grad_norm", "isolation_rtol", "impact_tolerance"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (a tolerance), got {getattr(self, name)}")
        if self.max_loss_rise < 0:
            raise ValueError(f"max_loss_rise must be >= 0, got {self.max_loss_rise}")
        if self.max_loss_ratio <= 1.0:
            raise ValueError(f"max_loss_ratio must be > 1, got {self.max_loss_ratio}")


def g0_width(
    *,
    layer: str,
    width: int,
    units: int,
    init: str,
    inits: Sequence[str],
    max_factor: float,
    adjacent_in_flight: Sequence[str] = (),
) -> GateVerdict:
    """A width seed's request is sane: a known init, 1 <= units <= (max_factor - 1) x width, and
    no width seed in flight on an adjacent layer (``adjacent_in_flight``: the slots whose layer
    reads this one's units, or whose units this one reads). Merging either would change the other's
    input or output width under it while it trains."""
    limit = max(1, math.floor(width * (max_factor - 1)))
    if adjacent_in_flight:
        return GateVerdict(
            gate=GateId.G0_SANITY,
            passed=False,
            reason=f"{layer} is adjacent to width seed(s) in flight in {list(adjacent_in_flight)}: widen it once "
            "they have merged or been culled",
        )
    if init not in inits:
        return GateVerdict(
            gate=GateId.G0_SANITY, passed=False, reason=f"width init must be one of {tuple(inits)}, got {init!r}"
        )
    if not 1 <= units <= limit:
        return GateVerdict(
            gate=GateId.G0_SANITY,
            passed=False,
            reason=f"{layer} has {width} units: a width seed may add 1..{limit} at once (KasminaConfig.width_max_factor "
            f"{max_factor:g}), got {units}",
        )
    return GateVerdict(gate=GateId.G0_SANITY, passed=True, reason=f"widen {layer} {width} -> {width + units} ({init})")


def g0_sanity(
    catalog: KarnCatalog,
    *,
    blueprint_id: str,
    params: dict[str, float],
    guard: GuardSchema,
    profile: ShapeProfile,
) -> GateVerdict:
    """Blueprint known and fits the slot's activation kind, parameters in bounds, guard fits the slot."""
    try:
        descriptor = catalog.get(blueprint_id).descriptor
        catalog.resolve_params(blueprint_id, params)
        check_guard(guard, feature_shape=profile.feature_shape, dtype=profile.dtype)
    except (ValueError, GuardMismatchError) as e:
        return GateVerdict(gate=GateId.G0_SANITY, passed=False, reason=str(e))
    if profile.kind not in descriptor.host_kinds:
        return GateVerdict(
            gate=GateId.G0_SANITY,
            passed=False,
            reason=f"{blueprint_id} transforms {descriptor.host_kinds} activations; slot {profile.name} is {profile.kind!r}",
        )
    if guard.batch_max < profile.batch_max:
        return GateVerdict(
            gate=GateId.G0_SANITY,
            passed=False,
            reason=f"artifact accepts batches up to {guard.batch_max}; slot needs {profile.batch_max}",
        )
    return GateVerdict(
        gate=GateId.G0_SANITY,
        passed=True,
        reason=f"{blueprint_id} fits {guard.describe()}",
    )


def g1_gradient_health(grad_norm: float, *, config: GateConfig) -> GateVerdict:
    """The seed's gradients over the epoch are finite and non-zero."""
    measured = {"grad_norm": grad_norm}
    if not math.isfinite(grad_norm):
        return GateVerdict(
            gate=GateId.G1_GRADIENT_HEALTH, passed=False, reason="non-finite gradient", measured=measured
        )
    if grad_norm <= config.min_grad_norm:
        return GateVerdict(
            gate=GateId.G1_GRADIENT_HEALTH,
            passed=False,
            reason=f"gradient norm {grad_norm:.3g} <= {config.min_grad_norm:.3g}: seed is not learning",
            measured=measured,
        )
    return GateVerdict(
        gate=GateId.G1_GRADIENT_HEALTH, passed=True, reason=f"grad norm {grad_norm:.3g}", measured=measured
    )


def g1_waived(kind: str) -> GateVerdict:
    """G1 for a seed of a kind that does not train in isolation: nothing to check yet."""
    return GateVerdict(
        gate=GateId.G1_GRADIENT_HEALTH,
        passed=True,
        reason=f"{kind} seeds do not train in isolation: they train, jointly with the host, once they blend",
    )


def g2_stability(with_seed_losses: Sequence[float], *, host_val_loss: float, config: GateConfig) -> GateVerdict:
    """The seed's own (with-seed) validation loss is finite, bounded and not rising."""
    if not with_seed_losses:
        return GateVerdict(gate=GateId.G2_STABILITY, passed=False, reason="no with-seed loss measured")
    last = with_seed_losses[-1]
    best = min(with_seed_losses)
    measured = {"with_seed_loss": last, "best_with_seed_loss": best, "host_val_loss": host_val_loss}
    if not math.isfinite(last):
        return GateVerdict(
            gate=GateId.G2_STABILITY, passed=False, reason="with-seed loss is not finite", measured=measured
        )
    if last > host_val_loss * config.max_loss_ratio:
        return GateVerdict(
            gate=GateId.G2_STABILITY,
            passed=False,
            reason=f"with-seed loss {last:.4f} > {config.max_loss_ratio}x host loss {host_val_loss:.4f}",
            measured=measured,
        )
    if last > best * (1.0 + config.max_loss_rise):
        return GateVerdict(
            gate=GateId.G2_STABILITY,
            passed=False,
            reason=f"with-seed loss rose to {last:.4f} from best {best:.4f} (> {config.max_loss_rise:.0%})",
            measured=measured,
        )
    return GateVerdict(
        gate=GateId.G2_STABILITY, passed=True, reason=f"with-seed loss {last:.4f} stable", measured=measured
    )


def g3_interface(
    *,
    input_shape: tuple[int, ...],
    output_shape: tuple[int, ...],
    input_dtype: torch.dtype,
    output_dtype: torch.dtype,
    isolation_rel_diff: float,
    config: GateConfig,
) -> GateVerdict:
    """Output shape and dtype match the slot's input, and isolation held while TRAINING (the host's
    gradients with the seed present and absent agree within ``isolation_rtol``)."""
    measured = {"isolation_rel_diff": isolation_rel_diff}
    if output_shape != input_shape or output_dtype != input_dtype:
        return GateVerdict(
            gate=GateId.G3_INTERFACE,
            passed=False,
            reason=f"seed maps {tuple(input_shape)} {input_dtype} to {tuple(output_shape)} {output_dtype}",
            measured=measured,
        )
    if not isolation_rel_diff <= config.isolation_rtol:
        return GateVerdict(
            gate=GateId.G3_INTERFACE,
            passed=False,
            reason=(
                f"isolation violated: host gradients differ by {isolation_rel_diff:.3g} of their largest with the "
                f"seed present (isolation_rtol={config.isolation_rtol:g})"
            ),
            measured=measured,
        )
    return GateVerdict(gate=GateId.G3_INTERFACE, passed=True, reason="shapes match, isolation holds", measured=measured)


def g4_system_impact(*, val_loss_with: float, val_loss_without: float, config: GateConfig) -> GateVerdict:
    """With the seed blended in, validation loss is no worse than without it (within tolerance)."""
    limit = val_loss_without * (1.0 + config.impact_tolerance)
    measured = {"val_loss_with_seed": val_loss_with, "val_loss_without_seed": val_loss_without}
    passed = math.isfinite(val_loss_with) and val_loss_with <= limit
    verb = "<=" if passed else ">"
    return GateVerdict(
        gate=GateId.G4_SYSTEM_IMPACT,
        passed=passed,
        reason=f"val loss with seed {val_loss_with:.4f} {verb} {limit:.4f} without",
        measured=measured,
    )


def g5_reset(*, has_seed: bool, alpha: float, optimizer_params: int) -> GateVerdict:
    """The slot holds no module, no alpha and no optimizer state before it is reused."""
    problems = []
    if has_seed:
        problems.append("a seed module is still attached")
    if alpha != 0.0:
        problems.append(f"alpha is {alpha}")
    if optimizer_params:
        problems.append(f"{optimizer_params} seed parameters still in the optimizer")
    return GateVerdict(
        gate=GateId.G5_RESET,
        passed=not problems,
        reason="; ".join(problems) or "slot clean",
        measured={"optimizer_params": float(optimizer_params)},
    )
