"""Tamiyo's graph builder: node/edge layout, feature hygiene, coverage."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from esper_core.contracts import (
    BlueprintDescriptor,
    BlueprintTier,
    CommandType,
    LayerState,
    SeedOperation,
    SeedStage,
    SeedState,
    SystemStatePacket,
)
from esper_core.contracts.enums import LayerKind, SlotKind
from esper_core.tamiyo.actions import ACTION_INDEX, legal_masks
from esper_core.tamiyo.candidates import BlueprintCandidate, CandidateCapacity
from esper_core.tamiyo.graph import (
    BLUEPRINT_FEATURES,
    EDGE_TYPES,
    FEATURE_CLIP,
    FEATURE_DIMS,
    FEATURE_NAMES,
    FORWARD_EDGE_TYPES,
    GLOBAL_FEATURES,
    LAYER_FEATURES,
    NODE_TYPES,
    REVERSE_EDGE_TYPES,
    SLOT_FEATURES,
    TamiyoGraph,
    build_graph,
)
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history


@pytest.fixture
def graph() -> TamiyoGraph:
    # 3 packets, 3 layers, slot0 DORMANT + slot1 TRAINING, 3 candidates.
    return build_graph(synthetic_history(num_epochs=3, num_layers=3, num_slots=2), synthetic_candidates(3))


def _candidate(blueprint_id: str, profiles: set[str]) -> BlueprintCandidate:
    return BlueprintCandidate(
        descriptor=BlueprintDescriptor(
            blueprint_id=blueprint_id,
            name=blueprint_id,
            tier=BlueprintTier.SAFE,
            host_kinds=("mlp",),
            description="test",
            risk=0.1,
        ),
        shape_profiles=frozenset(profiles),
        latency_p95_ms=1.0,
        param_cost=100,
    )


def _edge_pairs(graph: TamiyoGraph, edge_type: tuple[str, str, str]) -> set[tuple[int, int]]:
    src, dst = graph.edge_index_dict[edge_type].tolist()
    return set(zip(src, dst, strict=True))


def test_node_counts_and_feature_dims(graph: TamiyoGraph) -> None:
    counts = {nt: graph.x_dict[nt].shape[0] for nt in NODE_TYPES}
    assert counts == {"global": 1, "layer": 3, "slot": 2, "blueprint": 3}
    for nt in NODE_TYPES:
        x = graph.x_dict[nt]
        assert x.dtype == torch.float32
        assert x.shape[1] == FEATURE_DIMS[nt]
        assert torch.isfinite(x).all()
    assert graph.slot_ids == ("slot0", "slot1")
    assert graph.blueprint_ids == ("bp0", "bp1", "bp2")
    assert 0.0 < graph.coverage <= 1.0


def test_slot_features_encode_stage_and_gate(graph: TamiyoGraph) -> None:
    x_slot = graph.x_dict["slot"]
    col = {name: i for i, name in enumerate(SLOT_FEATURES)}
    assert x_slot[0, col["stage_dormant"]] == 1.0 and x_slot[1, col["stage_training"]] == 1.0
    assert x_slot[:, col["gate_none"]].tolist() == [1.0, 1.0]
    # Stage one-hot rows sum to one.
    stage_cols = [i for name, i in col.items() if name.startswith("stage_")]
    assert x_slot[:, stage_cols].sum(dim=1).tolist() == [1.0, 1.0]


def test_every_edge_type_present_and_well_formed(graph: TamiyoGraph) -> None:
    assert set(graph.edge_index_dict) == set(EDGE_TYPES)
    for src_type, rel, dst_type in EDGE_TYPES:
        edge_index = graph.edge_index_dict[src_type, rel, dst_type]
        assert edge_index.dtype == torch.int64
        assert edge_index.dim() == 2 and edge_index.shape[0] == 2
        if edge_index.numel():
            assert edge_index[0].min() >= 0 and edge_index[0].max() < graph.x_dict[src_type].shape[0]
            assert edge_index[1].min() >= 0 and edge_index[1].max() < graph.x_dict[dst_type].shape[0]
    # Every node type receives messages, and each reverse relation mirrors its forward one.
    assert {dst for _, _, dst in EDGE_TYPES} == set(NODE_TYPES)
    for fwd, rev in zip(FORWARD_EDGE_TYPES, REVERSE_EDGE_TYPES, strict=True):
        assert _edge_pairs(graph, rev) == {(d, s) for s, d in _edge_pairs(graph, fwd)}


def test_hetero_data_holds_the_same_tensors_in_the_same_order(graph: TamiyoGraph) -> None:
    """Simic batches ``hetero_data()`` where a run's policy read the plain dicts: the same inputs."""
    data = graph.hetero_data()
    assert list(data.x_dict) == list(graph.x_dict) == list(NODE_TYPES)
    assert list(data.edge_index_dict) == list(graph.edge_index_dict)
    assert all(data.x_dict[nt] is x for nt, x in graph.x_dict.items())
    assert all(data.edge_index_dict[et] is ei for et, ei in graph.edge_index_dict.items())
    assert {nt: data[nt].num_nodes for nt in NODE_TYPES} == {"global": 1, "layer": 3, "slot": 2, "blueprint": 3}


