"""GradMax-style seed initialisation: function preserved, rows along the gradient's top singular
directions, a larger output-weight gradient than the default init, and the fallbacks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper_core.karn.catalog import GradMaxLayers, KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.seed_init import gradmax_init_
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from esper_core.tolaria.loop import Trainer
from tests.helpers.kernels import germinate_kernel, kernel_from_registry
from tests.helpers.recipes import eager_recipe

PROFILE = "f16-b64"  # the seed-reference slot: 16 features, batches up to 64
DOWN_UP = GradMaxLayers(input="down", output="up")


def _trainer(seed_init: str) -> Trainer:
    config = eager_recipe("seed-reference")
    config.kasmina = dataclasses.replace(config.kasmina, seed_init=seed_init)
    return build_trainer(config, catalog=default_catalog(), run_id="test")


def _germinate(trainer: Trainer, settings: EsperSettings, blueprint: str = "lowrank_adapter") -> torch.nn.Module:
    kernel = kernel_from_registry(settings, blueprint, PROFILE)
    verdict = germinate_kernel(trainer.manager, "slot0", kernel)
    assert verdict.passed, verdict.reason
    seed = trainer.manager.slots["slot0"].seed
    assert seed is not None
    return seed


def _up_grad_norm(trainer: Trainer) -> float:
    """The loss gradient's norm for the seed's output weights, seed forced in, on the first batch."""
    seed = trainer.manager.slots["slot0"].seed
    assert seed is not None
    up = dict(seed.named_parameters())["up.weight"]
    x, y = trainer.data.train.head(trainer.batch_size)
    with trainer.manager.probe("slot0", 1.0):
        loss = trainer.loss_fn(trainer.model(x), y)
    (grad,) = torch.autograd.grad(loss, up)
    return float(grad.norm())


def test_gradmax_germination_preserves_the_function_at_alpha_one(compiled_home: EsperSettings) -> None:
    trainer = _trainer("gradmax")
    x = trainer.data.val.x[:32]
    before = trainer.model(x).detach()
    seed = _germinate(trainer, compiled_home)
    params = dict(seed.named_parameters())
    assert torch.count_nonzero(params["up.weight"]) == 0 and torch.count_nonzero(params["up.bias"]) == 0
    with trainer.manager.probe("slot0", 1.0):
        after = trainer.model(x).detach()
    assert torch.equal(after, before)
    metrics = trainer.manager.export_seed_states()[0].metrics
    # 4 classes: the gradient at the 16-wide slot has rank <= 3 (softmax gradients sum to zero).
    assert metrics["init_gradmax_rows"] == 3 and metrics["init_gradmax_energy"] == pytest.approx(1.0)
    assert metrics["init_gradmax_samples"] == 16  # the whole 16-sample training split
    assert any(e.name == "kasmina.seed.init" and "gradmax" in e.message for e in trainer.manager.drain_events())


def test_gradmax_gives_the_output_weights_a_larger_gradient_than_the_default(compiled_home: EsperSettings) -> None:
    default, gradmax = _trainer("default"), _trainer("gradmax")
    for trainer in (default, gradmax):
        _germinate(trainer, compiled_home)
    assert _up_grad_norm(gradmax) > 1.5 * _up_grad_norm(default)


def test_gradmax_draws_no_randomness_and_leaves_the_host_alone(compiled_home: EsperSettings) -> None:
    trainer = _trainer("gradmax")
    host = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rng = torch.get_rng_state()
    _germinate(trainer, compiled_home)
    assert torch.equal(torch.get_rng_state(), rng)
    assert trainer.model.training
    assert all(p.grad is None for p in trainer.model.host_parameters())
    assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in host.items())


def test_gradmax_keeps_the_default_for_a_blueprint_without_gradmax_layers(compiled_home: EsperSettings) -> None:
    trainer = _trainer("gradmax")
    kernel = kernel_from_registry(compiled_home, "lowrank_adapter", PROFILE)
    expected = {k: v.clone() for k, v in kernel.module.state_dict().items()}
    # A catalogue whose lowrank_adapter names no GradMax layers: the kernel's weights stay.
    entries = [default_catalog().get(i) for i in default_catalog().ids]
    trainer.manager.catalog = KarnCatalog(
        [dataclasses.replace(b, gradmax=None) if b.blueprint_id == "lowrank_adapter" else b for b in entries]
    )
    germinate_kernel(trainer.manager, "slot0", kernel)
    assert all(torch.equal(kernel.module.state_dict()[k], v) for k, v in expected.items())
    messages = [e.message for e in trainer.manager.drain_events() if e.name == "kasmina.seed.init"]
    assert messages == ["default init kept: the blueprint names no GradMax layers"]


def _orthonormal_samples(n: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """(n, width) samples whose second moment is exactly the identity: E[x x^T] = I."""
    q, _ = torch.linalg.qr(torch.randn(n, width, generator=generator, dtype=torch.float64))
    return q * n**0.5


def _constructed(n: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples x, gradients g = 3 (x.v1) u1 + (x.v2) u2, and V = (v1, v2): E[g x^T] = 3 u1 v1^T + u2 v2^T."""
    gen = torch.Generator().manual_seed(0)
    x = _orthonormal_samples(n, width, gen)
    basis, _ = torch.linalg.qr(torch.randn(width, 4, generator=gen, dtype=torch.float64))
    v, u = basis[:, :2].T, basis[:, 2:].T  # (2, W) each, orthonormal rows
    g = 3.0 * (x @ v[0])[:, None] * u[0] + (x @ v[1])[:, None] * u[1]
    return x, g, v


