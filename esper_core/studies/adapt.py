"""The adaptation study: a stored policy on varied tasks, beside the best fixed schedule and its own replay.

Does a learned growth policy adapt to the task, and does adapting pay? A policy trained on one
recipe can score well by replaying one schedule whatever it sees. This study moves the task under
a stored policy (host width x0.5 and x2, half the training data; ``EpisodeTask``, applied to every
arm alike) and sets the policy beside two fixed schedules on the same tasks and held-out seeds:

- ``best-fixed``: the single schedule that does best over all the tasks together, searched by
  successive halving (``search_schedules``) on separate selection seeds, ranked by validation
  accuracy, or a language model's validation loss (never test). Its family is the search family
  (``candidate_schedules``) plus ``replay``;
- ``replay``: the policy's own germinations on the recipe's task (read from one run on the first
  selection seed), replayed on every task: what a policy that does not adapt would do;
- ``none``: the static host at the task's width, for what growth bought on that task.

For each task and arm: test accuracy, parameters, training FLOPs; paired differences with
bootstrap 95 % intervals (``gnn`` minus each other arm); and how many distinct germination
schedules the policy chose across the seeds of the task and across tasks, which says whether its
decisions change with what it sees. The command is ``python -m bench.adapt``.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_core.contracts.enums import SeedOperation
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.run.plan import plan_run
from esper_core.run.recipes import get_recipe
from esper_core.run.scores import token_targets
from esper_core.run.task import EpisodeTask
from esper_core.settings import EsperSettings
from esper_core.simic.record_types import PolicyVersion
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import EpisodeResult, count_halted, episode_config, run_episode
from esper_core.studies.growth import fresh_run_id
from esper_core.studies.schedule_search import (
    GERMINATION_POINTS,
    Schedule,
    candidate_schedules,
    schedule_name,
    search_schedules,
)
from esper_core.tamiyo.config import ScheduledGermination
from esper_core.telemetry.paired import paired_difference

SPLIT_SEED = 0
"""The growth benchmark's one data split: the same test set for every seed, arm and task."""
SELECTION_FIRST_SEED = 3000
"""Selection seeds start here: apart from the evaluation seeds (0 ..) and Simic's (1000 ..)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One varied task: a host width factor and a share of the training data."""

    width: float = 1.0
    train_fraction: float = 1.0

    @property
    def name(self) -> str:
        return f"width={self.width:g},train_fraction={self.train_fraction:g}"

    def for_seed(self, seed: int) -> EpisodeTask:
        # The run's seed picks the kept half, so every arm of one seed trains on the same samples.
        return EpisodeTask(seed=seed, width=self.width, train_fraction=self.train_fraction)


DEFAULT_TASKS = (Task(width=0.5), Task(width=2.0), Task(train_fraction=0.5))
"""The issue's three: a host half and twice as wide, and half the training data."""


def germinations(settings: EsperSettings, run_id: str) -> Schedule:
    """The germinations a run's policy issued (Simic's stored decisions), as a fixed schedule."""
    store = SimicStore.open(settings.home)
    try:
        decisions = store.decisions([run_id])
    finally:
        store.close()
    return tuple(
        ScheduledGermination(epoch=d.command.epoch, slot=d.command.slot_id, blueprint=d.command.blueprint_id)
        for d in decisions
        if d.command.seed_operation is SeedOperation.GERMINATE
    )


class Episodes:
    """Runs one arm on one task and seed, with a deterministic run id, on one torch thread."""

    def __init__(self, settings: EsperSettings, recipe: str, policy: PolicyVersion, *, epochs: int | None) -> None:
        self.settings, self.recipe, self.policy, self.epochs = settings, recipe, policy, epochs
        self.count = 0

    def __call__(self, arm: str, task: Task, seed: int, schedule: Schedule = ()) -> EpisodeResult:
        config = episode_config(
            self.recipe,
            seed=seed,
            policy="scheduled" if schedule else arm,
            epochs=self.epochs,
            policy_version=self.policy.version if arm == "gnn" else None,
            lr_schedule="cosine",
            split_seed=SPLIT_SEED,
            schedule=schedule,
            task=task.for_seed(seed),
        )
        # The GNN at the size it was stored with (a policy trained by another plan may be smaller).
        config.tamiyo = dataclasses.replace(config.tamiyo, gnn=self.policy.gnn)
        label = schedule_name(schedule) if schedule else arm
        run_id = fresh_run_id(self.settings, f"adapt-{self.recipe}-{label}-{task.name}-s{seed}")
        self.count += 1
        print(f"[adapt] {self.count}: {run_id}", file=sys.stderr, flush=True)
        return run_episode(config, settings=self.settings, run_id=run_id)


