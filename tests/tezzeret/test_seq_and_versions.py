"""Tezzeret -> Urza -> Kasmina for a (C, L) sequence slot, and blueprint versions in Urza keys.

Real registry (SQLite in a temporary home), real compiles, real loads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from esper_core.contracts import ArtifactStatus
from esper_core.karn.catalog import Blueprint, KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.gates import g0_sanity
from esper_core.kasmina.loader import load_for_slot
from esper_core.pipeline import compile_job, find_published, job_for, publish_kernel
from esper_core.tezzeret.compiler import TezzeretConfig, compile_blueprint, environment_key
from esper_core.urza.service import Urza

FAST = TezzeretConfig(timing_iters=1, warmup_iters=0, prewarm_batches=(1, 8))
SEQ = ShapeProfile(feature_shape=(3, 7), batch_max=8)
VECTOR = ShapeProfile(feature_shape=(8,), batch_max=8)


@pytest.fixture
def urza(tmp_path: Path) -> Iterator[Urza]:
    registry = Urza.open(tmp_path / "home")
    yield registry
    registry.close()


@pytest.mark.parametrize("blueprint_id", ["seq_conv_residual", "seq_pointwise_adapter"])
def test_a_seq_kernel_loads_passes_g0_and_trains_inside_a_conv1d_host(urza: Urza, blueprint_id: str) -> None:
    catalog = default_catalog()
    published = publish_kernel(
        urza, catalog, compile_job(catalog, job_for(catalog, blueprint_id, SEQ.name), "cpu", config=FAST)
    )
    assert published.status is ArtifactStatus.ACTIVE and published.guard.feature_shape == (3, 7)
    loaded = load_for_slot(urza, blueprint_id, SEQ, catalog=catalog)
    verdict = g0_sanity(catalog, blueprint_id=blueprint_id, params=published.params, guard=published.guard, profile=SEQ)
    assert verdict.passed, verdict.reason

    seed = loaded.module
    conv = nn.Conv1d(1, 3, 3, padding=1)
    x = torch.randn(5, 1, 7)  # (B, 1, L) signals
    h = conv(x)  # (B, C, L): the slot's activation
    torch.testing.assert_close(h + seed(h), h)  # germinating does not change the host's function
    (h + seed(h)).pow(2).mean().backward()
    grads = [p.grad for p in seed.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads), "the seed must receive gradients"


def _linear_v1_catalog() -> KarnCatalog:
    """The catalogue as it was: lowrank_adapter version 1, the linear up(down(x))."""
    old = default_catalog().get("lowrank_adapter").descriptor.model_copy(update={"version": 1})

    def build(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
        width, rank = profile.feature_shape[0], int(params["rank"])
        up = nn.Linear(rank, width)
        nn.init.zeros_(up.weight)
        nn.init.zeros_(up.bias)
        return nn.Sequential(nn.Linear(width, rank, bias=False), up)

    return KarnCatalog([Blueprint(descriptor=old, build=build)])


def test_a_registry_of_the_linear_version_is_not_served_for_the_new_one(urza: Urza) -> None:
    old_catalog, catalog = _linear_v1_catalog(), default_catalog()
    urza.register_blueprint(old_catalog.get("lowrank_adapter").descriptor)
    stale = publish_kernel(urza, old_catalog, compile_blueprint(old_catalog, "lowrank_adapter", VECTOR, config=FAST))
    assert stale.params == {"rank": 4.0}
    urza.register_blueprint(catalog.get("lowrank_adapter").descriptor)

    job = job_for(catalog, "lowrank_adapter", VECTOR.name)
    # The compile cache does not take the linear kernel for the new blueprint ...
    assert find_published(urza, job, "cpu") is None
    resolved = catalog.resolve_params("lowrank_adapter")
    assert urza.store.find_active("lowrank_adapter", VECTOR.name, environment_key("cpu"), resolved) is None
    # ... so the catalogue compiles the non-linear one, whose key differs and which is newer.
    fresh = publish_kernel(urza, catalog, compile_job(catalog, job, "cpu", config=FAST))
    assert fresh.params == resolved and fresh.sha256 != stale.sha256
    assert find_published(urza, job, "cpu") == fresh
    assert load_for_slot(urza, "lowrank_adapter", VECTOR, catalog=catalog).artifact == fresh
