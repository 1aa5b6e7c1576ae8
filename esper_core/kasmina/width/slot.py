"""The slot of a width seed: the widened layer's input in, the consumer's output out.

A branch slot's seed reads the activation it adds to. A width seed's new units read the widened
layer's *input* and add to the consumer's *output*, so its slot takes two hooks: a forward
pre-hook on the layer keeps the input, and a forward hook on the consumer applies the seed to it
with the lifecycle's rules (``SeedSlot.apply_seed``: isolated while TRAINING, ``alpha`` while
blended). The blend is always residual: new units add to the consumer, never replace it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.width import WIDTH_PROFILE
from esper_core.kasmina.slot import SeedSlot
from esper_core.kasmina.width.trace import WidthSite

WIDTH_SLOT_SUFFIX = "+width"
"""A width slot's id is its layer's name with this suffix (``"conv2+width"``)."""


class WidthSlot(SeedSlot):
    """A seed slot that widens ``site.layer``.

    Args:
        site: The layer, its consumer and the ops in between (``trace_width_site``).
        batch_max: The largest batch a seed must accept.
    """

    def __init__(self, *, site: WidthSite, batch_max: int) -> None:
        super().__init__(
            slot_id=site.layer + WIDTH_SLOT_SUFFIX,
            layer=site.layer,
            profile=ShapeProfile(feature_shape=site.input_shape, batch_max=batch_max),
        )
        self.site = site
        self._source: torch.Tensor | None = None
        # The model the slot widens: in a tuple, so it is not registered as a submodule (the host
        # owns the slot, not the other way round).
        self._host: tuple[nn.Module, ...] = ()

    @property
    def profile_name(self) -> str:
        """Every width slot reports ``WIDTH_PROFILE``: the width menu fits it, no branch blueprint."""
        return WIDTH_PROFILE

    @property
    def host(self) -> nn.Module:
        """The model whose layer this slot widens (set by ``graft_width_slot``)."""
        if not self._host:
            raise ValueError(f"width slot {self.slot_id} is not grafted onto a model: call graft_width_slot first")
        return self._host[0]

    def capture(self, x: torch.Tensor) -> None:
        """Keep the widened layer's input for the consumer's hook (only while a seed is here)."""
        self._source = x if self.seed is not None else None

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        source, self._source = self._source, None
        return y if source is None else self.apply_seed(y, source)

    def _blend(self, x: torch.Tensor, delta: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
        return x + alpha * delta


def graft_width_slot(host: nn.Module, slot: WidthSlot) -> list[RemovableHandle]:
    """Hook ``slot`` into ``host`` (input kept at the layer, seed applied at the consumer)."""
    modules = dict(host.named_modules())
    slot._host = (host,)

    def keep(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        slot.capture(args[0])

    def apply(_m: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
        return slot(out)

    return [
        modules[slot.site.layer].register_forward_pre_hook(keep),
        modules[slot.site.consumer].register_forward_hook(apply),
    ]
