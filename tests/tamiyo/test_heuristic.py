"""Tamiyo's rule-based policy: each rule fires on a constructed history and says why."""

from __future__ import annotations

import pytest

from esper_core.contracts import (
    AdaptationCommand,
    BlendSchedule,
    BlueprintDescriptor,
    BlueprintTier,
    CommandType,
    GateId,
    GateVerdict,
    LayerState,
    SeedOperation,
    SeedStage,
    SeedState,
    SystemStatePacket,
)
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.heuristic import HeuristicConfig, HeuristicPolicy

LAYERS = (
    LayerState(name="fc1", width=32, grad_norm=0.2),
    LayerState(name="fc2", width=64, grad_norm=0.9),
    LayerState(name="fc3", width=64, grad_norm=0.4),
)


def _dormant(slot_id: str, layer: str, profile: str = "w64") -> SeedState:
    return SeedState(slot_id=slot_id, layer=layer, shape_profile=profile, stage=SeedStage.DORMANT)


def _seed(slot_id: str, stage: SeedStage, gate: GateVerdict | None = None) -> SeedState:
    return SeedState(
        slot_id=slot_id,
        layer="fc2",
        shape_profile="w64",
        stage=stage,
        blueprint_id="mlp-small",
        epochs_in_stage=2,
        last_gate=gate,
    )


def _history(
    val_losses: list[float], seeds: tuple[SeedState, ...], layers: tuple[LayerState, ...] = LAYERS
) -> list[SystemStatePacket]:
    return [
        SystemStatePacket(
            run_id="run",
            epoch=epoch,
            train_loss=loss,
            val_loss=loss,
            val_accuracy=0.5,
            learning_rate=0.01,
            epoch_latency_ms=10.0,
            latency_budget_ms=18.0,
            host_params=1000,
            layers=layers,
            seeds=seeds,
        )
        for epoch, loss in enumerate(val_losses)
    ]


def _candidate(
    blueprint_id: str,
    *,
    tier: BlueprintTier = BlueprintTier.SAFE,
    risk: float = 0.2,
    latency: float = 1.0,
    params: int = 1000,
    profiles: frozenset[str] = frozenset({"w32", "w64"}),
) -> BlueprintCandidate:
    return BlueprintCandidate(
        descriptor=BlueprintDescriptor(
            blueprint_id=blueprint_id,
            name=blueprint_id,
            tier=tier,
            host_kinds=("mlp",),
            description="test",
            risk=risk,
        ),
        shape_profiles=profiles,
        latency_p95_ms=latency,
        param_cost=params,
    )


CANDIDATES = [_candidate("mlp-small", risk=0.2)]
FALLING = [1.0, 0.8, 0.6]  # 40 % better over the last 2 epochs: no plateau
FLAT = [1.0, 0.8, 0.798, 0.797]  # 0.375 % better over the last 2 epochs: plateau


def _decide(
    history: list[SystemStatePacket],
    candidates: list[BlueprintCandidate] = CANDIDATES,
    **config: object,
) -> AdaptationCommand:
    policy = HeuristicPolicy(HeuristicConfig(**config))  # type: ignore[arg-type]
    command = policy.decide(history, candidates, run_id="run")
    assert command.issued_by == "heuristic"
    assert command.run_id == "run" and command.epoch == history[-1].epoch
    return command


def test_fossilizes_probationary_seed_that_passed_g4() -> None:
    gate = GateVerdict(
        gate=GateId.G4_SYSTEM_IMPACT,
        passed=True,
        reason="no regression",
        measured={"val_loss_with_seed": 0.41, "val_loss_without_seed": 0.45},
    )
    seeds = (_dormant("s0", "fc1"), _seed("s1", SeedStage.PROBATIONARY, gate))
    command = _decide(_history(FALLING, seeds))
    assert (command.command_type, command.seed_operation) == (
        CommandType.SEED,
        SeedOperation.FOSSILIZE,
    )
    assert command.slot_id == "s1"
    assert "g4_system_impact" in command.reason and "0.41" in command.reason and "0.45" in command.reason


def test_probationary_seed_with_a_passed_earlier_gate_is_not_fossilized() -> None:
    gate = GateVerdict(gate=GateId.G3_INTERFACE, passed=True, reason="ok")
    command = _decide(_history(FALLING, (_seed("s1", SeedStage.PROBATIONARY, gate),)))
    assert command.command_type is CommandType.WAIT


def test_culls_seed_whose_last_gate_failed() -> None:
    gate = GateVerdict(
        gate=GateId.G1_GRADIENT_HEALTH,
        passed=False,
        reason="gradient norm is zero",
        measured={"grad_norm": 0.0},
    )
    seeds = (_dormant("s0", "fc1"), _seed("s1", SeedStage.TRAINING, gate))
    command = _decide(_history(FLAT, seeds))
    assert (command.seed_operation, command.slot_id) == (SeedOperation.CULL, "s1")
    assert "g1_gradient_health" in command.reason and "gradient norm is zero" in command.reason
    assert "grad_norm=0" in command.reason


