"""Karn catalogue: contents, tiers, supported profiles, parameter validation, neutral fresh seeds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, BlueprintTier
from esper_core.karn.catalog import (
    VERSION_PARAM,
    Blueprint,
    InvalidBlueprintParamsError,
    KarnCatalog,
    UnknownBlueprintError,
)
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import HOST_KINDS, ShapeProfile
from esper_core.karn.rules import ProfileRule, UnsupportedProfileError
from esper_core.urza import params_key

PROFILE = ShapeProfile(feature_shape=(16,), batch_max=64)
SEQ_PROFILE = ShapeProfile(feature_shape=(4, 10), batch_max=64)
MAP_PROFILE = ShapeProfile(feature_shape=(8, 6, 6), batch_max=64)
TOK_PROFILE = ShapeProfile(feature_shape=(10, 4), batch_max=64, tokens=True)
PROFILES = {"mlp": PROFILE, "seq": SEQ_PROFILE, "cnn": MAP_PROFILE, "tok": TOK_PROFILE}
CATALOG = default_catalog()


def _profile_for(blueprint_id: str) -> ShapeProfile:
    return PROFILES[CATALOG.get(blueprint_id).descriptor.host_kinds[0]]


def test_catalogue_covers_every_tier_for_every_host_kind() -> None:
    descriptors = CATALOG.list()
    assert len(descriptors) == 26
    for kind in HOST_KINDS:
        assert {d.tier for d in CATALOG.list(host_kind=kind)} == set(BlueprintTier), kind
    assert {"residual_mlp", "lowrank_adapter", "norm_gate", "glu_block"} <= set(CATALOG.ids)
    for d in descriptors:
        assert 0.0 <= d.risk <= 1.0
        assert d.host_kinds in (("mlp",), ("seq",), ("cnn",), ("tok",))
        assert len(d.description) > 40
        assert CATALOG.get(d.blueprint_id).rule is not None, "every shipped blueprint states its profiles"


def test_risk_bands_follow_the_tiers() -> None:
    bands = {
        BlueprintTier.SAFE: (0.0, 0.25),
        BlueprintTier.EXPERIMENTAL: (0.3, 0.6),
        BlueprintTier.HIGH_RISK: (0.75, 1),
    }
    for d in CATALOG.list():
        low, high = bands[d.tier]
        assert low <= d.risk <= high, d.blueprint_id


def test_high_risk_blueprints_are_riskier_than_safe_ones() -> None:
    safe = max(d.risk for d in CATALOG.list(tier=BlueprintTier.SAFE))
    risky = min(d.risk for d in CATALOG.list(tier=BlueprintTier.HIGH_RISK))
    assert risky > safe


def test_list_filters() -> None:
    assert [d.blueprint_id for d in CATALOG.list(tier=BlueprintTier.EXPERIMENTAL, host_kind="mlp")] == [
        "norm_gate",
        "glu_block",
        "token_attention",
    ]
    assert [d.blueprint_id for d in CATALOG.list(tier=BlueprintTier.SAFE, host_kind="seq")] == [
        "seq_conv_residual",
        "seq_depthwise_separable",
        "seq_pointwise_adapter",
    ]
    assert [d.blueprint_id for d in CATALOG.list(tier=BlueprintTier.HIGH_RISK)] == [
        "wide_mlp",
        "wide_conv",
        "seq_wide_conv",
        "tok_wide_mlp",
    ]
    assert sum(len(CATALOG.list(host_kind=kind)) for kind in HOST_KINDS) == len(CATALOG)
    assert CATALOG.list(host_kind="tensor") == []


def test_default_catalog_is_cached() -> None:
    assert default_catalog() is CATALOG


def test_unknown_blueprint_lists_known_ids() -> None:
    with pytest.raises(UnknownBlueprintError, match=r"known blueprints are .*residual_mlp") as info:
        CATALOG.get("resnet9000")
    assert isinstance(info.value, ValueError)


def test_resolve_params_fills_defaults_and_accepts_overrides() -> None:
    assert CATALOG.resolve_params("residual_mlp") == {"expansion": 2.0}
    assert CATALOG.resolve_params("bottleneck_mlp", {"reduction": 8}) == {"reduction": 8.0}
    assert CATALOG.resolve_params("norm_gate") == {}


def test_a_changed_blueprint_carries_its_version_in_its_params() -> None:
    # lowrank_adapter and pointwise_adapter became non-linear (version 2) under the same ids.
    for blueprint_id in ("lowrank_adapter", "pointwise_adapter"):
        assert CATALOG.get(blueprint_id).descriptor.version == 2
        resolved = CATALOG.resolve_params(blueprint_id, {"rank": 8})
        assert resolved == {VERSION_PARAM: 2.0, "rank": 8.0}
        # An artifact of the linear version 1 was keyed without the version: another Urza key.
        assert params_key(resolved) != params_key({"rank": 8.0})
        # The artifact's own params resolve again (G0 does this), unchanged.
        assert CATALOG.resolve_params(blueprint_id, resolved) == resolved
    # Unchanged blueprints keep the keys of artifacts compiled before versioning existed.
    assert CATALOG.get("residual_mlp").descriptor.version == 1
    assert VERSION_PARAM not in CATALOG.resolve_params("residual_mlp")


def test_params_of_another_blueprint_version_are_refused() -> None:
    with pytest.raises(
        InvalidBlueprintParamsError, match=r"version 1 of blueprint 'lowrank_adapter'.*version 2"
    ) as info:
        CATALOG.resolve_params("lowrank_adapter", {VERSION_PARAM: 1, "rank": 4})
    assert "esper catalog compile lowrank_adapter" in str(info.value)


def test_the_version_parameter_name_is_reserved() -> None:
    entry = CATALOG.get("residual_mlp")
    bounds = {VERSION_PARAM: entry.descriptor.param_bounds["expansion"]}
    with pytest.raises(ValueError, match="reserved"):
        Blueprint(descriptor=entry.descriptor.model_copy(update={"param_bounds": bounds}), build=entry.build)


def test_descriptors_stored_before_versions_still_load() -> None:
    stored = CATALOG.get("residual_mlp").descriptor.model_dump(mode="json")
    del stored["version"]
    assert BlueprintDescriptor.model_validate(stored).version == 1


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
    profile = _profile_for(blueprint_id)
    # The smallest and the largest parameters exercise the extreme shapes the bounds allow.
    for params in ({}, {n: b.low for n, b in bounds.items()}, {n: b.high for n, b in bounds.items()}):
        seed = CATALOG.build(blueprint_id, profile, params)
        x = torch.randn(5, *profile.feature_shape)
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


@pytest.mark.parametrize("blueprint_id", CATALOG.ids)
def test_every_blueprint_refuses_the_other_host_kinds(blueprint_id: str) -> None:
    tensor = ShapeProfile(feature_shape=(2, 4, 6, 6))
    assert tensor.kind == "tensor"
    for wrong in [p for p in PROFILES.values() if p != _profile_for(blueprint_id)] + [tensor]:
        with pytest.raises(
            UnsupportedProfileError, match=rf"profile {wrong.name} .* does not fit .*esper catalog list"
        ):
            CATALOG.build(blueprint_id, wrong)
        assert not CATALOG.get(blueprint_id).supports(wrong)
    assert CATALOG.get(blueprint_id).supports(_profile_for(blueprint_id))


@pytest.mark.parametrize(
    ("blueprint_id", "profile", "fragment"),
    [
        ("token_attention", ShapeProfile(feature_shape=(18,)), "not a multiple of 4"),
        ("token_attention", ShapeProfile(feature_shape=(4,)), "4 features < 8"),
        ("spatial_attention", ShapeProfile(feature_shape=(4, 64, 64)), "4096 positions > 1024"),
        ("squeeze_excitation", ShapeProfile(feature_shape=(1, 8, 8)), "1 features < 2"),
        ("seq_attention", ShapeProfile(feature_shape=(4, 2048)), "2048 positions > 1024"),
        ("seq_squeeze_excitation", ShapeProfile(feature_shape=(1, 40)), "1 features < 2"),
        ("seq_conv_residual", ShapeProfile(feature_shape=(8, 8, 1)), "'cnn' profile of rank 3, not 'seq'"),
    ],
)
def test_profile_rules_name_what_does_not_fit(blueprint_id: str, profile: ShapeProfile, fragment: str) -> None:
    with pytest.raises(UnsupportedProfileError, match=fragment):
        CATALOG.check_profile(blueprint_id, profile)


def test_profile_rule_descriptions() -> None:
    assert CATALOG.get("residual_mlp").describe_profiles() == "(F,) vectors; float32, float16, bfloat16"
    assert CATALOG.get("spatial_attention").describe_profiles() == (
        "(C, H, W) maps, C >= 2, H*W <= 1024; float32, float16, bfloat16"
    )
    assert CATALOG.get("token_attention").describe_profiles().startswith("(F,) vectors, F >= 8, F % 4 == 0")
    assert CATALOG.get("seq_attention").describe_profiles().startswith("(C, L) sequences, C >= 2, L <= 1024;")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "tensor"}, "kind must be one of"),
        ({"kind": "mlp", "min_features": 0}, "must be >= 1"),
        ({"kind": "mlp", "max_positions": 4}, "seq, tok and cnn rules only"),
        ({"kind": "seq", "max_positions": 0}, "must be >= 1"),
        ({"kind": "cnn", "dtypes": ("float64",)}, "subset"),
    ],
)
def test_profile_rule_validation(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ProfileRule(**kwargs)  # type: ignore[arg-type]


def test_rule_and_host_kinds_must_agree() -> None:
    entry = CATALOG.get("residual_mlp")
    with pytest.raises(ValueError, match="make them agree"):
        Blueprint(descriptor=entry.descriptor, build=entry.build, rule=ProfileRule(kind="cnn"))


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
