"""Daemon threads started without waiting for them to run.

``threading.Thread.start()`` waits until the new thread reports that it runs. On Python 3.11 a
Prefect task timeout can make that wait endless where Prefect enforces it from a watcher thread
(a task off the main thread, or a process with a SIGALRM handler of its own, as under
pytest-timeout; on the main thread otherwise it uses the signal, which is not affected). The
watcher raises ``CancelledError`` in the task's thread with ``PyThreadState_SetAsyncExc``, which
finds a thread by its id, and a thread being started carries its starter's id until it first
runs. A timeout that fires then lands in the new thread, which dies on its first line, and
``start()`` never returns (a loop of deadline calls hung in 5 of 40 timeouts).
``_thread.start_new_thread`` does not wait: a thread lost this way is a thread that never ran,
which a caller waiting with a timeout survives, and the timeout reaches the caller's thread
whenever no start is in progress. Seen on Python 3.11.7; whether later versions still share the
id during a start was not checked.
"""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable


def start_daemon(fn: Callable[[], object], *, name: str) -> threading.Event:
    """Run ``fn`` on a new daemon thread called ``name``; returns an event set once ``fn`` has
    returned or raised (an exception is reported as an unraisable one, as for any thread)."""
    finished = threading.Event()

    def run() -> None:
        try:
            # Registers the thread with ``threading`` under its name, for log records
            # (``%(threadName)s``) and ``threading.enumerate()``.
            threading.current_thread().name = name
            fn()
        finally:
            finished.set()

    _thread.start_new_thread(run, ())
    return finished
