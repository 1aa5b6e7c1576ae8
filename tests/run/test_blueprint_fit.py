"""No blueprint list needed: each slot's candidates are the approved blueprints that fit its shape."""

from __future__ import annotations

import dataclasses

import pytest

from esper_cli.main import main
from esper_core.karn.entries import default_catalog
from esper_core.run import ScheduledGermination, TamiyoConfig
from esper_core.run.plan import check_recipe
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.tamiyo.heuristic import HeuristicConfig

CNN = "tests.helpers.user_models:cnn"
MISFIT = "tests.helpers.user_models:cnn_with_a_misfit"
SAFE_CONV = ["conv_residual", "depthwise_separable", "pointwise_adapter"]


def test_with_no_list_every_safe_blueprint_that_fits_is_a_candidate_per_slot() -> None:
    plan = check_recipe(get_recipe(CNN))
    assert plan.slots == {"features.2": "f8x8x8-b512", "features.5": "f16x8x8-b512"}
    assert plan.slot_fits == {"features.2": tuple(SAFE_CONV), "features.5": tuple(SAFE_CONV)}
    assert list(plan.blueprints) == SAFE_CONV
    assert {(j.blueprint_id, j.profile) for j in plan.jobs} == {
        (b, p) for b in SAFE_CONV for p in ("f8x8x8-b512", "f16x8x8-b512")
    }


def test_candidates_are_per_slot_on_a_host_with_two_kinds_of_slot() -> None:
    config = dataclasses.replace(get_recipe("digits-cnn"), blueprints=())
    fits = check_recipe(config).slot_fits
    assert fits["slot1"] == tuple(SAFE_CONV)  # (16, 8, 8) maps
    assert fits["slot2"] == ("residual_mlp", "lowrank_adapter", "bottleneck_mlp")  # (128,) vectors


def test_an_approved_experimental_blueprint_joins_the_slots_it_fits() -> None:
    config = dataclasses.replace(get_recipe(CNN), approved_blueprints=("squeeze_excitation",))
    assert check_recipe(config).slot_fits["features.2"] == (*SAFE_CONV, "squeeze_excitation")


def test_a_listed_blueprint_that_fits_no_slot_is_refused_naming_those_that_fit() -> None:
    with pytest.raises(ValueError, match=r"lists \['residual_mlp'\], which fit none of its slots") as e:
        check_recipe(get_recipe(MISFIT))
    assert "features.2 (8, 8, 8) (cnn)" in str(e.value)
    assert "'features.2': ['conv_residual', 'depthwise_separable', 'pointwise_adapter']" in str(e.value)
    assert "leave blueprints out" in str(e.value)


def test_a_scheduled_blueprint_must_fit_its_slot_when_the_recipe_lists_none() -> None:
    germination = ScheduledGermination(epoch=1, slot="features.2", blueprint="residual_mlp")
    config = dataclasses.replace(get_recipe(CNN), tamiyo=TamiyoConfig(policy="scheduled", schedule=(germination,)))
    with pytest.raises(ValueError, match=r"'residual_mlp' does not fit slot 'features.2'; blueprints that fit it"):
        check_recipe(config, catalog=default_catalog())


@pytest.mark.parametrize(
    ("prefer", "message"),
    [
        (("width-300",), r"'width-300', which is neither on a seed kind's menu nor in Karn's catalogue; choose from"),
        (("glu_block",), r"'glu_block', whose tier is experimental: the heuristic germinates SAFE blueprints only"),
    ],
)
def test_a_preferred_blueprint_the_heuristic_could_never_take_is_refused_at_planning(
    prefer: tuple[str, ...], message: str
) -> None:
    config = dataclasses.replace(get_recipe(CNN), tamiyo=TamiyoConfig(heuristic=HeuristicConfig(prefer=prefer)))
    with pytest.raises(ValueError, match=message):
        check_recipe(config, catalog=default_catalog())
    fine = dataclasses.replace(
        config, tamiyo=TamiyoConfig(heuristic=HeuristicConfig(prefer=("width-50", "conv_residual")))
    )
    assert check_recipe(fine, catalog=default_catalog()).slot_fits


def test_recipes_show_lists_each_slot_its_shape_and_blueprints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "show", CNN]) == 0
    out = capsys.readouterr().out
    assert "every approved blueprint that fits a slot" in out
    assert "slot         features.2: (8, 8, 8) (f8x8x8-b512) -> conv_residual, depthwise_separable" in out


@pytest.mark.parametrize("command", [["recipes", "show", MISFIT], ["run", "--recipe", MISFIT, "--epochs", "1"]])
def test_the_cli_refuses_a_misfit_before_prefect_starts(
    command: list[str], esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith("esper: error: recipe ") and "blueprints that fit" in err and "Traceback" not in err
    # Refused before any flow run: nothing ran, so no run directory exists.
    assert not esper_home.runs_dir.exists() or not any(esper_home.runs_dir.iterdir())


def test_a_slot_on_a_tuple_output_is_refused_before_prefect_starts_naming_the_element(
    esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--recipe", "tests.helpers.user_models:lstm_without_an_index", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "module 'lstm' returns a tuple (Tensor, tuple), not a tensor: name one element, e.g. slots=('lstm[0]',)" in err
    )
    assert "Traceback" not in err


def test_chars_gpt_plans_causal_token_slots_with_the_token_family() -> None:
    plan = check_recipe(get_recipe("chars-gpt"))
    assert plan.slots == {"blocks.0": "f64x64-b256-causal", "blocks.1": "f64x64-b256-causal"}
    assert plan.slot_fits["blocks.0"] == ("tok_mlp", "tok_adapter", "tok_attention")


def test_a_slot_no_blueprint_fits_is_refused_naming_those_of_any_tier() -> None:
    config = dataclasses.replace(get_recipe("digits-cnn"), blueprints=("conv_residual",))
    with pytest.raises(ValueError, match=r"no blueprint of recipe digits-cnn fits slot\(s\) \['slot2'\]") as e:
        check_recipe(config)
    assert "'slot2': ['residual_mlp', 'lowrank_adapter', 'bottleneck_mlp', 'norm_gate'" in str(e.value)
