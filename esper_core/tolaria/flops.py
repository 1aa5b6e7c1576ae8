"""Floating-point operations of a network's forward pass, as torch's ``FlopCounterMode`` counts
them (2 per multiply-add, at the ATen level: a seed loaded as an exported program counts like
eager code)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def forward_flops(model: nn.Module, sample: torch.Tensor) -> int:
    """FLOPs of ``model``'s forward on ``sample`` (one sample, batch dimension included), in eval
    mode and under inference mode (nothing is updated, no gradient is kept)."""
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            model(sample)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
