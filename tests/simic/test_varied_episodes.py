"""Simic's training episodes on varied tasks, end to end: real runs on a real registry, each
episode's drawn task recorded with its decisions and in the provenance of the policy trained on them."""

from __future__ import annotations

import dataclasses

import pytest

from esper_core.karn.entries import default_catalog
from esper_core.pipeline import find_published
from esper_core.run.plan import plan_compile_jobs
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.studies.episodes import episode_config
from esper_core.studies.simic_train import collect_episodes, get_plan, train_imitation
from esper_core.studies.variation import TaskVariation
from esper_core.urza.service import Urza


def test_each_episode_trains_on_its_drawn_task_and_the_policy_says_which(compiled_home: EsperSettings) -> None:
    variation = TaskVariation(train_fractions=(0.5, 1.0), label_noise=(0.0, 0.25))
    plan = dataclasses.replace(get_plan("smoke"), variation=variation)
    seeds = [1000, 1001, 1003]  # drawn: (0.5, 0.25), (0.5, 0.0), (1.0, 0.0)
    results = collect_episodes(compiled_home, recipe="seed-reference", seeds=seeds, policy="heuristic", plan=plan)
    assert [r.task for r in results] == [variation.draw(s) for s in seeds]
    assert len({(r.task.train_fraction, r.task.label_noise) for r in results if r.task}) == 3
    plain = collect_episodes(
        compiled_home, recipe="seed-reference", seeds=[1000], policy="heuristic", plan=get_plan("smoke"), label="plain"
    )
    assert plain[0].task is None
    store = SimicStore.open(compiled_home.home)
    try:
        run_ids = [r.run_id for r in results]
        for result in results:
            decisions = store.decisions([result.run_id])
            assert decisions and all(d.state.task == result.task.to_dict() for d in decisions)  # type: ignore[union-attr]
        unvaried = store.decisions([plain[0].run_id])
        assert all(d.state.task is None for d in unvaried)
        # The same seed on the recipe's own task trained differently: the task reached the run.
        first = store.decisions([results[0].run_id])[0].state.current
        assert first.train_loss != unvaried[0].state.current.train_loss
        assert first.val_loss == pytest.approx(unvaried[0].state.current.val_loss, abs=1.0)  # same val split
        policy = train_imitation(store, run_ids, plan)
        assert policy.provenance["tasks"] == {r.run_id: r.task.to_dict() for r in results}  # type: ignore[union-attr]
        assert policy.provenance["variation"]["label_noise"] == [0.0, 0.25]
        assert "tasks" not in train_imitation(store, [plain[0].run_id], get_plan("smoke")).provenance
    finally:
        store.close()


def test_a_narrower_host_gets_kernels_for_its_slots_and_grows(compiled_home: EsperSettings) -> None:
    variation = TaskVariation(widths=(0.5,))
    plan = dataclasses.replace(get_plan("smoke"), epochs=3, variation=variation)
    config = episode_config("digits-mlp", seed=1000, policy="heuristic", task=variation.draw(1000))
    jobs = plan_compile_jobs(config, feature_shape=(64,), catalog=default_catalog())

    def published() -> list[bool]:
        urza = Urza.open(compiled_home.home)
        try:
            return [find_published(urza, job, "cpu") is not None for job in jobs]
        finally:
            urza.close()

    assert jobs and not any(published())  # the registry holds the recipe's width only
    (narrow,) = collect_episodes(compiled_home, recipe="digits-mlp", seeds=[1000], policy="heuristic", plan=plan)
    assert all(published())
    assert narrow.task is not None and narrow.task.width == 0.5
    assert narrow.host_params == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    # The heuristic germinated after its probe epoch: a kernel for the 32-wide slots was there.
    assert narrow.commands.get("germinate") == 1


def test_a_recipe_that_cannot_vary_is_refused_before_any_episode(compiled_home: EsperSettings) -> None:
    plan = dataclasses.replace(get_plan("smoke"), variation=TaskVariation(widths=(0.5, 1.0)))
    with pytest.raises(ValueError, match=r"no hidden layer to widen"):
        collect_episodes(compiled_home, recipe="seed-reference", seeds=[1000], policy="heuristic", plan=plan)
    assert not compiled_home.runs_dir.exists() or not any(compiled_home.runs_dir.iterdir())
