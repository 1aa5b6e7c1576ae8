"""The slot of a depth seed: the stack's output in, the stack's output plus a blended block out.

A depth seed joins the host after the stack's last block: a forward hook on that block returns
``slot(h)``, which applies the seed with the lifecycle's rules (``SeedSlot.apply_seed``: isolated
while TRAINING, ``alpha`` while blended, always residual: the seed computes ``block(h) - h``).
The hook exists only while the slot holds a seed, so a DORMANT slot leaves the host's forward
exactly as PyTorch runs it; it goes on whichever block is last when the seed germinates, so
after a merge the next seed follows the block that merged.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from esper_core.karn.depth import DEPTH_PROFILE
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.depth.kind import DEPTH
from esper_core.kasmina.depth.stack import DepthSite
from esper_core.kasmina.kinds import SeedKind
from esper_core.kasmina.slot import SeedSlot

DEPTH_SLOT_SUFFIX = "+depth"
"""A depth slot's id is its stack's name with this suffix (``"blocks+depth"``)."""


class DepthSlot(SeedSlot):
    """A seed slot that deepens ``site.stack`` by one block at a time.

    Args:
        site: The stack (``find_depth_site``).
        batch_max: The largest batch a seed must accept.
    """

    kind: SeedKind = DEPTH

    def __init__(self, *, site: DepthSite, batch_max: int) -> None:
        super().__init__(
            slot_id=site.stack + DEPTH_SLOT_SUFFIX,
            layer=site.layer,
            profile=ShapeProfile(feature_shape=site.feature_shape, batch_max=batch_max),
        )
        self.site = site
        # The model the slot deepens: in a tuple, so it is not registered as a submodule (the
        # host owns the slot, not the other way round).
        self._host: tuple[nn.Module, ...] = ()
        self._handle: RemovableHandle | None = None

    def _seed_changed(self) -> None:
        if self.__dict__.get("_host"):
            self._sync_hook()

    def _sync_hook(self) -> None:
        """A hook on the stack's last block while a seed is here, none otherwise."""
        if self.seed is None:
            if self._handle is not None:
                self._handle.remove()
            self._handle = None
            return
        if self._handle is not None:
            return

        def apply(_m: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
            return self(out)

        self._handle = self.stack[-1].register_forward_hook(apply)

    @property
    def hook_ids(self) -> frozenset[int]:
        """Id of the hook the slot has on the stack's last block now (none while it holds no seed)."""
        return frozenset() if self._handle is None else frozenset({self._handle.id})

    @property
    def profile_name(self) -> str:
        """Every depth slot reports ``DEPTH_PROFILE``: the depth menu fits it, no branch blueprint."""
        return DEPTH_PROFILE

    @property
    def host(self) -> nn.Module:
        """The model whose stack this slot deepens (set by ``graft_depth_slot``)."""
        if not self._host:
            raise ValueError(f"depth slot {self.slot_id} is not grafted onto a model: call graft_depth_slot first")
        return self._host[0]

    @property
    def stack(self) -> nn.ModuleList | nn.Sequential:
        """The stack itself, at its current depth."""
        stack = self.host.get_submodule(self.site.stack)
        assert isinstance(stack, nn.ModuleList | nn.Sequential), type(stack)
        return stack

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.apply_seed(h, h)

    def _blend(self, x: torch.Tensor, delta: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
        # Always residual: the seed's delta is block(h) - h, so this is h + alpha * (block(h) - h).
        return x + alpha * delta


def graft_depth_slot(host: nn.Module, slot: DepthSlot) -> None:
    """Give ``slot`` the model it deepens: from now on a seed put into the slot hooks onto the
    stack's last block, and taking it out unhooks."""
    slot._host = (host,)
    slot._sync_hook()
