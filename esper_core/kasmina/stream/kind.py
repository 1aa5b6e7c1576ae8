"""The stream kind: double a transformer's width in place, kept at once.

Branch, width and depth seeds start as a side module that changes nothing, train (in isolation or
blended in), and are judged before they are kept, because until then they can be taken out. A
doubled stream is different on both counts: it computes exactly what the network computed
(``widen.widen_stream`` checks that on a training batch; that check is G0), so there is nothing to
isolate and no alpha to ramp, and once the copies train apart there is no narrower network to go
back to without losing that training. So it is applied at germination and kept at once
(``immediate``: GERMINATED -> FOSSILIZED -> DORMANT in one command), and judged afterwards the
way every epoch is: by the risk engine's loss-spike rule and the run's own rollback to its last
commit. The slot is free again at once; a second germination doubles again.

Everything else in the host must be the host's own when the stream doubles: a seed in another
slot (even a fossilised branch seed, which stays in its slot reading the old width) would not
follow, so G0 refuses while any other slot holds one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from esper_core.contracts import BlueprintDescriptor, GateVerdict, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.contracts.enums import GateId, SlotKind
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.stream import STREAM_MENU, check_stream_entry, stream_descriptor
from esper_core.kasmina.kinds import Merge, Nursery, Sprout
from esper_core.kasmina.loader import LoadedKernel
from esper_core.kasmina.records import SeedRecord
from esper_core.kasmina.stream.widen import resize_stream, stream_growth, widen_stream

if TYPE_CHECKING:
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.kasmina.slot import SeedSlot
    from esper_core.kasmina.stream.slot import StreamSlot


class StreamKind:
    """The host's stream doubled (``widen_stream``) at germination, kept at once."""

    name = "stream"
    slot_kind = SlotKind.WIDTH
    """Tamiyo sees the stream slot as a width slot (the whole model's width): her graph and
    action space keep their format."""
    compiled = False
    merges = True
    isolated_training = False
    immediate = True
    menu = tuple(STREAM_MENU)

    def describe(self, entry: str) -> BlueprintDescriptor:
        return stream_descriptor(entry)

    def param_cost(self, slot: SeedSlot, entry: str) -> int:
        """Parameters doubling the stream adds now (read from shapes)."""
        check_stream_entry(entry)
        ss = _stream_slot(slot)
        return stream_growth(ss.host, width=ss.width, output=ss.output)

    def check_config(self, slot: SeedSlot, config: KasminaConfig) -> None:
        """Nothing to refuse: the stream was planned when the slot was grafted, and doubling it
        reads no ``KasminaConfig`` field."""

    def sprout(self, slot: SeedSlot, blueprint_id: str, *, params: dict[str, float], nursery: Nursery) -> Sprout:
        """Double the stream now, checked on the first training batch (G0): on any refusal the
        host is left exactly as it was."""
        check_stream_entry(blueprint_id)
        ss = _stream_slot(slot)
        busy = sorted(sid for sid, other in nursery.slots.items() if other is not slot and other.seed is not None)
        refusal = None
        if busy:
            refusal = (
                f"slots {busy} hold seeds, which would not follow the stream to its new width: double the stream "
                "when every other seed has merged or been culled"
            )
        elif nursery.signals is None:
            refusal = "doubling the stream checks the network on a training batch: germinate it within a run"
        if refusal is not None:
            return Sprout(verdict=GateVerdict(gate=GateId.G0_SANITY, passed=False, reason=refusal))
        assert nursery.signals is not None
        sample = nursery.signals.first_batches(1)[0][0]
        try:
            # Seeded by the width: the same splits on every rank and in a resumed run.
            report = widen_stream(
                ss.host,
                sample,
                width=ss.width,
                optimizer=nursery.optimizer,
                generator=torch.Generator().manual_seed(ss.width),
            )
        except ValueError as e:
            return Sprout(verdict=GateVerdict(gate=GateId.G0_SANITY, passed=False, reason=str(e)))
        ss.plans[ss.width] = report.plan
        ss.set_width(report.width_after)
        return Sprout(
            verdict=GateVerdict(
                gate=GateId.G0_SANITY,
                passed=True,
                reason=(
                    f"stream doubled {report.width_before} -> {report.width_after} ({report.params_before} -> "
                    f"{report.params_after} parameters); the output moved by at most {report.max_change:.2g}"
                ),
            ),
            blueprint_id=blueprint_id,
            metrics={"width": float(report.width_after), "max_change": report.max_change},
        )

    def settle(self, slot: SeedSlot, record: SeedRecord, nursery: Nursery) -> list[TelemetryEvent]:
        return []

    def fossilize(self, slot: SeedSlot, optimizer: torch.optim.Optimizer | None) -> Merge | None:
        """Nothing left to fold in (``sprout`` changed the host): the record of the change."""
        ss = _stream_slot(slot)
        return Merge(
            reason=f"merged: stream {ss.width // 2} -> {ss.width} units",
            event=TelemetryEvent(
                name="kasmina.stream.doubled",
                level=TelemetryLevel.INFO,
                message=f"stream widened {ss.width // 2} -> {ss.width}",
                attributes={"slot_id": ss.slot_id, "width": float(ss.width)},
            ),
        )

    def seed_key(self, record: SeedRecord) -> str:
        return f"{self.name}:{record.blueprint_id}"

    def architecture(self, slot: SeedSlot) -> Any:
        """The stream's current width (units)."""
        return _stream_slot(slot).width

    def restore_architecture(self, slot: SeedSlot, value: Any, optimizer: torch.optim.Optimizer | None) -> None:
        ss = _stream_slot(slot)
        resize_stream(ss.host, int(value), current=ss.width, plans=ss.plans, output=ss.output, optimizer=optimizer)
        ss.set_width(int(value))

    def restore(
        self, slot: SeedSlot, record: SeedRecord, load_kernel: Callable[[KernelArtifact], LoadedKernel]
    ) -> nn.Module:
        raise ValueError(
            f"slot {slot.slot_id} never holds a seed (a doubled stream is kept at once): no seed to restore"
        )

    def copy_into(
        self, slot: SeedSlot, record: SeedRecord, model: nn.Module, *, catalog: KarnCatalog, merged: bool
    ) -> None:
        """Nothing: the doubled stream is the host's own from the start, in every copy of it."""


def _stream_slot(slot: SeedSlot) -> StreamSlot:
    # Only a ``StreamSlot`` names this kind (and its module imports this one, so no isinstance).
    assert slot.kind is STREAM, f"{slot.slot_id} is not the stream slot"
    return cast("StreamSlot", slot)


STREAM = StreamKind()
