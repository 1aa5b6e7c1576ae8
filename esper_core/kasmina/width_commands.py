"""The seed manager's commands for width seeds: germinate new units of a layer, merge them.

A width seed goes through the same lifecycle as a branch seed (gates, isolation, blending, cull,
embargo: ``SeedManager``); only two steps differ. Germination builds the seed from the host's own
layers (no kernel from the registry) and initialises it from the host's signals; fossilisation
merges it into the host, which grows in place, and frees the slot to widen the layer again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from esper_core.contracts import BlendSchedule, GateVerdict, SeedStage, TelemetryLevel
from esper_core.kasmina import gates
from esper_core.kasmina.lifecycle import check_transition
from esper_core.kasmina.records import WIDTH_BLUEPRINT, SeedRecord
from esper_core.kasmina.width import WIDTH_INITS, WidthBatch, WidthSeed, WidthSlot, init_width_seed_, merge_width_seed

if TYPE_CHECKING:
    from esper_core.kasmina.manager import SeedManager

S = SeedStage


class WidthCommands:
    """Mixed into ``SeedManager``: the width-seed half of its commands."""

    def germinate_width(
        self: SeedManager,
        slot_id: str,
        *,
        units: int,
        init: str,
        batches: list[WidthBatch],
        blend_schedule: BlendSchedule,
        blend_epochs: int,
        lr_scale: float,
    ) -> GateVerdict:
        """Add ``units`` new units to a width slot's layer, as a side module, if G0 passes.

        Args:
            batches: The host's signals at the slot (``width_batches``) for a data-aware init.

        Returns:
            The G0 verdict; on failure the slot stays DORMANT.
        """
        slot = self._slot(slot_id)
        if not isinstance(slot, WidthSlot):
            raise ValueError(
                f"slot {slot_id} takes branch seeds; widen a layer through its width slot ('<layer>+width')"
            )
        check_transition(slot_id, slot.stage, S.GERMINATED)
        site = slot.site
        adjacent = [
            sid
            for sid, other in self.slots.items()
            if isinstance(other, WidthSlot)
            and other.seed is not None
            and (other.site.layer == site.consumer or other.site.consumer == site.layer)
        ]
        verdict = gates.g0_width(
            layer=slot.site.layer,
            width=slot.site.width,
            units=units,
            init=init,
            inits=WIDTH_INITS,
            max_factor=self.config.width_max_factor,
            adjacent_in_flight=adjacent,
        )
        if verdict.passed:
            try:
                seed = WidthSeed(slot.site, slot.host, units=units)
                metrics = init_width_seed_(seed, init, batches)
            except ValueError as e:  # a GroupNorm's group size, an activation GradMax cannot keep
                verdict = GateVerdict(gate=verdict.gate, passed=False, reason=str(e))
        self._gate(slot_id, verdict)
        if not verdict.passed:
            return verdict
        slot.seed = seed
        slot.alpha = 0.0
        self._seeds[slot_id] = SeedRecord(
            blueprint_id=WIDTH_BLUEPRINT,
            params={"units": float(units)},
            artifact=None,
            lr_scale=lr_scale,
            schedule=blend_schedule,
            blend_epochs=blend_epochs,
            metrics=dict(metrics),
        )
        self._set_stage(slot_id, S.GERMINATED)
        self.param_groups.add(slot_id, self.seed_parameters(slot_id), lr_scale=lr_scale)
        return verdict

    def _merge_width(self: SeedManager, slot: WidthSlot) -> None:
        """Fold a width seed into its host (the layers grow in place) and free the slot."""
        seed = slot.seed
        assert isinstance(seed, WidthSeed)
        sid, before = slot.slot_id, slot.site.width
        # The merge reads the seed's optimizer state before its group goes.
        slot.site = merge_width_seed(slot.host, seed, self.param_groups.optimizer)
        self.param_groups.remove(sid)
        slot.seed = None
        slot.alpha = 0.0
        self._set_stage(sid, S.FOSSILIZED)
        self._seeds.pop(sid)
        self._set_stage(sid, S.DORMANT, reason=f"merged: {slot.site.layer} {before} -> {slot.site.width} units")
        self._event(
            "kasmina.width.merged",
            TelemetryLevel.INFO,
            f"{slot.site.layer} widened {before} -> {slot.site.width}",
            slot_id=sid,
            layer=slot.site.layer,
            width=float(slot.site.width),
        )
