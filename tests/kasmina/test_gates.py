"""Each gate checks real quantities: passing and failing inputs for G1-G5 and the lifecycle table."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from esper_core.contracts import BlendSchedule, SeedStage
from esper_core.kasmina import gates
from esper_core.kasmina.lifecycle import IllegalTransitionError, blend_alpha, check_transition

CFG = gates.GateConfig()


def test_g1_needs_finite_nonzero_gradients() -> None:
    assert gates.g1_gradient_health(0.3, config=CFG).passed
    assert not gates.g1_gradient_health(0.0, config=CFG).passed
    nan = gates.g1_gradient_health(math.nan, config=CFG)
    assert not nan.passed and "non-finite" in nan.reason


def test_g2_rejects_rising_or_unbounded_seed_loss() -> None:
    assert gates.g2_stability([0.9, 0.8], host_val_loss=0.85, config=CFG).passed
    rising = gates.g2_stability([0.5, 0.8], host_val_loss=0.85, config=CFG)
    assert not rising.passed and "rose" in rising.reason
    unbounded = gates.g2_stability([5.0], host_val_loss=1.0, config=CFG)
    assert not unbounded.passed and "host loss" in unbounded.reason
    assert not gates.g2_stability([], host_val_loss=1.0, config=CFG).passed


def test_g3_checks_shape_dtype_and_isolation() -> None:
    ok = dict(input_shape=(4, 8), output_shape=(4, 8), input_dtype=torch.float32, output_dtype=torch.float32)
    assert gates.g3_interface(**ok, isolation_rel_diff=0.0, config=CFG).passed
    leak = gates.g3_interface(**ok, isolation_rel_diff=1e-3, config=CFG)
    assert not leak.passed and "isolation violated" in leak.reason
    # CUDA's last-bit differences between two identical backward passes (2026-11-28 lease: ~1e-7).
    assert gates.g3_interface(**ok, isolation_rel_diff=1e-7, config=CFG).passed
    bad_shape = dict(ok, output_shape=(4, 9))
    assert not gates.g3_interface(**bad_shape, isolation_rel_diff=0.0, config=CFG).passed


def test_g4_compares_with_and_without_seed() -> None:
    assert gates.g4_system_impact(val_loss_with=0.5, val_loss_without=0.6, config=CFG).passed
    worse = gates.g4_system_impact(val_loss_with=0.7, val_loss_without=0.6, config=CFG)
    assert not worse.passed and worse.measured["val_loss_with_seed"] == 0.7
    tolerant = gates.GateConfig(impact_tolerance=0.2)
    assert gates.g4_system_impact(val_loss_with=0.7, val_loss_without=0.6, config=tolerant).passed


def test_g5_lists_what_is_left_in_the_slot() -> None:
    assert gates.g5_reset(has_seed=False, alpha=0.0, optimizer_params=0).passed
    dirty = gates.g5_reset(has_seed=True, alpha=0.5, optimizer_params=10)
    assert not dirty.passed
    assert "seed module" in dirty.reason and "alpha" in dirty.reason and "optimizer" in dirty.reason


def test_gate_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_loss_ratio must be > 1"):
        gates.GateConfig(max_loss_ratio=1.0)


def test_lifecycle_table() -> None:
    check_transition("s", SeedStage.DORMANT, SeedStage.GERMINATED)
    with pytest.raises(
        IllegalTransitionError, match="cannot go from dormant to blending; allowed from dormant: germinated"
    ):
        check_transition("s", SeedStage.DORMANT, SeedStage.BLENDING)
    # A fossilized seed is never culled; only a width slot, its seed merged, goes back to dormant.
    with pytest.raises(IllegalTransitionError, match="allowed from fossilized: dormant"):
        check_transition("s", SeedStage.FOSSILIZED, SeedStage.CULLED)


@pytest.mark.parametrize("schedule", list(BlendSchedule))
def test_blend_alpha_rises_monotonically_to_one(schedule: BlendSchedule) -> None:
    alphas = [blend_alpha(schedule, k, 4) for k in range(5)]
    assert alphas[0] == 0.0 and alphas[-1] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(alphas))
