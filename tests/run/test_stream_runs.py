"""Stream growth inside a real run: Tamiyo doubles a user's GPT's width through the stream slot,
the change is kept at once, a run stopped before or after it resumes to the same network bit for
bit, and the wider network exports as a program torch loads alone.

The recipe is ``tests/helpers/user_models.py``'s ``gpt_stream_scheduled`` (doubled after epoch 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper_core.contracts import SeedOperation
from esper_core.contracts.enums import SlotKind
from esper_core.karn.stream import STREAM_PROFILE
from esper_core.kasmina.stream import stream_growth
from esper_core.models.chars_gpt import CharGPT
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from tests.helpers.exported import run_with_torch_alone
from tests.helpers.state import assert_same_state
from tests.helpers.stepping import run_to_the_end

SCHEDULED = "tests.helpers.user_models:gpt_stream_scheduled"
SLOT = "stream"


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_the_stream_menu_fits_the_stream_slot_which_tamiyo_sees_as_a_width_slot(esper_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="plan"), settings=esper_home)
    try:
        assert session.plan.slot_fits[SLOT] == ("stream-2x",)
        (candidate,) = session.control.candidates()
        gpt = session.trainer.model.model
        assert (candidate.blueprint_id, candidate.kind) == ("stream-2x", SlotKind.WIDTH)
        assert candidate.shape_profiles == frozenset({STREAM_PROFILE})
        wider = sum(p.numel() for p in CharGPT(vocab=16, context=8, width=32, depth=2, heads=4).parameters())
        assert (
            candidate.param_cost
            == stream_growth(gpt, output="head")
            == wider - sum(p.numel() for p in gpt.parameters())
        )
        (state,) = session.manager.export_seed_states()
        assert (state.shape_profile, state.kind, state.layer) == (STREAM_PROFILE, SlotKind.WIDTH, "token")
    finally:
        session.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_scheduled_doubling_is_kept_at_once_and_a_resumed_run_is_the_same_network(esper_home: EsperSettings) -> None:
    straight = run_to_the_end(esper_home, "straight", recipe=SCHEDULED)
    try:
        ops = [(c.epoch, c.seed_operation) for c in straight.commands if c.seed_operation is not None]
        assert ops == [(1, SeedOperation.GERMINATE)], ops
        gpt = straight.trainer.model.model
        assert _shapes(gpt) == _shapes(CharGPT(vocab=16, context=8, width=32, depth=2, heads=4))
        assert [b.attn.heads for b in gpt.blocks] == [4, 4]
        # The packets describe the network as it is: 32 units from epoch 2 on.
        widths = [{la.name: la.width for la in p.layers} for p in straight.history]
        assert widths[1]["blocks.0.attn.proj"] == 16 and widths[2]["blocks.0.attn.proj"] == 32
        assert straight.manager.slots[SLOT].stage.value == "dormant"
        expected = straight.trainer.state_dict()
        assert expected["manager"]["architecture"] == {SLOT: 32}
        # Another doubling would cost what doubling the 32-wide network costs, not the planned
        # 16-wide one's: the risk engine's parameter budget reads the live cost.
        (planned,) = straight.plan.built_candidates
        (now,) = straight.control.candidates()
        assert now.param_cost == stream_growth(gpt, output="head") > 3 * planned.param_cost
    finally:
        straight.close()
    # Stopped before the doubling (after epoch 0) and after it (epoch 2).
    for stop in (0, 2):
        resumed = run_to_the_end(esper_home, f"resumed-{stop}", stop_after=stop, recipe=SCHEDULED)
        try:
            got = resumed.trainer.state_dict()
            for key in ("model", "optimizer"):
                assert_same_state(expected[key], got[key], key)
            assert got["manager"]["architecture"] == {SLOT: 32}
        finally:
            resumed.close()


@pytest.mark.slow
def test_a_widened_gpt_exports_and_loads_with_torch_alone(esper_home: EsperSettings, tmp_path: Path) -> None:
    from esper_core.run.export import export_run

    session = run_to_the_end(esper_home, "grown", recipe=SCHEDULED)
    try:
        x, _ = session.trainer.data.test.head(16)
        session.trainer.model.eval()
        with torch.inference_mode():
            expected = session.trainer.model(x)
        wider = sum(p.numel() for p in session.trainer.model.model.parameters())
    finally:
        session.close()
    done = export_run(settings=esper_home, run_id="grown", out=tmp_path / "out")
    assert done.max_abs_diff < 1e-4 and done.parameters == wider
    (out,) = run_with_torch_alone(tmp_path / "out" / "model.pt2", [x], tmp_path)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
