"""The width kind: seeds built from the host's own layers that merge into them when kept.

A width seed goes through the same lifecycle as a branch seed; three steps differ. Germination
builds it from the layer it widens (no kernel from the registry) and initialises it from the
host's signals at once, so an initialisation that cannot apply (a GroupNorm's group size, an
activation GradMax cannot keep) is G0's refusal. Keeping it merges it into the host, which grows in
place, and frees the slot to widen the layer again. And the slot owns the layer's width, which a
checkpoint records so that a restore reshapes the host before loading its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, GateVerdict, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.contracts.enums import SlotKind
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.width import WIDTH_MENU, width_descriptor, width_units
from esper_core.kasmina import gates
from esper_core.kasmina.kinds import Merge, Nursery, Sprout
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.records import SeedRecord
from esper_core.kasmina.width.init import WIDTH_INITS, check_width_init, init_width_seed_
from esper_core.kasmina.width.merge import merge_width_seed, resize_width
from esper_core.kasmina.width.seed import WidthSeed

if TYPE_CHECKING:
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.kasmina.slot import SeedSlot
    from esper_core.kasmina.width.slot import WidthSlot


class WidthKind:
    """New units of a host layer (``WidthSeed``), merged into it when kept."""

    name = "width"
    """Also the blueprint id a width seed reports: it is built from the host, not from Karn."""
    slot_kind = SlotKind.WIDTH
    compiled = False
    merges = True
    isolated_training = True
    immediate = False
    menu = tuple(WIDTH_MENU)

    def describe(self, entry: str) -> BlueprintDescriptor:
        return width_descriptor(entry)

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        """The new units' fan-in and fan-out at the layer's current width (sized on the meta
        device: asked every epoch, it must not allocate or move the run's random stream)."""
        ws = _width_slot(slot)
        seed = WidthSeed(ws.site, ws.host, units=width_units(entry, ws.site.width), device=torch.device("meta"))
        return sum(t.numel() for t in seed.parameters())

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """``config.width_init`` must be able to start new units of the layer without changing the
        network (``check_width_init``): refused at planning, not culled once the run trains."""
        ws = _width_slot(slot)
        # Its full width: a GroupNorm in between takes any multiple of its group size.
        seed = WidthSeed(ws.site, ws.host, units=ws.site.width, device=torch.device("meta"))
        check_width_init(seed, config.width_init)

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        """``blueprint_id`` is a width-menu entry (the units are that share of the layer's current
        width), or ``params["units"]`` says how many units exactly."""
        ws = _width_slot(slot)
        site = ws.site
        units = width_units(blueprint_id, site.width)  # also checks that the entry is on the menu
        units = int(params.get("units", units))
        init = nursery.config.width_init
        adjacent = [
            sid
            for sid, other in nursery.slots.items()
            if other.seed is not None
            and other.kind is self
            and (_width_slot(other).site.layer == site.consumer or _width_slot(other).site.consumer == site.layer)
        ]
        verdict = gates.g0_width(
            layer=site.layer,
            width=site.width,
            units=units,
            init=init,
            inits=WIDTH_INITS,
            max_factor=nursery.config.width_max_factor,
            adjacent_in_flight=adjacent,
        )
        if not verdict.passed:
            return Sprout(verdict=verdict)
        # Only the data-aware inits read the host's signals (``random`` ignores them).
        signals = (
            nursery.signals.site_signals(ws.reader, ws.joiner, nursery.config.seed_init_batches)
            if init != "random" and nursery.signals is not None
            else []
        )
        try:
            seed = WidthSeed(site, ws.host, units=units)
            metrics = init_width_seed_(seed, init, signals)
        except ValueError as e:  # a GroupNorm's group size, an activation GradMax cannot keep
            return Sprout(verdict=GateVerdict(gate=verdict.gate, passed=False, reason=str(e)))
        return Sprout(
            verdict=verdict, module=seed, blueprint_id=self.name, params={"units": float(units)}, metrics=dict(metrics)
        )

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        # Initialised in ``sprout``, before it was attached; a side module needs no pre-warm.
        return []

    def fossilize(self, slot: SeedSlot, optimizer: torch.optim.Optimizer | None) -> Merge | None:
        ws = _width_slot(slot)
        seed = ws.seed
        assert isinstance(seed, WidthSeed)
        before = ws.site.width
        # The merge reads the seed's optimizer state, so it runs before the seed's group goes.
        ws.site = merge_width_seed(ws.host, seed, optimizer)
        layer, after = ws.site.layer, ws.site.width
        return Merge(
            reason=f"merged: {layer} {before} -> {after} units",
            event=TelemetryEvent(
                name="kasmina.width.merged",
                level=TelemetryLevel.INFO,
                message=f"{layer} widened {before} -> {after}",
                attributes={"slot_id": ws.slot_id, "layer": layer, "width": float(after)},
            ),
        )

    def seed_key(self, record: SeedRecord) -> str:
        return f"{self.name}:{int(record.params['units'])}"

    def architecture(self, slot: SeedSlot) -> Any:
        """The widened layer's current width (units)."""
        return _width_slot(slot).site.width

    def restore_architecture(self, slot: SeedSlot, value: Any, optimizer: torch.optim.Optimizer | None) -> None:
        # Parameters keep their identity as they resize: the optimizer's groups hold them already.
        ws = _width_slot(slot)
        ws.site = resize_width(ws.host, ws.site, int(value))

    def restore(
        self, slot: SeedSlot, record: SeedRecord, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> nn.Module:
        ws = _width_slot(slot)
        # Its weights come with the host's state dict, loaded after this.
        return WidthSeed(ws.site, ws.host, units=int(record.params["units"]))

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """Merged: the layer and its consumer widened (the static network of the grown size).
        Unmerged: a copy of the seed beside them, run from the layer's input into the consumer's
        output by hooks with the isolation's arithmetic (``SeedSlot.apply_seed`` in TRAINING)."""
        seed = slot.seed
        assert isinstance(seed, WidthSeed)
        if merged:
            merge_width_seed(model, seed)
            return
        side = WidthSeed(seed.site, model, units=seed.units)
        side.load_state_dict(seed.state_dict())
        model.add_module(slot.slot_id.replace(".", "_").replace("+", "_"), side)
        kept: list[torch.Tensor] = []

        def keep(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            kept.append(args[0])

        def join(_m: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
            delta = side(kept.pop().detach())
            return out + (delta - delta.detach())

        model.get_submodule(side.site.layer).register_forward_pre_hook(keep)
        model.get_submodule(side.site.consumer).register_forward_hook(join)


def _width_slot(slot: SeedSlot) -> WidthSlot:
    # Only a ``WidthSlot`` names this kind (and its module imports this one, so no isinstance).
    assert slot.kind is WIDTH, f"{slot.slot_id} is not a width slot"
    return cast("WidthSlot", slot)


WIDTH = WidthKind()
