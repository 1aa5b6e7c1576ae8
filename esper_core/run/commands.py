"""Carrying out one of Tamiyo's commands on a live run (``RunSession.apply`` wraps it with the
safety rails, the rejection path and the step's telemetry).

A germination takes one of two paths: a branch blueprint's kernel is fetched from Urza and loaded
into its slot; a width-menu entry is built by Kasmina from the host itself and initialised from
the host's own signals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from esper_core.contracts import AdaptationCommand, BlendSchedule, CommandType, GateVerdict, MetricPoint, SeedOperation
from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.width import width_units
from esper_core.kasmina.loader import LoadedKernel, load_for_slot
from esper_core.kasmina.width import WidthSlot, width_batches
from esper_core.tolaria.modes import eval_mode

if TYPE_CHECKING:
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.run.session import RunSession
    from esper_core.tolaria.loop import Trainer
    from esper_core.tolaria.slotgrads import LossFn


class SeedCommands:
    """Mixed into ``RunSession``: what each command does to the trainer and the seed manager."""

    def _apply(self: RunSession, command: AdaptationCommand, metrics: list[MetricPoint]) -> None:
        op = command.seed_operation
        # WAIT and PAUSE change nothing here: both mean "no adaptation this epoch".
        if command.command_type is CommandType.OPTIMIZER:
            for group in self.trainer.optimizer.param_groups:
                group["lr"] *= command.lr_scale
        elif op is SeedOperation.GERMINATE:
            assert command.slot_id is not None and command.blueprint_id is not None
            slot = self.manager.slots.get(command.slot_id)
            if slot is None:
                raise ValueError(f"unknown slot {command.slot_id!r}; slots: {sorted(self.manager.slots)}")
            if isinstance(slot, WidthSlot):
                self._germinate_width(command, slot)
                return
            kernel = self._fetch_kernel(command.blueprint_id, slot.profile)
            metrics.append(
                MetricPoint(
                    name="kasmina.kernel.load_ms", value=kernel.load_ms, unit="ms", labels={"slot": command.slot_id}
                )
            )
            verdict = self.manager.germinate(
                command.slot_id,
                kernel,
                params=dict(command.parameters),
                blend_schedule=command.blend_schedule,
                blend_epochs=command.blend_epochs,
                lr_scale=command.lr_scale,
            )
            if not verdict.passed:
                raise ValueError(f"G0 refused {command.blueprint_id} in {command.slot_id}: {verdict.reason}")
        elif op is SeedOperation.ADVANCE:
            self.manager.advance(command.slot_id or "")
        elif op is SeedOperation.FOSSILIZE:
            self.manager.fossilize(command.slot_id or "")
        elif op is SeedOperation.CULL:
            self.manager.cull(command.slot_id or "", reason=command.reason)

    def _germinate_width(self: RunSession, command: AdaptationCommand, slot: WidthSlot) -> None:
        assert command.blueprint_id is not None
        verdict = germinate_width(
            self.trainer,
            slot,
            command.blueprint_id,
            config=self.config.kasmina,
            loss=self.config.loss,
            blend_schedule=command.blend_schedule,
            blend_epochs=command.blend_epochs,
            lr_scale=command.lr_scale,
        )
        if not verdict.passed:
            raise ValueError(f"G0 refused {command.blueprint_id} in {slot.slot_id}: {verdict.reason}")

    def _fetch_kernel(self: RunSession, blueprint_id: str, profile: ShapeProfile) -> LoadedKernel:
        # Tier policy, newest active artifact, guards against the slot before any bytes load,
        # SHA-256 on read; the seed manager pre-warms once it is attached.
        return load_for_slot(
            self.urza,
            blueprint_id,
            profile,
            catalog=self.catalog,
            device=self.device,
            approved=self.config.approved_blueprints,
            params=self.catalog.resolve_params(blueprint_id),
            prewarm=False,
        )


def germinate_width(
    trainer: Trainer,
    slot: WidthSlot,
    blueprint_id: str,
    *,
    config: KasminaConfig,
    loss: LossFn,
    blend_schedule: BlendSchedule,
    blend_epochs: int,
    lr_scale: float,
) -> GateVerdict:
    """New units for a width slot's layer (``blueprint_id`` from the width menu), initialised from
    the host's signals on the first training batches (in eval mode: a BatchNorm's running
    statistics are read, not updated, and dropout draws nothing, so a resumed run germinates the
    same units). Returns G0's verdict; on failure the slot stays DORMANT."""
    with eval_mode(slot.host):
        batches = width_batches(slot.host, slot.site, trainer.first_batches(config.seed_init_batches), loss)
    return trainer.manager.germinate_width(
        slot.slot_id,
        units=width_units(blueprint_id, slot.site.width),
        init=config.width_init,
        batches=batches,
        blend_schedule=blend_schedule,
        blend_epochs=blend_epochs,
        lr_scale=lr_scale,
    )
