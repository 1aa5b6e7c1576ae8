"""A run's actuation: carrying out one of Tamiyo's commands on the trainer and its seed manager
(``Run.apply`` wraps it with the safety rails, the rejection path and the step's telemetry).

A germination goes to Kasmina, whose slot's kind builds the seed: a branch blueprint's kernel is
fetched from Urza (through ``fetch``, only when the kind needs one); a width-menu entry is built
from the host itself and initialised from the host's own signals.
"""

from __future__ import annotations

from esper_core.contracts import AdaptationCommand, CommandType, MetricPoint, SeedOperation
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.kinds import KernelSource
from esper_core.kasmina.loader import LoadedKernel
from esper_core.tolaria.loop import Trainer


class Actuator:
    """Applies commands to a run's trainer and seed manager.

    Args:
        trainer: The run's trainer (its optimizer, and its seed manager).
        fetch: How a kernel reaches a slot (Urza, guards and SHA-256 checked).
    """

    def __init__(self, *, trainer: Trainer, fetch: KernelSource) -> None:
        self.trainer = trainer
        self.manager = trainer.manager
        self._fetch = fetch

    def carry_out(self, command: AdaptationCommand, metrics: list[MetricPoint]) -> None:
        """Apply ``command``; what it measured goes to ``metrics``.

        Raises:
            ValueError: the command cannot be applied (an unknown slot, a refused gate).
            LookupError, RegistryError: no kernel could be fetched.
        """
        op = command.seed_operation
        # WAIT and PAUSE change nothing here: both mean "no adaptation this epoch".
        if command.command_type is CommandType.OPTIMIZER:
            for group in self.trainer.optimizer.param_groups:
                group["lr"] *= command.lr_scale
        elif op is SeedOperation.GERMINATE:
            assert command.slot_id is not None and command.blueprint_id is not None
            slot_id = command.slot_id

            def fetch(blueprint_id: str, profile: ShapeProfile) -> LoadedKernel:
                kernel = self._fetch(blueprint_id, profile)
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
