"""Kasmina's loader: guard checks, and loading exported and eager artifacts as trainable seeds."""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

import esper_core.kasmina
from esper_core.contracts import BlueprintDescriptor, BlueprintTier, GuardSchema, KernelArtifact
from esper_core.karn.catalog import Blueprint, KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import ApprovalRequiredError
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import (
    EnvironmentMismatchError,
    GuardMismatchError,
    QuarantineOnlyError,
    check_guard,
    load_for_slot,
    load_kernel,
)
from esper_core.pipeline import compile_job, job_for, publish_kernel
from esper_core.tezzeret.compiler import (
    CompiledKernel,
    TezzeretConfig,
    build_deterministic,
    compile_blueprint,
    environment_key,
)
from esper_core.urza.errors import ArtifactNotFoundError
from esper_core.urza.service import Urza
from tests.helpers.runif import requires_cuda

PROFILE = ShapeProfile(feature_shape=(16,), batch_max=64)
FAST = TezzeretConfig(timing_iters=3, warmup_iters=1)
FAST_CONFIG = FAST
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


# --------------------------------------------------------------------------- load_for_slot


@pytest.fixture
def urza(tmp_path: Path) -> Iterator[Urza]:
    registry = Urza.open(tmp_path / "home")
    yield registry
    registry.close()


def _publish(urza: Urza, blueprint_id: str, profile: ShapeProfile, **params: float) -> KernelArtifact:
    catalog = default_catalog()
    job = job_for(catalog, blueprint_id, profile.name, params=params, approved=[blueprint_id])
    return publish_kernel(urza, catalog, compile_job(catalog, job, "cpu", config=FAST_CONFIG))


def test_load_for_slot_checks_loads_and_prewarms_once(urza: Urza) -> None:
    stored = _publish(urza, "lowrank_adapter", PROFILE, rank=2)
    loaded = load_for_slot(urza, "lowrank_adapter", PROFILE, catalog=default_catalog())
    assert loaded.artifact == stored and not loaded.fallback and loaded.inference is None
    assert loaded.load_ms > 0 and loaded.first_use_ms is not None and loaded.first_use_ms > 0
    assert loaded.module(torch.randn(3, 16)).shape == (3, 16)
    cold = load_for_slot(urza, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
    assert cold.first_use_ms is None


def test_load_for_slot_refuses_a_guard_mismatch_naming_both_shapes(urza: Urza) -> None:
    _publish(urza, "lowrank_adapter", PROFILE)
    wider_batches = ShapeProfile(feature_shape=(16,), batch_max=128)
    # Lookups go by profile name; a row under the slot's name whose guard accepts smaller batches
    # (as a registry written by another tool could hold) must be refused before it is loaded.
    artifact = urza.store.find_active("lowrank_adapter", PROFILE.name, environment_key("cpu"))
    assert artifact is not None
    bogus = artifact.model_copy(update={"shape_profile": wider_batches.name})
    urza.store.publish(bogus)
    with pytest.raises(GuardMismatchError) as info:
        load_for_slot(urza, "lowrank_adapter", wider_batches, catalog=default_catalog())
    message = str(info.value)
    assert "slot is (batch 128, 16) float32" in message and "artifact accepts (batch 1..64, 16) float32" in message
    assert "batch 128 outside [1, 64]" in message


def test_load_for_slot_enforces_the_tier_policy(urza: Urza) -> None:
    _publish(urza, "glu_block", PROFILE)
    with pytest.raises(ApprovalRequiredError, match="--approve glu_block"):
        load_for_slot(urza, "glu_block", PROFILE, catalog=default_catalog())
    assert load_for_slot(urza, "glu_block", PROFILE, catalog=default_catalog(), approved=["glu_block"]).module
    with pytest.raises(QuarantineOnlyError, match="quarantine-only"):
        load_for_slot(urza, "wide_mlp", PROFILE, catalog=default_catalog(), approved=["wide_mlp"])


def test_load_for_slot_without_an_artifact_says_how_to_compile(urza: Urza) -> None:
    with pytest.raises(ArtifactNotFoundError, match="esper catalog compile residual_mlp"):
        load_for_slot(urza, "residual_mlp", PROFILE, catalog=default_catalog())


def test_kasmina_never_compiles() -> None:
    # Seed 003: all compilation happens in Tezzeret. Kasmina may deserialise compiled kernels
    # and pre-populate caches, never call the compiler.
    package = Path(esper_core.kasmina.__file__).parent
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(package.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"torch\.compile\s*\(|compile_aoti|compile_with_caches|aoti_compile", line)
    ]
    assert offenders == [], f"Kasmina must never compile: {offenders}"
