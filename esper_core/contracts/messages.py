"""Leyline messages: the typed records that cross subsystem (and process) boundaries.

Every message is an immutable pydantic model: it is validated on construction, rejects unknown
fields, and round-trips losslessly through JSON (``to_json`` / ``from_json``). Messages carry
plain numbers and strings, never tensors, so they can be logged, stored in SQL and passed between
Prefect tasks.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from esper_core.contracts.enums import (
    ArtifactKind,
    ArtifactStatus,
    BlendMode,
    BlendSchedule,
    BlueprintTier,
    CommandType,
    GateId,
    HealthStatus,
    LayerKind,
    Outcome,
    SeedOperation,
    SeedStage,
    SlotKind,
    TelemetryLevel,
)

Scalar = float | int | str | bool


def new_id() -> str:
    """A fresh random identifier (hex UUID4)."""
    return uuid.uuid4().hex


class Message(BaseModel):
    """Base of all Leyline messages: frozen, strict about unknown fields, JSON round-trip."""

    # NaN/Infinity are written as JSON constants (not null) so a diverged loss still round-trips.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    def to_json(self) -> str:
        """Serialise to a JSON string that ``from_json`` reads back to an equal message."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Parse and validate a message produced by ``to_json``."""
        return cls.model_validate_json(text)


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


# --------------------------------------------------------------------------- blueprints


class ParamBound(Message):
    """Allowed range of one blueprint parameter."""

    low: float
    high: float
    default: float
    integer: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.low <= self.default <= self.high:
            raise ValueError(
                f"bound default {self.default} must lie in [{self.low}, {self.high}]: "
                "fix the blueprint's parameter bounds"
            )
        return self


class BlueprintDescriptor(Message):
    """A Karn blueprint as the rest of the system sees it (no builder code).

    ``version`` counts changes of the function a blueprint computes under a stable id. Karn
    puts a version above 1 into the blueprint's resolved parameters (``blueprint_version``), so
    artifacts compiled from an older function have another parameter key in Urza and are not
    served for the new one. It defaults to 1, so descriptors stored before it existed still load.
    """

    blueprint_id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    name: str = Field(min_length=1)
    tier: BlueprintTier
    host_kinds: tuple[str, ...] = Field(min_length=1)
    description: str
    risk: float = Field(ge=0.0, le=1.0)
    param_bounds: dict[str, ParamBound] = Field(default_factory=dict)
    version: int = Field(default=1, ge=1)


# --------------------------------------------------------------------------- artifacts


class GuardSchema(Message):
    """Input/output contract of a compiled kernel: shapes apart from a dynamic batch dimension.

    A tensor is accepted when its shape is ``(batch, *feature_shape)`` with
    ``batch_min <= batch <= batch_max`` and its dtype is ``dtype``. A token kernel (``length_min``
    set) also accepts a shorter sequence: ``(batch, length, *feature_shape[1:])`` with
    ``length_min <= length <= feature_shape[0]``.
    """

    feature_shape: tuple[int, ...] = Field(min_length=1)
    output_feature_shape: tuple[int, ...] = Field(min_length=1)
    dtype: str = "float32"
    batch_min: int = Field(default=1, ge=1)
    batch_max: int = Field(ge=1)
    length_min: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.batch_min > self.batch_max:
            raise ValueError(
                f"batch_min {self.batch_min} exceeds batch_max {self.batch_max}: declare a batch range with min <= max"
            )
        if any(d <= 0 for d in self.feature_shape + self.output_feature_shape):
            raise ValueError("feature dimensions must be positive integers")
        if self.length_min is not None and self.length_min > self.feature_shape[0]:
            raise ValueError(
                f"length_min {self.length_min} exceeds the longest sequence {self.feature_shape[0]}: "
                "declare a length range with min <= feature_shape[0]"
            )
        return self

    def accepts_features(self, feature_shape: tuple[int, ...]) -> bool:
        """Whether a per-sample shape fits: equal, or a token sequence within the length range."""
        if tuple(feature_shape) == self.feature_shape:
            return True
        return (
            self.length_min is not None
            and len(feature_shape) == len(self.feature_shape)
            and tuple(feature_shape[1:]) == self.feature_shape[1:]
            and self.length_min <= feature_shape[0] <= self.feature_shape[0]
        )

    def describe(self) -> str:
        """Human-readable shape, e.g. ``(batch 1..512, 64) float32`` or, for tokens,
        ``(batch 1..512, length 1..64, 32) float32``."""
        dims = [str(d) for d in self.feature_shape]
        if self.length_min is not None:
            dims[0] = f"length {self.length_min}..{self.feature_shape[0]}"
        return f"(batch {self.batch_min}..{self.batch_max}, {', '.join(dims)}) {self.dtype}"


