"""From stored decisions and field reports to training samples: graphs, choices, rewards.

Reward of the decision at epoch t of a run (``param_penalty`` = lambda, ``flops_penalty`` = mu):

    r_t = (q_{t+1} - q_t) - lambda * params_added_t / host_params
          - mu * (F_{t+1} - F_t) * (E - 1 - t) / (E * F_0)

where ``q_t`` is the validation quality after epoch t (``record_types.validation_quality``: the
validation accuracy; for a language model, whose accuracy reads 0, ``-BITS_WORTH`` x its
validation bits per token, since 2026-11-28: its growth used to earn nothing but the FLOPs
charge), ``params_added_t`` is the blueprint's parameter cost for a germination, minus the seed's
parameters for a cull, 0 otherwise, and the last decision of a run has no accuracy term (nothing
is trained after it). Summed over a run the accuracy terms telescope to the accuracy gained, so
the return trades accuracy gained against parameters added, as the issue asks.

The FLOPs term charges a decision for the training compute it commits the run to. ``F_t`` is the
forward FLOPs of one sample through the network the packet of epoch t describes
(``network_flops``), so ``F_{t+1} - F_t`` is what the decision (and the lifecycle moves of that
epoch) changed, paid on each of the ``E - 1 - t`` epochs left to train, per sample; ``E * F_0``
is the training compute of the run's first network trained static for all ``E`` epochs (the
per-sample factor, 3 x forward x samples, cancels). Summed over a run the terms telescope to

    mu * (training FLOPs of the run / training FLOPs of its first network, static - 1)

so **mu = 0.01 costs one accuracy point for a run whose growth doubles its training FLOPs**
(0.5 point for +50 %). A cull or merge that shrinks the network earns the same rate back.
Packets recorded before layers carried their FLOPs give no FLOPs term (it is 0).

With ``reward="counterfactual"`` the samples are only the decisions a run forked
(``esper_core.studies.counterfactual``: a seed operation was legal, so a choice existed), and each
reward is the fork's one-step (bandit) return

    r = q_A - q_B - lambda * (params_A - params_B) / host_params

of branch A (the decided command) against branch B (WAIT or the heuristic), both measured
``horizon`` epochs later (``CounterfactualOutcome.reward``). Nothing is bootstrapped across
epochs (``Sample.one_step``): the branches already played the decision's consequences out under
the same lifecycle rules, so the reward is the decision's whole effect over the horizon; adding
the critic's value of the run's next decision would count the later decisions that the
comparison held fixed, and forks are sparse (a few per run), so "the next sample" is usually not
the next epoch. Both branches see the same batches, so the difference carries none of the
per-epoch noise of the validation accuracy that dominates ``r_t``.

Field reports label the risk head: a judged command whose outcome was a regression is a positive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from torch_geometric.data import Batch, HeteroData

from esper_core.contracts import (
    AdaptationCommand,
    FieldReport,
    Outcome,
    SeedOperation,
    SeedStage,
    SystemStatePacket,
)
from esper_core.contracts.enums import SlotKind
from esper_core.simic.record_types import validation_quality
from esper_core.simic.records import DecisionRecord
from esper_core.tamiyo.actions import ACTION_INDEX, NO_CHOICE, ActionMasks, BatchChoices, legal_masks
from esper_core.tamiyo.graph import EdgeType, NodeType, build_graph
from esper_core.tamiyo.model import BLEND_SCHEDULES

# Who proposed a decision worth learning from; breaker and safety WAITs are not a policy's choice.
# ``scheduled``: the winner of a schedule search is a demonstrator (``TrainingPlan.search``).
LEARNABLE_POLICIES = frozenset({"heuristic", "gnn", "random", "scheduled"})
REWARDS = ("delta", "counterfactual")
RewardKind = Literal["delta", "counterfactual"]
"""``delta``: ``r_t`` of every decision; ``counterfactual``: forked decisions' one-step rewards."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One decision ready for training.

    Attributes:
        graph: The rebuilt state graph.
        masks: Legal choices in that state.
        action: Chosen action index; ``slot``, ``blueprint``, ``blend`` as in ``Choice``.
        reward: ``r_t`` of the module docstring.
        behaviour_log_prob: log-probability under the policy that acted (GNN decisions only).
        behaviour_value: That policy's value estimate (GNN decisions only).
        regressed: 1.0 / 0.0 when a field report judged the command, else None.
        run_id: The run.
        epoch: The decided epoch.
        policy: Who proposed.
        one_step: The reward is a whole (bandit) return: nothing is bootstrapped past it.
    """

    graph: HeteroData
    masks: ActionMasks
    action: int
    slot: int
    blueprint: int
    blend: int
    reward: float
    behaviour_log_prob: float | None
    behaviour_value: float | None
    regressed: float | None
    run_id: str
    epoch: int
    policy: str
    one_step: bool = False


def choice_of(
    command: AdaptationCommand, slot_ids: Sequence[str], blueprint_ids: Sequence[str]
) -> tuple[int, int, int, int]:
    """``(action, slot, blueprint, blend)`` indices of ``command`` in a graph's node order.

    Raises:
        ValueError: The command names a slot or blueprint that is not in the graph.
    """
    action = ACTION_INDEX[(command.command_type, command.seed_operation)]
    slot = blueprint = blend = NO_CHOICE
    if command.seed_operation is not None:
        if command.slot_id is None or command.slot_id not in slot_ids:
            raise ValueError(f"command names slot {command.slot_id!r}, not among the graph's slots {list(slot_ids)}")
        slot = list(slot_ids).index(command.slot_id)
    if command.seed_operation is SeedOperation.GERMINATE:
        if command.blueprint_id is None or command.blueprint_id not in blueprint_ids:
            raise ValueError(f"command names blueprint {command.blueprint_id!r}, not among {list(blueprint_ids)}")
        blueprint = list(blueprint_ids).index(command.blueprint_id)
        blend = BLEND_SCHEDULES.index(command.blend_schedule)
    return action, slot, blueprint, blend


def params_added(record: DecisionRecord) -> int:
    """Parameters the executed command adds (a germination) or removes (a cull, negative)."""
    command, current = record.command, record.state.current
    if command.seed_operation is SeedOperation.GERMINATE:
        return next((c.param_cost for c in record.state.candidates if c.blueprint_id == command.blueprint_id), 0)
    if command.seed_operation is SeedOperation.CULL:
        return -next((s.param_count for s in current.seeds if s.slot_id == command.slot_id), 0)
    return 0


def network_flops(packet: SystemStatePacket) -> float | None:
    """Forward FLOPs of one sample through the network ``packet`` describes, seeds included.

    The host's weight layers count what they measured (``LayerState.flops_per_sample``). A seed
    that runs in the forward (one in flight, or a fossilised branch seed; a kept width seed is
    merged into its layer, and a kept depth seed's block into the host's layers, which then measure
    it) counts a multiply and an add per
    parameter: exact for new units of a dense layer, low for a convolution's or a token-wise
    layer's, which run at every position (a cnn1d width seed: 2 x 396 counted where the merged
    layers measure 2,320 more). Packets do not say how a seed's parameters split between its own
    units and the next layer's new inputs, which run at different positions; scaling all of them
    by the layer's positions overstated the same seed twice (+3,879) and credited the merge that
    corrected it. Either way the error is the seed's while it trains: the merged layer is measured.

    Returns:
        The FLOPs, or None when a layer's were not measured (packets recorded before they were).
    """
    if not packet.layers or any(layer.flops_per_sample is None for layer in packet.layers):
        return None
    total = float(sum(layer.flops_per_sample or 0 for layer in packet.layers))
    for seed in packet.seeds:
        # ``is_active`` includes FOSSILIZED: a fossilised branch seed still runs beside its layer.
        if seed.stage.is_active and not (seed.stage is SeedStage.FOSSILIZED and seed.kind is SlotKind.WIDTH):
            total += 2 * seed.param_count
    return total


def run_rewards(records: Sequence[DecisionRecord], *, param_penalty: float, flops_penalty: float = 0.0) -> list[float]:
    """Rewards of one run's decisions, sorted by epoch (see the module docstring)."""
    first = network_flops(records[0].state.current) if records else None
    rewards = []
    for i, record in enumerate(records):
        current = record.state.current
        r = -param_penalty * params_added(record) / max(current.host_params, 1)
        if i + 1 < len(records):
            following = records[i + 1].state.current
            # Both read the same way: a packet restored from before ``classifies`` existed says
            # True, and a language model's pair across that boundary would otherwise mix
            # accuracy and bits; its loss reads the same in either packet.
            classifies = current.classifies and following.classifies
            r += _quality(following, classifies) - _quality(current, classifies)
            if flops_penalty:
                r -= flops_penalty * _flops_share(record, following, first)
        rewards.append(r)
    return rewards


