"""The risk engine: each named rule vetoes or downgrades, and the command says which fired."""

from __future__ import annotations

import pytest

from esper_core.contracts import (
    AdaptationCommand,
    BlueprintDescriptor,
    BlueprintTier,
    CommandType,
    FieldReport,
    GateId,
    GateVerdict,
    LayerState,
    Outcome,
    SeedOperation,
    SeedStage,
    SeedState,
    SystemStatePacket,
)
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.risk import RiskConfig, RiskContext, RiskEngine


def _candidate(
    bp: str, tier: BlueprintTier, risk: float, cost: int, profiles: tuple[str, ...] = ("p64",)
) -> BlueprintCandidate:
    return BlueprintCandidate(
        descriptor=BlueprintDescriptor(
            blueprint_id=bp, name=bp, tier=tier, host_kinds=("mlp",), description="t", risk=risk
        ),
        shape_profiles=frozenset(profiles),
        latency_p95_ms=1.0,
        param_cost=cost,
    )


SAFE_SMALL = _candidate("small", BlueprintTier.SAFE, 0.1, 500)
SAFE_BIG = _candidate("big", BlueprintTier.SAFE, 0.2, 5_000)
RISKY = _candidate("risky", BlueprintTier.HIGH_RISK, 0.8, 800)
CANDIDATES = (SAFE_SMALL, SAFE_BIG, RISKY)


def _seed(slot: str, stage: SeedStage = SeedStage.DORMANT, **kw: object) -> SeedState:
    return SeedState(
        slot_id=slot,
        layer="fc1",
        shape_profile="p64",
        stage=stage,
        blueprint_id=None if stage is SeedStage.DORMANT else "small",
        **kw,
    )


def _packet(
    epoch: int, val_loss: float, seeds: tuple[SeedState, ...] = (), latency_ms: float = 5.0
) -> SystemStatePacket:
    return SystemStatePacket(
        run_id="r",
        epoch=epoch,
        train_loss=val_loss,
        val_loss=val_loss,
        val_accuracy=0.5,
        learning_rate=0.1,
        epoch_latency_ms=latency_ms,
        latency_budget_ms=10.0,
        host_params=4_000,
        layers=(LayerState(name="fc1", width=64),),
        seeds=seeds,
    )


def _germinate(bp: str = "small", slot: str = "slot1", epoch: int = 3) -> AdaptationCommand:
    return AdaptationCommand(
        run_id="r",
        epoch=epoch,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.GERMINATE,
        slot_id=slot,
        blueprint_id=bp,
        issued_by="gnn:v1",
        reason="propose",
    )


def _history(
    losses: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7), seeds: tuple[SeedState, ...] = (_seed("slot1"),)
) -> list[SystemStatePacket]:
    return [_packet(i, loss, seeds) for i, loss in enumerate(losses)]


def _review(command: AdaptationCommand, **ctx: object) -> AdaptationCommand:
    defaults: dict[str, object] = {"history": _history(), "candidates": CANDIDATES}
    return RiskEngine(ctx.pop("config", RiskConfig())).review(command, RiskContext(**(defaults | ctx))).command  # type: ignore[arg-type]


def test_a_safe_proposal_passes_untouched() -> None:
    proposal = _germinate()
    assert _review(proposal) is proposal


def test_no_germination_after_the_last_epoch() -> None:
    # The history's last packet is epoch 3: the last of a 4-epoch run, not of a 5-epoch one.
    vetoed = _review(_germinate(), total_epochs=4)
    assert vetoed.command_type is CommandType.WAIT and vetoed.risk_rule == "no_epoch_left"
    assert "epoch 3 is the run's last of 4" in vetoed.reason
    assert _review(_germinate(), total_epochs=5).seed_operation is SeedOperation.GERMINATE
    assert _review(_germinate()).seed_operation is SeedOperation.GERMINATE  # length unknown: no opinion
    cull = _germinate().model_copy(update={"seed_operation": SeedOperation.CULL, "blueprint_id": None})
    assert _review(cull, total_epochs=4) is cull  # a seed in flight may still be culled (or fossilised)


