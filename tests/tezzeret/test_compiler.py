"""Tezzeret (export backend): export, numerics, guards, timing, verdicts, determinism, fallback."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from esper_core.contracts import ArtifactKind, ArtifactStatus, BlueprintDescriptor, BlueprintTier
from esper_core.karn.catalog import Blueprint, KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.tezzeret.compiler import (
    Backend,
    CompiledKernel,
    TezzeretConfig,
    compile_blueprint,
    environment_key,
)
from esper_core.tezzeret.formats import EAGER_FORMAT, decode_eager, decode_exported

PROFILE = ShapeProfile(feature_shape=(16,), batch_max=64)
FAST = TezzeretConfig(timing_iters=5, warmup_iters=1)


@pytest.fixture(scope="module")
def kernel() -> CompiledKernel:
    return compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, {"rank": 4}, config=FAST)


class DataDependent(nn.Module):
    """Branches on a tensor value: torch.export cannot trace this without a guard."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class Drifting(nn.Module):
    """Python-side state changes the output on every call: the export bakes the first value in,
    so the exported program (correctly traced) differs from eager numerically."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x) * self.calls


class WithDropout(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(x))


def _descriptor(blueprint_id: str) -> BlueprintDescriptor:
    return BlueprintDescriptor(
        blueprint_id=blueprint_id,
        name=blueprint_id,
        tier=BlueprintTier.EXPERIMENTAL,
        host_kinds=("mlp",),
        description="test blueprint",
        risk=0.5,
    )


def _build_data_dependent(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
    return DataDependent(profile.feature_shape[0])


def _build_with_dropout(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
    return WithDropout(profile.feature_shape[0])


def _build_drifting(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
    return Drifting(profile.feature_shape[0])


TEST_CATALOG = KarnCatalog(
    [
        Blueprint(descriptor=_descriptor("data_dependent"), build=_build_data_dependent),
        Blueprint(descriptor=_descriptor("with_dropout"), build=_build_with_dropout),
        Blueprint(descriptor=_descriptor("drifting"), build=_build_drifting),
    ]
)


def test_exported_artifact_descriptor(kernel: CompiledKernel) -> None:
    artifact = kernel.artifact
    assert artifact.kind is ArtifactKind.EXPORTED
    assert not artifact.fallback and artifact.fallback_reason is None
    assert artifact.status is ArtifactStatus.ACTIVE
    assert artifact.sha256 == hashlib.sha256(kernel.blob).hexdigest()
    assert artifact.size_bytes == len(kernel.blob)
    assert artifact.shape_profile == "f16-b64"
    assert artifact.params == {"blueprint_version": 2.0, "rank": 4.0}
    assert artifact.environment == environment_key("cpu")
    assert artifact.compile_ms > 0
    assert artifact.guard.feature_shape == (16,)
    assert artifact.guard.output_feature_shape == (16,)
    assert (artifact.guard.batch_min, artifact.guard.batch_max) == (1, 64)
    assert artifact.guard.dtype == "float32"
    assert set(artifact.latency) == {"b1", "b8", "b64"}
    for stats in artifact.latency.values():
        assert stats.samples == FAST.timing_iters
        assert 0 < stats.p50_ms <= stats.p95_ms <= stats.max_ms


def test_reloaded_program_enforces_its_guards(kernel: CompiledKernel) -> None:
    module = decode_exported(kernel.blob).module()
    assert module(torch.randn(1, 16)).shape == (1, 16)
    assert module(torch.randn(64, 16)).shape == (64, 16)
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        module(torch.randn(4, 17))
    with pytest.raises((AssertionError, RuntimeError, ValueError)):
        module(torch.randn(65, 16))


def test_compile_is_deterministic_and_leaves_the_global_rng_alone(kernel: CompiledKernel) -> None:
    state = torch.random.get_rng_state()
    again = compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, {"rank": 4}, config=FAST)
    assert torch.equal(state, torch.random.get_rng_state())
    assert again.artifact.sha256 == kernel.artifact.sha256
    other = compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, {"rank": 5}, config=FAST)
    assert other.artifact.sha256 != kernel.artifact.sha256


def test_non_exportable_module_falls_back_to_eager(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="esper_core.tezzeret.compiler"):
        kernel = compile_blueprint(TEST_CATALOG, "data_dependent", PROFILE, config=FAST)
    artifact = kernel.artifact
    assert artifact.kind is ArtifactKind.EAGER and artifact.fallback
    assert artifact.fallback_reason is not None
    assert "data-dependent" in artifact.fallback_reason
    assert len(artifact.fallback_reason) <= 500
    assert set(artifact.latency) == {"b1", "b8", "b64"}
    assert artifact.guard.output_feature_shape == (16,)
    ours = [r for r in caplog.records if r.name == "esper_core.tezzeret.compiler"]
    assert len(ours) == 1 and "data_dependent" in ours[0].getMessage()

    payload = decode_eager(kernel.blob)
    assert payload.blueprint_id == "data_dependent"
    assert payload.profile == PROFILE.name
    assert set(payload.state_dict) == {"fc.weight", "fc.bias"}


def test_mode_dependent_layers_fall_back_with_a_reason() -> None:
    kernel = compile_blueprint(TEST_CATALOG, "with_dropout", PROFILE, config=FAST)
    assert kernel.artifact.fallback
    assert kernel.artifact.fallback_reason is not None
    assert kernel.artifact.fallback_reason.startswith("ModeDependentModuleError")
    assert "Dropout" in kernel.artifact.fallback_reason


def test_prewarm_batches_are_clipped_to_the_profile() -> None:
    config = TezzeretConfig(prewarm_batches=(1, 8, 64, 1000))
    assert config.batch_sizes(ShapeProfile(feature_shape=(4,), batch_max=32)) == (1, 8, 32)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"prewarm_batches": ()}, "prewarm_batches"),
        ({"prewarm_batches": (0, 8)}, "positive ints"),
        ({"timing_iters": 0}, "timing_iters"),
        ({"warmup_iters": -1}, "warmup_iters"),
        ({"rtol": -1.0}, "rtol and atol"),
        ({"latency_budget_ms": 0.0}, "latency_budget_ms"),
        ({"backend": "tvm"}, "backend must be one of"),
    ],
)
def test_config_validation(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        TezzeretConfig(**kwargs)  # type: ignore[arg-type]


def test_environment_key() -> None:
    key = environment_key(torch.device("cpu"))
    assert key.device_kind == "cpu" and key.compiler == "torch.export"
    assert "+" not in key.torch_version
    assert environment_key("cpu", Backend.AOT_INDUCTOR).compiler == "aot_inductor"
    assert environment_key("cpu", "aot_inductor") != key
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        environment_key("meta")
    with pytest.raises(ValueError, match="backend must be one of"):
        environment_key("cpu", "tvm")


def test_user_errors_are_not_swallowed_by_the_fallback() -> None:
    with pytest.raises(ValueError, match="outside its bounds"):
        compile_blueprint(default_catalog(), "residual_mlp", PROFILE, {"expansion": 99}, config=FAST)
    with pytest.raises(ValueError, match="does not fit"):
        compile_blueprint(default_catalog(), "residual_mlp", ShapeProfile(feature_shape=(2, 4)), config=FAST)


def test_eager_format_tag() -> None:
    assert EAGER_FORMAT == "esper-eager-v1"


def test_concurrent_compiles_in_threads_both_export() -> None:
    # Regression: Prefect maps tasks onto threads, and two unguarded torch.export calls on
    # concurrent threads both failed and fell back to eager.
    profile = ShapeProfile(feature_shape=(16,), batch_max=64)
    with ThreadPoolExecutor(max_workers=2) as pool:
        kernels = list(
            pool.map(lambda bp: compile_blueprint(default_catalog(), bp, profile), ["residual_mlp", "lowrank_adapter"])
        )
    assert [k.artifact.kind for k in kernels] == [ArtifactKind.EXPORTED, ArtifactKind.EXPORTED], [
        k.artifact.fallback_reason for k in kernels
    ]


def test_a_numeric_mismatch_is_quarantined_with_the_reason() -> None:
    kernel = compile_blueprint(TEST_CATALOG, "drifting", PROFILE, config=FAST)
    artifact = kernel.artifact
    assert artifact.kind is ArtifactKind.EXPORTED and not artifact.fallback
    assert artifact.status is ArtifactStatus.QUARANTINED
    assert artifact.status_reason is not None
    assert "exported program" in artifact.status_reason and "differs from eager" in artifact.status_reason


def test_missing_an_enforced_latency_budget_is_quarantined_with_the_reason() -> None:
    config = TezzeretConfig(timing_iters=3, warmup_iters=0, latency_budget_ms=1e-9, enforce_latency_budget=True)
    artifact = compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, config=config).artifact
    assert artifact.status is ArtifactStatus.QUARANTINED
    assert artifact.status_reason is not None
    assert artifact.status_reason.startswith("latency budget 1e-09 ms exceeded: b1 p50")


def test_by_default_a_missed_latency_budget_is_reported_not_acted_on(caplog: pytest.LogCaptureFixture) -> None:
    config = TezzeretConfig(timing_iters=3, warmup_iters=0, latency_budget_ms=1e-9)
    with caplog.at_level("WARNING", logger="esper_core.tezzeret.compiler"):
        artifact = compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, config=config).artifact
    assert artifact.status is ArtifactStatus.ACTIVE and artifact.latency["b1"].p50_ms > 1e-9
    assert any("latency budget 1e-09 ms exceeded" in r.message for r in caplog.records)


def test_high_risk_blueprints_compile_but_are_quarantined() -> None:
    artifact = compile_blueprint(default_catalog(), "wide_mlp", PROFILE, {"expansion": 1}, config=FAST).artifact
    assert artifact.kind is ArtifactKind.EXPORTED
    assert artifact.status is ArtifactStatus.QUARANTINED
    assert artifact.status_reason is not None and "quarantine-only" in artifact.status_reason


@pytest.mark.parametrize("blueprint_id", [d.blueprint_id for d in default_catalog().list(host_kind="cnn")])
def test_every_conv_blueprint_exports_for_a_feature_map(blueprint_id: str) -> None:
    profile = ShapeProfile(feature_shape=(4, 6, 6), batch_max=16)
    config = TezzeretConfig(timing_iters=1, warmup_iters=0, prewarm_batches=(1, 16))
    artifact = compile_blueprint(default_catalog(), blueprint_id, profile, config=config).artifact
    assert artifact.kind is ArtifactKind.EXPORTED, artifact.fallback_reason
    assert artifact.guard.feature_shape == artifact.guard.output_feature_shape == (4, 6, 6)


@pytest.mark.parametrize("blueprint_id", [d.blueprint_id for d in default_catalog().list(host_kind="seq")])
def test_every_seq_blueprint_exports_for_a_sequence(blueprint_id: str) -> None:
    profile = ShapeProfile(feature_shape=(2, 5), batch_max=16)
    config = TezzeretConfig(timing_iters=1, warmup_iters=0, prewarm_batches=(1, 16))
    kernel = compile_blueprint(default_catalog(), blueprint_id, profile, config=config)
    artifact = kernel.artifact
    assert artifact.kind is ArtifactKind.EXPORTED, artifact.fallback_reason
    assert artifact.guard.feature_shape == artifact.guard.output_feature_shape == (2, 5)
    # The batch dimension is dynamic in [1, 16]; channels and length are guarded.
    module = decode_exported(kernel.blob).module()
    assert module(torch.randn(3, 2, 5)).shape == (3, 2, 5)
    for wrong in (torch.randn(3, 2, 6), torch.randn(3, 3, 5), torch.randn(17, 2, 5)):
        with pytest.raises((AssertionError, RuntimeError, ValueError)):
            module(wrong)
