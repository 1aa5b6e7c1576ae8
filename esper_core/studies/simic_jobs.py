"""Simic's training steps as functions of plain values, for a child process to run.

The ``train_policy`` flow's tasks run each step in a child process (``esper_core.child``) so that
the training time limit can stop it: these take the plan by name and return only run ids or a
policy version, which pickle cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence

from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.simic_train import (
    collect_demonstrations,
    collect_episodes,
    get_plan,
    train_imitation,
    train_ppo,
)


def demonstration_ids(settings: EsperSettings, recipe: str, plan: str, device: str) -> list[str]:
    """Run ids of the plan's demonstrations of ``recipe`` (``collect_demonstrations``)."""
    results = collect_demonstrations(settings, recipe=recipe, plan=get_plan(plan), device=device)
    return [r.run_id for r in results]


def episode_ids(
    settings: EsperSettings,
    recipe: str,
    plan: str,
    policy: str,
    seeds: Sequence[int],
    explore: bool,
    policy_version: int | None,
    device: str,
) -> list[str]:
    """Run ids of one episode per seed with ``policy`` deciding (``collect_episodes``)."""
    results = collect_episodes(
        settings,
        recipe=recipe,
        seeds=seeds,
        policy=policy,
        plan=get_plan(plan),
        explore=explore,
        policy_version=policy_version,
        device=device,
    )
    return [r.run_id for r in results]


def imitation_version(settings: EsperSettings, run_ids: Sequence[str], plan: str) -> int:
    """The policy version published by imitating ``run_ids`` (``train_imitation``)."""
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        return train_imitation(store, run_ids, get_plan(plan)).version
    finally:
        store.close()


def ppo_version(
    settings: EsperSettings,
    version: int,
    rollout_run_ids: Sequence[str],
    demonstration_run_ids: Sequence[str],
    plan: str,
) -> int:
    """The policy version published by one PPO update of ``version`` (``train_ppo``)."""
    store = SimicStore.open(settings.home, settings.registry_db_url)
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
