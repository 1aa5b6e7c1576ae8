"""The GNN policy's action space: legality masks, choosing an action, and its log-probability.

An action is ``(type, slot, blueprint, blend)``: the type from ``ACTIONS``; a slot for SEED
actions; a blueprint and a blend schedule for GERMINATE. Its probability factorises:

    pi(a) = pi(type) * pi(slot | type) * pi(blueprint | slot) * pi(blend)

with every factor a softmax over *legal* choices only (``ActionMasks``), so the policy never
proposes what Kasmina would reject. Tamiyo samples or takes the argmax (``choose``); Simic
recomputes the log-probability of recorded choices on batches of graphs (``log_prob``). Both
use the same masked distributions, which a test pins together.

Shape legend: G graphs in a batch; A = ``len(ACTIONS)``; S slots and B blueprints over the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from esper_core.contracts import CommandType, GateId, SeedOperation, SeedStage, SystemStatePacket
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tamiyo.model import ACTIONS, PolicyOutput

NO_CHOICE = -1
"""Index of a factor that does not apply (no slot for WAIT, no blueprint for CULL, ...)."""
LR_LOG2_RANGE = 1.0
"""An OPTIMIZER action scales the learning rate by 2 ** (lr_adjust * LR_LOG2_RANGE)."""

ACTION_INDEX = {action: i for i, action in enumerate(ACTIONS)}
_OPS = [op for _, op in ACTIONS]
_GERMINATE = _OPS.index(SeedOperation.GERMINATE)
UNTRAINED_ACTIONS: frozenset[int] = frozenset({ACTION_INDEX[(CommandType.OPTIMIZER, None)]})
"""Action types the GNN may not take: OPTIMIZER acts through the learning-rate head
(``lr_adjust``), and nothing teaches that head a scale (no policy Simic imitates issues one and no
reward isolates its effect), so an untrained head would rescale every parameter group at random.
Masked out of ``legal_masks``, the head never acts and no loss reaches it."""
_NEG = -1e9  # masked logit: finite, so an all-masked row gives NaN-free (if meaningless) values


@dataclass(frozen=True, kw_only=True, slots=True)
class ActionMasks:
    """Which choices are legal in one state.

    Attributes:
        action: ``(A,)`` legal action types.
        slot: ``(A, S)`` legal slots per action type (all False for types without a slot).
        fits: ``(S, B)`` blueprint b has an active artifact for slot s's profile.
    """

    action: Tensor
    slot: Tensor
    fits: Tensor


@dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    """One chosen action as indices into the graph's nodes, with its log-probability.

    Attributes:
        action: Index into ``ACTIONS``.
        slot: Slot node index, or ``NO_CHOICE``.
        blueprint: Blueprint node index, or ``NO_CHOICE``.
        blend: Index into ``BLEND_SCHEDULES``, or ``NO_CHOICE``.
        log_prob: log pi(choice) under the masked distributions.
        lr_scale: Learning-rate factor (used by OPTIMIZER actions).
    """

    action: int
    slot: int = NO_CHOICE
    blueprint: int = NO_CHOICE
    blend: int = NO_CHOICE
    log_prob: float = 0.0
    lr_scale: float = 1.0


def legal_masks(packet: SystemStatePacket, candidates: Sequence[BlueprintCandidate]) -> ActionMasks:
    """The legal actions in ``packet``'s state, mirroring what Kasmina accepts.

    GERMINATE: a DORMANT slot with a fitting blueprint. ADVANCE: a GERMINATED, BLENDING, or
    TRAINING seed whose last gate did not fail. FOSSILIZE: a PROBATIONARY seed whose last gate is
    a passed G4. CULL: any in-flight seed. WAIT and PAUSE are always legal; OPTIMIZER never is
    (``UNTRAINED_ACTIONS``: Kasmina would accept it, but the GNN has no trained head to act with).

    Args:
        packet: The current epoch's state (slots in node order).
        candidates: Blueprints in node order.

    Returns:
        The masks.
    """
    seeds = packet.seeds
    fits = torch.tensor([[c.fits(s.shape_profile) for c in candidates] for s in seeds], dtype=torch.bool).reshape(
        len(seeds), len(candidates)
    )
    slot = torch.zeros(len(ACTIONS), len(seeds), dtype=torch.bool)
    for j, seed in enumerate(seeds):
        gate = seed.last_gate
        failed = gate is not None and not gate.passed
        slot[_OPS.index(SeedOperation.GERMINATE), j] = seed.stage is SeedStage.DORMANT and bool(fits[j].any())
        slot[_OPS.index(SeedOperation.ADVANCE), j] = seed.stage in (SeedStage.GERMINATED, SeedStage.BLENDING) or (
            seed.stage is SeedStage.TRAINING and not failed
        )
        slot[_OPS.index(SeedOperation.FOSSILIZE), j] = (
            seed.stage is SeedStage.PROBATIONARY
            and gate is not None
            and gate.gate is GateId.G4_SYSTEM_IMPACT
            and gate.passed
        )
        slot[_OPS.index(SeedOperation.CULL), j] = seed.stage in (
            SeedStage.GERMINATED,
            SeedStage.TRAINING,
            SeedStage.BLENDING,
            SeedStage.PROBATIONARY,
        )
    always = [op is None and i not in UNTRAINED_ACTIONS for i, op in enumerate(_OPS)]
    action = torch.tensor(always, dtype=torch.bool) | slot.any(dim=1)
    return ActionMasks(action=action, slot=slot, fits=fits)


def has_choice(masks: ActionMasks) -> bool:
    """Whether the state offers a real choice: some seed operation is legal (WAIT and PAUSE, the
    only other legal types, both leave the run as it is)."""
    return bool(masks.slot.any())


def choose(out: PolicyOutput, masks: ActionMasks, *, sample: bool, generator: torch.Generator | None = None) -> Choice:
    """Pick an action for one graph: the most likely legal one, or a sample.

    Args:
        out: The policy's output for a single graph (G = 1), on any device.
        masks: ``legal_masks`` of the same state.
        sample: Sample from the masked distributions instead of taking each argmax.
        generator: CPU generator for sampling (seeded by the caller for reproducibility).

    Returns:
        The choice and its log-probability.
    """
    action_lp = _masked_log_softmax(out.action_logits[0].float().cpu(), masks.action)
    a = _pick(action_lp, sample, generator)
    total = action_lp[a]
    slot = blueprint = blend = NO_CHOICE
    if masks.slot[a].any():
        slot_lp = _masked_log_softmax(out.slot_scores.float().cpu(), masks.slot[a])
        slot = _pick(slot_lp, sample, generator)
        total = total + slot_lp[slot]
        if a == _GERMINATE:
            bp_lp = _masked_log_softmax(out.blueprint_scores.float().cpu(), masks.fits[slot])
            blueprint = _pick(bp_lp, sample, generator)
            blend_lp = torch.log_softmax(out.blend_logits[0].float().cpu(), dim=-1)
            blend = _pick(blend_lp, sample, generator)
            total = total + bp_lp[blueprint] + blend_lp[blend]
    lr_scale = 2.0 ** (float(out.lr_adjust[0]) * LR_LOG2_RANGE)
    return Choice(action=a, slot=slot, blueprint=blueprint, blend=blend, log_prob=float(total), lr_scale=lr_scale)


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchChoices:
    """Recorded choices and masks of G graphs batched together (Simic's training input).

    Attributes:
        action: ``(G,)`` chosen action indices.
        action_mask: ``(G, A)`` legal action types.
        slot: ``(G,)`` chosen slot, as an index into the batch's slot nodes, or ``NO_CHOICE``.
        slot_mask: ``(S,)`` slots legal for each graph's chosen action.
        slot_batch: ``(S,)`` graph of each slot node.
        blueprint: ``(G,)`` chosen blueprint (batch index) or ``NO_CHOICE``.
        blueprint_mask: ``(B,)`` blueprints fitting each graph's chosen slot.
        blueprint_batch: ``(B,)`` graph of each blueprint node.
        blend: ``(G,)`` chosen blend schedule or ``NO_CHOICE``.
    """

    action: Tensor
    action_mask: Tensor
    slot: Tensor
    slot_mask: Tensor
    slot_batch: Tensor
    blueprint: Tensor
    blueprint_mask: Tensor
    blueprint_batch: Tensor
    blend: Tensor

    def to(self, device: torch.device) -> BatchChoices:
        """The same choices on ``device``."""
        return BatchChoices(**{name: getattr(self, name).to(device) for name in self.__slots__})


def log_prob(out: PolicyOutput, choices: BatchChoices) -> tuple[Tensor, Tensor]:
    """log pi of each graph's recorded choice, and the entropy of every head that acted in it.

    The entropy is that of the action-type distribution plus, when the recorded action used
    them, the slot distribution (given the type), the blueprint distribution (given the slot) and
    the blend distribution: each head that chose something keeps its own exploration, and a head
    that did not act (no slot for WAIT, no blueprint for CULL) adds nothing.

    Args:
        out: The policy's output for the batch (G global nodes).
        choices: The recorded choices and their masks.

    Returns:
        ``(log_prob (G,), entropy (G,))``; differentiable with respect to ``out``.
    """
    g = choices.action.shape[0]
    action_lp = _masked_log_softmax(out.action_logits.float(), choices.action_mask)  # (G, A)
    total = action_lp.gather(1, choices.action.unsqueeze(1)).squeeze(1)
    entropy = _entropy(action_lp, choices.action_mask)
    for scores, mask, batch, chosen in (
        (out.slot_scores, choices.slot_mask, choices.slot_batch, choices.slot),
        (out.blueprint_scores, choices.blueprint_mask, choices.blueprint_batch, choices.blueprint),
    ):
        lp, h = _segment_choice_lp(scores.float(), mask, batch, chosen, g)
        total, entropy = total + lp, entropy + h
    blend_lp = torch.log_softmax(out.blend_logits.float(), dim=-1)  # (G, K)
    has_blend = choices.blend >= 0
    blend_term = blend_lp.gather(1, choices.blend.clamp(min=0).unsqueeze(1)).squeeze(1)
    zero = torch.zeros_like(blend_term)
    total = total + torch.where(has_blend, blend_term, zero)
    entropy = entropy + torch.where(has_blend, _entropy(blend_lp, torch.ones_like(blend_lp, dtype=torch.bool)), zero)
    return total, entropy


def _entropy(lp: Tensor, mask: Tensor) -> Tensor:
    """Entropy of each row of log-probabilities ``lp`` (G, K) over its ``mask``ed entries."""
    return -(lp.exp() * lp).masked_fill(~mask, 0.0).sum(dim=1)


def _segment_choice_lp(scores: Tensor, mask: Tensor, batch: Tensor, chosen: Tensor, g: int) -> tuple[Tensor, Tensor]:
    """Within each graph, the log-softmax of ``scores`` over masked nodes read at ``chosen``, and
    its entropy; both (G,), 0 for graphs that chose nothing here (``chosen`` < 0)."""
    # Imported here: only Simic's training reaches this (a run's decisions use ``choose``), and
    # importing torch-geometric costs every run seconds.
    from torch_geometric.utils import softmax as segment_softmax

    out = scores.new_zeros(g)
    if scores.numel() == 0:
        return out, out
    logits = scores.masked_fill(~mask, _NEG)
    lp = torch.log(segment_softmax(logits, batch, num_nodes=g).clamp(min=1e-30))  # (N,)
    has = chosen >= 0
    node_entropy = -(lp.exp() * lp).masked_fill(~mask, 0.0)  # (N,)
    entropy = out.scatter_add(0, batch, node_entropy)
    return torch.where(has, lp[chosen.clamp(min=0)], out), torch.where(has, entropy, out)


def _masked_log_softmax(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.log_softmax(logits.masked_fill(~mask, _NEG), dim=-1)


def _pick(log_probs: Tensor, sample: bool, generator: torch.Generator | None) -> int:
    if sample:
        return int(torch.multinomial(log_probs.exp(), 1, generator=generator).item())
    return int(log_probs.argmax().item())
