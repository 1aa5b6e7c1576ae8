"""Seeds train in their own optimizer parameter groups, each with its own learning-rate scale."""

from __future__ import annotations

import torch
from torch import nn


class SeedParamGroups:
    """Adds, removes and reports the per-seed parameter groups of one optimizer.

    Unbound (no optimizer yet) it does nothing, so a seed manager can be used for inference.
    """

    def __init__(self) -> None:
        self._optimizer: torch.optim.Optimizer | None = None
        self._base_lr = 0.0

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The bound optimizer (None before ``bind``)."""
        return self._optimizer

    def bind(self, optimizer: torch.optim.Optimizer, *, base_lr: float) -> None:
        """Manage seed groups in ``optimizer``; seeds get ``base_lr * lr_scale``."""
        self._optimizer = optimizer
        self._base_lr = base_lr

    def add(self, slot_id: str, params: list[nn.Parameter], *, lr_scale: float) -> None:
        """Give the seed in ``slot_id`` its own group (only its trainable parameters)."""
        if self._optimizer is None:
            return
        trainable = [p for p in params if p.requires_grad]
        self._optimizer.add_param_group({"params": trainable, "lr": self._base_lr * lr_scale, "slot_id": slot_id})

    def set_factor(self, slot_id: str, factor: float) -> None:
        """Scale the rate of ``slot_id``'s group to ``factor`` times its rate without one.

        The group remembers its last factor (``seed_lr_factor``, saved with the optimizer's state)
        and is rescaled from it, so whatever else changed its rate (Tolaria's run schedule,
        Tamiyo's learning-rate commands) is kept.
        """
        if self._optimizer is None:
            return
        for group in self._optimizer.param_groups:
            if group.get("slot_id") == slot_id:
                group["lr"] *= factor / group.get("seed_lr_factor", 1.0)
                group["seed_lr_factor"] = factor

    def remove(self, slot_id: str) -> None:
        """Drop the group of ``slot_id`` and the optimizer state (momentum) of its parameters."""
        opt = self._optimizer
        if opt is None:
            return
        for group in [g for g in opt.param_groups if g.get("slot_id") == slot_id]:
            for p in group["params"]:
                opt.state.pop(p, None)
        # By identity: list.remove compares groups with ==, which compares two seed groups'
        # parameter tensors element-wise and raises as soon as two seeds are alive.
        opt.param_groups[:] = [g for g in opt.param_groups if g.get("slot_id") != slot_id]

    def param_count(self, slot_id: str) -> int:
        """Parameters of ``slot_id`` still registered with the optimizer (G5 checks 0)."""
        if self._optimizer is None:
            return 0
        return sum(p.numel() for g in self._optimizer.param_groups if g.get("slot_id") == slot_id for p in g["params"])

    def order(self) -> list[str]:
        """Slot ids of the seed groups, in optimizer order (checkpoints restore this order)."""
        if self._optimizer is None:
            return []
        return [g["slot_id"] for g in self._optimizer.param_groups if "slot_id" in g]
