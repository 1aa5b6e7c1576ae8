"""Tolaria's per-epoch signals for Tamiyo: train accuracy and each slot's activation gradient."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch
from torch.nn import functional as F

from esper_core.benchmarks.common import germinate_one
from esper_core.contracts import SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer, growth_signals
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.modes import eval_mode
from esper_core.tolaria.slotgrads import GROWTH_SIGNALS, TRAIN_ACCURACY_SAMPLES, sample_accuracy
from tests.helpers.recipes import eager_recipe


def _trainer(recipe: str = "digits-mlp") -> Trainer:
    return build_trainer(eager_recipe(recipe), catalog=default_catalog(), run_id="signals")


def test_train_accuracy_is_measured_on_a_fixed_training_sample_after_the_epoch() -> None:
    trainer = _trainer()
    accuracies = []
    for _ in range(2):
        accuracy = trainer.train_epoch().packet.train_accuracy
        x, y = trainer.data.train.head(TRAIN_ACCURACY_SAMPLES)
        with torch.inference_mode():
            expected = (trainer.model(x).argmax(dim=1) == y).float().mean().item()
        assert accuracy == pytest.approx(expected, abs=1e-9)
        accuracies.append(accuracy)
    assert 0.0 < accuracies[0] < accuracies[1] <= 1.0


def test_sample_accuracy_is_unobserved_for_regression_targets_and_keeps_the_mode() -> None:
    model = torch.nn.Linear(4, 3)
    assert sample_accuracy(model, torch.randn(5, 4), torch.randn(5, 3)) is None
    assert model.training
    x, classes = torch.randn(5, 4), torch.tensor([0, 1, 2, 2, 0])
    with torch.no_grad():
        hits = (model(x).argmax(1) == classes).sum().item()
    assert sample_accuracy(model, x, classes) == hits / 5


def test_unread_signals_are_not_measured_and_read_ones_skip_slots_that_cannot_act() -> None:
    config = eager_recipe("digits-mlp")
    assert growth_signals(config, recorded=False) == frozenset()  # the heuristic reads neither
    assert growth_signals(config, recorded=True) == frozenset(GROWTH_SIGNALS)  # Simic does
    gnn = dataclasses.replace(config, tamiyo=dataclasses.replace(config.tamiyo, policy="gnn"))
    assert growth_signals(gnn, recorded=False) == frozenset(GROWTH_SIGNALS)
    unread = build_trainer(config, catalog=default_catalog(), run_id="s", recorded=False)
    probed = []
    unread.activation_grad_norms = lambda: probed.append(1) or {}  # type: ignore[method-assign]
    packet = unread.train_epoch().packet
    assert packet.train_accuracy is None and not probed
    assert all(s.activation_grad_norm is None for s in packet.seeds)
    read = _trainer()
    read.manager.slots["slot1"].stage = SeedStage.EMBARGOED  # cannot germinate until DORMANT again
    norms = read.activation_grad_norms()
    assert set(norms) == {"slot2"} and norms["slot2"] is not None and norms["slot2"] > 0
    with pytest.raises(ValueError, match="unknown growth signals"):
        Trainer(**{**_trainer_kwargs(read), "signals": frozenset({"val_gap"})})


def _trainer_kwargs(trainer: Trainer) -> dict[str, object]:
    return {
        "model": trainer.model,
        "manager": trainer.manager,
        "data": trainer.data,
        "config": trainer.config,
        "loss_fn": trainer.loss_fn,
        "batch_size": trainer.batch_size,
        "data_seed": trainer.data_seed,
        "device": trainer.device,
        "run_id": "s",
    }


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


@contextlib.contextmanager
def _counted_switches(trainer: Trainer) -> Iterator[list[bool]]:
    """The modes ``train()`` switches the trainer's whole model to within the block, in order."""
    switches: list[bool] = []
    train = type(trainer.model).train

    def counted(model: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
        if model is trainer.model:
            switches.append(mode)
        return train(model, mode)

    type(trainer.model).train = counted  # type: ignore[method-assign]
    try:
        yield switches
    finally:
        type(trainer.model).train = train  # type: ignore[method-assign]


def test_an_epoch_switches_modes_a_fixed_number_of_times_and_ends_in_train_mode() -> None:
    trainer = _trainer()
    germinate_one(trainer, eager_recipe("digits-mlp"))
    trainer.train_epoch()  # now TRAINING: its gate probe evaluates the validation split again
    assert trainer.manager.probe_plan(), "no gate probe to batch into the eval block"
    stage = trainer.manager.slots["slot1"].stage
    with _counted_switches(trainer) as switches:
        trainer.train_epoch()
    # Start of epoch (the last epoch's gate moved the seed on: a new structure, see the test
    # below); one eval block for validation, the gate probe and the bottleneck signal; the train
    # accuracy after the gates (each used to switch and back on its own: nine).
    assert stage is not SeedStage.GERMINATED and switches == [True, False, True, False, True]
    assert trainer.model.training


def test_an_epoch_walks_the_model_only_after_a_change_or_when_left_in_eval_mode() -> None:
    trainer = _trainer()
    trainer.train_epoch()
    modes: list[bool] = []  # at each optimizer step: is every module training?
    trainer.optimizer.register_step_pre_hook(
        lambda *_: modes.append(all(m.training for m in trainer.model.modules()))  # type: ignore[func-returns-value]
    )
    with _counted_switches(trainer) as switches:
        trainer.train_epoch()  # the same structure: validation left every module training
        assert switches == [False, True, False, True]
        assert modes and all(modes)
        trainer.model.eval()  # left in eval mode between epochs: switched back before training
        switches.clear()
        modes.clear()
        trainer.train_epoch()
        assert switches == [True, False, True, False, True]
        assert modes and all(modes)
        germinate_one(trainer, eager_recipe("digits-mlp"))
        trainer.manager.slots["slot1"].seed.eval()  # type: ignore[union-attr]
        switches.clear()
        modes.clear()
        trainer.train_epoch()  # a new structure: the seed, built in eval mode, trains in training mode
        assert switches[0] is True
        assert modes and all(modes)


def test_eval_mode_restores_the_mode_and_leaves_an_eval_model_alone() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    with pytest.raises(RuntimeError), eval_mode(model):
        assert not model.training and not model[1].training
        raise RuntimeError("a failed measurement")
    assert model.training and model[1].training
    model.eval()
    model[1].train()  # a submodule the caller keeps training: not switched by a no-op block
    with eval_mode(model):
        assert model[1].training
    assert not model.training


def test_train_accuracy_reads_as_many_samples_as_configured() -> None:
    config = eager_recipe("digits-mlp")
    config.trainer = dataclasses.replace(config.trainer, train_accuracy_samples=64)
    trainer = build_trainer(config, catalog=default_catalog(), run_id="samples")
    accuracy = trainer.train_epoch().packet.train_accuracy
    x, y = trainer.data.train.head(64)
    with torch.inference_mode():
        expected = (trainer.model(x).argmax(dim=1) == y).float().mean().item()
    assert accuracy == pytest.approx(expected, abs=1e-9) and (accuracy * 64) % 1 == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="train_accuracy_samples must be >= 1"):
        dataclasses.replace(config.trainer, train_accuracy_samples=0)
