"""Daemon threads started without waiting: they run, and their event is set however they end."""

from __future__ import annotations

import threading

import pytest

from esper_core.threads import start_daemon
from tests.helpers.waiting import poll


def test_a_daemon_runs_off_the_callers_thread_and_signals_its_end() -> None:
    seen: list[tuple[int, str]] = []
    assert start_daemon(lambda: seen.append((threading.get_ident(), threading.current_thread().name)), name="t1").wait(
        30
    )
    assert seen and seen[0][0] != threading.get_ident() and seen[0][1] == "t1"


def test_a_daemon_that_raises_still_signals_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[BaseException | None] = []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))

    def broken() -> None:
        raise RuntimeError("boom")

    assert start_daemon(broken, name="broken").wait(30)
    # The exception is reported like any thread's (after the event: wait for the report too).
    poll(lambda: reported, bool, timeout_s=30, interval_s=0.01)
    assert [type(e) for e in reported] == [RuntimeError]
