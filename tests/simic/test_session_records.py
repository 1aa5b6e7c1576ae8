"""A real run records its decisions and field reports for Simic, serves stored policies, and
keeps training through a failing Tamiyo (circuit breaker)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from esper_core.contracts import CommandType
from esper_core.karn.capacity import seed_capacity
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore, report_id_for
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.tamiyo.breaker import BreakerState
from esper_core.tamiyo.graph import GLOBAL_FEATURES, build_graph
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.urza.service import Urza


def _step(session: Run, epoch: int) -> None:
    session.train_epoch()
    session.commit(epoch_tag(epoch, "trained"))
    session.apply(session.decide())
    session.commit(epoch_tag(epoch, "applied"))


def test_every_applied_decision_and_report_reaches_the_registry(compiled_home: EsperSettings) -> None:
    session = Run.start(
        RunSpec(recipe="digits-mlp", epochs=5, device="cpu", run_id="rec", policy="heuristic"), settings=compiled_home
    )
    for epoch in range(5):
        _step(session, epoch)
    assert session.reports, "the germination's window closed: a report is due"
    store = SimicStore.open(compiled_home.home)
    decisions = store.decisions(["rec"])
    assert [d.command for d in decisions] == session.commands
    assert all(d.policy == "heuristic" and d.state.current.epoch == d.command.epoch for d in decisions)
    assert decisions[-1].state.total_epochs == 5 and len(decisions[-1].state.history) == 5
    reports = store.field_reports(["rec"])
    assert reports == session.reports and all(r.report_id == report_id_for(r.command) for r in reports)
    assert {"val_loss", "val_accuracy", "train_loss", "params"} <= set(reports[0].metric_deltas)
    assert reports[0].metric_deltas["params"] > 0  # the germinated seed's parameters
    lines = (compiled_home.runs_dir / "rec" / "field_reports.jsonl").read_text().splitlines()
    assert [json.loads(line)["report_id"] for line in lines] == [r.report_id for r in reports]
    # A retried epoch re-judges the same commands: same ids, no new rows.
    session.ensure_at(epoch_tag(3, "applied"))
    _step(session, 4)
    assert store.field_reports(["rec"]) == session.reports and len(store.decisions(["rec"])) == 5
    store.close()
    session.close()


def test_a_gnn_run_hot_swaps_to_the_newest_policy_between_epochs(compiled_home: EsperSettings) -> None:
    small = TamiyoGNNConfig(hidden_dim=8, num_layers=1)
    config = episode_config("digits-mlp", seed=0, policy="gnn", epochs=3)
    config.tamiyo = dataclasses.replace(config.tamiyo, gnn=small)
    store = SimicStore.open(compiled_home.home)
    torch.manual_seed(0)
    store.publish_policy(TamiyoGNN(small).state_dict(), gnn=small, method="imitation", provenance={})
    (compiled_home.runs_dir / "swap").mkdir(parents=True)
    session = Run(config=config, settings=compiled_home, run_id="swap", urza=Urza.open(compiled_home.home))
    session.commit(START_TAG)
    _step(session, 0)
    torch.manual_seed(1)
    store.publish_policy(TamiyoGNN(small).state_dict(), gnn=small, method="ppo", provenance={}, parent_version=1)
    _step(session, 1)
    assert [c.issued_by for c in session.commands] == ["gnn:v1", "gnn:v2"]
    assert [(d.policy, d.policy_version) for d in store.decisions(["swap"])] == [("gnn", "v1"), ("gnn", "v2")]
    store.close()
    session.close()


def test_a_failing_tamiyo_opens_the_breaker_and_training_goes_on(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = Run.start(RunSpec(recipe="seed-reference", epochs=3, device="cpu", run_id="brk"), settings=compiled_home)
    session.train_epoch()
    session.commit(epoch_tag(0, "trained"))
    calls = []

    def broken(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise RuntimeError("policy crashed")

    monkeypatch.setattr(session.tamiyo, "decide", broken)
    commands = [session.decide() for _ in range(5)]
    assert all(c.command_type is CommandType.WAIT for c in commands)
    threshold = session.config.tamiyo.breaker.failure_threshold
    assert len(calls) == threshold and session.tamiyo.breaker.state is BreakerState.OPEN
    assert [c.issued_by for c in commands[threshold:]] == ["tamiyo.breaker"] * (5 - threshold)
    assert commands[-1].risk_rule == "circuit_breaker"
    session.close()


def test_episodes_report_accuracy_parameters_and_commands(compiled_home: EsperSettings) -> None:
    result = run_episode(episode_config("seed-reference", seed=0, policy="heuristic", epochs=3), settings=compiled_home)
    assert result.total_params > result.host_params  # the probe germinated a seed
    assert result.commands.get("germinate") == 1 and 0.0 <= result.test_accuracy <= 1.0
    none = run_episode(episode_config("seed-reference", seed=0, policy="none", epochs=3), settings=compiled_home)
    assert none.total_params == none.host_params and none.commands == {"wait": 3}


def test_tamiyo_reads_the_new_inputs_on_a_real_run(compiled_home: EsperSettings) -> None:
    """digits-mlp, real trainer: train accuracy, slot bottlenecks, blueprint capacity and the
    remaining parameter budget reach the stored state and the rebuilt graph, with their values."""
    session = Run.start(RunSpec(recipe="digits-mlp", epochs=2, device="cpu", run_id="inputs"), settings=compiled_home)
    for epoch in range(2):
        _step(session, epoch)
    store = SimicStore.open(compiled_home.home)
    state = store.decisions(["inputs"])[-1].state
    store.close()
    current = state.current
    assert current.train_accuracy is not None and 0.0 < current.train_accuracy <= 1.0
    assert all(s.activation_grad_norm is not None and s.activation_grad_norm > 0 for s in current.seeds)
    catalog = default_catalog()
    for candidate in state.candidates:
        assert {c.profile for c in candidate.capacity} == set(candidate.shape_profiles)
        for c in candidate.capacity:
            measured = seed_capacity(catalog, candidate.blueprint_id, ShapeProfile.parse(c.profile))
            assert (c.parameters, c.flops_per_sample, c.linear) == (
                measured.parameters,
                measured.flops_per_sample,
                measured.linear,
            )
    assert state.param_budget == session.config.tamiyo.risk.seed_param_limit(current.host_params)
    graph = build_graph(
        state.history, state.candidates, total_epochs=state.total_epochs, param_budget=state.param_budget
    )
    new = ("train_accuracy", "train_val_accuracy_gap", "log1p_remaining_param_budget", "log1p_activation_grad_norm")
    assert not [m for m in graph.missing if m.split(".")[1] in new + ("log1p_flops_per_sample", "linear_share")]
    row = dict(zip(GLOBAL_FEATURES, graph.x_dict["global"][0].tolist(), strict=True))
    assert row["train_val_accuracy_gap"] == pytest.approx(current.train_accuracy - current.val_accuracy, abs=1e-6)
    session.close()