def test_edges_follow_the_host_structure(graph: TamiyoGraph) -> None:
    assert _edge_pairs(graph, ("layer", "feeds", "layer")) == {(0, 1), (1, 2)}
    # slot0 sits on layer0, slot1 on layer1.
    assert _edge_pairs(graph, ("layer", "hosts", "slot")) == {(0, 0), (1, 1)}
    assert _edge_pairs(graph, ("global", "context", "blueprint")) == {(0, 0), (0, 1), (0, 2)}
    assert _edge_pairs(graph, ("slot", "informs", "global")) == {(0, 0), (1, 0)}


def test_blueprint_without_the_slots_profile_gets_no_fits_edge() -> None:
    history = synthetic_history(num_slots=2)  # profiles w16 (slot0) and w32 (slot1)
    candidates = [_candidate("fits-all", {"w16", "w32"}), _candidate("only-w32", {"w32"})]
    graph = build_graph(history, candidates)
    assert _edge_pairs(graph, ("blueprint", "fits", "slot")) == {(0, 0), (0, 1), (1, 1)}


def test_empty_history_raises() -> None:
    with pytest.raises(ValueError, match="history is empty"):
        build_graph([], synthetic_candidates())


def test_no_slots_no_blueprints_keeps_every_edge_type() -> None:
    graph = build_graph(synthetic_history(num_slots=0), [])
    assert graph.x_dict["slot"].shape == (0, FEATURE_DIMS["slot"])
    assert graph.x_dict["blueprint"].shape == (0, FEATURE_DIMS["blueprint"])
    assert set(graph.edge_index_dict) == set(EDGE_TYPES)
    assert graph.edge_index_dict["blueprint", "fits", "slot"].shape == (2, 0)


def _packet(seeds: tuple[SeedState, ...], val_loss: float = 1.0) -> SystemStatePacket:
    return SystemStatePacket(
        run_id="r",
        epoch=0,
        train_loss=1.0,
        val_loss=val_loss,
        val_accuracy=0.5,
        train_accuracy=0.7,
        learning_rate=0.1,
        epoch_latency_ms=5.0,
        latency_budget_ms=10.0,
        host_params=100,
        layers=(
            LayerState(name="fc", width=8, kind=LayerKind.LINEAR, fan_in=4, fan_out=8, params=40, flops_per_sample=64),
        ),
        seeds=seeds,
    )


