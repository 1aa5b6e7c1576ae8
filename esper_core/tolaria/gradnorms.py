"""Gradient norms of named parameter groups (host layers, seeds), accumulated on the device with
one multi-tensor norm per step and reduced once per epoch (WP-99 Phase 3.2).

Per step: ``_foreach_norm`` over every tracked gradient, ``stack``, ``square_``, ``add_`` into a
preallocated accumulator: four kernels whatever the number of groups, and no host sync. Per
epoch: one ``tolist`` and the root-mean-square over steps of each group's norm.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class GradNormAccumulator:
    """Tracks the RMS over steps of each group's gradient norm."""

    def __init__(self) -> None:
        self._params: list[nn.Parameter] = []
        self._owners: list[str] = []
        self._acc: torch.Tensor | None = None  # (N,) sum over steps of each tensor's squared norm
        self._zero: torch.Tensor | None = None
        self.steps = 0

    def track(self, groups: dict[str, list[nn.Parameter]]) -> None:
        """Start an epoch tracking ``groups`` (name -> parameters); resets the sums."""
        self._params = [p for params in groups.values() for p in params]
        self._owners = [name for name, params in groups.items() for _ in params]
        self._names = list(groups)
        self.steps = 0
        if self._params:
            device = self._params[0].device
            self._acc = torch.zeros(len(self._params), device=device)
            self._zero = torch.zeros((), device=device)
        else:
            self._acc = None

    def step(self) -> None:
        """Add this step's squared gradient norms (device only, no sync)."""
        if self._acc is None:
            return
        zero = self._zero
        assert zero is not None
        # A parameter without a gradient this step (e.g. unused) counts as a zero norm.
        grads = [zero if p.grad is None else p.grad for p in self._params]
        self._acc.add_(torch.stack(torch._foreach_norm(grads)).square_())
        self.steps += 1

    def reduce(self) -> dict[str, float]:
        """RMS over this epoch's steps of each group's norm; one device sync."""
        if self._acc is None or self.steps == 0:
            return dict.fromkeys(getattr(self, "_names", []), 0.0)
        per_tensor = self._acc.tolist()
        sums = dict.fromkeys(self._names, 0.0)
        for owner, value in zip(self._owners, per_tensor, strict=True):
            sums[owner] += value
        return {name: math.sqrt(total / self.steps) for name, total in sums.items()}
