"""The ``aot_inductor`` backend: a real AOTInductor build of the smallest blueprint, its bundle,
the trainable program Kasmina loads next to the forward-only inference kernel, weight swapping,
guard checks, and the persisted-caches path when AOTInductor is unavailable.

Slow (a real C++ build, 10-25 s cold on 2 cores); CI runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper_core.contracts import ArtifactKind, ArtifactStatus
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import GuardMismatchError, load_kernel
from esper_core.tezzeret import inductor
from esper_core.tezzeret.compiler import AOTI_UNAVAILABLE_TAG, CompiledKernel, compile_blueprint
from esper_core.tezzeret.config import Backend, TezzeretConfig
from esper_core.tezzeret.formats import BUNDLE_FORMAT, decode_bundle

pytestmark = pytest.mark.slow

PROFILE = ShapeProfile(feature_shape=(8,), batch_max=16)
PARAMS = {"rank": 1}


def _config(cache_dir: Path) -> TezzeretConfig:
    return TezzeretConfig(
        backend=Backend.AOT_INDUCTOR, cache_dir=cache_dir, prewarm_batches=(1, 16), warmup_iters=1, timing_iters=3
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inductor-cache")


@pytest.fixture(scope="module")
def aoti_kernel(cache_dir: Path) -> CompiledKernel:
    return compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, PARAMS, config=_config(cache_dir))


def test_the_bundle_holds_the_program_and_the_aoti_package(aoti_kernel: CompiledKernel, cache_dir: Path) -> None:
    artifact = aoti_kernel.artifact
    assert artifact.environment.compiler == "aot_inductor"
    assert artifact.kind is ArtifactKind.EXPORTED and not artifact.fallback
    assert artifact.status is ArtifactStatus.ACTIVE, artifact.status_reason
    assert aoti_kernel.tags == ()
    bundle = decode_bundle(aoti_kernel.blob)
    assert bundle.program and bundle.aoti and bundle.inductor_cache is None and bundle.aoti_error is None
    # Kasmina's trainable program and the compiled inference kernel are both timed.
    assert set(artifact.latency) == {"b1", "b16", "aoti-b1", "aoti-b16"}
    assert any(cache_dir.rglob("*")), "Inductor's cache directory is persisted for later compiles"


def test_kasmina_trains_the_program_and_serves_the_compiled_kernel(aoti_kernel: CompiledKernel) -> None:
    loaded = load_kernel(aoti_kernel.artifact, aoti_kernel.blob, catalog=default_catalog())
    assert loaded.inference is not None and not loaded.fallback
    x = torch.randn(4, 8)
    # Train the seed a little: the exported program carries autograd.
    optimizer = torch.optim.SGD(loaded.module.parameters(), lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        (loaded.module(x) - x).pow(2).mean().backward()
        optimizer.step()
    with torch.no_grad():
        trained = loaded.module(x)
    assert trained.abs().sum() > 0
    stale = loaded.inference(x)
    assert not torch.allclose(stale, trained), "the package still holds the initial weights"
    # Freeze: swap the trained weights into the compiled kernel, no recompilation.
    loaded.inference.load_weights(loaded.module.state_dict())
    torch.testing.assert_close(loaded.inference(x), trained, rtol=1e-4, atol=1e-5)


def test_the_inference_kernel_checks_its_guard(aoti_kernel: CompiledKernel) -> None:
    inference = load_kernel(aoti_kernel.artifact, aoti_kernel.blob, catalog=default_catalog()).inference
    assert inference is not None
    # AOTInductor itself accepts these silently; the guard refuses them, naming both shapes.
    with pytest.raises(GuardMismatchError, match=r"feature shape \(9,\) != \(8,\)"):
        inference(torch.randn(2, 9))
    with pytest.raises(GuardMismatchError, match=r"batch 17 outside \[1, 16\]"):
        inference(torch.randn(17, 8))
    with pytest.raises(GuardMismatchError, match="dtype float64 != float32"):
        inference(torch.randn(2, 8, dtype=torch.float64))


def test_without_aoti_the_bundle_keeps_the_program_and_inductor_caches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def unavailable(program: object) -> bytes:
        raise RuntimeError("no C++ toolchain for AOTInductor on this device")

    monkeypatch.setattr(inductor, "compile_aoti", unavailable)
    kernel = compile_blueprint(default_catalog(), "lowrank_adapter", PROFILE, PARAMS, config=_config(tmp_path))
    assert kernel.artifact.status is ArtifactStatus.ACTIVE and not kernel.artifact.fallback
    assert kernel.tags == (AOTI_UNAVAILABLE_TAG,)
    bundle = decode_bundle(kernel.blob)
    assert bundle.aoti is None and bundle.aoti_error is not None and "no C++ toolchain" in bundle.aoti_error
    assert bundle.inductor_cache, "the Inductor mega-cache is stored with the artifact"
    assert "AOTInductor is unavailable" in caplog.text
    loaded = load_kernel(kernel.artifact, kernel.blob, catalog=default_catalog())
    assert loaded.inference is None
    loaded.module(torch.randn(3, 8)).sum().backward()


def test_a_damaged_bundle_is_named() -> None:
    with pytest.raises(ValueError, match=f"not an {BUNDLE_FORMAT} bundle"):
        decode_bundle(b"not a zip")
