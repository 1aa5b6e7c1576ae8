"""What blueprints add: no safe blueprint is affine (so none folds into its neighbour), and the
parameter and FLOP counts match the modules."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from torch import nn

from esper_core.contracts import BlueprintTier
from esper_core.karn.capacity import (
    LINEAR_TOLERANCE,
    REFERENCE_PROFILES,
    affine_gap,
    randomize_,
    reference_profile,
    seed_capacity,
)
from esper_core.karn.catalog import Blueprint, KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import HOST_KINDS, ShapeProfile

CATALOG = default_catalog()
# The smallest shapes every blueprint of the kind accepts (token attention: F >= 8, F % 4 == 0).
SMALL = {"mlp": (8,), "seq": (2, 5), "cnn": (2, 3, 3), "tok": (5, 2)}
SAFE = [d.blueprint_id for d in CATALOG.list(tier=BlueprintTier.SAFE)]


def _small(blueprint_id: str) -> ShapeProfile:
    kind = CATALOG.get(blueprint_id).descriptor.host_kinds[0]
    return ShapeProfile(feature_shape=SMALL[kind], batch_max=8, tokens=kind == "tok")


def test_every_host_kind_has_safe_blueprints() -> None:
    kinds = {CATALOG.get(b).descriptor.host_kinds[0] for b in SAFE}
    assert kinds == set(HOST_KINDS)


@pytest.mark.parametrize("blueprint_id", SAFE)
def test_no_safe_blueprint_is_affine_in_its_input(blueprint_id: str) -> None:
    # With random weights, f(a x1 + b x2) != a f(x1) + b f(x2) - (a + b - 1) f(0): the delta is
    # not A x + c, so no choice of weights lets it fold into the linear layer or convolution next
    # to the slot. Checked at the smallest and at the default parameters.
    bounds = CATALOG.get(blueprint_id).descriptor.param_bounds
    for params in ({}, {n: b.low for n, b in bounds.items()}):
        capacity = seed_capacity(CATALOG, blueprint_id, _small(blueprint_id), params)
        assert not capacity.linear
        assert capacity.affine_gap > 1e3 * LINEAR_TOLERANCE, (params, capacity.affine_gap)


@pytest.mark.parametrize("blueprint_id", [b for b in CATALOG.ids if b not in SAFE])
def test_no_other_blueprint_is_affine_either(blueprint_id: str) -> None:
    assert not seed_capacity(CATALOG, blueprint_id, _small(blueprint_id)).linear


@pytest.mark.parametrize(
    "module",
    [
        # The linear low-rank adapter lowrank_adapter was before version 2: up(down(x)).
        nn.Sequential(nn.Linear(8, 2, bias=False), nn.Linear(2, 8)),
        # The linear pointwise adapter, in 1-D: two 1x1 convolutions.
        nn.Sequential(nn.Conv1d(2, 1, 1), nn.Conv1d(1, 2, 1)),
        # Affine maps other than matrix products are caught too.
        nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.Flatten(), nn.Unflatten(1, (3, 5)), nn.Conv1d(3, 2, 1)),
    ],
)
def test_the_probe_finds_affine_seeds(module: nn.Module) -> None:
    # Control: the probe is not vacuous, it measures a foldable seed as affine.
    shape = (8,) if isinstance(module[0], nn.Linear) else (2, 5)
    randomize_(module.double(), torch.Generator().manual_seed(0))
    assert affine_gap(module, shape, torch.Generator().manual_seed(1)) < 1e-12


def test_a_linear_blueprint_is_reported_linear() -> None:
    # The whole path (build, random weight draws, probe) on a catalogue holding the version 1
    # lowrank_adapter: what the test above must refuse for a safe blueprint.
    old = CATALOG.get("lowrank_adapter").descriptor.model_copy(update={"version": 1})

    def build(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
        width, rank = profile.feature_shape[0], int(params["rank"])
        return nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, width))

    capacity = seed_capacity(
        KarnCatalog([Blueprint(descriptor=old, build=build)]), "lowrank_adapter", _small("lowrank_adapter")
    )
    assert capacity.linear and capacity.affine_gap < 1e-12
    assert (capacity.parameters, capacity.flops_per_sample) == (8 * 4 + 4 * 8 + 8, 2 * 2 * 8 * 4)


def test_a_zero_output_counts_as_affine() -> None:
    # A fresh seed outputs zero: why seed_capacity measures with random weights.
    fresh = CATALOG.build("lowrank_adapter", ShapeProfile(feature_shape=(8,))).double()
    assert affine_gap(fresh, (8,), torch.Generator().manual_seed(1)) == 0.0


@pytest.mark.parametrize(
    ("blueprint_id", "shape", "params", "parameters", "flops"),
    [
        # down W x R (no bias), up R x W + W; 2 FLOPs per multiply-add of both projections.
        ("lowrank_adapter", (64,), {"rank": 4}, 64 * 4 + 4 * 64 + 64, 2 * (64 * 4 + 4 * 64)),
        # The same per position, L = 40 positions.
        ("seq_pointwise_adapter", (8, 40), {"rank": 4}, 8 * 4 + 4 * 8 + 8, 2 * 40 * (8 * 4 + 4 * 8)),
        # Two size-3 convolutions C -> C -> C per position.
        ("seq_conv_residual", (8, 40), {"expansion": 1}, 2 * (8 * 8 * 3 + 8), 2 * 2 * 40 * 8 * 8 * 3),
        ("conv_residual", (4, 6, 6), {"expansion": 2}, 4 * 8 * 9 + 8 + 8 * 4 * 9 + 4, 2 * 2 * 36 * 4 * 8 * 9),
    ],
)
def test_parameters_and_flops_per_sample(
    blueprint_id: str, shape: tuple[int, ...], params: dict[str, float], parameters: int, flops: int
) -> None:
    capacity = seed_capacity(CATALOG, blueprint_id, ShapeProfile(feature_shape=shape), params)
    assert (capacity.parameters, capacity.flops_per_sample) == (parameters, flops)
    built = CATALOG.build(blueprint_id, ShapeProfile(feature_shape=shape), params)
    assert capacity.parameters == sum(p.numel() for p in built.parameters())


def test_attention_flops_grow_with_the_square_of_the_positions() -> None:
    short, long = (seed_capacity(CATALOG, "seq_attention", ShapeProfile(feature_shape=(4, n))) for n in (16, 32))
    projections = 2 * 16 * (4 * 16 * 2 + 4 * 4 * 2)  # q, k (C -> K), v, out (C -> C) at L = 16
    assert short.flops_per_sample == projections + 2 * (16 * 16 * 16 + 16 * 16 * 4)  # q k^T, attn v
    assert long.flops_per_sample > 3 * short.flops_per_sample


def test_capacity_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    first = seed_capacity(CATALOG, "residual_mlp", ShapeProfile(feature_shape=(8,)))
    assert torch.equal(state, torch.random.get_rng_state())
    assert seed_capacity(CATALOG, "residual_mlp", ShapeProfile(feature_shape=(8,))) == first
    assert first.to_dict()["params"] == {"expansion": 2.0}


def test_capacity_validates_before_building() -> None:
    with pytest.raises(ValueError, match="outside its bounds"):
        seed_capacity(CATALOG, "lowrank_adapter", ShapeProfile(feature_shape=(8,)), {"rank": 99})
    with pytest.raises(ValueError, match="does not fit"):
        seed_capacity(CATALOG, "lowrank_adapter", ShapeProfile(feature_shape=(8, 4)))


def test_every_blueprint_supports_its_reference_profile() -> None:
    assert set(REFERENCE_PROFILES) == set(HOST_KINDS)
    for blueprint_id in CATALOG.ids:
        assert CATALOG.get(blueprint_id).supports(reference_profile(CATALOG.get(blueprint_id)))


def test_token_seeds_count_per_token_and_attend_across_positions() -> None:
    tokens = ShapeProfile(feature_shape=(40, 8), tokens=True)
    adapter = seed_capacity(CATALOG, "tok_adapter", tokens, {"rank": 4})
    # The same per token as lowrank_adapter per vector, L = 40 tokens.
    assert (adapter.parameters, adapter.flops_per_sample) == (8 * 4 + 4 * 8 + 8, 2 * 40 * (8 * 4 + 4 * 8))
    attention = seed_capacity(CATALOG, "tok_attention", tokens, {"key_dim": 4})
    projections = 2 * 40 * (8 * 4 * 2 + 8 * 8 * 2)  # q, k (D -> K), v, out (D -> D) per token
    assert attention.flops_per_sample == projections + 2 * (40 * 40 * 4 + 40 * 40 * 8)  # q k^T, attn v
    assert not attention.linear and not adapter.linear
