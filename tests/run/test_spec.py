"""A run planned once: the spec is small and serialisable, and the plan is handed to the session."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections import Counter
from pathlib import Path

import pytest

from esper_core.run.commits import START_TAG
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec, check_same_controller, compile_jobs, plan_spec, resolve
from esper_core.settings import EsperSettings
from tests.helpers.planning import count_planning

APPROVING = "tests.helpers.recipes:seed_reference_approving"
MISFIT = "tests.helpers.user_models:cnn_with_a_misfit"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Recipe resolutions (``load_recipe``) and meta-host plans (``meta_host``) made from here on."""
    return count_planning(monkeypatch)


def test_the_spec_is_serialisable() -> None:
    spec = plan_spec(APPROVING, epochs=2, device="cpu", seed=3, run_id="r").spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    as_json = json.loads(json.dumps(dataclasses.asdict(spec)))
    assert as_json["recipe"] == APPROVING and as_json["jobs"][0]["blueprint_id"] == "lowrank_adapter"


def test_a_request_is_resolved_and_planned_once_into_the_planned_run(calls: Counter[str]) -> None:
    planned = plan_spec("seed-reference", epochs=2, device="cpu", run_id="named")
    assert calls == {"resolve": 1, "meta_host": 1}
    assert planned.spec == RunSpec(
        recipe="seed-reference", epochs=2, device="cpu", run_id="named", jobs=planned.plan.jobs
    )
    assert planned.config.epochs == 2 and planned.data.feature_shape == planned.plan.feature_shape


def test_a_recipe_compile_plans_the_jobs_a_run_of_it_plans(calls: Counter[str]) -> None:
    spec = plan_spec(APPROVING, device="cpu").spec
    # The compile_catalog flow asked for the recipe plans it itself (a run's compile takes spec.jobs).
    assert compile_jobs(APPROVING, approved=["norm_gate"]) == list(spec.jobs)
    assert calls["meta_host"] == 2
    assert [j.blueprint_id for j in compile_jobs(APPROVING, blueprints=["lowrank_adapter"])] == ["lowrank_adapter"]


def test_the_jobs_include_the_recipes_approved_blueprints() -> None:
    spec = plan_spec(APPROVING, device="cpu").spec
    assert spec.approved == ("norm_gate",)
    assert [(j.blueprint_id, j.approved) for j in spec.jobs] == [("lowrank_adapter", False), ("norm_gate", True)]
    # What the session plans from the spec alone (a flow run executed again in a new process).
    assert resolve(spec).plan.jobs == spec.jobs


def test_bad_input_is_refused_before_any_work_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        plan_spec("nope")
    with pytest.raises(ValueError, match=r"lists \['residual_mlp'\], which fit none of its slots"):
        plan_spec(MISFIT)
    with pytest.raises(ValueError, match="batch_size 4 cannot be shared by 8 processes"):
        plan_spec("seed-reference", nproc=8)
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        RunSpec(recipe="seed-reference", nproc=0)
    with pytest.raises(ValueError, match="device must be one of"):
        RunSpec(recipe="seed-reference", device="tpu")
    with pytest.raises(ValueError, match="seed must be >= 0"):
        RunSpec(recipe="seed-reference", seed=-1)


@pytest.mark.slow
def test_a_session_builds_on_the_plan_it_is_given_else_resolves_the_spec(
    compiled_home: EsperSettings, calls: Counter[str]
) -> None:
    planned = plan_spec("seed-reference", epochs=2, device="cpu", run_id="given")
    session = Run.start(planned.spec, settings=compiled_home, planned=planned)
    assert session.plan is planned.plan and session.config is planned.config
    assert calls == {"resolve": 1, "meta_host": 1}
    session.close()
    # A spec alone (a flow run executed again in a new process): the session resolves it.
    spec = dataclasses.replace(planned.spec, run_id="elsewhere")
    session = Run.start(spec, settings=compiled_home)
    assert (session.run_id, session.config.epochs, session.plan.jobs) == ("elsewhere", 2, spec.jobs)
    assert calls["resolve"] == 2
    session.close()
    # An existing run reopens at its last commit on the plan given, when that is the plan of its
    # run.json's request (esper run --run-id, the flow's plan-run task): it is not planned again.
    # (A plan of another request goes unused: tests/run/test_run_steps.py.)
    reopened = Run.start(planned.spec, settings=compiled_home, planned=planned)
    assert reopened.committed_tag == START_TAG and reopened.plan is planned.plan
    assert calls["resolve"] == 2
    reopened.close()


def test_run_json_is_the_spec_saved_and_loads_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    spec = RunSpec(recipe="seed-reference", epochs=3, device="cpu", seed=5, run_id="r", nproc=2, max_flops=1000)
    spec.save(run_dir, config=spec.config())
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["version"] == 5 and saved["recipe"] == "seed-reference" and saved["nproc"] == 2
    assert RunSpec.load(run_dir) == spec
    assert RunSpec.load(run_dir).config().epochs == 3
    assert RunSpec.load(run_dir).config().kasmina.max_flops == 1000
    with pytest.raises(ValueError, match="max_flops must be a positive FLOP count a sample"):
        RunSpec(recipe="seed-reference", max_flops=0)