def _cosines(rows: torch.Tensor, v: torch.Tensor) -> list[float]:
    rows = rows.double()
    return [abs(float(r @ d / r.norm())) for r, d in zip(rows, v, strict=True)]


def test_input_rows_follow_the_top_singular_directions_on_a_vector_slot() -> None:
    x, g, v = _constructed(256, 16)
    module = default_catalog().build("lowrank_adapter", ShapeProfile(feature_shape=(16,)), {"rank": 4})
    before = dict(module.named_parameters())["down.weight"].detach().clone()
    result = gradmax_init_(module, DOWN_UP, [(x[:128].float(), g[:128].float()), (x[128:].float(), g[128:].float())])
    down = dict(module.named_parameters())["down.weight"].detach()
    assert result.rows == 2 and result.hidden == 4 and result.samples == 256
    assert result.energy == pytest.approx(1.0)
    # Row order follows the singular values: 3 (v1), then 1 (v2); the other rows keep their default.
    assert min(_cosines(down[:2], v)) > 1 - 1e-5
    assert torch.equal(down[2:], before[2:])
    # Each chosen row has the default init's mean row norm.
    assert down[:2].norm(dim=1) == pytest.approx([float(before.norm(dim=1).mean())] * 2, rel=1e-5)


def test_sequence_slots_treat_positions_as_samples() -> None:
    channels, length = 8, 12
    x, g, v = _constructed(4 * length, channels)
    # (B*L, C) rows -> (B, C, L) activations: every position is one sample of the statistic.
    to_seq = lambda t: t.reshape(4, length, channels).permute(0, 2, 1).float()  # noqa: E731
    module = default_catalog().build("seq_pointwise_adapter", ShapeProfile(feature_shape=(channels, length)))
    result = gradmax_init_(module, DOWN_UP, [(to_seq(x), to_seq(g))])
    down = dict(module.named_parameters())["down.weight"].detach()  # (R, C, 1)
    assert result.rows == 2 and result.samples == 4 * length
    assert min(_cosines(down[:2, :, 0], v)) > 1 - 1e-5
    assert torch.count_nonzero(module(to_seq(x))) == 0


@pytest.mark.parametrize(
    ("blueprint", "shape"),
    [("seq_conv_residual", (6, 10)), ("conv_residual", (4, 5, 5)), ("residual_mlp", (12,)), ("bottleneck_mlp", (12,))],
)
def test_every_gradmax_blueprint_stays_neutral_and_grows_its_gradient(blueprint: str, shape: tuple[int, ...]) -> None:
    catalog = default_catalog()
    layers = catalog.get(blueprint).gradmax
    assert layers is not None
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, *shape, generator=gen)
    target = torch.randn(8, *shape, generator=gen)
    # A loss whose gradient at the slot is g = y - target, so L(delta) = ||x + delta - target||^2 / 2.
    g = x - target
    module = catalog.build(blueprint, ShapeProfile(feature_shape=shape))
    reference = catalog.build(blueprint, ShapeProfile(feature_shape=shape))
    reference.load_state_dict(module.state_dict())
    result = gradmax_init_(module, layers, [(x, g)])
    assert result.rows > 0
    assert torch.count_nonzero(module(x)) == 0

    def out_grad(m: torch.nn.Module) -> float:
        loss = 0.5 * (x + m(x) - target).pow(2).sum()
        (grad,) = torch.autograd.grad(loss, dict(m.named_parameters())[f"{layers.output}.weight"])
        return float(grad.norm())

    assert out_grad(module) > out_grad(reference)


def test_gradmax_errors_name_the_fix() -> None:
    module = default_catalog().build("lowrank_adapter", ShapeProfile(feature_shape=(16,)))
    with pytest.raises(ValueError, match="got no batches"):
        gradmax_init_(module, DOWN_UP, [])
    with pytest.raises(ValueError, match=r"no parameter proj\.weight .* fix the blueprint's GradMaxLayers"):
        gradmax_init_(module, GradMaxLayers(input="proj", output="up"), [(torch.ones(2, 16), torch.ones(2, 16))])
    with pytest.raises(ValueError, match="does not read the slot's 8 features"):
        gradmax_init_(module, DOWN_UP, [(torch.ones(2, 8), torch.ones(2, 8))])


def test_seed_init_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"seed_init must be one of \('default', 'gradmax'\), got 'grad_max'"):
        KasminaConfig(seed_init="grad_max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed_init_batches must be >= 1"):
        KasminaConfig(seed_init_batches=0)
