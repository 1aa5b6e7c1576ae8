"""The circuit breaker and TamiyoService.decide_safely: training goes on when Tamiyo errs."""

from __future__ import annotations

import logging

import pytest

from esper_core.contracts import CommandType
from esper_core.tamiyo.breaker import BreakerConfig, BreakerState, CircuitBreaker
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.tamiyo.service import BREAKER_ISSUER, TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history


def test_opens_after_the_threshold_cools_down_then_trials() -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2, cooldown_decisions=3))
    breaker.record_failure("boom")
    assert breaker.allow() and breaker.state is BreakerState.CLOSED
    breaker.record_failure("boom again")
    assert breaker.state is BreakerState.OPEN and breaker.opened_total == 1
    assert [breaker.allow() for _ in range(3)] == [False, False, False]
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN  # the trial
    breaker.record_failure("trial failed")  # one failure re-opens from HALF_OPEN
    assert breaker.state is BreakerState.OPEN and breaker.opened_total == 2
    assert [breaker.allow() for _ in range(4)] == [False, False, False, True]
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0
    assert breaker.failures_total == 3 and breaker.last_failure == "trial failed"


def test_success_resets_the_consecutive_count() -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2))
    breaker.record_failure("a")
    breaker.record_success()
    breaker.record_failure("b")
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(("field", "value"), [("failure_threshold", 0), ("cooldown_decisions", 0)])
def test_config_rejects_bad_values(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        BreakerConfig(**{field: value})  # type: ignore[arg-type]


def test_decide_safely_turns_errors_into_safe_waits_and_opens_the_breaker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    service = TamiyoService(
        TamiyoConfig(
            gnn=TamiyoGNNConfig(hidden_dim=8, num_layers=1),
            breaker=BreakerConfig(failure_threshold=2, cooldown_decisions=2),
        )
    )
    history, candidates = synthetic_history(num_epochs=2, num_slots=1), synthetic_candidates()
    calls = []

    def broken(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise KeyError("policy bug")

    monkeypatch.setattr(service.heuristic, "decide", broken)
    with caplog.at_level(logging.ERROR):
        decisions = [service.decide_safely(history, candidates, run_id="r") for _ in range(4)]
    assert all(d.command.command_type is CommandType.WAIT for d in decisions)
    assert all(d.command.issued_by == BREAKER_ISSUER and d.command.risk_rule == "circuit_breaker" for d in decisions)
    assert "Tamiyo failed: KeyError" in decisions[0].command.reason
    assert "circuit breaker open" in decisions[2].command.reason
    assert len(calls) == 2  # not asked while open
    monkeypatch.undo()
    recovered = [service.decide_safely(history, candidates, run_id="r") for _ in range(2)]
    assert recovered[-1].command.issued_by == "heuristic"
    assert service.breaker.state is BreakerState.CLOSED


def test_decide_safely_still_rejects_an_empty_history() -> None:
    service = TamiyoService(TamiyoConfig(gnn=TamiyoGNNConfig(hidden_dim=8, num_layers=1)))
    with pytest.raises(ValueError, match="history is empty"):
        service.decide_safely([], [], run_id="r")
