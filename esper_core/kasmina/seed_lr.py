"""A seed's learning-rate schedule while it trains in isolation (the TRAINING stage).

In TRAINING the seed learns on the host's activations while the host's output is unchanged, so
its rate can differ from the one it gets once blended: ``IsolationLRConfig`` gives it its own
factor, an optional linear warm-up and a cosine decay over the isolation epochs. The factor
multiplies the seed's rate in the later stages (the host's ``lr`` times its command's
``lr_scale``, under Tolaria's run schedule); ``SeedParamGroups.set_factor`` applies it once per
epoch, and it returns to 1 when the seed starts blending.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ISOLATION_LR_SCHEDULES = ("constant", "cosine")


@dataclass(kw_only=True, slots=True)
class IsolationLRConfig:
    """The learning-rate factor of a seed in TRAINING, per isolation epoch."""

    factor: float = 1.0
    """Peak factor on the seed's rate while it trains in isolation (1: the same rate as later)."""
    warmup_epochs: int = 0
    """Isolation epochs of linear warm-up: epoch ``t < warmup_epochs`` gets ``factor * (t + 1) /
    (warmup_epochs + 1)``."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: ``constant`` (``factor``), or ``cosine`` (half a cosine from ``factor``
    down to ``factor * final_factor`` at the last isolation epoch)."""
    final_factor: float = 1.0
    """The cosine's last value as a fraction of ``factor``, in (0, 1]."""
    epochs: int | None = None
    """Isolation epochs the schedule spans; None: ``KasminaConfig.min_training_epochs``. A seed
    the gates keep in TRAINING longer stays at the last value."""

    def __post_init__(self) -> None:
        if not 0.0 < self.factor < math.inf:
            raise ValueError(f"isolation_lr.factor must be a finite number > 0 (1 = unchanged), got {self.factor}")
        if self.warmup_epochs < 0:
            raise ValueError(f"isolation_lr.warmup_epochs must be >= 0 (0 = no warm-up), got {self.warmup_epochs}")
        if self.schedule not in ISOLATION_LR_SCHEDULES:
            raise ValueError(f"isolation_lr.schedule must be one of {ISOLATION_LR_SCHEDULES}, got {self.schedule!r}")
        if not 0.0 < self.final_factor <= 1.0:
            raise ValueError(
                f"isolation_lr.final_factor must lie in (0, 1] (a fraction of factor; 0 would stop the seed), "
                f"got {self.final_factor}"
            )
        if self.epochs is not None:
            self.check_length(self.epochs, source="isolation_lr.epochs")

    def check_length(self, length: int, *, source: str) -> None:
        """Raise unless the schedule fits ``length`` isolation epochs (named ``source`` in the error)."""
        if length < 1:
            raise ValueError(f"{source} must be >= 1 epoch, got {length}")
        if self.warmup_epochs >= length:
            raise ValueError(
                f"isolation_lr.warmup_epochs ({self.warmup_epochs}) must be shorter than the isolation "
                f"({source} = {length}): lower warmup_epochs or lengthen the isolation"
            )

    def factor_at(self, epoch: int, length: int) -> float:
        """The factor in isolation epoch ``epoch`` (0-based) of a ``length``-epoch isolation.

        Args:
            epoch: Completed TRAINING epochs of the seed.
            length: The isolation's planned length (``epochs`` or ``min_training_epochs``).

        Returns:
            The multiple of the seed's post-isolation rate.
        """
        length = self.epochs or length
        if epoch < self.warmup_epochs:
            return self.factor * (epoch + 1) / (self.warmup_epochs + 1)
        span = length - self.warmup_epochs
        if self.schedule == "constant" or span <= 1:
            return self.factor
        progress = min(epoch - self.warmup_epochs, span - 1) / (span - 1)
        final = self.final_factor
        return self.factor * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress)))
