"""A depth seed: new blocks for the end of a stack, kept beside it while they are young.

The seed runs its blocks as a chain on the stack's output ``h`` and returns ``f(h) - h``, so the
slot's usual residual join (``SeedSlot.apply_seed``) gives ``h + alpha * (f(h) - h)``: the
identity at alpha 0 and the deeper network at alpha 1, whatever the blocks are. In TRAINING the
seed is not run and the host's output is exactly ``h``; blended, the new blocks ramp in; merged
(``merge.py``), the blocks themselves are appended to the stack, in order.

How the blocks start (``DEPTH_MENU``): ``depth-stack`` is one copy of the stack's last block;
``depth-stack-all`` copies every block of the stack, in order, so the stack doubles (G_stack's
operator: ``b0 b1`` becomes ``b0 b1 b0 b1``); ``depth-fresh`` is one block of the same
architecture re-initialised by its modules' ``reset_parameters`` (PyTorch's defaults, not a
model's own init function, which Esper cannot see). Either way the network is unchanged when it
germinates: the blend starts at alpha 0.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
"""A module's call hooks (state-dict hooks are kept: they belong to its format, not its calls)."""


class DepthSeed(nn.Module):
    """``f(h) - h``, ``f`` the new blocks as a chain: what they add to the stack's output ``h``.

    Args:
        blocks: The new blocks, in the order they will join the stack (not part of the host
            until they merge).
    """

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        super().__init__()
        if not blocks:
            raise ValueError("a depth seed holds at least one block")
        self.blocks = nn.ModuleList(blocks)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h
        for block in self.blocks:
            x = block(x)
        return x - h


def blank_copy(source: nn.Module) -> nn.Module:
    """A copy of ``source`` with its weights, trainable, and without any call hook.

    The stack's blocks carry Esper's hooks (a branch slot on a block's output, a width slot on
    one of its layers, the trainer's activation probes) and perhaps a user's; a copy that kept
    them would apply another slot's seed twice, or report a layer that is not in the graph.
    """
    block = copy.deepcopy(source)
    for module in block.modules():
        for name in _HOOK_DICTS:
            hooks = getattr(module, name, None)
            if hooks is not None:
                hooks.clear()
    for p in block.parameters():
        p.requires_grad_(True)
    return block


def sources(stack: nn.ModuleList | nn.Sequential, entry: str) -> list[nn.Module]:
    """The stack's blocks a depth-menu ``entry`` starts its new blocks from, one per new block:
    every block for ``depth-stack-all``, the last one otherwise."""
    return list(stack) if entry == "depth-stack-all" else [stack[-1]]


@torch.no_grad()
def new_blocks(stack: nn.ModuleList | nn.Sequential, entry: str) -> list[nn.Module]:
    """The blocks a depth-menu ``entry`` inserts after ``stack``'s last one, in order.

    Args:
        stack: The stack's blocks now.
        entry: ``depth-stack`` (a copy of the last block), ``depth-stack-all`` (a copy of every
            block) or ``depth-fresh`` (the last block's architecture, re-initialised).
    """
    blocks = [blank_copy(source) for source in sources(stack, entry)]
    if entry == "depth-fresh":
        for module in blocks[0].modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
    return blocks
