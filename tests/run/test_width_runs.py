"""Width growth inside a real run: Tamiyo widens a user's CNN through its width slots, the seed
merges into the layer, and a run stopped at any commit resumes to the same network bit for bit.

The recipes are ``tests/helpers/user_models.py``'s ``cnn_widen`` (widening only, heuristic) and
``cnn_widen_scheduled`` (a branch slot too; the first convolution widened by half after epoch 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from esper_core.contracts import SeedOperation
from esper_core.karn.width import WIDTH_PROFILE
from esper_core.run.config import ModelSpec
from esper_core.run.recipes import get_recipe
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from tests.helpers.exported import run_with_torch_alone
from tests.helpers.state import assert_same_state
from tests.helpers.stepping import flow_epoch, run_to_the_end
from tests.helpers.user_models import DigitsCNN

SCHEDULED = "tests.helpers.user_models:cnn_widen_scheduled"


def test_the_width_menu_fits_width_slots_only_and_needs_no_kernel(esper_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="plan"), settings=esper_home)
    try:
        plan = session.plan
        assert plan.built_slots == {"features.0+width": "features.0", "features.3+width": "features.3"}
        # No kernel is compiled for a width slot, and no branch blueprint is offered to one.
        assert set(plan.slots) == {"features.2"}
        assert plan.slot_fits["features.0+width"] == ("width-25", "width-50", "width-100")
        assert "width-50" not in plan.slot_fits["features.2"]
        # An empty registry: no branch kernel, but the width menu is there, costed at the live
        # layers' widths every time it is asked, without touching the run's random stream (a
        # data-parallel run asks on rank 0 alone).
        rng = torch.random.get_rng_state()
        candidates = session.control.candidates()
        assert torch.equal(torch.random.get_rng_state(), rng)
        assert [c.blueprint_id for c in candidates] == ["width-25", "width-50", "width-100"]
        assert all(c.shape_profiles == frozenset({WIDTH_PROFILE}) for c in candidates)
        costs = [c.param_cost for c in candidates]
        assert costs == sorted(costs) and costs[0] > 0
        profiles = {s.slot_id: s.shape_profile for s in session.manager.export_seed_states()}
        assert profiles["features.0+width"] == WIDTH_PROFILE != profiles["features.2"]
    finally:
        session.close()


@pytest.mark.slow
def test_a_scheduled_width_seed_merges_and_a_resumed_run_is_the_same_network(esper_home: EsperSettings) -> None:
    straight = run_to_the_end(esper_home, "straight", recipe=SCHEDULED)
    try:
        ops = [c.seed_operation for c in straight.commands]
        assert SeedOperation.GERMINATE in ops and SeedOperation.FOSSILIZE in ops, ops
        # The first convolution grew 8 -> 12 channels; the rest kept their width.
        assert straight.trainer.model.layer_widths == (12, 16, 10)
        model = straight.trainer.model.model
        assert model.features[1].running_mean.shape == (12,)
        assert model.features[3].weight.shape == (16, 12, 3, 3)
        # The packets carry each layer's current width.
        assert straight.history[-1].layers[0].width == 12
        assert straight.history[0].layers[0].width == 8
        expected = straight.trainer.state_dict()
    finally:
        straight.close()
    # Stopped with the seed blending (epoch 2) and after its merge (epoch 4): the same network.
    for stop in (2, 4):
        resumed = run_to_the_end(esper_home, f"resumed-{stop}", stop_after=stop, recipe=SCHEDULED)
        try:
            got = resumed.trainer.state_dict()
            for key in ("model", "optimizer"):
                assert_same_state(expected[key], got[key], key)
            assert (
                got["manager"]["architecture"]
                == expected["manager"]["architecture"]
                == {
                    "features.0+width": 12,
                    "features.3+width": 16,
                }
            )
        finally:
            resumed.close()


def test_a_width_blueprint_in_a_branch_slot_and_a_kernel_in_a_width_slot_are_rejected(
    esper_home: EsperSettings,
) -> None:
    from esper_core.contracts import AdaptationCommand, CommandType

    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="misfit"), settings=esper_home)
    try:
        session.train_epoch()
        for slot, blueprint, why in (
            ("features.0+width", "conv_residual", "not on the width menu"),
            ("features.2", "width-50", "width-50"),
        ):
            command = AdaptationCommand(
                run_id=session.run_id,
                epoch=0,
                command_type=CommandType.SEED,
                seed_operation=SeedOperation.GERMINATE,
                slot_id=slot,
                blueprint_id=blueprint,
                issued_by="test",
                reason="misfit",
            )
            outcome = session.apply(command)
            assert outcome.startswith("rejected") and why in outcome, outcome
        assert session.trainer.model.layer_widths == (8, 16, 10)
    finally:
        session.close()


def test_a_model_spec_names_its_width_slots_and_refuses_bad_widen_lists() -> None:
    spec = ModelSpec(build=DigitsCNN, widen=("features.0",))
    assert spec.slot_ids == ("features.0+width",)
    with pytest.raises(ValueError, match="at least one slot or layer to widen"):
        ModelSpec(build=DigitsCNN)
    with pytest.raises(ValueError, match="write 'features.0'"):
        ModelSpec(build=DigitsCNN, widen=("features.0+width",))
    with pytest.raises(ValueError, match="more than once"):
        ModelSpec(build=DigitsCNN, widen=("features.0", "features.0"))
    with pytest.raises(ValueError, match="string"):
        ModelSpec(build=DigitsCNN, widen="features.0")


def test_a_layer_that_cannot_widen_is_refused_when_the_recipe_is_checked() -> None:
    from esper_core.run.plan import check_recipe

    config = get_recipe("tests.helpers.user_models:cnn_widen")
    # The classifier's Linear is the model's output: no layer reads its units.
    config.host = ModelSpec(build=DigitsCNN, widen=("classifier.1",))
    with pytest.raises(ValueError, match="classifier.1"):
        check_recipe(config)


@pytest.mark.slow
def test_a_grown_network_exports_and_loads_with_torch_alone(esper_home: EsperSettings, tmp_path: Path) -> None:
    from esper_core.run.commits import CHECKPOINTS_DIR
    from esper_core.run.export import export_run
    from esper_core.run.stops import read_stop, record_stop
    from esper_core.tolaria.checkpoint import CheckpointStore
    from tests.helpers.checkpoints import flip

    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="grown"), settings=esper_home)
    try:
        for _ in range(3):
            flow_epoch(session)  # epoch 2: the width seed is blending, so it is not part of the network yet
    finally:
        session.close()
    with pytest.raises(ValueError, match=r"features.0\+width.*change the network's output"):
        export_run(settings=esper_home, run_id="grown")
    assert not (esper_home.runs_dir / "grown" / "export").exists()

    session = Run.start(RunSpec(recipe=SCHEDULED, device="cpu", run_id="grown"), settings=esper_home)
    try:
        while session.epoch < session.config.epochs:
            flow_epoch(session)
        x, _ = session.trainer.data.test.head(16)
        session.trainer.model.eval()
        with torch.inference_mode():
            expected = session.trainer.model(x)
    finally:
        session.close()
    # An export reads the run and changes nothing of it: a stopped run stays stopped.
    stop = record_stop(esper_home.runs_dir / "grown", reason="test", resume=("esper run --run-id grown",))
    done = export_run(settings=esper_home, run_id="grown", out=tmp_path / "out")
    assert done.widths["features.0"] == 12 and done.max_abs_diff < 1e-4
    assert stop is not None and read_stop(esper_home.runs_dir / "grown") == stop
    # A fresh interpreter that imports torch and nothing of Esper's: the README's three lines.
    (out,) = run_with_torch_alone(tmp_path / "out" / "model.pt2", [x], tmp_path)
    # Another process may use other threads (another reduction order): float32 rounding apart.
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    saved = torch.load(tmp_path / "out" / "state_dict.pt")
    assert saved["widths"]["features.0"] == 12
    assert saved["state_dict"]["features.0.weight"].shape == (12, 1, 3, 3)
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert manifest["commit"] == "epoch-0005-applied" and manifest["parameters"] == done.parameters
    # A damaged last commit is reported, and left where it is: resuming the run deals with it.
    latest = CheckpointStore(esper_home.runs_dir / "grown" / CHECKPOINTS_DIR).path("epoch-0005-applied")
    flip(latest)
    with pytest.raises(ValueError, match="epoch-0005-applied is damaged"):
        export_run(settings=esper_home, run_id="grown", out=tmp_path / "again")
    assert latest.exists() and not (tmp_path / "again").exists()


def test_the_compiled_step_retraces_at_growth_events_only(esper_home: EsperSettings) -> None:
    """``tolaria.compile.traces`` per epoch: graphs at the first epoch and after each change of the
    network (a seed in, its stage, its merge), none in an epoch whose network the last one had."""
    session = Run.start(
        RunSpec(recipe="tests.helpers.user_models:mlp_widen_compiled", device="cpu", run_id="traces"),
        settings=esper_home,
    )
    structures = []  # each epoch's seeds, stages and widths as it starts (what the step's graph depends on)
    while session.epoch < session.config.epochs:
        structures.append(session.manager.structure_signature())
        flow_epoch(session)
    assert session.trainer.engine.use_compiled
    packets = [json.loads(line) for line in (session.run_dir / "telemetry.jsonl").read_text().splitlines()]
    traces = [m["value"] for p in packets for m in p["metrics"] if m["name"] == "tolaria.compile.traces"]
    assert len(traces) == session.config.epochs and traces[0] >= 1
    steady = [e for e in range(1, len(traces)) if structures[e] == structures[e - 1]]
    assert steady and all(traces[e] == 0 for e in steady), (traces, structures)
    assert sum(traces[e] for e in range(1, len(traces)) if e not in steady) >= 1  # growth re-traced
    assert session.trainer.model.layer_widths[1] == 72  # the seed merged within the run
    session.close()