def test_missing_metrics_count_against_coverage_and_default_to_zero() -> None:
    full = {
        "grad_norm": 0.2,
        "samples": 8.0,
        "val_loss_with_seed": 0.9,
        "val_loss_without_seed": 1.0,
    }
    seed = SeedState(
        slot_id="s",
        layer="fc",
        shape_profile="p",
        stage=SeedStage.TRAINING,
        kind=SlotKind.BRANCH,
        blueprint_id="b",
        metrics=full,
        activation_grad_norm=0.3,
    )
    bare = seed.model_copy(update={"metrics": {}})
    # Two packets so the trends and volatilities are observed; the run length gives progress.
    observed = build_graph([_packet((seed,)), _packet((seed,))], [], total_epochs=5, param_budget=400)
    defaulted = build_graph([_packet((bare,)), _packet((bare,))], [], total_epochs=5, param_budget=400)
    assert observed.coverage == 1.0 and observed.missing == ()
    # grad_norm, samples, val_loss_with_seed delta, val_loss_without_seed delta
    assert defaulted.missing == (
        "slot.log1p_grad_norm",
        "slot.log1p_samples",
        "slot.val_loss_with_seed_delta",
        "slot.val_loss_without_seed_delta",
    )
    total = sum(observed.x_dict[nt].numel() for nt in NODE_TYPES)
    assert defaulted.coverage == pytest.approx((total - 4) / total)
    col = SLOT_FEATURES.index("val_loss_with_seed_delta")
    assert observed.x_dict["slot"][0, col].item() == pytest.approx(-0.1)
    assert defaulted.x_dict["slot"][0, col].item() == 0.0
    # A single packet of a run of unknown length and budget has no trends (5 entries), no
    # progress and no remaining or used budget.
    single = build_graph([_packet((seed,))], [])
    assert single.coverage == pytest.approx((total - 8) / total)
    assert "global.progress" in single.missing and "global.val_accuracy_slope" in single.missing


def test_global_features_cover_trends_gap_seed_share_and_progress() -> None:
    history = synthetic_history(num_epochs=4, num_layers=3, num_slots=2)  # slot1 TRAINING
    graph = build_graph(history, synthetic_candidates(2), total_epochs=9)
    row = dict(zip(GLOBAL_FEATURES, graph.x_dict["global"][0].tolist(), strict=True))
    current = history[-1]
    assert row["progress"] == pytest.approx(current.epoch / 8)
    assert row["generalisation_gap"] == pytest.approx(current.val_loss - current.train_loss)
    assert row["val_accuracy_slope"] == pytest.approx(0.1)  # synthetic accuracy rises 0.1 per epoch
    assert row["train_loss_slope"] < 0 and row["val_accuracy_volatility"] > 0
    seed_params = sum(s.param_count for s in current.seeds if s.stage.is_active)
    assert row["seed_param_share"] == pytest.approx(seed_params / current.host_params)
    bp = dict(zip(BLUEPRINT_FEATURES, graph.x_dict["blueprint"][1].tolist(), strict=True))
    assert bp["param_cost_share"] == pytest.approx(2000 / current.host_params)


def test_non_finite_and_huge_values_are_bounded() -> None:
    seed = SeedState(
        slot_id="s",
        layer="fc",
        shape_profile="p",
        stage=SeedStage.TRAINING,
        blueprint_id="b",
        metrics={"grad_norm": math.inf, "val_loss_with_seed": math.nan},
    )
    graph = build_graph([_packet((seed,), val_loss=1e30)], [])
    for nt in NODE_TYPES:
        x = graph.x_dict[nt]
        assert torch.isfinite(x).all() and (x.abs() <= FEATURE_CLIP).all()
    assert graph.x_dict["global"][0, 1].item() == FEATURE_CLIP  # val_loss clipped
    assert graph.coverage < 1.0


