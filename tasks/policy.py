"""Simic tasks: collect episodes, imitate, improve with PPO. Each returns run ids or a version.

``NO_CACHE`` throughout: episodes are side effects on the registry, and a policy version is
published by the task itself (idempotently: a retried training task republishes the same
seeded weights, which Simic maps to the existing version).

Each task runs its step in a child process that the training time limit stops (``in_child``):
Prefect's own timeout interrupts with a signal that it may defer during one of its shielded calls
and then lose, so a limit it enforces need not hold.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks._limits import in_child, limited
from tasks._retry import transient
from tasks._runtime import settings

_JOBS = "esper_core.studies.simic_jobs"


@task(
    name="collect-episodes",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def collect(
    recipe: str,
    plan: str,
    policy: str,
    seeds: list[int],
    explore: bool = False,
    policy_version: int | None = None,
    device: str = "cpu",
) -> list[str]:
    """Run one episode per seed with ``policy`` deciding; returns their run ids."""
    return in_child(
        "train", f"{_JOBS}:episode_ids", settings(), recipe, plan, policy, seeds, explore, policy_version, device
    )


@task(
    name="collect-demonstrations",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def demonstrate(recipe: str, plan: str, device: str = "cpu") -> list[str]:
    """The plan's demonstrations of ``recipe`` (the heuristic's, or the best searched schedule's); run ids."""
    return in_child("train", f"{_JOBS}:demonstration_ids", settings(), recipe, plan, device)


@task(
    name="imitate-policy",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def imitate_policy(run_ids: list[str], plan: str) -> int:
    """Imitate the decisions of ``run_ids``; returns the published version."""
    return in_child("train", f"{_JOBS}:imitation_version", settings(), run_ids, plan)


@task(
    name="improve-policy",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def improve_policy(version: int, rollout_run_ids: list[str], demonstration_run_ids: list[str], plan: str) -> int:
    """One PPO update of ``version`` on its rollouts; returns the published version."""
    return in_child("train", f"{_JOBS}:ppo_version", settings(), version, rollout_run_ids, demonstration_run_ids, plan)