def test_growth_that_stops_is_set_per_run_and_kept_in_run_json(tmp_path: Path) -> None:
    own = RunSpec(recipe="seed-reference").config().tamiyo.risk
    assert own.grow_until == 1.0  # None: the recipe's own
    spec = RunSpec(recipe="seed-reference", epochs=4, device="cpu", seed=0, run_id="r", grow_until=0.25)
    config = spec.config()
    assert config.tamiyo.risk == dataclasses.replace(own, grow_until=0.25)  # the rest of the risk engine kept
    assert spec.key != dataclasses.replace(spec, grow_until=None).key  # a resume plans it again
    run_dir = tmp_path / "r"
    spec.save(run_dir, config=config)
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["grow_until"] == 0.25 and saved["decides"]["risk"]["grow_until"] == 0.25
    assert RunSpec.load(run_dir) == spec
    assert RunSpec.load(run_dir).config().tamiyo.risk.grow_until == 0.25
    check_same_controller(run_dir, RunSpec.load(run_dir).config())  # resolved as it started


@pytest.mark.parametrize("bad", [0, 0.0, 1.5, -0.25])
def test_a_growth_window_outside_the_run_is_refused_naming_the_fix(bad: float) -> None:
    with pytest.raises(ValueError, match=r"grow_until must be a share of the run's epochs in \(0, 1\].*e\.g\. 0\.25"):
        RunSpec(recipe="seed-reference", grow_until=bad)


def test_a_resume_whose_risk_engine_now_resolves_differently_is_refused(tmp_path: Path) -> None:
    spec = RunSpec(recipe="seed-reference", epochs=4, device="cpu", seed=0, run_id="r")
    run_dir = tmp_path / "r"
    spec.save(run_dir, config=spec.config())
    path = run_dir / "run.json"
    fields = json.loads(path.read_text())
    # As a version whose default window was a quarter of the run would have recorded it.
    fields["decides"]["risk"]["grow_until"] = 0.25
    path.write_text(json.dumps(fields))
    with pytest.raises(
        ValueError, match=r"r was decided by risk=.*'grow_until': 0\.25.*now resolves to risk=.*'grow_until': 1\.0"
    ):
        check_same_controller(run_dir, RunSpec.load(run_dir).config())
    # A threshold a later version added (one the record lacks) refuses nothing.
    fields["decides"]["risk"]["grow_until"] = 1.0
    del fields["decides"]["risk"]["max_predicted_risk"]
    path.write_text(json.dumps(fields))
    check_same_controller(run_dir, RunSpec.load(run_dir).config())
    # A run.json from before the risk engine was recorded resumes as ever.
    del fields["decides"]["risk"]
    path.write_text(json.dumps(fields))
    check_same_controller(run_dir, RunSpec.load(run_dir).config())


def test_a_recorded_quarantine_compares_equal_after_its_json_round_trip(tmp_path: Path) -> None:
    config = RunSpec(recipe="seed-reference", run_id="q").config()
    risk = dataclasses.replace(config.tamiyo.risk, quarantined=("norm_gate", "lowrank_adapter"))
    config.tamiyo = dataclasses.replace(config.tamiyo, risk=risk)
    RunSpec(recipe="seed-reference", run_id="q").save(tmp_path / "q", config=config)
    saved = json.loads((tmp_path / "q" / "run.json").read_text())
    assert saved["decides"]["risk"]["quarantined"] == ["norm_gate", "lowrank_adapter"]  # a tuple, saved as a list
    check_same_controller(tmp_path / "q", config)
    with pytest.raises(ValueError, match="was decided by risk="):
        check_same_controller(tmp_path / "q", RunSpec(recipe="seed-reference", run_id="q").config())


def test_a_version_2_run_json_loads_deciding_as_its_recipe_says(tmp_path: Path) -> None:
    """Before ``policy`` and ``max_params`` were kept: the recipe's own (the heuristic by default)."""
    run_dir = tmp_path / "v2"
    run_dir.mkdir()
    fields = {"version": 2, "run_id": "v2", "recipe": "seed-reference", "epochs": 4, "device": "cpu", "seed": 0}
    (run_dir / "run.json").write_text(json.dumps(fields | {"nproc": 1}))
    spec = RunSpec.load(run_dir)
    assert (spec.policy, spec.max_params, spec.max_flops, spec.grow_until) == (None, None, None, None)
    assert spec.config().tamiyo.policy == "heuristic"


def test_a_run_json_written_before_the_spec_owned_it_still_loads(tmp_path: Path) -> None:
    """Version 1 (no version key, device None for the recipe's own): runs started before resume."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    old = {"run_id": "old", "recipe": "seed-reference", "epochs": 4, "device": None, "seed": None}
    (run_dir / "run.json").write_text(json.dumps(old))
    spec = RunSpec.load(run_dir)
    assert (spec.recipe, spec.epochs, spec.device, spec.seed, spec.run_id) == ("seed-reference", 4, None, None, "old")
    assert spec.config().epochs == 4


def test_a_run_json_that_cannot_be_read_is_refused_naming_the_fix(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    with pytest.raises(ValueError, match=r"no run 'r' under .*; list runs with `ls "):
        RunSpec.load(run_dir)
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"version": 6, "recipe": "seed-reference"}))
    with pytest.raises(ValueError, match="run.json version 6, newer than this Esper reads \\(5\\): upgrade Esper"):
        RunSpec.load(run_dir)
    (run_dir / "run.json").write_text(json.dumps({"version": 2, "recipe": "seed-reference", "device": "tpu"}))
    with pytest.raises(ValueError, match="device must be one of"):
        RunSpec.load(run_dir)
