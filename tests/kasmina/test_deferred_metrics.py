"""Per-seed and per-layer metrics accumulated on the device and reduced once per epoch equal an
eager reduction done step by step (WP-99 Phase 3.2)."""

from __future__ import annotations

import math

import pytest
import torch

from esper_core.contracts import BlendMode, SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.config import KasminaConfig
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from tests.helpers.kernels import germinate_kernel, kernel_from_registry
from tests.helpers.recipes import eager_recipe


def test_device_accumulation_matches_eager_per_step_reduction(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = build_trainer(eager_recipe("digits-mlp"), catalog=default_catalog(), run_id="t")
    kernel = kernel_from_registry(compiled_home, "residual_mlp", "f64-b512")
    germinate_kernel(trainer.manager, "slot1", kernel)
    seed_norms: list[float] = []
    layer_norms: list[list[float]] = []
    accumulate = trainer.grad_norms.step

    def step() -> None:
        # The eager reference: a host sync per tensor per step.
        grads = [p.grad for p in trainer.manager.seed_parameters("slot1") if p.grad is not None]
        seed_norms.append(math.sqrt(sum(g.norm().item() ** 2 for g in grads)))
        layer_norms.append([layer.weight.grad.norm().item() for layer in trainer.model.layers])
        accumulate()

    monkeypatch.setattr(trainer.grad_norms, "step", step)
    packet = trainer.train_epoch().packet

    steps = len(seed_norms)
    expected_seed = math.sqrt(sum(n * n for n in seed_norms) / steps)
    assert packet.seed("slot1").metrics["grad_norm"] == pytest.approx(expected_seed, rel=1e-5)
    for i, layer in enumerate(packet.layers):
        expected = math.sqrt(sum(step[i] ** 2 for step in layer_norms) / steps)
        assert layer.grad_norm == pytest.approx(expected, rel=1e-5)
    assert packet.seed("slot1").metrics["samples"] == len(trainer.data.train)


def test_convex_blend_replaces_the_activation(compiled_home: EsperSettings) -> None:
    config = eager_recipe("digits-mlp")
    config.kasmina = KasminaConfig(blend_mode=BlendMode.CONVEX)
    trainer = build_trainer(config, catalog=default_catalog(), run_id="t")
    slot = trainer.manager.slots["slot1"]
    kernel = kernel_from_registry(compiled_home, "residual_mlp", "f64-b512")
    germinate_kernel(trainer.manager, "slot1", kernel, blend_epochs=2)
    trainer.train_epoch()
    assert slot.stage is SeedStage.BLENDING and slot.alpha == 0.5
    x = torch.randn(3, 64)
    with torch.inference_mode():
        expected = 0.5 * x + 0.5 * slot.seed(x)  # type: ignore[misc]
        assert torch.allclose(slot(x), expected, atol=1e-6)
    assert trainer.manager.export_seed_states()[0].blend_mode is BlendMode.CONVEX