class LatencyStats(Message):
    """Latency distribution in milliseconds over ``samples`` timed calls."""

    p50_ms: float = Field(ge=0.0)
    p95_ms: float = Field(ge=0.0)
    max_ms: float = Field(ge=0.0)
    samples: int = Field(ge=1)


class EnvironmentKey(Message):
    """Where a compiled artifact is valid: torch version, device kind, compiler."""

    torch_version: str = Field(min_length=1)
    device_kind: str = Field(pattern=r"^(cpu|cuda)$")
    compiler: str = Field(min_length=1)


class KernelArtifact(Message):
    """Descriptor of a compiled (or fallback) blueprint kernel stored in Urza."""

    blueprint_id: str
    shape_profile: str = Field(min_length=1)
    params: dict[str, float] = Field(default_factory=dict)
    environment: EnvironmentKey
    kind: ArtifactKind
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=1)
    guard: GuardSchema
    latency: dict[str, LatencyStats] = Field(default_factory=dict)
    fallback: bool = False
    fallback_reason: str | None = None
    status: ArtifactStatus = ArtifactStatus.ACTIVE
    status_reason: str | None = None
    compile_ms: float = Field(default=0.0, ge=0.0)
    version: int = Field(default=0, ge=0)
    artifact_id: int | None = None
    signature: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """HMAC-SHA256 (hex) over the blob and descriptor (``esper_core.urza.signing``); None: unsigned."""
    signature_key_id: str | None = None
    """Id of the key that made ``signature`` (keys rotate)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.fallback != (self.kind is ArtifactKind.EAGER):
            raise ValueError("fallback must be True exactly when kind is 'eager'")
        if self.fallback and not self.fallback_reason:
            raise ValueError("a fallback artifact must say why in fallback_reason")
        return self


# --------------------------------------------------------------------------- training state


class GateVerdict(Message):
    """Result of one gate check, with the quantities it looked at."""

    gate: GateId
    passed: bool
    reason: str
    measured: dict[str, float] = Field(default_factory=dict)


class SeedState(Message):
    """Kasmina's export of one seed slot at the end of an epoch.

    ``layer`` names the host layer whose input activation the slot transforms; ``shape_profile`` is the
    Karn profile name of that activation (artifacts must match it). ``metrics`` keys written by
    Kasmina: ``grad_norm``, ``samples``, ``val_loss_with_seed``, ``val_loss_without_seed``.

    ``activation_grad_norm`` is Tolaria's bottleneck signal at the slot, measured in the stages
    where the slot can act (DORMANT and seeds in flight): the root-mean-square over a probe batch
    of each sample's norm of the loss gradient with respect to the activation leaving the slot.
    None where it was not measured (nobody reads it in the run, a FOSSILIZED, CULLED or EMBARGOED
    slot, packets recorded before it existed, or a non-finite value).
    """

    slot_id: str = Field(min_length=1)
    layer: str = Field(min_length=1)
    shape_profile: str = Field(min_length=1)
    stage: SeedStage
    kind: SlotKind | None = None
    """How the slot grows the host (None in packets recorded before it was reported)."""
    blueprint_id: str | None = None
    artifact_sha256: str | None = None
    alpha: float = Field(default=0.0, ge=0.0, le=1.0)
    blend_mode: BlendMode = BlendMode.RESIDUAL
    age_epochs: int = Field(default=0, ge=0)
    epochs_in_stage: int = Field(default=0, ge=0)
    param_count: int = Field(default=0, ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    last_gate: GateVerdict | None = None
    activation_grad_norm: float | None = Field(default=None, ge=0.0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.stage.is_active and self.blueprint_id is None:
            raise ValueError(f"slot {self.slot_id} is {self.stage.value} but names no blueprint")
        return self


class LayerState(Message):
    """Statistics and shape of one host layer over the epoch.

    The shape fields describe the layer in terms that mean the same on every architecture (what
    Tamiyo's graph reads instead of the layer's name). Each is None where it was not measured:
    packets recorded before it was reported, or, for ``flops_per_sample``, a layer no validation
    batch ran through.

    Attributes:
        kind: What the layer computes (``LayerKind``).
        fan_in: Inputs each output unit reads (``weight[0].numel()``: in features, or in
            channels per group times the kernel's size).
        fan_out: Outputs each input unit feeds (out units times the kernel's size).
        params: The layer's own parameters (weight and bias).
        flops_per_sample: Forward multiply-adds times two for one sample through the layer's weight
            (over every position of a conv map or token sequence); 0 for a lookup (embedding).
    """

    name: str = Field(min_length=1)
    width: int = Field(ge=1)
    activation_mean: float = 0.0
    activation_std: float = 0.0
    grad_norm: float = 0.0
    kind: LayerKind | None = None
    fan_in: int | None = Field(default=None, ge=1)
    fan_out: int | None = Field(default=None, ge=1)
    params: int | None = Field(default=None, ge=0)
    flops_per_sample: int | None = Field(default=None, ge=0)


class SystemStatePacket(Message):
    """Everything Tamiyo sees about the run at the end of one epoch.

    ``train_accuracy`` is the share of a fixed sample of training signals (the first 512) the
    model classifies correctly at the end of the epoch (packets recorded before 2026-11-24 counted
    it during the epoch's steps instead); None when the targets are not class indices, when
    nobody reads it in the run, and in packets recorded before it existed.

    ``classifies`` says whether ``val_accuracy`` means anything: True for class targets; False
    for any other (a language model's token targets, real-valued targets), whose accuracy reads 0
    and whose score is ``val_loss`` (packets recorded before 2026-11-28 say True).
    """

    run_id: str = Field(min_length=1)
    epoch: int = Field(ge=0)
    train_loss: float
    val_loss: float
    val_accuracy: float = Field(ge=0.0, le=1.0)
    classifies: bool = True
    train_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    learning_rate: float = Field(gt=0.0)
    epoch_latency_ms: float = Field(ge=0.0)
    latency_budget_ms: float = Field(gt=0.0)
    host_params: int = Field(ge=0)
    layers: tuple[LayerState, ...] = ()
    seeds: tuple[SeedState, ...] = ()
    timestamp: float = Field(default_factory=time.time)

    @field_validator("train_loss", "val_loss")
    @classmethod
    def _finite_loss(cls, v: float) -> float:
        return _finite("loss", v)

    def seed(self, slot_id: str) -> SeedState:
        """The state of slot ``slot_id``; raises ``KeyError`` naming the known slots."""
        for state in self.seeds:
            if state.slot_id == slot_id:
                return state
        raise KeyError(f"no slot {slot_id!r}; known slots: {[s.slot_id for s in self.seeds]}")


# --------------------------------------------------------------------------- commands


class AdaptationCommand(Message):
    """A decision of Tamiyo, carried out by Kasmina / Tolaria."""

    command_id: str = Field(default_factory=new_id)
    run_id: str = Field(min_length=1)
    epoch: int = Field(ge=0)
    command_type: CommandType
    seed_operation: SeedOperation | None = None
    slot_id: str | None = None
    blueprint_id: str | None = None
    parameters: dict[str, float] = Field(default_factory=dict)
    blend_schedule: BlendSchedule = BlendSchedule.LINEAR
    blend_epochs: int = Field(default=3, ge=1)
    lr_scale: float = Field(default=1.0, gt=0.0)
    issued_by: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    risk_rule: str | None = None
    scores: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Self:
        is_seed = self.command_type is CommandType.SEED
        if is_seed != (self.seed_operation is not None):
            raise ValueError("seed_operation is required for, and only for, SEED commands")
        if is_seed and self.slot_id is None:
            raise ValueError(f"{self.seed_operation} command needs a slot_id")
        if self.seed_operation is SeedOperation.GERMINATE and self.blueprint_id is None:
            raise ValueError("germinate command needs a blueprint_id")
        return self

    @property
    def action(self) -> str:
        """Flat action name: ``wait``, ``germinate``, ..., ``optimizer``, ``pause``."""
        if self.seed_operation is not None:
            return self.seed_operation.value
        return self.command_type.value


class FieldReport(Message):
    """What happened after a command, once its observation window closed."""

    report_id: str = Field(default_factory=new_id)
    run_id: str
    command: AdaptationCommand
    outcome: Outcome
    observation_epochs: int = Field(ge=1)
    metric_deltas: dict[str, float] = Field(default_factory=dict)
    timestamp: float = Field(default_factory=time.time)


# --------------------------------------------------------------------------- telemetry


class MetricPoint(Message):
    """One metric sample; ``name`` follows ``subsystem.area.name``."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
    value: float
    unit: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class TelemetryEvent(Message):
    """A discrete event (gate verdict, fallback, timeout, ...)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
    level: TelemetryLevel = TelemetryLevel.INFO
    message: str = ""
    attributes: dict[str, Scalar] = Field(default_factory=dict)
    timestamp: float = Field(default_factory=time.time)


class TelemetryPacket(Message):
    """Metrics, events and health emitted by one unit of work."""

    packet_id: str = Field(default_factory=new_id)
    source: str = Field(min_length=1)
    run_id: str | None = None
    epoch: int | None = None
    metrics: tuple[MetricPoint, ...] = ()
    events: tuple[TelemetryEvent, ...] = ()
    health: HealthStatus = HealthStatus.HEALTHY
    health_reason: str = ""
    timestamp: float = Field(default_factory=time.time)

    def metric(self, name: str, **labels: str) -> float:
        """Value of the metric ``name`` with exactly ``labels``; ``KeyError`` if absent."""
        for point in self.metrics:
            if point.name == name and point.labels == labels:
                return point.value
        raise KeyError(f"packet from {self.source} has no metric {name} {labels or ''}".strip())
