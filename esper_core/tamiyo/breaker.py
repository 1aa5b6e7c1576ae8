"""Circuit breaker: keeps training safe when Tamiyo errs or misses its deadline.

States (counted in decisions, not seconds, so a run replays identically):

- CLOSED: Tamiyo is asked every epoch. ``failure_threshold`` consecutive failures open it.
- OPEN: Tamiyo is not asked; the safe command (WAIT) is used for ``cooldown_decisions``
  decisions, then the breaker goes HALF_OPEN.
- HALF_OPEN: Tamiyo is asked once. Success closes the breaker, failure re-opens it.

Who calls what: ``TamiyoService.decide_safely`` wraps its own errors; a caller that enforces a
deadline (Tolaria's session) reports a miss with ``record_failure("timeout ...")`` and uses
``TamiyoService.fallback_decision`` for that epoch. Always check ``allow()`` before asking.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    """Where the breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(kw_only=True, slots=True)
class BreakerConfig:
    """Thresholds of the circuit breaker.

    Attributes:
        failure_threshold: Consecutive failures (errors or timeouts) that open the breaker.
        cooldown_decisions: Decisions served by the safe command while open, before one trial.
    """

    failure_threshold: int = 3
    cooldown_decisions: int = 5

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if self.cooldown_decisions < 1:
            raise ValueError(f"cooldown_decisions must be >= 1, got {self.cooldown_decisions}")


class CircuitBreaker:
    """Counts Tamiyo's failures and decides whether she may be asked (thread-safe).

    Args:
        config: Thresholds; defaults to ``BreakerConfig()``.
    """

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self._lock = threading.Lock()
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.failures_total = 0
        self.opened_total = 0
        self.last_failure: str | None = None
        self._cooldown_left = 0

    def allow(self) -> bool:
        """Whether Tamiyo may be asked now. While OPEN each call counts one cooled-down decision.

        Returns:
            True when CLOSED or HALF_OPEN (the trial), False while cooling down.
        """
        with self._lock:
            if self.state is BreakerState.OPEN:
                self._cooldown_left -= 1
                if self._cooldown_left > 0:
                    return False
                self.state = BreakerState.HALF_OPEN
            return True

    def record_success(self) -> None:
        """Tamiyo answered in time: reset the failure count and close the breaker."""
        with self._lock:
            self.consecutive_failures = 0
            self.state = BreakerState.CLOSED

    def record_failure(self, reason: str) -> None:
        """Tamiyo raised or timed out; opens the breaker at the threshold or after a failed trial.

        Args:
            reason: What went wrong (kept in ``last_failure`` for telemetry and reports).
        """
        with self._lock:
            self.consecutive_failures += 1
            self.failures_total += 1
            self.last_failure = reason
            trial_failed = self.state is BreakerState.HALF_OPEN
            if trial_failed or self.consecutive_failures >= self.config.failure_threshold:
                if self.state is not BreakerState.OPEN:
                    self.opened_total += 1
                self.state = BreakerState.OPEN
                # allow() is called once per decision; +1 so exactly cooldown_decisions are refused.
                self._cooldown_left = self.config.cooldown_decisions + 1

    def reset(self) -> None:
        """Back to CLOSED with no history (e.g. when a service is reused for a new run)."""
        with self._lock:
            self.state = BreakerState.CLOSED
            self.consecutive_failures = 0
            self._cooldown_left = 0
            self.last_failure = None