def run(
    recipe: str,
    *,
    home: Path,
    policy_version: int,
    seeds: int,
    selection_seeds: int,
    tasks: tuple[Task, ...],
    epochs: int | None = None,
    eta: int = 3,
) -> dict[str, Any]:
    """The adaptation measurement (see the module docstring)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    settings = EsperSettings(home=home)
    store = SimicStore.open(home)
    try:
        policy = store.get_policy(policy_version)
        policy.require_current_inputs()  # a stale version fails here, before any run
    finally:
        store.close()
    episode = Episodes(settings, recipe, policy, epochs=epochs)
    selection = list(range(SELECTION_FIRST_SEED, SELECTION_FIRST_SEED + selection_seeds))
    own = episode("gnn", Task(), selection[0])
    replay = germinations(settings, own.run_id)
    config = get_recipe(recipe, epochs=epochs)
    data = load_dataset(config.data)
    family = candidate_schedules(config, plan_run(config, catalog=default_catalog(), data=data), GERMINATION_POINTS)
    if replay and replay not in family:
        family.append(replay)
    search = search_schedules(
        family,
        selection,
        lambda schedule, seed: [episode("scheduled", t, seed, schedule) for t in tasks],
        eta=eta,
        language_model=token_targets(data),
    )
    best = search.best
    arms: dict[str, dict[str, list[EpisodeResult]]] = {t.name: {} for t in tasks}
    chosen: dict[str, list[str]] = {}
    for task in tasks:
        runs = arms[task.name]
        runs["gnn"] = [episode("gnn", task, s) for s in range(seeds)]
        runs["best-fixed"] = [episode("scheduled", task, s, best) for s in range(seeds)]
        runs["replay"] = [episode("scheduled", task, s, replay) for s in range(seeds)] if replay else []
        runs["none"] = [episode("none", task, s) for s in range(seeds)]
        chosen[task.name] = [schedule_name(germinations(settings, r.run_id)) or "(none)" for r in runs["gnn"]]
    return {
        "bench": "adapt",
        "recipe": recipe,
        "policy_version": policy_version,
        "seeds": list(range(seeds)),
        "selection_seeds": selection,
        "split_seed": SPLIT_SEED,
        "replay": schedule_name(replay) or "(none)",
        "best_fixed": schedule_name(best),
        "family_size": len(family),
        "search_ranking": [{"schedule": n, "val_acc_mean": 100.0 * v, "episodes": k} for n, v, k in search.ranking],
        "tasks": {name: _task_summary(runs, chosen[name]) for name, runs in arms.items()},
        "decisions": {
            "distinct_schedules_all_tasks": len({s for names in chosen.values() for s in names}),
            "schedules_shared_by_tasks": sorted(set.intersection(*(set(n) for n in chosen.values()))),
        },
        "episodes_run": episode.count,
        "wall_s": time.perf_counter() - start,
    }


def _task_summary(runs: dict[str, list[EpisodeResult]], chosen: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "arms": {
            arm: {
                "test_acc_mean": statistics.fmean(100.0 * r.test_accuracy for r in results),
                "params_mean": statistics.fmean(r.total_params for r in results),
                "train_flops_mean": statistics.fmean(r.train_flops for r in results),
                "per_seed": [round(100.0 * r.test_accuracy, 2) for r in results],
                # Halted runs stay in their pairs, scored at their last commit (run_episode).
                "halted": count_halted(results),
            }
            for arm, results in runs.items()
            if results
        },
        "gnn_schedules": dict(Counter(chosen).most_common()),
    }
    gnn = [100.0 * r.test_accuracy for r in runs["gnn"]]
    for arm in ("best-fixed", "replay", "none"):
        if runs[arm]:
            other = [100.0 * r.test_accuracy for r in runs[arm]]
            summary[f"gnn_minus_{arm}"] = paired_difference(gnn, other).as_dict()
    return summary
