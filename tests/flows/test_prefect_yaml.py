"""prefect.yaml stays declarative and every entrypoint imports to a Prefect flow."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import get_args

import pytest
import yaml
from prefect import Flow

ROOT = Path(__file__).resolve().parents[2]

# The public parameter set of each deployed flow (practice 7: add a recipe or a named sweep,
# not a parameter). Changing one of these is an interface change: update the snapshot on purpose.
PARAMETERS = {
    "morphogenesis": [
        "recipe",
        "epochs",
        "device",
        "seed",
        "run_id",
        "nproc",
        "policy",
        "max_params",
        "max_flops",
        "grow_until",
    ],
    "compile_catalog": ["recipe", "blueprints", "device", "backend", "approve"],
    "benchmark_sweep": ["sweep", "workloads", "max_regression", "baselines_dir"],
    "fault_drills": ["drills"],
    "train_policy": ["recipes", "plan", "device"],
}


def _config() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


def _deployments() -> list[dict]:
    return _config()["deployments"]


def _load(entrypoint: str) -> Flow:
    path, name = entrypoint.split(":")
    spec = importlib.util.spec_from_file_location(f"entry_{name}", ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    flow = getattr(module, name)
    assert isinstance(flow, Flow), entrypoint
    return flow


def test_every_entrypoint_is_a_flow() -> None:
    deployments = _deployments()
    assert {d["entrypoint"].split(":")[1] for d in deployments} >= {"morphogenesis", "compile_catalog"}
    for d in deployments:
        _load(d["entrypoint"])


def test_deployments_use_the_shared_pool_and_schema_enforcement() -> None:
    config = _config()
    pool = config["definitions"]["work_pools"]["esper_process"]
    for d in _deployments():
        assert d["work_pool"] == pool, d["name"]  # the anchor, not a copy that can drift
        assert d["enforce_parameter_schema"] is True


def test_every_flow_is_deployed_once_per_name() -> None:
    names = [(_load(d["entrypoint"]).name, d["name"]) for d in _deployments()]
    assert len(names) == len(set(names)), names
    flows = {flow for flow, _ in names}
    expected = {"morphogenesis", "compile_catalog", "benchmark_sweep", "fault_drills", "train_policy"}
    assert flows >= expected, f"deploy every flow in prefect.yaml; missing {sorted(expected - flows)}"


def test_deployment_parameters_pass_the_flow_schema() -> None:
    for d in _deployments():
        flow = _load(d["entrypoint"])
        flow.validate_parameters(d.get("parameters") or {})  # raises ParameterTypeError when wrong


@pytest.mark.parametrize("flow_name", sorted(PARAMETERS))
def test_public_parameter_set_is_pinned(flow_name: str) -> None:
    # Every deployment of the flow (the Dask ones too) takes the same parameters.
    flows = [f for d in _deployments() if (f := _load(d["entrypoint"])).name == flow_name]
    assert flows
    for flow in flows:
        assert list(flow.parameters.properties) == PARAMETERS[flow_name], (
            f"{flow_name}'s parameters changed; prefer a recipe or named sweep over a new parameter, "
            "and update PARAMETERS here (and flows/scale_out.py) if the change is intended"
        )


def test_the_sweep_schedule_is_a_cron_that_starts_disabled() -> None:
    config = _config()
    schedule = config["definitions"]["schedules"]["nightly_sweep"]
    assert schedule["cron"].count(" ") == 4 and schedule["active"] is False
    scheduled = [d for d in _deployments() if d.get("schedules")]
    assert [d["entrypoint"] for d in scheduled] == ["flows/benchmark_sweep.py:benchmark_sweep"]
    assert scheduled[0]["schedules"] == [schedule]


def test_workers_find_the_code_without_a_preset_variable() -> None:
    config = _config()
    (step,) = config["pull"]
    directory = step["prefect.deployments.steps.set_working_directory"]["directory"]
    build_ids = [next(iter(s.values())).get("id") for s in config["build"]]
    assert directory == "{{ project.stdout }}" and "project" in build_ids


def test_choice_types_list_exactly_the_registered_names() -> None:
    # One edit adds a recipe, sweep, plan or drill: the registry and its Literal, kept equal here.
    from esper_core._capabilities import DEVICE_CHOICES, Device
    from esper_core.benchmarks.registry import SWEEPS, SweepName
    from esper_core.run.recipes import RECIPES, RecipeName
    from esper_core.studies.simic_train import PLANS, PlanName
    from esper_core.tezzeret.config import Backend, BackendName
    from tasks.drills import DRILLS, DrillName

    assert sorted(get_args(RecipeName)) == sorted(RECIPES), "add the new recipe's name to RecipeName"
    assert sorted(get_args(SweepName)) == sorted(SWEEPS)
    assert sorted(get_args(PlanName)) == sorted(PLANS)
    assert sorted(get_args(DrillName)) == sorted(DRILLS)
    assert sorted(get_args(BackendName)) == sorted(b.value for b in Backend)
    assert get_args(Device) == DEVICE_CHOICES


# Parameters with a fixed set of values offer that set in the schema (the UI shows a choice).
CHOICES = {
    ("morphogenesis", "device"): ["auto", "cpu", "cuda"],
    ("compile_catalog", "backend"): ["export", "aot_inductor"],
    ("benchmark_sweep", "sweep"): ["growth", "nightly", "smoke"],
    ("train_policy", "plan"): [
        "default",
        "smoke",
        "counterfactual",
        "varied",
        "counterfactual-varied",
        "search",
        "search-smoke",
    ],
}


def test_fixed_choices_are_enums_in_every_deployments_schema() -> None:
    from esper_core.run.recipes import RECIPE_IMPORT_PATTERN, RECIPES

    for d in _deployments():
        flow = _load(d["entrypoint"])
        properties = flow.parameters.model_dump()["properties"]
        for (flow_name, parameter), values in CHOICES.items():
            if flow.name == flow_name:
                assert properties[parameter]["enum"] == values, (d["entrypoint"], parameter)
        if "recipe" in properties:
            names, import_path = properties["recipe"]["anyOf"]
            assert sorted(names["enum"]) == sorted(RECIPES) and import_path["pattern"] == RECIPE_IMPORT_PATTERN


@pytest.mark.parametrize(
    ("flow_name", "parameters"),
    [
        ("morphogenesis", {"recipe": "digits-mpl"}),
        ("morphogenesis", {"recipe": "my_recipes.py"}),
        ("morphogenesis", {"device": "gpu"}),
        ("morphogenesis", {"epochs": 0}),
        ("morphogenesis", {"nproc": 0}),
        ("morphogenesis", {"seed": -1}),
        ("morphogenesis", {"grow_until": 0}),
        ("morphogenesis", {"grow_until": 1.5}),
        ("compile_catalog", {"backend": "inductor"}),
        ("benchmark_sweep", {"sweep": "weekly"}),
        ("train_policy", {"plan": "big"}),
        ("train_policy", {"recipes": ["digits-mlp", "nope"]}),
        ("fault_drills", {"drills": ["flood"]}),
    ],
)
def test_the_schema_refuses_a_value_outside_the_choices(flow_name: str, parameters: dict) -> None:
    # What the server checks for `enforce_parameter_schema` before a run is created.
    from prefect.utilities.schema_tools import ValidationError, validate

    flow = next(f for d in _deployments() if (f := _load(d["entrypoint"])).name == flow_name)
    schema = flow.parameters.model_dump_for_openapi()
    with pytest.raises(ValidationError, match=next(iter(parameters))):
        validate(parameters, schema, raise_on_error=True, ignore_required=True)


@pytest.mark.parametrize("recipe", ["digits-cnn", "my_lab.recipes:wide_mlp", "recipes:small"])
def test_the_schema_accepts_recipe_names_and_import_paths(recipe: str) -> None:
    from prefect.utilities.schema_tools import validate

    flow = _load("flows/morphogenesis.py:morphogenesis")
    validate({"recipe": recipe}, flow.parameters.model_dump_for_openapi(), raise_on_error=True, ignore_required=True)


def test_sweeps_never_overlap_within_a_deployment() -> None:
    config = _config()
    limit = config["definitions"]["one_sweep_at_a_time"]
    assert limit == {"limit": 1, "collision_strategy": "ENQUEUE"}  # a second sweep waits, never runs beside
    sweeps = [d for d in _deployments() if _load(d["entrypoint"]).name == "benchmark_sweep"]
    assert len(sweeps) == 2 and all(d["concurrency_limit"] == limit for d in sweeps), sweeps


def test_flow_run_processes_send_heartbeats_and_esper_logs() -> None:
    env = _config()["definitions"]["work_pools"]["esper_process"]["job_variables"]["env"]
    # Prefect's zombie detection needs heartbeats at least every 30 s; the automation waits 90 s.
    assert 0 < int(env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]) <= 30
    assert "esper_core" in env["PREFECT_LOGGING_EXTRA_LOGGERS"].split(",")
