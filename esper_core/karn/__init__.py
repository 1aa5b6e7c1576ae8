"""Karn: the blueprint catalogue (descriptors, tiers, parameter bounds, supported profiles, seed modules)."""

from esper_core.karn.catalog import (
    Blueprint,
    BlueprintBuilder,
    InvalidBlueprintParamsError,
    KarnCatalog,
    UnknownBlueprintError,
    default_catalog,
)
from esper_core.karn.policy import APPROVED_TAG, ApprovalRequiredError, publish_status, require_approval
from esper_core.karn.profiles import SUPPORTED_DTYPES, ShapeProfile
from esper_core.karn.rules import ProfileRule, UnsupportedProfileError

__all__ = [
    "APPROVED_TAG",
    "SUPPORTED_DTYPES",
    "ApprovalRequiredError",
    "Blueprint",
    "BlueprintBuilder",
    "InvalidBlueprintParamsError",
    "KarnCatalog",
    "ProfileRule",
    "ShapeProfile",
    "UnknownBlueprintError",
    "UnsupportedProfileError",
    "default_catalog",
    "publish_status",
    "require_approval",
]
