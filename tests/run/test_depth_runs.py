"""Depth growth inside a real run: Tamiyo inserts a block into a user's GPT through its depth
slot, the block merges into the stack, a run stopped at any commit resumes to the same network
bit for bit, and the deeper network exports as a program torch loads alone.

The recipes are ``tests/helpers/user_models.py``'s ``gpt_deepen`` (deepening only, heuristic)
and ``gpt_deepen_scheduled`` (a stacked copy of the last block inserted after epoch 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from esper_core.contracts import SeedOperation
from esper_core.contracts.enums import SlotKind
from esper_core.karn.depth import DEPTH_PROFILE
from esper_core.run.config import ModelSpec
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from tests.helpers.exported import run_with_torch_alone
from tests.helpers.state import assert_same_state
from tests.helpers.stepping import run_to_the_end

SCHEDULED = "tests.helpers.user_models:gpt_deepen_scheduled"
HEURISTIC = "tests.helpers.user_models:gpt_deepen"
SLOT = "blocks+depth"


def test_the_depth_menu_fits_depth_slots_only_and_needs_no_kernel(esper_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="plan"), settings=esper_home)
    try:
        plan = session.plan
        assert plan.built_slots == {SLOT: "blocks.1.proj"} and plan.slots == {}
        assert plan.slot_fits[SLOT] == ("depth-stack", "depth-stack-all", "depth-fresh")
        candidates = session.control.candidates()
        assert [c.blueprint_id for c in candidates] == ["depth-stack", "depth-stack-all", "depth-fresh"]
        assert all(c.shape_profiles == frozenset({DEPTH_PROFILE}) and c.kind is SlotKind.DEPTH for c in candidates)
        block = sum(p.numel() for p in session.trainer.model.model.blocks[-1].parameters())
        blocks = len(session.trainer.model.model.blocks)
        assert [c.param_cost for c in candidates] == [block, blocks * block, block]
        (state,) = session.manager.export_seed_states()
        assert (state.shape_profile, state.kind, state.layer) == (DEPTH_PROFILE, SlotKind.DEPTH, "blocks.1.proj")
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.timeout(900)  # four runs: ~2 min on 2 quiet cores; several when other jobs share them
def test_a_scheduled_depth_seed_merges_and_a_resumed_run_is_the_same_network(esper_home: EsperSettings) -> None:
    straight = run_to_the_end(esper_home, "straight", recipe=SCHEDULED)
    try:
        ops = [c.seed_operation for c in straight.commands]
        assert SeedOperation.GERMINATE in ops and SeedOperation.FOSSILIZE in ops, ops
        assert len(straight.trainer.model.model.blocks) == 3
        # The packets describe the network as it is: the merged block's layers from the merge on.
        assert "blocks.2.proj" in [layer.name for layer in straight.history[-1].layers]
        assert "blocks.2.proj" not in [layer.name for layer in straight.history[0].layers]
        expected = straight.trainer.state_dict()
    finally:
        straight.close()
    # Stopped with the seed training in isolation (epoch 1), blending (2) and after its merge (4).
    for stop in (1, 2, 4):
        resumed = run_to_the_end(esper_home, f"resumed-{stop}", stop_after=stop, recipe=SCHEDULED)
        try:
            got = resumed.trainer.state_dict()
            for key in ("model", "optimizer"):
                assert_same_state(expected[key], got[key], key)
            assert got["manager"]["architecture"] == expected["manager"]["architecture"] == {SLOT: 3}
        finally:
            resumed.close()


@pytest.mark.slow
def test_the_heuristic_inserts_a_block(esper_home: EsperSettings) -> None:
    session = run_to_the_end(esper_home, "heuristic", recipe=HEURISTIC)
    try:
        germinated = [c for c in session.commands if c.seed_operation is SeedOperation.GERMINATE]
        assert germinated and all(c.slot_id == SLOT for c in germinated), session.commands
        assert germinated[0].blueprint_id in ("depth-stack", "depth-fresh")
    finally:
        session.close()


def test_a_stack_that_cannot_deepen_is_refused_when_the_recipe_is_checked() -> None:
    from esper_core.run.plan import check_recipe

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 16)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            for block in self.blocks:
                h = block(h)
            return h

    config = get_recipe(HEURISTIC)
    config.host = ModelSpec(build=Pair, deepen=("blocks",), input_dtype=torch.long, batch_max=64)
    with pytest.raises(ValueError, match="'blocks' holds blocks that differ: block 1 .* identical blocks"):
        check_recipe(config)


@pytest.mark.slow
def test_a_deepened_gpt_exports_and_loads_with_torch_alone(esper_home: EsperSettings, tmp_path: Path) -> None:
    from esper_core.run.export import export_run

    session = run_to_the_end(esper_home, "grown", recipe=SCHEDULED)
    try:
        x, _ = session.trainer.data.test.head(16)
        session.trainer.model.eval()
        with torch.inference_mode():
            expected = session.trainer.model(x)
        deeper = sum(p.numel() for p in session.trainer.model.model.parameters())
        assert len(session.trainer.model.model.blocks) == 3
    finally:
        session.close()
    done = export_run(settings=esper_home, run_id="grown", out=tmp_path / "out")
    assert done.max_abs_diff < 1e-4 and done.parameters == deeper
    (out,) = run_with_torch_alone(tmp_path / "out" / "model.pt2", [x], tmp_path)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_processes_train_the_single_process_run_across_a_depth_change(esper_home: EsperSettings) -> None:
    from esper_core.run.ranks import launch
    from esper_core.run.steps import grow_epoch

    launch(RunSpec(run_id="two", recipe=SCHEDULED, nproc=2, device="cpu"), esper_home)
    one = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="one"), settings=esper_home)
    while one.epoch < one.config.epochs:
        grow_epoch(one, one.epoch)
    two = Run.resume(settings=esper_home, run_id="two")
    try:

        def growth(session: Run) -> list[tuple[int, str, str | None, str | None]]:
            return [(c.epoch, c.action, c.slot_id, c.blueprint_id) for c in session.commands if c.action != "wait"]

        assert growth(two) == growth(one) and {a for _, a, _, _ in growth(one)} >= {"germinate", "fossilize"}
        for a, b in zip(one.history, two.history, strict=True):
            assert b.val_loss == pytest.approx(a.val_loss, rel=1e-5)
            assert [s.stage for s in b.seeds] == [s.stage for s in a.seeds]
        assert len(two.trainer.model.model.blocks) == len(one.trainer.model.model.blocks) == 3
        width = one.trainer.model.model.ln_f.normalized_shape[0]
        named = zip(one.trainer.model.named_parameters(), two.trainer.model.parameters(), strict=True)
        for (name, p), q in named:
            if name.endswith("attn.qkv.bias"):
                # The key bias adds the same score to every key of a query, which softmax cancels:
                # its gradient is rounding noise, which Adam scales up to steps of about lr, so
                # another summation order gives it other values. Queries and values must agree.
                p, q = torch.cat([p[:width], p[2 * width :]]), torch.cat([q[:width], q[2 * width :]])
            torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4, msg=name)
        x, _ = one.trainer.data.val.head(16)
        with torch.inference_mode():
            torch.testing.assert_close(two.trainer.model(x), one.trainer.model(x), atol=1e-5, rtol=1e-4)
    finally:
        one.close()
        two.close()