def test_new_inputs_read_under_fitting_budget_bottleneck_and_capacity() -> None:
    history = synthetic_history(num_epochs=2, num_layers=3, num_slots=2)  # slot1 TRAINING
    candidates = synthetic_candidates(2)
    graph = build_graph(history, candidates, param_budget=5000)
    new = {"train_accuracy", "train_val_accuracy_gap", "log1p_remaining_param_budget", "log1p_activation_grad_norm"}
    new |= {"log1p_flops_per_sample", "linear_share"}
    assert not [m for m in graph.missing if m.split(".")[1] in new]
    current = history[-1]
    row = dict(zip(GLOBAL_FEATURES, graph.x_dict["global"][0].tolist(), strict=True))
    assert row["train_accuracy"] == pytest.approx(current.train_accuracy)
    assert row["train_val_accuracy_gap"] == pytest.approx(current.train_accuracy - current.val_accuracy)
    seed_params = sum(s.param_count for s in current.seeds if s.stage.is_active)
    assert row["log1p_remaining_param_budget"] == pytest.approx(math.log1p(5000 - seed_params))
    slot = graph.x_dict["slot"][:, SLOT_FEATURES.index("log1p_activation_grad_norm")].tolist()
    assert slot == pytest.approx([math.log1p(s.activation_grad_norm) for s in current.seeds])
    bp = [dict(zip(BLUEPRINT_FEATURES, x, strict=True)) for x in graph.x_dict["blueprint"].tolist()]
    assert [b["log1p_flops_per_sample"] for b in bp] == pytest.approx([math.log1p(2000), math.log1p(4000)])
    assert [b["linear_share"] for b in bp] == [0.0, 1.0]
    # Over budget: the remaining budget goes negative instead of saturating at zero.
    over = build_graph(history, candidates, param_budget=0)
    col = GLOBAL_FEATURES.index("log1p_remaining_param_budget")
    assert over.x_dict["global"][0, col].item() == pytest.approx(-math.log1p(seed_params))


def test_capacity_only_counts_the_profiles_the_candidate_has_an_artifact_for() -> None:
    (candidate,) = synthetic_candidates(1)
    wider = CandidateCapacity(profile="w999", parameters=1, flops_per_sample=10**9, linear=True)
    stale = dataclasses.replace(candidate, capacity=(*candidate.capacity, wider))
    history = synthetic_history(num_epochs=1)
    row = build_graph(history, [stale]).x_dict["blueprint"][0]
    assert row[BLUEPRINT_FEATURES.index("linear_share")].item() == 0.0
    assert row[BLUEPRINT_FEATURES.index("log1p_flops_per_sample")].item() == pytest.approx(math.log1p(2000))


# A packet and a candidate as runs recorded them before train accuracy, the slot bottleneck and
# blueprint capacity existed (Simic's stored decisions hold such JSON).
_OLD_PACKET = {
    "run_id": "old",
    "epoch": 3,
    "train_loss": 0.5,
    "val_loss": 0.6,
    "val_accuracy": 0.8,
    "learning_rate": 0.05,
    "epoch_latency_ms": 10.0,
    "latency_budget_ms": 18.0,
    "host_params": 5000,
    "layers": [{"name": "fc0", "width": 64}],
    "seeds": [{"slot_id": "slot1", "layer": "fc0", "shape_profile": "w64", "stage": "dormant"}],
    "timestamp": 0.0,
}


def test_old_packets_and_candidates_still_build_with_the_new_features_unobserved() -> None:
    packet = SystemStatePacket.model_validate(_OLD_PACKET)
    assert packet.train_accuracy is None and packet.seeds[0].activation_grad_norm is None
    old_candidate = synthetic_candidates(1)[0].to_dict()
    del old_candidate["capacity"], old_candidate["kind"]
    candidate = BlueprintCandidate.from_dict(old_candidate)
    assert candidate.capacity == () and candidate.kind is None
    graph = build_graph([packet], [candidate])
    assert {
        "global.train_accuracy",
        "global.train_val_accuracy_gap",
        "global.log1p_remaining_param_budget",
        "global.log1p_host_flops_per_sample",
        "slot.log1p_activation_grad_norm",
        "slot.kind_width",
        "layer.kind_linear",
        "layer.log_fan_in",
        "layer.flops_share",
        "blueprint.log1p_flops_per_sample",
        "blueprint.linear_share",
        "blueprint.kind_branch",
        "blueprint.flops_share",
    } <= set(graph.missing)
    assert SystemStatePacket.from_json(packet.to_json()) == packet


