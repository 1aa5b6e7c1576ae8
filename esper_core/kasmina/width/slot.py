"""The slot of a width seed: the widened layer's input in, the consumer's output out.

A branch slot's seed reads the activation it adds to. A width seed's new units read the widened
layer's *input* and add to the consumer's *output*, so its slot takes two hooks: a forward
pre-hook on the layer keeps the input, and a forward hook on the consumer applies the seed to it
with the lifecycle's rules (``SeedSlot.apply_seed``: isolated while TRAINING, ``alpha`` while
blended). The blend is always residual: new units add to the consumer, never replace it.

The hooks exist only while the slot holds a seed: a slot with nothing to add (DORMANT, or free
again after a merge) leaves the host's forward exactly as PyTorch runs it. Measured before that
(``bench/width_speed.py``, merged MNIST-1D nets against static ones of the same width, one
thread): two idle hooks per slot made an MLP epoch 1.29x and a CNN epoch 1.08x slower.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.width import WIDTH_PROFILE
from esper_core.kasmina.kinds import SeedKind
from esper_core.kasmina.slot import SeedSlot
from esper_core.kasmina.width.kind import WIDTH
from esper_core.kasmina.width.trace import WidthSite

WIDTH_SLOT_SUFFIX = "+width"
"""A width slot's id is its layer's name with this suffix (``"conv2+width"``)."""


class WidthSlot(SeedSlot):
    """A seed slot that widens ``site.layer``.

    Args:
        site: The layer, its consumer and the ops in between (``trace_width_site``).
        batch_max: The largest batch a seed must accept.
    """

    kind: SeedKind = WIDTH

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
        self._handles: list[RemovableHandle] = []

    def _seed_changed(self) -> None:
        if self.__dict__.get("_host"):
            self._sync_hooks()

    def _sync_hooks(self) -> None:
        """Hooks on the layer and its consumer while a seed is here, none otherwise."""
        if self.seed is None:
            for handle in self._handles:
                handle.remove()
            self._handles, self._source = [], None
            return
        if self._handles:
            return
        modules = dict(self.host.named_modules())

        def keep(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            self.capture(args[0])

        def apply(_m: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
            return self(out)

        self._handles = [
            modules[self.site.layer].register_forward_pre_hook(keep),
            modules[self.site.consumer].register_forward_hook(apply),
        ]

    @property
    def hook_ids(self) -> frozenset[int]:
        """Ids of the hooks the slot has on the host's modules now (none while it holds no seed)."""
        return frozenset(h.id for h in self._handles)

    @property
    def reader(self) -> nn.Module:
        """The widened layer: a width seed's new units read its input."""
        return self.host.get_submodule(self.site.layer)

    @property
    def joiner(self) -> nn.Module:
        """The layer's consumer: a width seed's new units add to its output."""
        return self.host.get_submodule(self.site.consumer)

    def delta_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        """A width seed maps the layer's input to a delta of the consumer's output."""
        return (x.shape[0], *self.site.output_shape)

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


def graft_width_slot(host: nn.Module, slot: WidthSlot) -> None:
    """Give ``slot`` the model it widens: from now on a seed put into the slot hooks into
    ``host`` (input kept at the layer, seed applied at the consumer), and taking it out unhooks."""
    slot._host = (host,)
    slot._sync_hooks()
