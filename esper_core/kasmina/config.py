"""Kasmina's configuration: lifecycle timing, gate thresholds, seed initialisation and the
isolation learning rate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from esper_core.contracts import BlendMode
from esper_core.kasmina import gates
from esper_core.kasmina.seed_init import SEED_INITS
from esper_core.kasmina.seed_lr import IsolationLRConfig
from esper_core.kasmina.width.init import WIDTH_INITS


@dataclass(kw_only=True, slots=True)
class KasminaConfig:
    """Lifecycle timing and gate thresholds."""

    min_training_epochs: int = 1
    """Epochs a seed trains in isolation before G3 may let it blend."""
    probation_epochs: int = 1
    """Epochs at full alpha before G4's verdict is final."""
    embargo_epochs: int = 1
    """Epochs a culled slot waits before it can be reused."""
    blend_mode: BlendMode = BlendMode.RESIDUAL
    """How seeds join the host activation."""
    gates: gates.GateConfig = field(default_factory=gates.GateConfig)
    seed_init: Literal["default", "gradmax"] = "gradmax"
    """How a germinated seed's weights start: ``gradmax`` (output layer zero, input rows along the
    top singular directions of the slot's gradient statistic; ``esper_core.kasmina.seed_init``), or
    ``default`` (the kernel's own: output layer zero, input layer random). Blueprints without
    ``Blueprint.gradmax`` layers keep their default under ``gradmax`` (an event says so). Measured
    on MNIST-1D (mnist1d-cnn, heuristic, 10 paired seeds): gradmax minus default +0.25 pt test
    accuracy, bootstrap 95 % CI [-0.42, +1.10]: not worse, not shown better."""
    seed_init_batches: int = 4
    """Training batches the ``gradmax`` statistic (and a width seed's ``width_init`` signals) are
    computed from, once, at germination."""
    isolation_lr: IsolationLRConfig = field(default_factory=IsolationLRConfig)
    """The seed's learning-rate factor, warm-up and decay while it trains in isolation."""
    blend_lr_warmup_epochs: int = 0
    """Blending epochs over which a seed's learning rate ramps up linearly: blending epoch
    ``t < blend_lr_warmup_epochs`` trains it at ``(t + 1) / (blend_lr_warmup_epochs + 1)`` of its
    rate. For seeds that join the host's training already trained: a depth seed's stacked copies
    take their source blocks' weights and optimizer moments and skip isolation, so without a
    warm-up their first blending steps are full-size steps along the source's momentum. A seed
    whose blending is shorter (a command's ``blend_epochs``) skips the rest of the ramp: it is at
    its full rate from PROBATIONARY on. 0: the full rate from the first blending epoch (what the
    depth benchmarks so far measured)."""
    width_init: Literal["random", "gradmax", "tiny"] = "tiny"
    """How a width seed's new units start (``esper_core.kasmina.width.init``): ``tiny`` (the
    least-squares direction of the layer's expressivity bottleneck), ``gradmax`` (zero fan-in,
    fan-out along the gradient's top singular directions) or ``random`` (random fan-in, zero
    fan-out). Each starts the network unchanged (``tiny`` behind a BatchNorm/GroupNorm by the
    norm's new weight at 0); a run whose layers cannot start so under it is refused when planned.
    On mnist1d-cnn, widened x1.5 at epoch 15 of 60 (``bench/width.py``, 40 paired
    seeds), grown minus static x1.5: tiny -0.21 pt [-0.94, +0.51], random -0.75 [-1.50, -0.01];
    gradmax (20 seeds) -3.10."""
    width_max_factor: float = 2.0
    """A width seed may add at most ``(width_max_factor - 1) x`` a layer's current units at once
    (2.0: at most double it); G0 refuses more."""
    max_params: int | None = None
    """A cap on growth: the network (host and every seed) may hold at most this many parameters.
    A germination that would pass it is undone and rejected (``kasmina.command.rejected``, the
    run goes on without it); None: no cap but the risk engine's budget. ``esper run --max-params``."""
    max_flops: int | None = None
    """A cap on growth in compute: one sample's forward pass through the network, every seed it
    holds at full weight, may cost at most this many FLOPs (``tolaria.flops.forward_flops``: 2 a
    multiply-add). A germination that would pass it is undone and rejected, as for
    ``max_params``; None: no cap. ``esper run --max-flops``."""

    def __post_init__(self) -> None:
        for name in ("min_training_epochs", "probation_epochs", "embargo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 epoch, got {getattr(self, name)}")
        if self.seed_init not in SEED_INITS:
            raise ValueError(f"seed_init must be one of {SEED_INITS}, got {self.seed_init!r}")
        if self.width_init not in WIDTH_INITS:
            raise ValueError(f"width_init must be one of {WIDTH_INITS}, got {self.width_init!r}")
        if not self.width_max_factor > 1.0:
            raise ValueError(
                f"width_max_factor must be > 1 (2.0 lets a width seed double a layer), got {self.width_max_factor}"
            )
        if self.max_params is not None and self.max_params < 1:
            raise ValueError(
                f"max_params must be a positive parameter count (or None for no cap), got {self.max_params}"
            )
        if self.max_flops is not None and self.max_flops < 1:
            raise ValueError(
                f"max_flops must be a positive FLOP count per sample (or None for no cap), got {self.max_flops}"
            )
        if self.seed_init_batches < 1:
            raise ValueError(
                f"seed_init_batches must be >= 1 (the gradmax statistic needs a batch), got {self.seed_init_batches}"
            )
        if self.blend_lr_warmup_epochs < 0:
            raise ValueError(f"blend_lr_warmup_epochs must be >= 0 (0: no warm-up), got {self.blend_lr_warmup_epochs}")
        if self.isolation_lr.epochs is None:
            self.isolation_lr.check_length(self.min_training_epochs, source="min_training_epochs")
