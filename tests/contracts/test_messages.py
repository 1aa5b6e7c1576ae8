"""Leyline messages validate on construction and round-trip losslessly through JSON."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from esper_core.contracts import (
    AdaptationCommand,
    ArtifactKind,
    BlueprintDescriptor,
    BlueprintTier,
    CommandType,
    EnvironmentKey,
    FieldReport,
    GateId,
    GateVerdict,
    GuardSchema,
    KernelArtifact,
    LatencyStats,
    LayerState,
    MetricPoint,
    Outcome,
    ParamBound,
    SeedOperation,
    SeedStage,
    SeedState,
    SystemStatePacket,
    TelemetryEvent,
    TelemetryPacket,
)

SHA = "ab" * 32


def _artifact(**overrides: object) -> KernelArtifact:
    fields = dict(
        blueprint_id="residual_mlp",
        shape_profile="f64-b512",
        params={"expansion": 2.0},
        environment=EnvironmentKey(torch_version="2.13.0", device_kind="cpu", compiler="torch.export"),
        kind=ArtifactKind.EXPORTED,
        sha256=SHA,
        size_bytes=100,
        guard=GuardSchema(feature_shape=(64,), output_feature_shape=(64,), batch_max=512),
        latency={"b8": LatencyStats(p50_ms=0.1, p95_ms=0.2, max_ms=0.3, samples=20)},
    )
    fields.update(overrides)
    return KernelArtifact(**fields)  # type: ignore[arg-type]


def _packet() -> SystemStatePacket:
    seed = SeedState(
        slot_id="slot1",
        layer="fc1",
        shape_profile="f64-b512",
        stage=SeedStage.TRAINING,
        blueprint_id="residual_mlp",
        alpha=0.0,
        metrics={"grad_norm": 0.5},
        last_gate=GateVerdict(gate=GateId.G1_GRADIENT_HEALTH, passed=True, reason="ok", measured={"grad_norm": 0.5}),
    )
    return SystemStatePacket(
        run_id="r",
        epoch=3,
        train_loss=0.5,
        val_loss=0.6,
        val_accuracy=0.8,
        learning_rate=0.05,
        epoch_latency_ms=12.0,
        latency_budget_ms=18.0,
        host_params=1000,
        layers=(LayerState(name="fc1", width=64, grad_norm=0.1),),
        seeds=(seed,),
    )


def _command() -> AdaptationCommand:
    return AdaptationCommand(
        run_id="r",
        epoch=3,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.GERMINATE,
        slot_id="slot1",
        blueprint_id="residual_mlp",
        issued_by="heuristic",
        reason="plateau",
    )


@pytest.mark.parametrize(
    "message",
    [
        BlueprintDescriptor(
            blueprint_id="residual_mlp",
            name="Residual MLP",
            tier=BlueprintTier.SAFE,
            host_kinds=("mlp",),
            description="d",
            risk=0.1,
            param_bounds={"expansion": ParamBound(low=1, high=4, default=2, integer=True)},
        ),
        _artifact(),
        _packet(),
        _command(),
        FieldReport(
            run_id="r",
            command=_command(),
            outcome=Outcome.SUCCESS,
            observation_epochs=2,
            metric_deltas={"val_loss": -0.1},
        ),
        TelemetryPacket(
            source="tolaria",
            metrics=(MetricPoint(name="tolaria.training.latency_ms", value=1.5, labels={"slot": "a"}),),
            events=(TelemetryEvent(name="kasmina.gate.g0_sanity", attributes={"passed": True, "n": 3}),),
        ),
    ],
    ids=lambda m: type(m).__name__,
)
def test_json_round_trip_is_lossless(message: object) -> None:
    text = message.to_json()  # type: ignore[attr-defined]
    assert type(message).from_json(text) == message  # type: ignore[attr-defined]


def test_nan_metric_survives_json() -> None:
    point = MetricPoint(name="tolaria.training.loss", value=float("nan"))
    assert math.isnan(MetricPoint.from_json(point.to_json()).value)


def test_germinate_without_blueprint_is_refused() -> None:
    with pytest.raises(ValidationError, match="germinate command needs a blueprint_id"):
        AdaptationCommand(
            run_id="r",
            epoch=0,
            command_type=CommandType.SEED,
            seed_operation=SeedOperation.GERMINATE,
            slot_id="slot1",
            issued_by="t",
            reason="x",
        )


def test_seed_operation_only_on_seed_commands() -> None:
    with pytest.raises(ValidationError, match="seed_operation is required for, and only for, SEED"):
        AdaptationCommand(
            run_id="r",
            epoch=0,
            command_type=CommandType.WAIT,
            seed_operation=SeedOperation.CULL,
            issued_by="t",
            reason="x",
        )


def test_active_seed_must_name_its_blueprint() -> None:
    with pytest.raises(ValidationError, match="names no blueprint"):
        SeedState(slot_id="s", layer="fc1", shape_profile="f4-b8", stage=SeedStage.BLENDING)


def test_guard_batch_range_and_fallback_rules() -> None:
    with pytest.raises(ValidationError, match="batch_min 9 exceeds batch_max 8"):
        GuardSchema(feature_shape=(4,), output_feature_shape=(4,), batch_min=9, batch_max=8)
    with pytest.raises(ValidationError, match="fallback must be True exactly when kind is 'eager'"):
        _artifact(kind=ArtifactKind.EAGER)
    with pytest.raises(ValidationError, match="must say why"):
        _artifact(kind=ArtifactKind.EAGER, fallback=True)


def test_unknown_fields_and_non_finite_losses_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TelemetryPacket(source="x", bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="loss must be a finite number"):
        _packet().model_copy(update={}).__class__(**{**_packet().model_dump(), "val_loss": float("inf")})


def test_metric_names_follow_the_pattern() -> None:
    with pytest.raises(ValidationError):
        MetricPoint(name="Tolaria latency", value=1.0)


def test_packet_lookup_helpers_name_what_is_missing() -> None:
    assert _packet().seed("slot1").stage is SeedStage.TRAINING
    with pytest.raises(KeyError, match="known slots"):
        _packet().seed("slot9")
    with pytest.raises(KeyError, match="no metric"):
        TelemetryPacket(source="x").metric("a.b")
