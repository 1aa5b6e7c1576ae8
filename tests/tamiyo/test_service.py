"""TamiyoService: graph + GNN forward + heuristic decision in one call."""

from __future__ import annotations

import pytest
import torch

from esper_core.contracts import CommandType, SeedOperation
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.model import ACTION_NAMES, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import UNTRAINED_NOTE, TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history


@pytest.fixture
def service() -> TamiyoService:
    torch.manual_seed(0)
    return TamiyoService(TamiyoConfig(gnn=TamiyoGNNConfig(hidden_dim=32)))


def test_decide_returns_heuristic_command_with_gnn_scores(service: TamiyoService) -> None:
    # Epoch 1 with slot0 dormant and nothing tried yet: the probe germinates.
    history = synthetic_history(num_epochs=2, num_layers=3, num_slots=1)
    decision = service.decide(history, synthetic_candidates(3), run_id="run-1")
    command = decision.command
    assert command.issued_by == "heuristic" and command.run_id == "run-1" and command.epoch == 1
    assert (command.command_type, command.seed_operation) == (
        CommandType.SEED,
        SeedOperation.GERMINATE,
    )
    assert (command.slot_id, command.blueprint_id) == ("slot0", "bp0")
    assert command.reason.endswith(UNTRAINED_NOTE)
    assert set(command.scores) == {f"gnn.{name}" for name in ACTION_NAMES}
    assert decision.action_probs == {name: command.scores[f"gnn.{name}"] for name in ACTION_NAMES}
    assert sum(decision.action_probs.values()) == pytest.approx(1.0, abs=1e-5)
    assert decision.gnn_latency_ms > 0.0
    assert 0.0 < decision.coverage <= 1.0


def test_decide_waits_while_seed_in_flight(service: TamiyoService) -> None:
    history = synthetic_history(num_epochs=3, num_layers=3, num_slots=2)  # slot1 TRAINING
    decision = service.decide(history, synthetic_candidates(3), run_id="run-1")
    assert decision.command.command_type is CommandType.WAIT
    assert "in flight" in decision.command.reason


def test_empty_history_raises(service: TamiyoService) -> None:
    with pytest.raises(ValueError, match="history is empty"):
        service.decide([], synthetic_candidates(), run_id="run-1")


def test_state_dict_round_trip_reproduces_action_probs(service: TamiyoService) -> None:
    history, candidates = synthetic_history(), synthetic_candidates()
    torch.manual_seed(123)  # a different initialisation
    other = TamiyoService(TamiyoConfig(), model=TamiyoGNN(TamiyoGNNConfig(hidden_dim=32)))
    before = other.decide(history, candidates, run_id="r").action_probs
    other.load_state_dict(service.state_dict())
    after = other.decide(history, candidates, run_id="r").action_probs
    expected = service.decide(history, candidates, run_id="r").action_probs
    assert after == pytest.approx(expected) and before != pytest.approx(expected)


def test_config_rejects_unknown_device() -> None:
    with pytest.raises(ValueError, match="device"):
        TamiyoConfig(device="tpu-9000")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_config_rejects_cuda_without_a_gpu() -> None:
    with pytest.raises(ValueError, match="set device='cpu'"):
        TamiyoConfig(device="cuda")
