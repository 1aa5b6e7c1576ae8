"""The host's signals at a seed's site, which data-aware initialisations read at germination.

Every seed reads an activation somewhere in the host (its *reader*: a branch slot reads the
activation it joins, a width seed the widened layer's input) and adds to the output of a module
(its *joiner*: the branch slot itself, or the widened layer's consumer). One batch of signals is
the reader's input ``x``, the joiner's input ``h`` and the loss gradient ``g`` at the joiner's
output. Tolaria supplies them from its first training batches (``GrowthSignals``); a notebook or a
test can compute them on any batches with ``site_signals``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True, slots=True)
class SiteSignals:
    """One batch of the host's signals at a seed's site, all detached.

    Attributes:
        x: The reader's input (B, *input_shape).
        h: The joiner's input (B, ...): for a width seed, the host's current units.
        g: The loss gradient at the joiner's output (B, ...).
    """

    x: torch.Tensor
    h: torch.Tensor
    g: torch.Tensor


class GrowthSignals(Protocol):
    """Where seed kinds read the host's signals (Tolaria's ``Trainer`` implements it)."""

    def site_signals(self, reader: nn.Module, joiner: nn.Module, batches: int) -> list[SiteSignals]:
        """Signals at ``reader`` / ``joiner`` on the first ``batches`` training batches, in data
        order, with the model in eval mode and no RNG drawn (a resumed run reads the same)."""
        ...

    def first_batches(self, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``batches`` training batches ``(x, y)`` in data order, on the device."""
        ...


def site_signals(
    model: nn.Module,
    reader: nn.Module,
    joiner: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: LossFn,
) -> list[SiteSignals]:
    """Run ``model`` forward and backward on ``batches`` and record the signals at a site.

    The joiner's output is replaced by a detached leaf, so the backward stops there and the
    model's parameters receive no gradient; train/eval mode is the caller's.

    Args:
        model: The host (``reader`` and ``joiner`` must run in its forward).
        reader: The module whose input the seed reads.
        joiner: The module whose output the seed adds to (may be ``reader``).
        batches: ``(inputs, targets)`` pairs.
        loss_fn: The training loss.

    Raises:
        ValueError: the forward did not run ``reader`` or ``joiner``.
    """
    seen: dict[str, torch.Tensor] = {}

    def keep_input(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen["x"] = args[0].detach()

    def cut(_m: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        seen["h"], seen["y"] = args[0].detach(), out.detach().requires_grad_()
        return seen["y"]

    out: list[SiteSignals] = []
    handles = [reader.register_forward_pre_hook(keep_input), joiner.register_forward_hook(cut)]
    try:
        for inputs, targets in batches:
            seen.clear()
            with torch.enable_grad():
                loss = loss_fn(model(inputs), targets)
            if "x" not in seen or "y" not in seen:
                raise ValueError(
                    "the seed's site was not called in the model's forward: attach the slot to a layer the forward runs"
                )
            (g,) = torch.autograd.grad(loss, seen["y"])
            out.append(SiteSignals(x=seen["x"], h=seen["h"], g=g))
    finally:
        for handle in handles:
            handle.remove()
    return out
