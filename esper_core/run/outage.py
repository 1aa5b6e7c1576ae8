"""Riding out a registry outage: a run keeps training while Urza's database is unreachable.

Every call a run makes to the database goes through one ``RegistryLink``. A call that finds the
database unreachable (``RegistryUnavailableError``, translated at Urza's SQL boundary) opens an
outage: the run goes on without the database (no candidates, so Tamiyo decides WAIT: nothing
germinates without a kernel; kernels already loaded keep serving from memory), writes wait in
order, and the link tries again after an exponentially growing delay with jitter (so many runs
do not reconnect in step). The first call that succeeds closes the outage and the queued writes
go out (they are idempotent by id: nothing is lost or doubled; a queue is also kept on disk,
so a process that dies mid-outage loses nothing either). An outage longer than
``ESPER_REGISTRY_OUTAGE_LIMIT_S`` fails the run with ``RegistryOutageError``.

Outages are telemetry events: ``urza.outage.started``, ``urza.outage.ended`` (with its length)
and ``urza.outage.exceeded``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from esper_core.contracts import AdaptationCommand, FieldReport, TelemetryEvent, TelemetryLevel
from esper_core.settings import EsperSettings
from esper_core.simic.records import CounterfactualOutcome, DecisionRecord, DecisionState, SimicStore
from esper_core.urza.errors import RegistryUnavailableError
from esper_core.urza.service import Urza

T = TypeVar("T")
log = logging.getLogger(__name__)
_BASE_DELAY_S = 0.5
_MAX_DELAY_S = 10.0


class RegistryOutageError(RuntimeError):
    """The registry stayed unreachable longer than the run's limit (not a rejected command: fatal)."""


