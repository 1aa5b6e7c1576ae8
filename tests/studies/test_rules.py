"""The rule search: fixed growth rules chosen on selection seeds, scored on hosts never searched."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from esper_core.studies.rules import (
    ARMS,
    DEFAULT_RULE,
    PREVIOUS_RULE,
    Rule,
    RuleSearchConfig,
    format_table,
    rule_grid,
    run,
    save_baseline,
)
from esper_core.studies.zoo_train import ZooSeeds, ZooTraining, zoo_members
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.zoo import ZooMember, ZooSpec, draw_member

TINY_ZOO = ZooSpec(seed=0, families=("mlp", "cnn1d"), epochs=(4,), train_samples=(1000,), widths=(8,))
TINY_TRAINING = ZooTraining(
    zoo=TINY_ZOO,
    members=2,
    seeds=ZooSeeds(train=tuple(range(1000, 1008)), selection=(2000,), evaluation=(0, 1, 2)),
)
DOUBLE_AT_ONCE = Rule(name="double-at-once", probe_epoch=0, plateau_rel_tol=0.5, width_step="width-100")


def test_a_rule_or_a_search_that_cannot_be_run_honestly_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="not on the width menu; choose one of"):
        Rule(name="r", width_step="width-300")
    with pytest.raises(ValueError, match="probe_epoch must be >= 0"):
        Rule(name="r", probe_epoch=-1)
    with pytest.raises(ValueError, match="name each rule once"):
        RuleSearchConfig(training=TINY_TRAINING, rules=(DEFAULT_RULE, DEFAULT_RULE))
    with pytest.raises(ValueError, match="is the zoo's own seed.*pick another seed"):
        RuleSearchConfig(training=TINY_TRAINING, eval_zoo_seed=0)
    with pytest.raises(ValueError, match="not in the zoo's families"):
        RuleSearchConfig(training=TINY_TRAINING, families=("gru",))
    with pytest.raises(ValueError, match=r"set ZooSpec\(kinds=\('width',\)\)"):
        RuleSearchConfig(
            training=dataclasses.replace(TINY_TRAINING, zoo=dataclasses.replace(TINY_ZOO, kinds=("width", "branch")))
        )
    with pytest.raises(ValueError, match="one rule is searched over the whole zoo"):
        RuleSearchConfig(training=dataclasses.replace(TINY_TRAINING, exclude_families=("mlp",)))
    with pytest.raises(ValueError, match=r"seeds must be 2\.\.3"):
        RuleSearchConfig(training=TINY_TRAINING, seeds=4)
    with pytest.raises(ValueError, match="including 0.0"):
        RuleSearchConfig(training=TINY_TRAINING, seeds=2, weight_decays=(1e-4,))


def test_the_grid_starts_with_the_default_and_holds_each_rule_once() -> None:
    grid = rule_grid()
    assert grid[0] == DEFAULT_RULE and len(grid) == 18
    assert len({r.name for r in grid}) == len(grid)
    behaviours = {(h.probe_epoch, h.plateau_rel_tol, h.prefer) for h in (r.heuristic(HeuristicConfig()) for r in grid)}
    assert len(behaviours) == len(grid), "two rules of the grid would play the same"
    # The default rule is the heuristic's defaults, which the zoo's members run.
    default = HeuristicConfig()
    assert DEFAULT_RULE.heuristic(default) == default
    assert PREVIOUS_RULE.heuristic(default) != default and PREVIOUS_RULE in grid
    assert draw_member(TINY_ZOO, 0).recipe().tamiyo.heuristic == HeuristicConfig(blend_epochs=1)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return run(RuleSearchConfig(training=TINY_TRAINING, rules=(DEFAULT_RULE, DOUBLE_AT_ONCE), eval_members=1, seeds=2))


def test_the_rule_chosen_on_selection_seeds_is_scored_on_hosts_and_seeds_it_never_saw(result: dict[str, Any]) -> None:
    selection = result["selection"]
    scores = {s["label"]: s["score"] for s in selection["scores"]}
    assert selection["chosen"] == max(scores, key=lambda name: scores[name]) == result["rule"]["name"]
    assert selection["seeds"] == [2000] and result["evaluation_seeds"] == [0, 1]
    # No evaluated host is a searched one: compared as hosts (architecture, task and its data
    # seed, budget), not by name, which carries the zoo's seed and index.
    config = RuleSearchConfig(training=TINY_TRAINING, eval_members=1, seeds=2)

    def host(member: ZooMember) -> tuple[object, ...]:
        return tuple(getattr(member, f.name) for f in dataclasses.fields(member) if f.name not in ("zoo_seed", "index"))

    evaluated = [m for family in ("mlp", "cnn1d") for m in config.evaluated_members(family)]
    assert {m.name for m in evaluated} == {name for r in result["results"].values() for name in r["members"]}
    assert {m.name for m in zoo_members(TINY_TRAINING)} == set(selection["members"])
    assert not {host(m) for m in evaluated} & {host(m) for m in zoo_members(TINY_TRAINING)}
    assert result["compared_with"]["name"] == PREVIOUS_RULE.name
    assert set(result["results"]) == {"mlp", "cnn1d"}
    for family in result["results"].values():
        assert set(family["arms"]) == set(ARMS) and family["pairs"] == 2
        assert {"rule_minus_tuned", "rule_minus_heuristic", "heuristic_minus_tuned"} <= set(family["paired"])
        for entry in family["runs"]:
            arms = entry["arms"]
            # The static arms have the rule run's final shape; the tuned one is the grid's best
            # on validation.
            assert arms["static"]["total_params"] == arms["tuned"]["total_params"] == arms["rule"]["total_params"]
            assert arms["tuned"]["val_accuracy"] >= arms["static"]["val_accuracy"]
    assert "goal (rule vs tuned)" in format_table(result)


def test_a_rule_that_doubles_at_once_grows_as_it_says(tmp_path: Any) -> None:
    result = run(
        RuleSearchConfig(training=TINY_TRAINING, rules=(DOUBLE_AT_ONCE,), families=("cnn1d",), eval_members=1, seeds=2)
    )
    for entry in result["results"]["cnn1d"]["runs"]:
        host, grown = entry["widths"]["host"], entry["widths"]["grown"]
        assert any(grown[layer] == 2 * width for layer, width in host.items()), entry["widths"]
        assert entry["arms"]["rule"]["commands"]["germinate"] >= 1
        # The compared rule widens by a quarter, a germination later: a smaller network.
        assert entry["arms"]["heuristic"]["total_params"] < entry["arms"]["rule"]["total_params"]
    json_path, png_path = save_baseline(result, tmp_path)
    assert json_path.name == "rules.json" and png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
