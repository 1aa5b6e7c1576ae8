"""The adaptation study end to end on a tiny width recipe (a real imitation policy, real runs).
Accuracies belong to the bench run; the tests check what was run and paired."""

from __future__ import annotations

import dataclasses

import pytest

from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.adapt import Task, germinations, run
from esper_core.studies.simic_train import collect_episodes, get_plan, train_imitation

RECIPE = "mnist1d-mlp-width"


@pytest.mark.slow
def test_a_policy_on_varied_tasks_is_paired_with_the_best_fixed_schedule_and_its_own_replay(
    esper_home: EsperSettings,
) -> None:
    plan = dataclasses.replace(get_plan("smoke"), epochs=4, demonstrations=1)
    (demo,) = collect_episodes(esper_home, recipe=RECIPE, seeds=[1000], policy="heuristic", plan=plan)
    store = SimicStore.open(esper_home.home)
    try:
        version = train_imitation(store, [demo.run_id], plan).version
    finally:
        store.close()
    tasks = (Task(width=0.5), Task(train_fraction=0.5))
    result = run(
        RECIPE, home=esper_home.home, policy_version=version, seeds=2, selection_seeds=1, tasks=tasks, epochs=4
    )

    assert result["seeds"] == [0, 1] and result["selection_seeds"] == [3000]
    assert set(result["tasks"]) == {"width=0.5,train_fraction=1", "width=1,train_fraction=0.5"}
    # The search ranks the whole family on both tasks: one episode per task for each candidate.
    assert result["search_ranking"][-1]["episodes"] == 2
    assert result["best_fixed"] == result["search_ranking"][0]["schedule"]
    for summary in result["tasks"].values():
        assert {"gnn", "best-fixed", "none"} <= summary["arms"].keys()
        for arm in summary["arms"].values():
            assert len(arm["per_seed"]) == 2
        entry = summary["gnn_minus_best-fixed"]
        assert entry["n"] == 2 and entry["ci95_low"] <= entry["mean"] <= entry["ci95_high"]
        assert sum(summary["gnn_schedules"].values()) == 2
    # The host at half width trains half-width layers: fewer parameters than at the recipe's width.
    narrow, full = (result["tasks"][t.name]["arms"]["none"]["params_mean"] for t in tasks)
    assert narrow < full
    # Every run's germinations are read back from Simic's records.
    gnn_run = f"adapt-{RECIPE}-gnn-width=0.5,train_fraction=1-s0"
    assert all(g.slot.endswith("+width") for g in germinations(esper_home, gnn_run))
