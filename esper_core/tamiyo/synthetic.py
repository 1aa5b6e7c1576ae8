"""Deterministic synthetic training states: the ``policy-graph`` workload and test fixtures.

The same builder serves the benchmark (a host with ~50 graph nodes), ``prepare_policy``'s dry
forward and the tests, so all three exercise one representative graph shape.
"""

from __future__ import annotations

from esper_core.contracts import (
    BlueprintDescriptor,
    BlueprintTier,
    LayerState,
    SeedStage,
    SeedState,
    SystemStatePacket,
)
from esper_core.contracts.enums import LayerKind, SlotKind
from esper_core.tamiyo.candidates import BlueprintCandidate, CandidateCapacity

# Stages given to slots 1, 2, ... (slot 0 is always DORMANT so a germination is possible).
_ACTIVE_CYCLE: tuple[SeedStage, ...] = (
    SeedStage.TRAINING,
    SeedStage.BLENDING,
    SeedStage.PROBATIONARY,
    SeedStage.FOSSILIZED,
    SeedStage.EMBARGOED,
)
_TIER_CYCLE: tuple[BlueprintTier, ...] = tuple(BlueprintTier)


def synthetic_history(
    *,
    num_epochs: int = 3,
    num_layers: int = 3,
    num_slots: int = 2,
    run_id: str = "synthetic",
) -> list[SystemStatePacket]:
    """A short run with a falling validation loss.

    Layer ``i`` is a linear layer named ``layer{i}`` with width ``16 * (1 + i % 4)``, reading the
    previous layer's width (the first its own); slot ``j`` sits on layer ``j % num_layers`` with
    shape profile ``w<width>``. Slot 0 is DORMANT, later slots cycle through TRAINING, BLENDING,
    PROBATIONARY, FOSSILIZED, EMBARGOED; every slot is a branch slot.

    Args:
        num_epochs: Number of packets (epochs 0 .. num_epochs - 1).
        num_layers: Host layers per packet (at least 1).
        num_slots: Seed slots per packet.
        run_id: Run id written into every packet.

    Returns:
        The packets, oldest first.

    Raises:
        ValueError: If ``num_epochs`` or ``num_layers`` is below 1 or ``num_slots`` below 0.
    """
    if num_epochs < 1 or num_layers < 1 or num_slots < 0:
        raise ValueError(
            f"need num_epochs >= 1, num_layers >= 1 and num_slots >= 0, got {num_epochs}, {num_layers}, {num_slots}"
        )
    widths = [16 * (1 + i % 4) for i in range(num_layers)]
    fan_ins = [widths[max(i - 1, 0)] for i in range(num_layers)]
    history = []
    for epoch in range(num_epochs):
        layers = tuple(
            LayerState(
                name=f"layer{i}",
                width=widths[i],
                activation_mean=0.1 * (i % 3),
                activation_std=1.0 + 0.05 * i,
                grad_norm=0.5 + 0.1 * ((i * 7) % 5),
                kind=LayerKind.LINEAR,
                fan_in=fan_ins[i],
                fan_out=widths[i],
                params=(fan_ins[i] + 1) * widths[i],
                flops_per_sample=2 * fan_ins[i] * widths[i],
            )
            for i in range(num_layers)
        )
        seeds = tuple(_seed(j, epoch, widths, num_layers) for j in range(num_slots))
        history.append(
            SystemStatePacket(
                run_id=run_id,
                epoch=epoch,
                train_loss=1.0 / (epoch + 1),
                val_loss=1.1 / (epoch + 1),
                val_accuracy=min(1.0, 0.5 + 0.1 * epoch),
                train_accuracy=min(1.0, 0.55 + 0.12 * epoch),
                learning_rate=0.01,
                epoch_latency_ms=12.0,
                latency_budget_ms=18.0,
                host_params=sum(w * w for w in widths),
                layers=layers,
                seeds=seeds,
            )
        )
    return history


def _seed(index: int, epoch: int, widths: list[int], num_layers: int) -> SeedState:
    layer = index % num_layers
    profile = f"w{widths[layer]}"
    if index == 0:
        return SeedState(
            slot_id="slot0",
            layer=f"layer{layer}",
            shape_profile=profile,
            stage=SeedStage.DORMANT,
            kind=SlotKind.BRANCH,
            activation_grad_norm=0.2,
        )
    stage = _ACTIVE_CYCLE[(index - 1) % len(_ACTIVE_CYCLE)]
    return SeedState(
        slot_id=f"slot{index}",
        layer=f"layer{layer}",
        shape_profile=profile,
        stage=stage,
        kind=SlotKind.BRANCH,
        blueprint_id=None if stage is SeedStage.EMBARGOED else "bp0",
        alpha=0.5 if stage is SeedStage.BLENDING else 0.0,
        age_epochs=epoch,
        epochs_in_stage=epoch,
        param_count=widths[layer] * 8,
        activation_grad_norm=0.2 + 0.05 * index,
        metrics={
            "grad_norm": 0.3,
            "samples": 64.0,
            "val_loss_with_seed": 1.0 / (epoch + 1),
            "val_loss_without_seed": 1.1 / (epoch + 1),
        },
    )


def synthetic_candidates(num_blueprints: int = 3) -> list[BlueprintCandidate]:
    """Blueprints ``bp0``, ``bp1``, ... cycling through the tiers.

    Blueprint ``b`` has artifacts for the profiles of widths ``16 .. 16 * (4 - b % 4)``, so the
    last ones fit fewer slots than the first; at each it adds ``param_cost`` parameters and
    twice as many FLOPs per sample, and odd-numbered blueprints are linear.

    Args:
        num_blueprints: Number of candidates.

    Returns:
        The candidates.
    """
    candidates = []
    for b in range(num_blueprints):
        profiles = frozenset(f"w{16 * k}" for k in range(1, 5 - b % 4))
        cost = 1000 * (b + 1)
        capacity = tuple(
            CandidateCapacity(profile=p, parameters=cost, flops_per_sample=2 * cost, linear=b % 2 == 1)
            for p in sorted(profiles)
        )
        candidates.append(_candidate(b, profiles, cost, capacity))
    return candidates


def _candidate(
    b: int, profiles: frozenset[str], cost: int, capacity: tuple[CandidateCapacity, ...]
) -> BlueprintCandidate:
    return BlueprintCandidate(
        descriptor=BlueprintDescriptor(
            blueprint_id=f"bp{b}",
            name=f"blueprint {b}",
            tier=_TIER_CYCLE[b % len(_TIER_CYCLE)],
            host_kinds=("mlp",),
            description="synthetic",
            risk=min(1.0, 0.1 + 0.2 * b),
        ),
        shape_profiles=profiles,
        latency_p95_ms=0.5 + 0.25 * b,
        param_cost=cost,
        capacity=capacity,
    )
