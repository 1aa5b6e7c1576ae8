"""The GNN's action space: legality masks, choosing, and the batched log-probability."""

from __future__ import annotations

import torch
from torch_geometric.data import Batch

from esper_core.contracts import CommandType, GateId, GateVerdict, SeedOperation
from esper_core.tamiyo.actions import (
    ACTION_INDEX,
    NO_CHOICE,
    UNTRAINED_ACTIONS,
    BatchChoices,
    Choice,
    choose,
    has_choice,
    legal_masks,
    log_prob,
)
from esper_core.tamiyo.graph import build_graph
from esper_core.tamiyo.model import ACTIONS, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history

GERMINATE = [op for _, op in ACTIONS].index(SeedOperation.GERMINATE)
FOSSILIZE = [op for _, op in ACTIONS].index(SeedOperation.FOSSILIZE)
CULL = [op for _, op in ACTIONS].index(SeedOperation.CULL)
ADVANCE = [op for _, op in ACTIONS].index(SeedOperation.ADVANCE)


def _state(num_slots: int = 5):
    # slot0 DORMANT, slot1 TRAINING, slot2 BLENDING, slot3 PROBATIONARY, slot4 FOSSILIZED
    history = synthetic_history(num_layers=4, num_slots=num_slots)
    return history, synthetic_candidates(3)


def test_masks_follow_the_lifecycle() -> None:
    history, candidates = _state()
    masks = legal_masks(history[-1], candidates)
    assert masks.slot[GERMINATE].tolist() == [True, False, False, False, False]
    assert masks.slot[CULL].tolist() == [False, True, True, True, False]
    assert masks.slot[ADVANCE].tolist() == [False, True, True, False, False]
    assert not masks.slot[FOSSILIZE].any()  # slot3 has no passed G4 yet
    assert masks.action[ACTION_INDEX[(ACTIONS[0][0], None)]]  # WAIT always
    g4 = GateVerdict(gate=GateId.G4_SYSTEM_IMPACT, passed=True, reason="ok")
    seeds = list(history[-1].seeds)
    seeds[3] = seeds[3].model_copy(update={"last_gate": g4})
    masks = legal_masks(history[-1].model_copy(update={"seeds": tuple(seeds)}), candidates)
    assert masks.slot[FOSSILIZE].tolist() == [False, False, False, True, False]


def test_germinate_is_illegal_without_a_fitting_blueprint() -> None:
    history, _ = _state()
    masks = legal_masks(history[-1], [])
    assert not masks.action[GERMINATE] and masks.fits.shape == (5, 0)


def _out(seed: int = 0):
    history, candidates = _state()
    graph = build_graph(history, candidates)
    torch.manual_seed(seed)
    model = TamiyoGNN(TamiyoGNNConfig(hidden_dim=16, num_layers=2)).eval()
    with torch.no_grad():
        out = model(*graph.inputs(torch.device("cpu")))
    return history, candidates, graph, model, out


def test_choices_are_always_legal_and_sampling_is_reproducible() -> None:
    history, candidates, _, _, out = _out()
    masks = legal_masks(history[-1], candidates)
    for seed in range(30):
        c = choose(out, masks, sample=True, generator=torch.Generator().manual_seed(seed))
        assert masks.action[c.action]
        if c.slot != NO_CHOICE:
            assert masks.slot[c.action, c.slot]
        if c.blueprint != NO_CHOICE:
            assert c.action == GERMINATE and masks.fits[c.slot, c.blueprint]
    a = choose(out, masks, sample=True, generator=torch.Generator().manual_seed(3))
    b = choose(out, masks, sample=True, generator=torch.Generator().manual_seed(3))
    assert a == b
    best = choose(out, masks, sample=False)
    assert best.action == int(out.action_logits[0].masked_fill(~masks.action, -1e9).argmax())


def _batch_choices(graph_list, masks_list, chosen: list[Choice]) -> tuple[Batch, BatchChoices]:
    batch = Batch.from_data_list([g.hetero_data() for g in graph_list])
    slot_ptr, bp_ptr = batch["slot"].ptr.tolist(), batch["blueprint"].ptr.tolist()
    return batch, BatchChoices(
        action=torch.tensor([c.action for c in chosen]),
        action_mask=torch.stack([m.action for m in masks_list]),
        slot=torch.tensor([slot_ptr[i] + c.slot if c.slot >= 0 else -1 for i, c in enumerate(chosen)]),
        slot_mask=torch.cat([m.slot[c.action] for m, c in zip(masks_list, chosen, strict=True)]),
        slot_batch=batch["slot"].batch,
        blueprint=torch.tensor([bp_ptr[i] + c.blueprint if c.blueprint >= 0 else -1 for i, c in enumerate(chosen)]),
        blueprint_mask=torch.cat(
            [
                m.fits[c.slot] if c.slot >= 0 else torch.zeros(m.fits.shape[1], dtype=torch.bool)
                for m, c in zip(masks_list, chosen, strict=True)
            ]
        ),
        blueprint_batch=batch["blueprint"].batch,
        blend=torch.tensor([c.blend for c in chosen]),
    )


