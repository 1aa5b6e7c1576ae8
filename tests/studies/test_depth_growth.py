"""The depth-growth benchmark (``esper bench depth-growth``): every arm at smoke scale through the
command line, the curve arithmetic its headlines rest on, and bad input refused before any run."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from unittest import mock

import pytest

from esper_cli.main import main
from esper_core.studies.depth_growth import PLANS, DepthGrowthConfig, arm_config, read_result
from esper_core.studies.depth_growth_report import (
    arm_summary,
    bits_at,
    combine,
    curves_png,
    extend_seeds,
    flops_to_reach,
    merge_results,
    static_frontier,
)

LN2 = math.log(2)


@pytest.mark.slow
def test_the_smoke_plan_runs_every_arm_and_writes_curves_and_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["bench", "depth-growth", "--plan", "smoke", "--json", "--workers", "0"]
    assert main([*argv, "--home", str(tmp_path / "home"), "--save-baseline", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["arms"]) == [
        "static-final",
        "static-start",
        "static-final-3ep",
        "stack-0-4",
        "stack-all-1",
        "static-narrow",
        "widen-1",
        "widen-controller",
        "widen-plateau-from50",
        "controller",
    ]
    arms = result["arms"]
    # The widened arm doubled once, at once, into the final network's exact shape.
    (widened,) = arms["widen-1"]["runs"]
    assert widened["commands"]["germinate"] == 1 and widened["params"] == arms["static-final"]["params_mean"]
    # The heuristic doubles once: after its probe epoch it knows a seed germinated (the stream
    # slot is DORMANT again at once), and the risk engine vetoes a second doubling.
    narrow_params = arms["static-narrow"]["params_mean"]
    (controller,) = arms["widen-controller"]["runs"]
    assert controller["commands"]["germinate"] == 1 and controller["params"] == widened["params"]
    # The plateau rule doubles at most once too (the live cost of a second doubling is over the
    # budget), into the same network when it does.
    assert result["widen_plateau"] == {"widen-plateau-from50": {"threshold": 0.029, "window": 1, "grow_from": 0.5}}
    (plateau,) = arms["widen-plateau-from50"]["runs"]
    assert plateau["commands"].get("germinate", 0) <= 1
    assert plateau["params"] == (widened["params"] if plateau["commands"].get("germinate") else narrow_params)
    narrow = arms["static-narrow"]["train_flops_mean"]
    assert narrow < widened["train_flops"] < arms["static-final"]["train_flops_mean"]
    # The stacked arm germinated twice, the whole-stack arm once; each ends at the final network's
    # size (2 -> 4 blocks) when its seeds merged, and the static start never grew.
    (stacked,) = arms["stack-0-4"]["runs"]
    assert stacked["commands"]["germinate"] == 2 and stacked["params"] == arms["static-final"]["params_mean"]
    (doubled,) = arms["stack-all-1"]["runs"]
    assert doubled["commands"]["germinate"] == 1
    if doubled["commands"].get("fossilize"):
        assert doubled["params"] == arms["static-final"]["params_mean"]
    else:
        assert doubled["params"] == arms["static-start"]["params_mean"] and doubled["commands"]["cull"] == 1
    assert arms["static-start"]["runs"][0]["commands"] == {"wait": 6}
    assert arms["static-start"]["params_mean"] < arms["static-final"]["params_mean"]
    # A grown network trains small first: it costs less than the static final one.
    assert arms["static-start"]["train_flops_mean"] < stacked["train_flops"] < arms["static-final"]["train_flops_mean"]
    for name, arm in arms.items():
        (run,) = arm["runs"]
        flops = [p["train_flops"] for p in run["curve"]]
        # Cumulative: each epoch adds its FLOPs, the last point is the whole run's.
        assert len(flops) == (3 if name == "static-final-3ep" else 6)
        assert flops[0] > 0 and flops == sorted(set(flops)) and flops[-1] == run["train_flops"]
    # The smaller static budget costs half the FLOPs, and every growing arm is compared with the
    # static frontier (3 and 6 epochs of the final network) where its FLOPs fall inside it.
    (budget,) = arms["static-final-3ep"]["runs"]
    assert budget["train_flops"] * 2 == arms["static-final"]["runs"][0]["train_flops"]
    assert set(result["static_frontier"]) == {
        "static-start",
        "stack-0-4",
        "stack-all-1",
        "static-narrow",
        "widen-1",
        "widen-controller",
        "widen-plateau-from50",
        "controller",
    }
    # The static network reaches its own final loss with all its FLOPs: a saving of 0.
    (static,) = arms["static-final"]["runs"]
    assert static["flops_saving"] == pytest.approx(0.0, abs=1e-9)
    assert result["targets_val_bits"] == [static["final_val_bits"]]
    assert (out / "depth_growth.json").exists()
    assert (out / "depth_growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flops_to_reach_interpolates_between_epochs_and_says_never() -> None:
    curve = [(100, 3.0 * LN2), (200, 2.0 * LN2), (300, 1.0 * LN2)]
    assert flops_to_reach(curve, 2.5) == pytest.approx(150.0)
    assert flops_to_reach(curve, 3.5) == 100.0
    assert flops_to_reach(curve, 0.5) is None
    assert bits_at(curve, 250) == pytest.approx(1.5)


def test_arms_are_configured_as_the_plan_says() -> None:
    config = DepthGrowthConfig(plan="smoke")
    stacked = arm_config(config, arm="stack-0-4", seed=0)
    assert stacked.tamiyo.policy == "scheduled"
    assert [(g.epoch, g.slot, g.blueprint) for g in stacked.tamiyo.schedule] == [
        (0, "blocks+depth", "depth-stack"),
        (4, "blocks+depth", "depth-stack"),
    ]
    assert stacked.host.deepen == ("blocks",) and stacked.host.slots == ()
    assert stacked.recipe == "chars-gpt-growth-start" and stacked.epochs == 6
    assert arm_config(config, arm="controller", seed=0).tamiyo.policy == "heuristic"
    assert arm_config(config, arm="static-final", seed=0).tamiyo.policy == "none"
    doubled = arm_config(config, arm="stack-all-1", seed=0)
    assert [(g.epoch, g.blueprint) for g in doubled.tamiyo.schedule] == [(1, "depth-stack-all")]
    with pytest.raises(ValueError, match="unknown arm 'stack-1-5'"):
        arm_config(config, arm="stack-1-5", seed=0)
    widened = arm_config(config, arm="widen-1", seed=0)
    assert widened.recipe == "chars-gpt-growth-narrow" and widened.tamiyo.policy == "scheduled"
    assert [(g.epoch, g.slot, g.blueprint) for g in widened.tamiyo.schedule] == [(1, "stream", "stream-2x")]
    assert widened.host.widen_stream and widened.host.slots == () and widened.host.deepen == ()
    narrow = arm_config(config, arm="static-narrow", seed=0)
    assert narrow.recipe == "chars-gpt-growth-narrow" and narrow.tamiyo.policy == "none"
    controller = arm_config(config, arm="widen-controller", seed=0)
    assert controller.tamiyo.policy == "heuristic" and controller.host.widen_stream
    assert controller.recipe == "chars-gpt-growth-narrow"
    assert DepthGrowthConfig(plan="widen").arms == (
        "static-final",
        "static-narrow",
        "widen-1",
        "widen-2",
        "widen-controller",
    )


def test_a_plan_without_controls_runs_the_final_network_and_the_stacked_arms_alone() -> None:
    # Its static-final runs are what a merge with the plan that ran the controls checks.
    config = DepthGrowthConfig(plan="crossover-stacked")
    assert config.arms == ("static-final", "stack-0-4", "stack-all-4", "stack-all-8")
    assert arm_config(config, arm="stack-all-8", seed=0).epochs == 16
    budgets = DepthGrowthConfig(plan="crossover-budgets")
    assert budgets.arms == ("static-final", "static-final-8ep", "static-final-12ep")
    assert arm_config(budgets, arm="static-final-12ep", seed=0).epochs == 12


def test_a_warm_up_names_the_growing_arms_and_reaches_their_lifecycle() -> None:
    # Named apart, so that a run with the warm-up merges with the same plan's run without it.
    config = DepthGrowthConfig(plan="crossover", blend_epochs=2, blend_lr_warmup_epochs=2)
    assert config.arms == ("static-final", "static-start", "controller-w2")
    controller = arm_config(config, arm="controller-w2", seed=0)
    assert controller.tamiyo.policy == "heuristic" and controller.kasmina.blend_lr_warmup_epochs == 2
    stacked = DepthGrowthConfig(plan="crossover-stacked", blend_lr_warmup_epochs=1)
    assert stacked.arms == ("static-final", "stack-0-4-w1", "stack-all-4-w1", "stack-all-8-w1")
    doubled = arm_config(stacked, arm="stack-all-8-w1", seed=0)
    assert [(g.epoch, g.blueprint) for g in doubled.tamiyo.schedule] == [(8, "depth-stack-all")]
    assert arm_config(DepthGrowthConfig(plan="crossover"), arm="controller", seed=0).kasmina.blend_lr_warmup_epochs == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"blend_lr_warmup_epochs": -1}, r"blend_lr_warmup_epochs must lie in 0 \.\. blend_epochs=1"),
        ({"blend_lr_warmup_epochs": 2}, r"blend_lr_warmup_epochs must lie in 0 \.\. blend_epochs=1 .*got 2"),
        ({"seeds": 1001}, r"seeds 0 \.\. 1000 mix evaluation seeds"),
        ({"first_seed": 998, "seeds": 3}, r"seeds 998 \.\. 1000 mix evaluation seeds"),
        ({"first_seed": -1}, "first_seed must be >= 0"),
        ({"plan": "huge"}, "unknown depth-growth plan 'huge'"),
        ({"epochs": 5}, r"growth points \(0, 4\) must be distinct, ascending epochs from 0 to 3"),
        ({"blend_epochs": 2}, r"closer than a stacked seed's lifecycle \(5 epochs with blend_epochs=2\)"),
        ({"epochs": 4, "plan": "default"}, r"growth point 3 must be an epoch from 0 to 2"),
        ({"start_recipe": "chars-gpt"}, "must share epochs and trainer"),
        ({"recipe": "digits-mlp"}, "has a built-in host"),
    ],
)
def test_bad_options_are_refused_before_any_run(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DepthGrowthConfig(**{"plan": "smoke", **options})  # type: ignore[arg-type]


def _arm(runs: list[tuple[int, float, float]]) -> dict[str, object]:
    """An arm's summary as ``summarise`` writes it: ``(seed, train_flops, final_val_bits)`` per run."""
    return {"runs": [{"seed": sd, "train_flops": f, "final_val_bits": b} for sd, f, b in runs]}


