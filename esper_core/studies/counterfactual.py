"""Counterfactual rewards: fork a run at a decision, play both branches out, put the run back.

At a decision point where the policy had a real choice (some seed operation was legal), the
session is snapshotted in memory and played forward twice from the same state: branch A carries
out the decided command, branch B the baseline's (WAIT, or the heuristic's command); each then
trains ``horizon`` epochs under lifecycle-only control (fossilize on a passed G4, cull on a failed
gate, never germinate: ``ScheduledGrowthPolicy`` with an empty schedule), so the decision at the
fork is the only difference between them. The data order depends only on (seed, epoch) and the
snapshot restores the RNG, so both branches see the same batches and the same dropout draws:
the difference of their validation accuracies is the decision's effect, not sampling noise of
the data order. After the branches the session is returned to the snapshot bit for bit through
the run's one state object (``esper_core.run.state``; ``tests/studies/test_counterfactual.py`` checks
the main run's losses against a run without forks, and every field of the state after a fork),
and the outcome is stored with the decision for Simic (``CounterfactualOutcome``).

Branches never commit: nothing reaches the checkpoints, the registry or the telemetry sinks.
A branch whose training halts (``TrainingHalted``) abandons the fork; the run goes on.

Cost: at most ``max_forks`` forks per episode, each ``2 * horizon`` extra epochs (``horizon``
when both branches would carry out the same command: they are identical, so one is played).
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation
from esper_core.run.session import Run
from esper_core.simic.records import CounterfactualOutcome, DecisionRecord
from esper_core.tamiyo.actions import has_choice, legal_masks
from esper_core.tamiyo.baselines import RandomGerminationPolicy, ScheduledGrowthPolicy, decision_seed
from esper_core.tamiyo.config import RandomPolicyConfig
from esper_core.tamiyo.risk import RiskContext
from esper_core.tolaria.loop import count_parameters
from esper_core.tolaria.safety import TrainingHalted

log = logging.getLogger(__name__)

BASELINES = ("wait", "heuristic")
COUNTERFACTUAL_ISSUER = "counterfactual"
# Command fields that decide what a branch does; equal fields give identical branches.
_EFFECT_FIELDS = ("command_type", "seed_operation", "slot_id", "blueprint_id", "blend_schedule", "blend_epochs")


@dataclass(kw_only=True, slots=True)
class CounterfactualConfig:
    """Where and how far runs are forked to measure their decisions.

    Attributes:
        horizon: Epochs each branch trains after the fork (cut to the epochs the run has left).
            None (the default): long enough for a seed germinated at the fork to reach G4's
            verdict, ``min_training_epochs + blend_epochs + probation_epochs`` (see
            ``lifecycle_horizon``). A shorter horizon scores a seed before it has blended in:
            while it trains in isolation the host's output does not change, and both branches
            score the same.
        max_forks: Decision points forked per episode, at most.
        fork_probability: Chance that a decision point with a choice is forked (drawn per run
            and epoch, so a rerun forks the same decisions); below 1 it spreads the forks over
            the run instead of spending them on the first choices.
        baseline: What branch B does at the fork: ``wait``, or ``heuristic`` (its command after
            the risk engine, as the decided command had).
        explore_on_wait: When the decision and the baseline would do the same thing (a WAIT
            against a WAIT baseline, typically), branch B germinates instead: a fitting blueprint
            into a dormant slot, drawn uniformly as the random arm draws (after the risk engine).
            Without it such a fork scores a decision against itself (reward exactly 0), and a
            policy that imitated a mostly waiting heuristic learns nothing from its forks.
    """

    horizon: int | None = None
    max_forks: int = 2
    fork_probability: float = 0.5
    baseline: Literal["wait", "heuristic"] = "wait"
    explore_on_wait: bool = True

    def __post_init__(self) -> None:
        if self.horizon is not None and self.horizon < 1:
            raise ValueError(f"horizon must be >= 1 epoch, got {self.horizon}: use e.g. 3 (a seed must blend in)")
        if self.max_forks < 1:
            raise ValueError(
                f"max_forks must be >= 1, got {self.max_forks}: to train without forks use TrainingPlan(reward='delta')"
            )
        if not 0.0 < self.fork_probability <= 1.0:
            raise ValueError(
                f"fork_probability must lie in (0, 1], got {self.fork_probability}: use 1.0 to fork every choice"
            )
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")


class CounterfactualForks:
    """One episode's forks: decides which decisions to fork and forks them.

    Args:
        config: Horizon, budget and baseline.
        run_id: The episode's run (seeds the draw of which decisions are forked).
    """

    def __init__(self, config: CounterfactualConfig, *, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self.forks = 0

    def should_fork(self, session: Run, command: AdaptationCommand) -> bool:
        """Whether to fork at ``command``: within budget, with epochs left, a recorded decision
        of Tamiyo's, a real choice (a seed operation was legal), and the per-decision draw."""
        record = session.control.pending_decision(command)
        if self.forks >= self.config.max_forks or record is None or _epochs_left(session) < 1:
            return False
        if not has_choice(legal_masks(record.state.current, record.state.candidates)):
            return False
        draw = random.Random(decision_seed(self.run_id, command.epoch, COUNTERFACTUAL_ISSUER)).random()
        return draw < self.config.fork_probability

    def maybe_fork(self, session: Run, command: AdaptationCommand) -> CounterfactualOutcome | None:
        """Fork at ``command`` if ``should_fork`` says so, and attach the outcome to its decision.

        Call after ``decide`` and before ``apply``; the session is left exactly as it was.

        Returns:
            The outcome, or None when the decision was not forked (or a branch halted).
        """
        if not self.should_fork(session, command):
            return None
        self.forks += 1
        record = session.control.pending_decision(command)
        assert record is not None  # should_fork checked it
        outcome = fork(session, command, record=record, config=self.config)
        if outcome is not None:
            session.control.attach_counterfactual(command, outcome)
        return outcome


