"""Interrupts held while a step's effects are made durable, and raised at a deadline
(``esper_core.interrupts``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from esper_core.interrupts import DeadlinePassed, deferred_interrupts, noted_interrupts, raise_at_deadline
from tests.helpers.waiting import wait_for


class Stopped(Exception):
    pass


@pytest.fixture
def raising_sigterm():
    def stop(signum, frame):  # noqa: ANN001, ANN202
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("raising_sigterm")
def test_a_sigterm_inside_the_block_is_raised_when_the_block_has_finished() -> None:
    done = []
    with pytest.raises(Stopped), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("checkpoint")  # the handler ran already if the signal were not held
        done.append("telemetry")
    assert done == ["checkpoint", "telemetry"]
    assert signal.getsignal(signal.SIGTERM).__name__ == "stop"  # the previous handler is back


@pytest.mark.usefixtures("raising_sigterm")
def test_a_noted_sigterm_is_noted_before_the_handler_raises_and_after_a_held_commit() -> None:
    noted: list[object] = []
    with noted_interrupts(noted.append):
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises long before this ends
        assert noted == [signal.SIGTERM]
        # Held by a commit: noted only once the commit is complete, then raised.
        with pytest.raises(Stopped), deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            noted.append("commit")
    assert noted == [signal.SIGTERM, "commit", signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM).__name__ == "stop"  # the previous handler is back


@pytest.mark.usefixtures("raising_sigterm")
def test_a_note_that_fails_does_not_replace_the_interrupt() -> None:
    def full_disk(_signum: int) -> None:
        raise OSError("no space left on device")

    with pytest.raises(Stopped) as stopped, noted_interrupts(full_disk):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert isinstance(stopped.value.__context__, OSError)


@pytest.mark.usefixtures("raising_sigterm")
def test_without_a_signal_the_block_changes_nothing_and_nests() -> None:
    with deferred_interrupts(), deferred_interrupts():
        pass
    assert signal.getsignal(signal.SIGTERM).__name__ == "stop"
    with pytest.raises(Stopped):
        os.kill(os.getpid(), signal.SIGTERM)  # outside the block: at once


def test_off_the_main_thread_the_block_defers_nothing_and_does_not_fail() -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with deferred_interrupts():
                pass
        except BaseException as e:  # noqa: BLE001 (reported to the test thread)
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == []


@pytest.mark.parametrize("work", ["busy", "sleep"])
def test_a_block_past_its_deadline_is_stopped(work: str) -> None:
    start = time.monotonic()
    with (
        pytest.raises(DeadlinePassed, match="the work ran past its limit of 0.2 s"),
        raise_at_deadline(0.2, what="the work") as armed,
    ):
        assert armed
        if work == "sleep":
            time.sleep(60)  # a blocking call is interrupted, not waited out
        while True:
            pass
    assert time.monotonic() - start < 30


def test_a_deadline_swallowed_once_is_raised_again() -> None:
    # Python drops an exception raised in a __del__ or a callback, and library code may catch
    # BaseException: until the block ends, the watchdog signals again.
    with pytest.raises(DeadlinePassed), raise_at_deadline(0.2, what="the work"):
        try:
            while True:
                pass
        except DeadlinePassed:
            pass  # swallowed
        while True:
            pass


def test_a_block_within_its_deadline_runs_and_a_late_signal_does_nothing() -> None:
    seen = []
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        # The deadline's handler stays after its block: a SIGUSR1 then, which would have ended
        # the process under the default action, is ignored...
        with raise_at_deadline(30, what="quick work") as armed:
            total = sum(range(1000))
        assert armed and total == 499500
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # the process is still here: nothing to wait for but a signal's delivery
        # ... and goes to the handler that was there before, if it was a function.
        signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
        with raise_at_deadline(30, what="quick work"):
            pass
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: seen == [signal.SIGUSR1], what="the earlier SIGUSR1 handler to be called", timeout_s=10)
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_no_deadline_off_the_main_thread_inside_another_or_without_a_limit() -> None:
    armed: list[bool] = []

    def elsewhere() -> None:
        with raise_at_deadline(0.01, what="x") as on:
            armed.append(on)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    with raise_at_deadline(30, what="outer") as outer, raise_at_deadline(0.01, what="inner") as inner:
        time.sleep(0.05)
    with raise_at_deadline(None, what="unlimited") as unlimited:
        pass
    assert (armed, outer, inner, unlimited) == ([False], True, False, False)
    with pytest.raises(ValueError, match="limit_s must be > 0"), raise_at_deadline(0, what="x"):
        pass