def test_the_static_frontier_interpolates_each_seeds_budgets_and_leaves_out_flops_beyond_them() -> None:
    arms = {
        "static-final": _arm([(0, 800.0, 2.0), (1, 800.0, 2.2)]),
        "static-final-4ep": _arm([(0, 400.0, 3.0), (1, 400.0, 3.2)]),
        "grown": _arm([(0, 600.0, 2.3), (1, 500.0, 2.8)]),
        "small": _arm([(0, 300.0, 3.5), (1, 300.0, 3.6)]),
    }
    frontier = static_frontier(arms)
    # Seed 0: frontier at 600 is 2.5, seed 1 at 500 is 2.95: the grown arm is 0.2 and 0.15 below it.
    assert frontier["grown"]["mean"] == pytest.approx(-0.175)
    assert frontier["small"] is None  # 300 FLOPs: below every static budget, no comparison
    assert "static-final-4ep" not in frontier and "static-final" not in frontier
    assert static_frontier({"static-final": arms["static-final"], "grown": arms["grown"]}) == {}


def test_merging_results_keeps_both_arms_and_refuses_results_of_other_runs() -> None:
    base = {"recipe": "r", "start_recipe": "s", "seeds": [0, 1], "epochs": 8, "lr": 3e-3, "wall_s": 10.0}
    first = {**base, "arms": {"static-final": _arm([(0, 800.0, 2.0), (1, 800.0, 2.2)]), "grown": _arm(
        [(0, 600.0, 2.3), (1, 500.0, 2.8)])}}  # fmt: skip
    second = {**base, "static_budgets": [4], "arms": {"static-final": first["arms"]["static-final"],
              "static-final-4ep": _arm([(0, 400.0, 3.0), (1, 400.0, 3.2)])}}  # fmt: skip
    merged = merge_results(first, second)
    assert list(merged["arms"]) == ["static-final", "grown", "static-final-4ep"]
    assert merged["static_frontier"]["grown"]["mean"] == pytest.approx(-0.175) and merged["wall_s"] == 20.0
    # What each side's widened arms ran with travels with them.
    widened = merge_results(
        {**first, "narrow_recipe": "n", "widen_points": [3]},
        {**second, "narrow_recipe": "n", "widen_points": [5], "widen_plateau": {"widen-plateau": {"window": 1}}},
    )
    assert (widened["widen_points"], widened["narrow_recipe"]) == ([3, 5], "n")
    assert widened["widen_plateau"] == {"widen-plateau": {"window": 1}}
    assert "widen_points" not in merged and "widen_plateau" not in merged
    with pytest.raises(ValueError, match="results differ in seeds"):
        merge_results(first, {**second, "seeds": [0]})
    other = {**second, "arms": {**second["arms"], "static-final": _arm([(0, 800.0, 2.0), (1, 800.0, 2.3)])}}
    with pytest.raises(ValueError, match="static-final runs differ"):
        merge_results(first, other)


