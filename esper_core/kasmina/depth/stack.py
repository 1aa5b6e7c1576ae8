"""Where a network can be deepened: a stack of identical blocks that run one after another.

Deepening stack ``S`` (an ``nn.ModuleList`` or ``nn.Sequential``) inserts a new block after its
last one. That is only the same network plus a block when the stack's blocks are interchangeable
and the forward pass runs them as a chain, which is checked, not assumed, by one dry forward on
the meta device (no memory, no compute) with the stack's last block appended once more:

- every block has the same type and the same parameters and buffers (names, shapes, dtypes);
- each block takes one tensor and returns a tensor of the same shape;
- the appended block runs, right after the last one and on its output (a forward that iterates
  the stack, ``for block in self.blocks: x = block(x)``; one that calls ``self.blocks[0]`` by
  index would never run an inserted block).

Anything else is refused, naming what differs and what to name instead, before any work starts.

Shapes: a block maps (B, *feature_shape) to (B, *feature_shape).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from esper_core.kasmina.dryrun import dry_forward

DEEPENABLE = (nn.ModuleList, nn.Sequential)
"""Containers a depth seed can insert a block into."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DepthSite:
    """A stack that can be deepened, as the dry forward found it.

    Attributes:
        stack: Dotted name of the ``nn.ModuleList`` / ``nn.Sequential``.
        blocks: Its blocks when it was found (a merge makes the stack longer; the slot reads
            the stack's current length, this is the host's starting depth).
        feature_shape: Per-sample shape of a block's input and output.
        layer: The weight layer a depth slot belongs to in Tamiyo's graph: the last one of the
            stack's last block (the stack's name when its blocks hold none).
    """

    stack: str
    blocks: int
    feature_shape: tuple[int, ...]
    layer: str


def find_depth_site(
    model: nn.Module, stack: str, sample_shape: tuple[int, ...], input_dtype: torch.dtype = torch.float32
) -> DepthSite:
    """Check that ``stack`` is a chain of identical blocks a new block can be inserted into.

    Args:
        model: The user's model (its weights are not read or changed).
        stack: Dotted name of an ``nn.ModuleList`` or ``nn.Sequential`` of blocks.
        sample_shape: Shape of one input sample, without the batch dimension.
        input_dtype: The input's dtype (``torch.long`` for token ids).

    Returns:
        The site: the stack, its depth and the blocks' per-sample shape.

    Raises:
        ValueError: no such module, not a ModuleList/Sequential, an empty stack, blocks that
            differ, a block whose output shape is not its input's, or a forward that does not run
            the stack as a chain; the message says what and what to name instead.
    """
    modules = dict(model.named_modules())
    container = modules.get(stack) if stack else None
    if container is None:
        stacks = [n for n, m in modules.items() if isinstance(m, DEEPENABLE) and n]
        raise ValueError(
            f"the model has no module named {stack!r} to deepen; its ModuleList/Sequential modules are {stacks}"
        )
    if not isinstance(container, DEEPENABLE):
        raise ValueError(
            f"{stack!r} is a {type(container).__name__}: a depth seed inserts a block into an nn.ModuleList or "
            "nn.Sequential of identical blocks; name the container that holds the blocks"
        )
    blocks = list(container)
    if not blocks:
        raise ValueError(f"{stack!r} is empty: a depth seed copies the stack's blocks; name a stack with blocks")
    first = _signature(blocks[0])
    for i, block in enumerate(blocks[1:], start=1):
        if _signature(block) != first:
            raise ValueError(
                f"{stack!r} holds blocks that differ: block {i} ({type(block).__name__}) is not like block 0 "
                f"({type(blocks[0]).__name__}) in type or in its parameters' names and shapes; a depth seed needs "
                "identical blocks (e.g. the transformer blocks or residual stages of one width); name a stack of "
                "those"
            )
    calls = _chain_calls(model, container, sample_shape, input_dtype)
    last = len(blocks) - 1
    ran = [i for i, _, _ in calls]
    if ran != list(range(len(blocks) + 1)):
        raise ValueError(
            f"{stack!r}'s blocks do not run as a chain in the model's forward (with a copy of the last block "
            f"appended as block {last + 1}, the blocks ran in the order {ran}): a depth seed inserts a block after "
            f"the last one, which runs only when forward() iterates the stack (for block in self.{stack}: "
            "x = block(x)) and calls each block once"
        )
    shape: tuple[int, ...] = ()
    for i, (_, x, y) in enumerate(calls):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise ValueError(
                f"block {ran[i]} of {stack!r} takes or returns something other than one tensor: a depth seed "
                "inserts blocks that map a tensor to a tensor of the same shape"
            )
        if x.shape != y.shape:
            raise ValueError(
                f"block {ran[i]} of {stack!r} maps {tuple(x.shape)} to {tuple(y.shape)}: a depth seed inserts blocks "
                "whose output has their input's shape (transformer blocks, residual stages of one width); name "
                "such a stack"
            )
        if i > 0 and x is not calls[i - 1][2]:
            raise ValueError(
                f"block {ran[i]} of {stack!r} does not read block {ran[i - 1]}'s output: a depth seed needs blocks "
                "that run as a chain (x = block(x)); name such a stack"
            )
        shape = tuple(x.shape[1:])
    prefix = f"{stack}.{last}."
    layers = [
        n
        for n, m in modules.items()
        if n.startswith(prefix) and isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.dim() >= 2
    ]
    return DepthSite(stack=stack, blocks=len(blocks), feature_shape=shape, layer=layers[-1] if layers else stack)


def _signature(block: nn.Module) -> tuple[object, ...]:
    """What two interchangeable blocks share: type, and each tensor's name, shape and dtype."""
    tensors = [*block.named_parameters(), *block.named_buffers()]
    return (type(block), tuple((n, tuple(t.shape), t.dtype) for n, t in tensors))


def _chain_calls(
    model: nn.Module,
    container: nn.ModuleList | nn.Sequential,
    sample_shape: tuple[int, ...],
    input_dtype: torch.dtype,
) -> list[tuple[int, object, object]]:
    """``(block index, input, output)`` of each block call of one dry forward with a copy of the
    last block appended (moved to the meta device: the dry forward reads shapes only)."""
    blocks = list(container)
    # A copy, not the same module again: a module listed twice ties its parameters, which the dry
    # forward's parameter swap does not undo.
    extra = copy.deepcopy(blocks[-1]).to_empty(device="meta")
    blocks.append(extra)
    index = {id(b): i for i, b in enumerate(blocks)}
    calls: list[tuple[int, object, object]] = []

    def record(i: int) -> Callable[[nn.Module, tuple[object, ...], dict[str, object], object], None]:
        def hook(_m: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], out: object) -> None:
            calls.append((i, args[0] if len(args) == 1 and not kwargs else None, out))

        return hook

    handles = [b.register_forward_hook(record(index[id(b)]), with_kwargs=True) for b in dict.fromkeys(blocks)]
    container.append(extra)
    try:
        dry_forward(model, (2, *sample_shape), input_dtype)
    finally:
        del container[len(blocks) - 1]
        for h in handles:
            h.remove()
    return calls
