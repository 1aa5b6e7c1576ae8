"""The slot of stream growth: the whole model's width, owned by one slot.

A stream seed is applied to the host at germination and kept at once (``kind``), so the slot
never holds a seed module and takes no hook: it records the stream's width, which a checkpoint
keeps so that a restore gives the host that width before loading its weights.
"""

from __future__ import annotations

from torch import nn

from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.stream import STREAM_PROFILE
from esper_core.kasmina.kinds import SeedKind
from esper_core.kasmina.slot import SeedSlot
from esper_core.kasmina.stream.kind import STREAM
from esper_core.kasmina.stream.plan import StreamPlan

STREAM_SLOT = "stream"
"""The stream slot's id (a model has one stream)."""


class StreamSlot(SeedSlot):
    """The slot that doubles a model's stream (``ModelSpec(widen_stream=True)``).

    Args:
        plan: The model's stream as planned when it was grafted (``plan_stream``).
        batch_max: The largest batch a seed must accept.
    """

    kind: SeedKind = STREAM

    def __init__(self, *, plan: StreamPlan, batch_max: int) -> None:
        # Tamiyo's graph joins a slot to a weight layer: the first embedding writing the stream.
        layer = plan.names("embedding", "writer", "free")[0]
        super().__init__(
            slot_id=STREAM_SLOT, layer=layer, profile=ShapeProfile(feature_shape=(plan.width,), batch_max=batch_max)
        )
        self.width = plan.width
        self.output = plan.output
        # Each doubling's plan by the width it doubled: a rollback undoes one with its own plan.
        self.plans: dict[int, StreamPlan] = {plan.width: plan}
        self._host: tuple[nn.Module, ...] = ()

    def set_width(self, width: int) -> None:
        """Record the stream's width after it changed (the profile follows)."""
        self.width = width
        self.profile = ShapeProfile(feature_shape=(width,), batch_max=self.profile.batch_max)

    @property
    def profile_name(self) -> str:
        """The stream slot reports ``STREAM_PROFILE``: the stream menu fits it, nothing else."""
        return STREAM_PROFILE

    @property
    def host(self) -> nn.Module:
        """The model whose stream this slot doubles (set by ``graft_stream_slot``)."""
        if not self._host:
            raise ValueError(f"stream slot {self.slot_id} is not grafted onto a model: call graft_stream_slot first")
        return self._host[0]


def graft_stream_slot(host: nn.Module, slot: StreamSlot) -> None:
    """Give ``slot`` the model whose stream it doubles."""
    slot._host = (host,)
