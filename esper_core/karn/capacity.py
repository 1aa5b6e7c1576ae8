"""What a blueprint adds at a slot: parameters, forward FLOPs per sample, and whether it is linear.

A seed only adds capacity if its delta is a function the host could not already represent: a
delta that is affine in its input (``A x + c``) folds into the linear layer or convolution next to
the slot, whatever its weights. ``seed_capacity`` builds the real module for a profile and
measures all three, so the numbers describe the module Tezzeret would compile, not a formula
that could drift from it. Nothing here is stored: Urza's descriptors stay as they are and the
capacity is recomputed (milliseconds for the shipped blueprints) wherever it is shown.

Linearity is measured, not declared: with every weight random (a fresh seed's zero output layer
would make any module look linear), the probe compares ``f(a x1 + b x2)`` with
``a f(x1) + b f(x2) - (a + b - 1) f(0)``, which are equal exactly when ``f`` is affine.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from esper_core.karn.catalog import Blueprint, KarnCatalog
from esper_core.karn.profiles import ShapeProfile

LINEAR_TOLERANCE = 1e-6
"""Largest relative affinity gap (in float64) at which a module counts as affine; an affine
module measures ~1e-16, a GELU bottleneck with random weights ~1e-1."""

REFERENCE_PROFILES: dict[str, ShapeProfile] = {
    "mlp": ShapeProfile(feature_shape=(64,)),
    "seq": ShapeProfile(feature_shape=(8, 40)),
    "cnn": ShapeProfile(feature_shape=(16, 8, 8)),
    "tok": ShapeProfile(feature_shape=(64, 64), tokens=True),
}
"""The profile per host kind at which ``esper catalog list`` reports capacity: the slot shapes of
the shipped recipes (a 64-wide MLP layer, an MNIST-1D Conv1d output, a small conv layer, a
64-character context of 64-wide tokens)."""

# The probe's coefficients: any a, b with a + b != 1 separate affine from linear offsets.
_A, _B = 0.7, -1.3
_PROBE_BATCH = 2
_WEIGHT_DRAWS = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedCapacity:
    """What one blueprint adds at one slot shape.

    Attributes:
        blueprint_id: The blueprint.
        profile: The shape profile's name.
        params: The resolved blueprint parameters the module was built with.
        parameters: Trainable parameters the seed adds.
        flops_per_sample: Forward FLOPs for one sample, as ``torch.utils.flop_counter`` counts
            them: 2 per multiply-add of matmuls, convolutions and attention; element-wise ops
            (activations, normalisation, gates) are not counted.
        affine_gap: How far the seed's function is from affine (``affine_gap``), on random
            inputs and the first of up to four random weight draws that shows it (0 for an
            affine map).
        linear: ``affine_gap <= LINEAR_TOLERANCE`` on every draw: the delta is affine in the
            input, so it folds into the neighbouring linear layer or convolution and adds no
            capacity.
    """

    blueprint_id: str
    profile: str
    params: dict[str, float]
    parameters: int
    flops_per_sample: int
    affine_gap: float
    linear: bool

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (for ``esper catalog list|show --json``)."""
        return {
            "profile": self.profile,
            "params": dict(self.params),
            "parameters": self.parameters,
            "flops_per_sample": self.flops_per_sample,
            "affine_gap": self.affine_gap,
            "linear": self.linear,
        }


def reference_profile(entry: Blueprint) -> ShapeProfile:
    """The ``REFERENCE_PROFILES`` entry of the blueprint's (first) host kind.

    Raises:
        ValueError: No reference profile for its kind, or the blueprint does not support it.
    """
    kind = entry.descriptor.host_kinds[0]
    profile = REFERENCE_PROFILES.get(kind)
    if profile is None or not entry.supports(profile):
        raise ValueError(
            f"blueprint {entry.blueprint_id!r} has no reference profile its rule accepts "
            f"({entry.describe_profiles()}): pass a profile explicitly"
        )
    return profile