def _result(seeds: list[int], saving: float) -> dict[str, object]:
    """A result of two arms on ``seeds`` whose grown arm saved ``saving`` of the FLOPs on each."""

    def runs(bits: float, flops_saving: float | None) -> list[dict[str, object]]:
        return [
            {"seed": sd, "final_val_bits": bits, "train_flops": 800.0, "params": 10, "flops_saving": flops_saving,
             "static_bits_at_equal_flops": bits + 0.1, "curve": []}
            for sd in seeds
        ]  # fmt: skip

    arms = {
        "static-final": arm_summary(runs(2.0, 0.0)),
        "static-start": arm_summary(runs(2.1, None)),
        "controller": arm_summary(runs(1.9, saving)),
    }
    return {"bench": "depth-growth", "recipe": "chars-gpt-growth", "start_recipe": "chars-gpt-growth-start",
            "plan": "crossover", "epochs": 16, "lr": 3e-3, "seeds": seeds, "targets_val_bits": [2.0] * len(seeds),
            "arms": arms, "wall_s": 5.0}  # fmt: skip


def test_more_seeds_extend_the_same_arms_and_are_summarised_over_all_of_them() -> None:
    extended = extend_seeds(_result([0, 1], 0.2), _result([2, 3, 4], 0.3))
    assert extended["seeds"] == [0, 1, 2, 3, 4] and extended["wall_s"] == 10.0
    controller = extended["arms"]["controller"]
    assert [r["seed"] for r in controller["runs"]] == [0, 1, 2, 3, 4] and controller["reached_target"] == 5
    assert controller["flops_saving"]["mean"] == pytest.approx(0.26) and controller["flops_saving"]["n"] == 5
    assert combine(_result([0, 1], 0.2), _result([2], 0.3))["seeds"] == [0, 1, 2]
    with pytest.raises(ValueError, match="share seeds"):
        extend_seeds(_result([0, 1], 0.2), _result([1, 2], 0.3))
    other = _result([2], 0.3)
    other["arms"] = {"static-final": other["arms"]["static-final"]}  # type: ignore[index]
    with pytest.raises(ValueError, match="extend the same arms"):
        extend_seeds(_result([0, 1], 0.2), other)
    with pytest.raises(ValueError, match="selection seeds and the other on evaluation seeds"):
        extend_seeds(_result([0, 1], 0.2), {**_result([1000], 0.3), "selection": True})
    with pytest.raises(ValueError, match="whose standard libraries"):
        extend_seeds(_result([0, 1], 0.2), {**_result([2], 0.3), "python": "3.12"})


