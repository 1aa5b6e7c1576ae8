"""Karn: the blueprint catalogue.

A ``Blueprint`` pairs a ``BlueprintDescriptor`` (what Tamiyo, Urza and telemetry see) with the
builder of its ``nn.Module``. ``KarnCatalog`` looks blueprints up, validates parameters against
their bounds and builds modules; ``default_catalog()`` is the catalogue the platform ships.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real

from torch import nn

from esper_core.contracts import BlueprintDescriptor, BlueprintTier, ParamBound
from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.rules import ProfileRule, UnsupportedProfileError

BlueprintBuilder = Callable[[ShapeProfile, Mapping[str, float]], nn.Module]

VERSION_PARAM = "blueprint_version"
"""Reserved parameter name carrying a descriptor's ``version`` above 1 in resolved parameters.

Urza keys artifacts by (blueprint, parameters, profile, environment), so a blueprint whose
function changed under the same id gets a new parameter key: an artifact compiled from the old
function is neither reused by the compile cache nor found by a lookup with the resolved
parameters, and resolving parameters that name another version (G0 resolves an artifact's)
fails. Version 1 adds nothing,
which keeps the keys of artifacts compiled before versioning existed.
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class GradMaxLayers:
    """The two layers of a blueprint's seed module that a GradMax-style initialisation sets.

    The module must compute ``output(act(input(x)))`` with ``act(0) = 0``: ``input`` maps the
    slot's features to hidden units (a ``Linear``, or a stride-1 convolution with "same" padding
    over the slot's channels) and ``output`` maps them back (a ``Linear`` or a convolution).
    Kasmina zeroes ``output`` and points the rows of ``input`` at the slot's gradient statistic
    (``esper_core.kasmina.seed_init``).

    Attributes:
        input: Name of the input projection in the module (its ``weight`` is ``input.weight``).
        output: Name of the output projection (``output.weight`` and ``output.bias``, if any).
    """

    input: str
    output: str


class UnknownBlueprintError(ValueError):
    """A blueprint id the catalogue does not hold."""


class InvalidBlueprintParamsError(ValueError):
    """Blueprint parameters that are unknown, out of bounds, or not integers where required."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Blueprint:
    """A catalogue entry: the descriptor and the builder of its module.

    Attributes:
        descriptor: Id, tier, risk, host kinds and parameter bounds.
        build: ``build(profile, params) -> nn.Module``; ``params`` are already resolved
            (every bounded parameter present and valid).
        rule: The shape profiles it supports; default: any profile of its (single) host kind.
        gradmax: The layers a GradMax-style initialisation at germination sets; None: the
            blueprint keeps its default initialisation (its form is not ``output(act(input(x)))``).
    """

    descriptor: BlueprintDescriptor
    build: BlueprintBuilder
    rule: ProfileRule | None = None
    gradmax: GradMaxLayers | None = None

    def __post_init__(self) -> None:
        if VERSION_PARAM in self.descriptor.param_bounds:
            raise ValueError(
                f"blueprint {self.blueprint_id!r} names a parameter {VERSION_PARAM!r}, which is reserved "
                "for the descriptor's version: rename the parameter"
            )
        if self.rule is not None and self.descriptor.host_kinds != (self.rule.kind,):
            raise ValueError(
                f"blueprint {self.blueprint_id!r} lists host kinds {self.descriptor.host_kinds} but its "
                f"profile rule is for {self.rule.kind!r}: make them agree"
            )

    def supports(self, profile: ShapeProfile) -> bool:
        """Whether the blueprint can be built for ``profile`` (see ``check_profile``)."""
        if self.rule is None:
            return profile.kind in self.descriptor.host_kinds
        return not self.rule.problems(profile)

    def describe_profiles(self) -> str:
        """The supported profiles in words, for ``esper catalog show``."""
        if self.rule is None:
            return f"any {'/'.join(self.descriptor.host_kinds)} profile"
        return self.rule.describe()

    @property
    def blueprint_id(self) -> str:
        """The descriptor's id."""
        return self.descriptor.blueprint_id


class KarnCatalog:
    """An immutable set of blueprints, keyed by id.

    Args:
        entries: The blueprints; ids must be unique.

    Raises:
        ValueError: Two blueprints share an id.
    """

    def __init__(self, entries: Sequence[Blueprint]) -> None:
        by_id: dict[str, Blueprint] = {}
        for entry in entries:
            if entry.blueprint_id in by_id:
                raise ValueError(
                    f"blueprint id {entry.blueprint_id!r} appears twice in the catalogue: "
                    "give each blueprint a unique id"
                )
            by_id[entry.blueprint_id] = entry
        self._by_id = by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, blueprint_id: object) -> bool:
        return blueprint_id in self._by_id

    @property
    def ids(self) -> tuple[str, ...]:
        """Blueprint ids in catalogue order."""
        return tuple(self._by_id)

    def list(
        self, tier: BlueprintTier | None = None, host_kind: str | None = None
    ) -> builtins.list[BlueprintDescriptor]:
        """Descriptors, optionally filtered.

        Args:
            tier: Keep only blueprints of this tier.
            host_kind: Keep only blueprints that fit this host kind (e.g. ``"mlp"``).

        Returns:
            Matching descriptors in catalogue order.
        """
        return [
            entry.descriptor
            for entry in self._by_id.values()
            if (tier is None or entry.descriptor.tier is tier)
            and (host_kind is None or host_kind in entry.descriptor.host_kinds)
        ]

    def get(self, blueprint_id: str) -> Blueprint:
        """The blueprint with id ``blueprint_id``.

        Raises:
            UnknownBlueprintError: No such id; the message lists the known ids.
        """
        entry = self._by_id.get(blueprint_id)
        if entry is None:
            raise UnknownBlueprintError(
                f"unknown blueprint {blueprint_id!r}: known blueprints are {sorted(self._by_id)}"
            )
        return entry

    def resolve_params(self, blueprint_id: str, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
        """Complete and validate a blueprint's parameters.

        Args:
            blueprint_id: The blueprint.
            overrides: Values to use instead of the defaults; may be partial.

        Returns:
            Every bounded parameter, sorted by name, as floats (integers exactly), plus
            ``blueprint_version`` when the descriptor's ``version`` is above 1 (see
            ``VERSION_PARAM``).

        Raises:
            UnknownBlueprintError: Unknown blueprint.
            InvalidBlueprintParamsError: An unknown parameter name, a non-number, a value out of
                bounds, a fraction for an integer parameter, or a ``blueprint_version`` other
                than the catalogue's (an artifact compiled from another version).
        """
        descriptor = self.get(blueprint_id).descriptor
        bounds = descriptor.param_bounds
        overrides = dict(overrides or {})
        version = overrides.pop(VERSION_PARAM, descriptor.version)
        if version != descriptor.version:
            raise InvalidBlueprintParamsError(
                f"parameters name version {version!r} of blueprint {blueprint_id!r}, the catalogue holds "
                f"version {descriptor.version}: the artifact was compiled from another version of the "
                f"blueprint; compile it again (`esper catalog compile {blueprint_id}`)"
            )
        unknown = sorted(set(overrides) - set(bounds))
        if unknown:
            raise InvalidBlueprintParamsError(
                f"blueprint {blueprint_id!r} has no parameter(s) {unknown}: "
                f"its parameters are {sorted(bounds) or 'none'}"
            )
        resolved: dict[str, float] = {}
        for name in sorted(bounds):
            bound = bounds[name]
            value = overrides.get(name, bound.default)
            resolved[name] = _check_value(blueprint_id, name, value, bound)
        if descriptor.version > 1:
            resolved[VERSION_PARAM] = float(descriptor.version)
        return dict(sorted(resolved.items()))

    def check_profile(self, blueprint_id: str, profile: ShapeProfile) -> None:
        """Raise unless the blueprint supports ``profile``.

        Raises:
            UnknownBlueprintError: Unknown blueprint.
            UnsupportedProfileError: The profile does not fit its rule (the message names both).
        """
        entry = self.get(blueprint_id)
        if entry.rule is not None:
            entry.rule.check(blueprint_id, profile)
        elif profile.kind not in entry.descriptor.host_kinds:
            raise UnsupportedProfileError(
                f"blueprint {blueprint_id!r} transforms {entry.descriptor.host_kinds} activations; "
                f"profile {profile.name} {profile.feature_shape} is {profile.kind!r}: pick a blueprint "
                "for this slot (`esper catalog list`)"
            )

    def build(
        self,
        blueprint_id: str,
        profile: ShapeProfile,
        params: Mapping[str, float] | None = None,
    ) -> nn.Module:
        """Build a fresh (neutral) seed module for a slot of shape ``profile``.

        Args:
            blueprint_id: The blueprint.
            profile: The slot's shape profile; the module is cast to its dtype.
            params: Parameter overrides, validated by ``resolve_params``.

        Returns:
            A module mapping (B, *feature_shape) to the same shape, in training mode.

        Raises:
            UnsupportedProfileError: The blueprint does not support ``profile``.
        """
        entry = self.get(blueprint_id)
        self.check_profile(blueprint_id, profile)
        resolved = self.resolve_params(blueprint_id, params)
        return entry.build(profile, resolved).to(dtype=profile.torch_dtype)


def _check_value(blueprint_id: str, name: str, value: object, bound: ParamBound) -> float:
    where = f"parameter {name!r} of blueprint {blueprint_id!r}"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidBlueprintParamsError(
            f"{where} must be a number, got {value!r}: pass a value in [{bound.low:g}, {bound.high:g}]"
        )
    number = float(value)
    if not math.isfinite(number) or not bound.low <= number <= bound.high:
        raise InvalidBlueprintParamsError(
            f"{where} is {number:g}, outside its bounds [{bound.low:g}, {bound.high:g}]: "
            f"pick a value in that range (default {bound.default:g})"
        )
    if bound.integer and not number.is_integer():
        raise InvalidBlueprintParamsError(
            f"{where} must be an integer, got {number:g}: round it, e.g. to {round(number)}"
        )
    return number
