"""Kasmina's loader: guard checks, and loading exported and eager artifacts as trainable seeds."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping

import pytest
import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, BlueprintTier, GuardSchema
from esper_core.karn.catalog import Blueprint, KarnCatalog, default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import (
    EnvironmentMismatchError,
    GuardMismatchError,
    check_guard,
    load_kernel,
)
from esper_core.tezzeret.compiler import (
    CompiledKernel,
    TezzeretConfig,
    build_deterministic,
    compile_blueprint,
)
from tests.helpers.runif import requires_cuda

PROFILE = ShapeProfile(feature_shape=(16,), batch_max=64)
FAST = TezzeretConfig(timing_iters=3, warmup_iters=1)
GUARD = GuardSchema(feature_shape=(16,), output_feature_shape=(16,), dtype="float32", batch_max=64)


class Branchy(nn.Module):
    """Data-dependent control flow: cannot be exported, so Tezzeret falls back to eager."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


def _build_branchy(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
    return Branchy(profile.feature_shape[0])


BRANCHY_CATALOG = KarnCatalog(
    [
        Blueprint(
            descriptor=BlueprintDescriptor(
                blueprint_id="branchy",
                name="Branchy",
                tier=BlueprintTier.EXPERIMENTAL,
                host_kinds=("mlp",),
                description="not exportable",
                risk=0.5,
            ),
            build=_build_branchy,
        )
    ]
)


@pytest.fixture(scope="module")
def exported() -> CompiledKernel:
    return compile_blueprint(default_catalog(), "residual_mlp", PROFILE, config=FAST)


@pytest.fixture(scope="module")
def eager() -> CompiledKernel:
    return compile_blueprint(BRANCHY_CATALOG, "branchy", PROFILE, config=FAST)


def test_check_guard_accepts_a_matching_slot() -> None:
    check_guard(GUARD, feature_shape=(16,), dtype="float32")
    check_guard(GUARD, feature_shape=(16,), dtype="float32", batch_size=64)


@pytest.mark.parametrize(
    ("feature_shape", "dtype", "batch_size", "problem"),
    [
        ((32,), "float32", None, "feature shape (32,) != (16,)"),
        ((16,), "bfloat16", None, "dtype bfloat16 != float32"),
        ((16,), "float32", 65, "batch 65 outside [1, 64]"),
    ],
)
def test_check_guard_names_both_shapes_and_the_fix(
    feature_shape: tuple[int, ...], dtype: str, batch_size: int | None, problem: str
) -> None:
    with pytest.raises(GuardMismatchError) as info:
        check_guard(GUARD, feature_shape=feature_shape, dtype=dtype, batch_size=batch_size)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert problem in message
    assert GUARD.describe() in message
    assert f"{', '.join(map(str, feature_shape))}) {dtype}" in message
    assert "esper catalog compile" in message


def test_check_guard_rejects_a_non_residual_output() -> None:
    guard = GUARD.model_copy(update={"output_feature_shape": (8,)})
    with pytest.raises(GuardMismatchError, match="must return its input shape"):
        check_guard(guard, feature_shape=(16,), dtype="float32")


def _perturbed(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=generator) for k, v in module.state_dict().items()}


def test_exported_kernel_matches_eager_and_trains(exported: CompiledKernel) -> None:
    loaded = load_kernel(exported.artifact, exported.blob, catalog=default_catalog(), device="cpu")
    assert not loaded.fallback and loaded.load_ms > 0
    reference = build_deterministic(default_catalog(), "residual_mlp", PROFILE, exported.artifact.params)
    x = torch.randn(8, 16)
    torch.testing.assert_close(loaded.module(x), reference(x))
    # Compare on non-zero weights too: a neutral seed outputs zeros whatever its graph does.
    weights = _perturbed(reference, seed=3)
    loaded.module.load_state_dict(weights)
    reference.load_state_dict(weights)
    torch.testing.assert_close(loaded.module(x), reference(x), rtol=1e-5, atol=1e-5)

    # The seed trains inside a host, and host.train()/eval() recurse into it without error.
    host = nn.Sequential(nn.Linear(16, 16), loaded.module)
    host.train()
    host.eval()
    host.train()
    loss = host(x).pow(2).mean()
    loss.backward()
    grads = {name: p.grad for name, p in loaded.module.named_parameters()}
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(g.abs().sum() > 0 for g in grads.values() if g is not None)
    before = {k: v.clone() for k, v in loaded.module.state_dict().items()}
    torch.optim.SGD(loaded.module.parameters(), lr=0.1).step()
    assert any(not torch.equal(before[k], v) for k, v in loaded.module.state_dict().items())


def test_eager_fallback_is_rebuilt_from_karn(eager: CompiledKernel) -> None:
    assert eager.artifact.fallback
    rng = torch.random.get_rng_state()
    loaded = load_kernel(eager.artifact, eager.blob, catalog=BRANCHY_CATALOG, device="cpu")
    assert torch.equal(rng, torch.random.get_rng_state()), "loading must not consume the run's RNG"
    assert loaded.fallback
    reference = build_deterministic(BRANCHY_CATALOG, "branchy", PROFILE, {})
    x = torch.randn(4, 16)
    torch.testing.assert_close(loaded.module(x), reference(x))
    loaded.module(x).pow(2).sum().backward()
    assert all(p.grad is not None for p in loaded.module.parameters())


def test_wrong_eager_format_is_named(eager: CompiledKernel) -> None:
    buffer = io.BytesIO()
    torch.save({"format": "someone-else-v9", "state_dict": {}}, buffer)
    blob = buffer.getvalue()
    artifact = eager.artifact.model_copy(update={"sha256": hashlib.sha256(blob).hexdigest(), "size_bytes": len(blob)})
    with pytest.raises(ValueError, match=r"'someone-else-v9'.*expected 'esper-eager-v1'"):
        load_kernel(artifact, blob, catalog=BRANCHY_CATALOG)


def test_blob_must_match_the_artifact(exported: CompiledKernel) -> None:
    with pytest.raises(ValueError, match=r"fetch the blob with Urza\.fetch_blob"):
        load_kernel(exported.artifact, exported.blob + b"!", catalog=default_catalog())


def test_exported_artifact_for_another_device_kind(exported: CompiledKernel) -> None:
    environment = exported.artifact.environment.model_copy(update={"device_kind": "cuda"})
    artifact = exported.artifact.model_copy(update={"environment": environment})
    with pytest.raises(EnvironmentMismatchError, match="exported for cuda, the slot is on cpu"):
        load_kernel(artifact, exported.blob, catalog=default_catalog(), device="cpu")


@requires_cuda("export, load and train a kernel on the GPU")
def test_exported_kernel_on_cuda() -> None:
    kernel = compile_blueprint(default_catalog(), "residual_mlp", PROFILE, config=FAST, device="cuda")
    loaded = load_kernel(kernel.artifact, kernel.blob, catalog=default_catalog(), device="cuda")
    x = torch.randn(8, 16, device="cuda")
    assert loaded.module(x).device.type == "cuda"
    loaded.module(x).sum().backward()
