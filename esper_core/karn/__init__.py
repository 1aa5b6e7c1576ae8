"""Karn: the blueprint catalogue (descriptors, tiers, parameter bounds, seed modules)."""

from esper_core.karn.catalog import (
    Blueprint,
    BlueprintBuilder,
    InvalidBlueprintParamsError,
    KarnCatalog,
    UnknownBlueprintError,
    default_catalog,
)
from esper_core.karn.profiles import SUPPORTED_DTYPES, ShapeProfile

__all__ = [
    "SUPPORTED_DTYPES",
    "Blueprint",
    "BlueprintBuilder",
    "InvalidBlueprintParamsError",
    "KarnCatalog",
    "ShapeProfile",
    "UnknownBlueprintError",
    "default_catalog",
]
