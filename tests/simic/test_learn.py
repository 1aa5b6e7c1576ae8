"""Simic's samples, rewards, imitation and PPO on decisions made by a real Tamiyo."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation
from esper_core.simic.dataset import build_samples, choice_of, collate, params_added, run_rewards
from esper_core.simic.learn import (
    SimicConfig,
    agreement,
    imitate,
    normalised_advantages,
    ppo_update,
    returns_and_advantages,
)
from esper_core.simic.record_types import BITS_WORTH, CounterfactualOutcome, validation_quality
from esper_core.simic.records import DecisionRecord
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history

SMALL = TamiyoGNNConfig(hidden_dim=16, num_layers=2)


def _records(policy: str, runs: int = 3, epochs: int = 4, explore: bool = False) -> list[DecisionRecord]:
    torch.manual_seed(0)
    service = TamiyoService(
        TamiyoConfig(policy=policy, explore=explore, gnn=SMALL, compile=PolicyCompileConfig(enabled=False))
    )
    candidates = synthetic_candidates(3)
    records = []
    for run in range(runs):
        for epoch in range(1, epochs + 1):
            history = synthetic_history(num_epochs=epoch + 1, num_slots=1 + run % 3, run_id=f"run{run}")
            decision = service.decide(history, candidates, run_id=f"run{run}", total_epochs=epochs + 1)
            records.append(DecisionRecord.from_decision(decision, history, candidates, total_epochs=epochs + 1))
    return records


def test_rewards_trade_accuracy_gained_against_parameters_added() -> None:
    records = [r for r in _records("heuristic", runs=1) if r.command.run_id == "run0"]
    assert records[0].command.seed_operation is SeedOperation.GERMINATE  # the probe at epoch 1
    host = records[0].state.current.host_params
    rewards = run_rewards(records, param_penalty=0.01)
    assert params_added(records[0]) == 1000  # bp0's parameter cost
    # Synthetic accuracy rises 0.1 per epoch; each decision pays for what it adds.
    expected = [0.1 - 0.01 * params_added(r) / host for r in records[:-1]]
    assert rewards[:-1] == pytest.approx(expected) and rewards[0] == pytest.approx(0.1 - 0.01 * 1000 / host)
    # Nothing is trained after the last decision: only its parameter cost counts.
    assert rewards[-1] == pytest.approx(-0.01 * params_added(records[-1]) / host)
    assert sum(run_rewards(records, param_penalty=0.0)) == pytest.approx(
        records[-1].state.current.val_accuracy - records[0].state.current.val_accuracy
    )


def test_a_language_models_rewards_read_its_validation_bits_not_its_accuracy_of_zero() -> None:
    records = [r for r in _records("heuristic", runs=1) if r.command.run_id == "run0"]

    def as_language_model(record: DecisionRecord, nats: float) -> DecisionRecord:
        current = record.state.current.model_copy(update={"classifies": False, "val_accuracy": 0.0, "val_loss": nats})
        state = dataclasses.replace(record.state, history=(*record.state.history[:-1], current))
        return dataclasses.replace(record, state=state)

    # Validation loss falls by 0.1 bit an epoch: each decision earns half of it (BITS_WORTH).
    lm = [as_language_model(r, (3.0 - 0.1 * i) * math.log(2)) for i, r in enumerate(records)]
    rewards = run_rewards(lm, param_penalty=0.0)
    assert rewards[:-1] == pytest.approx([BITS_WORTH * 0.1] * (len(lm) - 1)) and rewards[-1] == 0.0
    # A packet restored from before ``classifies`` existed says True: its pair with a newer one
    # is read in bits on both sides (its loss is as good as ever), never accuracy against bits.
    older = lm[0].state.current.model_copy(update={"classifies": True})
    lm[0] = dataclasses.replace(
        lm[0], state=dataclasses.replace(lm[0].state, history=(*lm[0].state.history[:-1], older))
    )
    assert run_rewards(lm, param_penalty=0.0)[0] == pytest.approx(BITS_WORTH * 0.1)
    assert validation_quality(accuracy=0.0, loss=2 * math.log(2), classifies=False) == pytest.approx(-1.0)
    assert validation_quality(accuracy=0.8, loss=9.0, classifies=True) == 0.8
    # A fork of a language model compares its branches' losses the same way.
    fork = CounterfactualOutcome(
        baseline="wait", baseline_action="wait", horizon=2, val_accuracy=0.0, baseline_val_accuracy=0.0,
        val_loss=1.9 * math.log(2), baseline_val_loss=2.0 * math.log(2), params=10, baseline_params=10,
        host_params=10, fork_ms=1.0, classifies=False,
    )  # fmt: skip
    assert fork.reward(param_penalty=0.01) == pytest.approx(0.05)
    assert CounterfactualOutcome.from_json(fork.to_json()) == fork


def test_samples_carry_the_choice_and_skip_illegal_proposals() -> None:
    records = _records("heuristic")
    illegal = AdaptationCommand(
        run_id="run0",
        epoch=1,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.FOSSILIZE,
        slot_id="slot0",
        issued_by="heuristic",
        reason="no G4 yet",
    )
    records.append(
        DecisionRecord(
            **{
                **{f: getattr(records[0], f) for f in ("policy", "policy_version", "state")},
                "command": illegal,
                "proposal": illegal,
            }
        )
    )
    samples, skipped = build_samples(records, [], param_penalty=0.01)
    assert skipped == 1 and len(samples) == len(records) - 1
    first = samples[0]
    assert (first.action, first.slot, first.blueprint) == choice_of(
        records[0].proposal, ("slot0",), ("bp0", "bp1", "bp2")
    )[:3]
    batch = collate(samples[:5], torch.device("cpu"))
    assert batch.choices.action.shape == (5,) and batch.x_dict["global"].shape[0] == 5
    assert torch.isnan(batch.regressed).all()  # no field reports joined


def test_gae_with_lambda_one_and_zero_values_is_the_monte_carlo_return() -> None:
    samples, _ = build_samples(_records("heuristic", runs=1), [], param_penalty=0.0)
    returns, advantages = returns_and_advantages(samples, torch.zeros(len(samples)), SimicConfig(gae_lambda=1.0))
    rewards = [s.reward for s in samples]
    assert returns.tolist() == pytest.approx([sum(rewards[i:]) for i in range(len(rewards))])
    assert torch.equal(returns, advantages)


def test_imitation_learns_the_heuristic() -> None:
    samples, _ = build_samples(_records("heuristic", runs=6), [], param_penalty=0.01)
    torch.manual_seed(0)
    model = TamiyoGNN(SMALL)
    before = agreement(model, samples)
    metrics = imitate(model, samples, SimicConfig(imitation_epochs=60, batch_size=8, lr=1e-2))
    assert metrics["agreement"] >= 0.9 > before or metrics["agreement"] == 1.0
    assert not model.training


def test_ppo_recomputes_the_recorded_log_probs_and_updates() -> None:
    records = _records("gnn", runs=4, explore=True)
    samples, skipped = build_samples(records, [], param_penalty=0.01)
    assert skipped == 0 and all(s.behaviour_log_prob is not None for s in samples)
    torch.manual_seed(0)
    model = TamiyoGNN(SMALL)  # the same weights Tamiyo served (same seed)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = ppo_update(model, samples, SimicConfig(ppo_epochs=1, batch_size=len(samples), bc_coef=0.0))
    # One minibatch, first step: the new policy is the behaviour policy.
    assert abs(metrics["approx_kl"]) < 1e-4 and metrics["clip_fraction"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_imitation_without_data_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="record some heuristic runs"):
        imitate(TamiyoGNN(SMALL), [], SimicConfig())
    with pytest.raises(ValueError, match="batch_size"):
        SimicConfig(batch_size=0)


def test_one_step_samples_are_bandit_returns_with_nothing_bootstrapped() -> None:
    samples, _ = build_samples(_records("heuristic", runs=1), [], param_penalty=0.0)
    bandit = [dataclasses.replace(s, one_step=True, reward=0.1 * i) for i, s in enumerate(samples)]
    values = torch.linspace(-1.0, 1.0, len(bandit))
    returns, advantages = returns_and_advantages(bandit, values, SimicConfig(gamma=1.0, gae_lambda=0.9))
    rewards = torch.tensor([s.reward for s in bandit])
    torch.testing.assert_close(returns, rewards)  # the reward alone, whatever the later values
    torch.testing.assert_close(advantages, rewards)  # already a contrast with the baseline branch


def test_normalising_keeps_the_sign_of_a_one_step_contrast() -> None:
    # Every decision scored below its baseline branch: none may be reinforced after normalising.
    contrast = torch.tensor([-0.056, -0.011, -0.002, 0.0])
    normalised = normalised_advantages(contrast, torch.ones(4, dtype=torch.bool))
    assert (normalised <= 0).all() and normalised[-1] == 0
    torch.testing.assert_close(normalised, contrast / contrast.std(unbiased=False))
    # Multi-step advantages are still centred (GAE over delta rewards).
    mixed = normalised_advantages(torch.tensor([1.0, 3.0, -0.5]), torch.tensor([False, False, True]))
    assert mixed[0] < 0 < mixed[1] and mixed[2] < 0


def test_counterfactual_samples_need_forked_decisions() -> None:
    records = _records("heuristic", runs=1)
    assert build_samples(records, [], param_penalty=0.01, reward="counterfactual") == ([], 0)
    with pytest.raises(ValueError, match="reward must be one of"):
        build_samples(records, [], param_penalty=0.01, reward="bandit")  # type: ignore[arg-type]
