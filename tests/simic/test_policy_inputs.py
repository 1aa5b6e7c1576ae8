"""Stored policies trained on other graph inputs are refused; old decisions still rebuild."""

from __future__ import annotations

import json

import pytest
import torch
from sqlalchemy import update

from esper_core.contracts import AdaptationCommand, CommandType
from esper_core.simic.dataset import build_samples
from esper_core.simic.models import PolicyRow
from esper_core.simic.records import DecisionRecord, DecisionState, IncompatiblePolicyError, SimicStore
from esper_core.simic.serving import refresh_policy
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES, build_graph
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history

SMALL = TamiyoGNNConfig(hidden_dim=8, num_layers=1)


def _gnn_service() -> TamiyoService:
    return TamiyoService(TamiyoConfig(policy="gnn", gnn=SMALL, compile=PolicyCompileConfig(enabled=False)))


def _publish(store: SimicStore) -> int:
    torch.manual_seed(0)
    return store.publish_policy(TamiyoGNN(SMALL).state_dict(), gnn=SMALL, method="imitation", provenance={}).version


def _rewrite(store: SimicStore, version: int, **columns: str) -> None:
    """Make a stored row look like one an older Esper wrote."""
    with store.engine.begin() as conn:
        conn.execute(update(PolicyRow).where(PolicyRow.version == version).values(**columns))


def test_a_current_policy_is_served(store: SimicStore) -> None:
    version = _publish(store)
    service = _gnn_service()
    served = refresh_policy(service, store)
    assert served is not None and served.version == version and service.policy_version == "v1"


def test_a_policy_trained_on_the_old_feature_widths_is_refused_with_the_fix(store: SimicStore) -> None:
    version = _publish(store)
    old = {**FEATURE_DIMS, "global": FEATURE_DIMS["global"] - 3, "slot": FEATURE_DIMS["slot"] - 1}
    _rewrite(
        store, version, feature_dims_json=json.dumps(old), provenance_json=json.dumps({"policy_format": POLICY_FORMAT})
    )
    service = _gnn_service()
    with pytest.raises(IncompatiblePolicyError, match=r"global \d+ -> \d+, .*slot.*train_policy flow"):
        refresh_policy(service, store)
    assert service.policy_version is None  # nothing was swapped in


def test_equal_widths_with_other_feature_names_are_refused_too(store: SimicStore) -> None:
    version = _publish(store)
    names = {nt: list(n) for nt, n in FEATURE_NAMES.items()}
    names["global"][0], names["global"][1] = names["global"][1], names["global"][0]
    _rewrite(store, version, provenance_json=json.dumps({"policy_format": POLICY_FORMAT, "graph_features": names}))
    with pytest.raises(IncompatiblePolicyError, match="global"):
        refresh_policy(_gnn_service(), store)


def test_a_policy_stored_before_the_format_was_recorded_is_refused_in_one_line(store: SimicStore) -> None:
    """What a policy published before format 2 looks like: no recorded format, the old names."""
    version = _publish(store)
    names = {nt: list(n) for nt, n in FEATURE_NAMES.items()}
    names["global"][6] = "latency_budget_ratio"
    _rewrite(store, version, provenance_json=json.dumps({"graph_features": names}))
    service = _gnn_service()
    with pytest.raises(IncompatiblePolicyError) as caught:
        refresh_policy(service, store)
    message = str(caught.value)
    assert "\n" not in message
    assert f"has format 1, but this Tamiyo reads format {POLICY_FORMAT}" in message
    assert "train_policy flow" in message and "TamiyoConfig.policy='heuristic'" in message
    assert service.policy_version is None


def test_a_published_policy_records_the_current_format(store: SimicStore) -> None:
    version = _publish(store)
    stored = store.get_policy(version)
    assert stored.provenance["policy_format"] == POLICY_FORMAT
    stored.require_current_inputs()


def test_decisions_recorded_before_the_new_inputs_still_become_samples() -> None:
    """A state stored by an older Esper: packets without train accuracy or slot bottlenecks,
    candidates without capacity, no parameter budget. It rebuilds with those unobserved."""
    history = synthetic_history(num_epochs=3, num_slots=1)
    state = DecisionState(history=tuple(history), candidates=tuple(synthetic_candidates(2)), total_epochs=10)
    data = json.loads(state.to_json())
    del data["param_budget"]
    for packet in data["history"]:
        del packet["train_accuracy"]
        for seed in packet["seeds"]:
            del seed["activation_grad_norm"]
    for packet in data["history"]:
        for layer in packet["layers"]:
            for key in ("kind", "fan_in", "fan_out", "params", "flops_per_sample"):
                del layer[key]
        for seed in packet["seeds"]:
            del seed["kind"]
    for candidate in data["candidates"]:
        del candidate["capacity"], candidate["kind"]
    old = DecisionState.from_json(json.dumps(data))
    graph = build_graph(old.history, old.candidates, total_epochs=old.total_epochs, param_budget=old.param_budget)
    assert {"global.train_accuracy", "slot.log1p_activation_grad_norm", "blueprint.linear_share"} <= set(graph.missing)
    assert "global.log1p_remaining_param_budget" in graph.missing
    assert {"layer.kind_linear", "layer.flops_share", "slot.kind_branch", "blueprint.kind_width"} <= set(graph.missing)
    wait = AdaptationCommand(
        run_id="synthetic", epoch=2, command_type=CommandType.WAIT, issued_by="heuristic", reason="r"
    )
    record = DecisionRecord(command=wait, proposal=wait, policy="heuristic", policy_version=None, state=old)
    samples, skipped = build_samples([record], [], param_penalty=0.0)
    assert len(samples) == 1 and skipped == 0
