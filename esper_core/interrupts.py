"""Holding Ctrl-C and SIGTERM while a step's effects are made durable; interrupting work that
runs past a deadline.

A run's commit writes its checkpoint and then releases the step's telemetry and field reports.
An interrupt between the two would leave a committed epoch whose packets were never written: the
resumed run starts after that epoch, and its telemetry is lost for good. Inside
``deferred_interrupts()`` the two signals are only noted; the interrupt is raised (by the handler
that was installed before, e.g. Python's ``KeyboardInterrupt``) as soon as the block ends.

Signal handlers can only be changed from the main thread, which is also the only thread Python
delivers them to; elsewhere the block defers nothing (an interrupt then reaches the main thread,
not the committing one).

``raise_at_deadline(limit_s)`` is the other way round: a watchdog thread signals the main thread
(``SIGUSR1``) when the block has run ``limit_s`` seconds, and the handler raises ``DeadlinePassed``
there, at the next bytecode, or as soon as a blocking call (a sleep, a wait on a compile worker)
is interrupted. A C call that never returns to Python is not interrupted until it does. Off the
main thread the block runs without a deadline.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from esper_core.threads import start_daemon

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


@contextlib.contextmanager
def noted_interrupts(note: Callable[[int], None]) -> Iterator[None]:
    """Within the block, SIGINT or SIGTERM first calls ``note(signum)``, then the handler that was
    installed before (which raises, e.g. ``KeyboardInterrupt``, or Prefect's ``TerminationSignal``).

    For what must be written the moment a stop arrives, not after the stack has unwound: a
    process stopped by SIGTERM may be killed outright a few seconds later (a server shutting
    down gives its flow runs ``FLOW_RUNS_STOP_S``), and on a loaded machine unwinding (Prefect
    reporting each task's end to its server) can take longer than that. A signal held by
    ``deferred_interrupts`` reaches ``note`` when that block ends, after the commit. Off the
    main thread the block notes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Callable[[int, FrameType | None], Any] | int | signal.Handlers | None]
    previous = {s: signal.getsignal(s) for s in _HELD}

    def noting(signum: int, frame: FrameType | None) -> None:
        try:
            note(signum)
        finally:
            # Whatever the note did, the stop goes on: a note that failed (a full disk) must not
            # replace the interrupt with its own error.
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

    for held in _HELD:
        signal.signal(held, noting)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


_DEADLINE_SIGNAL = signal.SIGUSR1
_RESEND_S = 0.5
"""Seconds between a watchdog's signals once its deadline passed: until its block ends, so that a
``DeadlinePassed`` raised where Python drops it (a ``__del__``, a callback) is raised again."""


class DeadlinePassed(BaseException):  # noqa: N818 - named for what happened, like KeyboardInterrupt
    """A ``raise_at_deadline`` block ran past its limit.

    A ``BaseException``, as ``KeyboardInterrupt`` is: library code that falls back on any
    ``Exception`` (a compiler trying another strategy) must not swallow it and go on."""


class _Deadlines:
    """The one armed deadline of the main thread, and the handler that raises it.

    The handler stays installed once it was (an armed block installs it unless it is there): a
    watchdog's signal that arrives just after its block ended must not meet the default action
    (which ends the process). Unarmed, a ``SIGUSR1`` goes to the handler that was there before, if
    it was a function, and is ignored otherwise. A handler Python says was installed outside it
    (``signal.getsignal`` gives None) is left alone: blocks then run without a deadline. (One that
    C code installs later, as ``faulthandler.register`` does, Python cannot see: it is replaced.)
    """

    def __init__(self) -> None:
        # Reentrant: the handler runs on the main thread, which may hold the lock when the
        # signal arrives (arming or disarming).
        self.lock = threading.RLock()
        self.armed: object | None = None  # the armed block's token
        self.fired: object | None = None  # the token whose deadline passed
        self.message = ""
        self.previous: Callable[[int, FrameType | None], Any] | int | signal.Handlers | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        with self.lock:
            ours = self.fired is not None and self.fired is self.armed
        if ours:
            raise DeadlinePassed(self.message)
        if callable(self.previous):
            self.previous(signum, frame)


_DEADLINES = _Deadlines()


@contextlib.contextmanager
def raise_at_deadline(limit_s: float | None, *, what: str) -> Iterator[bool]:
    """Raise ``DeadlinePassed`` in the block once it has run ``limit_s`` seconds.

    Args:
        limit_s: Seconds the block may run; None: no deadline.
        what: What runs, for the message (``"the compile trial"``).

    Yields:
        Whether the deadline is armed: False for ``limit_s=None``, off the main thread (signals
        reach only the main thread), inside another armed block (the outer deadline stands) and
        where ``SIGUSR1``'s handler was installed outside Python.
    """
    if limit_s is not None and limit_s <= 0:
        raise ValueError(f"limit_s must be > 0 seconds or None (no deadline), got {limit_s}")
    current = signal.getsignal(_DEADLINE_SIGNAL)
    if (
        limit_s is None
        or threading.current_thread() is not threading.main_thread()
        or _DEADLINES.armed is not None
        or current is None
    ):
        yield False
        return
    if current != _DEADLINES.handle:  # first use, or replaced since
        _DEADLINES.previous = signal.signal(_DEADLINE_SIGNAL, _DEADLINES.handle)
    token = object()
    done = threading.Event()
    main = threading.main_thread().ident
    assert main is not None
    with _DEADLINES.lock:
        _DEADLINES.armed, _DEADLINES.fired = token, None
        _DEADLINES.message = f"{what} ran past its limit of {limit_s:.3g} s and was stopped"

    def watch() -> None:
        if done.wait(limit_s):
            return
        while True:
            with _DEADLINES.lock:
                if _DEADLINES.armed is not token:
                    return  # the block ended
                _DEADLINES.fired = token
            signal.pthread_kill(main, _DEADLINE_SIGNAL)
            if done.wait(_RESEND_S):
                return

    start_daemon(watch, name="esper-deadline-watch")
    try:
        yield True
    finally:
        done.set()
        with _DEADLINES.lock:
            if _DEADLINES.armed is token:
                _DEADLINES.armed = None
