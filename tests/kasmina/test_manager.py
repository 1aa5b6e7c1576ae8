"""The seed manager on a real host, trainer and exported kernels from a real registry."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper_core.contracts import BlendSchedule, SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.lifecycle import IllegalTransitionError
from esper_core.kasmina.loader import LoadedKernel
from esper_core.run.build import build_trainer
from esper_core.settings import EsperSettings
from esper_core.tolaria.loop import Trainer
from tests.helpers.kernels import germinate_kernel, given, kernel_from_registry
from tests.helpers.recipes import eager_recipe

PROFILE = "f16-b64"  # the seed-reference slot: 16 features, batches up to 64


def _trainer(**kasmina: int) -> Trainer:
    config = eager_recipe("seed-reference")
    config.kasmina = dataclasses.replace(config.kasmina, **kasmina)
    return build_trainer(config, catalog=default_catalog(), run_id="test")


def _germinate(trainer: Trainer, settings: EsperSettings, *, blend_epochs: int = 1, lr_scale: float = 0.5) -> None:
    kernel = kernel_from_registry(settings, "lowrank_adapter", PROFILE)
    verdict = germinate_kernel(trainer.manager, "slot0", kernel, blend_epochs=blend_epochs, lr_scale=lr_scale)
    assert verdict.passed, verdict.reason


def _events(trainer: Trainer) -> list[str]:
    return [e.name for e in trainer.manager.drain_events()]


def test_germinate_attaches_kernel_with_its_own_param_group(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    _germinate(trainer, compiled_home, lr_scale=0.5)
    slot = trainer.manager.slots["slot0"]
    assert slot.stage is SeedStage.GERMINATED and slot.seed is not None
    groups = [g for g in trainer.optimizer.param_groups if g.get("slot_id") == "slot0"]
    assert len(groups) == 1 and groups[0]["lr"] == pytest.approx(trainer.config.lr * 0.5)
    names = _events(trainer)
    assert "kasmina.gate.g0_sanity" in names and "kasmina.seed.stage" in names
    state = trainer.manager.export_seed_states()[0]
    assert state.blueprint_id == "lowrank_adapter" and state.metrics["kernel_load_ms"] > 0


def test_g0_refuses_a_kernel_built_for_another_shape(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    wrong = kernel_from_registry(compiled_home, "lowrank_adapter", "f64-b512")
    verdict = germinate_kernel(trainer.manager, "slot0", wrong)
    assert not verdict.passed
    assert "(batch *, 16)" in verdict.reason and "(batch 1..512, 64)" in verdict.reason
    slot = trainer.manager.slots["slot0"]
    assert slot.stage is SeedStage.DORMANT and slot.seed is None
    assert len(trainer.optimizer.param_groups) == 1


def test_training_seed_is_isolated_from_the_host(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    x = trainer.data.train.x[:4]
    before = trainer.model(x).detach()
    _germinate(trainer, compiled_home)
    trainer.manager.start_epoch()
    assert trainer.manager.slots["slot0"].stage is SeedStage.TRAINING
    # The forward value is bit-identical and the host's gradients do not see the seed.
    assert torch.equal(trainer.model(x).detach(), before)
    assert trainer.isolation_probe("slot0") == 0.0
    # ...while the seed itself receives the task gradient.
    result = trainer.train_epoch()
    assert result.packet.seed("slot0").metrics["grad_norm"] > 0


def test_isolation_leak_fails_g3_and_is_reported(compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _trainer()
    _germinate(trainer, compiled_home)
    slot = trainer.manager.slots["slot0"]
    # A broken slot that lets the host see the seed while TRAINING.
    monkeypatch.setattr(
        type(slot),
        "forward",
        lambda self, x: x + 0.1 * self.seed(x) if self.seed is not None and self.probe_alpha is None else x,
    )
    events = [e for e in trainer.train_epoch().events]
    g3 = [e for e in events if e.name == "kasmina.gate.g3_interface"]
    assert g3 and g3[0].attributes["passed"] is False
    assert any(e.name == "kasmina.isolation.violation" for e in events)
    assert slot.stage is SeedStage.TRAINING  # it does not blend


def test_g2_judges_the_seed_at_the_alpha_its_blend_starts_at(compiled_home: EsperSettings) -> None:
    trainer = _trainer(min_training_epochs=1)
    _germinate(trainer, compiled_home, blend_epochs=4)
    trainer.manager.start_epoch()
    assert trainer.manager.probe_plan() == {"slot0": pytest.approx(0.25)}  # linear ramp, step 1 of 4
    trainer.train_epoch()
    slot = trainer.manager.slots["slot0"]
    assert (slot.stage, slot.alpha) == (SeedStage.BLENDING, pytest.approx(0.25))
    probed = trainer.manager.export_seed_states()[0].metrics["val_loss_with_seed"]
    # What G2 measured is what the first blending epoch starts from, and not the seed at alpha 1.
    assert trainer.evaluate(trainer.data.val).loss == pytest.approx(probed, rel=1e-6)
    with trainer.manager.probe("slot0", 1.0):
        assert trainer.evaluate(trainer.data.val).loss != pytest.approx(probed, rel=1e-6)


def test_full_lifecycle_to_fossilized(compiled_home: EsperSettings) -> None:
    trainer = _trainer(min_training_epochs=1, probation_epochs=1)
    _germinate(trainer, compiled_home, blend_epochs=2)
    stages = []
    for _ in range(5):
        packet = trainer.train_epoch().packet
        stages.append((packet.seeds[0].stage, round(packet.seeds[0].alpha, 2)))
    assert stages[0] == (SeedStage.BLENDING, 0.5)  # G1, G2, G3 passed after one training epoch
    assert (SeedStage.PROBATIONARY, 1.0) in stages
    state = trainer.manager.export_seed_states()[0]
    assert state.last_gate is not None and state.last_gate.gate.value == "g4_system_impact"
    if not state.last_gate.passed:
        pytest.fail(f"G4 failed on the reference workload: {state.last_gate.reason}")
    trainer.manager.fossilize("slot0")
    slot = trainer.manager.slots["slot0"]
    assert slot.stage is SeedStage.FOSSILIZED
    assert all(not p.requires_grad for p in slot.seed.parameters())  # type: ignore[union-attr]
    assert trainer.manager.optimizer_param_count("slot0") == 0
    trainer.train_epoch()  # a fossilized seed keeps working in the forward pass


def test_fossilize_requires_passed_g4(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    _germinate(trainer, compiled_home)
    with pytest.raises(ValueError, match="must be probationary with a passed G4"):
        trainer.manager.fossilize("slot0")


def test_cull_frees_then_embargo_then_g5_reset(compiled_home: EsperSettings) -> None:
    trainer = _trainer(embargo_epochs=1)
    _germinate(trainer, compiled_home)
    trainer.train_epoch()
    trainer.manager.cull("slot0", reason="test cull")
    slot = trainer.manager.slots["slot0"]
    assert slot.stage is SeedStage.EMBARGOED and slot.seed is None
    assert len(trainer.optimizer.param_groups) == 1 and trainer.manager.optimizer_param_count("slot0") == 0
    with pytest.raises(IllegalTransitionError):
        trainer.manager.germinate(
            "slot0",
            "lowrank_adapter",
            kernels=given(kernel_from_registry(compiled_home, "lowrank_adapter", PROFILE)),
            params={},
            blend_schedule=BlendSchedule.LINEAR,
            blend_epochs=1,
            lr_scale=1.0,
        )
    events = trainer.train_epoch().events
    g5 = [e for e in events if e.name == "kasmina.gate.g5_reset"]
    assert g5 and g5[0].attributes["passed"] is True
    assert slot.stage is SeedStage.DORMANT
    _germinate(trainer, compiled_home)  # the slot is reusable


def test_attribute_batch_and_unknown_slot(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    assert trainer.manager.attribute_batch(4) == {}
    _germinate(trainer, compiled_home)
    trainer.manager.start_epoch()
    assert trainer.manager.attribute_batch(4) == {"slot0": 4}
    with pytest.raises(ValueError, match="unknown slot 'slot9'; this host has slots \\['slot0'\\]"):
        trainer.manager.cull("slot9", reason="x")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="embargo_epochs must be >= 1"):
        KasminaConfig(embargo_epochs=0)


def test_g3_isolation_holds_on_a_host_with_dropout_and_leaves_the_rng_alone() -> None:
    # nn.TransformerEncoderLayer holds dropout: both passes of the probe must draw the same masks.
    from esper_core.karn.blueprints_tok import TokenAdapter
    from esper_core.karn.capacity import randomize_
    from esper_core.run.recipes import get_recipe

    trainer = build_trainer(get_recipe("tests.helpers.user_models:transformer"), catalog=default_catalog(), run_id="t")
    trainer.model.train()
    slot = trainer.manager.slots["encoder.layers.0"]
    slot.seed = randomize_(TokenAdapter(32, 4), torch.Generator().manual_seed(0))
    slot.stage = SeedStage.TRAINING
    state = torch.random.get_rng_state()
    assert trainer.isolation_probe("encoder.layers.0") == 0.0
    assert torch.equal(torch.random.get_rng_state(), state)


def test_undrained_events_travel_in_memory_never_in_a_checkpoint(compiled_home: EsperSettings) -> None:
    trainer = _trainer()
    wrong = kernel_from_registry(compiled_home, "lowrank_adapter", "f64-b512")
    refused = germinate_kernel(trainer.manager, "slot0", wrong)
    assert not refused.passed  # its G0 verdict is an event waiting to be drained
    checkpoint, live = trainer.state_dict()["manager"], trainer.state_dict(in_memory=True)["manager"]
    assert "events" not in checkpoint and {k: v for k, v in live.items() if k != "events"} == checkpoint
    names = [e.name for e in live["events"]]
    assert "kasmina.gate.g0_sanity" in names

    def no_kernel(artifact: object) -> LoadedKernel:
        raise AssertionError("no seed to load")

    trainer.manager.load_state_dict(checkpoint, load_kernel=no_kernel)  # a restore keeps them
    assert _events(trainer) == names
    trainer.manager.load_state_dict(live, load_kernel=no_kernel)  # a fork's put-back returns them
    assert _events(trainer) == names