def test_fossilized_seed_with_failed_gate_is_not_culled() -> None:
    gate = GateVerdict(gate=GateId.G2_STABILITY, passed=False, reason="late wobble")
    command = _decide(_history(FALLING, (_seed("s1", SeedStage.FOSSILIZED, gate),)))
    assert command.command_type is CommandType.WAIT


def test_waits_while_a_seed_is_in_flight_even_on_a_plateau() -> None:
    seeds = (_dormant("s0", "fc1"), _seed("s1", SeedStage.BLENDING))
    command = _decide(_history(FLAT, seeds))
    assert command.command_type is CommandType.WAIT
    assert "1 seed(s) in flight" in command.reason and "max_active_seeds=1" in command.reason
    assert "s1 blending for 2 epoch(s)" in command.reason
    # Room for a second seed: the plateau now germinates.
    assert _decide(_history(FLAT, seeds), max_active_seeds=2).seed_operation is SeedOperation.GERMINATE


def test_germinates_on_plateau() -> None:
    # A seed has already been tried (now embargoed), so only the plateau can trigger.
    history = _history(FLAT, (_dormant("s0", "fc2"), _seed("s1", SeedStage.EMBARGOED)))
    command = _decide(history, blend_epochs=4, blend_schedule=BlendSchedule.COSINE)
    assert (command.seed_operation, command.slot_id, command.blueprint_id) == (
        SeedOperation.GERMINATE,
        "s0",
        "mlp-small",
    )
    assert command.parameters == {}
    assert (command.blend_epochs, command.blend_schedule) == (4, BlendSchedule.COSINE)
    # (0.8 - 0.797) / 0.8 = 0.375 % over the last 2 epochs, against the 1 % tolerance.
    assert "plateau" in command.reason and "0.38%" in command.reason
    assert "0.8 -> 0.797" in command.reason and "1.00%" in command.reason


def test_no_germination_when_loss_still_falls_after_a_seed_was_tried() -> None:
    history = _history(FALLING, (_dormant("s0", "fc2"), _seed("s1", SeedStage.EMBARGOED)))
    command = _decide(history)
    assert command.command_type is CommandType.WAIT
    assert "40.00%" in command.reason and "already germinated" in command.reason


def test_germinates_at_probe_epoch_without_plateau() -> None:
    seeds = (_dormant("s0", "fc2"),)
    early = _decide(_history([1.0], seeds), probe_epoch=1)
    assert early.command_type is CommandType.WAIT and "epoch 0 < probe_epoch 1" in early.reason
    command = _decide(_history([1.0, 0.5], seeds), probe_epoch=1)
    assert command.seed_operation is SeedOperation.GERMINATE
    assert "probe" in command.reason and "epoch 1 >= probe_epoch 1" in command.reason
    disabled = _decide(_history([1.0, 0.5], seeds), probe_epoch=None)
    assert disabled.command_type is CommandType.WAIT and "probe disabled" in disabled.reason


def test_grow_from_holds_plateaus_and_the_probe_until_its_share_of_the_run() -> None:
    """``grow_from=0.3`` of a 10-epoch run opens growth at epoch ceil(3.0) = 3: a plateau at epoch
    2 waits, the same plateau at epoch 3 germinates."""
    seeds = (_dormant("s0", "fc2"),)
    early = _history([1.0, 0.8, 0.799], seeds)  # a plateau at epoch 2 (0.125 % over one epoch)
    policy = HeuristicPolicy(HeuristicConfig(grow_from=0.3, plateau_window=1, probe_epoch=0))
    command = policy.decide(early, CANDIDATES, run_id="run", total_epochs=10)
    assert command.command_type is CommandType.WAIT
    assert "epoch 2 < 3: growth opens at grow_from=0.3 of the run's 10 epochs" in command.reason
    opened = policy.decide(_history([1.0, 0.8, 0.799, 0.798], seeds), CANDIDATES, run_id="run", total_epochs=10)
    assert opened.seed_operation is SeedOperation.GERMINATE and "plateau" in opened.reason
    # Open from the start when not set, so the same early plateau germinates.
    default = HeuristicPolicy(HeuristicConfig(plateau_window=1)).decide(
        early, CANDIDATES, run_id="run", total_epochs=10
    )
    assert default.seed_operation is SeedOperation.GERMINATE


def test_grow_from_opens_at_the_ceiling_of_its_share() -> None:
    # 0.25 of 10 epochs is 2.5: growth opens at epoch 3, not 2.
    seeds = (_dormant("s0", "fc2"),)
    policy = HeuristicPolicy(HeuristicConfig(grow_from=0.25, plateau_window=1))
    at_2 = policy.decide(_history([1.0, 0.8, 0.799], seeds), CANDIDATES, run_id="run", total_epochs=10)
    assert at_2.command_type is CommandType.WAIT and "epoch 2 < 3" in at_2.reason
    at_3 = policy.decide(_history([1.0, 0.8, 0.799, 0.798], seeds), CANDIDATES, run_id="run", total_epochs=10)
    assert at_3.seed_operation is SeedOperation.GERMINATE