def test_selection_seeds_are_a_run_of_their_own_and_never_extend_an_evaluation(tmp_path: Path) -> None:
    selection = DepthGrowthConfig(plan="crossover", first_seed=1000, seeds=2)
    assert selection.selection and selection.seed_list == [1000, 1001]
    assert not DepthGrowthConfig(plan="crossover", first_seed=3, seeds=5).selection
    path = tmp_path / "depth_growth.json"
    path.write_text(json.dumps(_result([0, 1, 2], 0.2)))
    with pytest.raises(ValueError, match="disjoint seeds of the same kind"):
        read_result(path, selection)
    with pytest.raises(ValueError, match="more seeds extend the same plan"):
        read_result(path, DepthGrowthConfig(plan="crossover-stacked", first_seed=3))
    # Refused before the run, not after it: a schedule that could never be combined.
    with pytest.raises(ValueError, match="ran 16 epochs and this run would run 8"):
        read_result(path, DepthGrowthConfig(plan="crossover", first_seed=3, epochs=8))
    assert read_result(path, DepthGrowthConfig(plan="crossover", first_seed=3, seeds=5))["seeds"] == [0, 1, 2]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read .* as a depth-growth result"),
        ("not json", "cannot read .* as a depth-growth result"),
        ('{"bench": "growth"}', "is not a depth-growth result"),
        ('{"bench": "depth-growth", "recipe": "chars-gpt-growth", "start_recipe": "chars-gpt-growth-start", '
         '"seeds": [0, 1, 2], "arms": {"static-final": {}}}', r"has seeds \[0, 1, 2\] and this run would have \[0\]"),
    ],
)  # fmt: skip
def test_a_bad_merge_with_file_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "depth_growth.json"
    if content is not None:
        path.write_text(content)
    home = tmp_path / "home"
    argv = ["bench", "depth-growth", "--plan", "smoke", "--home", str(home), "--merge-with", str(path)]
    assert main(argv) == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert not (home / "runs").exists()  # nothing ran


