"""Simic tasks: collect episodes, imitate, improve with PPO. Each returns run ids or a version.

``NO_CACHE`` throughout: episodes are side effects on the registry, and a policy version is
published by the task itself (idempotently: a retried training task republishes the same
seeded weights, which Simic maps to the existing version).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.run.simic_train import collect_demonstrations, collect_episodes, get_plan, train_imitation, train_ppo
from esper_core.simic.records import SimicStore
from tasks._limits import limited, retry_unless_timed_out
from tasks._runtime import settings


def _store() -> SimicStore:
    s = settings()
    return SimicStore.open(s.home, s.registry_db_url)


@task(
    name="collect-episodes",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_timed_out,
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
    results = collect_episodes(
        settings(),
        recipe=recipe,
        seeds=seeds,
        policy=policy,
        plan=get_plan(plan),
        explore=explore,
        policy_version=policy_version,
        device=device,
    )
    return [r.run_id for r in results]


@task(
    name="collect-demonstrations",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_timed_out,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def demonstrate(recipe: str, plan: str, device: str = "cpu") -> list[str]:
    """The plan's demonstrations of ``recipe`` (the heuristic's, or the best searched schedule's); run ids."""
    results = collect_demonstrations(settings(), recipe=recipe, plan=get_plan(plan), device=device)
    return [r.run_id for r in results]


@task(
    name="imitate-policy",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_timed_out,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def imitate_policy(run_ids: list[str], plan: str) -> int:
    """Imitate the decisions of ``run_ids``; returns the published version."""
    store = _store()
    try:
        return train_imitation(store, run_ids, get_plan(plan)).version
    finally:
        store.close()


@task(
    name="improve-policy",
    retries=1,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_timed_out,
    cache_policy=NO_CACHE,
    **limited("train"),
)
def improve_policy(version: int, rollout_run_ids: list[str], demonstration_run_ids: list[str], plan: str) -> int:
    """One PPO update of ``version`` on its rollouts; returns the published version."""
    store = _store()
    try:
        return train_ppo(
            store,
            version=version,
            rollout_run_ids=rollout_run_ids,
            demonstration_run_ids=demonstration_run_ids,
            plan=get_plan(plan),
        ).version
    finally:
        store.close()
