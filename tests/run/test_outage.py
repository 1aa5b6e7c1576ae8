"""``RegistryLink``: outages are ridden out with backoff and jitter, and fail a run only past the limit.

The drill with a real PostgreSQL is ``test_registry_outage_drill.py``; here the clock is the
test's, so backoff and the limit are checked exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import text

from esper_core.contracts import TelemetryEvent
from esper_core.run.outage import RegistryLink, RegistryOutageError
from esper_core.settings import EsperSettings
from esper_core.urza.errors import RegistryError, RegistryUnavailableError
from esper_core.urza.sql_engine import create_registry_engine, translate_errors


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Database:
    def __init__(self) -> None:
        self.up = True
        self.calls = 0

    def query(self) -> str:
        self.calls += 1
        if not self.up:
            raise RegistryUnavailableError("registry x: could not connect (connection refused)")
        return "rows"


def _link(clock: _Clock, events: list[TelemetryEvent], limit_s: float = 600.0) -> RegistryLink:
    return RegistryLink(limit_s=limit_s, emit=events.append, clock=clock, rng=random.Random(0))


def test_an_outage_backs_off_exponentially_with_jitter_and_ends_when_the_database_returns() -> None:
    clock, db, events = _Clock(), _Database(), []
    link = _link(clock, events)
    assert link.try_call("look up kernels", db.query) == (True, "rows") and not link.down
    db.up = False
    assert link.try_call("look up kernels", db.query) == (False, None) and link.down
    waits = []
    for _ in range(7):
        # Until the next attempt is due, calls do not touch the database at all.
        calls, start = db.calls, clock.now
        while db.calls == calls:
            clock.now += 0.01
            assert link.try_call("look up kernels", db.query) == (False, None)
        waits.append(clock.now - start)
    for attempt, wait in enumerate(waits):
        cap = min(10.0, 0.5 * 2**attempt)
        assert cap / 2 - 0.02 <= wait <= cap + 0.02, (attempt, wait)
    assert len({round(w, 2) for w in waits[:4]}) == 4  # jittered, and growing
    db.up = True
    clock.now += 10.0
    assert link.try_call("look up kernels", db.query) == (True, "rows") and not link.down
    assert [e.name for e in events] == ["urza.outage.started", "urza.outage.ended"]
    assert events[1].attributes["outage_s"] > 10 and events[1].attributes["failed_attempts"] >= 8


def test_an_outage_past_the_limit_fails_naming_the_setting() -> None:
    clock, db, events = _Clock(), _Database(), []
    link = _link(clock, events, limit_s=60.0)
    db.up = False
    assert link.try_call("record field reports and decisions", db.query) == (False, None)
    clock.now += 59.0
    assert link.try_call("record field reports and decisions", db.query) == (False, None)
    clock.now += 2.0
    with pytest.raises(RegistryOutageError, match=r"unreachable for 61 s.*ESPER_REGISTRY_OUTAGE_LIMIT_S"):
        link.try_call("record field reports and decisions", db.query)
    assert [e.name for e in events] == ["urza.outage.started", "urza.outage.exceeded"]


def test_call_waits_out_a_short_outage() -> None:
    events: list[TelemetryEvent] = []
    link = RegistryLink(limit_s=30.0, emit=events.append)
    answers = iter([RegistryUnavailableError("down"), RegistryUnavailableError("down"), "rows"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert link.call("record field reports and decisions", flaky) == "rows"
    assert [e.name for e in events] == ["urza.outage.started", "urza.outage.ended"]


def test_the_limit_is_a_setting_and_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EsperSettings().registry_outage_limit_s == 600.0
    monkeypatch.setenv("ESPER_REGISTRY_OUTAGE_LIMIT_S", "45")
    assert EsperSettings().registry_outage_limit_s == 45.0
    with pytest.raises(ValueError, match="ESPER_REGISTRY_OUTAGE_LIMIT_S"):
        RegistryLink(limit_s=0, emit=lambda e: None)


def test_a_rejected_statement_is_not_an_outage(tmp_path: Path) -> None:
    engine = create_registry_engine(f"sqlite:///{tmp_path / 'r.db'}")
    # SQLite reports "no such table" as OperationalError too: waiting would not cure it.
    with (
        pytest.raises(RegistryError, match="no such table") as info,
        translate_errors("r.db", "read"),
        engine.connect() as conn,
    ):
        conn.execute(text("SELECT * FROM nowhere"))
    assert not isinstance(info.value, RegistryUnavailableError)
    engine.dispose()
