"""Transparent rule-based policy: what Tamiyo does until its GNN has been trained by Simic.

Rules, first match wins (each command's ``reason`` quotes the numbers it used):

1. A PROBATIONARY seed whose last gate is a passed G4 (system impact) is fossilized.
2. An active, not yet fossilized seed whose last gate failed is culled.
3. With ``max_active_seeds`` seeds in flight (GERMINATED .. PROBATIONARY), wait; before
   ``grow_from`` of the run, wait.
4. With a DORMANT slot and either a val-loss plateau or the probe epoch reached before any seed
   has ever left DORMANT, germinate: the first of ``prefer`` that fits the slot, else the
   lowest-risk (then smallest) SAFE blueprint with an artifact for the slot's shape profile, in
   the dormant slot whose host layer has the largest gradient norm among the slots that have
   such a blueprint. No fitting blueprint: wait.
5. Otherwise wait.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from esper_core.contracts import (
    AdaptationCommand,
    BlendSchedule,
    BlueprintTier,
    CommandType,
    GateId,
    SeedOperation,
    SeedStage,
    SeedState,
    SystemStatePacket,
)
from esper_core.tamiyo.candidates import BlueprintCandidate

ISSUED_BY = "heuristic"

# Builds a heuristic command for the current run and epoch: make(command_type, reason, **fields).
_Make = Callable[..., AdaptationCommand]

IN_FLIGHT_STAGES: frozenset[SeedStage] = frozenset(
    {SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.PROBATIONARY}
)


DEFAULTS_SEARCH_ZOO_SEED = 0
"""The zoo seed whose members ``HeuristicConfig``'s defaults were searched on (``esper bench
rules``): an evaluation of the default heuristic on zoo members draws them under another one."""


@dataclass(kw_only=True, slots=True)
class HeuristicConfig:
    """Thresholds of the rule-based policy.

    The defaults are the best single fixed rule over the host zoo (``esper bench rules``,
    ``baselines/zoo/rules``): germinate after the first epoch, and widen a layer by doubling it.
    Chosen on the zoo's selection seeds among 18 rules, it beat the earlier defaults (a probe at
    epoch 1, the lowest-risk 25 % widening) on hosts and seeds the search never saw, by 0.4-2.1
    accuracy points on every classifier family (resolved on five of six); it still trails the static network of its own
    grown shape on four of them, and on the character GPT it cost 0.02 bits per character. It
    widens again on every plateau, so on long runs it grows far (the built-in 60-epoch width
    recipes keep the 25 % step: ``esper_core.run.recipes``).

    Attributes:
        plateau_window: Epochs over which the val-loss improvement is measured.
        plateau_rel_tol: A relative val-loss improvement below this over ``plateau_window``
            epochs is a plateau (0.01 = 1 %).
        probe_epoch: Germinate the first seed no later than this epoch even without a plateau,
            so short runs still explore; None disables the probe.
        max_active_seeds: Seeds allowed in flight (GERMINATED .. PROBATIONARY) at once.
        blend_epochs: Length of the alpha ramp written into germinate commands.
        blend_schedule: Shape of the alpha ramp written into germinate commands.
        prefer: Blueprint ids germinated first where they fit, in this order (``("width-100",)``
            doubles a width slot's layer where the lowest-risk choice would add 25 %); a slot
            none of them fits (a branch slot) gets the lowest-risk SAFE fit. Empty: always the
            lowest-risk fit.
        grow_from: Share of the run before which nothing is germinated, plateau or probe (epoch
            < ``ceil(grow_from * total_epochs)``): a one-epoch dip of the improvement early in
            a run is noise more often than a plateau, and a network grown early pays for its
            width over more epochs. The opening counterpart of ``RiskConfig.grow_until``, but the
            rule's alone (the risk engine's window binds every policy); 0 (default) does not limit
            it. Needs the run's length (``decide(total_epochs=...)``).
    """

    plateau_window: int = 2
    plateau_rel_tol: float = 0.01
    probe_epoch: int | None = 0
    max_active_seeds: int = 1
    blend_epochs: int = 2
    blend_schedule: BlendSchedule = BlendSchedule.LINEAR
    prefer: tuple[str, ...] = ("width-100",)
    grow_from: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.prefer, str):
            raise ValueError(f"prefer is a tuple of blueprint ids: write prefer=({self.prefer!r},)")
        self.prefer = tuple(self.prefer)
        if len(set(self.prefer)) != len(self.prefer):
            raise ValueError(f"prefer lists a blueprint twice: {self.prefer}; list each once")
        if self.plateau_window < 1:
            raise ValueError(f"plateau_window must be >= 1 epoch, got {self.plateau_window}")
        if not 0.0 <= self.plateau_rel_tol < 1.0:
            raise ValueError(
                f"plateau_rel_tol must lie in [0, 1), got {self.plateau_rel_tol}: it is a fraction, e.g. 0.01 for 1 %"
            )
        if self.probe_epoch is not None and self.probe_epoch < 0:
            raise ValueError(f"probe_epoch must be >= 0 or None (disabled), got {self.probe_epoch}")
        if not 0.0 <= self.grow_from < 1.0:
            raise ValueError(
                f"grow_from must lie in [0, 1), got {self.grow_from}: a share of the run's epochs, e.g. 0.3 to "
                "germinate nothing in its first 30 % (0 does not limit growth)"
            )
        if self.max_active_seeds < 1:
            raise ValueError(f"max_active_seeds must be >= 1, got {self.max_active_seeds}")
        if self.blend_epochs < 1:
            raise ValueError(f"blend_epochs must be >= 1, got {self.blend_epochs}")
        if not isinstance(self.blend_schedule, BlendSchedule):
            options = [s.value for s in BlendSchedule]
            if self.blend_schedule not in options:
                raise ValueError(f"blend_schedule must be one of {options}, got {self.blend_schedule!r}")
            self.blend_schedule = BlendSchedule(self.blend_schedule)


class HeuristicPolicy:
    """Rule-based policy with one ``decide`` call per epoch.

    Args:
        config: Thresholds; defaults to ``HeuristicConfig()``.
    """

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config if config is not None else HeuristicConfig()

    def decide(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        *,
        run_id: str,
        total_epochs: int | None = None,
    ) -> AdaptationCommand:
        """Choose this epoch's command.

        Args:
            history: The run's packets, oldest first; ``history[-1]`` is the current epoch.
            candidates: Blueprints with active artifacts that may be germinated.
            run_id: Run the command belongs to.
            total_epochs: Length of the run; ``grow_from`` needs it.

        Returns:
            A command with ``issued_by="heuristic"`` and a reason quoting the numbers used.

        Raises:
            ValueError: If ``history`` is empty, or ``grow_from`` is set and ``total_epochs`` is not.
        """
        if not history:
            raise ValueError("history is empty: pass at least the current epoch's packet")
        if self.config.grow_from > 0 and total_epochs is None:
            raise ValueError(
                f"grow_from={self.config.grow_from:g} is a share of the run: pass total_epochs to decide, "
                "or set grow_from=0"
            )
        make: _Make = functools.partial(_make_command, run_id=run_id, epoch=history[-1].epoch)
        seeds = history[-1].seeds
        command = self.lifecycle_command(seeds, make) or self._wait_while_in_flight(seeds, make)
        if command is not None:
            return command
        opens = math.ceil(self.config.grow_from * total_epochs) if total_epochs is not None else 0
        if history[-1].epoch < opens:
            return make(
                CommandType.WAIT,
                f"wait: epoch {history[-1].epoch} < {opens}: growth opens at grow_from={self.config.grow_from:g} "
                f"of the run's {total_epochs} epochs",
            )
        return self._germinate_or_wait(history, candidates, make)

    def lifecycle_command(self, seeds: Sequence[SeedState], make: _Make) -> AdaptationCommand | None:
        """Rules 1 and 2 alone (fossilize on a passed G4, cull on a failed gate), or None.

        Args:
            seeds: The current epoch's seed states.
            make: ``make(command_type, reason, **fields)`` builds a command for this run and epoch.

        Returns:
            The lifecycle command, or None when neither rule applies.
        """
        return _fossilize_on_passed_g4(seeds, make) or _cull_on_failed_gate(seeds, make)

    def _wait_while_in_flight(self, seeds: Sequence[SeedState], make: _Make) -> AdaptationCommand | None:
        """Rule 3: wait while ``max_active_seeds`` seeds are in flight."""
        in_flight = [s for s in seeds if s.stage in IN_FLIGHT_STAGES]
        if len(in_flight) < self.config.max_active_seeds:
            return None
        listed = ", ".join(f"{s.slot_id} {s.stage.value} for {s.epochs_in_stage} epoch(s)" for s in in_flight)
        return make(
            CommandType.WAIT,
            f"wait: {len(in_flight)} seed(s) in flight ({listed}) >= max_active_seeds={self.config.max_active_seeds}",
        )

    def _germinate_or_wait(
        self,
        history: Sequence[SystemStatePacket],
        candidates: Sequence[BlueprintCandidate],
        make: _Make,
    ) -> AdaptationCommand:
        """Rules 4 and 5: germinate on a plateau or at the probe epoch, else wait."""
        current = history[-1]
        dormant = [s for s in current.seeds if s.stage is SeedStage.DORMANT]
        if not dormant:
            return make(CommandType.WAIT, "wait: no DORMANT slot to germinate")
        trigger = self._trigger(history)
        if trigger is None:
            return make(CommandType.WAIT, f"wait: {self._no_trigger_reason(history)}")
        fitting = [(s, c) for s in dormant if (c := _best_safe_fit(s, candidates, self.config.prefer)) is not None]
        if not fitting:
            profiles = sorted({s.shape_profile for s in dormant})
            return make(
                CommandType.WAIT,
                f"wait: {trigger}, but no SAFE blueprint among {len(candidates)} candidate(s) "
                f"has an artifact for the dormant slots' profiles {profiles}",
            )
        grad_norms = {layer.name: layer.grad_norm for layer in current.layers}
        # max() keeps the first of equal keys, so ties go to the earlier slot. A slot whose
        # host layer is not reported counts as grad_norm 0.
        slot, best = max(fitting, key=lambda sc: grad_norms.get(sc[0].layer, 0.0))
        desc = best.descriptor
        return make(
            CommandType.SEED,
            f"germinate: {trigger}; slot {slot.slot_id} on layer {slot.layer} has the largest "
            f"host grad_norm {grad_norms.get(slot.layer, 0.0):.4g} among {len(fitting)} "
            f"germinable dormant slot(s); {desc.blueprint_id} is the "
            f"{'first preferred' if desc.blueprint_id in self.config.prefer else 'lowest-risk'} SAFE fit for "
            f"profile {slot.shape_profile!r} (risk {desc.risk:.3g}, "
            f"p95 {best.latency_p95_ms:.3g} ms)",
            seed_operation=SeedOperation.GERMINATE,
            slot_id=slot.slot_id,
            blueprint_id=desc.blueprint_id,
            blend_epochs=self.config.blend_epochs,
            blend_schedule=self.config.blend_schedule,
        )

    def _trigger(self, history: Sequence[SystemStatePacket]) -> str | None:
        """Why a germination is due now (plateau or probe), or None."""
        plateau = _relative_improvement(history, self.config.plateau_window)
        if plateau is not None and plateau[0] < self.config.plateau_rel_tol:
            improvement, before, after = plateau
            return (
                f"val_loss plateau: relative improvement {improvement:.2%} over the last "
                f"{self.config.plateau_window} epoch(s) ({before:.4g} -> {after:.4g}) < "
                f"plateau_rel_tol {self.config.plateau_rel_tol:.2%}"
            )
        probe = self.config.probe_epoch
        epoch = history[-1].epoch
        if probe is not None and epoch >= probe and not _ever_germinated(history):
            return f"probe: epoch {epoch} >= probe_epoch {probe} and no seed has left DORMANT yet"
        return None

    def _no_trigger_reason(self, history: Sequence[SystemStatePacket]) -> str:
        window = self.config.plateau_window
        plateau = _relative_improvement(history, window)
        if plateau is None:
            parts = [f"{len(history)} epoch(s) of history, a plateau needs {window + 1}"]
        else:
            improvement, before, after = plateau
            parts = [
                f"val_loss improved {improvement:.2%} over the last {window} epoch(s) "
                f"({before:.4g} -> {after:.4g}) >= plateau_rel_tol "
                f"{self.config.plateau_rel_tol:.2%}"
            ]
        probe = self.config.probe_epoch
        if probe is None:
            parts.append("probe disabled")
        elif _ever_germinated(history):
            parts.append("probe not needed: a seed has already germinated")
        else:
            parts.append(f"epoch {history[-1].epoch} < probe_epoch {probe}")
        return "; ".join(parts)


def _make_command(
    command_type: CommandType,
    reason: str,
    *,
    run_id: str,
    epoch: int,
    **fields: Any,  # noqa: ANN401  (forwarded verbatim; AdaptationCommand validates them)
) -> AdaptationCommand:
    return AdaptationCommand(
        run_id=run_id,
        epoch=epoch,
        command_type=command_type,
        issued_by=ISSUED_BY,
        reason=reason,
        **fields,
    )


def _fossilize_on_passed_g4(seeds: Sequence[SeedState], make: _Make) -> AdaptationCommand | None:
    """Rule 1: fossilize a PROBATIONARY seed whose last gate is a passed G4."""
    for seed in seeds:
        gate = seed.last_gate
        if (
            seed.stage is SeedStage.PROBATIONARY
            and gate is not None
            and gate.gate is GateId.G4_SYSTEM_IMPACT
            and gate.passed
        ):
            return make(
                CommandType.SEED,
                f"fossilize: slot {seed.slot_id} passed {gate.gate.value}{_measured(gate.measured)}",
                seed_operation=SeedOperation.FOSSILIZE,
                slot_id=seed.slot_id,
            )
    return None


def _cull_on_failed_gate(seeds: Sequence[SeedState], make: _Make) -> AdaptationCommand | None:
    """Rule 2: cull an in-flight (active, not fossilized) seed whose last gate failed."""
    for seed in seeds:
        gate = seed.last_gate
        if seed.stage in IN_FLIGHT_STAGES and gate is not None and not gate.passed:
            return make(
                CommandType.SEED,
                f"cull: slot {seed.slot_id} ({seed.stage.value}) failed {gate.gate.value}: "
                f"{gate.reason}{_measured(gate.measured)}",
                seed_operation=SeedOperation.CULL,
                slot_id=seed.slot_id,
            )
    return None


def _relative_improvement(history: Sequence[SystemStatePacket], window: int) -> tuple[float, float, float] | None:
    """(relative improvement, val_loss ``window`` epochs ago, val_loss now), or None if short."""
    if len(history) <= window:
        return None
    before, after = history[-1 - window].val_loss, history[-1].val_loss
    # Guard the division: a val loss of exactly 0 cannot improve, which reads as a plateau.
    improvement = (before - after) / max(abs(before), 1e-12)
    return improvement, before, after


def _ever_germinated(history: Sequence[SystemStatePacket]) -> bool:
    # A kind whose change is kept at once (a doubled stream) leaves its slot DORMANT within the
    # command; its passed G0 is the trace it leaves in the packets.
    return any(
        s.stage is not SeedStage.DORMANT
        or (s.last_gate is not None and s.last_gate.gate is GateId.G0_SANITY and s.last_gate.passed)
        for packet in history
        for s in packet.seeds
    )


def _best_safe_fit(
    slot: SeedState, candidates: Sequence[BlueprintCandidate], prefer: Sequence[str] = ()
) -> BlueprintCandidate | None:
    """The SAFE candidate fitting ``slot`` first in ``prefer``, else with the lowest risk, then
    fewest parameters, then id.

    Never by measured latency: a kernel's p95 varies with the machine's load, and a choice that
    depends on it would make two runs of the same seed grow different networks.
    """
    fits = [c for c in candidates if c.descriptor.tier is BlueprintTier.SAFE and c.fits(slot.shape_profile)]
    preferred = [c for c in fits if c.blueprint_id in prefer]
    if preferred:
        return min(preferred, key=lambda c: prefer.index(c.blueprint_id))
    return min(fits, key=lambda c: (c.descriptor.risk, c.param_cost, c.blueprint_id), default=None)


def _measured(measured: dict[str, float]) -> str:
    if not measured:
        return ""
    return " (" + ", ".join(f"{k}={v:.4g}" for k, v in sorted(measured.items())) + ")"
