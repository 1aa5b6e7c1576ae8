"""What Tamiyo knows about a blueprint it may germinate: Karn's descriptor plus Urza's facts,
and what the seed adds at each slot profile (Karn's capacity measurement, made at planning)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from esper_core.contracts import BlueprintDescriptor
from esper_core.contracts.enums import SlotKind


@dataclass(frozen=True, kw_only=True, slots=True)
class CandidateCapacity:
    """What the blueprint adds at one slot profile (``esper_core.karn.capacity.SeedCapacity``).

    Attributes:
        profile: The shape profile's name.
        parameters: Trainable parameters the seed adds there.
        flops_per_sample: Its forward FLOPs for one sample.
        linear: Its delta is affine in the slot's input, so it folds into the next layer.
    """

    profile: str
    parameters: int
    flops_per_sample: int
    linear: bool

    def __post_init__(self) -> None:
        if self.parameters < 0 or self.flops_per_sample < 0:
            raise ValueError(
                f"capacity at {self.profile!r} has parameters {self.parameters} and FLOPs "
                f"{self.flops_per_sample}: both must be >= 0 (measure them with karn.capacity.seed_capacity)"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class BlueprintCandidate:
    """A blueprint that can be germinated now, with the registry facts the policy weighs.

    Attributes:
        descriptor: Karn's descriptor (id, tier, risk, parameter bounds).
        shape_profiles: Shape profiles for which Urza holds an active compiled artifact; a slot
            can only host this blueprint if its ``shape_profile`` is in this set.
        latency_p95_ms: p95 latency of the artifact in milliseconds (worst over its profiles).
        param_cost: Number of parameters the seed adds to the host.
        capacity: What the seed adds at each profile it was measured at; empty when unknown
            (candidates recorded before it existed).
        kind: The kind of slot it grows in (a Karn blueprint: ``BRANCH``; a width-menu entry:
            ``WIDTH``); None for candidates recorded before it was.
    """

    descriptor: BlueprintDescriptor
    shape_profiles: frozenset[str]
    latency_p95_ms: float
    param_cost: int
    capacity: tuple[CandidateCapacity, ...] = ()
    kind: SlotKind | None = SlotKind.BRANCH

    def __post_init__(self) -> None:
        if not isinstance(self.shape_profiles, frozenset):
            raise ValueError(
                f"shape_profiles must be a frozenset, got {type(self.shape_profiles).__name__}: "
                "wrap the profile names in frozenset(...)"
            )
        if not (math.isfinite(self.latency_p95_ms) and self.latency_p95_ms >= 0.0):
            raise ValueError(
                f"latency_p95_ms must be a finite number >= 0, got {self.latency_p95_ms!r}: "
                f"pass the measured p95 of blueprint {self.descriptor.blueprint_id!r}"
            )
        if self.param_cost < 0:
            raise ValueError(f"param_cost must be >= 0, got {self.param_cost}: pass the seed's parameter count")

    @property
    def blueprint_id(self) -> str:
        """The Karn blueprint id."""
        return self.descriptor.blueprint_id

    def fits(self, shape_profile: str) -> bool:
        """Whether an active artifact exists for ``shape_profile``.

        Args:
            shape_profile: The slot's Karn shape profile.

        Returns:
            True if this candidate can be germinated in a slot with that profile.
        """
        return shape_profile in self.shape_profiles

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``from_dict`` reads it back to an equal candidate)."""
        return {
            "descriptor": self.descriptor.model_dump(mode="json"),
            "shape_profiles": sorted(self.shape_profiles),
            "latency_p95_ms": self.latency_p95_ms,
            "param_cost": self.param_cost,
            "capacity": [
                {
                    "profile": c.profile,
                    "parameters": c.parameters,
                    "flops_per_sample": c.flops_per_sample,
                    "linear": c.linear,
                }
                for c in self.capacity
            ],
            "kind": None if self.kind is None else self.kind.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlueprintCandidate:
        """The candidate ``to_dict`` wrote."""
        return cls(
            descriptor=BlueprintDescriptor.model_validate(data["descriptor"]),
            shape_profiles=frozenset(data["shape_profiles"]),
            latency_p95_ms=float(data["latency_p95_ms"]),
            param_cost=int(data["param_cost"]),
            # Absent from candidates recorded before capacity was known: the features stay unobserved.
            capacity=tuple(CandidateCapacity(**c) for c in data.get("capacity", ())),
            # Absent from candidates recorded before it was: unobserved, not guessed from the id.
            kind=None if data.get("kind") is None else SlotKind(data["kind"]),
        )