def _every_clock_changed(packet: SystemStatePacket, k: int) -> SystemStatePacket:
    """``packet`` as a machine under another load would have measured it: every timing and
    timestamp different (seed metrics that are timings too), everything else equal."""
    seeds = tuple(
        s.model_copy(update={"metrics": {**s.metrics, "kernel_load_ms": 1e3 * k, "kernel_first_use_ms": 7.0 * k}})
        for s in packet.seeds
    )
    return packet.model_copy(
        update={
            "epoch_latency_ms": packet.epoch_latency_ms * 37.0 * k + 1.0,
            "latency_budget_ms": packet.latency_budget_ms / (3.0 * k),
            "timestamp": packet.timestamp + 86_400.0 * k,
            "seeds": seeds,
        }
    )


def test_two_states_differing_only_in_wall_clock_time_build_bit_identical_graphs() -> None:
    """The same run on an idle and a busy machine: the policy must read exactly the same inputs."""
    history = synthetic_history(num_epochs=4, num_layers=3, num_slots=3)
    candidates = synthetic_candidates(3)
    busy_history = [_every_clock_changed(p, k) for k, p in enumerate(history, start=1)]
    busy_candidates = [dataclasses.replace(c, latency_p95_ms=c.latency_p95_ms * 50.0 + 3.0) for c in candidates]
    assert busy_history != history and busy_candidates != candidates
    idle = build_graph(history, candidates, total_epochs=10, param_budget=5000)
    busy = build_graph(busy_history, busy_candidates, total_epochs=10, param_budget=5000)
    for nt in NODE_TYPES:
        assert torch.equal(idle.x_dict[nt], busy.x_dict[nt]), nt
    for et in EDGE_TYPES:
        assert torch.equal(idle.edge_index_dict[et], busy.edge_index_dict[et]), et
    assert (idle.coverage, idle.missing) == (busy.coverage, busy.missing)


def test_no_feature_name_reads_a_timing() -> None:
    names = [name for names in FEATURE_NAMES.values() for name in names]
    assert not [n for n in names if any(word in n for word in ("latency", "_ms", "time", "second"))]


def test_layer_names_do_not_reach_the_policy() -> None:
    """A recipe's layer names are not features: the same host under other names, with slots
    pointing at the renamed layers, builds the same inputs."""
    history = synthetic_history(num_epochs=2, num_layers=3, num_slots=2)

    def renamed(packet: SystemStatePacket) -> SystemStatePacket:
        layers = tuple(layer.model_copy(update={"name": f"blocks.{i}.mlp"}) for i, layer in enumerate(packet.layers))
        seeds = tuple(s.model_copy(update={"layer": f"blocks.{s.layer[5:]}.mlp"}) for s in packet.seeds)
        return packet.model_copy(update={"layers": layers, "seeds": seeds})

    a = build_graph(history, synthetic_candidates(2))
    b = build_graph([renamed(p) for p in history], synthetic_candidates(2))
    for nt in NODE_TYPES:
        assert torch.equal(a.x_dict[nt], b.x_dict[nt]), nt
    assert _edge_pairs(a, ("layer", "hosts", "slot")) == _edge_pairs(b, ("layer", "hosts", "slot"))


