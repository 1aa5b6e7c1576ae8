"""Tolaria's per-epoch signals for Tamiyo: train accuracy and each slot's activation gradient."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from esper_core.karn.catalog import default_catalog
from esper_core.run.build import build_trainer
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.slotgrads import batch_stats, train_accuracy
from tests.helpers.recipes import eager_recipe


def _trainer(recipe: str = "digits-mlp") -> Trainer:
    return build_trainer(eager_recipe(recipe), catalog=default_catalog(), run_id="signals")


def test_train_accuracy_counts_every_training_step() -> None:
    trainer = _trainer()
    hits = [0]
    loss_fn = trainer.loss_fn

    def counting_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Training steps only: evaluation runs in inference mode, the bottleneck probe in eval mode.
        if trainer.model.training and torch.is_grad_enabled():
            hits[0] += int((logits.argmax(dim=1) == y).sum())
        return loss_fn(logits, y)

    trainer.loss_fn = counting_loss  # the step closure reads it at each call
    accuracies = []
    for _ in range(2):
        hits[0] = 0
        accuracy = trainer.train_epoch().packet.train_accuracy
        assert accuracy == pytest.approx(hits[0] / len(trainer.data.train), abs=1e-9)
        accuracies.append(accuracy)
    assert 0.0 < accuracies[0] < accuracies[1] <= 1.0


def test_batch_stats_leave_accuracy_unobserved_for_regression_targets() -> None:
    logits, y = torch.randn(5, 3), torch.randn(5, 3)
    stats = batch_stats(F.mse_loss(logits, y), logits, y)
    assert stats[1:].tolist() == [0.0, 0.0]
    assert train_accuracy(0.0, 0.0) is None
    classes = torch.tensor([0, 1, 2, 2, 0])
    stats = batch_stats(F.cross_entropy(logits, classes), logits, classes)
    assert stats[2] == 5 and stats[1] == (logits.argmax(1) == classes).sum()


def _manual_mlp_grad_norms(trainer: Trainer) -> dict[str, float]:
    """digits-mlp by hand: slots on the inputs of fc1 and fc2, gradient of the summed loss."""
    x, y = trainer._probe_batch
    fc0, fc1, fc2 = trainer.model.layers
    a1 = torch.relu(fc0(x)).detach().requires_grad_()
    a2 = torch.relu(fc1(a1))
    loss = F.cross_entropy(fc2(a2), y) * y.shape[0]
    g1, g2 = torch.autograd.grad(loss, [a1, a2])
    return {"slot1": float(g1.norm()) / math.sqrt(len(y)), "slot2": float(g2.norm()) / math.sqrt(len(y))}


def test_dormant_slots_report_the_loss_gradient_at_their_activation() -> None:
    trainer = _trainer()
    packet = trainer.train_epoch().packet
    measured = {s.slot_id: s.activation_grad_norm for s in packet.seeds}
    assert all(s.stage.value == "dormant" for s in packet.seeds)
    expected = _manual_mlp_grad_norms(trainer)
    assert measured == pytest.approx(expected, rel=1e-5)
    assert all(v > 0 for v in expected.values())
    # The probe leaves nothing behind: no hooks on the slots, no parameter gradients touched.
    assert all(not slot._forward_hooks for slot in trainer.manager.slots.values())


def test_a_slot_on_the_raw_input_is_measured_too() -> None:
    trainer = _trainer("seed-reference")
    packet = trainer.train_epoch().packet
    (slot,) = packet.seeds
    assert slot.slot_id == "slot0" and slot.activation_grad_norm is not None and slot.activation_grad_norm > 0


def test_measuring_the_signals_does_not_change_the_run() -> None:
    measured = _trainer()
    unmeasured = _trainer()
    unmeasured.activation_grad_norms = dict  # type: ignore[method-assign]
    a = [measured.train_epoch().packet for _ in range(2)]
    b = [unmeasured.train_epoch().packet for _ in range(2)]
    assert [p.train_loss for p in a] == [p.train_loss for p in b]
    assert [p.val_loss for p in a] == [p.val_loss for p in b]
    assert all(s.activation_grad_norm is None for s in b[-1].seeds)
