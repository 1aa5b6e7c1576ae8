"""The schedule search: successive halving's arithmetic and ranking, its refusals, and a real search
on digits-cnn whose winner's episodes become Simic's demonstrations (real runs, real registry)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from esper_core.fanout import Pool
from esper_core.settings import EsperSettings
from esper_core.simic.record_types import BITS_WORTH
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.schedule_search import (
    HalvingSearch,
    Schedule,
    ScheduleSearch,
    schedule_name,
    search_all,
    search_schedules,
)
from esper_core.studies.simic_train import (
    collect_demonstrations,
    demonstration_search,
    get_plan,
    search_demonstrations,
    train_imitation,
)
from esper_core.tamiyo.config import ScheduledGermination


def _schedules(n: int) -> list[Schedule]:
    return [(ScheduledGermination(epoch=k, slot="s", blueprint="b"),) for k in range(n)]


def _result(schedule: Schedule, seed: int, val: float, params: int = 100) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"{schedule_name(schedule)}-{seed}",
        recipe="r",
        policy="scheduled",
        seed=seed,
        test_accuracy=val,
        val_accuracy=val,
        host_params=90,
        total_params=params,
        forward_flops=1,
        wall_s=0.0,
        commands={},
        policy_version=None,
    )


def test_halving_keeps_a_third_each_round_and_the_winner_runs_on_every_seed() -> None:
    calls: list[tuple[int, int]] = []

    def run(schedule: Schedule, seed: int) -> EpisodeResult:
        epoch = schedule[0].epoch
        calls.append((epoch, seed))
        # Seed 0 reverses the order of the last three: a schedule must survive, not shine once.
        val = float(52 - epoch if seed == 0 and epoch >= 24 else epoch)
        return _result(schedule, seed, val)

    outcome = search_schedules(_schedules(27), [0, 1, 2, 3], run, eta=3)
    assert [sum(1 for _, s in calls if s == seed) for seed in range(4)] == [27, 9, 3, 1]
    assert [r.seed for r in outcome.best_episodes] == [0, 1, 2, 3]
    # Seed 0 ranks 24 first, but later seeds score each schedule its epoch: after three seeds the
    # means are 24 -> 25.33, 25 -> 25.67, 26 -> 26, so the mean, not the first seed, chooses.
    assert schedule_name(outcome.best) == "s:b@26"
    names = [int(name.removeprefix("s:b@")) for name, _, _ in outcome.ranking]
    assert names == [26, 25, 24, *range(23, 17, -1), *range(17, -1, -1)]
    assert [seeds for _, _, seeds in outcome.ranking] == [4] + [3] * 2 + [2] * 6 + [1] * 18
    assert outcome.ranking[0][1] == pytest.approx(26.0)
    assert outcome.ranking[2][1] == pytest.approx((28 + 24 + 24) / 3)


class _CountingPool(Pool):
    """Runs here, in order, and notes how many jobs each map carried."""

    def __init__(self) -> None:
        super().__init__(None)
        self.maps: list[int] = []

    def map(self, fn, items, *, progress=None):  # noqa: ANN001, ANN201 - Pool.map's signature
        self.maps.append(len(items))
        return super().map(fn, items, progress=progress)


def test_searches_side_by_side_share_each_round_and_find_what_each_finds_alone() -> None:
    def by_epoch(schedule: Schedule, seed: int) -> EpisodeResult:
        return _result(schedule, seed, float(schedule[0].epoch + seed))

    def against_epoch(schedule: Schedule, seed: int) -> EpisodeResult:
        return _result(schedule, seed, float(-schedule[0].epoch))

    first = HalvingSearch(candidates=_schedules(27), seeds=[0, 1, 2, 3], run=by_epoch, eta=3)
    second = HalvingSearch(candidates=_schedules(9), seeds=[5, 6], run=against_epoch, eta=3)
    pool = _CountingPool()
    together = search_all([first, second], pool=pool)
    # One map a round, each carrying both searches' episodes while both go on (27 + 9, 9 + 3).
    assert pool.maps == [36, 12, 3, 1]
    alone = [search_schedules(s.candidates, s.seeds, s.run, eta=s.eta) for s in (first, second)]
    assert [schedule_name(o.best) for o in together] == ["s:b@26", "s:b@0"]
    for joint, single in zip(together, alone, strict=True):
        assert joint.best == single.best and joint.ranking == single.ranking
        assert {n: [r.run_id for r in runs] for n, runs in joint.episodes.items()} == {
            n: [r.run_id for r in runs] for n, runs in single.episodes.items()
        }


def test_ties_go_to_the_smaller_schedule() -> None:
    schedules = _schedules(2)

    def run(schedule: Schedule, seed: int) -> EpisodeResult:
        return _result(schedule, seed, 80.0, params=200 if schedule[0].epoch == 0 else 150)

    outcome = search_schedules(schedules, [0], run, eta=2)
    assert schedule_name(outcome.best) == "s:b@1"


def test_a_schedule_searched_over_several_tasks_is_scored_on_all_of_them() -> None:
    # Two tasks a round: schedule 0 wins task A by 10 and loses task B by 30, so on the mean over
    # both it must lose, though it would win a search on task A alone.
    def run(schedule: Schedule, seed: int) -> list[EpisodeResult]:
        first = schedule[0].epoch == 0
        return [_result(schedule, seed, 90.0 if first else 80.0), _result(schedule, seed, 40.0 if first else 70.0)]

    outcome = search_schedules(_schedules(2), [0, 1], run, eta=2)
    assert schedule_name(outcome.best) == "s:b@1"
    assert [(name, mean, episodes) for name, mean, episodes in outcome.ranking] == [
        ("s:b@1", pytest.approx(75.0), 4),
        ("s:b@0", pytest.approx(65.0), 2),
    ]
    assert len(outcome.best_episodes) == 4


def test_a_language_model_s_schedules_are_ranked_by_validation_loss() -> None:
    # A language model's accuracy is 0 whatever the schedule: ranked by it, every schedule ties
    # and the first candidate wins, here the one with the highest loss. Its loss ranks them.
    losses = {0: 2.0, 1: 1.5, 2: 1.8}  # validation nats per character, by the schedule's epoch

    def run(schedule: Schedule, seed: int) -> EpisodeResult:
        return dataclasses.replace(_result(schedule, seed, 0.0), val_loss=losses[schedule[0].epoch] + 0.01 * seed)

    outcome = search_schedules(_schedules(3), [0, 1], run, eta=3, language_model=True)
    assert schedule_name(outcome.best) == "s:b@1"
    assert [name for name, _, _ in outcome.ranking] == ["s:b@1", "s:b@2", "s:b@0"]
    # Scored as Simic's rewards and the zoo's selection score it: minus half the bits per character.
    assert outcome.ranking[0][1] == pytest.approx(-BITS_WORTH * (1.5 + 1.51) / 2 / math.log(2))
    assert outcome.ranking[1][1] == pytest.approx(-BITS_WORTH * 1.8 / math.log(2))
    assert schedule_name(search_schedules(_schedules(3), [0, 1], run, eta=3).best) == "s:b@0"  # the tie


def test_the_demonstration_search_ranks_a_language_model_by_loss(esper_home: EsperSettings) -> None:
    # Told by the recipe's data (token targets), before any episode runs.
    plan = get_plan("search-smoke")
    gpt = demonstration_search(esper_home, recipe="tests.helpers.user_gpt:recipe", plan=plan, device="cpu")
    digits = demonstration_search(esper_home, recipe="digits-cnn", plan=plan, device="cpu")
    assert (gpt.language_model, digits.language_model) == (True, False)


def test_a_search_without_candidates_or_seeds_or_with_bad_settings_is_refused() -> None:
    def run(schedule: Schedule, seed: int) -> EpisodeResult:
        raise AssertionError("no episode may run")

    with pytest.raises(ValueError, match=r"needs candidates and seeds, got 0 and 2"):
        search_schedules([], [0, 1], run, eta=3)
    with pytest.raises(ValueError, match=r"got 1 and 0"):
        search_schedules(_schedules(1), [], run, eta=3)
    with pytest.raises(ValueError, match=r"must be distinct"):
        search_schedules(_schedules(1) * 2, [0], run, eta=3)
    with pytest.raises(ValueError, match=r"eta must be >= 2"):
        ScheduleSearch(eta=1)
    with pytest.raises(ValueError, match=r"fractions of the run in \[0, 1\]"):
        ScheduleSearch(at=(1.5,))


def test_a_real_search_finds_a_schedule_and_its_episodes_are_the_demonstrations(compiled_home: EsperSettings) -> None:
    plan = get_plan("search-smoke")
    outcome = search_demonstrations(compiled_home, recipe="digits-cnn", plan=plan)
    # digits-cnn: conv_residual fits the conv slot, residual_mlp and lowrank_adapter the vector one.
    # digits-cnn has two slots; one germination per fitting (slot, blueprint) after epoch 0, and
    # no blueprint fits both: three candidates, of which one (ceil(3 / 3)) survives seed 1000.
    assert sorted(name for name, _, _ in outcome.ranking) == [
        "slot1:conv_residual@0",
        "slot2:lowrank_adapter@0",
        "slot2:residual_mlp@0",
    ]
    assert [seeds for _, _, seeds in outcome.ranking] == [2, 1, 1]
    best = outcome.best_episodes
    assert [r.seed for r in best] == plan.seeds("demonstrations")
    assert all(r.policy == "scheduled" and r.commands.get("germinate") == 1 for r in best)
    store = SimicStore.open(compiled_home.home)
    try:
        decisions = store.decisions([r.run_id for r in best])
        assert decisions and {d.policy for d in decisions} == {"scheduled"}
        policy = train_imitation(store, [r.run_id for r in best], plan)
        # Every scheduled decision became a sample: the searched schedule is a demonstrator.
        assert policy.provenance["skipped_decisions"] == 0
        assert policy.provenance["decisions"] == len(decisions) == plan.demonstrations * plan.epochs
    finally:
        store.close()


def test_without_a_search_the_heuristic_demonstrates(compiled_home: EsperSettings) -> None:
    plan = dataclasses.replace(get_plan("smoke"), demonstrations=1)
    (demo,) = collect_demonstrations(compiled_home, recipe="seed-reference", plan=plan)
    assert demo.policy == "heuristic"
    with pytest.raises(ValueError, match=r"does not search: set TrainingPlan.search"):
        search_demonstrations(compiled_home, recipe="seed-reference", plan=plan)