def test_no_germination_once_the_growth_window_closed() -> None:
    # Epoch 3 of 12: past the first quarter (epochs 0-2), inside the first third (epochs 0-3).
    quarter, third = RiskConfig(grow_until=0.25), RiskConfig(grow_until=1 / 3)
    vetoed = _review(_germinate(), total_epochs=12, config=quarter)
    assert vetoed.command_type is CommandType.WAIT and vetoed.risk_rule == "growth_window"
    assert "epoch 3 >= 3: growth stops at grow_until=0.25 of the run's 12 epochs" in vetoed.reason
    assert _review(_germinate(), total_epochs=12, config=third).seed_operation is SeedOperation.GERMINATE
    # The default leaves every epoch but the last open; a run of unknown length is not limited.
    assert _review(_germinate(), total_epochs=5).seed_operation is SeedOperation.GERMINATE
    assert _review(_germinate(), config=quarter).seed_operation is SeedOperation.GERMINATE
    cull = _germinate().model_copy(update={"seed_operation": SeedOperation.CULL, "blueprint_id": None})
    assert _review(cull, total_epochs=12, config=quarter) is cull  # seeds in flight go on through their lifecycle
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="grow_until must lie in"):
            RiskConfig(grow_until=bad)


def test_isolation_violation_downgrades_anything_to_culling_the_seed() -> None:
    g3 = GateVerdict(gate=GateId.G3_INTERFACE, passed=False, reason="isolation violated: host gradients differ")
    seeds = (_seed("slot1"), _seed("slot2", SeedStage.TRAINING, last_gate=g3))
    command = _review(_germinate(), history=_history(seeds=seeds))
    assert (command.seed_operation, command.slot_id, command.risk_rule) == (
        SeedOperation.CULL,
        "slot2",
        "isolation_violation",
    )
    assert command.blueprint_id is None and "failed G3" in command.reason


def test_loss_spike_vetoes_growth_but_not_a_cull() -> None:
    spiking = _history(losses=(1.0, 0.8, 0.7, 1.2))
    command = _review(_germinate(), history=spiking)
    assert command.command_type is CommandType.WAIT and command.risk_rule == "loss_spike"
    cull = AdaptationCommand(
        run_id="r",
        epoch=3,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.CULL,
        slot_id="slot1",
        issued_by="gnn",
        reason="c",
    )
    assert _review(cull, history=spiking).risk_rule is None


def _report(bp: str, outcome: Outcome, epoch: int) -> FieldReport:
    return FieldReport(run_id="r", command=_germinate(bp, epoch=epoch), outcome=outcome, observation_epochs=2)


def test_repeated_regressions_pause_growth_for_the_cooldown() -> None:
    reports = [_report("big", Outcome.REGRESSION, e) for e in (0, 1)] + [_report("small", Outcome.REGRESSION, 1)]
    assert _review(_germinate(), reports=reports).risk_rule == "repeated_regressions"  # closed at epoch 3
    late = _history(losses=(1.0, 0.9, 0.8, 0.7, 0.6, 0.5))  # epoch 5: the cooldown is over
    assert _review(_germinate(epoch=5), history=late, reports=reports).risk_rule is None


def test_a_blueprint_that_regressed_twice_is_quarantined_and_replaced() -> None:
    reports = [
        _report("big", Outcome.REGRESSION, 0),
        _report("big", Outcome.SUCCESS, 0),
        _report("big", Outcome.REGRESSION, 0),
    ]
    command = _review(_germinate("big"), reports=reports)
    assert command.blueprint_id == "small" and command.risk_rule == "blueprint_quarantine"


def test_configured_quarantine_and_missing_artifacts_downgrade() -> None:
    command = _review(_germinate("big"), config=RiskConfig(quarantined=("big",)))
    assert command.blueprint_id == "small" and "quarantined" in command.reason
    gone = _review(_germinate("vanished"))
    assert gone.blueprint_id == "small" and "no active artifact" in gone.reason


