"""Interrupts held while a step's effects are made durable (``esper_core.interrupts``)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from esper_core.interrupts import deferred_interrupts


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
