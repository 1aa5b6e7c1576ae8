"""Fold a blended depth seed into its stack, and give a stack a recorded depth on restore.

After the merge the stack holds the seed's blocks too (appended in order: the seed always sits
after the last one) and the host is the plain network of the new depth. At alpha 1 the slot
computed ``h + (f(h) - h)``; the merged stack computes ``f(h)``: the same function up to one
floating-point rounding of that sum.

The blocks' parameters keep their identity and move from the seed's optimizer group into the
host's group that holds the same parameter of the block before it, with the optimizer state the
seed had (its own Adam moments and step count). A host group keeps its parameters in the order
``host.parameters()`` lists them, so an optimizer built afresh for a resumed run and grown by
``resize_depth`` indexes the same parameters in the same places as the live one, and its saved
state loads onto the right tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from esper_core.kasmina.depth.seed import DepthSeed, blank_copy


def merge_depth_seed(
    host: nn.Module,
    stack: nn.ModuleList | nn.Sequential,
    seed: DepthSeed,
    optimizer: torch.optim.Optimizer | None = None,
) -> int:
    """Append ``seed.blocks`` to ``stack``; their parameters join the host's optimizer groups.

    Args:
        host: The model that holds ``stack`` (its parameter order orders the optimizer groups).
        stack: The stack the seed deepens.
        seed: A depth seed at alpha 1.
        optimizer: The optimizer training ``host`` and the seed, if any.

    Returns:
        The stack's new depth.
    """
    source = stack[-1]
    for block in seed.blocks:
        stack.append(block)
        if optimizer is not None:
            _adopt(optimizer, host, block, source)
    return len(stack)


def resize_depth(
    host: nn.Module, stack: nn.ModuleList | nn.Sequential, depth: int, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Give ``stack`` exactly ``depth`` blocks, for loading a checkpoint taken at that depth.

    Blocks are appended as copies of the last one (the checkpoint's weights replace theirs) or
    dropped from the end, with their parameters added to or removed from ``optimizer``'s host
    groups (the optimizer's state is the checkpoint's to load).

    Raises:
        ValueError: ``depth`` < 1.
    """
    if depth < 1:
        raise ValueError(f"a stack keeps at least one block, got depth={depth}")
    while len(stack) < depth:
        source = stack[-1]
        block = blank_copy(source)
        stack.append(block)
        if optimizer is not None:
            _adopt(optimizer, host, block, source)
    while len(stack) > depth:
        block = stack[-1]
        del stack[len(stack) - 1]
        if optimizer is not None:
            gone = {id(p) for p in block.parameters()}
            for p in block.parameters():
                optimizer.state.pop(p, None)
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) not in gone]


def _adopt(optimizer: torch.optim.Optimizer, host: nn.Module, block: nn.Module, source: nn.Module) -> None:
    """Move ``block``'s parameters into the groups that hold ``source``'s same-named ones, in
    ``host``'s parameter order (out of any seed group; their state stays)."""
    moving = {id(p) for p in block.parameters()}
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in moving]
    groups = [g for g in optimizer.param_groups if "slot_id" not in g]
    touched = []
    src = dict(source.named_parameters())
    for name, p in block.named_parameters():
        home = next((g for g in groups if any(q is src[name] for q in g["params"])), None)
        if home is None:  # the source's parameter is frozen or not trained: neither is this one
            continue
        home["params"].append(p)
        touched.append(home)
    order = {id(p): i for i, p in enumerate(host.parameters())}
    for group in {id(g): g for g in touched}.values():
        group["params"].sort(key=lambda p: order.get(id(p), len(order)))
