"""ShapeProfile: validation and the name <-> profile round trip."""

from __future__ import annotations

import pytest
import torch

from esper_core.karn.profiles import ShapeProfile


@pytest.mark.parametrize(
    ("profile", "name"),
    [
        (ShapeProfile(feature_shape=(128,)), "f128-b512"),
        (ShapeProfile(feature_shape=(16, 8, 8)), "f16x8x8-b512"),
        (ShapeProfile(feature_shape=(8, 40), batch_max=64), "f8x40-b64"),
        (ShapeProfile(feature_shape=(64,), batch_max=32, dtype="bfloat16"), "f64-b32-bfloat16"),
    ],
)
def test_name_round_trips(profile: ShapeProfile, name: str) -> None:
    assert profile.name == name
    assert ShapeProfile.parse(name) == profile


@pytest.mark.parametrize(
    ("shape", "kind"),
    [((128,), "mlp"), ((25, 20), "seq"), ((16, 8, 8), "cnn"), ((2, 3, 4, 5), "tensor")],
)
def test_kind_follows_the_rank(shape: tuple[int, ...], kind: str) -> None:
    profile = ShapeProfile(feature_shape=shape)
    assert profile.kind == kind
    assert ShapeProfile.parse(profile.name).kind == kind


def test_torch_dtype() -> None:
    assert ShapeProfile(feature_shape=(4,), dtype="float16").torch_dtype is torch.float16


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"feature_shape": ()}, "non-empty tuple"),
        ({"feature_shape": [16]}, "non-empty tuple"),
        ({"feature_shape": (16, 0)}, "positive ints"),
        ({"feature_shape": (16,), "batch_max": 1}, "batch_max must be an int >= 2"),
        ({"feature_shape": (16,), "dtype": "float64"}, "use one of"),
    ],
)
def test_invalid_profiles_say_how_to_fix(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ShapeProfile(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "128-b512", "f128", "f128-b0", "f0-b8", "f8-b8-int8", "f8-b8-float32"])
def test_parse_rejects_bad_names(name: str) -> None:
    with pytest.raises(ValueError):
        ShapeProfile.parse(name)