def test_the_plot_draws_as_many_arms_as_a_merged_result_holds() -> None:
    curve = [{"train_flops": 1.0, "val_bits": 3.0}, {"train_flops": 2.0, "val_bits": 2.5}]
    arms = {f"stack-all-{i}": {"runs": [{"curve": curve}]} for i in range(9)}
    arms |= {a: {"runs": [{"curve": curve}]} for a in ("static-final", "static-final-4ep", "controller")}
    png = curves_png({"arms": arms, "targets_val_bits": [2.5], "recipe": "r", "seeds": [0], "epochs": 2})
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plan_without_widen_controls_runs_the_final_network_and_the_widened_arms_alone() -> None:
    # widen-late merges with widen-crossover's result, which has static-narrow and the heuristic.
    config = DepthGrowthConfig(plan="widen-late")
    assert config.arms == ("static-final", "widen-5", "widen-plateau")
    widened = arm_config(config, arm="widen-5", seed=0)
    assert widened.epochs == 16
    assert [(g.epoch, g.slot, g.blueprint) for g in widened.tamiyo.schedule] == [(5, "stream", "stream-2x")]
    # The plateau arm: the heuristic alone decides when, on a one-epoch plateau, no probe.
    plateau = arm_config(config, arm="widen-plateau", seed=0)
    assert plateau.tamiyo.policy == "heuristic" and plateau.tamiyo.schedule == ()
    assert plateau.recipe == "chars-gpt-growth-narrow" and plateau.host.widen_stream
    rule = plateau.tamiyo.heuristic
    assert (rule.plateau_window, rule.plateau_rel_tol, rule.probe_epoch) == (1, 0.029, None)


def test_the_smoothed_plateau_rule_is_its_own_arm() -> None:
    config = DepthGrowthConfig(plan="widen-smooth")
    assert config.arms == ("static-final", "widen-plateau-w2") and config.seed_list == [0, 1, 2, 3, 4, 5]
    rule = arm_config(config, arm="widen-plateau-w2", seed=3).tamiyo.heuristic
    assert (rule.plateau_window, rule.plateau_rel_tol, rule.probe_epoch) == (2, 0.067, None)


def test_the_budget_aware_rule_opens_at_five_sixteenths_on_fresh_seeds() -> None:
    config = DepthGrowthConfig(plan="widen-budget", first_seed=6)
    assert config.arms == ("static-final", "widen-5", "widen-plateau-from31")
    assert config.seed_list == [6, 7, 8, 9, 10, 11]
    rule = arm_config(config, arm="widen-plateau-from31", seed=6).tamiyo.heuristic
    assert (rule.plateau_window, rule.plateau_rel_tol, rule.probe_epoch, rule.grow_from) == (1, 0.029, None, 5 / 16)


def test_a_plateau_threshold_outside_0_1_is_refused_with_its_meaning() -> None:
    plan = dataclasses.replace(PLANS["widen-late"], widen_plateau=2.9)
    with mock.patch.dict(PLANS, {"bad": plan}), pytest.raises(ValueError, match="e.g. 0.029 for 2.9 %"):
        DepthGrowthConfig(plan="bad")


def test_a_plateau_start_outside_0_1_is_refused_with_its_meaning() -> None:
    plan = dataclasses.replace(PLANS["widen-budget"], widen_plateau_from=5)
    with mock.patch.dict(PLANS, {"bad": plan}), pytest.raises(ValueError, match="e.g. 0.3125 for 5 of 16"):
        DepthGrowthConfig(plan="bad", first_seed=6)


def test_the_budget_plan_refuses_the_seeds_that_shaped_its_rule() -> None:
    with pytest.raises(ValueError, match="pass --first-seed 6"):
        DepthGrowthConfig(plan="widen-budget")
    plan = dataclasses.replace(PLANS["widen-late"], widen_plateau=None, widen_plateau_from=0.3)
    with mock.patch.dict(PLANS, {"bad": plan}), pytest.raises(ValueError, match="set widen_plateau too"):
        DepthGrowthConfig(plan="bad")
