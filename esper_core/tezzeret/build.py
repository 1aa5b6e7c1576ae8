"""Deterministic construction of a blueprint's module and of the probe inputs Tezzeret checks on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.profiles import ShapeProfile


def init_seed(blueprint_id: str, params: Mapping[str, float], profile: ShapeProfile) -> int:
    """Stable 63-bit RNG seed for a blueprint's weights, so recompiling gives the same blob."""
    key = json.dumps(
        [blueprint_id, {k: float(v) for k, v in sorted(params.items())}, profile.name],
        separators=(",", ":"),
    )
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


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
