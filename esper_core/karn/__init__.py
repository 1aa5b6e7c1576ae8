"""Karn: the blueprint catalogue (descriptors, tiers, parameter bounds, supported profiles, seed modules,
what each seed adds)."""

from esper_core.karn.capacity import SeedCapacity, seed_capacity
from esper_core.karn.catalog import (
    VERSION_PARAM,
    Blueprint,
    BlueprintBuilder,
    GradMaxLayers,
    InvalidBlueprintParamsError,
    KarnCatalog,
    UnknownBlueprintError,
)
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import APPROVED_TAG, ApprovalRequiredError, publish_status, require_approval
from esper_core.karn.profiles import HOST_KINDS, SUPPORTED_DTYPES, ShapeProfile
from esper_core.karn.rules import ProfileRule, UnsupportedProfileError

__all__ = [
    "APPROVED_TAG",
    "HOST_KINDS",
    "SUPPORTED_DTYPES",
    "VERSION_PARAM",
    "ApprovalRequiredError",
    "Blueprint",
    "BlueprintBuilder",
    "GradMaxLayers",
    "InvalidBlueprintParamsError",
    "KarnCatalog",
    "ProfileRule",
    "SeedCapacity",
    "ShapeProfile",
    "UnknownBlueprintError",
    "UnsupportedProfileError",
    "default_catalog",
    "publish_status",
    "require_approval",
    "seed_capacity",
]
