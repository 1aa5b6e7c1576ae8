"""Counterfactual forks on real runs (seed-reference: 16 samples, a Linear 16->4 host, real
Run, real kernels from the compiled registry): the main run is untouched, both branches
are real training, forks happen only where a choice exists and within budget, and Simic's
counterfactual samples are exactly the forked decisions."""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.config import RunConfig
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.simic.dataset import build_samples
from esper_core.simic.records import CounterfactualOutcome, SimicStore
from esper_core.studies.counterfactual import CounterfactualConfig, CounterfactualForks, fork, lifecycle_horizon
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.studies.simic_train import TrainingPlan, collect_episodes, get_plan, train_imitation, train_ppo
from esper_core.tamiyo.config import ScheduledGermination
from esper_core.urza.service import Urza
from tests.helpers.state import assert_same_state

EPOCHS = 6


@dataclasses.dataclass
class _Run:
    losses: list[tuple[float, float, float]]  # (train_loss, val_loss, val_accuracy) per epoch
    weights: dict[str, torch.Tensor]
    actions: list[str]
    outcomes: dict[int, CounterfactualOutcome]  # decided epoch -> its fork


def _run(settings: EsperSettings, config: RunConfig, run_id: str, forks: CounterfactualConfig | None = None) -> _Run:
    """``run_episode``'s loop, keeping what the tests compare."""
    (settings.runs_dir / run_id).mkdir(parents=True)
    session = Run(config=config, settings=settings, run_id=run_id, urza=Urza.open(settings.home))
    session.commit(START_TAG)
    evaluator = None if forks is None else CounterfactualForks(forks, run_id=run_id)
    outcomes = {}
    try:
        for epoch in range(config.epochs):
            session.train_epoch()
            session.commit(epoch_tag(epoch, "trained"))
            command = session.decide()
            if evaluator is not None and (outcome := evaluator.maybe_fork(session, command)) is not None:
                outcomes[epoch] = outcome
            session.apply(command)
            session.commit(epoch_tag(epoch, "applied"))
        return _Run(
            losses=[(p.train_loss, p.val_loss, p.val_accuracy) for p in session.history],
            weights={k: v.clone() for k, v in session.trainer.model.state_dict().items()},
            actions=[c.action for c in session.commands],
            outcomes=outcomes,
        )
    finally:
        session.close()


@pytest.fixture
def second_home(tmp_path: Path, compiled_home_template: Path) -> EsperSettings:
    """Another ESPER_HOME with the same compiled registry (the same run id runs in both)."""
    home = tmp_path / "second"
    shutil.copytree(compiled_home_template, home)
    return EsperSettings(home=home)


def _config(policy: str = "heuristic", **changes: object) -> RunConfig:
    return dataclasses.replace(episode_config("seed-reference", seed=0, policy=policy, epochs=EPOCHS), **changes)


def test_forking_leaves_the_main_run_bit_identical(compiled_home: EsperSettings, second_home: EsperSettings) -> None:
    plain = _run(compiled_home, _config(), "same")
    forked = _run(second_home, _config(), "same", CounterfactualConfig(horizon=3, max_forks=3, fork_probability=1.0))
    assert len(forked.outcomes) == 3, "the test must actually fork"
    assert forked.losses == plain.losses  # exact float equality, every epoch
    assert forked.actions == plain.actions
    assert forked.weights.keys() == plain.weights.keys()
    assert all(torch.equal(forked.weights[k], plain.weights[k]) for k in plain.weights)


