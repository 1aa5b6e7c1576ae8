"""Depth seeds through Kasmina's lifecycle: isolation, blending, cull, merge, optimizer state,
checkpoints and plain copies, on a two-block character GPT."""

from __future__ import annotations

import copy

import pytest
import torch

from esper_core.contracts import BlendSchedule, SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.config import KasminaConfig
from esper_core.kasmina.depth import DepthSeed
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.manager import EpochObservation, SeedManager
from esper_core.models.chars_gpt import CharGPT, next_char_loss
from tests.helpers.gates import pass_to_probation

SLOT = "blocks+depth"


class Run:
    """A two-block CharGPT with a depth slot on ``blocks``, its seed manager and Adam."""

    def __init__(self, config: KasminaConfig | None = None) -> None:
        torch.manual_seed(0)
        gpt = CharGPT(vocab=16, context=8, width=16, depth=2, heads=2)
        self.model = GrowableModel(
            gpt, slots=(), deepen=("blocks",), sample_shape=(8,), batch_max=8, input_dtype=torch.long, causal=True
        )
        self.manager = SeedManager(self.model.slots(), catalog=default_catalog(), config=config)
        self.opt = torch.optim.Adam(self.model.host_parameters(), lr=1e-2)
        self.manager.bind_optimizer(self.opt, base_lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randint(0, 16, (8, 8), generator=gen), torch.randint(0, 16, (8, 8), generator=gen)

    @property
    def blocks(self) -> torch.nn.ModuleList:
        return self.model.model.blocks

    @property
    def slot(self):  # noqa: ANN201 (a DepthSlot)
        return self.model.slots()[SLOT]

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        next_char_loss(self.model(self.x), self.y).backward()
        self.opt.step()

    def out(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(self.x)

    def germinate(self, entry: str = "depth-stack") -> None:
        verdict = self.manager.germinate(
            SLOT, entry, params={}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=2, lr_scale=1.0
        )
        assert verdict.passed, verdict.reason

    def to_probation(self) -> None:
        """Straight to PROBATIONARY with G4 passed, as the gates would after training."""
        pass_to_probation(self.manager, SLOT, loss=lambda: next_char_loss(self.out(), self.y), sample=self.x)


def test_a_stacked_seed_is_a_copy_of_the_last_block_with_its_adam_moments() -> None:
    run = Run()
    for _ in range(3):
        run.step()
    run.germinate()
    seed = run.slot.seed
    assert isinstance(seed, DepthSeed) and seed.blocks[0] is not run.blocks[-1]
    source = run.blocks[-1].state_dict()
    assert all(torch.equal(v, source[k]) for k, v in seed.blocks[0].state_dict().items())
    for p, q in zip(seed.blocks[0].parameters(), run.blocks[-1].parameters(), strict=True):
        mine, theirs = run.opt.state[p], run.opt.state[q]
        assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and mine["exp_avg"] is not theirs["exp_avg"]
        assert torch.equal(mine["exp_avg_sq"], theirs["exp_avg_sq"]) and float(mine["step"]) == 3
    # The seed's parameters train in its own group; the host's group is the host's alone.
    assert [g.get("slot_id") for g in run.opt.param_groups] == [None, SLOT]
    assert {id(p) for p in run.opt.param_groups[1]["params"]} == {id(p) for p in seed.parameters()}
    # At alpha 1 the slot computes the network with the copy appended (one rounding apart).
    deeper = run.model.plain_copy()  # without the slot's hook, which a copy of the live block would keep
    deeper.blocks.append(copy.deepcopy(deeper.blocks[-1]))
    with run.manager.probe(SLOT, 1.0):
        torch.testing.assert_close(run.out(), deeper(run.x).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("entry", ["depth-stack", "depth-stack-all", "depth-fresh"])
def test_a_depth_seed_is_the_identity_at_alpha_0_and_neither_runs_nor_trains_until_it_blends(entry: str) -> None:
    grown, plain = Run(), Run()
    grown.step(), plain.step()
    before = grown.out()
    grown.germinate(entry)
    germinated = [p.detach().clone() for p in grown.slot.seed.parameters()]
    if entry == "depth-fresh":  # a block of the same architecture, its own weights
        assert not torch.equal(grown.slot.seed.blocks[0].fc.weight, grown.blocks[-1].fc.weight)
    assert torch.equal(grown.out(), before)  # GERMINATED: not applied yet
    grown.manager.start_epoch()
    plain.manager.start_epoch()
    assert grown.slot.stage is SeedStage.TRAINING
    for _ in range(3):
        assert torch.equal(grown.out(), plain.out())  # isolated: the host's output, bit for bit
        grown.step(), plain.step()
        # ... and the host's gradients, so the host trains exactly as without the seed.
        for p, q in zip(grown.model.host_parameters(), plain.model.host_parameters(), strict=True):
            assert torch.equal(p, q)
    # Not trained in isolation: the seed's blocks are exactly as germinated, with no gradient.
    assert all(p.grad is None for p in grown.slot.seed.parameters())
    assert all(torch.equal(p, q) for p, q in zip(grown.slot.seed.parameters(), germinated, strict=True))
    grown.manager.advance(SLOT)  # BLENDING, alpha at the schedule's first step
    assert grown.slot.stage is SeedStage.BLENDING and 0.0 < grown.slot.alpha < 1.0
    assert not torch.equal(grown.out(), plain.out())
    grown.slot.alpha = 0.0
    assert torch.equal(grown.out(), plain.out())
    grown.slot.alpha = 0.5
    grown.step()  # blended, the seed trains jointly with the host
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in grown.slot.seed.parameters())


def test_an_isolated_seed_culled_leaves_the_trained_host_exactly_as_without_it() -> None:
    grown, plain = Run(), Run()
    grown.germinate()
    grown.manager.start_epoch()
    plain.manager.start_epoch()
    for _ in range(3):
        grown.step(), plain.step()
    grown.manager.cull(SLOT, reason="test")
    for p, q in zip(grown.model.host_parameters(), plain.model.host_parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(grown.out(), plain.out())
    assert len(grown.opt.param_groups) == 1 and not grown.blocks[-1]._forward_hooks


def test_fossilising_appends_the_block_to_the_stack_and_frees_the_slot_to_deepen_again() -> None:
    run = Run()
    run.step()
    run.germinate()
    run.to_probation()
    before = run.out()
    block = run.slot.seed.blocks[0]
    moments = run.opt.state[next(block.parameters())]["exp_avg"].clone()
    run.manager.fossilize(SLOT)
    assert len(run.blocks) == 3 and run.blocks[2] is block
    assert run.slot.stage is SeedStage.DORMANT and run.slot.seed is None
    assert run.manager.structure_signature() == ((SLOT, "dormant", None, 3),)
    # h + 1 * (block(h) - h) became block(h): one rounding apart.
    torch.testing.assert_close(run.out(), before, rtol=1e-5, atol=1e-6)
    # One host group, in the host's parameter order, the merged block's Adam state kept.
    assert len(run.opt.param_groups) == 1
    assert [id(p) for p in run.opt.param_groups[0]["params"]] == [id(p) for p in run.model.host_parameters()]
    assert torch.equal(run.opt.state[next(block.parameters())]["exp_avg"], moments)
    names = [e.name for e in run.manager.drain_events()]
    assert "kasmina.depth.merged" in names
    run.step()
    # The next seed copies the merged block and hooks onto it, the stack's last now.
    run.germinate()
    assert set(run.blocks[2]._forward_hooks) == set(run.slot.hook_ids) and not run.blocks[1]._forward_hooks
    run.to_probation()
    run.manager.fossilize(SLOT)
    assert len(run.blocks) == 4


def test_a_checkpoint_after_a_merge_and_with_a_seed_in_flight_restores_exactly() -> None:
    run = Run()
    run.step()
    run.germinate()
    run.to_probation()
    run.manager.fossilize(SLOT)
    run.step()
    run.germinate()  # a second seed, training, with copied moments
    run.manager.start_epoch()
    run.step()
    state = copy.deepcopy(
        {"manager": run.manager.state_dict(), "model": run.model.state_dict(), "opt": run.opt.state_dict()}
    )
    assert state["manager"]["architecture"] == {SLOT: 3}
    fresh = Run()
    fresh.manager.load_state_dict(state["manager"], load_kernel=None)  # type: ignore[arg-type]
    fresh.model.load_state_dict(state["model"])
    fresh.opt.load_state_dict(state["opt"])
    assert len(fresh.blocks) == 3 and fresh.slot.stage is SeedStage.TRAINING
    assert torch.equal(fresh.out(), run.out())
    for _ in range(2):
        run.step(), fresh.step()
    assert torch.equal(fresh.out(), run.out())
    for p, q in zip(fresh.model.parameters(), run.model.parameters(), strict=True):
        assert torch.equal(p, q)
    # Back to the depth of an earlier state (a rollback): the block leaves stack and optimizer.
    earlier = {**state["manager"], "architecture": {SLOT: 2}, "group_order": []}
    fresh.manager.load_state_dict(earlier, load_kernel=None)  # type: ignore[arg-type]
    assert len(fresh.blocks) == 2
    assert [id(p) for p in fresh.opt.param_groups[0]["params"]] == [id(p) for p in fresh.model.host_parameters()]


def test_a_plain_copy_carries_a_merged_block_and_copy_into_merges_or_isolates_a_live_one() -> None:
    run = Run()
    run.step()
    run.germinate()
    run.to_probation()
    with pytest.raises(ValueError, match=r"blocks\+depth.*change the network's output"):
        run.model.plain_copy()
    twin = copy.deepcopy(run.model.model)
    for module in twin.modules():
        module._forward_hooks.clear()
    run.manager.copy_seeds_into(twin, merged=True)
    assert len(twin.blocks) == 3
    torch.testing.assert_close(twin(run.x), run.out(), rtol=1e-5, atol=1e-6)
    run.manager.fossilize(SLOT)
    plain = run.model.plain_copy()
    assert len(plain.blocks) == 3 and not any(m._forward_hooks for m in plain.modules())
    assert torch.equal(plain(run.x), run.out())


def test_stacking_the_whole_stack_copies_every_block_in_order_with_its_moments_and_doubles_it() -> None:
    run = Run()
    for _ in range(3):
        run.step()
    cost = run.manager.slots[SLOT].kind.param_cost(run.slot, "depth-stack-all")
    assert cost == sum(p.numel() for p in run.blocks.parameters())
    run.germinate("depth-stack-all")
    seed = run.slot.seed
    assert isinstance(seed, DepthSeed) and len(seed.blocks) == 2
    for copied, source in zip(seed.blocks, run.blocks, strict=True):
        assert copied is not source
        assert all(torch.equal(v, source.state_dict()[k]) for k, v in copied.state_dict().items())
        for p, q in zip(copied.parameters(), source.parameters(), strict=True):
            assert torch.equal(run.opt.state[p]["exp_avg_sq"], run.opt.state[q]["exp_avg_sq"])
    # At alpha 1: b0 b1 b0 b1, G_stack's doubled network (one rounding apart).
    doubled = run.model.plain_copy()
    doubled.blocks.extend([copy.deepcopy(doubled.blocks[0]), copy.deepcopy(doubled.blocks[1])])
    with run.manager.probe(SLOT, 1.0):
        torch.testing.assert_close(run.out(), doubled(run.x).detach(), rtol=1e-5, atol=1e-6)
    run.to_probation()
    before = run.out()
    run.manager.fossilize(SLOT)
    assert len(run.blocks) == 4 and run.blocks[2] is seed.blocks[0] and run.blocks[3] is seed.blocks[1]
    torch.testing.assert_close(run.out(), before, rtol=1e-5, atol=1e-6)
    assert [id(p) for p in run.opt.param_groups[0]["params"]] == [id(p) for p in run.model.host_parameters()]


def test_a_checkpoint_with_a_whole_stack_seed_in_flight_restores_it_at_its_size() -> None:
    run = Run()
    run.step()
    run.germinate("depth-stack-all")
    run.manager.start_epoch()
    run.step()
    state = copy.deepcopy(
        {"manager": run.manager.state_dict(), "model": run.model.state_dict(), "opt": run.opt.state_dict()}
    )
    fresh = Run()
    fresh.manager.load_state_dict(state["manager"], load_kernel=None)  # type: ignore[arg-type]
    fresh.model.load_state_dict(state["model"])
    fresh.opt.load_state_dict(state["opt"])
    assert len(fresh.slot.seed.blocks) == 2 and fresh.slot.stage is SeedStage.TRAINING
    with run.manager.probe(SLOT, 1.0), fresh.manager.probe(SLOT, 1.0):
        assert torch.equal(fresh.out(), run.out())
    for _ in range(2):
        run.step(), fresh.step()
    for p, q in zip(fresh.model.parameters(), run.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_depth_seed_passes_g1_without_gradients_and_blends_after_its_training_epoch() -> None:
    run = Run()
    run.step()
    run.germinate("depth-stack-all")
    run.manager.start_epoch()
    run.step()
    with run.manager.probe(SLOT, 1.0):
        with_seed = float(next_char_loss(run.out(), run.y))
    verdicts = run.manager.end_epoch(
        EpochObservation(
            val_loss=float(next_char_loss(run.out(), run.y)),
            seed_grad_norms={},  # no gradient: the seed did not run
            probe_losses={SLOT: with_seed},
            isolation_probe=lambda _sid: 0.0,
            sample_input=lambda _sid: torch.randn(2, 8, 16),  # the stack's output: (B, L, D)
        )
    )
    reasons = {v.gate.value: (v.passed, v.reason) for v in verdicts}
    (g1,) = [e for e in run.manager.drain_events() if e.name == "kasmina.gate.g1_gradient_health"]
    assert g1.attributes["passed"] and "do not train in isolation" in g1.message, g1.message
    assert run.slot.stage is SeedStage.BLENDING, reasons
