"""Baseline policies the learned one is measured against: random, periodic and scheduled
germination, no growth.

All keep the heuristic's lifecycle rules (fossilize a seed that passed G4, cull one that failed
a gate) so that what differs is only *when, where and what* to germinate.
"""

from __future__ import annotations

import abc
import functools
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation, SeedStage, SeedState, SystemStatePacket
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.config import PeriodicPolicyConfig, RandomPolicyConfig, ScheduledGermination
from esper_core.tamiyo.heuristic import HeuristicPolicy, _best_safe_fit, _make_command

RANDOM_ISSUER = "random"
PERIODIC_ISSUER = "periodic"
SCHEDULED_ISSUER = "scheduled"
NONE_ISSUER = "none"


def decision_seed(run_id: str, epoch: int, salt: str = "") -> int:
    """A seed that depends only on run and epoch, so a retried decision draws the same numbers."""
    return zlib.crc32(f"{salt}:{run_id}:{epoch}".encode())


def _lifecycle_first(
    lifecycle: HeuristicPolicy, history: Sequence[SystemStatePacket], run_id: str, issuer: str
) -> tuple[SystemStatePacket, Callable[..., AdaptationCommand], AdaptationCommand | None]:
    """The current packet, a command maker for this epoch, and the lifecycle rules' command
    (fossilise on G4, cull on failure) if one applies: the baselines keep those rules and only
    decide germination themselves.

    Raises:
        ValueError: If ``history`` is empty.
    """
    if not history:
        raise ValueError("history is empty: pass at least the current epoch's packet")
    current = history[-1]
    plain = functools.partial(_make_command, run_id=run_id, epoch=current.epoch)

    def make(command_type: CommandType, reason: str, **fields: Any) -> AdaptationCommand:  # noqa: ANN401
        return plain(command_type, reason, **fields).model_copy(update={"issued_by": issuer})

    return current, make, lifecycle.lifecycle_command(current.seeds, make)


def _germinate(
    make: Callable[..., AdaptationCommand],
    reason: str,
    slot: SeedState,
    candidate: BlueprintCandidate,
    lifecycle: HeuristicPolicy,
) -> AdaptationCommand:
    """A germinate command for ``candidate`` into ``slot``, on the heuristic's blend ramp."""
    return make(
        CommandType.SEED,
        reason,
        seed_operation=SeedOperation.GERMINATE,
        slot_id=slot.slot_id,
        blueprint_id=candidate.blueprint_id,
        blend_epochs=lifecycle.config.blend_epochs,
        blend_schedule=lifecycle.config.blend_schedule,
    )


class _GerminationBaseline(abc.ABC):
    """A baseline that keeps the heuristic's lifecycle rules and decides germination itself.

    ``decide`` applies the lifecycle rules first (they take precedence); otherwise the subclass's
    ``_germinate_or_wait`` issues this epoch's germination or WAIT, with commands issued as
    ``issuer``.
    """

    issuer: str

    def __init__(self, lifecycle: HeuristicPolicy) -> None:
        self.lifecycle = lifecycle

    def decide(
        self, history: Sequence[SystemStatePacket], candidates: Sequence[BlueprintCandidate], *, run_id: str
    ) -> AdaptationCommand:
        """This epoch's command (deterministic per run and epoch).

        Raises:
            ValueError: If ``history`` is empty.
        """
        current, make, lifecycle = _lifecycle_first(self.lifecycle, history, run_id, self.issuer)
        if lifecycle is not None:
            return lifecycle
        return self._germinate_or_wait(current, candidates, make, run_id)

    @abc.abstractmethod
    def _germinate_or_wait(
        self,
        current: SystemStatePacket,
        candidates: Sequence[BlueprintCandidate],
        make: Callable[..., AdaptationCommand],
        run_id: str,
    ) -> AdaptationCommand:
        """The germinate command this epoch calls for, or a WAIT saying why not."""


class RandomGerminationPolicy(_GerminationBaseline):
    """Germinates a random fitting blueprint into a random dormant slot with probability p.

    Args:
        config: Germination probability.
        lifecycle: Supplies the fossilize-on-G4 and cull-on-failure rules.
    """

    issuer = RANDOM_ISSUER

    def __init__(self, config: RandomPolicyConfig, lifecycle: HeuristicPolicy) -> None:
        super().__init__(lifecycle)
        self.config = config

    def _germinate_or_wait(
        self,
        current: SystemStatePacket,
        candidates: Sequence[BlueprintCandidate],
        make: Callable[..., AdaptationCommand],
        run_id: str,
    ) -> AdaptationCommand:
        options = [
            (s, c) for s in current.seeds if s.stage is SeedStage.DORMANT for c in candidates if c.fits(s.shape_profile)
        ]
        rng = random.Random(decision_seed(run_id, current.epoch, RANDOM_ISSUER))
        draw = rng.random()
        if not options or draw >= self.config.germinate_prob:
            why = "no germinable dormant slot" if not options else f"draw {draw:.3f} >= p {self.config.germinate_prob}"
            return make(CommandType.WAIT, f"wait (random): {why}")
        slot, candidate = rng.choice(options)
        reason = (
            f"germinate (random): draw {draw:.3f} < p {self.config.germinate_prob}; "
            f"{candidate.blueprint_id} into {slot.slot_id}, one of {len(options)} (slot, blueprint) options"
        )
        return _germinate(make, reason, slot, candidate, self.lifecycle)