def test_a_fork_puts_back_every_field_of_the_run_state(compiled_home: EsperSettings) -> None:
    """Field by field, the run's state after a fork (record, unsent telemetry, pending decisions,
    trainer, rails, seed manager) is the state before it, and no attribute of the session was
    replaced: whatever a step changes lives in the state object the fork copies."""
    (compiled_home.runs_dir / "every").mkdir(parents=True)
    session = Run(config=_config(), settings=compiled_home, run_id="every", urza=Urza.open(compiled_home.home))
    try:
        session.commit(START_TAG)
        session.train_epoch()
        session.commit(epoch_tag(0, "trained"))
        command = session.decide()
        session.rails.note("tolaria.remediation", "an undrained rails event")
        record = session.control.pending_decision(command)
        assert record is not None
        before = copy.deepcopy(session.state.state_dict(in_memory=True))
        live = before["in_memory"]
        assert live["outbox"] and live["decision_records"] and live["candidates"] and live["dirty"]
        assert before["emergency"]["events"], "the fork must have undrained rails events to put back"
        attributes = dict(vars(session))
        outcome = fork(session, command, record=record, config=CounterfactualConfig(horizon=2))
        assert outcome is not None and outcome.horizon == 2, "both branches must really train"
        assert_same_state(before, session.state.state_dict(in_memory=True))
        assert vars(session).keys() == attributes.keys()
        assert all(vars(session)[name] is value for name, value in attributes.items())
    finally:
        session.close()


def test_a_germination_is_scored_against_a_real_wait_branch(
    compiled_home: EsperSettings, second_home: EsperSettings
) -> None:
    """Branch A (germinate) and branch B (WAIT) are real training: each equals, bit for bit, the
    run that really took that path (the heuristic's run, and the same run with no growth)."""
    horizon = 4
    config = CounterfactualConfig(horizon=horizon, max_forks=EPOCHS, fork_probability=1.0)
    grown = _run(compiled_home, _config(), "cf", config)
    none = _run(second_home, _config("none"), "cf")
    epoch = grown.actions.index(SeedOperation.GERMINATE.value)
    outcome = grown.outcomes[epoch]
    assert outcome.baseline == "wait" and outcome.baseline_action == "wait" and outcome.horizon == horizon
    # Lifecycle-only control after the fork is what the heuristic does while its one seed is in
    # flight, so branch A is the heuristic run itself; branch B is the run that never grew.
    assert (outcome.val_loss, outcome.val_accuracy) == grown.losses[epoch + horizon][1:]
    assert (outcome.baseline_val_loss, outcome.baseline_val_accuracy) == none.losses[epoch + horizon][1:]
    assert outcome.baseline_params == outcome.host_params  # branch B never grew
    # Branch A holds the seed unless a gate culled it within the horizon, as the real run did.
    culled = SeedOperation.CULL.value in grown.actions[epoch : epoch + horizon]
    assert (outcome.params == outcome.host_params) if culled else (outcome.params > outcome.host_params)
    # The seed blended in within the horizon, so the host's function changed: the branches differ.
    # (Accuracy on 3-4 validation samples may tie; the loss cannot unless the seed is inert.)
    assert outcome.val_loss != outcome.baseline_val_loss
    expected = (outcome.val_accuracy - outcome.baseline_val_accuracy) - 0.01 * (
        outcome.params - outcome.baseline_params
    ) / outcome.host_params
    assert outcome.reward(param_penalty=0.01) == pytest.approx(expected)
    # A WAIT forked while the slot was dormant is scored against a random germination
    # (explore_on_wait); once the slot is busy both branches wait, one is played, the reward is 0.
    waits = [grown.outcomes[e] for e in grown.outcomes if grown.actions[e] == "wait"]
    explored = [o for o in waits if o.baseline_action == "germinate"]
    assert explored and all(o.baseline_params > o.host_params for o in explored)
    assert all(o.reward(param_penalty=0.01) == 0.0 for o in waits if o.baseline_action == "wait")
    # Without it a WAIT is only ever scored against itself.
    plain = dataclasses.replace(config, explore_on_wait=False)
    waits = [o for e, o in _run(second_home, _config(), "plain", plain).outcomes.items() if grown.actions[e] == "wait"]
    assert waits and all(o.baseline_action == "wait" and o.reward(param_penalty=0.01) == 0.0 for o in waits)


