"""Holding Ctrl-C and SIGTERM while a step's effects are made durable.

A run's commit writes its checkpoint and then releases the step's telemetry and field reports.
An interrupt between the two would leave a committed epoch whose packets were never written: the
resumed run starts after that epoch, and its telemetry is lost for good. Inside
``deferred_interrupts()`` the two signals are only noted; the interrupt is raised (by the handler
that was installed before, e.g. Python's ``KeyboardInterrupt``) as soon as the block ends.

Signal handlers can only be changed from the main thread, which is also the only thread Python
delivers them to; elsewhere the block defers nothing (an interrupt then reaches the main thread,
not the committing one).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM wait; the first to arrive is raised after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append((signum, frame))

    previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None]
    previous = {s: signal.signal(s, hold) for s in _HELD}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signum, frame = caught[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