class PeriodicGrowthPolicy(_GerminationBaseline):
    """Germinates after every k-th epoch into the first DORMANT slot a SAFE blueprint fits.

    The schedule ignores the run's state on purpose: it is the "grow on a timer" rule a learned
    policy has to beat. The blueprint is the heuristic's choice for the slot (its first preferred
    SAFE fit, else the lowest-risk one), so the two differ in timing alone.

    Args:
        config: The period.
        lifecycle: Supplies the fossilize-on-G4 and cull-on-failure rules.
    """

    issuer = PERIODIC_ISSUER

    def __init__(self, config: PeriodicPolicyConfig, lifecycle: HeuristicPolicy) -> None:
        super().__init__(lifecycle)
        self.config = config

    def _germinate_or_wait(
        self,
        current: SystemStatePacket,
        candidates: Sequence[BlueprintCandidate],
        make: Callable[..., AdaptationCommand],
        run_id: str,
    ) -> AdaptationCommand:
        every = self.config.every
        if (current.epoch + 1) % every != 0:
            why = f"epoch {current.epoch} is not the last of a period of {every}"
            return make(CommandType.WAIT, f"wait (periodic): {why}")
        for slot in current.seeds:
            if slot.stage is not SeedStage.DORMANT:
                continue
            candidate = _best_safe_fit(slot, candidates, self.lifecycle.config.prefer)
            if candidate is None:
                continue
            reason = f"germinate (periodic, every {every} epochs): {candidate.blueprint_id} into {slot.slot_id}"
            return _germinate(make, reason, slot, candidate, self.lifecycle)
        return make(CommandType.WAIT, "wait (periodic): no DORMANT slot a SAFE blueprint fits")


class ScheduledGrowthPolicy(_GerminationBaseline):
    """Germinates exactly what a fixed schedule says, when it says it.

    The schedule is the "best fixed schedule in hindsight" a learned policy's headroom is
    measured against (``bench.headroom``). A germination is issued after its epoch if its slot is
    DORMANT then; otherwise it is skipped (the WAIT's reason says why), never postponed, so a
    schedule means the same thing in every run.

    Args:
        schedule: The germinations, at distinct epochs.
        lifecycle: Supplies the fossilize-on-G4 and cull-on-failure rules, which take precedence.
    """

    issuer = SCHEDULED_ISSUER

    def __init__(self, schedule: Sequence[ScheduledGermination], lifecycle: HeuristicPolicy) -> None:
        super().__init__(lifecycle)
        self.by_epoch = {g.epoch: g for g in schedule}

    def _germinate_or_wait(
        self,
        current: SystemStatePacket,
        candidates: Sequence[BlueprintCandidate],
        make: Callable[..., AdaptationCommand],
        run_id: str,
    ) -> AdaptationCommand:
        due = self.by_epoch.get(current.epoch)
        if due is None:
            return make(CommandType.WAIT, f"wait (scheduled): nothing scheduled after epoch {current.epoch}")
        slot = current.seed(due.slot)
        candidate = next((c for c in candidates if c.blueprint_id == due.blueprint), None)
        if slot.stage is not SeedStage.DORMANT:
            why = f"slot {due.slot} is {slot.stage.name}, not DORMANT"
        elif candidate is None:
            why = f"blueprint {due.blueprint} has no active kernel in the registry"
        elif not candidate.fits(slot.shape_profile):
            why = f"blueprint {due.blueprint} has no kernel for slot {due.slot}'s profile {slot.shape_profile}"
        else:
            reason = f"germinate (scheduled at epoch {due.epoch}): {due.blueprint} into {due.slot}"
            return _germinate(make, reason, slot, candidate, self.lifecycle)
        return make(CommandType.WAIT, f"wait (scheduled): skipped the germination at epoch {due.epoch}: {why}")


def no_growth(history: Sequence[SystemStatePacket], *, run_id: str) -> AdaptationCommand:
    """WAIT, always: the host trains alone."""
    if not history:
        raise ValueError("history is empty: pass at least the current epoch's packet")
    return AdaptationCommand(
        run_id=run_id,
        epoch=history[-1].epoch,
        command_type=CommandType.WAIT,
        issued_by=NONE_ISSUER,
        reason="wait: policy 'none' (no growth)",
    )
