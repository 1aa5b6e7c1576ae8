"""Growth signals on fixed batches, for a seed manager tested without a trainer."""

from __future__ import annotations

import torch
from torch import nn

from esper_core.kasmina.signals import LossFn, SiteSignals, site_signals


class FixedSignals:
    """``kasmina.signals.GrowthSignals`` over the batches given (Tolaria's trainer reads its first
    training batches instead)."""

    def __init__(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], loss_fn: LossFn) -> None:
        self.model = model
        self.batches = batches
        self.loss_fn = loss_fn

    def site_signals(self, reader: nn.Module, joiner: nn.Module, batches: int) -> list[SiteSignals]:
        return site_signals(self.model, reader, joiner, self.batches[:batches], self.loss_fn)
