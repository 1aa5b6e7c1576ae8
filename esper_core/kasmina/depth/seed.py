"""A depth seed: one new block for the end of a stack, kept beside it while it is young.

The seed computes ``block(h) - h`` from the stack's output ``h``, so the slot's usual residual
join (``SeedSlot.apply_seed``) gives ``h + alpha * (block(h) - h)``: the identity at alpha 0 and
the deeper network at alpha 1, whatever the block is. Isolated (TRAINING), the host's output is
exactly ``h``; blended, the new block ramps in; merged (``merge.py``), the block itself is
appended to the stack.

How the block starts (``DEPTH_MENU``): ``depth-stack`` copies the stack's last block (G_stack);
``depth-fresh`` is the same architecture re-initialised by its modules' ``reset_parameters``
(PyTorch's defaults, not a model's own init function, which Esper cannot see). Either way the
network is unchanged when it germinates: the blend starts at alpha 0.
"""

from __future__ import annotations

import copy

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
    """``block(h) - h``: what one more block adds to the stack's output ``h``.

    Args:
        block: The new block (not part of the host until it merges).
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h) - h


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


@torch.no_grad()
def new_block(source: nn.Module, entry: str) -> nn.Module:
    """The block a depth-menu ``entry`` inserts after ``source`` (the stack's last block).

    Args:
        source: The stack's last block.
        entry: ``depth-stack`` (a copy of ``source``) or ``depth-fresh`` (re-initialised).
    """
    block = blank_copy(source)
    if entry == "depth-fresh":
        for module in block.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
    return block