def test_no_fork_where_only_wait_is_legal(compiled_home: EsperSettings) -> None:
    # No artifact of bottleneck_mlp in the registry: nothing can be germinated, no seed is ever
    # in flight, so every decision is WAIT with nothing else legal (PAUSE aside).
    config = _config(blueprints=("bottleneck_mlp",))
    run = _run(compiled_home, config, "nochoice", CounterfactualConfig(max_forks=EPOCHS, fork_probability=1.0))
    assert set(run.actions) == {"wait"} and run.outcomes == {}


def test_max_forks_is_respected_and_the_choice_is_deterministic(
    compiled_home: EsperSettings, second_home: EsperSettings
) -> None:
    # Every decision of the run has a choice (a dormant slot, then a seed in flight) but the last.
    every = _run(
        compiled_home, _config(), "all", CounterfactualConfig(horizon=1, max_forks=EPOCHS, fork_probability=1.0)
    )
    assert sorted(every.outcomes) == list(range(EPOCHS - 1))  # the last decision has no epoch left to play
    capped = _run(
        compiled_home, _config(), "capped", CounterfactualConfig(horizon=1, max_forks=2, fork_probability=1.0)
    )
    assert sorted(capped.outcomes) == [0, 1]
    # Which decisions fork is drawn from the run id and epoch: the same run id forks the same ones.
    sparse = CounterfactualConfig(horizon=1, max_forks=2, fork_probability=0.5)
    first = run_episode(_config(), settings=compiled_home, run_id="budget", counterfactual=sparse)
    again = run_episode(_config(), settings=second_home, run_id="budget", counterfactual=sparse)
    assert 1 <= first.forks <= 2 and first.forks == again.forks and first.fork_ms > 0
    epochs = []
    for settings in (compiled_home, second_home):
        store = SimicStore.open(settings.home)
        try:
            epochs.append([d.command.epoch for d in store.decisions(["budget"]) if d.counterfactual is not None])
        finally:
            store.close()
    assert epochs[0] == epochs[1] and len(epochs[0]) == first.forks