def fork(
    session: Run, command: AdaptationCommand, *, record: DecisionRecord, config: CounterfactualConfig
) -> CounterfactualOutcome | None:
    """Play ``command`` and the baseline's command out from the session's current state.

    Args:
        session: A session between ``decide`` and ``apply``; returned to exactly this state.
        command: The decided command (branch A).
        record: Its pending decision (what Tamiyo saw).
        config: Horizon and baseline.

    Returns:
        Both branches' measurements, or None when a branch halted.
    """
    start = time.perf_counter()
    baseline = _baseline_command(session, record, config.baseline)
    if config.explore_on_wait and _same_effect(command, baseline):
        # The random arm's draw with probability 1, under the recipe's lifecycle rules (which act
        # first: a seed due a fossilize or a cull gets it, and then both branches agree again).
        alternative = RandomGerminationPolicy(RandomPolicyConfig(germinate_prob=1.0), session.tamiyo.heuristic)
        baseline = _risk_reviewed(session, record, alternative.decide)
    horizon = min(config.horizon or lifecycle_horizon(session, command, baseline), _epochs_left(session))
    snapshot = _Snapshot.take(session)
    try:
        a = _branch(session, command, horizon)
        if _same_effect(command, baseline):
            b = a  # the same command from the same state: the branch would repeat bit for bit
        else:
            snapshot.put_back(session)
            b = _branch(session, baseline, horizon)
    except TrainingHalted as e:
        log.warning("counterfactual fork of %s at epoch %d abandoned: %s", session.run_id, command.epoch, e)
        return None
    finally:
        snapshot.put_back(session)
    return CounterfactualOutcome(
        baseline=config.baseline,
        baseline_action=baseline.action,
        horizon=horizon,
        val_accuracy=a.val_accuracy,
        baseline_val_accuracy=b.val_accuracy,
        val_loss=a.val_loss,
        baseline_val_loss=b.val_loss,
        params=a.params,
        baseline_params=b.params,
        host_params=record.state.current.host_params,
        fork_ms=(time.perf_counter() - start) * 1e3,
        classifies=record.state.current.classifies,
    )


def lifecycle_horizon(session: Run, *commands: AdaptationCommand) -> int:
    """Epochs from a germination to G4's verdict on it: isolation, the blend, probation.

    The blend is the longest any of ``commands`` germinates with (the heuristic's when none
    germinates), so both branches of a fork are scored after the same number of epochs.
    """
    blends = [c.blend_epochs for c in commands if c.seed_operation is SeedOperation.GERMINATE]
    blend = max(blends, default=session.tamiyo.heuristic.config.blend_epochs)
    kasmina = session.config.kasmina
    return kasmina.min_training_epochs + blend + kasmina.probation_epochs


@dataclass(frozen=True, kw_only=True, slots=True)
class _Branch:
    val_accuracy: float
    val_loss: float
    params: int


def _branch(session: Run, command: AdaptationCommand, horizon: int) -> _Branch:
    """Apply ``command``, then train ``horizon`` epochs with lifecycle-only decisions between them."""
    lifecycle = ScheduledGrowthPolicy((), session.tamiyo.heuristic)
    session.apply(command)
    packet = None
    for step in range(horizon):
        packet = session.train_epoch()
        if step + 1 < horizon:
            session.apply(lifecycle.decide(session.history, session.control.candidates(), run_id=session.run_id))
    assert packet is not None  # horizon >= 1
    return _Branch(
        val_accuracy=packet.val_accuracy, val_loss=packet.val_loss, params=count_parameters(session.trainer.model)
    )


def _baseline_command(session: Run, record: DecisionRecord, baseline: str) -> AdaptationCommand:
    current = record.state.current
    if baseline == "wait":
        return AdaptationCommand(
            run_id=session.run_id,
            epoch=current.epoch,
            command_type=CommandType.WAIT,
            issued_by=COUNTERFACTUAL_ISSUER,
            reason="wait: counterfactual baseline",
        )
    return _risk_reviewed(
        session, record, functools.partial(session.tamiyo.heuristic.decide, total_epochs=session.config.epochs)
    )


def _risk_reviewed(session: Run, record: DecisionRecord, decide: Callable[..., AdaptationCommand]) -> AdaptationCommand:
    """``decide``'s command at the decision's state, after the risk engine (as the decided one was)."""
    history, candidates = tuple(session.history), tuple(record.state.candidates)
    proposal = decide(history, candidates, run_id=session.run_id)
    context = RiskContext(
        history=history,
        candidates=candidates,
        reports=tuple(session.reports),
        predicted_risk=None,
        total_epochs=session.config.epochs,
    )
    return session.tamiyo.risk.review(proposal, context).command


def _same_effect(a: AdaptationCommand, b: AdaptationCommand) -> bool:
    return all(getattr(a, name) == getattr(b, name) for name in _EFFECT_FIELDS)


def _epochs_left(session: Run) -> int:
    return session.config.epochs - session.epoch


class _Snapshot:
    """Everything a branch can change in a session, copied in memory: the run's state with its
    live extras (``RunState.state_dict(in_memory=True)``: the record, the step's unsent telemetry
    and reports, pending decisions, the rails' counters, the seed manager's events), deep-copied
    so that no tensor or list is shared with the live run, and copied again at each put-back
    because the run trains on what it loads."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    @classmethod
    def take(cls, session: Run) -> _Snapshot:
        return cls(copy.deepcopy(session.state.state_dict(in_memory=True)))

    def put_back(self, session: Run) -> None:
        session.state.load_state_dict(copy.deepcopy(self.state))