def test_layers_read_kind_fans_and_shares_of_the_host() -> None:
    (packet,) = synthetic_history(num_epochs=1, num_layers=3, num_slots=0)
    conv = packet.layers[1].model_copy(update={"kind": LayerKind.CONV2D, "fan_in": 16 * 9, "fan_out": 32 * 9})
    packet = packet.model_copy(update={"layers": (packet.layers[0], conv, packet.layers[2])})
    graph = build_graph([packet], [])
    rows = [dict(zip(LAYER_FEATURES, x, strict=True)) for x in graph.x_dict["layer"].tolist()]
    assert [r["kind_conv2d"] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["kind_linear"] for r in rows] == [1.0, 0.0, 1.0]
    assert rows[1]["log_fan_in"] == pytest.approx(math.log(16 * 9))
    assert rows[1]["log_fan_out"] == pytest.approx(math.log(32 * 9))
    flops = [layer.flops_per_sample or 0 for layer in packet.layers]
    assert [r["flops_share"] for r in rows] == pytest.approx([f / sum(flops) for f in flops])
    params = [layer.params or 0 for layer in packet.layers]
    assert [r["param_share"] for r in rows] == pytest.approx([p / packet.host_params for p in params])
    widths = [math.log(layer.width) for layer in packet.layers]
    assert [r["log_width_rel"] for r in rows] == pytest.approx([w - sum(widths) / 3 for w in widths])
    g = dict(zip(GLOBAL_FEATURES, graph.x_dict["global"][0].tolist(), strict=True))
    assert g["log1p_host_flops_per_sample"] == pytest.approx(math.log1p(sum(flops)), rel=1e-6)
    # A host twice as wide everywhere: the scale-free features do not move.
    doubled = packet.model_copy(
        update={
            "host_params": packet.host_params * 4,
            "layers": tuple(
                layer.model_copy(
                    update={
                        "width": layer.width * 2,
                        "params": (layer.params or 0) * 4,
                        "flops_per_sample": (layer.flops_per_sample or 0) * 4,
                    }
                )
                for layer in packet.layers
            ),
        }
    )
    rows2 = [dict(zip(LAYER_FEATURES, x, strict=True)) for x in build_graph([doubled], []).x_dict["layer"].tolist()]
    for name in ("log_width_rel", "param_share", "flops_share", "relative_depth"):
        assert [r[name] for r in rows2] == pytest.approx([r[name] for r in rows]), name


def test_slots_and_blueprints_carry_their_kind_depth_included() -> None:
    history = synthetic_history(num_epochs=1, num_layers=2, num_slots=2)
    packet = history[-1]
    depth_slot = packet.seeds[0].model_copy(update={"kind": SlotKind.DEPTH, "shape_profile": "depth"})
    packet = packet.model_copy(update={"seeds": (depth_slot, packet.seeds[1])})
    depth = dataclasses.replace(_candidate("depth-block", {"depth"}), kind=SlotKind.DEPTH)
    graph = build_graph([packet], [*synthetic_candidates(1), depth])
    slots = [dict(zip(SLOT_FEATURES, x, strict=True)) for x in graph.x_dict["slot"].tolist()]
    assert [(r["kind_branch"], r["kind_width"], r["kind_depth"]) for r in slots] == [(0, 0, 1), (1, 0, 0)]
    bps = [dict(zip(BLUEPRINT_FEATURES, x, strict=True)) for x in graph.x_dict["blueprint"].tolist()]
    assert [(r["kind_branch"], r["kind_depth"]) for r in bps] == [(1, 0), (0, 1)]
    assert bps[1]["fit_share"] == 0.5
    # The action space already holds it: germinating the depth slot with the depth block is legal.
    masks = legal_masks(packet, [*synthetic_candidates(1), depth])
    assert bool(masks.fits[0, 1]) and bool(masks.slot[ACTION_INDEX[(CommandType.SEED, SeedOperation.GERMINATE)], 0])


def test_blueprint_flops_are_read_against_the_hosts() -> None:
    history = synthetic_history(num_epochs=1, num_layers=3, num_slots=1)
    graph = build_graph(history, synthetic_candidates(1))
    host = sum(layer.flops_per_sample or 0 for layer in history[-1].layers)
    row = dict(zip(BLUEPRINT_FEATURES, graph.x_dict["blueprint"][0].tolist(), strict=True))
    assert row["flops_share"] == pytest.approx(2000 / host)
