"""Fixed growth schedules: the family searched, and a budgeted search for the best of them.

A schedule is a list of germinations (slot x blueprint x epoch) that ignores the run's state.
``candidate_schedules`` spans a small family of them; the headroom benchmark runs every member
on a few seeds to measure what a learned controller could gain over the heuristic, and Simic's
``search`` plans learn from the winner of ``search_schedules`` (expert iteration: a search
produces the demonstrations, imitation distils them into the GNN, PPO then refines it).

``search_schedules`` is successive halving: every candidate runs on the first seed, the best
``1 / eta`` of them (by mean final validation quality over the seeds run so far) go on to the
next seed, and so on, until one is left or the seeds run out. A family of 27 on four seeds costs
27 + 9 + 3 + 1 = 40 episodes instead of 108. Validation quality is what Simic's rewards and the
zoo's selection read (``esper_core.simic.record_types.validation_quality``): a classifier's
accuracy, and for a language model (whose accuracy is 0) minus half its loss in bits per token.
Ranking reads the validation split, never test: the search chooses what a policy learns, and the
test split is what the policy is judged on.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from esper_core.fanout import LOCAL, Pool
from esper_core.run.config import RunConfig
from esper_core.run.plan import RunPlan
from esper_core.simic.record_types import validation_quality
from esper_core.studies.episodes import EpisodeResult
from esper_core.tamiyo.config import ScheduledGermination

Schedule = tuple[ScheduledGermination, ...]
RunSchedule = Callable[[Schedule, int], EpisodeResult | Sequence[EpisodeResult]]
"""``run(schedule, seed)``: one real episode of policy ``scheduled``, or one per task when a
schedule is searched for several tasks at once (each round then scores it on all of them)."""

GERMINATION_POINTS = (0.05, 0.2, 0.4)
"""Where the family germinates, as fractions of the run: early, at a fifth and at two fifths
(later ones train a seed at a learning rate cosine has nearly spent). The headroom benchmark and
Simic's search share it, so the headroom measured is the headroom searched."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSearch:
    """Which schedules a search considers and how fast it discards them.

    Attributes:
        at: Germination points, as fractions of the run (0: after the first epoch).
        eta: Each round keeps the best ``ceil(n / eta)`` of its ``n`` candidates.
    """

    at: tuple[float, ...] = GERMINATION_POINTS
    eta: int = 3

    def __post_init__(self) -> None:
        if not self.at or any(not 0.0 <= f <= 1.0 for f in self.at):
            raise ValueError(f"ScheduleSearch.at needs fractions of the run in [0, 1], got {self.at}")
        if self.eta < 2:
            raise ValueError(f"ScheduleSearch.eta must be >= 2 (each round must discard some), got {self.eta}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOutcome:
    """What a schedule search found.

    Attributes:
        best: The schedule that survived every round.
        ranking: ``(name, mean validation quality, episodes run)`` of every candidate, best first:
            the ones that went further rank above the ones discarded earlier. The quality is the
            validation accuracy of a classifier (module docstring).
        episodes: Every episode the search ran, by schedule name.
    """

    best: Schedule
    ranking: tuple[tuple[str, float, int], ...]
    episodes: dict[str, list[EpisodeResult]]

    @property
    def best_episodes(self) -> list[EpisodeResult]:
        """The winner's episodes, one per seed: Simic's demonstrations."""
        return self.episodes[schedule_name(self.best)]


def candidate_schedules(config: RunConfig, plan: RunPlan, at: tuple[float, ...]) -> list[Schedule]:
    """The schedules searched: one germination per (epoch, slot, fitting blueprint), and, for each
    blueprint that fits every slot, all slots in slot order starting at each epoch."""
    last = config.epochs - 1
    epochs = sorted({min(last, round(f * last)) for f in at})
    # Width slots too: their "blueprints" are the width menu (``esper_core.karn.width``).
    fits = {slot: list(plan.slot_fits[slot]) for slot in (*plan.slots, *plan.built_slots)}
    singles = [
        (ScheduledGermination(epoch=e, slot=s, blueprint=b),) for e in epochs for s, bs in fits.items() for b in bs
    ]
    offered = dict.fromkeys(b for bs in fits.values() for b in bs)
    everywhere = [b for b in offered if all(b in bs for bs in fits.values())]
    together = [
        tuple(ScheduledGermination(epoch=e + k, slot=s, blueprint=b) for k, s in enumerate(fits))
        for e in epochs
        for b in everywhere
        if len(fits) > 1 and e + len(fits) - 1 <= last
    ]
    return singles + together


def _run_one(job: tuple[RunSchedule, int, Schedule]) -> EpisodeResult | Sequence[EpisodeResult]:
    run, seed, schedule = job
    return run(schedule, seed)


def schedule_name(schedule: Schedule) -> str:
    """``act2:seq_conv_residual@3+act3:seq_conv_residual@4``."""
    return "+".join(f"{g.slot}:{g.blueprint}@{g.epoch}" for g in schedule)


@dataclass(frozen=True, kw_only=True, slots=True)
class HalvingSearch:
    """One successive-halving search (see the module docstring): what ``search_all`` runs.

    Attributes:
        candidates: The schedules, distinct by name.
        seeds: One round per seed, in order; the winner runs on every one of them.
        run: Runs one episode, or one per task (all of them count toward the schedule's mean).
        eta: Each round keeps ``ceil(n / eta)`` of ``n``.
        language_model: Whether the recipe predicts tokens (``esper_core.run.scores.token_targets``
            of its data): its schedules are then ranked by validation loss, its accuracy being 0.
    """

    candidates: Sequence[Schedule]
    seeds: Sequence[int]
    run: RunSchedule
    eta: int
    language_model: bool = False

    def __post_init__(self) -> None:
        if not self.candidates or not self.seeds:
            raise ValueError(
                f"a schedule search needs candidates and seeds, got {len(self.candidates)} and {len(self.seeds)}: "
                "check the recipe's blueprints fit its slots and pass at least one seed"
            )
        if len({schedule_name(s) for s in self.candidates}) != len(self.candidates):
            raise ValueError("candidate schedules must be distinct")


class _Halving:
    """A ``HalvingSearch`` under way: the schedules still in, and every episode run so far."""

    def __init__(self, search: HalvingSearch) -> None:
        self.search = search
        self.by_name = {schedule_name(s): s for s in search.candidates}
        self.episodes: dict[str, list[EpisodeResult]] = {name: [] for name in self.by_name}
        self.alive = list(self.by_name)
        self.discarded: list[tuple[str, float, int]] = []
        self.round = 0
        self.done = False

    def jobs(self) -> list[tuple[RunSchedule, int, Schedule]]:
        """This round's episodes: every schedule still in, on the round's seed."""
        seed = self.search.seeds[self.round]
        return [(self.search.run, seed, self.by_name[name]) for name in self.alive]

    def score(self, name: str) -> float:
        """Mean validation quality of ``name``'s episodes so far (the module docstring)."""
        classifies = not self.search.language_model
        return statistics.fmean(
            validation_quality(accuracy=r.val_accuracy, loss=r.val_loss, classifies=classifies)
            for r in self.episodes[name]
        )

    def finish_round(self, ran: Sequence[EpisodeResult | Sequence[EpisodeResult]]) -> None:
        """Record the round's episodes (in ``jobs``' order) and keep the best ``1 / eta``."""
        for name, results in zip(self.alive, ran, strict=True):
            self.episodes[name].extend([results] if isinstance(results, EpisodeResult) else results)
        # Ties go to the smaller schedule (fewer parameters added), then to the earlier candidate.
        self.alive.sort(key=lambda n: (-self.score(n), statistics.fmean(r.total_params for r in self.episodes[n])))
        if self.round == len(self.search.seeds) - 1 or len(self.alive) == 1:
            self.done = True
            return
        keep = math.ceil(len(self.alive) / self.search.eta)
        self.discarded = [(n, self.score(n), len(self.episodes[n])) for n in self.alive[keep:]] + self.discarded
        self.alive = self.alive[:keep]
        self.round += 1

    def outcome(self) -> SearchOutcome:
        ranking = tuple((n, self.score(n), len(self.episodes[n])) for n in self.alive) + tuple(self.discarded)
        return SearchOutcome(
            best=self.by_name[self.alive[0]],
            ranking=ranking,
            episodes={n: runs for n, runs in self.episodes.items() if runs},
        )


def search_all(searches: Sequence[HalvingSearch], *, pool: Pool = LOCAL) -> list[SearchOutcome]:
    """Run independent searches side by side: each round of every search still going, in one map.

    A search's next round waits for its last one, so on its own it leaves workers idle as its
    rounds shrink (27, 9, 3, 1 episodes); searches of several recipes fill each other's gaps. Each
    search's episodes and winner are the same as when it runs alone.

    Args:
        searches: The searches, e.g. one per recipe.
        pool: Where the episodes run (``esper_core.fanout``); the ``run`` callables then travel
            to the workers.

    Returns:
        Each search's outcome, in ``searches``' order.
    """
    going = [_Halving(search) for search in searches]
    while active := [h for h in going if not h.done]:
        rounds = [h.jobs() for h in active]
        ran = pool.map(_run_one, [job for jobs in rounds for job in jobs])
        start = 0
        for halving, jobs in zip(active, rounds, strict=True):
            halving.finish_round(ran[start : start + len(jobs)])
            start += len(jobs)
    return [h.outcome() for h in going]


def search_schedules(
    candidates: Sequence[Schedule],
    seeds: Sequence[int],
    run: RunSchedule,
    *,
    eta: int,
    language_model: bool = False,
    pool: Pool = LOCAL,
) -> SearchOutcome:
    """Successive halving of ``candidates`` over ``seeds`` (one ``HalvingSearch``, see there).

    Args:
        language_model: Rank by validation loss (``HalvingSearch.language_model``).
        pool: Where a round's episodes run (``esper_core.fanout``): the candidates of a round are
            independent, so they may spread over workers; ``run`` then travels to them.

    Raises:
        ValueError: No candidates or seeds, or two candidates with one name.
    """
    search = HalvingSearch(candidates=candidates, seeds=seeds, run=run, eta=eta, language_model=language_model)
    (outcome,) = search_all([search], pool=pool)
    return outcome
