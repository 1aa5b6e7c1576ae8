"""Tolaria's epoch loop: packets, inference-mode validation, determinism and exact restore."""

from __future__ import annotations

import itertools

import pytest
import torch

from esper_core.contracts import BlendSchedule
from esper_core.contracts.enums import LayerKind, SlotKind
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.loader import load_kernel
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from esper_core.tolaria.checkpoint import CheckpointNotFoundError, CheckpointStore
from esper_core.tolaria.config import TrainerConfig
from esper_core.tolaria.loop import GRAD_NORM_SAMPLES, Trainer, grad_norm_steps
from esper_core.urza.service import Urza
from tests.helpers.kernels import germinate_kernel, given, kernel_from_registry
from tests.helpers.recipes import eager_recipe


def _trainer(recipe: str = "seed-reference") -> Trainer:
    return build_trainer(eager_recipe(recipe), catalog=default_catalog(), run_id="test")


def test_epoch_produces_a_complete_packet() -> None:
    trainer = _trainer("digits-mlp")
    result = trainer.train_epoch()
    packet = result.packet
    assert packet.epoch == 0 and trainer.epoch == 1
    assert 0.0 < packet.val_accuracy <= 1.0 and packet.train_loss > 0
    assert [layer.name for layer in packet.layers] == ["fc0", "fc1", "fc2"]
    assert all(layer.grad_norm > 0 and layer.activation_std > 0 for layer in packet.layers)
    assert [s.slot_id for s in packet.seeds] == ["slot1", "slot2"]
    # Each layer described as any architecture's would be: kind, fans and a count of its cost.
    fc0, fc1, fc2 = packet.layers
    assert {layer.kind for layer in packet.layers} == {LayerKind.LINEAR}
    assert (fc1.fan_in, fc1.fan_out) == (fc0.width, fc1.width)
    assert fc1.params == (fc0.width + 1) * fc1.width and fc2.flops_per_sample == 2 * fc1.width * fc2.width
    assert {s.kind for s in packet.seeds} == {SlotKind.BRANCH}
    names = {m.name for m in result.metrics}
    assert {
        "tolaria.training.latency_ms",
        "tolaria.train.compile_enabled",
        "tolaria.train.amp_enabled",
        "tolaria.train.graph_enabled",
    } <= names
    assert result.train_ms > 0 and result.total_ms >= result.train_ms


def test_validation_runs_under_inference_mode() -> None:
    trainer = _trainer()
    seen: list[bool] = []
    trainer.model.layers[0].register_forward_hook(lambda *_: seen.append(torch.is_inference_mode_enabled()))
    trainer.evaluate(trainer.data.val)
    assert seen and all(seen)


def test_training_learns_digits() -> None:
    trainer = _trainer("digits-mlp")
    first = trainer.train_epoch().packet
    for _ in range(3):
        last = trainer.train_epoch().packet
    assert last.val_loss < first.val_loss and last.val_accuracy > 0.8


def test_same_recipe_and_seed_give_identical_losses() -> None:
    runs = []
    for _ in range(2):
        trainer = _trainer("digits-mlp")
        runs.append([trainer.train_epoch().packet.train_loss for _ in range(2)])
    assert runs[0] == runs[1]


def test_restored_checkpoint_reproduces_the_epoch_exactly(tmp_path, compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    kernel = kernel_from_registry(compiled_home, "lowrank_adapter", "f16-b64")
    germinate_kernel(trainer.manager, "slot0", kernel)
    trainer.train_epoch()
    store = CheckpointStore(tmp_path / "ckpt")
    store.save("e1", trainer.state_dict())
    original = trainer.train_epoch().packet

    urza = Urza.open(compiled_home.home, compiled_home.registry_db_url)

    def load(artifact):
        return load_kernel(artifact, urza.fetch_blob(artifact), catalog=default_catalog(), device="cpu")

    fresh = _trainer()  # a new process would start from nothing but the checkpoint
    fresh.load_state_dict(store.load("e1"), load_kernel=load)
    retried = fresh.train_epoch().packet
    urza.close()
    assert retried.train_loss == original.train_loss
    assert retried.val_loss == original.val_loss
    assert retried.seeds == original.seeds
    assert retried.layers == original.layers


def test_missing_checkpoint_error_says_why(tmp_path) -> None:
    with pytest.raises(CheckpointNotFoundError, match="has not committed an epoch yet"):
        CheckpointStore(tmp_path).load()


def test_trainer_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="momentum must lie in"):
        TrainerConfig(momentum=1.5)
    with pytest.raises(ValueError, match="device must be one of"):
        TrainerConfig(device="tpu")


def test_two_trainable_seeds_aggregate_host_gradients(compiled_home: EsperSettings) -> None:
    trainer = _trainer("digits-mlp")
    args = dict(params={}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=1, lr_scale=1.0)
    for slot in ("slot1", "slot2"):
        assert trainer.manager.germinate(
            slot,
            "lowrank_adapter",
            kernels=given(kernel_from_registry(compiled_home, "lowrank_adapter", "f64-b512")),
            **args,
        ).passed
    result = trainer.train_epoch()
    metrics = {m.name: m.value for m in result.metrics}
    assert metrics["tolaria.grad_agg.steps"] == 17  # every step of the epoch (1079 samples, batch 64)
    assert 0.0 <= metrics["tolaria.grad_agg.conflict_ratio"] <= 1.0
    assert 0.0 < metrics["tolaria.grad_agg.teacher_share"] <= 1.0
    assert all(s.metrics["grad_norm"] > 0 for s in result.packet.seeds)


def test_one_trainable_seed_short_circuits_aggregation(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    kernel = kernel_from_registry(compiled_home, "lowrank_adapter", "f16-b64")
    germinate_kernel(trainer.manager, "slot0", kernel)
    metrics = {m.name: m.value for m in trainer.train_epoch().metrics}
    assert metrics["tolaria.grad_agg.steps"] == 0.0


@pytest.mark.parametrize("steps", [1, 5, 8, 15, 16, 17, 40, 41, 1000])
def test_gradient_norms_are_sampled_on_evenly_spread_steps_never_more_than_configured(steps: int) -> None:
    sampled = sorted(grad_norm_steps(steps))
    assert len(sampled) == min(steps, GRAD_NORM_SAMPLES) and sampled[0] == 0 and sampled[-1] < steps
    if steps % GRAD_NORM_SAMPLES == 0:
        # The recipes whose epochs are a multiple of 8 steps sample the steps they always did.
        assert sampled == list(range(0, steps, steps // GRAD_NORM_SAMPLES))
    elif steps > GRAD_NORM_SAMPLES:
        gaps = {b - a for a, b in itertools.pairwise(sampled)}
        assert gaps <= {steps // GRAD_NORM_SAMPLES, -(-steps // GRAD_NORM_SAMPLES)}


def test_the_full_precision_step_computes_what_the_general_step_does() -> None:
    trainer = _trainer("digits-mlp")
    assert not trainer.precision.enabled and trainer.engine.step_fn == trainer._full_precision_step
    x, y = trainer._probe_batch
    results = []
    for step in (trainer._train_step, trainer._full_precision_step):
        trainer.optimizer.zero_grad(set_to_none=True)
        loss = step(x, y)
        results.append((loss, [p.grad.clone() for p in trainer.model.host_parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_b.dtype == torch.float32 and torch.equal(loss_a, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    # A float64 model's loss is summed in float32, as the general step returns it.
    trainer.model.double()
    assert trainer._full_precision_step(x.double(), y).dtype == torch.float32