class RegistryLink:
    """A run's one path to the registry database, with outage bookkeeping and backoff.

    Args:
        limit_s: Longest outage a run survives (``ESPER_REGISTRY_OUTAGE_LIMIT_S``).
        emit: Sends an outage event at once (the run's telemetry sink).
        clock: Monotonic seconds (tests may pass their own).
        rng: Source of the jitter.
    """

    def __init__(
        self,
        *,
        limit_s: float,
        emit: Callable[[TelemetryEvent], None],
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if limit_s <= 0:
            raise ValueError(
                f"the registry outage limit must be > 0 s, got {limit_s}: set ESPER_REGISTRY_OUTAGE_LIMIT_S"
            )
        self.limit_s = limit_s
        self._emit = emit
        self._clock = clock
        self._rng = rng or random.Random()
        self.since: float | None = None
        self.failures = 0
        self._next_try = 0.0
        self._last_error = ""

    @property
    def down(self) -> bool:
        """Whether an outage is open (the last call found the database unreachable)."""
        return self.since is not None

    def try_call(self, operation: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """Call ``fn`` unless the link is backing off; never waits.

        Returns:
            ``(True, result)``, or ``(False, None)`` when the database is (still) unreachable.

        Raises:
            RegistryOutageError: The outage has lasted longer than the limit.
        """
        if self.since is not None and self._clock() < self._next_try:
            self._check_limit(operation)
            return False, None
        try:
            result = fn()
        except RegistryUnavailableError as e:
            self.failed(operation, e)
            return False, None
        self._recovered()
        return True, result

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """Call ``fn``, waiting out an outage with backoff (up to the limit).

        Raises:
            RegistryOutageError: The database stayed unreachable past the limit.
        """
        while True:
            done, result = self.try_call(operation, fn)
            if done:
                return result  # type: ignore[return-value]
            # The backoff itself: sleep until the next attempt is due.
            time.sleep(max(0.0, self._next_try - self._clock()))

    def failed(self, operation: str, error: Exception) -> None:
        """Record that ``operation`` found the database unreachable; schedule the next attempt.

        Raises:
            RegistryOutageError: The outage has lasted longer than the limit.
        """
        now = self._clock()
        self._last_error = str(error)
        if self.since is None:
            self.since = now
            self._emit(
                TelemetryEvent(
                    name="urza.outage.started",
                    level=TelemetryLevel.WARNING,
                    message=f"registry unreachable while trying to {operation}; training goes on without it: {error}",
                    attributes={"operation": operation, "limit_s": self.limit_s},
                )
            )
        self.failures += 1
        cap = min(_MAX_DELAY_S, _BASE_DELAY_S * 2 ** min(self.failures - 1, 16))
        # "Equal jitter": at least half the exponential delay, so retries still back off.
        self._next_try = now + cap / 2 + self._rng.uniform(0.0, cap / 2)
        self._check_limit(operation)

    def _check_limit(self, operation: str) -> None:
        assert self.since is not None
        elapsed = self._clock() - self.since
        if elapsed <= self.limit_s:
            return
        message = (
            f"the registry database has been unreachable for {elapsed:.0f} s, longer than the run's limit "
            f"of {self.limit_s:g} s (ESPER_REGISTRY_OUTAGE_LIMIT_S), while trying to {operation}: "
            f"{self._last_error}. Bring the database back and resume the run (its last commit is intact), "
            "or raise ESPER_REGISTRY_OUTAGE_LIMIT_S"
        )
        self._emit(
            TelemetryEvent(
                name="urza.outage.exceeded",
                level=TelemetryLevel.CRITICAL,
                message=message,
                attributes={"operation": operation, "outage_s": round(elapsed, 3), "limit_s": self.limit_s},
            )
        )
        raise RegistryOutageError(message)

    def _recovered(self) -> None:
        if self.since is None:
            return
        elapsed = self._clock() - self.since
        self._emit(
            TelemetryEvent(
                name="urza.outage.ended",
                message=f"registry reachable again after {elapsed:.1f} s and {self.failures} failed attempt(s)",
                attributes={"outage_s": round(elapsed, 3), "failed_attempts": self.failures},
            )
        )
        self.since = None
        self.failures = 0


class PendingRecords:
    """Committed field reports and decisions on their way to the database, oldest first.

    While some are queued they are also kept in ``path`` (replaced atomically after every
    attempt, removed once written), so a process that dies during an outage loses nothing: the
    next one to open the run writes them.

    Args:
        store: Simic's store (None: a registry without SQL, nothing to write).
        link: The run's registry link.
        path: Where the queue survives the process (``<run>/unrecorded.json``).
    """

    def __init__(self, store: SimicStore | None, link: RegistryLink, path: Path) -> None:
        self._store = store
        self._link = link
        self._path = path
        self._reports: list[FieldReport] = []
        self._decisions: list[DecisionRecord] = []
        if store is not None and path.exists():
            saved = json.loads(path.read_text())
            self._reports = [FieldReport.from_json(r) for r in saved["reports"]]
            self._decisions = [_decision_from_dict(d) for d in saved["decisions"]]

    def __len__(self) -> int:
        return len(self._reports) + len(self._decisions)

    def add(self, reports: Sequence[FieldReport], decisions: Sequence[DecisionRecord]) -> None:
        """Queue a commit's reports and decisions."""
        if self._store is not None:
            self._reports.extend(reports)
            self._decisions.extend(decisions)

    def flush(self, *, wait: bool) -> bool:
        """Write everything queued in one transaction (idempotent by id, so a replay never doubles).

        Args:
            wait: Wait out an outage (up to the limit) instead of leaving the records queued.

        Returns:
            Whether the queue is empty now.

        Raises:
            RegistryOutageError: The outage has lasted longer than the limit.
        """
        if not self or self._store is None:
            return True
        store = self._store

        def write() -> None:
            store.record(reports=self._reports, decisions=self._decisions)
            self._reports, self._decisions = [], []

        operation = "record field reports and decisions"
        try:
            if wait:
                self._link.call(operation, write)
            else:
                self._link.try_call(operation, write)
        finally:
            self._save()
        return not self

    def _save(self) -> None:
        if not self:
            self._path.unlink(missing_ok=True)
            return
        saved = {
            "reports": [r.to_json() for r in self._reports],
            "decisions": [_decision_to_dict(d) for d in self._decisions],
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, self._path)


def _decision_to_dict(d: DecisionRecord) -> dict[str, Any]:
    return {
        "command": d.command.to_json(),
        "proposal": d.proposal.to_json(),
        "policy": d.policy,
        "policy_version": d.policy_version,
        "state": d.state.to_json(),
        "log_prob": d.log_prob,
        "value": d.value,
        "counterfactual": None if d.counterfactual is None else d.counterfactual.to_json(),
    }


def _decision_from_dict(d: dict[str, Any]) -> DecisionRecord:
    return DecisionRecord(
        command=AdaptationCommand.from_json(d["command"]),
        proposal=AdaptationCommand.from_json(d["proposal"]),
        policy=d["policy"],
        policy_version=d["policy_version"],
        state=DecisionState.from_json(d["state"]),
        log_prob=d["log_prob"],
        value=d["value"],
        counterfactual=None if d["counterfactual"] is None else CounterfactualOutcome.from_json(d["counterfactual"]),
    )


def _log_event(event: TelemetryEvent) -> None:
    log.warning("%s: %s", event.name, event.message)


def open_registry(settings: EsperSettings, *, emit: Callable[[TelemetryEvent], None] = _log_event) -> Urza:
    """Urza for a run, waiting out an outage up to ``ESPER_REGISTRY_OUTAGE_LIMIT_S``.

    A worker that starts or resumes a run while the database is down waits for it (the run has
    no telemetry sink yet, so the outage events go to ``emit``, by default the log).

    Raises:
        RegistryOutageError: The database stayed unreachable past the limit.
    """
    link = RegistryLink(limit_s=settings.registry_outage_limit_s, emit=emit)
    return link.call("open the registry", lambda: Urza.open(settings.home, settings.registry_db_url))
