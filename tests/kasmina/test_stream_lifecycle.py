"""Stream seeds through Kasmina: applied by G0 and kept at once, refused (the host untouched) while
another seed could not follow, and a checkpoint's width restored in either direction."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.contracts import BlendSchedule, GateVerdict, SeedStage
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.manager import SeedManager
from esper_core.kasmina.signals import SiteSignals
from esper_core.models.chars_gpt import CharGPT, next_char_loss
from esper_core.run.config import ModelSpec
from tests.helpers.gates import pass_to_probation

STREAM, DEPTH = "stream", "blocks+depth"


class Batches:
    """The growth signals a trainer offers, from one fixed batch."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def first_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.x, self.y)] * batches

    def site_signals(self, reader: nn.Module, joiner: nn.Module, batches: int) -> list[SiteSignals]:
        raise AssertionError("a stream seed reads no site signals")


class Host:
    """A two-block CharGPT 16 wide with a stream slot (and a depth slot), its manager and Adam."""

    def __init__(self, *, signals: bool = True) -> None:
        torch.manual_seed(0)
        self.gpt = CharGPT(vocab=24, context=8, width=16, depth=2, heads=2)
        self.model = GrowableModel(
            self.gpt,
            slots=(),
            deepen=("blocks",),
            widen_stream=True,
            sample_shape=(8,),
            batch_max=8,
            input_dtype=torch.long,
            causal=True,
        )
        self.manager = SeedManager(self.model.slots(), catalog=default_catalog())
        self.opt = torch.optim.Adam(self.model.host_parameters(), lr=1e-2)
        self.manager.bind_optimizer(self.opt, base_lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randint(0, 24, (8, 8), generator=gen), torch.randint(0, 24, (8, 8), generator=gen)
        if signals:
            self.manager.bind_signals(Batches(self.x, self.y))

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        next_char_loss(self.model(self.x), self.y).backward()
        self.opt.step()

    def out(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(self.x)

    def germinate(self, slot: str = STREAM, entry: str = "stream-2x") -> GateVerdict:
        return self.manager.germinate(
            slot, entry, params={}, blend_schedule=BlendSchedule.LINEAR, blend_epochs=1, lr_scale=1.0
        )


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_doubling_is_applied_by_g0_and_kept_at_once() -> None:
    run = Host()
    run.step()
    before, groups = run.out(), [list(g["params"]) for g in run.opt.param_groups]
    run.manager.drain_events()
    verdict = run.germinate()
    assert verdict.passed and "stream doubled 16 -> 32" in verdict.reason, verdict.reason
    slot = run.manager.slots[STREAM]
    assert (slot.stage, slot.seed, slot.width) == (SeedStage.DORMANT, None, 32)
    events = run.manager.drain_events()
    stages = [e.attributes["stage"] for e in events if e.name == "kasmina.seed.stage"]
    assert stages == ["germinated", "fossilized", "dormant"]
    assert any(e.name == "kasmina.stream.doubled" for e in events)
    torch.testing.assert_close(run.out(), before, rtol=0, atol=1e-5)
    # The host's parameters are the same objects, grown: no seed group, nothing new to bind.
    assert [list(g["params"]) for g in run.opt.param_groups] == groups
    run.step()
    # Free again at once: a second doubling.
    assert run.germinate().passed and run.gpt.ln_f.normalized_shape == (64,)


def test_a_doubling_is_refused_while_another_seed_could_not_follow_and_without_a_batch() -> None:
    run = Host()
    assert run.germinate(DEPTH, "depth-stack").passed
    state = _state(run.gpt)
    refused = run.germinate()
    assert not refused.passed and "slots ['blocks+depth'] hold seeds" in refused.reason
    assert all(torch.equal(v, state[k]) for k, v in run.gpt.state_dict().items())
    assert run.manager.slots[STREAM].stage is SeedStage.DORMANT
    bare = Host(signals=False)
    refused = bare.germinate()
    assert not refused.passed and "germinate it within a run" in refused.reason
    assert bare.gpt.token.embedding_dim == 16


@pytest.mark.parametrize("direction", ["forward", "rollback"])
def test_a_checkpoint_gives_the_host_its_width_before_its_weights_load(direction: str) -> None:
    narrow, wide = Host(), Host()
    wide.step()
    assert wide.germinate().passed
    wide.step()
    source, target = (wide, narrow) if direction == "forward" else (narrow, wide)
    saved = source.manager.state_dict()
    weights = _state(source.model)
    target.manager.load_state_dict(saved, load_kernel=lambda a: pytest.fail("no kernel to load"))
    target.model.load_state_dict(weights)
    width = 32 if direction == "forward" else 16
    assert target.manager.slots[STREAM].width == width == target.gpt.token.embedding_dim
    assert [b.attn.heads for b in target.gpt.blocks] == [width // 8] * 2
    torch.testing.assert_close(target.out(), source.out(), rtol=0, atol=0)


def test_a_checkpoint_taken_after_a_block_was_merged_and_the_stream_doubled_resumes_exactly() -> None:
    # The restore deepens the fresh host first (depth slots come before the stream), so the
    # doubling it replays must cover the merged block too, not only the blocks of the graft.
    grown, fresh = Host(), Host()
    grown.step()
    assert grown.germinate(DEPTH, "depth-stack").passed
    pass_to_probation(grown.manager, DEPTH, loss=lambda: next_char_loss(grown.out(), grown.y), sample=grown.x)
    grown.manager.fossilize(DEPTH)
    grown.step()
    assert len(grown.gpt.blocks) == 3 and grown.germinate().passed
    grown.step()
    fresh.manager.load_state_dict(grown.manager.state_dict(), load_kernel=lambda a: pytest.fail("no kernel"))
    fresh.model.load_state_dict(_state(grown.model))
    assert len(fresh.gpt.blocks) == 3 and fresh.gpt.blocks[2].ln1.normalized_shape == (32,)
    torch.testing.assert_close(fresh.out(), grown.out(), rtol=0, atol=0)


def test_what_cannot_double_is_refused_when_the_host_is_built() -> None:
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.mix = nn.Conv1d(8, 8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mix(self.embed(x).transpose(1, 2))

    with pytest.raises(ValueError, match="'mix' is a convolution with 8 channels"):
        GrowableModel(Conv(), slots=(), widen_stream=True, sample_shape=(5,), batch_max=4, input_dtype=torch.long)
    for others in ({"widen": ("mix",), "slots": ()}, {"slots": ("embed",)}):
        with pytest.raises(ValueError, match="choose widen_stream=True alone"):
            ModelSpec(build=Conv, widen_stream=True, **others)
        with pytest.raises(ValueError, match="give widen_stream=True without slots or widen"):
            GrowableModel(Conv(), widen_stream=True, sample_shape=(5,), batch_max=4, input_dtype=torch.long, **others)
