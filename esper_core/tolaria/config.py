"""Tolaria's configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from esper_core._capabilities import DEVICE_CHOICES
from esper_core.tolaria.aggregation import AggregationConfig
from esper_core.tolaria.precision import AMP_CHOICES
from esper_core.tolaria.safety import SafetyConfig
from esper_core.tolaria.staging import LoaderConfig
from esper_core.tolaria.step import StepEngineConfig

OPTIMIZERS = ("sgd", "adam")


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """Optimiser, device and budgets of the training loop."""

    optimizer: str = "sgd"
    """``sgd`` (with ``momentum``) or ``adam``; seeds join it in their own parameter groups."""
    lr: float = 0.05
    """Learning rate of the host; seeds get ``lr * lr_scale`` of their command."""
    momentum: float = 0.9
    weight_decay: float = 0.0
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``."""
    latency_budget_ms: float = 18.0
    """p95 budget of the training part of an epoch (seed 001); reported against, not enforced."""
    val_batch_size: int = 512
    """Validation runs in batches of this size under ``torch.inference_mode()``."""
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
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        if self.latency_budget_ms <= 0:
            raise ValueError("latency_budget_ms must be > 0")
        if self.val_batch_size < 1:
            raise ValueError("val_batch_size must be >= 1")
        if self.amp not in AMP_CHOICES:
            raise ValueError(f"amp must be one of {AMP_CHOICES}, got {self.amp!r}")
