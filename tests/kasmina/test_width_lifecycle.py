"""Width seeds through Kasmina's lifecycle: gates, isolation, blending, merge, cull, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from esper_core.contracts import BlendSchedule, GateVerdict, SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.manager import EpochObservation, SeedManager
from esper_core.models.mnist1d import MNIST1DMLP
from tests.helpers.signals import FixedSignals

SLOT = "fc1+width"


class Run:
    """A GrowableModel with a width slot on ``fc1``, its seed manager and an Adam optimizer."""

    def __init__(self, *, width: int = 6, init: str = "gradmax") -> None:
        torch.manual_seed(0)
        self.model = GrowableModel(
            MNIST1DMLP(width=width), slots=("act2",), sample_shape=(40,), batch_max=64, widen=("fc1",)
        )
        config = KasminaConfig(width_init=init)  # type: ignore[arg-type]
        self.manager = SeedManager(self.model.slots(), catalog=default_catalog(), config=config)
        self.opt = torch.optim.Adam(self.model.host_parameters(), lr=1e-2)
        self.manager.bind_optimizer(self.opt, base_lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(64, 40, generator=gen), torch.randint(0, 10, (64,), generator=gen)
        self.manager.bind_signals(FixedSignals(self.model, [(self.x, self.y)], F.cross_entropy))

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()

    def loss(self) -> float:
        with torch.no_grad():
            return float(F.cross_entropy(self.model(self.x), self.y))

    def germinate(self, units: int = 3) -> None:
        verdict = self.manager.germinate(
            SLOT, "width-50", params={"units": units}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=2, lr_scale=1.0
        )
        assert verdict.passed, verdict.reason

    def end_epoch(self) -> None:
        plan = self.manager.probe_plan()
        probes = {}
        for sid, alpha in plan.items():
            with self.manager.probe(sid, alpha):
                probes[sid] = self.loss()
        seed = self.model.slots()[SLOT].seed
        norms = {SLOT: float(sum(p.grad.norm() for p in seed.parameters() if p.grad is not None))} if seed else {}
        self.manager.end_epoch(
            EpochObservation(
                val_loss=self.loss(),
                seed_grad_norms=norms,
                probe_losses=probes,
                isolation_probe=lambda _sid: 0.0,
                sample_input=lambda _sid: self.x[:4],
            )
        )


def test_each_slot_takes_seeds_of_its_kind_only_and_g0_bounds_the_units() -> None:
    run = Run(init="random")
    args = {"blend_schedule": BlendSchedule.LINEAR, "blend_epochs": 1, "lr_scale": 1.0}
    with pytest.raises(ValueError, match="'lowrank_adapter' is not on the width menu"):
        run.manager.germinate(SLOT, "lowrank_adapter", params={}, **args)
    # A branch slot's kind needs a registry kernel, and says how to give it one.
    with pytest.raises(ValueError, match="slot act2 takes registry kernels: germinate it with kernels="):
        run.manager.germinate("act2", "lowrank_adapter", params={}, **args)
    assert run.model.slots()["act2"].stage is SeedStage.DORMANT
    slot = run.model.slots()[SLOT]
    verdict = run.manager.germinate(SLOT, "width-100", params={"units": 7}, **args)
    assert not verdict.passed and "may add 1..6 at once" in verdict.reason
    assert slot.stage is SeedStage.DORMANT and slot.seed is None


def test_a_width_seed_grows_through_every_gate_and_merges_into_a_wider_host() -> None:
    run = Run(init="gradmax")
    run.germinate()
    for _ in range(12):
        run.manager.start_epoch()
        for _ in range(3):
            run.step()
        run.end_epoch()
        if run.model.slots()[SLOT].stage is SeedStage.PROBATIONARY and run.manager.export_seed_states()[1].last_gate:
            gate = run.manager.export_seed_states()[1].last_gate
            if gate.gate.value == "g4_system_impact" and gate.passed:
                break
    slot = run.model.slots()[SLOT]
    assert slot.stage is SeedStage.PROBATIONARY, slot.stage
    before = run.model(run.x).detach()
    run.manager.fossilize(SLOT)
    assert slot.stage is SeedStage.DORMANT and slot.seed is None and slot.site.width == 9
    assert run.model.model.fc1.out_features == 9 and run.model.model.fc2.in_features == 9
    assert run.model.layer_widths[0] == 9
    torch.testing.assert_close(run.model(run.x), before, rtol=1e-5, atol=1e-6)
    # Only the host's (now wider) parameters are left in the optimizer, with their Adam state.
    params = [p for g in run.opt.param_groups for p in g["params"]]
    assert {id(p) for p in params} == {id(p) for p in run.model.host_parameters()}
    assert run.opt.state[run.model.model.fc1.weight]["exp_avg"].shape == (9, 40)
    run.step()  # and training goes on at the new width
    names = [e.name for e in run.manager.drain_events()]
    assert "kasmina.width.merged" in names and "kasmina.gate.g3_interface" in names


def test_a_culled_width_seed_leaves_the_host_bit_identical_to_one_that_never_had_it() -> None:
    grown, plain = Run(init="random"), Run()
    grown.germinate()
    grown.manager.start_epoch()  # TRAINING: isolated
    plain.manager.start_epoch()
    for _ in range(3):
        grown.step()
        plain.step()
        assert torch.equal(grown.model(grown.x), plain.model(plain.x))
    grown.manager.cull(SLOT, reason="test")
    for p, q in zip(grown.model.host_parameters(), plain.model.host_parameters(), strict=True):
        assert torch.equal(p, q)
    assert grown.model.slots()[SLOT].stage is SeedStage.EMBARGOED
    assert all(len(g["params"]) for g in grown.opt.param_groups) and len(grown.opt.param_groups) == 1


def test_a_checkpoint_after_a_merge_restores_the_wider_network_exactly() -> None:
    run = Run(init="tiny")
    run.germinate()
    slot = run.model.slots()[SLOT]
    # Straight to PROBATIONARY with G4 passed, as the gates would after training.
    run.manager.start_epoch()
    run.manager.advance(SLOT)
    run.manager.advance(SLOT)
    assert slot.stage is SeedStage.PROBATIONARY
    run.end_epoch()
    run.manager.fossilize(SLOT)
    run.step()
    state = {"manager": copy.deepcopy(run.manager.state_dict()), "model": copy.deepcopy(run.model.state_dict())}
    opt_state = copy.deepcopy(run.opt.state_dict())
    fresh = Run()
    fresh.manager.load_state_dict(state["manager"], load_kernel=None)  # type: ignore[arg-type]
    fresh.model.load_state_dict(state["model"])
    fresh.opt.load_state_dict(opt_state)
    assert torch.equal(fresh.model(fresh.x), run.model(run.x))
    run.step(), fresh.step()
    assert torch.equal(fresh.model(fresh.x), run.model(run.x))
    assert isinstance(fresh.model.model.fc1, nn.Linear) and fresh.model.model.fc1.out_features == 9


def test_a_width_seed_waits_while_an_adjacent_layer_has_one_in_flight() -> None:
    """fc1 feeds fc2: a merge of either would change the other seed's input or output width under
    it (a run's periodic arm hit this as a shape error), so G0 refuses the second one."""
    torch.manual_seed(0)
    model = GrowableModel(MNIST1DMLP(width=6), slots=("act2",), sample_shape=(40,), batch_max=64, widen=("fc1", "fc2"))
    manager = SeedManager(model.slots(), catalog=default_catalog(), config=KasminaConfig(width_init="random"))
    manager.bind_optimizer(torch.optim.Adam(model.host_parameters(), lr=1e-2), base_lr=1e-2)
    x, _ = torch.randn(8, 40), torch.randint(0, 10, (8,))

    def germinate(slot_id: str) -> GateVerdict:
        return manager.germinate(
            slot_id, "width-25", params={"units": 2}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=1, lr_scale=1.0
        )

    assert germinate("fc2+width").passed
    refused = germinate("fc1+width")
    assert not refused.passed and "adjacent to width seed(s) in flight in ['fc2+width']" in refused.reason
    assert model.slots()["fc1+width"].stage is SeedStage.DORMANT
    manager.cull("fc2+width", reason="make way")
    assert germinate("fc1+width").passed
    assert model(x).shape == (8, 10)