def _quality(packet: SystemStatePacket, classifies: bool) -> float:
    return validation_quality(accuracy=packet.val_accuracy, loss=packet.val_loss, classifies=classifies)


def _flops_share(record: DecisionRecord, following: SystemStatePacket, first: float | None) -> float:
    """``(F_{t+1} - F_t) * (E - 1 - t) / (E * F_0)`` of the module docstring; 0 where unmeasured."""
    now, then = network_flops(record.state.current), network_flops(following)
    epochs = record.state.total_epochs
    if now is None or then is None or not first or not epochs:
        return 0.0
    left = max(epochs - 1 - record.command.epoch, 0)
    return (then - now) * left / (epochs * first)


def build_samples(
    records: Sequence[DecisionRecord],
    reports: Sequence[FieldReport],
    *,
    param_penalty: float,
    flops_penalty: float = 0.0,
    policies: frozenset[str] = LEARNABLE_POLICIES,
    reward: RewardKind = "delta",
) -> tuple[list[Sample], int]:
    """Samples of every learnable decision, with rewards computed per run.

    Args:
        records: Stored decisions (any order, any runs).
        reports: Stored field reports (joined to decisions by command id).
        param_penalty: lambda of the reward.
        flops_penalty: mu of the reward (``delta`` only: a fork does not measure its branches'
            FLOPs, so ``counterfactual`` refuses a nonzero mu).
        policies: Proposers whose decisions become samples.
        reward: ``delta`` (every decision, ``r_t``) or ``counterfactual`` (only the forked
            decisions, their one-step reward; see the module docstring).

    Returns:
        ``(samples, skipped)``: decisions whose proposal is illegal in the rebuilt state (e.g.
        recorded before a feature or rule change) are skipped and counted.

    Raises:
        ValueError: Unknown ``reward``.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    if reward == "counterfactual" and flops_penalty:
        raise ValueError(
            "counterfactual rewards carry no FLOPs term (forks do not measure their branches' FLOPs): "
            "use reward='delta' with a flops_penalty, or flops_penalty=0"
        )
    outcome = {r.command.command_id: r.outcome for r in reports}
    by_run: dict[str, list[DecisionRecord]] = defaultdict(list)
    for record in records:
        by_run[record.command.run_id].append(record)
    samples: list[Sample] = []
    skipped = 0
    for run_records in by_run.values():
        run_records.sort(key=lambda r: r.command.epoch)
        one_step = reward == "counterfactual"
        for record, r in zip(
            run_records, run_rewards(run_records, param_penalty=param_penalty, flops_penalty=flops_penalty), strict=True
        ):
            if record.policy not in policies or (one_step and record.counterfactual is None):
                continue
            if record.counterfactual is not None and one_step:
                r = record.counterfactual.reward(param_penalty=param_penalty)
            sample = _sample(record, r, outcome.get(record.command.command_id), one_step=one_step)
            if sample is None:
                skipped += 1
            else:
                samples.append(sample)
    return samples, skipped


def _sample(record: DecisionRecord, reward: float, outcome: Outcome | None, *, one_step: bool) -> Sample | None:
    state = record.state
    graph = build_graph(
        state.history, state.candidates, total_epochs=state.total_epochs, param_budget=state.param_budget
    )
    masks = legal_masks(state.current, state.candidates)
    try:
        action, slot, blueprint, blend = choice_of(record.proposal, graph.slot_ids, graph.blueprint_ids)
    except ValueError:
        return None
    legal = bool(masks.action[action]) and (slot < 0 or bool(masks.slot[action, slot]))
    if not legal or (blueprint >= 0 and not bool(masks.fits[slot, blueprint])):
        return None
    return Sample(
        graph=graph.hetero_data(),
        masks=masks,
        action=action,
        slot=slot,
        blueprint=blueprint,
        blend=blend,
        reward=reward,
        behaviour_log_prob=record.log_prob if record.policy == "gnn" else None,
        behaviour_value=record.value if record.policy == "gnn" else None,
        regressed=None if outcome is None else float(outcome is Outcome.REGRESSION),
        run_id=record.command.run_id,
        epoch=record.command.epoch,
        policy=record.policy,
        one_step=one_step,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleBatch:
    """G samples batched into one graph for a single forward.

    Attributes:
        x_dict: Node features of the batch.
        edge_index_dict: Edges of the batch (indices offset per graph).
        choices: The recorded choices with their masks.
        regressed: ``(G,)`` risk-head labels, NaN where no field report judged the command.
    """

    x_dict: dict[NodeType, Tensor]
    edge_index_dict: dict[EdgeType, Tensor]
    choices: BatchChoices
    regressed: Tensor


def collate(samples: Sequence[Sample], device: torch.device) -> SampleBatch:
    """Batch ``samples`` (PyG ``Batch``) with global slot and blueprint indices."""
    batch = Batch.from_data_list([s.graph for s in samples])
    slot_ptr, bp_ptr = batch["slot"].ptr.tolist(), batch["blueprint"].ptr.tolist()
    slot_mask, bp_mask, slots, bps = [], [], [], []
    for g, s in enumerate(samples):
        num_bp = bp_ptr[g + 1] - bp_ptr[g]
        slot_mask.append(s.masks.slot[s.action])
        bp_mask.append(s.masks.fits[s.slot] if s.slot >= 0 else torch.zeros(num_bp, dtype=torch.bool))
        slots.append(slot_ptr[g] + s.slot if s.slot >= 0 else NO_CHOICE)
        bps.append(bp_ptr[g] + s.blueprint if s.blueprint >= 0 else NO_CHOICE)
    choices = BatchChoices(
        action=torch.tensor([s.action for s in samples]),
        action_mask=torch.stack([s.masks.action for s in samples]),
        slot=torch.tensor(slots),
        slot_mask=torch.cat(slot_mask),
        slot_batch=batch["slot"].batch,
        blueprint=torch.tensor(bps),
        blueprint_mask=torch.cat(bp_mask),
        blueprint_batch=batch["blueprint"].batch,
        blend=torch.tensor([s.blend for s in samples]),
    )
    regressed = torch.tensor([float("nan") if s.regressed is None else s.regressed for s in samples])
    return SampleBatch(
        x_dict={nt: x.to(device) for nt, x in batch.x_dict.items()},
        edge_index_dict={et: ei.to(device) for et, ei in batch.edge_index_dict.items()},
        choices=choices.to(device),
        regressed=regressed.to(device),
    )
