"""The train_policy flow under the session's Prefect test harness (smoke plan, seed-reference)."""

from __future__ import annotations

import pytest

from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.simic_train import get_plan

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_train_policy_imitates_then_improves_and_publishes_each_version(compiled_home: EsperSettings) -> None:
    from flows.train_policy import train_policy

    version = train_policy(recipes=["seed-reference"], plan="smoke", device="cpu")
    store = SimicStore.open(compiled_home.home)
    policies = store.policies()
    assert version == policies[-1].version == 2
    imitation, ppo = policies
    assert (imitation.method, ppo.method, ppo.parent_version) == ("imitation", "ppo", 1)
    plan = get_plan("smoke")
    assert len(imitation.provenance["runs"]) == plan.demonstrations
    assert imitation.provenance["decisions"] == plan.demonstrations * plan.epochs
    assert {"agreement", "loss"} <= set(imitation.provenance["metrics"])
    assert {"approx_kl", "mean_return"} <= set(ppo.provenance["metrics"])
    rollouts = store.decisions(ppo.provenance["runs"])
    assert rollouts and all(d.policy == "gnn" and d.policy_version == "v1" and d.log_prob is not None for d in rollouts)
    store.close()


def test_a_searched_plan_imitates_the_winning_schedule(compiled_home: EsperSettings) -> None:
    from flows.train_policy import train_policy

    version = train_policy(recipes=["digits-cnn"], plan="search-smoke", device="cpu")
    store = SimicStore.open(compiled_home.home)
    try:
        (imitation,) = store.policies()
        assert imitation.version == version and imitation.method == "imitation"
        runs = imitation.provenance["runs"]
        # The winner's episodes, one per demonstration seed, named after their schedule.
        assert len(runs) == get_plan("search-smoke").demonstrations
        assert len({run.rsplit("-s", 1)[0] for run in runs}) == 1 and all(run.startswith("search-") for run in runs)
        assert {d.policy for d in store.decisions(runs)} == {"scheduled"}
        # Every candidate ran on the first seed: three schedules on digits-cnn.
        first = [p.name for p in compiled_home.runs_dir.iterdir() if p.name.endswith("-s1000")]
        assert len(first) == 3
    finally:
        store.close()


def test_an_unknown_plan_is_refused_with_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown training plan 'huge'; choose one of \['counterfactual', 'counterfactual-varied', 'default', "
        r"'search', 'search-smoke', 'smoke', 'varied'\]",
    ):
        get_plan("huge")
