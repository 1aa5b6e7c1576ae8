"""Karn catalogue: contents, parameter validation, and the neutrality of fresh seeds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, BlueprintTier
from esper_core.karn.catalog import (
    Blueprint,
    InvalidBlueprintParamsError,
    KarnCatalog,
    UnknownBlueprintError,
    default_catalog,
)
from esper_core.karn.profiles import ShapeProfile

PROFILE = ShapeProfile(feature_shape=(16,), batch_max=64)
CATALOG = default_catalog()


def test_catalogue_covers_every_tier() -> None:
    descriptors = CATALOG.list()
    assert len(descriptors) >= 5
    assert {d.tier for d in descriptors} == set(BlueprintTier)
    assert {"residual_mlp", "lowrank_adapter", "norm_gate", "glu_block"} <= set(CATALOG.ids)
    for d in descriptors:
        assert 0.0 <= d.risk <= 1.0
        assert d.host_kinds == ("mlp",)
        assert len(d.description) > 40


def test_high_risk_blueprints_are_riskier_than_safe_ones() -> None:
    safe = max(d.risk for d in CATALOG.list(tier=BlueprintTier.SAFE))
    risky = min(d.risk for d in CATALOG.list(tier=BlueprintTier.HIGH_RISK))
    assert risky > safe


def test_list_filters() -> None:
    assert [d.blueprint_id for d in CATALOG.list(tier=BlueprintTier.EXPERIMENTAL)] == [
        "norm_gate",
        "glu_block",
    ]
    assert CATALOG.list(host_kind="cnn") == []
    assert len(CATALOG.list(host_kind="mlp")) == len(CATALOG)


def test_default_catalog_is_cached() -> None:
    assert default_catalog() is CATALOG


def test_unknown_blueprint_lists_known_ids() -> None:
    with pytest.raises(UnknownBlueprintError, match=r"known blueprints are .*residual_mlp") as info:
        CATALOG.get("resnet9000")
    assert isinstance(info.value, ValueError)


def test_resolve_params_fills_defaults_and_accepts_overrides() -> None:
    assert CATALOG.resolve_params("residual_mlp") == {"expansion": 2.0}
    assert CATALOG.resolve_params("lowrank_adapter", {"rank": 8}) == {"rank": 8.0}
    assert CATALOG.resolve_params("norm_gate") == {}


@pytest.mark.parametrize(
    ("blueprint_id", "overrides", "fragments"),
    [
        ("residual_mlp", {"expansion": 9}, ["'expansion'", "[1, 4]", "pick a value"]),
        ("residual_mlp", {"expansion": 0}, ["outside its bounds"]),
        ("lowrank_adapter", {"rank": 2.5}, ["'rank'", "must be an integer", "round it"]),
        (
            "residual_mlp",
            {"width": 3},
            ["no parameter(s) ['width']", "parameters are ['expansion']"],
        ),
        ("norm_gate", {"expansion": 2}, ["parameters are none"]),
        ("residual_mlp", {"expansion": float("nan")}, ["outside its bounds"]),
        ("residual_mlp", {"expansion": "2"}, ["must be a number"]),
        ("residual_mlp", {"expansion": True}, ["must be a number"]),
    ],
)
def test_invalid_params_explain_the_fix(blueprint_id: str, overrides: dict[str, object], fragments: list[str]) -> None:
    with pytest.raises(InvalidBlueprintParamsError) as info:
        CATALOG.resolve_params(blueprint_id, overrides)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("blueprint_id", CATALOG.ids)
def test_every_blueprint_maps_shape_to_itself_and_starts_neutral(blueprint_id: str) -> None:
    bounds = CATALOG.get(blueprint_id).descriptor.param_bounds
    # The largest parameters exercise the biggest shapes the bounds allow.
    for params in ({}, {name: b.high for name, b in bounds.items()}):
        seed = CATALOG.build(blueprint_id, PROFILE, params)
        x = torch.randn(5, 16)
        delta = seed(x)
        assert delta.shape == x.shape
        assert torch.count_nonzero(delta) == 0, "a fresh seed must not perturb the host"
        # Neutral, yet trainable: the zero-initialised last layer still receives gradients.
        (delta - x).pow(2).sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in seed.parameters())


def test_build_casts_to_the_profile_dtype() -> None:
    profile = ShapeProfile(feature_shape=(8,), dtype="bfloat16")
    seed = CATALOG.build("residual_mlp", profile)
    assert {p.dtype for p in seed.parameters()} == {torch.bfloat16}


def test_mlp_blueprints_reject_non_flat_profiles() -> None:
    with pytest.raises(ValueError, match="needs a 1-D feature shape"):
        CATALOG.build("residual_mlp", ShapeProfile(feature_shape=(4, 8, 8)))


def test_duplicate_ids_are_rejected() -> None:
    entry = CATALOG.get("norm_gate")
    with pytest.raises(ValueError, match="appears twice"):
        KarnCatalog([entry, entry])


def test_custom_catalogue() -> None:
    descriptor = BlueprintDescriptor(
        blueprint_id="identity_zero",
        name="Zero",
        tier=BlueprintTier.SAFE,
        host_kinds=("mlp",),
        description="A seed that always outputs zero.",
        risk=0.0,
    )
    catalog = KarnCatalog([Blueprint(descriptor=descriptor, build=lambda p, q: nn.Identity())])
    assert "identity_zero" in catalog
    assert catalog.list() == [descriptor]
