"""The headroom measurement: the schedules it searches, its smoke plan end to end (real runs on
the tiny seed-reference recipe), and its input checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.headroom import HeadroomConfig
from esper_cli.main import main
from esper_core.karn.entries import default_catalog
from esper_core.run.plan import plan_run
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.studies.schedule_search import candidate_schedules, schedule_name


def test_schedules_cover_every_fitting_slot_blueprint_and_epoch() -> None:
    recipe = get_recipe("mnist1d-cnn")
    schedules = candidate_schedules(recipe, plan_run(recipe, catalog=default_catalog()), (0.05, 0.2, 0.4))
    names = [schedule_name(s) for s in schedules]
    # 3 epochs x 2 slots x 3 blueprints alone, then 3 epochs x 3 blueprints in both slots.
    assert len(names) == len(set(names)) == 18 + 9
    assert "act2:seq_conv_residual@3" in names and "act3:seq_pointwise_adapter@24" in names
    assert "act2:seq_depthwise_separable@12+act3:seq_depthwise_separable@13" in names


@pytest.mark.slow
def test_smoke_plan_ranks_schedules_and_confirms_the_best_on_held_out_seeds(
    compiled_home: EsperSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "baseline"
    argv = ["bench", "headroom", "--recipe", "seed-reference", "--plan", "smoke", "--json"]
    assert main([*argv, "--home", str(compiled_home.home), "--save-baseline", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["train_seeds"] == [1000, 1001] and result["holdout_seeds"] == [0, 1]
    assert result["best_schedule"] == "slot0:lowrank_adapter@0"
    assert [r["schedule"] for r in result["ranking"]] == ["slot0:lowrank_adapter@0", "heuristic", "none"]
    best = result["ranking"][0]
    assert all(c.get("germinate") == 1 for c in best["commands"])
    assert all("germinate" not in c for c in result["ranking"][2]["commands"])  # none never grows
    for where in ("train", "holdout"):
        for name in ("best_minus_heuristic", "best_minus_none", "heuristic_minus_none"):
            d = result[where][name]
            assert d["n"] == 2 and d["ci95_low"] <= d["mean"] <= d["ci95_high"]
    assert set(result["holdout"]["arms"]) == {"none", "heuristic", "best"}
    assert "headroom" in result["verdict"]
    assert json.loads((out / "headroom.json").read_text())["best_schedule"] == result["best_schedule"]


def test_bad_options_are_refused_before_any_run() -> None:
    with pytest.raises(ValueError, match="unknown headroom plan"):
        HeadroomConfig(plan="huge")
    with pytest.raises(ValueError, match="train_seeds must be >= 2"):
        HeadroomConfig(train_seeds=1)
    with pytest.raises(ValueError, match="overlap Simic's"):
        HeadroomConfig(holdout_seeds=2000)
    with pytest.raises(ValueError, match="unknown recipe|not found|recipe"):
        HeadroomConfig(recipe="no-such-recipe")