def test_grow_from_needs_the_run_length() -> None:
    policy = HeuristicPolicy(HeuristicConfig(grow_from=0.3))
    with pytest.raises(ValueError, match="grow_from=0.3 is a share of the run: pass total_epochs"):
        policy.decide(_history(FLAT, (_dormant("s0", "fc2"),)), CANDIDATES, run_id="run")


def test_waits_when_no_safe_blueprint_fits() -> None:
    candidates = [
        _candidate("wrong-profile", profiles=frozenset({"w32"})),
        _candidate("too-risky", tier=BlueprintTier.EXPERIMENTAL, risk=0.05),
    ]
    command = _decide(_history(FLAT, (_dormant("s0", "fc2", "w64"),)), candidates)
    assert command.command_type is CommandType.WAIT
    assert "no SAFE blueprint among 2 candidate(s)" in command.reason and "w64" in command.reason


def test_chooses_highest_grad_norm_slot_and_lowest_risk_then_smallest_safe_blueprint() -> None:
    seeds = (
        _dormant("on-fc1", "fc1"),
        _dormant("on-fc2", "fc2"),  # host grad_norm 0.9: the largest
        _dormant("on-fc3", "fc3"),
        _seed("gone", SeedStage.CULLED),  # not dormant
    )
    candidates = [
        _candidate("safe-risky", risk=0.5),
        _candidate("experimental", tier=BlueprintTier.EXPERIMENTAL, risk=0.01),
        # Equal risk: fewest parameters wins, whatever the measured latency (it varies with load).
        _candidate("safe-big-fast", risk=0.1, latency=1.0, params=5000),
        _candidate("safe-small-slow", risk=0.1, latency=5.0, params=1000),
        _candidate("safe-small-slow-b", risk=0.1, latency=0.5, params=1000),
        _candidate("safe-other-profile", risk=0.0, profiles=frozenset({"w32"})),
    ]
    command = _decide(_history(FLAT, seeds), candidates)
    assert (command.slot_id, command.blueprint_id) == ("on-fc2", "safe-small-slow")
    assert "grad_norm 0.9" in command.reason and "risk 0.1" in command.reason
    assert "p95 5 ms" in command.reason


def test_a_preferred_blueprint_that_fits_wins_over_the_lowest_risk_and_the_rest_fall_back() -> None:
    seeds = (_dormant("on-fc2", "fc2", "w64"),)
    candidates = [
        _candidate("low-risk", risk=0.05),
        _candidate("double", risk=0.2),
        _candidate("half", risk=0.1),
        _candidate("elsewhere", risk=0.0, profiles=frozenset({"w32"})),
    ]
    command = _decide(_history(FLAT, seeds), candidates, prefer=("elsewhere", "double", "half"))
    # "elsewhere" does not fit w64; the first preferred entry that does is taken, not the safest.
    assert command.blueprint_id == "double" and "first preferred SAFE fit" in command.reason
    fallback = _decide(_history(FLAT, seeds), candidates, prefer=("elsewhere",))
    assert fallback.blueprint_id == "low-risk" and "lowest-risk SAFE fit" in fallback.reason


def test_prefer_is_a_tuple_of_distinct_ids() -> None:
    with pytest.raises(ValueError, match=r"write prefer=\('width-100',\)"):
        HeuristicConfig(prefer="width-100")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="twice"):
        HeuristicConfig(prefer=("width-50", "width-50"))


def test_skips_the_best_slot_when_no_safe_blueprint_fits_it() -> None:
    seeds = (_dormant("on-fc1", "fc1", "w32"), _dormant("on-fc2", "fc2", "w128"))
    command = _decide(_history(FLAT, seeds))
    assert command.slot_id == "on-fc1"


def test_grad_norm_ties_go_to_the_first_slot() -> None:
    layers = (
        LayerState(name="a", width=8, grad_norm=1.0),
        LayerState(name="b", width=8, grad_norm=1.0),
    )
    seeds = (_dormant("first", "a"), _dormant("second", "b"))
    command = _decide(_history(FLAT, seeds, layers))
    assert command.slot_id == "first"


def test_waits_without_dormant_slot() -> None:
    command = _decide(_history(FLAT, (_seed("s1", SeedStage.FOSSILIZED),)))
    assert command.command_type is CommandType.WAIT and "no DORMANT slot" in command.reason


def test_empty_history_raises() -> None:
    with pytest.raises(ValueError, match="history is empty"):
        HeuristicPolicy().decide([], CANDIDATES, run_id="run")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("plateau_window", 0),
        ("plateau_rel_tol", -0.1),
        ("probe_epoch", -1),
        ("max_active_seeds", 0),
        ("blend_epochs", 0),
        ("blend_schedule", "sigmoid"),
        ("grow_from", 1.0),
        ("grow_from", -0.1),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        HeuristicConfig(**{field: value})  # type: ignore[arg-type]


def test_config_accepts_schedule_name() -> None:
    assert HeuristicConfig(blend_schedule="cosine").blend_schedule is BlendSchedule.COSINE  # type: ignore[arg-type]
