"""``esper_cli.choices`` spells out what the library defines: each tuple equals its source."""

from __future__ import annotations

from typing import get_args

import pytest

from esper_cli import choices
from esper_core._capabilities import DEVICE_CHOICES
from esper_core.contracts import BlueprintTier
from esper_core.karn.profiles import HOST_KINDS
from esper_core.run.recipes import RECIPES
from esper_core.studies.depth_growth import PLANS as DEPTH_GROWTH_PLANS
from esper_core.studies.growth import PLANS as GROWTH_PLANS
from esper_core.studies.simic_train import PLANS as SIMIC_PLANS
from esper_core.tamiyo.config import pinnable_policies
from esper_core.tamiyo.shipped import SHIPPED
from esper_core.tezzeret.config import BackendName
from esper_core.tolaria.precision import AMP_CHOICES
from esper_core.zoo import FAMILIES


@pytest.mark.parametrize(
    ("name", "source", "where"),
    [
        ("DEVICES", DEVICE_CHOICES, "esper_core._capabilities.DEVICE_CHOICES"),
        ("PRECISIONS", AMP_CHOICES, "esper_core.tolaria.precision.AMP_CHOICES"),
        ("HOST_KINDS", HOST_KINDS, "esper_core.karn.profiles.HOST_KINDS"),
        ("BACKENDS", get_args(BackendName), "esper_core.tezzeret.config.BackendName"),
        ("BLUEPRINT_TIERS", tuple(t.value for t in BlueprintTier), "esper_core.contracts.BlueprintTier"),
        ("RECIPES", tuple(sorted(RECIPES)), "sorted(esper_core.run.recipes.RECIPES)"),
        ("GROWTH_PLANS", tuple(sorted(GROWTH_PLANS)), "sorted(esper_core.studies.growth.PLANS)"),
        ("DEPTH_GROWTH_PLANS", tuple(sorted(DEPTH_GROWTH_PLANS)), "sorted(esper_core.studies.depth_growth.PLANS)"),
        ("SIMIC_PLANS", tuple(sorted(SIMIC_PLANS)), "sorted(esper_core.studies.simic_train.PLANS)"),
        ("SHIPPED_POLICIES", tuple(sorted(SHIPPED)), "tuple(sorted(esper_core.tamiyo.shipped.SHIPPED))"),
        ("PINNABLE_POLICIES", pinnable_policies(), "esper_core.tamiyo.config.pinnable_policies()"),
        ("ZOO_FAMILIES", FAMILIES, "esper_core.zoo.FAMILIES"),
    ],
)
def test_choices_match_the_library(name: str, source: tuple[str, ...], where: str) -> None:
    assert getattr(choices, name) == source, f"esper_cli/choices.py: set {name} = {source!r}, as {where} is now"