def test_high_risk_tier_is_downgraded_to_the_safest_fit_or_vetoed() -> None:
    command = _review(_germinate("risky"))
    assert command.blueprint_id == "small" and command.risk_rule == "blueprint_tier"
    only_risky = _review(_germinate("risky"), candidates=(RISKY,))
    assert only_risky.command_type is CommandType.WAIT and "no allowed alternative" in only_risky.reason
    assert (
        _review(_germinate("risky"), config=RiskConfig(allow_high_risk=True, max_blueprint_risk=0.9)).risk_rule is None
    )


def test_param_budget_downgrades_to_a_cheaper_blueprint() -> None:
    # Host 4,000 parameters: with max growth 1.0 the 5,000-parameter blueprint does not fit.
    command = _review(_germinate("big"), config=RiskConfig(max_param_growth=1.0))
    assert command.blueprint_id == "small" and command.risk_rule == "param_budget"


def test_latency_budget_rule_is_off_by_default_and_vetoes_when_set() -> None:
    slow = [_packet(i, 1.0 - 0.1 * i, (_seed("slot1"),), latency_ms=50.0) for i in range(4)]
    assert _review(_germinate(), history=slow).risk_rule is None
    command = _review(_germinate(), history=slow, config=RiskConfig(max_latency_ratio=2.0))
    assert command.command_type is CommandType.WAIT and command.risk_rule == "latency_budget"


def test_predicted_risk_vetoes_growth() -> None:
    command = _review(_germinate(), predicted_risk=0.95)
    assert command.command_type is CommandType.WAIT and command.risk_rule == "predicted_risk"


def test_rules_chain_and_all_are_named() -> None:
    command = _review(_germinate("risky"), predicted_risk=0.99)
    assert command.risk_rule == "blueprint_tier,predicted_risk" and command.command_type is CommandType.WAIT


@pytest.mark.parametrize(
    ("field", "value"),
    [("spike_window", 0), ("loss_spike_ratio", 0.0), ("max_blueprint_risk", 1.5), ("max_latency_ratio", -1.0)],
)
def test_config_rejects_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RiskConfig(**{field: value})  # type: ignore[arg-type]


def test_max_seed_params_caps_what_seeds_hold_in_all() -> None:
    # Active seed "small" already holds 300 parameters; another 500 would make 800.
    seeds = (_seed("slot1"), _seed("slot2", SeedStage.FOSSILIZED, param_count=300))
    history = _history(seeds=seeds)
    assert _review(_germinate(), history=history, config=RiskConfig(max_seed_params=800)).risk_rule is None
    capped = _review(_germinate(), history=history, config=RiskConfig(max_seed_params=799))
    assert capped.command_type is CommandType.WAIT and capped.risk_rule == "param_budget"
    assert "max_seed_params 799" in capped.reason
    zero = _review(_germinate("big"), config=RiskConfig(max_seed_params=0))
    assert zero.command_type is CommandType.WAIT
    with pytest.raises(ValueError, match="max_seed_params must be >= 0"):
        RiskConfig(max_seed_params=-1)


def test_merged_width_counts_against_the_budget_of_the_host_the_run_started_with() -> None:
    """A merged width seed moves its parameters into the host: no seed holds them any more, yet
    they are growth. The budget counts them, and is set by the starting host, not the grown one."""
    from esper_core.tamiyo.risk import merged_growth

    start = _history()
    grown = [*start[:-1], start[-1].model_copy(update={"host_params": 4_300})]
    assert merged_growth(start) == 0 and merged_growth(grown) == 300
    # 300 merged + 500 for "small" = 800: within 800, not within 799.
    assert _review(_germinate(), history=grown, config=RiskConfig(max_seed_params=800)).risk_rule is None
    capped = _review(_germinate(), history=grown, config=RiskConfig(max_seed_params=799))
    assert capped.command_type is CommandType.WAIT and capped.risk_rule == "param_budget"
    # max_param_growth 0.2 of the starting 4,000 is 800 (of the grown 4,300 it would be 860).
    assert _review(_germinate(), history=grown, config=RiskConfig(max_param_growth=0.2)).risk_rule is None
    over = _review(_germinate(), history=grown, config=RiskConfig(max_param_growth=0.199))
    assert over.risk_rule == "param_budget" and "x host 4000 at the start" in over.reason