def test_counterfactual_samples_are_exactly_the_forked_decisions(compiled_home: EsperSettings) -> None:
    config = CounterfactualConfig(horizon=2, max_forks=3, fork_probability=1.0)
    result = run_episode(_config(), settings=compiled_home, run_id="samples", counterfactual=config)
    assert result.forks == 3
    store = SimicStore.open(compiled_home.home)
    try:
        records = store.decisions(["samples"])
    finally:
        store.close()
    forked = {d.command.epoch: d.counterfactual for d in records if d.counterfactual is not None}
    assert sorted(forked) == [0, 1, 2]
    samples, skipped = build_samples(records, [], param_penalty=0.01, reward="counterfactual")
    assert skipped == 0 and sorted(s.epoch for s in samples) == [0, 1, 2]
    assert all(s.one_step and s.reward == forked[s.epoch].reward(param_penalty=0.01) for s in samples)
    every, _ = build_samples(records, [], param_penalty=0.01)
    assert len(every) == EPOCHS and not any(s.one_step for s in every)


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"horizon": 0}, "use e.g. 3"),
        ({"max_forks": 0}, "reward='delta'"),
        ({"fork_probability": 0.0}, "use 1.0"),
        ({"baseline": "random"}, "one of"),
    ],
)
def test_config_errors_name_the_fix(kwargs: dict[str, object], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        CounterfactualConfig(**kwargs)


def test_training_plan_refuses_an_unknown_reward() -> None:
    with pytest.raises(ValueError, match=r"reward must be one of \('delta', 'counterfactual'\)"):
        TrainingPlan(reward="bandit")  # type: ignore[arg-type]
    assert TrainingPlan(reward="counterfactual").forks is not None and TrainingPlan().forks is None


def test_the_heuristic_baseline_plays_the_heuristics_command(compiled_home: EsperSettings) -> None:
    # The schedule germinates after epoch 3; the heuristic would germinate at its probe epoch 1:
    # forking epoch 1 against the heuristic compares WAIT (decided) with that germination.
    schedule = (ScheduledGermination(epoch=3, slot="slot0", blueprint="lowrank_adapter"),)
    config = episode_config("seed-reference", seed=0, policy="scheduled", epochs=EPOCHS, schedule=schedule)
    forks = CounterfactualConfig(horizon=3, max_forks=EPOCHS, fork_probability=1.0, baseline="heuristic")
    run = _run(compiled_home, config, "vs-heuristic", forks)
    assert run.actions[1] == "wait" and run.actions[3] == "germinate"
    outcome = run.outcomes[1]
    assert outcome.baseline == "heuristic" and outcome.baseline_action == "germinate"
    assert outcome.params == outcome.host_params < outcome.baseline_params
    assert outcome.val_loss != outcome.baseline_val_loss


def test_ppo_learns_from_the_forked_rollout_decisions_only(compiled_home: EsperSettings) -> None:
    smoke = get_plan("smoke")
    plan = dataclasses.replace(
        smoke,
        epochs=EPOCHS,
        reward="counterfactual",
        counterfactual=CounterfactualConfig(horizon=2, max_forks=2, fork_probability=1.0),
    )
    store = SimicStore.open(compiled_home.home)
    try:
        demos = collect_episodes(compiled_home, recipe="seed-reference", seeds=[1000], policy="heuristic", plan=plan)
        assert demos[0].forks == 0  # only the GNN's rollouts are forked
        version = train_imitation(store, [r.run_id for r in demos], plan).version
        rollouts = collect_episodes(
            compiled_home, recipe="seed-reference", seeds=[1001], policy="gnn", plan=plan, explore=True
        )
        assert rollouts[0].forks == 2
        ids = [r.run_id for r in rollouts]
        ppo = train_ppo(store, version=version, rollout_run_ids=ids, demonstration_run_ids=[demos[0].run_id], plan=plan)
        assert ppo.provenance["metrics"]["samples"] == 2.0 and "entropy" in ppo.provenance["metrics"]
        with pytest.raises(ValueError, match="no forked decisions.*fork_probability"):
            train_ppo(store, version=version, rollout_run_ids=[demos[0].run_id], demonstration_run_ids=[], plan=plan)
    finally:
        store.close()


def test_default_horizon_lasts_until_g4_judges_a_seed_germinated_at_the_fork(compiled_home: EsperSettings) -> None:
    config = _config(epochs=12)
    lifecycle = config.kasmina.min_training_epochs + config.kasmina.probation_epochs
    forks = CounterfactualConfig(max_forks=1, fork_probability=1.0)  # horizon None: the seed's lifecycle
    ((_, outcome),) = _run(compiled_home, config, "lifecycle", forks).outcomes.items()
    assert outcome.horizon == lifecycle + config.tamiyo.heuristic.blend_epochs
    session = Run(config=config, settings=compiled_home, run_id="lifecycle", urza=Urza.open(compiled_home.home))
    try:
        wait = AdaptationCommand(run_id="r", epoch=0, command_type=CommandType.WAIT, issued_by="t", reason="t")
        germinate = AdaptationCommand(
            run_id="r",
            epoch=0,
            command_type=CommandType.SEED,
            seed_operation=SeedOperation.GERMINATE,
            slot_id="slot0",
            blueprint_id="lowrank_adapter",
            blend_epochs=7,
            issued_by="t",
            reason="t",
        )
        # Both branches get the longer lifecycle, whichever of them germinates.
        assert (
            lifecycle_horizon(session, wait, germinate) == lifecycle_horizon(session, germinate, wait) == lifecycle + 7
        )
    finally:
        session.close()
