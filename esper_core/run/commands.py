"""Carrying out one of Tamiyo's commands on a live run (``RunSession.apply`` wraps it with the
safety rails, the rejection path and the step's telemetry).

A germination goes to Kasmina, whose slot's kind builds the seed: a branch blueprint's kernel is
fetched from Urza (through ``fetch``, only when the kind needs one); a width-menu entry is built
from the host itself and initialised from the host's own signals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from esper_core.contracts import AdaptationCommand, CommandType, MetricPoint, SeedOperation
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.loader import LoadedKernel, load_for_slot

if TYPE_CHECKING:
    from esper_core.run.session import RunSession


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
            slot_id = command.slot_id

            def fetch(blueprint_id: str, profile: ShapeProfile) -> LoadedKernel:
                kernel = self._fetch_kernel(blueprint_id, profile)
                metrics.append(
                    MetricPoint(
                        name="kasmina.kernel.load_ms", value=kernel.load_ms, unit="ms", labels={"slot": slot_id}
                    )
                )
                return kernel

            verdict = self.manager.germinate(
                slot_id,
                command.blueprint_id,
                params=dict(command.parameters),
                blend_schedule=command.blend_schedule,
                blend_epochs=command.blend_epochs,
                lr_scale=command.lr_scale,
                kernels=fetch,
            )
            if not verdict.passed:
                raise ValueError(f"G0 refused {command.blueprint_id} in {slot_id}: {verdict.reason}")
        elif op is SeedOperation.ADVANCE:
            self.manager.advance(command.slot_id or "")
        elif op is SeedOperation.FOSSILIZE:
            self.manager.fossilize(command.slot_id or "")
        elif op is SeedOperation.CULL:
            self.manager.cull(command.slot_id or "", reason=command.reason)

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
