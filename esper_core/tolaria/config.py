"""Tolaria's configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from esper_core._capabilities import DEVICE_CHOICES
from esper_core.tolaria.aggregation import AggregationConfig
from esper_core.tolaria.precision import AMP_CHOICES
from esper_core.tolaria.safety import SafetyConfig
from esper_core.tolaria.slotgrads import TRAIN_ACCURACY_SAMPLES
from esper_core.tolaria.staging import LoaderConfig
from esper_core.tolaria.step import StepEngineConfig

OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "cosine", "cooldown")


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """Optimiser, device and budgets of the training loop."""

    optimizer: str = "sgd"
    """``sgd`` (with ``momentum``) or ``adam``; seeds join it in their own parameter groups."""
    lr: float = 0.05
    """Learning rate of the host; seeds get ``lr * lr_scale`` of their command."""
    momentum: float = 0.9
    lr_schedule: str = "constant"
    """Learning rate over the run's epochs: ``constant``, or ``cosine`` (half a cosine from the full
    rate at the first epoch down to ``lr * lr_final_factor`` at the last), set per epoch. It scales
    every parameter group's rate by the same factor, so a seed's ``lr_scale`` and Tamiyo's learning-rate
    commands keep their ratios."""
    lr_final_factor: float = 0.01
    """The last epoch's rate of ``cosine`` and ``cooldown`` as a fraction of ``lr`` (in (0, 1])."""
    lr_cooldown_epochs: int = 2
    """``cooldown`` (warmup-stable-decay without the warm-up): the full rate, then a linear decay
    over this many last epochs down to ``lr * lr_final_factor`` in the last one. A constant rate
    lets arms of different lengths or growth points share one schedule family, and the cooldown
    is where most of the final loss is won (Hägele et al. 2024)."""
    weight_decay: float = 0.0
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``."""
    latency_budget_ms: float = 18.0
    """p95 budget of the training part of an epoch (seed 001); reported against, not enforced."""
    val_batch_size: int = 512
    """Validation runs in batches of this size under ``torch.inference_mode()``."""
    train_accuracy_samples: int = TRAIN_ACCURACY_SAMPLES
    """Training samples the epoch's train accuracy (a growth signal) is measured on: the first
    ones in data order, all of a smaller split (``slotgrads.sample_accuracy``)."""
    amp: str = "auto"
    """Mixed precision: ``auto`` (bf16, or fp16 + GradScaler, on CUDA; fp32 on CPU), ``off``,
    ``bf16``, ``fp16``."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """Where training batches live and how they reach the device (gpu_dataset, prefetch, workers)."""
    step: StepEngineConfig = field(default_factory=StepEngineConfig)
    """How the training step runs: compile decision, CUDA graphs."""
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    """How per-seed gradients on the host combine when several seeds train (PCGrad or sum)."""
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    """Deadlines, failed-epoch thresholds and emergency levels."""

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not 0.0 < self.lr_final_factor <= 1.0:
            raise ValueError(
                f"lr_final_factor must lie in (0, 1] (a fraction of lr; 0 would stop training), got {self.lr_final_factor}"
            )
        if self.lr_cooldown_epochs < 1:
            raise ValueError(f"lr_cooldown_epochs must be >= 1 (the decay's length), got {self.lr_cooldown_epochs}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        if self.latency_budget_ms <= 0:
            raise ValueError("latency_budget_ms must be > 0")
        if self.val_batch_size < 1:
            raise ValueError("val_batch_size must be >= 1")
        if self.train_accuracy_samples < 1:
            raise ValueError(f"train_accuracy_samples must be >= 1, got {self.train_accuracy_samples}")
        if self.amp not in AMP_CHOICES:
            raise ValueError(f"amp must be one of {AMP_CHOICES}, got {self.amp!r}")

    def lr_factor(self, epoch: int, total_epochs: int | None) -> float:
        """The schedule's multiple of each group's base rate in ``epoch`` (0-based) of ``total_epochs``.

        Raises:
            ValueError: ``cosine`` or ``cooldown`` without the run's length.
        """
        if self.lr_schedule == "constant":
            return 1.0
        if total_epochs is None:
            raise ValueError(
                f"lr_schedule {self.lr_schedule!r} needs the run's length: pass total_epochs to the Trainer"
            )
        if self.lr_schedule == "cooldown":
            # Epoch total - k + j (j = 0..k-1) runs at 1 - (1 - final) (j + 1) / k: the last at final.
            into = min(epoch, total_epochs - 1) - (total_epochs - self.lr_cooldown_epochs) + 1
            return 1.0 - (1.0 - self.lr_final_factor) * max(0, into) / self.lr_cooldown_epochs
        if total_epochs <= 1:
            return 1.0
        progress = min(epoch, total_epochs - 1) / (total_epochs - 1)
        final = self.lr_final_factor
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))
