"""Leyline enums: the vocabulary every subsystem speaks.

Values are lower-case strings so that JSON, SQL rows and Prometheus labels carry readable names.
"""

from __future__ import annotations

from enum import StrEnum


class SeedStage(StrEnum):
    """Lifecycle stage of a seed slot (DESIGN.md "Seed lifecycle")."""

    DORMANT = "dormant"
    GERMINATED = "germinated"
    TRAINING = "training"
    BLENDING = "blending"
    PROBATIONARY = "probationary"
    FOSSILIZED = "fossilized"
    CULLED = "culled"
    EMBARGOED = "embargoed"

    @property
    def is_active(self) -> bool:
        """True while the slot holds a seed module that takes part in forward passes."""
        return self in _ACTIVE_STAGES


_ACTIVE_STAGES = frozenset(
    {
        SeedStage.GERMINATED,
        SeedStage.TRAINING,
        SeedStage.BLENDING,
        SeedStage.PROBATIONARY,
        SeedStage.FOSSILIZED,
    }
)


class GateId(StrEnum):
    """The lifecycle gates; each verdict is a telemetry event named ``kasmina.gate.<id>``."""

    G0_SANITY = "g0_sanity"
    G1_GRADIENT_HEALTH = "g1_gradient_health"
    G2_STABILITY = "g2_stability"
    G3_INTERFACE = "g3_interface"
    G4_SYSTEM_IMPACT = "g4_system_impact"
    G5_RESET = "g5_reset"


class CommandType(StrEnum):
    """What an adaptation command asks for."""

    WAIT = "wait"
    SEED = "seed"
    OPTIMIZER = "optimizer"
    PAUSE = "pause"


class SeedOperation(StrEnum):
    """The operation of a ``CommandType.SEED`` command."""

    GERMINATE = "germinate"
    ADVANCE = "advance"
    FOSSILIZE = "fossilize"
    CULL = "cull"


class HealthStatus(StrEnum):
    """Health carried by every telemetry packet."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    CRITICAL = "critical"


class TelemetryLevel(StrEnum):
    """Severity of a telemetry event."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class BlueprintTier(StrEnum):
    """Karn tier: how much trust a blueprint has earned."""

    SAFE = "safe"
    EXPERIMENTAL = "experimental"
    HIGH_RISK = "high_risk"


class ArtifactStatus(StrEnum):
    """Urza status of a published kernel artifact."""

    ACTIVE = "active"
    QUARANTINED = "quarantined"
    RETIRED = "retired"


class ArtifactKind(StrEnum):
    """How an artifact's blob is loaded: an exported program, or eager weights (fallback)."""

    EXPORTED = "exported"
    EAGER = "eager"


class BlendSchedule(StrEnum):
    """Shape of the alpha ramp during BLENDING."""

    LINEAR = "linear"
    COSINE = "cosine"


class BlendMode(StrEnum):
    """How a seed's output joins the host's activation.

    RESIDUAL: ``y = x + alpha * seed(x)``; CONVEX: ``y = (1 - alpha) * x + alpha * seed(x)``.
    """

    RESIDUAL = "residual"
    CONVEX = "convex"


class Outcome(StrEnum):
    """Outcome of a command once its observation window closed (field reports)."""

    SUCCESS = "success"
    NEUTRAL = "neutral"
    REGRESSION = "regression"


class LayerKind(StrEnum):
    """What a host layer computes, in words that mean the same on every architecture.

    Tamiyo's graph reads it instead of the layer's name, so a policy trained on one family of
    hosts can read another. Tolaria derives it from the module's type where it builds the packet
    (``esper_core.tolaria.layers.layer_kind``).
    """

    LINEAR = "linear"
    CONV1D = "conv1d"
    CONV2D = "conv2d"
    ATTENTION = "attention"
    """A projection of an attention or transformer block (``nn.MultiheadAttention``'s, a torch
    transformer layer's, or one inside a module whose class name says attention)."""
    RECURRENT = "recurrent"
    NORM = "norm"
    EMBEDDING = "embedding"
    OTHER = "other"


class SlotKind(StrEnum):
    """How a slot grows the host; the names of ``esper_core.kasmina.kinds.SeedKind``.

    BRANCH adds a compiled block beside a module's output, WIDTH adds units to a layer, DEPTH (issue
    36) inserts a new block, initialised to the identity, after a layer. Tamiyo's graph and action
    space carry all three, so the stored policy's format does not change when a kind arrives.
    """

    BRANCH = "branch"
    WIDTH = "width"
    DEPTH = "depth"