def test_batched_log_prob_equals_the_log_prob_of_each_choice() -> None:
    """Tamiyo records choose()'s log-probability; Simic recomputes it on batches: they must agree."""
    history, candidates, graph, model, _ = _out()
    other_history = synthetic_history(num_layers=2, num_slots=2)
    graphs = [graph, build_graph(other_history, candidates[:2])]
    masks_list = [legal_masks(history[-1], candidates), legal_masks(other_history[-1], candidates[:2])]
    chosen = []
    with torch.no_grad():
        for g, m in zip(graphs, masks_list, strict=True):
            out = model(*g.inputs(torch.device("cpu")))
            # Force a germination so that every factor (slot, blueprint, blend) is exercised.
            forced = out._replace(action_logits=out.action_logits.index_fill(1, torch.tensor([GERMINATE]), 50.0))
            chosen.append(choose(forced, m, sample=True, generator=torch.Generator().manual_seed(1)))
    assert all(c.action == GERMINATE for c in chosen)
    batch, choices = _batch_choices(graphs, masks_list, chosen)
    out = model(batch.x_dict, batch.edge_index_dict)
    forced = out._replace(action_logits=out.action_logits.index_fill(1, torch.tensor([GERMINATE]), 50.0))
    lp, entropy = log_prob(forced, choices)
    torch.testing.assert_close(lp, torch.tensor([c.log_prob for c in chosen]), rtol=1e-4, atol=1e-4)
    assert (entropy >= 0).all()
    lp.sum().backward()  # differentiable for Simic
    assert model.slot_head[0].weight.grad is not None and model.blueprint_head[0].weight.grad is not None


def test_every_head_that_acts_keeps_its_entropy() -> None:
    """A germination's entropy is the sum of the type, slot, blueprint and blend entropies (each
    over its legal choices); a WAIT's is the type's alone; only heads that acted get gradients."""
    history, candidates, graph, model, _ = _out()
    masks = legal_masks(history[-1], candidates)
    germinate = Choice(action=GERMINATE, slot=0, blueprint=1, blend=0)
    wait = Choice(action=ACTION_INDEX[ACTIONS[0]])
    batch, choices = _batch_choices([graph, graph], [masks, masks], [germinate, wait])
    out = model(batch.x_dict, batch.edge_index_dict)
    _, entropy = log_prob(out, choices)

    def h(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(logits[mask], dim=-1)
        return -(p * p.log()).sum()

    n_slots, n_bp = graph.x_dict["slot"].shape[0], graph.x_dict["blueprint"].shape[0]
    type_h = h(out.action_logits[1], masks.action)
    expected = (
        type_h
        + h(out.slot_scores[:n_slots], masks.slot[GERMINATE])  # a single legal slot: 0
        + h(out.blueprint_scores[:n_bp], masks.fits[0])
        + h(out.blend_logits[0], torch.ones(out.blend_logits.shape[1], dtype=torch.bool))
    )
    torch.testing.assert_close(entropy, torch.stack([expected, type_h]), rtol=1e-5, atol=1e-5)
    assert entropy[0] > entropy[1] > 0
    entropy[0].backward()
    assert model.blueprint_head[0].weight.grad.abs().sum() > 0 and model.blend_head[0].weight.grad.abs().sum() > 0
    assert model.lr_head[0].weight.grad is None  # no loss reaches the learning-rate head


def test_the_learning_rate_head_never_acts() -> None:
    """OPTIMIZER (the learning-rate head's only use) is never legal, so the untrained head can
    neither be chosen nor rescale the optimizer."""
    history, candidates, _, _, out = _out()
    masks = legal_masks(history[-1], candidates)
    optimizer = ACTION_INDEX[(CommandType.OPTIMIZER, None)]
    assert not masks.action[optimizer] and optimizer in UNTRAINED_ACTIONS
    forced = out._replace(action_logits=out.action_logits.index_fill(1, torch.tensor([optimizer]), 50.0))
    picks = {choose(forced, masks, sample=True, generator=torch.Generator().manual_seed(s)).action for s in range(20)}
    assert optimizer not in picks and choose(forced, masks, sample=False).action != optimizer


def test_a_choice_exists_only_where_a_seed_operation_is_legal() -> None:
    history, candidates = _state()
    assert has_choice(legal_masks(history[-1], candidates))
    dormant_only = synthetic_history(num_layers=2, num_slots=1)  # one DORMANT slot
    assert has_choice(legal_masks(dormant_only[-1], candidates))
    assert not has_choice(legal_masks(dormant_only[-1], []))  # nothing fits: only WAIT and PAUSE