def seed_capacity(
    catalog: KarnCatalog,
    blueprint_id: str,
    profile: ShapeProfile,
    params: Mapping[str, float] | None = None,
) -> SeedCapacity:
    """Build the blueprint for ``profile`` and measure what it adds.

    Args:
        catalog: The catalogue holding the blueprint.
        blueprint_id: The blueprint.
        profile: The slot's shape profile.
        params: Parameter overrides (validated; defaults fill the rest).

    Returns:
        Parameter count, forward FLOPs per sample and the affinity measurement.

    Raises:
        UnknownBlueprintError: Unknown blueprint.
        InvalidBlueprintParamsError: Invalid parameters.
        UnsupportedProfileError: The blueprint does not support ``profile``.
    """
    resolved = catalog.resolve_params(blueprint_id, params)
    # Forked and seeded: the measurement is deterministic and leaves the caller's RNG alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = catalog.build(blueprint_id, profile, resolved).to(torch.float64).eval()
    parameters = sum(p.numel() for p in module.parameters() if p.requires_grad)
    # Counted on a meta copy: FLOP formulas need shapes only, so nothing is computed.
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        copy.deepcopy(module).to("meta")(torch.empty((1, *profile.feature_shape), dtype=torch.float64, device="meta"))
    # One draw of weights can leave the module affine where the probe looks (e.g. a single ReLU
    # unit dead on every input), so it counts as linear only if every draw measures affine.
    gap = 0.0
    for draw in range(_WEIGHT_DRAWS):
        randomize_(module, torch.Generator().manual_seed(draw))
        gap = max(gap, affine_gap(module, profile.feature_shape, torch.Generator().manual_seed(_WEIGHT_DRAWS + draw)))
        if gap > LINEAR_TOLERANCE:
            break
    return SeedCapacity(
        blueprint_id=blueprint_id,
        profile=profile.name,
        params=resolved,
        parameters=parameters,
        flops_per_sample=int(counter.get_total_flops()),
        affine_gap=gap,
        linear=gap <= LINEAR_TOLERANCE,
    )


def randomize_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Overwrite every floating parameter with random values, in place; return ``module``.

    Matrices and kernels get N(0, 1/fan_in), so activations stay O(1) through the layers (inside
    the non-linearities' bending range); vectors (biases, norm scales) get N(0, 0.25).
    """
    with torch.no_grad():
        for p in module.parameters():
            if not p.is_floating_point():
                continue
            std = 1.0 / math.sqrt(p[0].numel()) if p.dim() >= 2 else 0.5
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) * std)
    return module


def affine_gap(module: nn.Module, feature_shape: tuple[int, ...], generator: torch.Generator) -> float:
    """How far ``module`` is from an affine map, relative to its outputs' size.

    For ``f(x) = A x + c``, ``f(a x1 + b x2) - a f(x1) - b f(x2) + (a + b - 1) f(0)`` is zero; the
    gap is that residual's norm divided by the sum of its terms' norms (so 0 for affine, and at
    most 1). Measured on random float64 inputs with the module's own dtype and weights, so call
    it on a float64 module with random weights (``randomize_``).

    Args:
        module: The seed module (maps (B, *feature_shape) to the same shape).
        feature_shape: The per-sample shape.
        generator: Source of the random inputs.

    Returns:
        The relative gap in [0, 1]; 0 for a module whose output is identically zero.
    """
    dtype = next((p.dtype for p in module.parameters()), torch.float64)
    x1, x2 = (torch.randn((_PROBE_BATCH, *feature_shape), generator=generator, dtype=dtype) for _ in range(2))
    offset = _A + _B - 1.0
    # One call on the four stacked inputs: a seed acts on each sample alone (no batch statistics).
    stacked = torch.cat([_A * x1 + _B * x2, x1, x2, torch.zeros_like(x1)])
    with torch.no_grad():
        mixed, f1, f2, f0 = module(stacked).chunk(4)
    residual = mixed - _A * f1 - _B * f2 + offset * f0
    scale = mixed.norm() + abs(_A) * f1.norm() + abs(_B) * f2.norm() + abs(offset) * f0.norm()
    if scale == 0:
        return 0.0
    return float(residual.norm() / scale)
